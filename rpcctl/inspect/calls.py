"""The calls view of the inspection SDK: who waits on whom, for what, since when.

::

    from rpcctl import inspect
    report = inspect.calls(run_dir)           -> CallsReport
    report.pending   [PendingCall]   calls running for 1 s or more, oldest first
    report.summary   [CallSummary]   per caller → callee → function: count, p50/p99, errors, pending
    report.serving   [ServingRecord] what each worker has been running for whom, for 1 s or more

Calls that end within ``calls.LONG_S`` are only counted (``call_stats``: a log-scale histogram
per caller, callee, function and kind, so p50/p99 come from bucket middles, within ±9%; of the
timed calls, ``timed``: of each function's rpc_sync calls (each method's, for a method called
through a helper such as ``_call_method(Class.method, rref)`` or an RRef proxy), the first
``SYNC_TIMED_FIRST``, then one in ``SYNC_SAMPLE``; of rpc_async calls the first
``ASYNC_TIMED_FIRST``, then one in ``ASYNC_SAMPLE``; of rpc.remote calls ``REMOTE_TIMED_FIRST``,
then one in ``REMOTE_SAMPLE``; every call is counted). The
callee does not know who asked: ``serving`` rows get their caller by matching the callers'
pending calls to the same worker and function, the latest one that started before.
After the run, calls that never ended are listed as ``unfinished``, aged until their process
ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpcctl.console import HIGH, KEY, LOW, Column, human_bytes, human_seconds, iso_time
from rpcctl.telemetry.reader import StoreReader, column, loads
from rpcctl.inspect.stored import StoredCall, StoredServed
from rpcctl.base.states import CallState, ServingState
from rpcctl.wire.histogram import quantile


def _duration(value: float) -> str:
    return human_seconds(value) if value >= 0.01 else f"{value * 1e3:.2f} ms"


@dataclass
class PendingCall:
    caller: str | None  # RPC name of the waiting process (None: before init_rpc finished)
    caller_rank: int | None
    callee: str
    func: str  # the callee's name for it when the callee is running it ("PS.update"), else the caller's
    kind: str  # rpc_sync | rpc_async | remote
    age_s: float
    call_site: str
    state: CallState  # pending | unfinished (the run, or the caller, ended first) | ok | error | timeout
    started_at: str | None
    thread: int | None  # the caller's thread ident (faulthandler's "Thread 0x…")
    caller_pid: int | None
    caller_proc: int
    call_id: int
    restart: int
    nbytes: int | None = None  # bytes of the tensors among its arguments (None: none, or not known)

    COLUMNS = (
        Column("caller", priority=KEY),
        Column("callee", priority=KEY),
        Column("func", "FUNCTION", priority=KEY, wrap=True),
        Column("kind", priority=LOW),
        Column("age_s", "AGE", fmt=human_seconds, justify="right", priority=KEY),
        Column("nbytes", "SENT", fmt=human_bytes, justify="right", detail=True),
        Column("call_site", "CALL SITE", wrap=True),
        Column("state", detail=True),
        Column("caller_pid", "PID", detail=True, justify="right"),
        Column("thread", fmt=hex, detail=True),
    )


@dataclass
class CallSummary:
    caller: str | None
    callee: str
    func: str
    kind: str
    count: int  # ended calls
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    mean_s: float | None
    errors: int
    timeouts: int
    pending: int  # listed calls (running 1 s or more) not ended yet
    mean_sent_bytes: float | None = None  # of the timed calls: bytes of the tensors among their arguments
    # the calls p50, p99 and the mean are of: past 100, 1 in 16 rpc_sync (a function's or method's), rpc_async, 1 in 64
    # rpc.remote
    timed: int = 0

    COLUMNS = (
        Column("caller", priority=KEY),
        Column("callee", priority=KEY),
        Column("func", "FUNCTION", priority=KEY, wrap=True),
        Column("kind", priority=LOW),
        Column("count", "CALLS", justify="right", priority=HIGH),
        Column("timed", "TIMED", justify="right", detail=True),
        Column("p50_s", "P50", fmt=_duration, justify="right", priority=HIGH),
        Column("p99_s", "P99", fmt=_duration, justify="right", priority=HIGH),
        Column("max_s", "MAX", fmt=_duration, justify="right", detail=True),
        Column("mean_s", "MEAN", fmt=_duration, justify="right", detail=True),
        Column("mean_sent_bytes", "SENT/CALL", fmt=human_bytes, justify="right", detail=True),
        Column("errors", justify="right"),
        Column("timeouts", justify="right", detail=True),
        Column("pending", justify="right"),
    )


@dataclass
class ServingRecord:
    worker: str | None
    worker_rank: int | None
    func: str
    caller: str | None  # who asked (matched from the callers' pending calls), None: not known
    age_s: float
    state: ServingState  # running | done | unfinished
    thread: int | None  # the callee's thread ident
    nbytes: int | None  # bytes of the tensor arguments
    started_at: str | None
    pid: int | None
    proc_id: int
    serve_id: int
    restart: int
    call: tuple[int, int] | None = field(default=None, repr=False)  # (caller proc, call id) it serves

    COLUMNS = (
        Column("worker", priority=KEY),
        Column("func", "FUNCTION", priority=KEY, wrap=True),
        Column("caller", "FOR", priority=KEY),
        Column("age_s", "FOR HOW LONG", fmt=human_seconds, justify="right"),
        Column("state", detail=True),
        Column("thread", fmt=hex, detail=True),
        Column("pid", detail=True, justify="right"),
    )

    def describe(self) -> str:
        who = f" for {self.caller}" if self.caller else ""
        return f"{self.worker or f'pid {self.pid}'} has run {self.func}{who} for {human_seconds(self.age_s)}"


@dataclass
class CallsReport:
    pending: list[PendingCall]
    summary: list[CallSummary]
    serving: list[ServingRecord]


def calls(run_dir: Path, *, restart: int | None = None, history: bool = False) -> CallsReport:
    """The calls of the latest restart: pending (or unfinished) ones, the summary, the callee's
    view. ``history``: every listed call and served function, ended ones too (the trace)."""
    with StoreReader(run_dir) as s:
        restart = s.latest_restart() if restart is None else restart
        procs = {p["proc_id"]: p for p in s.procs(restart)}
        call_rows = s.calls(restart, unfinished_only=not history)
        serve_rows = s.serving(restart, unfinished_only=not history)
        stat_rows = s.call_stats(restart)
        live = s.live
        now = s.now if live else (s.closed_at or s.now)  # after the reads (``StoreReader``)

    def end_of(proc_id: int) -> float:
        proc = procs.get(proc_id)
        ended = proc["ended_at"] if proc is not None else None
        return ended if ended is not None else now

    pending = []
    for row in call_rows:
        ended = row["ended_at"]
        if ended is not None:
            state = CallState.read(row["status"] or CallState.OK, CallState.ERROR)  # the rank wrote it
        elif live and (procs.get(row["proc_id"]) is None or procs[row["proc_id"]]["ended_at"] is None):
            state = CallState.PENDING
        else:
            state = CallState.UNFINISHED
        until = ended if ended is not None else end_of(row["proc_id"])
        proc = procs.get(row["proc_id"])
        pending.append(
            PendingCall(
                caller=row["caller"] or (proc["name"] if proc is not None else None),
                caller_rank=row["caller_rank"],
                callee=row["callee"],
                func=row["func"],
                kind=row["kind"],
                age_s=max(0.0, until - row["started_at"]),
                call_site=row["call_site"],
                state=state,
                started_at=iso_time(row["started_at"]),
                thread=row["thread"],
                caller_pid=proc["pid"] if proc is not None else None,
                caller_proc=row["proc_id"],
                call_id=row["call_id"],
                restart=restart,
                nbytes=column(row, "nbytes"),
            )
        )
    serving = []
    for row in serve_rows:
        proc = procs.get(row["proc_id"])
        ended = row["ended_at"]
        state = (
            ServingState.DONE
            if ended is not None
            else (
                ServingState.RUNNING
                if live and proc is not None and proc["ended_at"] is None
                else ServingState.UNFINISHED
            )
        )
        until = ended if ended is not None else end_of(row["proc_id"])
        serving.append(
            ServingRecord(
                worker=row["worker"] or (proc["name"] if proc is not None else None),
                worker_rank=row["worker_rank"],
                func=row["func"],
                caller=None,
                age_s=max(0.0, until - row["started_at"]),
                state=state,
                thread=row["thread"],
                nbytes=row["nbytes"],
                started_at=iso_time(row["started_at"]),
                pid=proc["pid"] if proc is not None else None,
                proc_id=row["proc_id"],
                serve_id=row["serve_id"],
                restart=restart,
            )
        )
    _match(pending, serving, call_rows, serve_rows)
    return CallsReport(pending, _summary(stat_rows, pending), serving)


def same_function(caller_name: str, callee_name: str) -> bool:
    """The caller's name for a call and the callee's: equal, or an RRef proxy's "rref.method"
    against the owner's "Type.method", or a module path the caller spelled differently."""
    if caller_name == callee_name:
        return True
    if caller_name.startswith("rref."):
        return callee_name.endswith("." + caller_name[5:])
    return caller_name.rsplit(".", 1)[-1] == callee_name.rsplit(".", 1)[-1]


