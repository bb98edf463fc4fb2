"""RPC call tracking in real jobs: calls in flight with their call site, the per caller → callee
summary, and the callee's view of what it runs for whom (``rpcctl inspect calls``)."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import assert_no_process_left, kill_if_running, only_run, rpcctl, start_rpcctl, wait_until
from rpcctl import inspect
from rpcctl.rank import call_summary, calls as tracking
from rpcctl.wire import histogram

pytestmark = pytest.mark.timeout(180)

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    import torch
    import torch.distributed.rpc as rpc

    SYNC = Path(sys.argv[1])


    class PS:
        def __init__(self):
            self.n = 0

        def update(self, x):
            self.n += 1
            return x + 1

        def hold(self, x=None):
            while not (SYNC / "release").exists():
                time.sleep(0.02)
            return self.n


    def add(a, b):
        return a + b


    def boom():
        raise ValueError("boom")


    def total(t, scale):
        return float(t.sum()) * scale


    def main():
        rank = int(os.environ["RANK"])
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
        if rank == 0:
            for i in range(300):
                rpc.rpc_sync("worker1", add, args=(i, 1))
            torch.futures.wait_all([rpc.rpc_async("worker1", add, args=(i, 2)) for i in range(40)])
            for _ in range(5):
                rpc.rpc_sync("worker1", total, args=(torch.ones(1000), 2.0))  # 4000 bytes sent a call
            [r.to_here() for r in [rpc.remote("worker1", add, args=(i, 3)) for i in range(20)]]
            ps = rpc.remote("worker1", PS)
            for i in range(10):
                ps.rpc_sync().update(i)
            try:
                rpc.rpc_sync("worker1", boom)
            except ValueError:
                pass
            (SYNC / "fast-done").write_text("1")
            ps.rpc_sync().hold(torch.zeros(16))  # 64 bytes sent, through the proxy
        rpc.shutdown()


    main()
    """
)


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if text in line)


def _timed_of(n: int, first: int, every: int) -> int:
    """How many of a kind's first n calls in a process are timed: the first ``first``, then one in ``every``."""
    return min(n, first) + len(range(first, n, every))


def warm_up(call: str) -> str:
    """In a job script: a function's first rpc.remote calls (``call``: its arguments), all timed,
    so its next ones are sampled (per function, as rpc_sync's and rpc_async's)."""
    return f"[rpc.remote('worker1', {call}).to_here() for _ in range({tracking.REMOTE_TIMED_FIRST})]"


def _launch_to_end(tmp_path, runs_dir, script: str, name: str) -> None:
    """Run ``script`` on 2 ranks under `rpcctl launch` to its end, which must be a success."""
    (tmp_path / f"{name}.py").write_text(script)
    config = tmp_path / f"{name}.yaml"
    config.write_text(f"script: {name}.py\nnproc_per_node: 2\ntimeout: 120\n")
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir), timeout=150)
    assert result.returncode == 0, result.stderr


def _start_synced(tmp_path, runs_dir, script: str, name: str = "calls_job"):
    """Launch ``script`` on 2 ranks with a directory of sync files as its argument."""
    sync = tmp_path / "sync"
    sync.mkdir()
    (tmp_path / f"{name}.py").write_text(script)
    config = tmp_path / f"{name}.yaml"
    config.write_text(f"script: {name}.py\nargs: [{json.dumps(str(sync))}]\nnproc_per_node: 2\ntimeout: 150\n")
    return sync, start_rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir))


def test_bucket_quantiles_stay_within_a_bucket():
    durations = [0.0003] * 90 + [0.02] * 10
    hist: dict[int, int] = {}
    for d in durations:
        hist[histogram.bucket(d)] = hist.get(histogram.bucket(d), 0) + 1
    p50, p99 = histogram.quantile(hist, 0.5), histogram.quantile(hist, 0.99)
    assert 0.0003 / 1.2 < p50 < 0.0003 * 1.2
    assert 0.02 / 1.2 < p99 < 0.02 * 1.2
    assert histogram.quantile({}, 0.5) is None
    few = {histogram.bucket(0.002): 2, histogram.bucket(0.006): 1}  # 3 calls: the p99 is the slowest's
    assert 0.006 / 1.2 < histogram.quantile(few, 0.99) < 0.006 * 1.2
    assert 0.002 / 1.2 < histogram.quantile(few, 0.5) < 0.002 * 1.2
    assert 0.002 / 1.2 < histogram.quantile({histogram.bucket(0.002): 1}, 0.0) < 0.002 * 1.2


