"""A job whose ranks are started by separate launches, one rank each, as pytorch/examples'
parameter server runs it (tests/workers/rank_per_launch.py: ``--rank R``, MASTER_* set by the
program, the rank's work in an ``mp.Process`` its parent joins) (issue 40, item 1).

Runs that met at one rendezvous are one job: each says so, and shows the job's RRefs whole (the
ps's run alone saw its 6 RRefs "live": the trainers' runs saw them released; theirs, "remote"
with no shape or call site: the ps's run knows what they are). One real job of three launches
(``job``) is shared by the tests that read it.

multiprocessing hides a process's exception from its parent (the parent's ``join`` returns, its
own exit is 0): a launch whose rank's process raised still fails, naming that process.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
import yaml
from conftest import WORKERS, assert_no_process_left, launch_job, record, rpcctl

pytestmark = pytest.mark.timeout(120)

JOB = str(WORKERS / "rank_per_launch.py")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_launch_whose_rank_process_raised_fails_naming_that_process(tmp_path, runs_dir):
    """World of one: the ps's process raises; its parent exits 0."""
    args = ["--rank", "0", "--world", "1", "--port", str(_free_port()), "--raise-in", "0"]
    result, run_dir, rec = launch_job(tmp_path, runs_dir, name="raised", script=JOB, args=args, nproc_per_node=1, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "rank 0 process exit code 1" in (run_dir / "logs" / "rank-0.log").read_text()  # the program saw it, and went on
    assert rec["status"] == "failed", rec
    rank = rec["ranks"][0]
    assert (rank["state"], rank["exit_code"]) == ("failed", 0), rank
    (written,) = (run_dir / "errors").glob("process-*.json")
    assert stat.S_IMODE(os.stat(written).st_mode) == 0o600
    pid = json.loads(written.read_text())["pid"]
    cause = rec["root_cause"]
    assert cause["message"] == (f"ps (pid {pid}, Process-1, rank 0 › pid {pid}) raised RuntimeError: ps lost its gradient; "
                                "rank 0 exited 0 all the same: multiprocessing does not pass a process's exception to its parent")
    assert cause["error_type"] == "RuntimeError" and "in run" in cause["traceback"] and "rpcctl" not in cause["traceback"]
    assert f"root cause: rank 0 (pid {rank['pid']}, exit code 0): ps (pid {pid}" in result.stderr, result.stderr
    shown = json.loads(rpcctl("inspect", "workers", str(run_dir), "--json").stdout)
    child = next(w for w in shown if w["pid"] == pid)
    assert (child["name"], child["state"], child["exit_code"]) == ("ps", "failed", 1), child


WORLD, TRAINERS, CALLS = 3, 2, 3  # tests/workers/rank_per_launch.py: each trainer holds 3 RRefs of the ps's parameter


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Three launches at once (ps, trainer_1, trainer_2), each of one rank, meeting at one port."""
    tmp = tmp_path_factory.mktemp("three-launches")
    runs_dir, port = tmp / "runs", str(_free_port())
    launchers = []
    for rank in range(WORLD):
        config = tmp / f"rank{rank}.yaml"
        config.write_text(yaml.safe_dump({"name": f"ps-rank{rank}", "script": JOB, "nproc_per_node": 1, "timeout": 90, "grace": 2,
                                          "preload": [], "args": ["--rank", str(rank), "--world", str(WORLD), "--port", port]}))
        launchers.append(subprocess.Popen([sys.executable, "-m", "rpcctl", "launch", str(config), "--runs-dir", str(runs_dir), "--no-live"],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True))
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
    assert [launcher.returncode for launcher in launchers] == [0] * WORLD, outputs
    return [runs[f"ps-rank{rank}"] for rank in range(WORLD)]


@pytest.mark.parametrize("rank", range(WORLD))
def test_each_launch_of_a_job_shows_its_rrefs_whole(job, rank):
    shown = json.loads(rpcctl("inspect", "rrefs", str(job[rank]), "--json").stdout)
    assert len(shown) == TRAINERS * CALLS, shown
    for rref in shown:  # the owner's run knows what each is; the trainers' runs, how it ended
        assert (rref["owner"], rref["kind"], rref["type"], rref["shape"]) == ("ps", "local", "Tensor", [4, 4]), rref
        assert rref["call_site"].endswith("rank_per_launch.py:24 in get_param"), rref
        assert (rref["state"], rref["ending"], rref["forks"]) == ("deleted", "at shutdown", 1), rref


@pytest.mark.parametrize("rank", range(WORLD))
def test_each_launch_of_a_job_names_the_others(job, rank):
    table = " ".join(rpcctl("inspect", "rrefs", str(job[rank])).stdout.split())
    others = [f"{job[r].name} ({'ps' if r == 0 else f'trainer_{r}'})" for r in range(WORLD) if r != rank]
    assert f"3 workers) is one job with 2 other runs in {job[rank].parent}: {', '.join(others)}" in table, table
