"""A real job kept running while a test reads it from outside (`rpcctl stack --native`,
`rpcctl profile`), then stopped by its launcher's pid: the module fixtures of
tests/test_native_stacks.py and tests/test_profile.py."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from conftest import assert_no_process_left, kill_if_running, only_run, start_rpcctl


@contextlib.contextmanager
def live_job(tmp: Path, name: str, script: str, nproc: int, preload: str, *launch_args: str) -> Iterator[Path]:
    """Launch ``script`` as ``name`` (``nproc`` ranks) and yield its run directory while it runs;
    then SIGTERM the launcher (ours, by its pid), wait, and check that no process is left."""
    (tmp / f"{name}.py").write_text(script)
    config = tmp / f"{name}.yaml"
    config.write_text(
        f"name: {name}\nscript: {name}.py\nnproc_per_node: {nproc}\ngrace: 2\ntimeout: 100\npreload: [{preload}]\n"
    )
    launcher = start_rpcctl("launch", str(config), "--no-live", "--runs-dir", str(tmp / "runs"), *launch_args)
    run_dir = None
    try:
        run_dir = only_run(tmp / "runs")
        yield run_dir
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            try:
                launcher.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                pass  # killed below
        kill_if_running(launcher)
    if run_dir is not None:
        assert_no_process_left(run_dir)