def test_a_live_job_shows_its_calls_in_flight_the_summary_and_the_callee_view(tmp_path, runs_dir):
    sync, launcher = _start_synced(tmp_path, runs_dir, SCRIPT)
    try:
        run_dir = only_run(runs_dir)
        wait_until(
            lambda: (sync / "fast-done").exists() or launcher.poll() is not None,
            90,
            "the fast calls",
            logs=run_dir / "logs",
        )
        assert launcher.poll() is None, launcher.communicate()

        # The held call shows as pending, named as the owner calls it, at its call site; the
        # callee says what it runs and for whom.
        def held():
            report = inspect.calls(run_dir)
            return report if report.pending and report.serving else None

        report = wait_until(held, 30, "the held call in flight", logs=run_dir / "logs")
        [call] = report.pending
        assert (call.caller, call.callee, call.func, call.kind, call.state) == (
            "worker0",
            "worker1",
            "PS.hold",
            "rpc_sync",
            "pending",
        )
        assert call.call_site.endswith(f"calls_job.py:{_line('ps.rpc_sync().hold(')} in main")
        assert call.age_s >= tracking.LONG_S and call.nbytes == 64
        [served] = report.serving
        assert (served.worker, served.func, served.caller, served.state) == ("worker1", "PS.hold", "worker0", "running")
        assert served.describe().startswith("worker1 has run PS.hold for worker0 for ")

        # Fast calls are only counted: per caller, callee, function and kind.
        summary = {(s.func, s.kind): s for s in report.summary if s.caller == "worker0"}
        assert summary[("add", "rpc_sync")].count == 300
        assert summary[("add", "rpc_async")].count == 40
        assert summary[("add", "remote")].count == 20
        assert summary[("rref.update", "rpc_sync")].count == 10
        assert (summary[("total", "rpc_sync")].count, summary[("total", "rpc_sync")].mean_sent_bytes) == (5, 4000)
        assert summary[("add", "rpc_sync")].mean_sent_bytes is None  # no tensor among its arguments
        assert summary[("rref.update", "rpc_sync")].mean_sent_bytes is None  # (an int, through the proxy)
        assert (summary[("boom", "rpc_sync")].count, summary[("boom", "rpc_sync")].errors) == (1, 1)
        add = summary[("add", "rpc_sync")]
        assert 0 < add.p50_s <= add.p99_s <= add.max_s and add.errors == 0 and add.pending == 0
        remote_timed = _timed_of(20, tracking.REMOTE_TIMED_FIRST, tracking.REMOTE_SAMPLE)  # its first 20 remote calls
        add_timed = _timed_of(300, tracking.SYNC_TIMED_FIRST, tracking.SYNC_SAMPLE)  # sampled per function
        assert add.timed == add_timed and summary[("add", "remote")].timed == remote_timed
        assert summary[("PS.hold", "rpc_sync")].pending == 1  # not ended: not counted yet, named by its owner
        assert not any(s.func.startswith("torch.distributed.rpc.") for s in report.summary)  # torch's own protocol

        # The same through the real CLI, as a table.
        result = rpcctl("inspect", "calls", "--runs-dir", str(runs_dir))
        assert result.returncode == 0, result.stderr
        assert "PS.hold" in result.stdout and "worker1 has run PS.hold for worker0 for" in result.stdout

        (sync / "release").write_text("1")
        out, err = launcher.communicate(timeout=90)
        assert launcher.returncode == 0, (out, err)
    finally:
        kill_if_running(launcher)

    # After the run: nothing pending, the held call counted, from the store.
    result = rpcctl("inspect", "calls", "--json", "--runs-dir", str(runs_dir))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["pending"] == [] and document["serving"] == []
    hold = next(s for s in document["summary"] if s["func"] == "rref.hold")
    assert hold["count"] == 1 and hold["pending"] == 0 and hold["max_s"] >= tracking.LONG_S
    history = inspect.calls(run_dir, history=True)
    assert [(c.func, c.state) for c in history.pending] == [("PS.hold", "ok")]
    assert_no_process_left(run_dir)


