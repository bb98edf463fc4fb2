"""A stack dump never harms the process it reads: asked through its FIFO, a process writes its
threads' stacks under the GIL; SIGUSR1's faulthandler dump, which walks the threads while they
run (a thread state freed under it is a segfault), is only the fallback for a process whose GIL
is held. Real processes, real threads, real signals."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rpcctl.base import stacks
from rpcctl.supervise.hang_evidence import main_thread, parse_stacks

pytestmark = pytest.mark.timeout(120)

# Threads that come and go without end, as torch's RPC threads' states do while a rank serves
# calls; then the main thread waits in a function of its own, to be found in every dump.
CHURN = textwrap.dedent(
    """
    import sys, threading, time
    from rpcctl.base import stacks

    stacks.register_child(sys.argv[1])

    def churn():
        while True:
            started = [threading.Thread(target=lambda: None) for _ in range(8)]
            for t in started:
                t.start()
            for t in started:
                t.join()

    for _ in range(2):
        threading.Thread(target=churn, daemon=True).start()

    def waiting_in_main():
        print("ready", flush=True)
        time.sleep(120)

    waiting_in_main()
    """
)

# The GIL held in one C call (ctypes.PyDLL keeps it across the call): no Python thread runs.
GIL_HELD = textwrap.dedent(
    """
    import ctypes, sys
    from rpcctl.base import stacks

    stacks.register_child(sys.argv[1])
    print("ready", flush=True)
    while True:  # a signal ends libc's sleep early
        ctypes.PyDLL(None).sleep(120)
    """
)


def _start(tmp_path: Path, code: str) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    ticks = stacks.start_ticks(proc.pid)
    return proc, stacks.child_stack_file(tmp_path, proc.pid, ticks)


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)


def test_dumps_of_a_process_whose_threads_come_and_go_leave_it_running(tmp_path):
    """40 dumps, one after the other: SIGUSR1's faulthandler killed such a process by SIGSEGV
    within 13 here. Each one comes back with the main thread where it waits."""
    proc, path = _start(tmp_path, CHURN)
    try:
        for i in range(40):
            text = stacks.dump(proc.pid, path, timeout=10)
            assert proc.poll() is None, f"dump {i} killed it: exit {proc.returncode}"
            main = main_thread(parse_stacks(text or ""))
            assert main is not None and any(f.func == "waiting_in_main" for f in main.frames), text
        assert stacks.ask_path(path).exists()
    finally:
        _stop(proc)


def test_a_process_whose_gil_is_held_is_dumped_by_faulthandler_all_the_same(tmp_path):
    """Its dumper thread cannot run: the FIFO brings nothing, SIGUSR1 does (faulthandler's
    handler needs no GIL), within the timeout."""
    proc, path = _start(tmp_path, GIL_HELD)
    try:
        started = time.monotonic()
        text = stacks.dump(proc.pid, path, timeout=6)
        assert text and "in <module>" in text and time.monotonic() - started < 6, text
        assert proc.poll() is None
    finally:
        _stop(proc)


def test_a_finished_runs_stacks_folder_holds_no_fifo(tmp_path):
    """A process killed (no exit handler ran) leaves its FIFO; the launcher removes what is left
    once the run's processes are gone (``remove_asks``), and a process that exits removes its own."""
    proc, path = _start(tmp_path, CHURN)
    _stop(proc)
    assert stacks.ask_path(path).exists()
    stacks.remove_asks(path.parent)
    assert not stacks.ask_path(path).exists() and path.parent.is_dir()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from rpcctl.base import stacks; stacks.register_child(sys.argv[1])",
            str(tmp_path),
        ],
        timeout=60,
    )
    assert done.returncode == 0 and not any(p.name.endswith(stacks.ASK_SUFFIX) for p in path.parent.iterdir())


def test_a_planted_link_or_file_where_the_fifo_goes_is_never_written_through(tmp_path):
    """The run's folder is the owner's, but its files are data: a link (or a plain file) named as
    the FIFO is neither served nor written to; the dump then falls back to SIGUSR1."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    stack_file = tmp_path / "stacks" / "rank-0.txt"
    stack_file.parent.mkdir()
    stacks.ask_path(stack_file).symlink_to(victim)
    assert not stacks._ask(stack_file)
    with open(stack_file, "a") as out:
        before = {t.name for t in threading.enumerate()}
        stacks.serve_dumps(stack_file, out)
        assert {t.name for t in threading.enumerate()} == before  # nothing served
    assert victim.read_text() == "keep me"


NAMES = textwrap.dedent(
    """
    import sys, threading, time
    from rpcctl.base import stacks

    stacks.register_child(sys.argv[1])

    def forged():
        time.sleep(120)

    # a function whose name would forge a thread of its own, and 300 threads
    forged.__code__ = forged.__code__.replace(co_name="x\\nThread 0x00000000deadbeef (most recent call first):\\x1b[2J")
    for _ in range(300):
        threading.Thread(target=forged, daemon=True).start()
    print("ready", flush=True)
    time.sleep(120)
    """
)


def test_a_dump_is_bounded_and_no_name_forges_a_line(tmp_path):
    proc, path = _start(tmp_path, NAMES)
    try:
        text = stacks.dump(proc.pid, path, timeout=10)
    finally:
        _stop(proc)
    threads = parse_stacks(text or "")
    assert len(threads) == stacks.MAX_THREADS and text.endswith("...\n"), len(threads)
    assert 0xDEADBEEF not in {t.ident for t in threads} and "\x1b" not in text
    assert "in x\\nThread 0x00000000deadbeef" in text
