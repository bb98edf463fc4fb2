"""The exit status of the processes a process started with ``multiprocessing`` (``mp.spawn``'s
workers): their parent reaps them, so only the parent can know it (psutil cannot wait on a
process that is not its child; the rank server, a subreaper, sees only orphans).

``install()`` (when torch is imported: ``autohook``) wraps ``Popen.poll`` of the fork and
spawn start methods, through which ``Process.join``, ``exitcode`` and ``is_alive`` learn that a
child ended: the first time a child's status is known, a ``cexit`` event (its pid, and the
status as multiprocessing has it: the exit code, or minus the signal's number) goes out with
this process's telemetry, if it has any. The store puts it on the child's row (``procs.exit_code``:
pid and parent). Processes started otherwise (``subprocess``, the forkserver method) are not
followed: the views say ``exited`` for them.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def install() -> None:
    """Wrap ``multiprocessing.popen_fork.Popen.poll`` (the spawn method's Popen inherits it); once."""
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
