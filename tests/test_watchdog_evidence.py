"""The hang watchdog stops a job only on evidence of its own (issue 38): a silence in telemetry
is a suspicion, checked against the processes (two looks at their stacks and CPU) and against
telemetry's own health. Real jobs: one that computes silently (a Python stack that walks on; one
long C call), one whose disk fills under it while it works silently, one whose hang evidence
cannot be written, and one whose rank ended before the others' init_process_group."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from conftest import assert_no_process_left, kill_if_running, only_run, record, rpcctl, start_rpcctl
from test_faults import tmpfs

pytestmark = pytest.mark.timeout(180)

HANG_TIMEOUT = 4  # the watchdog looks at 3 s of silence and again at 4 s


def _launch(tmp_path: Path, runs_dir: Path, name: str, script: str, nproc: int = 2, timeout: float = 120) -> tuple:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(script))
    config = tmp_path / f"{name}.yaml"
    config.write_text(f"name: {name}\nscript: {name}.py\nnproc_per_node: {nproc}\ngrace: 2\ntimeout: 100\n")
    result = rpcctl(
        "launch",
        str(config),
        "--no-live",
        "--runs-dir",
        str(runs_dir),
        "--hang-timeout",
        str(HANG_TIMEOUT),
        timeout=timeout,
    )
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    return result, run_dir


RPC_PAIR = """
    import os, time
    import torch.distributed.rpc as rpc

    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    """

# 40 sleeps of 0.25 s, each on its own line: a Python stack that walks on, with no CPU to speak of.
WALKING = (
    RPC_PAIR
    + """
    if rank == 0:
        print("walking", flush=True)
