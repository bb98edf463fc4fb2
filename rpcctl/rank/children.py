"""The processes a process started with ``multiprocessing`` (``mp.spawn``'s workers): their
exit status, and where they sit in the run's tree. Their parent reaps them, so only the parent
can know how they ended (psutil cannot wait on a process that is not its child; the rank server,
a subreaper, sees only orphans).

``install()`` (when torch is imported: ``autohook``) does four things:

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
- in a process a rank started with ``multiprocessing.Process`` (not mp.spawn's: torch's ``_wrap``
  catches their exceptions itself), when its ``run()`` raises: multiprocessing prints the
  traceback and exits 1, and the parent's ``join`` returns as for any end, so a rank whose every
  process raised still exits 0. The exception (type, message, traceback, the process's name, pid
  and parent) is written, 0600, to ``protocol.RAISED_FILE`` in the run directory, before the
  process ends: the supervisor reads it when the rank exits 0 and fails the job, naming that
  process (``Supervisor._raised_below``). Taken at the ``traceback.print_exc`` that
  multiprocessing's ``_bootstrap`` calls, so no frame of rpcctl's shows in the traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from rpcctl.base.lines import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, cap_text
from rpcctl.base.private import private_dir, private_open
from rpcctl.rank.observer import Observer
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
    _tell_raised()


def note(index: int, pid: int) -> str:
    return NOTE.format(index=index, pid=pid)


def noted(line: str) -> tuple[int, int] | None:
    """(index, pid) of a ``note`` line; None for any other line."""
    head, mid, pid = line.strip().partition(_NOTE_MID)
    index = head[len(_NOTE_HEAD) :] if head.startswith(_NOTE_HEAD) else ""
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
            if (
                type(index) is int
                and type(pid) is int
                and _not_a_rank()
                and note(index, pid) not in getattr(self, "__notes__", ())
            ):
                self.add_note(note(index, pid))
        except Exception:  # noqa: BLE001 - never change what the program's own join raises
            pass

    __init__._rpcctl_children = True  # type: ignore[attr-defined]
    exception.__init__ = __init__


def _tell_raised() -> None:
    """Wrap ``BaseProcess._bootstrap`` (it runs in the child): while it runs, the
    ``traceback.print_exc`` its own ``except`` calls for an exception of ``run()`` writes that
    exception down first (``_raised_document``); any other caller's print_exc is left alone."""
    from multiprocessing import process

    original = process.BaseProcess._bootstrap
    if getattr(original, "_rpcctl_children", False):
        return
    code = original.__code__

    @functools.wraps(original)
    def _bootstrap(self: Any, *args: Any, **kwargs: Any) -> Any:
        printer = traceback.print_exc

        def print_exc(*pargs: Any, **pkwargs: Any) -> None:
            try:
                caller = sys._getframe(1).f_code
                exc = sys.exc_info()[1]
                if caller is code and isinstance(exc, Exception) and _not_a_rank():
                    _write_raised(exc, self)
            except Exception:  # noqa: BLE001 - never change how the program's process ends
                pass
            printer(*pargs, **pkwargs)

        traceback.print_exc = print_exc
        try:
            return original(self, *args, **kwargs)
        finally:
            traceback.print_exc = printer

    _bootstrap._rpcctl_children = True  # type: ignore[attr-defined]
    process.BaseProcess._bootstrap = _bootstrap  # type: ignore[method-assign]


def _raised_document(exc: BaseException, name: str) -> dict[str, Any]:
    """What ``RAISED_FILE`` holds: the process (pid, parent, its multiprocessing name, the rank's
    pid), and its exception as the rank's error file has one, capped the same way."""
    whole = "; the whole is in the rank's log"
    return {
        "rank_pid": os.environ.get(protocol.ENV_RANK_PID),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "name": str(name)[:200],
        "worker": _worker_name(),
        "type": type(exc).__name__,
        "message": cap_text(f"{type(exc).__name__}: {exc}", MAX_MESSAGE_CHARS, whole),
        "traceback": cap_text("".join(traceback.format_exception(exc)), MAX_TRACEBACK_CHARS, whole),
        "t": time.time(),
    }


def _worker_name() -> str | None:
    """This process's RPC name, if it is in an RPC world now (the store may not have it yet)."""
    rpc = sys.modules.get("torch.distributed.rpc")
    try:
        if rpc is not None and rpc.api._is_current_rpc_agent_set():
            return str(rpc.get_worker_info().name)[:200]
    except Exception:  # noqa: BLE001 - the name is a courtesy
        pass
    return None


def _write_raised(exc: BaseException, process: Any) -> None:
    run_dir = os.environ.get("RPCCTL_RUN_DIR")
    if not run_dir or not os.environ.get(protocol.ENV_RANK_PID):
        return
    path = os.path.join(run_dir, protocol.RAISED_FILE.format(pid=os.getpid()))
    try:
        private_dir(os.path.dirname(path))
        tmp = f"{path}.tmp"
        with private_open(tmp, "w") as f:
            json.dump(_raised_document(exc, getattr(process, "name", "?")), f)
        os.replace(tmp, path)
    except OSError as err:
        print(f"rpcctl: could not write {path}: {err}", file=sys.stderr)


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
    q = OBSERVER.queue
    try:
        if q is not None:
            if len(q) < protocol.MAX_QUEUE:
                q.append({"e": "cexit", "pid": int(pid), "code": int(code), "t": time.time()})
            else:
                OBSERVER.lost += 1
    except Exception:  # never break the program's own join
        pass


class ChildrenObserver(Observer):
    """The children family, as the reporter drives it. Its handle, the reporter's queue while
    telemetry runs, is kept here (no hot path: one ``cexit`` per child ended)."""

    name = "children"

    def __init__(self) -> None:
        self.queue: Any = None
        self.lost = 0

    def activate(self, queue: Any) -> None:
        self.queue = queue

    def deactivate(self) -> None:
        self.queue = None

    def after_fork_in_child(self) -> None:
        """A forked child has no telemetry until it joins."""
        self.queue, self.lost = None, 0

    def dropped(self) -> int:
        return self.lost


OBSERVER = ChildrenObserver()
