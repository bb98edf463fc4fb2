"""The processes a process started with ``multiprocessing`` (``mp.spawn``'s workers): their
exit status, and where they sit in the run's tree. Their parent reaps them, so only the parent
can know how they ended (psutil cannot wait on a process that is not its child; the rank server,
a subreaper, sees only orphans).

``install()`` (when torch is imported: ``autohook``) does three things:

- wraps ``Popen.poll`` of the fork and spawn start methods, through which ``Process.join``,
  ``exitcode`` and ``is_alive`` learn that a child ended: the first time a child's status is
  known, a ``cexit`` event (its pid, and the status as multiprocessing has it: the exit code, or
  minus the signal's number) goes out with this process's telemetry, if it has any. The store puts
  it on the child's row (``procs.exit_code``: pid and parent). Processes started otherwise
  (``subprocess``, the forkserver method) are not followed: the views say ``exited`` for them.
- in a process a rank started (not the rank: it joined at its start), joins telemetry before
  ``Process.start`` (every start method, a Pool's workers, ``mp.spawn``): a trainer that
  mp.spawns workers of its own is then one of the run's processes, so its children are listed
  under it and their exit statuses are told (``inspect workers``: rank 0 › pid A › pid B), even
  if it never calls init_rpc or init_process_group itself.
- in such a process too, when ``mp.spawn``'s join (torch's ``ProcessContext.join``) finds that one
  of its workers failed, the exception it raises gets a note naming that worker's pid (``note``,
  added as torch makes the exception, so no frame of rpcctl's shows in its traceback). That
  exception reaches the rank only as text (torch's ``_wrap`` writes the traceback to a file), and
  the text of a nested ``ProcessRaisedException`` has indexes, never pids: with the note, the
  rank's error file names the process that failed and its chain (``runtime.spawned_failure``).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from rpcctl.wire import protocol

NOTE = "rpcctl: mp.spawn process {index} was pid {pid}"
_NOTE_HEAD, _NOTE_MID = "rpcctl: mp.spawn process ", " was pid "


def install(join: Callable[[], Any] | None = None) -> None:
    """Follow this process's children (above); once. ``join``: how this process joins telemetry
    (``patch.set_join``'s callable), called before it starts a child if it is not a rank."""
    _follow_exits()
    if join is not None:
        _join_before_start(join)
    _note_failed_pid()


def note(index: int, pid: int) -> str:
    return NOTE.format(index=index, pid=pid)


def noted(line: str) -> tuple[int, int] | None:
    """(index, pid) of a ``note`` line; None for any other line."""
    head, mid, pid = line.strip().partition(_NOTE_MID)
    index = head[len(_NOTE_HEAD):] if head.startswith(_NOTE_HEAD) else ""
    if not mid or not index.isdigit() or not pid.isdigit() or not index.isascii() or not pid.isascii():
        return None
    return int(index), int(pid)


def _not_a_rank() -> bool:
    return os.environ.get(protocol.ENV_RANK_PID) != str(os.getpid())


def _join_before_start(join: Callable[[], Any]) -> None:
    from multiprocessing import process

    original = process.BaseProcess.start
    if getattr(original, "_rpcctl_children", False):
        return

    @functools.wraps(original)
    def start(self: Any) -> None:
        if _not_a_rank():
            try:
                join()
            except Exception:  # noqa: BLE001 - never break the program's own start
                pass
        return original(self)

    start._rpcctl_children = True  # type: ignore[attr-defined]
    process.BaseProcess.start = start  # type: ignore[method-assign]


def _note_failed_pid() -> None:
    """On torch's ``ProcessException`` (the base of what ``ProcessContext.join`` raises for a
    worker that failed), so that no frame of rpcctl's is added to the traceback the user reads."""
    exception = getattr(sys.modules.get("torch.multiprocessing.spawn"), "ProcessException", None)
    original = getattr(exception, "__init__", None)
    if original is None or getattr(original, "_rpcctl_children", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            index, pid = getattr(self, "error_index", None), getattr(self, "error_pid", None)
            if type(index) is int and type(pid) is int and _not_a_rank() and note(index, pid) not in getattr(self, "__notes__", ()):
                self.add_note(note(index, pid))
        except Exception:  # noqa: BLE001 - never change what the program's own join raises
            pass

    __init__._rpcctl_children = True  # type: ignore[attr-defined]
    exception.__init__ = __init__


def _follow_exits() -> None:
    """Wrap ``multiprocessing.popen_fork.Popen.poll`` (the spawn method's Popen inherits it)."""
    try:
        from multiprocessing import popen_fork
    except ImportError:  # a platform without fork
        return
    popen = popen_fork.Popen
    original = popen.poll
    if getattr(original, "_rpcctl_children", False):
        return

    def poll(self: Any, flag: int = os.WNOHANG) -> int | None:
        known = self.returncode is not None
        code = original(self, flag)
        if code is not None and not known:
            _ended(self.pid, code)
        return code

    poll._rpcctl_children = True  # type: ignore[attr-defined]
    popen.poll = poll


def _ended(pid: int, code: int) -> None:
    # The reporter is loaded wherever telemetry is on (not imported here: it imports the
    # module that installs this one); where it is not, there is nothing to tell.
    reporter = sys.modules.get("rpcctl.rank.reporter")
    try:
        if reporter is not None:
            reporter.post({"e": "cexit", "pid": int(pid), "code": int(code), "t": time.time()})
    except Exception:  # never break the program's own join
        pass