"""
    + "".join("        time.sleep(0.25)\n" for _ in range(40))
    + """
        print("walked", flush=True)
    rpc.shutdown()
    """
)


def test_a_silent_job_whose_stack_walks_on_is_not_stopped(tmp_path, runs_dir):
    """10 s without a line, a call or a loss (the hang timeout is 4 s): rank 0's stack is at
    another line at every look, so the silence is not a hang. The old watchdog stopped it."""
    result, run_dir = _launch(tmp_path, runs_dir, "walking", WALKING)
    assert result.returncode == 0, result.stderr
    assert "[rank0]: walked" in result.stdout
    moved = [line for line in result.stderr.splitlines() if "but the job moves" in line]
    assert len(moved) == 1, result.stderr  # said once a run, not at every silence
    assert "rank 0 (pid " in moved[0] and "its Python stack changed: " in moved[0] and "walking.py:" in moved[0], moved[
        0
    ]
    assert not (run_dir / "hang").exists()


COMPUTING = (
    RPC_PAIR
    + """
    if rank == 0:
        import torch

        torch.set_num_threads(1)  # the product runs on the main thread
        a = torch.rand(5500, 5500, dtype=torch.float64)
        print("computing", flush=True)
        b = a @ a  # one C call of ~8 s (torch lets go of the GIL): the Python stack stays the same
        print("computed", b.shape[0], flush=True)
    rpc.shutdown()
    """
)


def test_a_long_computation_in_one_c_call_is_not_stopped(tmp_path, runs_dir):
    """The same Python stack at both looks, but the main thread was on the CPU in between, with
    no call or collective of its own in flight: it computes."""
    result, run_dir = _launch(tmp_path, runs_dir, "computing", COMPUTING)
    assert result.returncode == 0, result.stderr
    assert "[rank0]: computed 5500" in result.stdout
    moved = [line for line in result.stderr.splitlines() if "but the job moves" in line]
    assert len(moved) == 1 and "rank 0 (pid " in moved[0] and "its main thread ran " in moved[0], result.stderr
    assert "computing.py:" in moved[0] and "b = a @ a" in moved[0], moved[0]


FILLS_THE_DISK = (
    """
    def echo(x):
        return x
    """
    + RPC_PAIR
    + """
    if rank == 0:
        # Fill the run's file system (a 2 MiB tmpfs) to the last byte, then work silently for 12 s:
        # rpc_sync calls, each one progress, none of which the store can keep any more.
        fd = os.open(os.path.join(os.environ["RPCCTL_RUN_DIR"], "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"x" * 4096)
        except OSError:
            os.close(fd)
        print("disk full", flush=True)
        calls, started = 0, time.time()
        while time.time() - started < 12:
            rpc.rpc_sync("worker1", echo, args=(calls,))
            calls += 1
        print("calls", calls, flush=True)
    rpc.shutdown()
    """
)


def test_a_healthy_job_on_a_full_disk_is_not_stopped_as_hung(tmp_path):
    """The store cannot be written any more: telemetry is impaired, so its silence is no one's
    evidence. One warning from the store, one from the watchdog; the job's exit code is its own,
    and the record ends (the old watchdog stopped this job as hung, then died writing the evidence)."""
    with tmpfs(tmp_path / "small", "size=2m,mode=0755") as where:
        runs_dir = where / "runs"
        result, run_dir = _launch(tmp_path, runs_dir, "fills", FILLS_THE_DISK)
        ended = record(run_dir)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "[rank0]: calls " in result.stdout
    impaired = [line for line in result.stderr.splitlines() if "declares no hang while telemetry is impaired" in line]
    assert len(impaired) == 1 and "the telemetry store cannot be written" in impaired[0], result.stderr
    assert "has sent no telemetry heartbeat" not in result.stderr, result.stderr
    assert ended["status"] == "succeeded" and ended["ended_at"], ended


# The callee's function is defined before init_rpc: a call that reaches worker1 before its script
# defined it fails to unpickle ("Can't get attribute 'slow_update'"), seen once on a loaded machine.
SLEEPING_CALLEE = (
    """
    import time

    def slow_update():
        time.sleep(600)
    """
    + RPC_PAIR
    + """
    if rank == 0:
        rpc.rpc_sync("worker1", slow_update)
    rpc.shutdown()
    """
)


def test_a_hang_whose_evidence_cannot_be_written_is_still_told_and_the_record_ends(tmp_path, runs_dir):
    """``hang`` is taken by a file: the evidence cannot be written. The verdict is the same (the
    callee named), one warning says what was not kept, no traceback, the record ends failed."""
    (tmp_path / "sleeping.py").write_text(textwrap.dedent(SLEEPING_CALLEE))
    config = tmp_path / "sleeping.yaml"
    config.write_text("name: sleeping\nscript: sleeping.py\nnproc_per_node: 2\ngrace: 2\ntimeout: 100\n")
    launcher = start_rpcctl(
        "launch", str(config), "--no-live", "--runs-dir", str(runs_dir), "--hang-timeout", str(HANG_TIMEOUT)
    )
    try:
        run_dir = only_run(runs_dir)
        (run_dir / "hang").write_text("not a folder\n")
        out, err = launcher.communicate(timeout=120)
    finally:
        kill_if_running(launcher)
    assert_no_process_left(run_dir)
    assert launcher.returncode == 1, err
    assert "Traceback" not in err, err
    unwritten = [line for line in err.splitlines() if "could not write the hang evidence" in line]
    assert len(unwritten) == 1 and "(the verdict stands)" in unwritten[0], err
    ended = record(run_dir)
    assert ended["status"] == "failed" and ended["root_cause"]["reason"] == "hang", ended
    assert "worker1 is running slow_update for worker0" in ended["root_cause"]["message"]
    assert "evidence: not written" in ended["root_cause"]["traceback"]
    assert (run_dir / "hang").read_text() == "not a folder\n"


LEAVES_EARLY = """
    import os, sys
    import torch.distributed as dist

    if os.environ["RANK"] == "1":
        print("rank 1 leaves", flush=True)
        sys.exit(0)
    dist.init_process_group("gloo")
    """


def test_a_rank_that_ended_before_init_process_group_is_named(tmp_path, runs_dir):
    """Rank 1 exits 0 before init_process_group; rank 0 waits in it for a rank that is gone.
    The old diagnosis said "no call in flight" and named no one."""
    result, run_dir = _launch(tmp_path, runs_dir, "early", LEAVES_EARLY)
    assert result.returncode == 1, result.stderr
    cause = record(run_dir)["root_cause"]
    pids = [r["pid"] for r in record(run_dir)["ranks"]]
    assert cause["reason"] == "hang" and cause["pid"] == pids[1], cause
    assert cause["message"].startswith(
        f"hang: rank 1 (pid {pids[1]}) exited with code 0 before entering init_process_group; "
        f"rank 0 (pid {pids[0]}) waits in init_process_group for it, at "
    ), cause["message"]
    assert 'dist.init_process_group("gloo")' in cause["message"]


def test_the_watchdog_says_once_when_it_has_nothing_to_judge(tmp_path, runs_dir):
    """A job that never enters init_rpc or init_process_group (a Monarch job, a plain script):
    the hang timeout passes, the watchdog says once that it does not watch such a job."""
    result, _ = _launch(
        tmp_path, runs_dir, "plain", "import time\ntime.sleep(7)\nprint('slept', flush=True)\n", nproc=1
    )
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "has nothing to judge it by" in line]
    assert len(said) == 1 and "hang_timeout (4.0 s)" in said[0], result.stderr
    assert json.loads(rpcctl("runs", "--json", "--runs-dir", str(runs_dir)).stdout)[0]["status"] == "succeeded"
