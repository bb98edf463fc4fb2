"""Run rpcctl on a real pseudo-terminal and read back the screen a user would see.

The pty is the process's controlling terminal (as a shell sets it up), so typing Ctrl-C sends
SIGINT to the foreground process group the way a keyboard does; the bytes drawn are replayed
through a terminal emulator (pyte), so tests assert on the final screen, not on escape codes.
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

ROWS, COLS = 60, 150
CTRL_C = b"\x03"


def _take_terminal() -> None:
    # In the child, after setsid: make the pty (stdin) the controlling terminal, as a shell does.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def run_on_terminal(
    args: list[str], on_output: Callable[[bytes, int], bytes | None], timeout: float
) -> tuple[int, bytes]:
    """Run rpcctl on a fresh pty; ``on_output(all_bytes, pid)`` may return bytes to type."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(COLS), "LINES": str(ROWS)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rpcctl", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
        preexec_fn=_take_terminal,
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
