"""Native stacks from outside (issue 41): `rpcctl stack --native` and the hang verdict's evidence
read each process of a rank with py-spy, so they say where a rank is when it cannot run Python.

One real job, shared: three ranks in one gloo group. Rank 0 waits in all_reduce (the others
never come: gloo's C++ side), rank 1 holds the GIL in a C call (libc's sleep through ctypes.PyDLL,
again and again), rank 2's Python threads all wait on a lock. The watchdog declares the hang
(on_hang: keep) and the job keeps running, for `rpcctl stack --native` to read it live; then the
test stops it by its launcher's pid."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import WORKERS, wait_until
from live_job import live_job
from rpcctl.base import native_stacks

pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(native_stacks.py_spy() is None, reason="py-spy is not installed"),
]

JOB = textwrap.dedent(
    """
    import ctypes, subprocess, threading
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    if rank == 0:
        tensor = torch.ones(4)
        dist.all_reduce(tensor)  # ranks 1 and 2 never come
    elif rank == 1:
        libc = ctypes.PyDLL(None)
        while True:
            libc.sleep(60)  # the GIL held in C; a signal ends one sleep, the next begins
    else:
        subprocess.Popen(["sleep", "300"])  # a process under the rank that is not Python
        lock = threading.Lock()
        lock.acquire()

        def wait_for_lock():
            lock.acquire()

        threading.Thread(target=wait_for_lock, name="waiter", daemon=True).start()
        lock.acquire()  # every Python thread of the rank waits on the lock
    """
)


FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,utilization.memory)
    echo "0, GPU-5f1e, NVIDIA H100 80GB HBM3, 3172, 81559, 0, 0"
    echo "1, GPU-77aa, NVIDIA H100 80GB HBM3, 5, 81559, [N/A], 0";;
  --query-compute-apps=pid,gpu_uuid,used_memory) echo "$PPID, GPU-5f1e, 2900";;
  *) exit 9;;
esac
"""


def _line(text: str) -> int:
    return next(i for i, line in enumerate(JOB.splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    """The job, hung and judged (hang/diagnosis.txt written), still running: (run_dir, runs_dir)."""
    tmp = tmp_path_factory.mktemp("native")
    smi = tmp / "bin" / "nvidia-smi"  # no GPU here: the one system edge faked, a GPU as nvidia-smi tells it
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI)
    smi.chmod(0o700)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
        with live_job(tmp, "native_job", JOB, 3, "torch", "--hang-timeout", "4", "--keep-on-hang") as run_dir:
            wait_until(lambda: (run_dir / "hang" / "diagnosis.txt").is_file(), 60, "the hang verdict", run_dir / "logs")
            yield run_dir, tmp / "runs"


def _stack(run_dir: Path, *args: str, wrapper: tuple[str, ...] = ()) -> tuple[str, str]:
    """`rpcctl stack --native ARGS`, as a real process (under ``wrapper``, if any)."""
    argv = [*wrapper, sys.executable, "-m", "rpcctl", "stack", "--native", *args, str(run_dir)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, result.stderr


@pytest.fixture(scope="module")
def live(hung) -> dict[int, str]:
    """One `rpcctl stack --native` of every rank of the hung job, live: rank → its sections."""
    out, _ = _stack(hung[0])
    sections = re.split(r"(?m)^(?=── rank \d+ \(pid )", out)
    return {int(part.split()[2]): part for part in sections if part.startswith("── rank ")}


def _under(text: str, native: str, python: str) -> None:
    """``native`` is on the same thread as ``python``, nearer the top (py-spy and faulthandler
    write the most recent call first: the C call is what the Python line called)."""
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if python in line), None)
    assert at is not None, f"{python!r} not in:\n{text}"
    thread = max(i for i in range(at + 1) if lines[i].startswith("Thread "))
    assert any(native in line for line in lines[thread:at]), f"{native!r} not above {python!r} in its thread:\n{text}"


def test_a_rank_in_a_gloo_collective_shows_the_backends_wait_live(live):
    out = live[0]
    assert out.startswith("── rank 0 (pid ") and "· native ──" in out, out
    _under(out, "c10d::Work::wait (libtorch_cpu.so)", f"<module> (native_job.py:{_line('dist.all_reduce')})")
    _under(out, "c10d::Work::wait (libtorch_cpu.so)", "all_reduce (torch/distributed/distributed_c10d.py:")


def test_a_rank_holding_the_gil_in_a_c_call_shows_the_c_function_live(live):
    out = live[1]
    _under(out, "sleep (libc.so.6)", f"<module> (native_job.py:{_line('libc.sleep(60)')})")
    assert "holds the GIL" in out and '"MainThread"' in out, out
    assert "a thread of rpcctl's (hidden; --all-frames shows it)" in out, out  # its telemetry thread, one line


def test_a_rank_whose_threads_all_wait_on_a_lock_shows_the_lock_live(live):
    out = live[2]
    _under(out, "PyThread_acquire_lock_timed (libpython", f"<module> (native_job.py:{_line('every Python thread')})")
    _under(
        out,
        "PyThread_acquire_lock_timed (libpython",
        f"wait_for_lock (native_job.py:{_line('        lock.acquire()')})",
    )
    assert '"waiter"' in out, out
    assert re.search(
        r"── rank 2 › pid \d+: sleep 300 · native ──\n"
        r"\(no native stack: not a Python process \(py-spy reads Python processes only\)\)",
        out,
    ), out


