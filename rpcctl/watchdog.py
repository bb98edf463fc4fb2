"""The hang watchdog: notice that a job stopped moving, keep the evidence, name the suspect.

Progress, precisely: a line of output from any rank, a loss or metrics record (printed or
``rpcctl.report``), the end (ok, error or timeout) of any RPC call in any rank or process a
rank spawned, or a process that starts (connects to telemetry) or enters ``init_rpc``. Not progress: heartbeats and probes (a hung process still sends them), RRef
bookkeeping, torch's own calls (shutdown's barrier), a call that is still running.

The supervisor calls ``check()`` from its loop (at most once a second does work). When no
progress was seen for ``hang_timeout`` seconds in a job that uses RPC (a process entered
``init_rpc``), it:

1. dumps the Python stacks of every running rank and of the processes they spawned (what
   ``rpcctl stack`` does; a stopped process cannot answer and is said to be stopped),
2. snapshots the calls in flight and the callees' view (``rpcctl.inspect.calls``),
3. writes ``stacks.txt``, ``calls.json`` and ``diagnosis.txt`` into ``<run_dir>/hang/``
   (``hang-2/``… for later reports), owner-only,
4. makes the diagnosis: the wait chain from the oldest call in flight to the process at its
   end, what that process is running and where (file, line, the source line: the lock it
   waits on), a cycle of workers if the chain comes back (a deadlock); else the rank that
   never joined RPC, else where the ranks' main threads are,
5. returns the failure (root cause: hang, the diagnosis its message and details; the job is
   torn down, exit 1, and the verdict prints it) or, with ``on_hang: keep``, prints the
   diagnosis, keeps the job and reports again only after progress resumed and stopped.

Earlier, within ``JOIN_WARN_S`` (or half ``hang_timeout`` if shorter) of the first process
entering ``init_rpc``, a rank that has not entered it yet is named with where it is, once. A
rank whose spawned processes entered it (an ``mp.spawn`` program) has joined, through them.

In any job (RPC or not), a rank whose telemetry heartbeat is older than ``STALE_AFTER_S`` has a
sender thread that cannot run (a long C call holding the GIL, a starved or stopped process): its
stack is dumped into ``stacks/rank-N.txt`` at once and the rank named with where it is, once per
silence (again only after it beat again). Nothing ends on that alone: the hang timeout decides.
"""

from __future__ import annotations

import linecache
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpcctl import collective_hangs, inspect, stacks
from rpcctl.inspect.calls import CallsReport, PendingCall, ServingRecord, same_function
from rpcctl.console import human_seconds, to_jsonable
from rpcctl.frames import is_user_file, short_path
from rpcctl.telemetry.protocol import STALE_AFTER_S
from rpcctl.telemetry.reader import column  # a column a store before schema 7 (or 8) lacks reads as None
from rpcctl.runs import Failure, RunRecord, now_iso, write_json_atomic
from rpcctl.states import CallState, RankStatus, ServingState

JOIN_WARN_S = 20.0
CHECK_EVERY_S = 1.0
DUMP_TIMEOUT_S = 2.0


# ---------------------------------------------------------------------------------------------
# Stacks: faulthandler's text, parsed


@dataclass
class Frame:
    file: str
    line: int
    func: str

    @property
    def site(self) -> str:
        return f"{short_path(self.file)}:{self.line} in {self.func}"

    @property
    def source(self) -> str:
        return linecache.getline(self.file, self.line).strip()


@dataclass
class ThreadStack:
    ident: int
    current: bool  # the thread that took the signal (the main thread, for a process signal)
    frames: list[Frame]  # innermost first

    def user_frame(self) -> Frame | None:
        return next((f for f in self.frames if is_user_file(f.file)), None)

    @property
    def is_main(self) -> bool:
        return any(f.func == "_run_script" and f.file.endswith(os.path.join("rpcctl", "runtime.py")) for f in self.frames)


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_stacks(text: str) -> list[ThreadStack]:
    """Threads of one faulthandler dump (``Thread 0x… (most recent call first):`` blocks)."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        header = _THREAD.match(line)
        if header:
            threads.append(ThreadStack(int(header.group(2), 16), header.group(1) == "Current thread", []))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1].frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    return threads


def where(thread: ThreadStack | None) -> str | None:
    """``train.py:12 in load_data (`time.sleep(600)`)``: the innermost frame of the user's code."""
    frame = thread.user_frame() if thread is not None else None
    if frame is None:
        return None
    source = frame.source
    return f"{frame.site} (`{source}`)" if source else frame.site


