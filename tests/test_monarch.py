"""A Monarch program under `rpcctl launch`: one controller rank whose proc mesh is its processes.

torchmonarch is an optional extra (``pip install 'rpcctl[monarch]'``; .ci/run installs it): these
tests run a real proc mesh on this host where it is installed and skip, with the command,
where it is not. See docs/monarch.md.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    WORKERS,
    assert_no_process_left,
    kill_if_running,
    only_run,
    pids_gone,
    record,
    rpcctl,
    start_rpcctl,
    wait_until,
    write_config,
)
from example_checks import MONARCH_CHECKS

INSTALL = "pip install -c constraints.txt 'rpcctl[monarch]'"


def monarch_missing() -> str | None:
    """Why Monarch cannot run here, or None. By distribution name, without importing it (an
    unrelated package on PyPI is also called ``monarch``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("torchmonarch")
    except PackageNotFoundError:
        return f"torchmonarch is not installed ({INSTALL})"
    return None


pytestmark = [pytest.mark.timeout(90), pytest.mark.skipif(monarch_missing() is not None, reason=str(monarch_missing()))]

MESH = str(WORKERS / "monarch_mesh.py")


def _mesh_pids(run_dir: Path) -> list[int]:
    path = run_dir / "mesh.pids"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _launch(tmp_path: Path, runs_dir: Path, action: str, timeout: int = 60):
    config = write_config(tmp_path, name="monarch", script=MESH, args=[action], nproc_per_node=1, timeout=timeout)
    launcher = start_rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live")
    run_dir = only_run(runs_dir)
    pids = wait_until(
        lambda: _mesh_pids(run_dir) or (launcher.poll() is not None and [-1]), 60, "the mesh", run_dir / "logs"
    )
    assert pids != [-1], launcher.communicate()
    return launcher, run_dir, pids


def test_the_mesh_is_the_ranks_processes_and_ctrl_c_ends_it(tmp_path, runs_dir):
    """inspect workers lists each mesh process as rank 0's child; `rpcctl stack` shows its
    Python stack; its output is in the rank's log; Ctrl-C leaves none of them behind."""
    launcher, run_dir, pids = _launch(tmp_path, runs_dir, "hold")
    try:

        def children() -> list[dict]:
            shown = rpcctl("inspect", "workers", str(run_dir), "--json", timeout=30)
            return [w for w in json.loads(shown.stdout) if w["kind"] == "child"] if shown.returncode == 0 else []

        listed = wait_until(
            lambda: len(children()) == 2 and children(), 20, "the mesh in inspect workers", run_dir / "logs"
        )
        assert sorted(w["pid"] for w in listed) == pids and {w["rank"] for w in listed} == {0}
        assert {w["state"] for w in listed} == {"running"}
        stacks = rpcctl("stack", str(run_dir), timeout=30)
        assert stacks.returncode == 0, stacks.stderr
        for pid in pids:
            assert f"rank 0 › pid {pid}: " in stacks.stdout, stacks.stdout
        assert stacks.stdout.count("monarch/_src/actor/bootstrap_main.py") >= 2, stacks.stdout
        log = (run_dir / "logs" / "rank-0.log").read_text()
        assert all(f"actor on pid {pid}" in log for pid in pids), log
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 130, err
        assert record(run_dir)["status"] == "cancelled"
        assert_no_process_left(run_dir, timeout=10)
        assert pids_gone(pids)
    finally:
        kill_if_running(launcher)


@pytest.mark.parametrize("action", ["actor-raise", "timeout"])
def test_a_failure_or_the_timeout_leaves_no_mesh_process(tmp_path, runs_dir, action):
    """An endpoint that raises fails the controller (Monarch re-raises it as ActorError), and
    the job's timeout kills the rank: in both the mesh goes with the rank."""
    launcher, run_dir, pids = _launch(
        tmp_path, runs_dir, "hold" if action == "timeout" else action, timeout=12 if action == "timeout" else 60
    )
    try:
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 1, err
        if action == "timeout":
            assert "the job exceeded its timeout of 12s" in err
        else:
            assert "root cause: rank 0" in err and "ActorError" in err and "failed on purpose" in err, err
        assert_no_process_left(run_dir, timeout=10)
        assert pids_gone(pids)
    finally:
        kill_if_running(launcher)


def test_a_process_that_imports_monarch_joins_as_the_ranks_child(tmp_path):
    """What a mesh process does at `import monarch` (rpcctl's sitecustomize): join telemetry as
    a child of its rank and register for `rpcctl stack`, torch imported first or not. Joining
    inside that import raised RecursionError (torchmonarch 0.7.0), so this joins from a thread."""
    import os
    import socket
    import subprocess
    import sys

    from rpcctl.wire import protocol

    site = ROOT / "rpcctl" / "rank" / "_site"
    path = tmp_path / "t.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)
        server.settimeout(30)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), RPCCTL_RUN_DIR=str(tmp_path))
        env.update({protocol.ENV_SOCKET: str(path), protocol.ENV_RANK: "0", protocol.ENV_RANK_PID: "1"})
        code = "import torch, monarch, time; time.sleep(30)"
        child = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            conn, _ = server.accept()
            with conn:
                hello = protocol.decode(conn.makefile("rb").readline())
            assert (
                hello["k"] == "hello" and hello["kind"] == "child" and hello["rank"] == 0 and hello["pid"] == child.pid
            ), hello
            wait_until(lambda: list((tmp_path / "stacks").glob(f"pid-{child.pid}-*.txt")), 10, "the stack file")
        finally:
            child.kill()
            _, err = child.communicate(timeout=30)
    assert "RecursionError" not in err and "rpcctl:" not in err, err


@pytest.mark.parametrize("example", list(MONARCH_CHECKS))
def test_monarch_example_runs_under_rpcctl(example, runs_dir):
    """configs/monarch/: each classic pattern in Monarch, one controller rank, the same results
    as the torch RPC version (tests/example_checks.py)."""
    result = rpcctl(
        "launch", f"configs/monarch/{example}.yaml", "--no-live", "--runs-dir", str(runs_dir), cwd=ROOT, timeout=85
    )
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir, timeout=10)
    assert result.returncode == 0, result.stdout + result.stderr
    MONARCH_CHECKS[example](result.stdout)
    assert record(run_dir)["status"] == "succeeded"