def test_the_hang_evidence_has_every_ranks_native_frames_and_the_verdict_quotes_them(hung):
    run_dir = hung[0]
    evidence = (run_dir / "hang" / "stacks.txt").read_text()
    assert evidence.count("native (py-spy, most recent call first):") >= 3, evidence
    _under(evidence, "c10d::Work::wait (libtorch_cpu.so)", f"<module> (native_job.py:{_line('dist.all_reduce')})")
    _under(evidence, "sleep (libc.so.6)", f"<module> (native_job.py:{_line('libc.sleep(60)')})")
    _under(
        evidence,
        "PyThread_acquire_lock_timed (libpython",
        f"wait_for_lock (native_job.py:{_line('        lock.acquire()')})",
    )
    diagnosis = (run_dir / "hang" / "diagnosis.txt").read_text()
    # The verdict: rank 0 waits in all_reduce for ranks 1 and 2, and where each rank is, down to the C function.
    headline, details = diagnosis.splitlines()[0], diagnosis.splitlines()[1:]
    assert headline.startswith("rank 0 waits in all_reduce #1 (pg 0"), headline
    assert re.search(
        r"native_job\.py:\d+ in <module> \(`.+`\), in (sleep \(libc\.so\.6\)|PyThread_acquire_lock_timed \(libpython)",
        headline,
    ), headline
    at = {line.split(" (")[0].strip(): line for line in details if " is at " in line}
    assert f"native_job.py:{_line('dist.all_reduce')} in <module> (`dist.all_reduce(tensor)" in at["rank 0"], details
    assert at["rank 0"].endswith("), in c10d::Work::wait (libtorch_cpu.so)"), details
    assert at["rank 1"].endswith("), in sleep (libc.so.6)") and at["rank 2"].endswith(
        "), in PyThread_acquire_lock_timed (libpython3.11.so.1.0)"
    ), details


def test_where_ptrace_is_refused_one_line_says_how_to_allow_it_and_faulthandler_answers(hung):
    """A container's seccomp profile (tests/workers/no_ptrace.py: ptrace and process_vm_readv
    fail with EPERM) refuses py-spy: one line says why and how, then the Python stacks."""
    out, err = _stack(hung[0], "--rank", "2", wrapper=(sys.executable, str(WORKERS / "no_ptrace.py")))
    told = [line for line in err.splitlines() if "native stacks" in line]
    assert (
        len(told) == 1 and "not allowed to read the rank's processes (a seccomp filter forbids ptrace here" in told[0]
    ), err
    assert "kernel.yama.ptrace_scope=0" in told[0] and "CAP_SYS_PTRACE" in told[0], told
    assert "· native ──" not in out and out.startswith("── rank 2 (pid "), out
    assert f'native_job.py", line {_line("every Python thread")} in <module>' in out, out  # faulthandler's


def test_the_verdict_records_each_gpus_memory_and_use_as_nvidia_smi_tells_it(hung):
    """With NVIDIA GPUs (here nvidia-smi is a script on PATH: the machine has none), the verdict
    has a line per GPU and hang/gpus.json, asked of nvidia-smi at the moment of the verdict."""
    diagnosis = (hung[0] / "hang" / "diagnosis.txt").read_text()
    assert re.search(
        r"^  GPU 0 \(NVIDIA H100 80GB HBM3\): 3\.1 GiB of 79\.6 GiB used, 0% busy; pid \d+ holds 2\.8 GiB$",
        diagnosis,
        re.M,
    ), diagnosis
    assert "  GPU 1 (NVIDIA H100 80GB HBM3): 0.0 GiB of 79.6 GiB used, ? busy; no process of its own" in diagnosis, (
        diagnosis
    )
    gpus = json.loads((hung[0] / "hang" / "gpus.json").read_text())
    assert [(g["index"], g["memory_total_bytes"], g["utilization_pct"]) for g in gpus] == [
        (0, 81559 * 2**20, 0),
        (1, 81559 * 2**20, None),
    ], gpus


def test_a_stopped_rank_is_read_as_it_stands_and_said_to_be_stopped(hung):
    """faulthandler cannot answer for a stopped process; py-spy reads its Python frames unpaused."""
    pid = json.loads((hung[0] / "run.json").read_text())["ranks"][2]["pid"]
    os.kill(pid, signal.SIGSTOP)  # rank 2 of the job this module started, by its pid
    try:
        out, _ = _stack(hung[0], "--rank", "2")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (
        f"(stopped (SIGSTOP): its Python frames as it stands, no native ones; `kill -CONT {pid}` resumes it)" in out
    ), out
    assert (
        f"<module> (native_job.py:{_line('every Python thread')})" in out and "PyThread_acquire_lock_timed" not in out
    ), out


def test_the_live_page_serves_every_ranks_native_stacks_when_asked(hung):
    """`rpcctl web`'s /stacks (the page's token): the same reading as `stack --native`, all ranks."""
    import http.client

    from test_report import _start_web

    web, url = _start_web(str(hung[0]))
    try:
        port, token = int(re.search(r":(\d+)/", url).group(1)), url.split("token=", 1)[1]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", f"/stacks?token={token}")
        answer = conn.getresponse()
        text = answer.read().decode()
    finally:
        web.terminate()  # our rpcctl web, by its pid
        web.communicate(timeout=30)
    assert answer.status == 200 and answer.getheader("Content-Type") == "text/plain; charset=utf-8", (
        answer.status,
        text,
    )
    assert [int(m) for m in re.findall(r"(?m)^── rank (\d+) \(pid \d+\) · native ──$", text)] == [0, 1, 2], text
    _under(text, "c10d::Work::wait (libtorch_cpu.so)", f"<module> (native_job.py:{_line('dist.all_reduce')})")
    _under(text, "sleep (libc.so.6)", f"<module> (native_job.py:{_line('libc.sleep(60)')})")
