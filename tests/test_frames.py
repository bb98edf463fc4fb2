"""rpcctl's own frames stay out of what users read: a real rank's traceback through rpcctl's call
tracking (rank log, error file, the launcher's verdict) shows the user's frames and torch's, and
`launch --all-frames` shows rpcctl's too. A fault raised in rpcctl's own code keeps every frame."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import launch_job as launch

from rpcctl.base.frames import PACKAGE_DIR, drop_own_frames, hide_own_frames, short_path

# Rank 0 calls a function that raises on rank 1: the exception comes back through rpc_sync,
# which rpcctl's call tracking wraps (rpcctl/rank/calls.py), and kills rank 0.
REMOTE_ERROR_JOB = """
import os
import torch.distributed.rpc as rpc

def bad(x):
    raise ValueError(f"bad value {x}")

rank = int(os.environ["RANK"])
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
try:
    if rank == 0:
        rpc.rpc_sync("worker1", bad, args=(7,))
finally:
    rpc.shutdown(graceful=rank != 0)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("all_frames", [False, True])
def test_a_ranks_traceback_through_rpcctls_call_tracking(tmp_path, runs_dir, all_frames):
    script = tmp_path / "remote_error.py"
    script.write_text(REMOTE_ERROR_JOB)
    flags = ["--all-frames"] if all_frames else []
    result, run_dir, rec = launch(tmp_path, runs_dir, *flags, script=str(script), nproc_per_node=2, preload=["torch"])
    assert result.returncode == 1, result.stderr
    callstack = json.loads((run_dir / "errors" / "rank-0.json").read_text())["message"]["extraInfo"]["py_callstack"]
    log = (run_dir / "logs" / "rank-0.log").read_text()
    for text in (callstack, log, result.stderr):
        assert 'remote_error.py", line 12, in <module>' in text and "torch/distributed/rpc/api.py" in text, text
        assert ("rpcctl/rank/calls.py" in text) == all_frames, text
    assert rec["root_cause"]["traceback"] == callstack
    kept = yaml.safe_load((run_dir / "config.yaml").read_text())["env"]  # a replay keeps the choice
    assert kept.get("RPCCTL_ALL_FRAMES") == ("1" if all_frames else None), kept


def _raise_in_rpcctl():
    from rpcctl.config import load_config

    load_config("/nonexistent/job.yaml", [])


def test_a_fault_raised_in_rpcctl_keeps_every_frame():
    with pytest.raises(Exception) as caught:
        _raise_in_rpcctl()
    frames_before = _files(caught.value.__traceback__)
    assert any(f.startswith(PACKAGE_DIR) for f in frames_before)  # the culprit is rpcctl's
    drop_own_frames(caught.value)
    assert _files(caught.value.__traceback__) == frames_before


def _files(tb):
    files = []
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return files


def test_a_stack_dump_keeps_the_user_and_names_rpcctls_threads():
    own = PACKAGE_DIR + "rank/reporter.py"
    dump = (
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n'
        f'  File "{own}", line 275 in _run\n'
        '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n'
        "\n"
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/rpc/api.py", line 842 in rpc_sync\n'
        f'  File "{PACKAGE_DIR}rank/calls.py", line 145 in rpc_sync\n'
        '  File "/home/me/train.py", line 7 in <module>\n'
        f'  File "{PACKAGE_DIR}runtime.py", line 125 in _run_script\n'
        f'  File "{PACKAGE_DIR}rank_server.py", line 268 in <module>\n'
        '  File "<frozen runpy>", line 88 in _run_code\n'
    )
    assert hide_own_frames(dump).splitlines() == [
        "Thread 0x00007f0000000001: rpcctl's telemetry sender (hidden; --all-frames shows it)",
        "",
        "Current thread 0x00007f0000000002 (most recent call first):",
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/rpc/api.py", line 842 in rpc_sync',
        "  [rpcctl frames hidden]",
        '  File "/home/me/train.py", line 7 in <module>',
        "  [rpcctl frames hidden]",
    ]
    # A thread of the user's that only sleeps in the standard library is the user's: kept whole.
    user_thread = 'Thread 0x1 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 331 in wait\n'
    assert hide_own_frames(user_thread) == user_thread


def test_short_path_names_installed_code_by_its_import_path(tmp_path, monkeypatch):
    import threading

    import torch.distributed.rpc.api

    assert short_path(torch.distributed.rpc.api.__file__) == "torch/distributed/rpc/api.py"
    assert short_path(threading.__file__) == "threading.py"
    monkeypatch.chdir(tmp_path)
    assert short_path(str(tmp_path / "jobs" / "train.py")) == "jobs/train.py"
    assert short_path("/srv/elsewhere/train.py") == "/srv/elsewhere/train.py"