HELD_TO_THE_END = textwrap.dedent(
    """
    import os
    import torch.distributed.rpc as rpc


    def add(a, b):
        return a + b


    def one():
        return 1


    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    if rank == 0:
        WARM_UP
        held = [rpc.remote("worker1", add, args=(i, 1)) for i in range(20)]
        [rpc.remote("worker1", one).to_here() for _ in range(3)]  # after add's hot loop: timed, as its own first calls
        try:
            rpc.remote("nobody", add, args=(0, 0))  # untimed, and refused at once: no duration at all
        except Exception:
            pass
        rpc.rpc_sync("worker1", add, args=(0, 0))  # the owner has run them all: their creation is done
    rpc.shutdown()
    """
).replace("WARM_UP", warm_up("add, args=(0, 0)"))


def test_remote_calls_held_to_a_quick_end_are_all_counted(tmp_path, runs_dir):
    """Past a function's first REMOTE_TIMED_FIRST, only one rpc.remote of it in REMOTE_SAMPLE is
    timed (another function's first calls are); the others are counted when their RRef goes or,
    after a second, when it is created. RRefs still held at a sub-second shutdown are counted by the
    last report."""
    _launch_to_end(tmp_path, runs_dir, HELD_TO_THE_END, "held")
    document = json.loads(rpcctl("inspect", "calls", "--json", "--runs-dir", str(runs_dir)).stdout)
    remote = next(
        s for s in document["summary"] if s["kind"] == "remote" and s["func"] == "add" and s["callee"] == "worker1"
    )
    first = tracking.REMOTE_TIMED_FIRST
    assert remote["count"] == first + 20 and remote["pending"] == 0, remote
    assert remote["timed"] == first + len(range(0, 20, tracking.REMOTE_SAMPLE)), remote  # what p50/p99 are of
    rare = next(s for s in document["summary"] if s["func"] == "one")
    assert (rare["count"], rare["timed"]) == (3, 3), rare  # sampled per function: a process's count would time none
    alone = next(s for s in document["summary"] if s["func"] == "add" and s["callee"] == "nobody")
    # No duration known: none is shown (it read MAX 0.00 ms)
    assert (alone["count"], alone["errors"], alone["timed"], alone["p50_s"], alone["max_s"], alone["mean_s"]) == (
        1,
        1,
        0,
        None,
        None,
        None,
    ), alone
    assert_no_process_left(only_run(runs_dir))