# ---------------------------------------------------------------------------------------------
# The evidence, and the diagnosis


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


def diagnose(procs: list[Proc], report: CallsReport, stalled_s: float, groups: list[Any] = ()) -> Diagnosis:
    by_name = {p.name: p for p in procs if p.name}
    by_proc_id = {p.proc_id: p for p in procs if p.proc_id is not None}
    details = [f"no progress for {human_seconds(stalled_s)}: no call ended, no collective completed, no loss, no output line"]
    for proc in procs:
        if proc.stopped:
            details.append(f"{proc.describe()} is stopped (SIGSTOP or SIGTSTP): it cannot run or answer until SIGCONT")
    waiting = [c for c in report.pending if c.state == CallState.PENDING]
    for call in waiting:
        details.append(f"{call.caller} → {call.callee}: {call.kind} {call.func} at {call.call_site}, for {human_seconds(call.age_s)}")
    for served in report.serving:
        if served.state == ServingState.RUNNING:
            details.append(served.describe())
    collective = collective_hangs.verdict(list(groups), procs, time.time(), lambda p: where(p.main_thread()))
    if collective is not None:
        details.extend(collective.details)
    if waiting:
        headline, suspect = _chain(waiting[0], waiting, report.serving, by_name, by_proc_id)
        if collective is not None:
            headline += f"; {collective.headline}"
            if collective.suspect is not None and collective.suspect.proc_id == waiting[0].caller_proc:
                headline += (f" — a deadlock across RPC and a collective: {collective.suspect.describe()} waits on its RPC call,"
                             " whose callee waits in the collective for it")
        return Diagnosis(headline, details, suspect)
    if collective is not None:
        return Diagnosis(collective.headline, details, collective.suspect)
    missing = collective_hangs.absent_from_groups(procs)
    if missing:
        proc = missing[0]
        at = where(proc.main_thread())
        others = [p.describe() for p in procs if p.kind == "rank" and p.pg_joined_at is not None]
        headline = f"{proc.describe()} has not entered init_process_group" + (
            ": it is stopped (SIGSTOP)" if proc.stopped else (f"; it is at {at}" if at else "")) + \
            f"; {', '.join(others)} {'waits' if len(others) == 1 else 'wait'} in it"
        return Diagnosis(headline, details, proc)
    joined = [p for p in procs if p.joined_at is not None]
    absent = [p for p in procs if p.kind == "rank" and p.joined_at is None]
    if joined and absent:
        proc = absent[0]
        at = where(proc.main_thread())
        others = [p.describe() for p in joined if p.kind == "rank"] or [p.describe() for p in joined]
        headline = f"{proc.describe()} has not joined RPC" + (f"; it is at {at}" if at else "") + \
            f"; {', '.join(others)} {'waits' if len(others) == 1 else 'wait'} in init_rpc"
        if proc.stopped:
            headline = f"{proc.describe()} has not joined RPC: it is stopped (SIGSTOP)"
        return Diagnosis(headline, details, proc)
    stopped = next((p for p in procs if p.stopped), None)
    if stopped is not None:
        return Diagnosis(f"{stopped.describe()} is stopped (SIGSTOP or SIGTSTP)", details, stopped)
    places = [f"{p.describe()} at {where(p.main_thread())}" for p in procs if where(p.main_thread())]
    headline = "no call in flight; " + ("; ".join(places) if places else "see the stacks")
    return Diagnosis(headline, details, None)


