"""Real RPC jobs through ``rpcctl launch``, inspected while they run and after they end.

The scripts are unmodified torch RPC programs (one also calls rpcctl.report); they pause at
files the test creates, so every assertion about a live run happens at a known point."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from conftest import (
    assert_no_process_left,
    kill_if_running,
    launch_job,
    only_run,
    record,
    rpcctl,
    start_rpcctl,
    wait_until,
)
from rpcctl import inspect

pytestmark = pytest.mark.timeout(150)

# Visible latency the issue asks for is 1 s; the design gives ~0.5 s (0.2 s age filter, 0.1 s
# send cycle, 0.1 s commit). The margin absorbs a loaded 2-core CI machine.
VISIBLE_WITHIN_S = 2.0

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    import torch
    import torch.distributed.rpc as rpc
    import rpcctl

    SYNC = Path(sys.argv[1])


    class KV:
        def __init__(self):
            self.table = torch.arange(10, dtype=torch.int64)

        def size(self):
            return self.table.numel()


    def make(rows, cols):
        return torch.ones(rows, cols)


    _kept = []


    def keep(rref):
        _kept.append(rref)
        return len(_kept)


    def drop_all():
        _kept.clear()


    def wait_for(name):
        deadline = time.time() + 90
        while not (SYNC / name).exists():
            if time.time() > deadline:
                raise SystemExit(f"timed out waiting for {name}")
            time.sleep(0.02)


    def main():
        rank = int(os.environ["RANK"])
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
        if rank == 0:
            big = rpc.remote("worker1", make, args=(16, 32))
            kv = rpc.remote("worker1", KV)
            local = rpc.RRef(torch.zeros(10, dtype=torch.float64))
            rpc.rpc_sync("worker1", keep, args=(local,))
            size = kv.remote().size()
            for step, loss in enumerate([0.9, 0.52, 0.3125]):
                print(f"step {step} loss {loss}", flush=True)
            print("Epoch 3: 0.125", flush=True)
            print("loss did not go down: 1 -> 2 (not a loss)", flush=True)
            (SYNC / "created").write_text(repr(time.time()))
            wait_for("delete")
            del big
            rpc.rpc_sync("worker1", drop_all)
            (SYNC / "deleted").write_text(repr(time.time()))
            wait_for("finish")
        else:
            for step in range(3):
                rpcctl.report(step=step, loss=1.0 / (step + 1), acc=0.5 * step)
        rpc.shutdown()


    main()
    """
)

