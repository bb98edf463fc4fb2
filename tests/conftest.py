"""Shared fixtures: an isolated runs directory, a fixed-width colourless console, and helpers
that run rpcctl for real and prove that a run left no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"

# A suite started in the background of a shell without job control (`cmd &` in a script, as a
# CI runner may) inherits SIGINT ignored, and so does every process it starts: Python then
# never raises KeyboardInterrupt, and the tests that stop `rpcctl web` or a rank with Ctrl-C's
# signal would wait for ever. The tests send SIGINT on purpose: take it back (a handler, not
# SIG_IGN, resets to the default across exec).
for _sig in (signal.SIGINT, signal.SIGQUIT):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, signal.default_int_handler if _sig == signal.SIGINT else signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("RPCCTL_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("RPCCTL_DEBUG", raising=False)
    # a CI job that runs in a pod
    for name in [n for n in os.environ if n.startswith("PET_")] + ["JOB_COMPLETION_INDEX"]:
        monkeypatch.delenv(name, raising=False)
    from rpcctl.console import set_console

    set_console(None)
    yield
    set_console(None)


@pytest.fixture
def script(tmp_path) -> Path:
    """A trivial train.py in tmp_path, for configs that only need a script to exist."""
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return path


@pytest.fixture
def runs_dir(tmp_path) -> Path:
    return tmp_path / "runs"


def write_config(tmp_path: Path, **keys) -> Path:
    """A config file for tests/workers/behave.py (or ``script=``), without torch preloaded
    unless the test asks: supervision tests do not need it and start in a fraction of a second."""
    keys.setdefault("script", str(WORKERS / "behave.py"))
    keys.setdefault("preload", [])
    keys.setdefault("grace", 2)
    path = tmp_path / f"{keys.get('name', 'job')}.yaml"
    path.write_text(yaml.safe_dump(keys))
    return path


def rpcctl(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Run the real CLI as a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "rpcctl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def start_rpcctl(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rpcctl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # signals in a test reach only the launcher we name
    )


def kill_if_running(launcher: subprocess.Popen) -> None:
    """A test's ``finally``: a launcher it left running (the test failed) is killed and reaped."""
    if launcher.poll() is None:
        launcher.kill()
        launcher.communicate()


def launch_job(tmp_path: Path, runs_dir: Path, *args: str, **keys) -> tuple[subprocess.CompletedProcess, Path, dict]:
    """Run `rpcctl launch` on a behave.py config to the end; check it left no process behind."""
    config = write_config(tmp_path, **keys)
    result = rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live", *args)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    return result, run_dir, record(run_dir)


def launch_until_running(tmp_path: Path, runs_dir: Path, *args: str, **keys) -> tuple[subprocess.Popen, Path]:
    """Start `rpcctl launch` on a behave.py config; return it and its run once every rank runs."""
    config = write_config(tmp_path, **keys)
    launcher = start_rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live", *args)
    run_dir = only_run(runs_dir)
    wait_until(
        lambda: all(r["state"] == "running" for r in record(run_dir)["ranks"]),
        30,
        "every rank running",
        run_dir / "logs",
    )
    return launcher, run_dir


def only_run(runs_dir: Path, timeout: float = 30) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [p for p in runs_dir.glob("*") if (p / "run.json").is_file()] if runs_dir.is_dir() else []
        if len(runs) == 1:
            return runs[0]
        assert len(runs) <= 1, runs
        time.sleep(0.05)
    raise AssertionError(f"no run appeared in {runs_dir} within {timeout}s")


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def wait_until(predicate, timeout: float, what: str, logs: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    detail = ""
    if logs is not None and logs.is_dir():
        detail = "\n" + "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(logs.glob("*.log")))
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")


def processes_of_run(run_id: str) -> list[psutil.Process]:
    """Every live process that carries this run's id in its environment (ranks, their children,
    the rank server)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("RPCCTL_RUN_ID") == run_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def assert_no_process_left(run_dir: Path, timeout: float = 5.0) -> None:
    run_id = record(run_dir)["run_id"]
    deadline = time.monotonic() + timeout
    left = processes_of_run(run_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = processes_of_run(run_id)
    if left:
        described = [(p.pid, p.cmdline()) for p in left]
        for proc in left:  # ours: clean up so one failure does not cascade
            try:
                proc.kill()
            except psutil.Error:
                pass
        raise AssertionError(f"processes of run {run_id} still alive: {described}")


def pids_gone(pids) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


__all__ = [
    "ROOT",
    "WORKERS",
    "write_config",
    "rpcctl",
    "start_rpcctl",
    "launch_job",
    "launch_until_running",
    "only_run",
    "record",
    "wait_until",
    "processes_of_run",
    "assert_no_process_left",
    "pids_gone",
    "signal",
    "os",
]