def _chain(first: PendingCall, waiting: list[PendingCall], serving: list[ServingRecord],
           by_name: dict[str, Proc], by_proc_id: dict[int, Proc]) -> tuple[str, Proc | None]:
    """Follow the oldest call: its callee runs something for it; if that thread itself waits
    on a call, follow that one; stop at a process that waits on nothing (the suspect)."""
    caller = by_proc_id.get(first.caller_proc)
    who = caller.describe() if caller is not None else (first.caller or "a process")
    parts = [f"{who} has waited {human_seconds(first.age_s)} on {first.kind} → {first.callee} ({first.func}, {first.call_site})"]
    path = [first.caller or who]
    call, suspect = first, None
    for _ in range(16):
        path.append(call.callee)
        callee = by_name.get(call.callee)
        served = next((s for s in serving if s.call == (call.caller_proc, call.call_id) and s.state == ServingState.RUNNING), None) or next(
            (s for s in serving if s.worker == call.callee and s.state == ServingState.RUNNING and same_function(call.func, s.func)), None)
        if callee is not None and callee.stopped:
            parts.append(f"{callee.describe()} is stopped (SIGSTOP or SIGTSTP): it cannot answer")
            suspect = callee
            break
        if served is None:
            suspect = callee
            at = where(callee.main_thread()) if callee is not None else None
            parts.append(f"{call.callee} shows nothing running for it" + (f"; its main thread is at {at}" if at else "")
                         + (callee.elsewhere if callee is not None else ""))
            break
        thread = callee.thread(served.thread) if callee is not None else None
        onward = next((c for c in waiting if callee is not None and c.caller_proc == callee.proc_id and c.thread == served.thread), None)
        if onward is None:
            suspect = callee
            at = where(thread)
            parts.append(f"{served.worker} is running {served.func} for {served.caller or '?'} ({human_seconds(served.age_s)})"
                         + (f", blocked at {at}" if at else "") + (callee.elsewhere if callee is not None else ""))
            break
        parts.append(f"{served.worker} runs {served.func}, which waits on {onward.kind} → {onward.callee} ({onward.func}, {onward.call_site})")
        call = onward
    headline = "; ".join(parts)
    repeated = [name for index, name in enumerate(path) if name in path[:index]]
    if repeated:  # name the cycle itself, and who waits on it from outside
        start = path.index(repeated[0])
        outside = path[:start]
        headline += f" — a deadlock: {' → '.join(path[start:])} wait on each other" + (
            f"; {', '.join(outside)} {'waits' if len(outside) == 1 else 'wait'} on the cycle" if outside else "")
    return headline, suspect


# ---------------------------------------------------------------------------------------------
# The watchdog the supervisor runs