SLOW_REMOTES = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    import torch.distributed.rpc as rpc

    SYNC = Path(sys.argv[1])


    def slow_make(wait=True):
        while wait and not (SYNC / "release").exists():
            time.sleep(0.02)
        return 7


    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    if rank == 0:
        WARM_UP
        first = rpc.remote("worker1", slow_make)  # the timed one of REMOTE_SAMPLE (the first past them)
        second = rpc.remote("worker1", slow_make)  # counted from its handle only
        (SYNC / "sent").write_text("1")
        assert first.to_here() + second.to_here() == 14
        try:
            rpc.remote("nobody", slow_make)  # refused at once (an unknown worker): no handle
        except Exception:
            pass
    rpc.shutdown()
    """
).replace("WARM_UP", warm_up("slow_make, args=(False,)"))


def test_remote_calls_still_being_created_are_listed_pending_timed_or_not(tmp_path, runs_dir):
    """A remote call whose owner has not created the value after LONG_S is a long call, listed
    with its call site, whether it is the one call in REMOTE_SAMPLE timed in the hook or one
    counted from its handle's record; each is counted once, and a call refused at once (no
    handle) is counted as an error."""
    sync, launcher = _start_synced(tmp_path, runs_dir, SLOW_REMOTES, name="slow")
    try:
        run_dir = only_run(runs_dir)
        wait_until(
            lambda: (sync / "sent").exists() or launcher.poll() is not None,
            60,
            "the remote calls",
            logs=run_dir / "logs",
        )

        def both_pending():
            report = inspect.calls(run_dir)
            mine = [c for c in report.pending if c.func == "slow_make"]
            return mine if len(mine) == 2 else None

        pending = wait_until(both_pending, 30, "both remote calls listed", logs=run_dir / "logs")
        line = next(i for i, text in enumerate(SLOW_REMOTES.splitlines(), 1) if "first = rpc.remote" in text)
        assert {(c.caller, c.callee, c.kind, c.state) for c in pending} == {("worker0", "worker1", "remote", "pending")}
        sites = sorted(c.call_site for c in pending)
        assert sites[0].endswith(f"slow.py:{line} in <module>") and sites[1].endswith(
            f"slow.py:{line + 1} in <module>"
        ), sites
        assert all(c.age_s >= tracking.LONG_S for c in pending), pending
        (sync / "release").write_text("1")
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, (out, err)
    finally:
        kill_if_running(launcher)
    document = json.loads(rpcctl("inspect", "calls", "--json", "--runs-dir", str(runs_dir)).stdout)
    assert document["pending"] == []
    made = next(s for s in document["summary"] if s["func"] == "slow_make" and s["callee"] == "worker1")
    assert (
        made["count"] == tracking.REMOTE_TIMED_FIRST + 2 and made["errors"] == 0 and made["max_s"] >= tracking.LONG_S
    ), made
    refused = next(s for s in document["summary"] if s["func"] == "slow_make" and s["callee"] == "nobody")
    assert (refused["count"], refused["errors"]) == (1, 1), refused
    history = inspect.calls(run_dir, history=True)
    assert sorted((c.func, c.state) for c in history.pending) == [("slow_make", "ok"), ("slow_make", "ok")]
    assert_no_process_left(run_dir)


def test_torchscript_functions_are_named_by_their_own_name(tmp_path, monkeypatch):
    """A TorchScript function's __qualname__ is its class's ("torch.jit.ScriptFunction"), as
    DistributedOptimizer's remote steps showed ("torch.jit.torch.jit.ScriptFunction"); it is
    named like a Python function: module and name."""
    torch = pytest.importorskip("torch")
    (tmp_path / "scripted_steps.py").write_text(
        textwrap.dedent(
            """
        import torch


        @torch.jit.script
        def scaled(x: torch.Tensor) -> torch.Tensor:
            return x * 2
        """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import scripted_steps

    assert isinstance(scripted_steps.scaled, torch.jit.ScriptFunction)
    assert call_summary.qualname(scripted_steps.scaled) == "scripted_steps.scaled"
    assert call_summary.qualname(textwrap.dedent) == "textwrap.dedent"  # a Python function, as before


MANY_ASYNC = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    import torch
    import torch.distributed.rpc as rpc

    SYNC = Path(sys.argv[1])
    N = int(sys.argv[2])  # past the rpc_async calls that are all timed
    QUICK = int(sys.argv[3])  # quick calls of hold: the next two are untimed


    def add(a, b):
        return a + b


    def boom():
        raise ValueError("boom")


    def slow():
        time.sleep(1.0)


    def hold(t, wait):
        while wait and not (SYNC / "release").exists():
            time.sleep(0.02)
        return t.numel()


    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    if rank == 0:
        torch.futures.wait_all([rpc.rpc_async("worker1", add, args=(i, 2)) for i in range(N)])
        for future in [rpc.rpc_async("worker1", boom) for _ in range(48)]:
            try:
                future.wait()  # and dropped at once: its error must be counted all the same
            except ValueError:
                pass
        for future in [rpc.rpc_async("worker1", slow, timeout=0.2) for _ in range(16)]:
            try:
                future.wait()
            except RuntimeError:
                pass
        # The callee's slow() calls hold its RPC threads for 1 s after they timed out here: hold's
        # quick calls queued behind them ran past LONG_S under load and were listed (CI).
        time.sleep(1.2)
        torch.futures.wait_all([rpc.rpc_async("worker1", hold, args=(torch.zeros(1), False)) for _ in range(QUICK)])
        # Two long calls back to back, both untimed (one in ASYNC_SAMPLE is timed).
        first = rpc.rpc_async("worker1", hold, args=(torch.zeros(4), True))
        second = rpc.rpc_async("worker1", hold, args=(torch.zeros(8), True))
        (SYNC / "sent").write_text("1")
        assert first.wait() + second.wait() == 12
        time.sleep(1.0)  # the callee's slow() calls, long timed out here, end before shutdown
    rpc.shutdown()
    """
)


def _two_holds_pending(runs_dir, sync, launcher):
    """Once the job wrote "sent": its run and the two calls of hold listed pending."""
    run_dir = only_run(runs_dir)
    wait_until(lambda: (sync / "sent").exists() or launcher.poll() is not None, 120, "the calls", logs=run_dir / "logs")

    def both_pending():
        mine = [c for c in inspect.calls(run_dir).pending if c.func == "hold"]
        return mine if len(mine) == 2 else None

    return run_dir, wait_until(both_pending, 30, "the two long calls listed", logs=run_dir / "logs")