SPAWN_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    import torch
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp


    def make(n):
        return torch.ones(n)


    def run(rank, world_size, sync):
        rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world_size)
        if rank == 0:
            shard = rpc.remote("trainer1", make, args=(6,))
            shard.to_here()
            (Path(sync) / "made").write_text("1")
            while not (Path(sync) / "finish").exists():
                time.sleep(0.02)
        rpc.shutdown()


    if __name__ == "__main__":
        # The launcher gave this rank MASTER_ADDR/MASTER_PORT; the children use them.
        mp.spawn(run, args=(2, sys.argv[1]), nprocs=2, join=True)
    """
)


def _line(script: str, text: str) -> int:
    return next(i for i, line in enumerate(script.splitlines(), 1) if text in line)


def _config(tmp_path: Path, name: str, script: str, nproc: int, sync: Path) -> Path:
    (tmp_path / f"{name}.py").write_text(script)
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        f"name: {name}\nscript: {name}.py\nargs: [{json.dumps(str(sync))}]\nnproc_per_node: {nproc}\ntimeout: 120\n"
    )
    return config


@contextlib.contextmanager
def _launched(config: Path, runs_dir: Path):
    """``rpcctl launch CONFIG`` in the background: (launcher, run_dir); killed if still alive."""
    launcher = start_rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir))
    try:
        yield launcher, only_run(runs_dir)
    finally:
        kill_if_running(launcher)


def _finish(launcher, sync: Path) -> tuple[str, str]:
    (sync / "finish").touch()
    out, err = launcher.communicate(timeout=90)
    assert launcher.returncode == 0, (out, err)
    return out, err


def _wait_file(path: Path, run_dir: Path, launcher, timeout: float = 90) -> float:
    def ready():
        if launcher.poll() is not None:
            out, err = launcher.communicate()
            raise AssertionError(f"the job ended early ({launcher.returncode}):\n{out}\n{err}")
        return path.exists()

    wait_until(ready, timeout, f"{path.name} from the job", logs=run_dir / "logs")
    return float(path.read_text()) if path.read_text().strip() not in ("", "1") else time.time()


def _rrefs_when(run_dir: Path, predicate, what: str, timeout: float):
    return wait_until(
        lambda: (lambda rs: rs if predicate(rs) else None)(inspect.rrefs(run_dir)), timeout, what, logs=run_dir / "logs"
    )


def test_a_live_job_shows_its_rrefs_workers_stacks_and_losses(tmp_path, runs_dir):
    sync = tmp_path / "sync"
    sync.mkdir()
    config = _config(tmp_path, "tracked", SCRIPT, 2, sync)
    with _launched(config, runs_dir) as (launcher, run_dir):
        created = _wait_file(sync / "created", run_dir, launcher)

        # RRefs appear with owner, type and bytes; the fork to worker1 shows as a holder.
        records = _rrefs_when(
            run_dir, lambda rs: len(rs) == 4 and all(r.type for r in rs) and rs[2].forks == 1, "four RRefs", 30
        )
        seen_after = time.time() - created
        big, kv, local, size = records
        assert (
            big.owner,
            big.owner_rank,
            big.creator,
            big.type,
            big.shape,
            big.dtype,
            big.nbytes,
            big.state,
            big.callee,
        ) == ("worker1", 1, "worker0", "Tensor", [16, 32], "float32", 2048, "live", "make")
        assert big.call_site.endswith(f"tracked.py:{_line(SCRIPT, 'big = ')} in main") and big.holders == ["worker0"]
        assert (kv.owner, kv.type, kv.nbytes, kv.dtype, kv.state) == ("worker1", "KV", 80, "int64", "live")
        assert (local.kind, local.owner, local.type, local.nbytes, local.holders, local.state) == (
            "local",
            "worker0",
            "Tensor",
            80,
            ["worker0", "worker1"],
            "live",
        )
        # via rref.remote()
        assert (size.owner, size.type, size.callee, size.state) == ("worker1", "int", "KV.size", "live")
        assert seen_after <= VISIBLE_WITHIN_S, f"new RRefs took {seen_after:.2f} s to show"

        # The workers view is the real processes, checked as a real subprocess once.
        result = rpcctl("inspect", "workers", "--json", "--runs-dir", str(runs_dir))
        assert result.returncode == 0, result.stderr
        workers = json.loads(result.stdout)
        pids = [r["pid"] for r in record(run_dir)["ranks"]]
        assert [(w["rank"], w["name"], w["pid"], w["state"], w["kind"]) for w in workers] == [
            (0, "worker0", pids[0], "running", "rank"),
            (1, "worker1", pids[1], "running", "rank"),
        ]
        for w in workers:
            assert psutil.Process(w["pid"]).environ()["RPCCTL_RUN_ID"] == run_dir.name
            assert w["heartbeat_age_s"] < 5 and not w["stale"] and w["rss_bytes"] > 10 << 20 and w["device"] == "cpu"

        # rpcctl stack: the live rank's Python stacks.
        result = rpcctl("stack", "--rank", "0", "--runs-dir", str(runs_dir))
        assert result.returncode == 0, result.stderr
        assert (
            result.stdout.startswith(f"── rank 0 (pid {pids[0]}) ──")
            and "wait_for" in result.stdout
            and 'File "' in result.stdout
        )
        # rpcctl's own threads and frames are named and hidden; --all-frames shows them.
        assert "rpcctl's telemetry sender (hidden; --all-frames shows it)" in result.stdout, result.stdout
        assert "/rpcctl/" not in result.stdout and "[rpcctl frames hidden]" in result.stdout, result.stdout
        everything = rpcctl("stack", "--rank", "0", "--all-frames", "--runs-dir", str(runs_dir)).stdout
        assert "rpcctl/rank/reporter.py" in everything and "rpcctl/rank/runtime.py" in everything, everything

        # Deleting changes the state; releasing the fork removes the holder.
        (sync / "delete").touch()
        deleted = _wait_file(sync / "deleted", run_dir, launcher)
        _rrefs_when(run_dir, lambda rs: rs[0].state == "deleted" and rs[2].holders == ["worker0"], "deletion", 30)
        assert time.time() - deleted <= VISIBLE_WITHIN_S

        _finish(launcher, sync)

    # After the run: printed losses match exactly; rank 1 reported its own (with a metric).
    # Steps as printed (none on "Epoch 3: 0.125": epoch 3 comes after step 2, so the rank is
    # still keyed by (epoch, step)) and as reported.
    losses = [(r.rank, r.seq, r.step, r.epoch, r.loss, r.source, r.metrics) for r in inspect.losses(run_dir)]
    assert sorted(losses, key=lambda r: (r[0], r[1])) == [  # arrival order across ranks is free
        (0, 0, 0, None, 0.9, "log", {}),
        (0, 1, 1, None, 0.52, "log", {}),
        (0, 2, 2, None, 0.3125, "log", {}),
        (0, 3, None, 3, 0.125, "log", {}),
        (1, 0, 0, None, 1.0, "report", {"acc": 0.0}),
        (1, 1, 1, None, 0.5, "report", {"acc": 0.5}),
        (1, 2, 2, None, 1.0 / 3, "report", {"acc": 1.0}),
    ]
    assert {r.keyed_by for r in inspect.losses(run_dir)} == {inspect.BY_STEP}
    # Still referenced when rank 0 called rpc.shutdown(), which released them: all but the deleted
    # one. kv and size were not used while the script waited for the test: held unused; the
    # rpc.RRef(value) is a handle on a tensor its owner keeps, so only held to the end.
    assert inspect.leaked_rrefs(run_dir) == []
    ended = [(r.type, r.call_site.rsplit("/", 1)[-1], r.ending) for r in inspect.ended_rrefs(run_dir)]
    assert ended == [
        ("KV", f"tracked.py:{_line(SCRIPT, 'kv = ')} in main", "held unused"),
        ("Tensor", f"tracked.py:{_line(SCRIPT, 'local = ')} in main", "at shutdown"),
        ("int", f"tracked.py:{_line(SCRIPT, 'size = ')} in main", "held unused"),
    ], ended
    document = json.loads(rpcctl("inspect", "rrefs", "--json", "--runs-dir", str(runs_dir)).stdout)
    assert [r["state"] for r in document] == ["deleted"] * 4

    # What telemetry cost, measured by its own threads: there, and a small part of the whole.
    workers = json.loads(rpcctl("inspect", "workers", "--json", "--runs-dir", str(runs_dir)).stdout)
    assert all(w["cpu_s"] > 0 and 0 < w["telemetry_cpu_s"] < w["cpu_s"] for w in workers), workers
    cost = inspect.telemetry_cost(run_dir)
    assert cost.senders_cpu_s == pytest.approx(sum(w["telemetry_cpu_s"] for w in workers))
    assert cost.server_cpu_s > 0 and 0 < cost.share < 0.5, cost
    assert cost.refused_messages == 0, "the server refused events a real worker sent (protocol.EVENT_FIELDS too strict)"
    table = rpcctl("inspect", "workers", "--runs-dir", str(runs_dir)).stdout
    assert table.rstrip().splitlines()[-1].startswith("telemetry CPU: senders "), table
    assert_no_process_left(run_dir)


def test_rrefs_of_a_script_that_spawns_its_own_ranks(tmp_path, runs_dir):
    sync = tmp_path / "sync"
    sync.mkdir()
    config = _config(tmp_path, "spawner", SPAWN_SCRIPT, 1, sync)
    with _launched(config, runs_dir) as (launcher, run_dir):
        _wait_file(sync / "made", run_dir, launcher)
        (shard,) = _rrefs_when(run_dir, lambda rs: len(rs) == 1 and rs[0].type, "the shard RRef", 30)
        assert (shard.owner, shard.creator, shard.type, shard.shape, shard.nbytes, shard.state) == (
            "trainer1",
            "trainer0",
            "Tensor",
            [6],
            24,
            "live",
        )
        assert shard.call_site.endswith(f"spawner.py:{_line(SPAWN_SCRIPT, 'shard = ')} in run")
        workers = inspect.workers(run_dir)
        launched = record(run_dir)["ranks"][0]["pid"]
        assert [(w.rank, w.kind, w.name) for w in workers] == [
            (0, "rank", None),
            (0, "child", "trainer0"),
            (0, "child", "trainer1"),
        ]
        assert workers[0].pid == launched and {w.parent_pid for w in workers[1:]} == {launched}
        # The table shows the trainers as rank 0's children (RPC name, pid), not as more rows of rank 0.
        table = rpcctl(
            "inspect", "workers", "--runs-dir", str(runs_dir), env={**os.environ, "COLUMNS": "200"}
        ).stdout.splitlines()
        assert table[1].split()[:2] == ["0", "-"] and str(launched) in table[1].split(), table
        for worker, line in zip(workers[1:], table[2:4]):
            assert (
                line.split()[:6] == ["└", worker.name, "(child", "of", "rank", "0)"] and str(worker.pid) in line.split()
            ), table

        # rpcctl stack reaches the spawned trainers too: that is where such a job hangs.
        result = rpcctl("stack", "--rank", "0", "--runs-dir", str(runs_dir))
        assert result.returncode == 0, result.stderr
        sections = result.stdout.split("── rank 0 ")[1:]
        assert [s.split(" ", 3)[:2] for s in sections[1:]] == [["›", "pid"], ["›", "pid"]], result.stdout
        assert sections[0].startswith(f"(pid {launched}) ──") and "spawn" in sections[0]
        child_pids = sorted(int(s.split()[2].rstrip(":")) for s in sections[1:])
        assert child_pids == sorted(w.pid for w in workers[1:]), result.stdout
        assert all("in run" in s and 'File "' in s for s in sections[1:]), result.stdout
        out, err = _finish(launcher, sync)
    assert_no_process_left(run_dir)
    assert "as a ProcessGroup" not in out + err  # torch's own init_rpc warning, silenced in the trainers too
    # The trainers' exit codes, as their parent (mp.spawn's join) reaped them.
    assert [(w.kind, w.state, w.exit_code) for w in inspect.workers(run_dir)] == [
        ("rank", "succeeded", 0),
        ("child", "succeeded", 0),
        ("child", "succeeded", 0),
    ]
    # The trainers were asked for their stacks, so their files stay; nothing else was left.
    assert sorted(p.name.split("-")[0] for p in (run_dir / "stacks").iterdir()) == ["pid", "pid", "rank"]


def test_report_in_a_forked_child_uses_its_own_connection(tmp_path):
    """A forked child (a DataLoader worker, mp with fork) must not write on its parent's
    connection: it joins on its own when it reports."""
    from rpcctl.telemetry.server import TelemetryServer

    server = TelemetryServer(tmp_path / "run", None, 1)
    env = server.start()
    code = textwrap.dedent(
        """
        import os
        from rpcctl.rank import reporter as worker
        worker.start()
        worker.report(step=0, loss=1.0)
        pid = os.fork()
        if pid == 0:
            worker.report(step=0, loss=2.0)
            worker.stop()
            os._exit(0)
        os.waitpid(pid, 0)
        worker.report(step=1, loss=0.5)
        worker.stop()
        """
    )
    try:
        child_env = dict(os.environ, RANK="0", **env)
        result = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        wait_until(lambda: len(inspect.losses(server.run_dir)) == 3, 10, "three losses")
    finally:
        server.close()
    assert server.bad_messages == 0
    kinds = sorted(w.kind for w in inspect.workers(server.run_dir))
    assert kinds == ["child", "rank"]
    assert sorted((r.step, r.loss) for r in inspect.losses(server.run_dir)) == [(0, 1.0), (0, 2.0), (1, 0.5)]


SITES_SCRIPT = textwrap.dedent(
    """
    import os, time

    import torch
    import torch.distributed.rpc as rpc
    from torch.distributed.optim import DistributedOptimizer


    def make_param():
        return torch.nn.Parameter(torch.ones(2))


    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    if rank == 1:
        param = rpc.remote("worker0", make_param)
        opt = DistributedOptimizer(torch.optim.SGD, [param], lr=0.1)
        time.sleep(1.0)  # both RRefs outlive the 0.2 s below which they are only counted
        del opt, param
    rpc.shutdown()
    """
)


def test_call_sites_name_installed_code_by_its_import_path(tmp_path, runs_dir):
    # DistributedOptimizer makes its RRef inside torch, on the parameter's owner: its site read
    # /.../.venv/lib/python3.11/site-packages/torch/distributed/optim/optimizer.py:101, four
    # folded lines of the CALL SITE column.
    script = tmp_path / "sites.py"
    script.write_text(SITES_SCRIPT)
    result, run_dir, _ = launch_job(tmp_path, runs_dir, script=str(script), nproc_per_node=2, preload=["torch"])
    assert result.returncode == 0, result.stdout + result.stderr
    sites = sorted(r.call_site for r in inspect.rrefs(run_dir))
    assert len(sites) == 2, sites
    assert sites[0].startswith("/") and sites[0].endswith(f"sites.py:{_line(SITES_SCRIPT, 'param = ')} in <module>"), (
        sites
    )
    assert (
        sites[1].startswith("torch/distributed/optim/optimizer.py:") and " in _new_script_local_optimizer" in sites[1]
    ), sites
