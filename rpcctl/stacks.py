"""Python stack dumps of live processes: SIGUSR1 -> faulthandler -> a file, read back by
``rpcctl stack``.

Ranks register in rpcctl's bootstrap (``runtime.py``) and write ``stacks/rank-N.txt``.
Python processes that a rank starts itself (``mp.spawn``, ``subprocess``) register when they
import torch (the import hook rpcctl's ``sitecustomize`` installs, ``telemetry/autohook.py``)
and write ``stacks/pid-<pid>-<start>.txt``. That file is also the
proof that the process answers SIGUSR1 with a dump; to any other process SIGUSR1 is fatal,
so nothing without one is signalled. ``<start>`` is the process's start time as /proc gives
it (clock ticks since boot), so a recycled pid never matches an old file.

Imported in those processes and by the launcher: the standard library only (psutil, for
``registered_descendants``, is imported where it is used).
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import time
from pathlib import Path

from rpcctl.private import private_dir, private_open

_files: list = []  # kept open for faulthandler.register


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


def child_stack_file(run_dir: Path, pid: int, ticks: int) -> Path:
    return run_dir / "stacks" / f"pid-{pid}-{ticks}.txt"


def register_child(run_dir: str) -> None:
    """In a process a rank started: dump every thread's stack to this process's file on SIGUSR1."""
    pid = os.getpid()
    ticks = start_ticks(pid)
    if ticks is None:
        return
    path = child_stack_file(Path(run_dir), pid, ticks)
    private_dir(path.parent)
    f = private_open(path, "a")  # must stay open for faulthandler
    _files.append(f)
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
    atexit.register(_remove_if_empty, path)


def _remove_if_empty(path: Path) -> None:
    # A process that was never asked for its stacks leaves no file behind.
    try:
        if path.stat().st_size == 0:
            path.unlink()
    except OSError:
        pass


def registered_descendants(run_dir: Path, pid: int) -> list[tuple[int, list[str], Path]]:
    """(pid, cmdline, stack file) of each live descendant of ``pid`` that registered a dump."""
    import psutil

    found = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        ticks = start_ticks(child.pid)
        path = child_stack_file(run_dir, child.pid, ticks) if ticks is not None else None
        if path is None or not path.exists():
            continue
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        found.append((child.pid, cmdline, path))
    return found


def dump(pid: int, path: Path, timeout: float) -> str | None:
    """Signal ``pid`` and return what it appended to ``path``, or None if nothing came.

    Raises ProcessLookupError / PermissionError from the signal."""
    before = path.stat().st_size if path.exists() else 0
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    size, stable_since = before, None
    # faulthandler writes thread by thread: wait until the file stops growing.
    while time.monotonic() < deadline:
        current = path.stat().st_size if path.exists() else 0
        if current > before:
            if current != size:
                size, stable_since = current, time.monotonic()
            elif stable_since is not None and time.monotonic() - stable_since >= 0.2:
                break
        time.sleep(0.05)
    if size <= before:
        return None
    with open(path, "rb") as f:
        f.seek(before)
        return f.read().decode(errors="replace")