def _release(sync, launcher):
    (sync / "release").write_text("1")
    out, err = launcher.communicate(timeout=90)
    assert launcher.returncode == 0, (out, err)


def _worker0_summary(run_dir, kind):
    return {s.func: s for s in inspect.calls(run_dir).summary if s.caller == "worker0" and s.kind == kind}


def test_rpc_async_calls_past_the_first_are_sampled_for_time_but_all_counted_and_long_ones_listed(tmp_path, runs_dir):
    """Of each function, the first ASYNC_TIMED_FIRST rpc_async calls are timed, then one in
    ASYNC_SAMPLE (a done-callback on every future cost the RPC threads a tenth of a call); the
    others are still counted with their outcome, errors and timeouts too, even when the job
    drops the future right after waiting on it, and one running for LONG_S is listed with its
    call site, thread and request bytes, and ended, whether timed or not."""
    n = tracking.ASYNC_TIMED_FIRST + 10 * tracking.ASYNC_SAMPLE
    quick = tracking.ASYNC_TIMED_FIRST + 1  # hold's calls 0 to ASYNC_TIMED_FIRST are timed, the next two not
    script = MANY_ASYNC.replace("int(sys.argv[2])", str(n)).replace("int(sys.argv[3])", str(quick))
    sync, launcher = _start_synced(tmp_path, runs_dir, script, name="many")
    try:
        run_dir, pending = _two_holds_pending(runs_dir, sync, launcher)
        line = next(i for i, source in enumerate(script.splitlines(), 1) if "first = rpc.rpc_async" in source)
        assert sorted((c.kind, c.call_site.rsplit("/", 1)[-1], c.nbytes) for c in pending) == [
            ("rpc_async", f"many.py:{line} in <module>", 16),
            ("rpc_async", f"many.py:{line + 1} in <module>", 32),
        ], pending
        assert all(c.age_s >= tracking.LONG_S and c.state == "pending" and c.thread for c in pending), pending
        _release(sync, launcher)
    finally:
        kill_if_running(launcher)

    summary = _worker0_summary(run_dir, "rpc_async")
    add, boom, slow, hold = summary["add"], summary["boom"], summary["slow"], summary["hold"]
    assert (add.count, add.errors, add.pending) == (n, 0, 0), add
    assert (boom.count, boom.errors) == (48, 48), boom
    assert (slow.count, slow.timeouts, slow.errors) == (16, 16, 0), slow
    assert (hold.count, hold.pending) == (quick + 2, 0), hold
    assert hold.max_s >= tracking.LONG_S, hold  # the longest call, timed or not
    # Of each function, the first ASYNC_TIMED_FIRST calls are timed, then one in ASYNC_SAMPLE: all
    # of the few calls of boom, slow and hold, a sample of add's.
    assert add.timed == _timed_of(n, tracking.ASYNC_TIMED_FIRST, tracking.ASYNC_SAMPLE), add
    assert (boom.timed, slow.timed, hold.timed) == (48, 16, quick), (boom, slow, hold)
    assert 0 < add.p50_s <= add.p99_s <= add.max_s
    history = inspect.calls(run_dir, history=True)
    assert sorted((c.kind, c.state) for c in history.pending if c.func == "hold") == [("rpc_async", "ok")] * 2
    assert_no_process_left(run_dir)


MANY_SYNC = textwrap.dedent(
    """
    import os, sys, threading, time
    from pathlib import Path

    import torch
    import torch.distributed.rpc as rpc

    SYNC = Path(sys.argv[1])
    N = int(sys.argv[2])  # past the rpc_sync calls of a function that are all timed


    def add(a, b):
        return a + b


    def boom():
        raise ValueError("boom")


    def hold(t, wait):
        while wait and not (SYNC / "release").exists():
            time.sleep(0.02)
        return t.numel()


    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    if rank == 0:
        for i in range(N):
            rpc.rpc_sync("worker1", add, args=(i, 2))
        for _ in range(N):
            try:
                rpc.rpc_sync("worker1", boom)
            except ValueError:
                pass
        for _ in range(N):
            rpc.rpc_sync("worker1", hold, args=(torch.zeros(1), False))
        # Two long calls at once, on two threads, both untimed (one in SYNC_SAMPLE is timed).
        other = threading.Thread(target=rpc.rpc_sync, args=("worker1", hold, (torch.zeros(8), True)))
        other.start()
        (SYNC / "sent").write_text("1")
        assert rpc.rpc_sync("worker1", hold, args=(torch.zeros(4), True)) == 4
        other.join()
    rpc.shutdown()
    """
)