def pair_served(calls: list[StoredCall], serving: list[StoredServed]) -> dict[tuple[int, int], StoredServed]:
    """(caller proc, call id) → the served function that answered it: for each served
    function, the latest call to that worker and function that started before it (and had not
    ended before it started), one call per served function."""
    out: dict[tuple[int, int], StoredServed] = {}
    taken: set[tuple[int, int]] = set()
    slack = 0.05  # the two processes' clocks are the same host's, read at different moments
    for served in sorted(serving, key=lambda r: r.started_at):
        best = None
        for call in calls:
            key = (call.proc_id, call.call_id)
            if key in taken or call.callee != served.worker or not same_function(call.func, served.func):
                continue
            if call.started_at > served.started_at + slack or (
                call.ended_at is not None and call.ended_at < served.started_at - slack
            ):
                continue
            if best is None or call.started_at > best.started_at:
                best = call
        if best is not None:
            taken.add((best.proc_id, best.call_id))
            out[(best.proc_id, best.call_id)] = served
    return out


def _match(
    pending: list[PendingCall], serving: list[ServingRecord], call_rows: list[Any], serve_rows: list[Any]
) -> None:
    """Give each served function its caller (``pair_served``); the call takes the owner's name."""
    calls_by_key = {(c.caller_proc, c.call_id): c for c in pending}
    served_by_key = {(s.proc_id, s.serve_id): s for s in serving}
    for key, row in pair_served(StoredCall.all(call_rows), StoredServed.all(serve_rows)).items():
        call, served = calls_by_key[key], served_by_key[(row.proc_id, row.serve_id)]
        served.caller, served.call = call.caller, key
        call.func = served.func  # the owner's name says more ("PS.update" for "rref.update")


