"""A job whose ranks are started by separate launches, one rank each, as pytorch/examples'
parameter server runs it (tests/workers/rank_per_launch.py: ``--rank R``, MASTER_* set by the
program, the rank's work in an ``mp.Process`` its parent joins) (issue 40, item 1).

Runs that met at one rendezvous are one job: each says so, and shows the job's RRefs whole (the
ps's run alone saw its 6 RRefs "live": the trainers' runs saw them released; theirs, "remote"
with no shape or call site: the ps's run knows what they are). A rank whose work waits in
``rpc.shutdown()`` for a worker that is gone is diagnosed with that worker's name. One real job of
three launches (``job``: trainer_2's process raises after its calls) is shared by the tests that
read it.

multiprocessing hides a process's exception from its parent (the parent's ``join`` returns, its
own exit is 0): a launch whose rank's process raised still fails, naming that process.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

import pytest
import yaml
from conftest import WORKERS, assert_no_process_left, record, rpcctl

from rpcctl import inspect

pytestmark = pytest.mark.timeout(120)

JOB = str(WORKERS / "rank_per_launch.py")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORLD, TRAINERS, CALLS = 3, 2, 3  # tests/workers/rank_per_launch.py: each trainer holds 3 RRefs of the ps's parameter
RAISES = 2  # trainer_2's process raises after its calls; its parent exits 0


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Three launches at once (ps, trainer_1, trainer_2), each of one rank, meeting at one port.
    trainer_2's launch fails (its process raised); the others are left in rpc.shutdown, waiting
    for it, until their hang watchdog stops them."""
    tmp = tmp_path_factory.mktemp("three-launches")
    runs_dir, port = tmp / "runs", str(_free_port())
    launchers = []
    for rank in range(WORLD):
        config = tmp / f"rank{rank}.yaml"
        args = ["--rank", str(rank), "--world", str(WORLD), "--port", port, "--raise-in", str(RAISES)]
        config.write_text(
            yaml.safe_dump(
                {
                    "name": f"ps-rank{rank}",
                    "script": JOB,
                    "nproc_per_node": 1,
                    "timeout": 90,
                    "grace": 2,
                    "hang_timeout": 3,
                    "preload": [],
                    "args": args,
                }
            )
        )
        launchers.append(
            subprocess.Popen(
                [sys.executable, "-m", "rpcctl", "launch", str(config), "--runs-dir", str(runs_dir), "--no-live"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    try:
        outputs = [launcher.communicate(timeout=100) for launcher in launchers]
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
                launcher.communicate()
    runs = {record(d)["name"]: d for d in runs_dir.iterdir() if (d / "run.json").is_file()}
    for run_dir in runs.values():
        assert_no_process_left(run_dir)
    assert [launcher.returncode for launcher in launchers] == [1] * WORLD, outputs
    return [runs[f"ps-rank{rank}"] for rank in range(WORLD)], outputs


def test_a_launch_whose_rank_process_raised_fails_naming_that_process(job):
    runs, outputs = job
    run_dir, rec = runs[RAISES], record(runs[RAISES])
    # the program saw it, and went on
    assert f"rank {RAISES} process exit code 1" in (run_dir / "logs" / "rank-0.log").read_text()
    assert rec["status"] == "failed", rec
    rank = rec["ranks"][0]
    assert (rank["state"], rank["exit_code"]) == ("failed", 0), rank
    (written,) = (run_dir / "errors").glob("process-*.json")
    assert stat.S_IMODE(os.stat(written).st_mode) == 0o600
    pid = json.loads(written.read_text())["pid"]
    cause = rec["root_cause"]
    assert cause["message"] == (
        f"trainer_2 (pid {pid}, Process-1, rank 0 › pid {pid}) raised RuntimeError: trainer_2 lost its gradient; "
        "rank 0 exited 0 all the same: multiprocessing does not pass a process's exception to its parent"
    )
    assert (
        cause["error_type"] == "RuntimeError" and "in run" in cause["traceback"] and "rpcctl" not in cause["traceback"]
    )
    assert f"root cause: rank 0 (pid {rank['pid']}, exit code 0): trainer_2 (pid {pid}" in outputs[RAISES][1], outputs[
        RAISES
    ][1]
    shown = json.loads(rpcctl("inspect", "workers", str(run_dir), "--json").stdout)
    child = next(w for w in shown if w["pid"] == pid)
    assert (child["name"], child["state"], child["exit_code"]) == ("trainer_2", "failed", 1), child


@pytest.mark.parametrize("rank", range(WORLD))
def test_each_launch_of_a_job_shows_its_rrefs_whole(job, rank):
    runs, _ = job
    shown = inspect.rrefs(runs[rank])  # the SDK the CLI's view prints (its JSON: the same records)
    assert len(shown) == TRAINERS * CALLS, shown
    for rref in shown:  # the owner's run knows what each is; the trainers' runs, how it ended
        assert (rref.owner, rref.kind, rref.type, rref.shape) == ("ps", "local", "Tensor", [4, 4]), rref
        assert rref.call_site.endswith("rank_per_launch.py:24 in get_param"), rref
        assert (rref.state, rref.forks) == ("deleted", 1), rref
    # trainer_1 held its 3 into rpc.shutdown; trainer_2's went as its run() raised
    assert sorted(str(r.ending) for r in shown) == ["None"] * CALLS + ["at shutdown"] * CALLS, shown


@pytest.mark.parametrize("rank", range(WORLD))
def test_each_launch_of_a_job_names_the_others(job, rank):
    runs, _ = job
    table = " ".join(rpcctl("inspect", "rrefs", str(runs[rank])).stdout.split())
    others = [f"{runs[r].name} ({'ps' if r == 0 else f'trainer_{r}'})" for r in range(WORLD) if r != rank]
    assert f"3 workers) is one job with 2 other runs in {runs[rank].parent}: {', '.join(others)}" in table, table


@pytest.mark.parametrize("rank", [0, 1])
def test_a_launch_left_in_rpc_shutdown_names_the_worker_it_waits_for(job, rank):
    runs, outputs = job
    cause = record(runs[rank])["root_cause"]
    name = "ps" if rank == 0 else "trainer_1"
    assert cause["reason"] == "hang", cause
    assert re.search(
        rf"{name} \(pid \d+\) waits in rpc.shutdown for trainer_2, which ended without calling it "
        rf"\(run {runs[RAISES].name}, exit code 1\)",
        cause["message"],
    ), cause["message"]
    assert "waits in rpc.shutdown for trainer_2" in (runs[rank] / "hang" / "diagnosis.txt").read_text()