def test_rpc_sync_calls_past_a_functions_first_are_sampled_for_time_but_all_counted_and_long_ones_listed(
    tmp_path, runs_dir
):
    """Of each function, the first SYNC_TIMED_FIRST rpc_sync calls are timed, then one in
    SYNC_SAMPLE (a timed call cost the caller ~4 µs, an untimed one ~2.2); the others are
    counted with their outcome, and one running for LONG_S is listed by the sender from the
    hook's table of calls in flight, with its call site, thread and request bytes, from when it
    started, and ended with its outcome."""
    n = tracking.SYNC_TIMED_FIRST + 3 * tracking.SYNC_SAMPLE + 2  # the next two calls of hold: untimed
    script = MANY_SYNC.replace("int(sys.argv[2])", str(n))
    sync, launcher = _start_synced(tmp_path, runs_dir, script, name="many_sync")
    try:
        run_dir, pending = _two_holds_pending(runs_dir, sync, launcher)
        line = next(i for i, source in enumerate(script.splitlines(), 1) if "== 4" in source)
        sites = sorted((c.kind, c.call_site.rsplit("/", 1)[-1], c.nbytes) for c in pending)
        assert sites[0] == ("rpc_sync", f"many_sync.py:{line} in <module>", 16), pending
        assert sites[1][0] == "rpc_sync" and sites[1][2] == 32, pending  # the thread's: torch's Thread.run calls it
        assert all(c.age_s >= tracking.LONG_S and c.state == "pending" for c in pending), pending
        assert len({c.thread for c in pending}) == 2, pending
        _release(sync, launcher)
    finally:
        kill_if_running(launcher)

    summary = _worker0_summary(run_dir, "rpc_sync")
    add, boom, hold = summary["add"], summary["boom"], summary["hold"]
    timed = _timed_of(n, tracking.SYNC_TIMED_FIRST, tracking.SYNC_SAMPLE)
    assert (add.count, add.errors, add.pending, add.timed) == (n, 0, 0, timed), add
    assert (boom.count, boom.errors, boom.timed) == (n, n, timed), boom
    assert (hold.count, hold.pending, hold.timed) == (n + 2, 0, timed), hold
    assert hold.max_s >= tracking.LONG_S, hold  # the longest call, timed or not
    assert 0 < add.p50_s <= add.p99_s <= add.max_s
    history = inspect.calls(run_dir, history=True)
    assert sorted((c.kind, c.state) for c in history.pending if c.func == "hold") == [("rpc_sync", "ok")] * 2
    assert_no_process_left(run_dir)


def test_a_caller_far_ahead_of_the_sender_counts_the_watched_calls_done_itself():
    """Once HARVEST_AT untimed rpc_async calls are waiting (a sender that cannot keep up), the
    caller's thread takes those done, oldest first up to the first still running, with their
    outcome, and lets their futures go. Real torch futures, completed by hand (no RPC needed)."""
    torch = pytest.importorskip("torch")
    futures = [torch.futures.Future() for _ in range(tracking.HARVEST_AT)]
    for i, future in enumerate(futures[:-2]):
        if i % 10 == 3:
            future.set_exception(ValueError("boom"))
        else:
            future.set_result(i)
    futures[-1].set_result(-1)  # done, but behind one still running: left for the sender
    watched = [
        (
            future,
            "worker1",
            test_a_caller_far_ahead_of_the_sender_counts_the_watched_calls_done_itself,
            (),
            None,
            0,
            1,
            0.0,
        )
        for future in futures
    ]
    tracking._watched.extend(watched)
    try:
        tracking._harvest_done()
        seen = list(tracking._seen_done)
        assert [entry for entry, _, _ in seen] == watched[:-2]
        assert [status for _, status, _ in seen] == ["error" if i % 10 == 3 else "ok" for i in range(len(futures) - 2)]
        assert list(tracking._watched) == watched[-2:]
    finally:
        tracking._watched.clear()
        tracking._seen_done.clear()


class _Unhashable:
    name = "worker2"
    __hash__ = None  # type: ignore[assignment]


def _method_run_by_a_helper():
    pass


