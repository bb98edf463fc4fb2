"""Python stack dumps of live processes: SIGUSR1 -> faulthandler -> a file, read back by
``rpcctl stack``.

Ranks register in rpcctl's bootstrap (``runtime.py``) and write ``stacks/rank-N.txt``.
Python processes that a rank starts itself (``mp.spawn``, ``subprocess``) register when they
import torch (the import hook rpcctl's ``sitecustomize`` installs, ``rank/autohook.py``)
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
import threading
import time
from pathlib import Path

from rpcctl.base.private import private_dir, private_open
from rpcctl.base.procstat import START_TIME, stat_fields

_files: list = []  # kept open for faulthandler.register
_register_lock = threading.Lock()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22)."""
    try:
        return int(stat_fields(pid)[START_TIME])
    except OSError:
        return None


def child_stack_file(run_dir: Path, pid: int, ticks: int) -> Path:
    return run_dir / "stacks" / f"pid-{pid}-{ticks}.txt"


def register_child(run_dir: str) -> None:
    """In a process a rank started: dump every thread's stack to this process's file on SIGUSR1."""
    pid = os.getpid()
    ticks = start_ticks(pid)
    if ticks is None:
        return
    path = child_stack_file(Path(run_dir), pid, ticks)
    with _register_lock:  # a Monarch mesh process registers from a thread, and again at `import torch`
        if any(f.name == str(path) for f in _files):
            return
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
    before = _size(path)
    os.kill(pid, signal.SIGUSR1)
    return _collect({pid: (path, before)}, timeout)[pid]


def dump_many(
    targets: list[tuple[int, Path]], timeout: float, header: str = "", stop=lambda: False
) -> dict[int, str | None]:
    """Dump several processes at once (the launcher, before a teardown): signal every one that
    can answer, then wait up to ``timeout`` in all for their files. A process that would die of
    SIGUSR1 (no dump handler yet: still starting) or cannot answer (stopped) is not signalled.
    ``header`` is appended to each file first, to say when and why; ``stop()`` cuts the wait."""
    pending: dict[int, tuple[Path, int]] = {}
    for pid, path in targets:
        if not answers_dump(pid):
            continue
        try:
            if header:
                with private_open(path, "a") as f:
                    f.write(header)
            before = _size(path)
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            continue
        pending[pid] = (path, before)
    return _collect(pending, timeout, stop)


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return {k: v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}
    except OSError:
        return {}


def stopped(pid: int) -> bool:
    """True when ``pid`` is stopped (SIGSTOP, Ctrl-Z, a tracer): it runs nothing, answers no
    signal but SIGKILL and SIGCONT, until ``kill -CONT``."""
    return _status(pid).get("State", "")[:1] in ("T", "t")


def answers_dump(pid: int) -> bool:
    """True when ``pid`` runs and handles SIGUSR1 (its SigCgt mask in /proc): signalling it
    yields a dump, never its death. A stopped process cannot answer until SIGCONT."""
    fields = _status(pid)
    if fields.get("State", "X")[:1] in ("T", "t", "Z", "X"):
        return False
    caught = int(fields.get("SigCgt", "0") or "0", 16)
    return bool(caught & (1 << (signal.SIGUSR1 - 1)))


def stopped_message(what: str, pid: int) -> str:
    return f"{what} (pid {pid}) is stopped (SIGSTOP): `kill -CONT {pid}` to resume it, then retry"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _collect(pending: dict[int, tuple[Path, int]], timeout: float, stop=lambda: False) -> dict[int, str | None]:
    """What each signalled process appended past its offset. faulthandler writes thread by
    thread: a file is done once it grew and then stayed the same size for 0.2 s."""
    deadline = time.monotonic() + timeout
    sizes = {pid: before for pid, (_, before) in pending.items()}
    stable_since: dict[int, float] = {}
    while pending and time.monotonic() < deadline and not stop():
        now = time.monotonic()
        for pid, (path, before) in pending.items():
            current = _size(path)
            if current > before and current != sizes[pid]:
                sizes[pid], stable_since[pid] = current, now
        if len(stable_since) == len(pending) and all(now - t >= 0.2 for t in stable_since.values()):
            break
        time.sleep(0.05)
    texts: dict[int, str | None] = {}
    for pid, (path, before) in pending.items():
        if sizes[pid] <= before:
            texts[pid] = None
            continue
        with open(path, "rb") as f:
            f.seek(before)
            texts[pid] = f.read(sizes[pid] - before).decode(errors="replace")
    return texts