def _at_most(value: float | None, limit: float) -> float | None:
    return None if value is None else min(value, limit)  # a bucket's middle may lie past the slowest call


def _summary(stat_rows: list[Any], pending: list[PendingCall]) -> list[CallSummary]:
    merged: dict[tuple[str | None, str, str, str], dict[str, Any]] = {}
    for row in stat_rows:
        key = (row["caller"], row["callee"], row["func"], row["kind"])
        entry = merged.setdefault(
            key, {"count": 0, "errors": 0, "timeouts": 0, "total": 0.0, "max": 0.0, "hist": {}, "sent": 0}
        )
        entry["count"] += row["count"]
        entry["sent"] += column(row, "request_bytes") or 0
        entry["errors"] += row["errors"]
        entry["timeouts"] += row["timeouts"]
        entry["total"] += row["total_s"] or 0.0
        entry["max"] = max(entry["max"], row["max_s"] or 0.0)
        for bucket, n in (loads(row["hist"]) or {}).items():
            entry["hist"][int(bucket)] = entry["hist"].get(int(bucket), 0) + int(n)
    open_calls: dict[tuple[str | None, str, str, str], int] = {}
    for call in pending:
        if call.state == CallState.PENDING:
            key = next(
                (
                    k
                    for k in merged
                    if k[0] == call.caller
                    and k[1] == call.callee
                    and k[3] == call.kind
                    and same_function(k[2], call.func)
                ),
                (call.caller, call.callee, call.func, call.kind),
            )
            open_calls[key] = open_calls.get(key, 0) + 1
            merged.setdefault(
                key, {"count": 0, "errors": 0, "timeouts": 0, "total": 0.0, "max": 0.0, "hist": {}, "sent": 0}
            )
    out = []
    for key, entry in merged.items():
        count, timed = entry["count"], sum(entry["hist"].values())
        out.append(
            CallSummary(
                caller=key[0],
                callee=key[1],
                func=key[2],
                kind=key[3],
                count=count,
                timed=timed,
                p50_s=_at_most(quantile(entry["hist"], 0.5), entry["max"]),
                p99_s=_at_most(quantile(entry["hist"], 0.99), entry["max"]),
                # None where no call was timed and none was long (an untimed call's duration is not known)
                max_s=entry["max"] if count and (timed or entry["max"]) else None,
                mean_s=entry["total"] / timed if timed else None,
                errors=entry["errors"],
                timeouts=entry["timeouts"],
                pending=open_calls.get(key, 0),
                mean_sent_bytes=entry["sent"] / timed if timed and entry["sent"] else None,
            )
        )
    out.sort(key=lambda c: (c.caller or "", c.callee, -c.count, c.func))
    return out