def test_the_sender_counts_each_watched_call_by_callee_and_function_a_helpers_by_its_method():
    """The sender's side of untimed rpc_async calls: each done future counted once with its
    outcome, under (callee, function); a helper's call under "helper → method", an unhashable
    callee the slow way; one still running stays watched. Real torch futures, completed by hand."""
    torch = pytest.importorskip("torch")

    def done(value=None, error=None):
        future = torch.futures.Future()
        future.set_exception(error) if error else future.set_result(value)
        return future

    def watched(future, to, func, args=()):
        return (future, to, func, args, None, 0, 1, 0.0)

    me = test_the_sender_counts_each_watched_call_by_callee_and_function_a_helpers_by_its_method
    running = watched(torch.futures.Future(), "worker1", me)
    entries = (
        [watched(done(i), "worker1", me, (i,)) for i in range(5)]
        + [watched(done(error=ValueError("boom")), "worker1", me)] * 2
        + [watched(done(), "worker1", _call_helper, (_method_run_by_a_helper, 1))] * 3
        + [watched(done(), _Unhashable(), me)]
        + [running]
    )
    tracking._watched.extend(entries)
    try:
        out = call_summary.Summariser().process(1.0)
        counts = {
            (e["callee"], e["func"].replace(f"{__name__}.", "")): (e["n"], e["err"]) for e in out if e["e"] == "cstat"
        }
        helper = "_call_helper → _method_run_by_a_helper"
        assert counts == {
            ("worker1", me.__name__): (7, 2),
            ("worker1", helper): (3, 0),
            ("worker2", me.__name__): (1, 0),
        }, counts
        assert list(tracking._watched) == [running]
    finally:
        tracking._watched.clear()


def _call_helper(method, *args):
    return method(*args)


BACK_TO_BACK = textwrap.dedent(
    """
    import os, time

    import torch
    import torch.distributed.rpc as rpc


    def short():
        time.sleep(0.05)


    def long():
        time.sleep(1.6)


    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    if rank == 0:
        end = time.monotonic() + 2.5
        while time.monotonic() < end:  # 32 at a time: each of the callee's threads busy back to back
            torch.futures.wait_all([rpc.rpc_async("worker1", short) for _ in range(32)])
        rpc.rpc_sync("worker1", long)
    rpc.shutdown()
    """
)


def test_the_callee_lists_a_function_served_for_long_not_short_ones_back_to_back(tmp_path, runs_dir):
    """The callee's view comes from its threads' stacks (no hook on its hot path): a call is the
    frame of torch's _run_function that runs it, so short calls back to back on one thread are
    not taken for one long one, while a long call is listed, for its caller, and ended."""
    _launch_to_end(tmp_path, runs_dir, BACK_TO_BACK, "back")
    run_dir = only_run(runs_dir)
    history = inspect.calls(run_dir, history=True)
    served = [(s.worker, s.func, s.caller, s.state) for s in history.serving]
    assert served == [("worker1", "long", "worker0", "done")], served
    short = next(s for s in history.summary if s.func == "short")
    assert short.count >= 32 * 10 and short.max_s < tracking.LONG_S, short
    assert_no_process_left(run_dir)


HELD_THEN_DROPPED = textwrap.dedent(
    """
    import os, time

    import torch.distributed.rpc as rpc


    def make():
        return 7


    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    if rank == 0:
        kept = rpc.remote("worker1", make)  # lives past the sender's report (MIN_AGE_S) ...
        time.sleep(0.6)
        assert kept.to_here() == 7
        del kept  # ... then goes before shutdown: its release is queued, and must not count again
        time.sleep(0.6)
    rpc.shutdown()
    """
)


def test_a_remote_call_whose_handle_was_reported_then_dropped_is_counted_once(tmp_path, runs_dir):
    """The RRef hook queues a handle's record when it is made and, once reported, again when it
    dies; the remote call is counted from the first only (the parameter-server example counted
    each trainer's rpc.remote twice)."""
    _launch_to_end(tmp_path, runs_dir, HELD_THEN_DROPPED, "dropped")
    document = json.loads(rpcctl("inspect", "calls", "--json", "--runs-dir", str(runs_dir)).stdout)
    make = next(s for s in document["summary"] if s["func"] == "make")
    assert (make["kind"], make["count"], make["timed"]) == ("remote", 1, 1), make
    assert_no_process_left(only_run(runs_dir))


