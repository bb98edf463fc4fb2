"""A rank a communication backend aborted is told in the backend's own words and where it was
(issue 38, item 7): gloo's on real jobs through ``rpcctl launch``; the shapes NCCL and c10d abort
with, from torch's sources, on their text."""

from __future__ import annotations

import pytest
from conftest import WORKERS, launch_job

from rpcctl.base import backend_abort

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("mode", ["size", "dtype"])
def test_a_gloo_abort_on_mismatched_collectives_is_told_in_glooss_words(mode, tmp_path, runs_dir):
    result, run_dir, rec = launch_job(
        tmp_path,
        runs_dir,
        name=f"abort-{mode}",
        script=str(WORKERS / "backend_abort.py"),
        args=[mode],
        nproc_per_node=2,
        timeout=40,
        preload=["torch"],
    )
    assert result.returncode == 1, result.stdout + result.stderr
    cause = rec["root_cause"]
    assert cause["signal"] == "SIGABRT", cause
    expected = "gloo: Received data size doesn't match expected size (8 vs 4): a collective mismatch? at "
    assert cause["message"].startswith(expected), cause["message"]
    assert "backend_abort.py:" in cause["message"] and "in <module> (`dist.all_reduce(t)`)" in cause["message"], cause[
        "message"
    ]
    assert cause["error_type"] == "gloo::EnforceNotMet", cause
    # The traceback is what gloo threw and the main thread's stack, not every thread's dump.
    assert "what():  [enforce fail at " in cause["traceback"], cause["traceback"]
    assert "reporter.py" not in cause["traceback"] and "Extension modules" not in cause["traceback"], cause["traceback"]
    shown = result.stderr
    assert f"rank {cause['rank']} (pid {cause['pid']}, killed by SIGABRT): gloo: Received data size" in shown, shown
    assert "last lines of rank" not in shown, shown


# The shapes c10d, gloo and NCCL abort with (torch's source: ProcessGroupNCCL.cpp's watchdog,
# gloo's transport), as libstdc++'s terminate handler and c10's logging print them. A line that
# ends in a backslash goes on in the next: one line of the log.
NCCL_TIMEOUT = """\
[rank1]:[E1207 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600021 milliseconds \
before timing out.
[rank1]:[E1207 10:00:00.000000000 ProcessGroupNCCL.cpp:2197] [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group \
watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, \
OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.
Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:760 (most recent call \
first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f57d0f6afad in \
/venv/lib/python3.11/site-packages/torch/lib/libc10.so)

terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] \
Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, \
Timeout(ms)=600000) ran for 600021 milliseconds before timing out.
Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:760 (most recent call \
first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f57d0f6afad in \
/venv/lib/python3.11/site-packages/torch/lib/libc10.so)

Fatal Python error: Aborted

Thread 0x00007f600c7ff6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f602ae6fb80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/home/me/train.py", line 31 in step
  File "/home/me/train.py", line 40 in <module>
"""

GLOO_PEER_GONE = """\
terminate called after throwing an instance of 'gloo::IoException'
  what():  [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:45210
Fatal Python error: Aborted
"""

CUDA_IN_THE_WATCHDOG = """\
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: CUDA error: \
an illegal memory access was encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
"""

HEARTBEAT = """\
[rank0]:[E1207 10:00:00.000 ProcessGroupNCCL.cpp:1500] [PG ID 0 PG GUID 0(default_pg) Rank 0] First PG on this rank \
that detected no heartbeat of its watchdog.
[rank0]:[F1207 10:00:00.000 ProcessGroupNCCL.cpp:1530] [PG ID 0 PG GUID 0(default_pg) Rank 0] ProcessGroupNCCL's \
watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives. This typically \
indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog.
Fatal Python error: Aborted
"""


@pytest.mark.parametrize(
    "text, backend, message",
    [
        (
            NCCL_TIMEOUT,
            "NCCL",
            "NCCL: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1024, "
            "NumelOut=1024, Timeout(ms)=600000) ran for 600021 milliseconds before timing out at ",
        ),
        (GLOO_PEER_GONE, "gloo", "gloo: Connection closed by peer [127.0.0.1]:45210"),
        (CUDA_IN_THE_WATCHDOG, "c10d", "c10d: CUDA error: an illegal memory access was encountered"),
        (
            HEARTBEAT,
            "NCCL",
            "NCCL: ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring "
            "enqueued collectives.",
        ),
    ],
)
def test_the_shapes_backends_abort_with_are_read(text, backend, message):
    found = backend_abort.read(text.splitlines())
    assert found is not None and found.backend == backend, found
    assert found.describe().startswith(message), found.describe()


def test_where_an_aborted_rank_was_is_its_main_threads_frame():
    found = backend_abort.read(NCCL_TIMEOUT.splitlines())
    assert found.where == "/home/me/train.py:31 in step", found.where
    assert found.describe().endswith(" at /home/me/train.py:31 in step")


def test_a_rank_that_printed_no_abort_has_none():
    assert backend_abort.read(["Traceback (most recent call last):", '  File "x.py", line 1', "ValueError: x"]) is None
    assert backend_abort.read([]) is None


def test_an_abort_message_from_a_rank_is_bounded():
    text = ["terminate called after throwing an instance of 'gloo::EnforceNotMet'", "  what():  " + "x" * 100_000]
    found = backend_abort.read(text)
    assert (
        len(found.describe()) <= backend_abort.MAX_MESSAGE_CHARS + 100
        and len(found.detail) <= backend_abort.MAX_DETAIL_CHARS + 200
    )
