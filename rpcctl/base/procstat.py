"""A process's figures from ``/proc/PID/stat`` (Linux), read whole in one system call.

The command name (field 2) may hold spaces and parentheses, so the fields are split after its
last ``)``; the indexes below are into what follows it (proc(5)'s field number minus 3).
The standard library only: ranks import it too (the reporter's probe).
"""

from __future__ import annotations

UTIME, STIME, NUM_THREADS, START_TIME, RSS_PAGES = 11, 12, 17, 19, 21


def stat_fields(pid: int | str = "self") -> list[bytes]:
    """The fields after the command name; raises OSError where there is no such file."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2 :].split()


_TICK_S = None


def cpu_seconds(pid: int, tid: int | None = None) -> float | None:
    """CPU time (user + system, seconds) of a process, or of one of its threads (``tid``: the
    main thread's is the pid); None where it cannot be read (gone, not Linux)."""
    global _TICK_S
    import os

    try:
        if _TICK_S is None:
            _TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
        path = f"{pid}/task/{tid}" if tid is not None else str(pid)
        fields = stat_fields(path)
        return (int(fields[UTIME]) + int(fields[STIME])) * _TICK_S
    except (OSError, ValueError, IndexError):
        return None
