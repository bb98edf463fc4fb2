"""The live view of `rpcctl launch` on a real terminal.

The launcher runs on a pseudo-terminal that is its controlling terminal, so Ctrl-C is the
byte a user's keyboard sends (the kernel signals the whole foreground process group, ranks
included), and what it drew is read back through a terminal emulator (pyte): the test sees
the final screen a user sees, not the escape codes that drew it.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable

import pyte
import pytest
from conftest import assert_no_process_left, only_run, record, write_config

pytestmark = pytest.mark.timeout(90)

ROWS, COLS = 60, 150
CTRL_C = b"\x03"

LOOP = """
import itertools, os, time
rank = int(os.environ["RANK"])
# Rank 1's lines carry text that is Rich markup, to be shown as it is, never interpreted.
suffix = " [/] [red]" if rank == 1 else ""
for step in itertools.count():
    print(f"step {step} loss {1.0 / (step + 1) + rank:.4f}{suffix}", flush=True)
    time.sleep(0.3)
"""


def _take_terminal() -> None:
    # In the child, after setsid: make the pty (stdin) the controlling terminal, as a shell does.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def run_on_terminal(args: list[str], on_output: Callable[[bytes, int], bytes | None], timeout: float) -> tuple[int, bytes]:
    """Run rpcctl on a fresh pty; ``on_output(all_bytes, pid)`` may return bytes to type."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(COLS), "LINES": str(ROWS)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rpcctl", *args],
        stdin=slave, stdout=slave, stderr=slave, env=env,
        start_new_session=True, preexec_fn=_take_terminal,
    )
    os.close(slave)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every holder of the slave side has closed it
                    chunk = b""
                if not chunk:
                    break
                output += chunk
                typed = on_output(output, proc.pid)
                if typed:
                    os.write(master, typed)
            elif proc.poll() is not None:
                break
        else:
            raise AssertionError(f"rpcctl did not finish in {timeout}s; it drew:\n{screen_text(output)}")
        return proc.wait(timeout=10), output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def screen_text(output: bytes) -> str:
    screen = pyte.Screen(COLS, ROWS)
    pyte.ByteStream(screen).feed(output)
    return "\n".join(line.rstrip() for line in screen.display).rstrip()


def test_ctrl_c_on_the_live_view_stops_the_job_and_leaves_one_final_panel(tmp_path, runs_dir):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    config = write_config(tmp_path, name="looping", script=str(script), nproc_per_node=2)
    pressed = []

    def press_ctrl_c_once_both_ranks_print(output: bytes, _pid: int) -> bytes | None:
        if not pressed and b"[rank0]: step 2 " in output and b"[rank1]: step 2 " in output:
            pressed.append(time.monotonic())
            return CTRL_C
        return None

    rc, output = run_on_terminal(
        ["launch", str(config), "--runs-dir", str(runs_dir)], press_ctrl_c_once_both_ranks_print, timeout=60
    )
    screen = screen_text(output)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    assert pressed, f"the ranks' lines never showed:\n{screen}"
    assert rc == 130, screen
    assert record(run_dir)["status"] == "cancelled"

    lines = screen.splitlines()
    run_id = record(run_dir)["run_id"]
    # The panel is redrawn in place while the job runs; what stays is one final panel,
    # under the ranks' output, with the stop message above or below it but never inside.
    titles = [i for i, line in enumerate(lines) if line.startswith("looping") and run_id in line]
    assert len(titles) == 1, screen
    header = lines[titles[0] + 1].split()
    assert header[:5] == ["RANK", "PID", "STATE", "DEVICE", "EXIT"], screen
    rank0, rank1 = (line.split() for line in lines[titles[0] + 2 : titles[0] + 4])
    assert rank0[:3] == ["0", str(record(run_dir)["ranks"][0]["pid"]), "killed"], screen
    assert rank1[:3] == ["1", str(record(run_dir)["ranks"][1]["pid"]), "killed"], screen
    assert rank1[-2:] == ["[/]", "[red]"], screen
    assert sum("stopping the job" in line for line in lines) == 1, screen
    assert "[rank0]: step 1 loss 0.5000" in lines and "[rank1]: step 1 loss 1.5000 [/] [red]" in lines, screen
