"""A job whose ranks are started by separate launches, one rank each, as pytorch/examples'
parameter server runs it (tests/workers/rank_per_launch.py: ``--rank R``, MASTER_* set by the
program, the rank's work in an ``mp.Process`` its parent joins) (issue 40, item 1).

multiprocessing hides a process's exception from its parent (the parent's ``join`` returns, its
own exit is 0): a launch whose rank's process raised still fails, naming that process.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from conftest import WORKERS, launch_job, rpcctl

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