HOT, RARE = tracking.ASYNC_TIMED_FIRST + 2 * tracking.ASYNC_SAMPLE, 20  # a method's calls past the first, and another's
HELPED = textwrap.dedent(
    f"""
    import os
    import torch
    import torch.distributed.rpc as rpc


    class PS:
        def hot(self):
            return 1

        def rare(self):
            return 2


    def _call_method(method, rref, *args):  # pytorch/examples' helper
        return method(rref.local_value(), *args)


    def main():
        rank = int(os.environ["RANK"])
        rpc.init_rpc(f"worker{{rank}}", rank=rank, world_size=2)
        if rank == 0:
            ps = rpc.remote("worker1", PS)
            for method, n in ((PS.hot, {HOT}), (PS.rare, {RARE})):
                for _ in range(n):
                    rpc.rpc_sync("worker1", _call_method, args=(method, ps))
                torch.futures.wait_all([rpc.rpc_async("worker1", _call_method, args=(method, ps)) for _ in range(n)])
            for _ in range({HOT}):
                ps.rpc_sync().hot()
            for _ in range({RARE}):
                ps.rpc_sync().rare()
        rpc.shutdown()


    main()
    """
)


def test_a_method_called_through_a_helper_is_sampled_as_its_own_function(tmp_path, runs_dir):
    """TIMED is per method, as the rows are: a method called only through the examples'
    ``_call_method(method, rref)`` (or an RRef proxy) after another method's hot loop has its first
    calls timed, not one in SYNC_SAMPLE or ASYNC_SAMPLE of the helper's (issue 40, item 7: the
    rare method's 20 calls had 1 or 2 timed)."""
    _launch_to_end(tmp_path, runs_dir, HELPED, "helped")
    document = json.loads(rpcctl("inspect", "calls", "--json", "--runs-dir", str(runs_dir)).stdout)
    rows = {(s["func"], s["kind"]): s for s in document["summary"] if s["caller"] == "worker0"}
    for kind, first, every in (
        ("rpc_sync", tracking.SYNC_TIMED_FIRST, tracking.SYNC_SAMPLE),
        ("rpc_async", tracking.ASYNC_TIMED_FIRST, tracking.ASYNC_SAMPLE),
    ):
        hot, rare = rows[("_call_method → PS.hot", kind)], rows[("_call_method → PS.rare", kind)]
        assert (hot["count"], hot["timed"]) == (HOT, _timed_of(HOT, first, every)), hot
        assert (rare["count"], rare["timed"]) == (RARE, RARE), rare
    hot, rare = rows[("rref.hot", "rpc_sync")], rows[("rref.rare", "rpc_sync")]
    assert (hot["count"], hot["timed"]) == (HOT, _timed_of(HOT, tracking.SYNC_TIMED_FIRST, tracking.SYNC_SAMPLE)), hot
    assert (rare["count"], rare["timed"]) == (RARE, RARE), rare
    assert_no_process_left(only_run(runs_dir))


def test_a_call_made_by_torchs_rpc_code_alone_is_sited_in_torch_not_question_mark():
    """On an RPC server thread (a C++ thread that enters Python in torch's RPC code) a call made
    by torch's own code has no frame of the job's: its site is torch's innermost frame, which
    says whose call it is, not "?" (issue 40, item 7: call spans of >= 1 s sited "?"). A thread
    started by ``_thread.start_new_thread`` has the same stack: only the function it runs."""
    import _thread
    import os
    import threading

    import torch.distributed.rpc as rpc

    from rpcctl.rank.rrefs import hooks
    from rpcctl.rank.rrefs.sender import Tracker

    hooks.skip_frames_of(rpc)
    torch_file = os.path.join(os.path.dirname(rpc.__file__), "api.py")  # as torch's own code is named
    space: dict = {"hooks": hooks, "sys": __import__("sys")}
    exec(
        compile(
            "def _broadcast_like(out, done):\n    out.append(hooks.caller(1))\n    done.set()\n", torch_file, "exec"
        ),
        space,
    )
    out, done = [], threading.Event()
    _thread.start_new_thread(space["_broadcast_like"], (out, done))
    assert done.wait(10)
    code, lasti = out[0]
    assert code is space["_broadcast_like"].__code__, code
    assert Tracker()._site(code, lasti) == "torch/distributed/rpc/api.py:2 in _broadcast_like"
    # A frame of the job's above torch's still wins.
    assert hooks.caller(1)[0] is test_a_call_made_by_torchs_rpc_code_alone_is_sited_in_torch_not_question_mark.__code__
