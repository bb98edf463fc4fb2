"""The examples under configs/ through `rpcctl launch`, as a user runs them."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, assert_no_process_left, only_run, record, rpcctl
from example_checks import CHECKS

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("example", list(CHECKS))
def test_example_succeeds_under_rpcctl(example, runs_dir):
    result = rpcctl(
        "launch", f"configs/{example}.yaml", "--no-live", "--runs-dir", str(runs_dir), cwd=ROOT, timeout=110
    )
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    CHECKS[example](result.stdout)
    assert record(run_dir)["status"] == "succeeded"
    # torch's own warning from inside init_rpc is not the user's to act on (runtime.py).
    assert "as a ProcessGroup" not in result.stdout + result.stderr


def test_failing_example_names_its_root_cause(runs_dir):
    result = rpcctl("launch", "configs/failing.yaml", "--no-live", "--runs-dir", str(runs_dir), cwd=ROOT, timeout=110)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    assert result.returncode == 1
    assert "root cause: rank 1" in result.stderr
    assert "RuntimeError: simulated failure in rank 1 at step 3" in result.stderr
    assert 'File "' in result.stderr and "failing.py" in result.stderr  # the rank's own traceback
    runs = json.loads(rpcctl("runs", "--json", "--runs-dir", str(runs_dir)).stdout)
    assert runs[0]["status"] == "failed" and runs[0]["root_cause"]["rank"] == 1
    logs = rpcctl("logs", "--rank", "1", "--runs-dir", str(runs_dir))
    assert "[rank1]: RuntimeError: simulated failure in rank 1 at step 3" in logs.stdout
