"""The hang watchdog's diagnosis: from the processes (``Proc``, their stacks as the last look saw
them), the calls in flight and the collectives' groups, who waits on whom, and the suspect.

Pure: no I/O here (``rpcctl.supervise.watchdog`` gathers the evidence, writes it and decides). The
diagnosis, in order: the wait chain from the oldest call in flight to the process at its end,
what that process is running and where (file, line, the source line: the lock it waits on), a
cycle of workers if the chain comes back (a deadlock); a collective's hang
(``collective_hangs``); the rank that has not entered init_process_group, or joined RPC (or
ended without doing so while others wait in it); a stopped process; else where the ranks' main
threads are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rpcctl.supervise import collective_hangs
from rpcctl.console import human_seconds
from rpcctl.supervise.hang_evidence import ThreadStack, where
from rpcctl.inspect.calls import CallsReport, PendingCall, ServingRecord, same_function
from rpcctl.inspect.stored import StoredGroup
from rpcctl.base.states import CallState, ServingState


@dataclass
class Proc:
    """A process of the attempt as the watchdog sees it."""

    proc_id: int | None
    pid: int
    rank: int | None
    kind: str  # rank | child
    name: str | None  # RPC name
    joined_at: float | None  # entered init_rpc
    stopped: bool = False
    pg_joined_at: float | None = None  # entered init_process_group (or new_group)
    dist_rank: int | None = None  # its rank in its c10d world (a process a rank spawned: not the launcher rank)
    pg_world: int | None = 0  # which c10d world (the store's numbering)
    threads: list[ThreadStack] = field(default_factory=list)
    dumped: bool = False
    host: str | None = None
    ended: str | None = None  # how a rank of the attempt that is no longer running ended ("exited with code 0")
    local: bool = True  # one of this node's: a multi-node run's other nodes are not signalled from here

    def describe(self) -> str:
        on = "" if self.local else f" on {self.host or 'another node'}"
        if self.kind == "rank":
            named = f"{self.name}, " if self.name else ""
            return f"rank {self.rank} ({named}pid {self.pid}{on})"
        return f"{self.name or 'process'} (pid {self.pid}{on}, started by rank {self.rank})"

    @property
    def elsewhere(self) -> str:
        """For a process of another node: where its stack can be had."""
        return "" if self.local else f"; its stack: `rpcctl stack` on {self.host or 'its node'}"

    def thread(self, ident: int | None) -> ThreadStack | None:
        return next((t for t in self.threads if t.ident == ident), None)

    def main_thread(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.is_main), None) or next((t for t in self.threads if t.current), None)


@dataclass
class Diagnosis:
    headline: str
    details: list[str]
    suspect: Proc | None

    def text(self) -> str:
        return "\n".join([self.headline, *(f"  {line}" for line in self.details)]) + "\n"


def diagnose(
    procs: list[Proc],
    report: CallsReport,
    stalled_s: float,
    groups: list[StoredGroup] = (),
    ended: list[Proc] = (),
    shutdown: str | None = None,
) -> Diagnosis:
    """``procs``: the attempt's running processes; ``groups``: their process groups (``inspect.progress``'s
    typed records); ``ended``: its ranks that have ended (``Proc.ended``);
    ``shutdown``: who waits in rpc.shutdown for whom (``inspect.shutdown_waits``)."""
    by_name = {p.name: p for p in procs if p.name}
    by_proc_id = {p.proc_id: p for p in procs if p.proc_id is not None}
    details = [
        f"no progress for {human_seconds(stalled_s)}: no call ended, no collective completed, no loss, no output line"
    ]
    for proc in procs:
        if proc.stopped:
            details.append(f"{proc.describe()} is stopped (SIGSTOP or SIGTSTP): it cannot run or answer until SIGCONT")
    waiting = [c for c in report.pending if c.state == CallState.PENDING]
    for call in waiting:
        details.append(
            f"{call.caller} → {call.callee}: {call.kind} {call.func} at {call.call_site},"
            f" for {human_seconds(call.age_s)}"
        )
    for served in report.serving:
        if served.state == ServingState.RUNNING:
            details.append(served.describe())
    for proc in procs:  # read from outside at the verdict: where each one is, down to the C function
        main = proc.main_thread()
        if main is not None and main.native and where(main):
            details.append(f"{proc.describe()} is at {where(main)}")
    collective = collective_hangs.verdict(list(groups), procs, time.time(), lambda p: where(p.main_thread()))
    if collective is not None:
        details.extend(collective.details)
    if waiting:
        headline, suspect = _chain(waiting[0], waiting, report.serving, by_name, by_proc_id)
        if collective is not None:
            headline += f"; {collective.headline}"
            if collective.suspect is not None and collective.suspect.proc_id == waiting[0].caller_proc:
                headline += (
                    f" — a deadlock across RPC and a collective: {collective.suspect.describe()} waits on its RPC call,"
                    " whose callee waits in the collective for it"
                )
        return Diagnosis(headline, details, suspect)
    if collective is not None:
        return Diagnosis(collective.headline, details, collective.suspect)
    left = _left_before(procs, list(ended))
    if left is not None:
        return Diagnosis(left[0], details, left[1])
    missing = collective_hangs.absent_from_groups(procs)
    if missing:
        proc = missing[0]
        at = where(proc.main_thread())
        others = [p.describe() for p in procs if p.kind == "rank" and p.pg_joined_at is not None]
        headline = (
            f"{proc.describe()} has not entered init_process_group"
            + (": it is stopped (SIGSTOP)" if proc.stopped else (f"; it is at {at}" if at else ""))
            + f"; {', '.join(others)} {'waits' if len(others) == 1 else 'wait'} in it"
        )
        return Diagnosis(headline, details, proc)
    joined = [p for p in procs if p.joined_at is not None]
    absent = [p for p in procs if p.kind == "rank" and p.joined_at is None]
    if joined and absent:
        proc = absent[0]
        at = where(proc.main_thread())
        others = [p.describe() for p in joined if p.kind == "rank"] or [p.describe() for p in joined]
        headline = (
            f"{proc.describe()} has not joined RPC"
            + (f"; it is at {at}" if at else "")
            + f"; {', '.join(others)} {'waits' if len(others) == 1 else 'wait'} in init_rpc"
        )
        if proc.stopped:
            headline = f"{proc.describe()} has not joined RPC: it is stopped (SIGSTOP)"
        return Diagnosis(headline, details, proc)
    stopped = next((p for p in procs if p.stopped), None)
    if stopped is not None:
        return Diagnosis(f"{stopped.describe()} is stopped (SIGSTOP or SIGTSTP)", details, stopped)
    places = [f"{p.describe()} at {where(p.main_thread())}" for p in procs if where(p.main_thread())]
    headline = (
        "no call in flight; "
        + (f"{shutdown}; " if shutdown else "")
        + ("; ".join(places) if places else "see the stacks")
    )
    return Diagnosis(headline, details, None)


def _left_before(procs: list[Proc], ended: list[Proc]) -> tuple[str, Proc] | None:
    """A rank that ended without entering init_process_group (or init_rpc) while others wait in it:
    they wait for a rank that is gone."""
    for entered, what, where_in in (
        (lambda p: p.pg_joined_at, "entering init_process_group", "init_process_group"),
        (lambda p: p.joined_at, "joining RPC", "init_rpc"),
    ):
        waiting = [p for p in procs if p.kind == "rank" and entered(p) is not None]
        gone = [p for p in ended if p.kind == "rank" and entered(p) is None]
        if waiting and gone:
            proc = gone[0]
            others = ", ".join(p.describe() for p in waiting)
            at = where(waiting[0].main_thread()) if len(waiting) == 1 else None
            return (
                f"{proc.describe()} {proc.ended} before {what}; {others} {'waits' if len(waiting) == 1 else 'wait'} "
                f"in {where_in} for it" + (f", at {at}" if at else "")
            ), proc
    return None


def _chain(
    first: PendingCall,
    waiting: list[PendingCall],
    serving: list[ServingRecord],
    by_name: dict[str, Proc],
    by_proc_id: dict[int, Proc],
) -> tuple[str, Proc | None]:
    """Follow the oldest call: its callee runs something for it; if that thread itself waits
    on a call, follow that one; stop at a process that waits on nothing (the suspect)."""
    caller = by_proc_id.get(first.caller_proc)
    who = caller.describe() if caller is not None else (first.caller or "a process")
    parts = [
        f"{who} has waited {human_seconds(first.age_s)} on {first.kind} → {first.callee}"
        f" ({first.func}, {first.call_site})"
    ]
    path = [first.caller or who]
    call, suspect = first, None
    for _ in range(16):
        path.append(call.callee)
        callee = by_name.get(call.callee)
        served = next(
            (s for s in serving if s.call == (call.caller_proc, call.call_id) and s.state == ServingState.RUNNING), None
        ) or next(
            (
                s
                for s in serving
                if s.worker == call.callee and s.state == ServingState.RUNNING and same_function(call.func, s.func)
            ),
            None,
        )
        if callee is not None and callee.stopped:
            parts.append(f"{callee.describe()} is stopped (SIGSTOP or SIGTSTP): it cannot answer")
            suspect = callee
            break
        if served is None:
            suspect = callee
            at = where(callee.main_thread()) if callee is not None else None
            parts.append(
                f"{call.callee} shows nothing running for it"
                + (f"; its main thread is at {at}" if at else "")
                + (callee.elsewhere if callee is not None else "")
            )
            break
        thread = callee.thread(served.thread) if callee is not None else None
        onward = next(
            (
                c
                for c in waiting
                if callee is not None and c.caller_proc == callee.proc_id and c.thread == served.thread
            ),
            None,
        )
        if onward is None:
            suspect = callee
            at = where(thread)
            parts.append(
                f"{served.worker} is running {served.func} for {served.caller or '?'} ({human_seconds(served.age_s)})"
                + (f", blocked at {at}" if at else "")
                + (callee.elsewhere if callee is not None else "")
            )
            break
        parts.append(
            f"{served.worker} runs {served.func}, which waits on {onward.kind} → {onward.callee}"
            f" ({onward.func}, {onward.call_site})"
        )
        call = onward
    headline = "; ".join(parts)
    repeated = [name for index, name in enumerate(path) if name in path[:index]]
    if repeated:  # name the cycle itself, and who waits on it from outside
        start = path.index(repeated[0])
        outside = path[:start]
        headline += f" — a deadlock: {' → '.join(path[start:])} wait on each other" + (
            f"; {', '.join(outside)} {'waits' if len(outside) == 1 else 'wait'} on the cycle" if outside else ""
        )
    return headline, suspect