class HangWatchdog:
    """The supervisor's hang watchdog. On a multi-node run it runs on node 0, whose store has
    every node's telemetry: it detects and diagnoses the hang for the whole job, and dumps the
    stacks of this node's processes only (a pid of another node means nothing here; those are
    named with their host, and a failure it declares tears every node down as any failure does)."""

    def __init__(self, run_dir: Path, timeout: float, keep: bool, console: Any):
        self.run_dir = Path(run_dir)
        self.timeout = timeout
        self.keep = keep
        self.console = console
        self.join_warn_s = min(JOIN_WARN_S, timeout / 2)  # named before the hang is declared
        self._output_at = time.time()
        self._next_check = 0.0
        self._restart = 0
        self._warned_join: set[int] = set()
        self._warned_pg: set[int] = set()
        self._groups: list[Any] = []  # coll_groups rows of the live processes, as of the last check
        self._pg_through: dict[int, float] = {}  # rank → when a process it spawned entered init_process_group
        self._silent: set[int] = set()  # proc ids whose stale heartbeat was reported (until it beats again)
        self._reported_at: float | None = None
        self.reports = 0

    def output_line(self) -> None:
        """A rank printed a line (the log pump's thread: one assignment, no lock needed)."""
        self._output_at = time.time()

    def attempt_started(self, restart: int) -> None:
        self._restart = restart
        self._output_at = time.time()
        self._warned_join.clear()
        self._warned_pg.clear()
        self._silent.clear()
        self._reported_at = None

    def check(self, record: RunRecord) -> Failure | None:
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + CHECK_EVERY_S
        seen = inspect.progress(self.run_dir, self._restart)  # one read a check; the dumps wait until it is closed
        rows = seen.running
        facts = self._facts(seen, record)
        self._dump_silent_ranks(rows, record)
        if facts is None:
            return None
        procs, progress_at, first_join, first_pg_join = facts
        wall = time.time()
        if first_join is not None:
            self._warn_absent(procs, record, first_join, wall)
        if first_pg_join is not None:
            self._warn_absent(procs, record, first_pg_join, wall, group=True)
        progress_at = max(progress_at, self._output_at)
        if self._reported_at is not None:
            if progress_at <= self._reported_at:
                return None
            self._reported_at = None  # it moved again: a new stall will be reported
        stalled = wall - progress_at
        if stalled < self.timeout:
            return None
        diagnosis, folder = self.report(procs, record, stalled)
        self._reported_at = wall
        if self.keep:
            self.console.warn(f"hang: {diagnosis.headline}")
            for line in diagnosis.details:
                self.console.info(f"  {line}")
            self.console.info(f"  stacks, calls and this diagnosis: {folder}")
            self.console.info("  on_hang: keep — the job keeps running")
            return None
        # The verdict, once the job is down, gives the diagnosis (its root cause): said once.
        self.console.warn(f"hang: no progress for {human_seconds(stalled)}; stopping the job (the diagnosis follows)")
        suspect = diagnosis.suspect
        details = "".join(f"  {line}\n" for line in diagnosis.details)  # the message is the headline
        return Failure(rank=-1, pid=suspect.pid if suspect is not None else None, exit_code=None, signal=None, reason="hang",
                       message=f"hang: {diagnosis.headline}", timestamp=now_iso(), traceback=f"{details}evidence: {folder}\n")

    # -- evidence ------------------------------------------------------------------------------
    def _facts(self, seen: inspect.Progress, record: RunRecord) -> tuple[list[Proc], float, float | None, float | None] | None:
        """Processes of this attempt, the last progress the store saw, the first init_rpc and the
        first init_process_group; None while no process of the job entered either (the job
        uses no torch.distributed, or not yet)."""
        rows = seen.running
        joins = [r["rpc_join_at"] for r in rows if r["rpc_join_at"] is not None]
        pg_joins = [v for v in (column(r, "pg_join_at") for r in rows) if v is not None]
        if not joins and not pg_joins:
            return None
        # A collective completing is progress (rank.collectives: the cycle that saw it).
        self._groups = seen.groups
        completed = [g["completed_at"] for g in self._groups if g["completed_at"] is not None]
        # A process that connects or enters init_rpc moves the job on too (the fork server may
        # take seconds to start the ranks).
        starts = [r["connected_at"] for r in rows] + joins + pg_joins + completed
        progress = max([m for m in (*seen.marks, *starts) if m is not None] or [0.0])
        procs = [_proc(r, record) for r in rows]
        # A rank whose spawned processes joined RPC (an mp.spawn program: the rank waits in
        # mp.spawn, its children are the workers) has joined, through them; those may have ended.
        # So for init_process_group, but the rank is not in their groups (``_warn_absent`` only).
        self._pg_through = seen.pg_joined_through
        through = seen.joined_through
        for proc in procs:
            if proc.kind == "rank" and proc.joined_at is None and proc.rank in through:
                proc.joined_at = through[proc.rank]
        return procs, progress, min(joins) if joins else None, min(pg_joins) if pg_joins else None

    def _dump_silent_ranks(self, rows: list, record: RunRecord) -> None:
        """A rank whose telemetry heartbeat went stale: its sender thread cannot run (the GIL held
        by a long C call, a starved or stopped process). Dump its stack then, once per silence,
        while the evidence is live: the hang timeout may be minutes away, or never come."""
        wall = time.time()
        for row in rows:
            beating = row["stopped_at"] is None and row["last_seen"] is not None  # stopped_at: it said goodbye
            silent = beating and wall - row["last_seen"] > STALE_AFTER_S
            if not silent:
                self._silent.discard(row["proc_id"])
                continue
            if row["proc_id"] in self._silent or (row["kind"] or "rank") != "rank":
                continue
            self._silent.add(row["proc_id"])
            proc = _proc(row, record)
            self._dump(proc, record)
            quiet = f"{proc.describe()} has sent no telemetry heartbeat for {human_seconds(wall - row['last_seen'])}"
            if not proc.local:
                self.console.warn(f"{quiet}{proc.elsewhere}")
                continue
            if proc.stopped:
                self.console.warn(f"{quiet}: it is stopped (SIGSTOP); `kill -CONT {proc.pid}` resumes it")
                continue
            at = where(proc.main_thread())
            self.console.warn(f"{quiet} (its telemetry thread cannot run: a long call holding the GIL?)"
                              + (f"; it is at {at}" if at else "") + f"; stacks in stacks/rank-{proc.rank}.txt")

    def _warn_absent(self, procs: list[Proc], record: RunRecord, first_join: float, wall: float, group: bool = False) -> None:
        """Name, once, a rank that has not entered init_rpc (``group``: init_process_group) while
        another did ``join_warn_s`` ago."""
        if wall - first_join < self.join_warn_s:
            return
        warned, what = (self._warned_pg, "entered init_process_group") if group else (self._warned_join, "joined RPC")
        connected = {p.rank for p in procs if p.kind == "rank"}
        for proc in procs:
            if proc.kind != "rank" or (proc.pg_joined_at if group else proc.joined_at) is not None or proc.rank in warned:
                continue
            if group and proc.rank in self._pg_through:
                continue
            warned.add(proc.rank)
            self._dump(proc, record)
            at = where(proc.main_thread())
            state = "it is stopped (SIGSTOP)" if proc.stopped else (f"it is at {at}" if at else "its stack did not come")
            if not proc.local:
                state = proc.elsewhere.lstrip("; ")
            self.console.warn(f"{proc.describe()} has not {what} after {human_seconds(wall - first_join)}; {state}")
        for state in record.ranks:  # a rank whose telemetry never connected is absent too
            if state.state == RankStatus.RUNNING and state.rank not in connected and state.rank not in warned:
                warned.add(state.rank)
                self.console.warn(f"rank {state.rank} (pid {state.pid}) has not {what} after {human_seconds(wall - first_join)}"
                                  " and never reported: see `rpcctl stack`")

    def _dump(self, proc: Proc, record: RunRecord) -> list[Any]:
        """Dump a rank (and its children) unless it is stopped; fill in the threads."""
        from rpcctl.errors import RpcctlError

        if not proc.local:
            return []
        proc.stopped = stacks.stopped(proc.pid)
        if proc.stopped or proc.kind != "rank" or proc.rank is None:
            return []
        try:
            dumps = inspect.dump_stacks(self.run_dir, proc.rank, timeout=DUMP_TIMEOUT_S)
        except RpcctlError:
            return []
        proc.dumped = True
        proc.threads = parse_stacks(dumps[0].text or "")
        return dumps

    def report(self, procs: list[Proc], record: RunRecord, stalled: float) -> tuple[Diagnosis, Path]:
        by_pid = {p.pid: p for p in procs}
        texts = []
        for proc in procs:
            if proc.kind != "rank":
                continue
            dumps = self._dump(proc, record)
            if not proc.local:
                texts.append(f"── {proc.describe()} ──\n(not dumped from this node{proc.elsewhere})\n")
            if proc.stopped:
                texts.append(f"── {proc.describe()} ──\n(stopped: no stack until SIGCONT)\n")
            for dump in dumps:
                child = by_pid.get(dump.pid)
                if dump.kind == "child" and child is not None:
                    child.threads = parse_stacks(dump.text or "")
                    child.stopped = stacks.stopped(dump.pid)
                header = f"── rank {dump.rank} (pid {dump.pid}) ──" if dump.kind == "rank" else f"── rank {dump.rank} › pid {dump.pid}: {' '.join(dump.cmdline)} ──"
                texts.append(f"{header}\n{dump.text or '(wrote no stack in time)'}\n")
        for proc in procs:  # spawned processes the dumps did not reach (stopped ones)
            if proc.kind != "rank" and not proc.threads and proc.local:
                proc.stopped = stacks.stopped(proc.pid)
        calls = inspect.calls(self.run_dir, restart=self._restart)
        diagnosis = diagnose(procs, calls, stalled, self._groups)
        folder = self._folder()
        _write_private(folder / "stacks.txt", "\n".join(texts))
        write_json_atomic(folder / "calls.json", to_jsonable(calls))
        _write_private(folder / "diagnosis.txt", diagnosis.text())
        self.reports += 1
        return diagnosis, folder

    def _folder(self) -> Path:
        name = "hang" if self.reports == 0 else f"hang-{self.reports + 1}"
        folder = self.run_dir / name
        folder.mkdir(mode=0o700, exist_ok=True)
        return folder


def _proc(row: Any, record: RunRecord) -> Proc:
    """A procs row as the watchdog sees it; local: a process of one of this node's ranks."""
    local = row["rank"] in {r.rank for r in record.ranks}
    return Proc(row["proc_id"], row["pid"], row["rank"], row["kind"] or "rank", row["name"], row["rpc_join_at"],
                host=row["host"], local=local, pg_joined_at=column(row, "pg_join_at"), dist_rank=column(row, "dist_rank"),
                pg_world=column(row, "pg_world") or 0)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
