"""Python stack dumps of live processes, appended to a file and read back by ``rpcctl stack``
and the hang watchdog's looks.

Two ways in, the safe one first. Each process that registers also serves dumps on a thread of
its own (``serve_dumps``): a byte written to the FIFO beside its file (``<file>.ask``) wakes it,
and it writes every thread's stack from ``sys._current_frames()``, under the GIL, in
faulthandler's format. Only if that brings nothing in time (the GIL is held: a C call that
never releases it; the thread is gone) is the process sent SIGUSR1, and faulthandler's handler
dumps without the GIL. That one walks the interpreter's threads while they run, and a thread
state freed under it is a segfault: a rank serving RPC calls died of it under the watchdog's
looks (CI, test_server_total), and 13 dumps of a process whose threads come and go were enough
here (tests/test_stack_dumps.py). With the GIL held elsewhere
no thread state is freed, so the fallback is safe where it is needed.

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
import stat
import sys
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
        serve_dumps(path, f)
    atexit.register(_remove_if_empty, path)


ASK_SUFFIX = ".ask"
MAX_FRAMES = 100  # per thread, as faulthandler
MAX_THREADS = 100  # as faulthandler
MAX_NAME = 500  # characters of a file or function name, as faulthandler


def ask_path(stack_file: Path | str) -> Path:
    return Path(str(stack_file) + ASK_SUFFIX)


def serve_dumps(stack_file: Path | str, out) -> None:
    """Answer dump requests on a daemon thread: each byte written to ``<stack_file>.ask`` (a
    FIFO, the owner's alone) appends one dump of every other thread to ``out``. Nothing served
    (no FIFO, or something else of that name: a read-only directory, a planted link) leaves
    SIGUSR1's faulthandler dump as the only way."""
    ask = ask_path(stack_file)
    try:
        try:
            os.mkfifo(ask, 0o600)
        except FileExistsError:  # a restarted rank's, or a process registering twice
            pass
        fd = _open_fifo(ask, os.O_RDWR)  # read and write: no EOF when the asker closes its end
    except OSError:
        return
    threading.Thread(target=_answer, args=(fd, out.fileno()), name="rpcctl-stack-dumps", daemon=True).start()
    pid = os.getpid()
    atexit.register(lambda: os.getpid() == pid and _remove_ask(Path(stack_file)))  # not a forked child's exit


def _open_fifo(path: Path, flags: int) -> int:
    """``path`` opened if it is a FIFO, never through a link: OSError for anything else."""
    fd = os.open(path, flags | os.O_NOFOLLOW)
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a FIFO")
    return fd


def _answer(fd: int, out_fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 64):
                return
        except OSError:  # the FIFO went: SIGUSR1 still dumps
            return
        try:  # straight to the file, as faulthandler writes: nothing of a failed dump stays queued
            data = format_stacks().encode()
            while data:
                data = data[os.write(out_fd, data) :]
        except Exception:  # noqa: BLE001 - a full disk, a closed file: this dump is lost, the next may land
            pass


def format_stacks() -> str:
    """Every thread's Python stack but the caller's, in faulthandler's format and bounds (the
    readers parse that; at most 100 threads of 100 frames, names cut at 500 characters and in
    printable ASCII, so a name cannot forge a line): the main thread first, as ``Current
    thread``, the one faulthandler's handler runs in."""
    frames = sys._current_frames()
    me, main = threading.get_ident(), threading.main_thread().ident
    order = ([main] if main in frames else []) + [t for t in frames if t not in (main, me)]
    out = []
    for tid in order[:MAX_THREADS]:
        out.append(f"{'Current thread' if tid == main else 'Thread'} 0x{tid:016x} (most recent call first):\n")
        frame, depth = frames[tid], 0
        while frame is not None and depth < MAX_FRAMES:
            code = frame.f_code
            out.append(
                f'  File "{_printable(code.co_filename)}", line {frame.f_lineno or 0} in {_printable(code.co_name)}\n'
            )
            frame, depth = frame.f_back, depth + 1
        if frame is not None:
            out.append("  ...\n")
        out.append("\n")
    if len(order) > MAX_THREADS:
        out.append("...\n")
    return "".join(out)


def _printable(text: str) -> str:
    """faulthandler's way with a name: printable ASCII as it is, anything else escaped."""
    cut, more = text[:MAX_NAME], "..." if len(text) > MAX_NAME else ""
    if not (cut.isascii() and cut.isprintable()):
        cut = "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode() for c in cut)
    return cut + more


def _ask(path: Path) -> bool:
    """Ask the process serving ``path``'s FIFO for a dump; False when none reads it."""
    try:
        fd = _open_fifo(ask_path(path), os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no reader, ENOENT: none
    except OSError:
        return False
    try:
        return os.write(fd, b"?") == 1
    except OSError:  # full: asked many times already, and not answering
        return False
    finally:
        os.close(fd)


def _remove_ask(path: Path) -> None:
    try:
        ask_path(path).unlink()
    except OSError:
        pass


def remove_asks(stacks_dir: Path) -> None:
    """The FIFOs left in a run's ``stacks/`` once its processes are gone (a killed one never
    removed its own): a finished run holds plain files only (``grep -r`` or a copy of the run
    would wait on a FIFO for ever)."""
    try:
        entries = list(stacks_dir.iterdir())
    except OSError:
        return
    for path in entries:
        if path.name.endswith(ASK_SUFFIX):
            try:
                path.unlink()
            except OSError:
                pass


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
    """Ask ``pid`` for a dump (its FIFO, then SIGUSR1: the module's docstring) and return what
    it appended to ``path``, or None if nothing came.

    Raises ProcessLookupError / PermissionError from the signal."""
    return _dump_all({pid: path}, timeout, lambda pid: os.kill(pid, signal.SIGUSR1))[pid]


def _dump_all(targets: dict[int, Path], timeout: float, signal_it, stop=lambda: False) -> dict[int, str | None]:
    """The FIFO first, for up to half of ``timeout`` (2 s at most); who did not answer is
    signalled (``signal_it(pid)``; OSError from it: not dumped, but ``dump``'s to raise) and
    waited for in the time left."""
    deadline = time.monotonic() + timeout
    asked = {pid: (path, _size(path)) for pid, path in targets.items()}
    asked = {pid: at for pid, at in asked.items() if _ask(at[0])}
    texts = _collect(asked, min(timeout / 2, 2.0), stop) if asked else {}
    if stop():
        return {pid: texts.get(pid) for pid in targets}
    signalled: dict[int, tuple[Path, int]] = {}
    for pid, path in targets.items():
        if texts.get(pid) is None:
            before = _size(path)
            signal_it(pid)
            signalled[pid] = (path, before)
    if signalled:
        texts.update(_collect(signalled, max(deadline - time.monotonic(), 0.5), stop))
    return texts


def dump_many(
    targets: list[tuple[int, Path]], timeout: float, header: str = "", stop=lambda: False
) -> dict[int, str | None]:
    """Dump several processes at once (the launcher, before a teardown): signal every one that
    can answer, then wait up to ``timeout`` in all for their files. A process that would die of
    SIGUSR1 (no dump handler yet: still starting) or cannot answer (stopped) is not signalled.
    ``header`` is appended to each file first, to say when and why; ``stop()`` cuts the wait."""
    chosen: dict[int, Path] = {}
    for pid, path in targets:
        if not answers_dump(pid):
            continue
        try:
            if header:
                with private_open(path, "a") as f:
                    f.write(header)
        except OSError:
            continue
        chosen[pid] = path
    gone: set[int] = set()

    def signal_it(pid: int) -> None:
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            gone.add(pid)

    texts = _dump_all(chosen, timeout, signal_it, stop)
    return {pid: text for pid, text in texts.items() if pid not in gone}


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
