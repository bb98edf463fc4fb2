"""The example scripts under configs/ run unchanged under plain torchrun.

Each test launches ``python -m torch.distributed.run --standalone --nproc-per-node N``
(N from the example's yaml), checks the exit code and the key lines of the output, and
checks that no rank outlived torchrun.

Each rank's output is read from torchrun's own per-rank log files (``--redirects 3``),
not from one shared stdout: ranks that share a pipe interleave their writes, and
``print`` issues the text and the newline as separate writes, so lines from two ranks
can be spliced together there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml
from example_checks import CHECKS

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
RUN_TIMEOUT = 90  # seconds per torchrun; each example takes well under 15 s


def _run_torchrun(example: str) -> tuple[int, str, float]:
    """Run configs/<example>.yaml's script under torchrun; return (rc, output, seconds)."""
    with tempfile.TemporaryDirectory() as log_dir:
        return _run_torchrun_logging_to(example, Path(log_dir))


def _run_torchrun_logging_to(example: str, log_dir: Path) -> tuple[int, str, float]:
    cfg = yaml.safe_load((CONFIGS / f"{example}.yaml").read_text())
    script = (CONFIGS / cfg["script"]).relative_to(REPO)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(cfg["nproc_per_node"]),
        "--log-dir",
        str(log_dir),
        "--redirects",
        "3",
        str(script),
        *cfg.get("args", []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    seen: set[psutil.Process] = set()
    with tempfile.TemporaryFile(mode="w+") as out:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            parent = psutil.Process(proc.pid)
            # Poll instead of wait() so that we also learn the ranks' pids.
            while proc.poll() is None:
                if time.monotonic() - start > RUN_TIMEOUT:
                    raise subprocess.TimeoutExpired(cmd, RUN_TIMEOUT)
                try:
                    seen.update(parent.children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
                time.sleep(0.1)
        finally:
            if proc.poll() is None:  # only on timeout: take down what we started
                for child in seen:
                    try:
                        child.kill()
                    except psutil.NoSuchProcess:
                        pass
                proc.kill()
                proc.wait()
        elapsed = time.monotonic() - start
        out.seek(0)
        # torchrun's own messages, then every rank's stdout and stderr, whole.
        output = out.read() + "".join(f.read_text(errors="replace") for f in sorted(log_dir.rglob("std*.log")))

    assert seen, "torchrun never started any rank"
    # psutil.Process.is_running() also checks the create time, so a reused pid is not a
    # false alarm. Give the OS a moment to reap.
    deadline = time.monotonic() + 5
    while (alive := [p for p in seen if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, f"processes left behind by torchrun: {alive}"
    return proc.returncode, output, elapsed


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(120)
@pytest.mark.parametrize("example", list(CHECKS))
def test_example_runs_under_torchrun(example: str) -> None:
    rc, out, elapsed = _run_torchrun(example)
    print(f"{example}: {elapsed:.1f}s")
    assert rc == 0, out
    CHECKS[example](out)


@pytest.mark.timeout(120)
def test_failing_example_fails_under_torchrun() -> None:
    rc, out, elapsed = _run_torchrun("failing")
    print(f"failing: {elapsed:.1f}s")
    assert rc != 0, out
    assert "RuntimeError: simulated failure in rank 1 at step 3" in out
    # Rank 0 was blocked, so torchrun had to stop it, well before the script's own timeout.
    assert elapsed < 60, elapsed
