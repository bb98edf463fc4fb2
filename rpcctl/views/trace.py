"""A run as Chrome trace-event JSON (``rpcctl trace``): what Perfetto UI, chrome://tracing and
Holistic Trace Analysis open.

The document is the JSON Object Format: ``{"traceEvents": [...], "displayTimeUnit": "ms",
"otherData": {...}}``; times are microseconds from the run's first record.

===========================  ===================================================================
track (``pid``)              events
===========================  ===================================================================
one per process              ``M`` process_name / process_sort_index / thread_name
(a rank, or a process it     ``X`` "rank R" on thread 0: the rank's lifetime (launcher's view)
spawned; per restart)        ``X`` a call (1 s or more) on the caller's thread; ``s`` → ``f``
                             flow arrow to the function its callee ran for it (``X`` on the
                             callee's thread)
                             ``X`` RRef lifetimes on thread 1 of the owner ("RRefs"): the
                             process that was that RPC rank in the RRef's world (a
                             spawned worker's own track, not the rank that spawned it)
                             ``X`` "process" on thread 0 of a spawned process: its lifetime
                             ``X`` collectives on a thread per process group ("collectives
                             pg P"): "all_reduce #5" from entered to completed (an upper
                             bound: gloo records no end), args op, pg, group, seq, sizes,
                             dtypes, bytes, late_by_s (its entry minus the first rank's);
                             one still in flight when the rank last reported runs to its
                             end (args state "in flight"); ``s`` → ``t`` → ``f`` flow
                             arrows link one (pg, seq) across ranks in order of entry
                             (id ``coll:RESTART:PG:SEQ``, also in args.flow)
                             ``C`` loss and metrics counters;
                             ``i`` a non-finite value (``loss=inf``: args
                             ``{"metric", "value": "inf"|"-inf"|"nan"}``)
                             ``i`` rank exits (with code and state), spawned processes' ends
global                       ``i`` restarts; an elastic job's rounds instead ("round 1: 2
                             node(s), world size 4", args why and members): there each
                             attempt is a round, and its tracks say "round N", not "restart N"
===========================  ===================================================================

Threads are numbered per track, 2, 3, ... in order of first appearance (0 is the process, 1 its
RRefs): Perfetto's JSON importer drops a tid above 2^32, which a Python thread ident is, and
puts the event on the process's own track. The ident is in the ``thread_name`` metadata (its
name, and ``args.ident``).

Calls that ended within 1 s are not in the telemetry one by one; their per caller → callee
summary is in ``otherData.calls``. Collectives are the ones each rank lists (the first 64 of a
group, then every 16th: ``rank.collectives``), the same sequence numbers on every rank.
Bounded size for long runs: at most ``MAX_SPANS`` call and served-function spans each (the
longest kept), ``MAX_RREFS`` RRef spans (the longest-lived kept), ``MAX_COLLECTIVES`` collective
spans or a quarter of ``max_events`` (whole (pg, seq) sets, the longest from first entry to last
completion kept), and counters share what is left of ``MAX_EVENTS`` (100,000 events, about 10 MB), each at
most ``MAX_POINTS`` points (evenly thinned, the last one kept), whatever the run's length or
its number of metrics; what was left out is counted in ``otherData.left_out``. ``rpcctl trace
--max-events N`` moves the cap; ``--max-events 0`` keeps every event.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from rpcctl import inspect
from rpcctl.console import to_jsonable
from rpcctl.inspect.calls import pair_served
from rpcctl.records.runs import RunRecord, describe_round, epoch_or_none, load_record

MAX_SPANS = 20_000
MAX_RREFS = 10_000
MAX_COLLECTIVES = 10_000
MAX_POINTS = 2_000
MAX_EVENTS = 100_000  # in all (about 10 MB): the counters share what the other events leave
PROCESS_THREAD, RREF_THREAD, FIRST_THREAD = 0, 1, 2


def build_trace(run_dir: Path, max_events: int = MAX_EVENTS) -> dict[str, Any]:
    """``max_events``: about how many events at most (0: every one, no cap of any kind)."""
    history = inspect.store_history(run_dir)
    ranks, procs, calls, serving = history.ranks, history.procs, history.calls, history.serving
    rrefs, handles, losses, end = history.rrefs, history.handles, history.losses, history.end
    times = [t for t in [*(r.started_at for r in ranks), *(p.connected_at for p in procs)] if _a_time(t)]
    start = min(times) if times else end
    builder = _Builder(start, end, max_events, record=_record(run_dir))
    builder.processes(ranks, procs)
    builder.calls(calls, serving, procs)
    builder.rrefs(rrefs, handles, procs)
    builder.collectives(inspect.collective_spans(run_dir), procs)
    builder.losses(losses)  # as inspect losses: a loss reported and printed once (store_history keeps one source)
    builder.exits(ranks)
    builder.spawned_ends(procs)
    report = inspect.calls(run_dir)
    builder.finite()
    return {
        "traceEvents": builder.events,
        "displayTimeUnit": "ms",
        "otherData": {
            "run_dir": str(run_dir),
            "start_epoch_s": start,
            "calls": to_jsonable(report.summary),
            "left_out": builder.left_out,
        },
    }


def _record(run_dir: Path) -> RunRecord | None:
    try:
        return load_record(run_dir)
    except Exception:  # noqa: BLE001 - no record, or a damaged one: the store alone draws the trace
        return None


class _Builder:
    def __init__(self, start: float, end: float, max_events: int = MAX_EVENTS, record: RunRecord | None = None):
        self.start, self.end, self.max_events = start, end, max_events
        self.record = record  # its rounds name an elastic run's attempts
        self.elastic = record is not None and record.round_at(end) is not None
        self.events: list[dict[str, Any]] = []
        self.left_out: dict[str, int] = {}
        self.track_of_proc: dict[int, int] = {}
        self.track_of_rank: dict[tuple[int, int], int] = {}  # (rank, restart) → the rank's own track
        self.named_threads: set[tuple[int, int]] = set()
        self.small_tids: dict[tuple[int, int], int] = {}  # (track, thread ident) → the tid in the trace
        self.threads_of: dict[int, int] = {}  # track → its next free tid

    def ts(self, t: float) -> float:
        return round((t - self.start) * 1e6, 3)

    def finite(self) -> None:
        """Leave out the events whose time is none a trace can hold (a store written before every
        time was checked at the socket: a wait in flight since -inf, a completion at 1e308), and
        spell a non-finite argument as text: the document is strict JSON, whatever the store holds."""
        kept = []
        for event in self.events:
            if all(_a_span(event[key]) for key in ("ts", "dur") if key in event):
                if "args" in event:
                    event["args"] = _spelled(event["args"])
                kept.append(event)
        if len(kept) != len(self.events):
            self.left_out["events_at_impossible_times"] = len(self.events) - len(kept)
        self.events = kept

    def span(
        self, pid: int, tid: int, name: str, begin: float, finish: float | None, cat: str, args: dict[str, Any]
    ) -> None:
        finish = self.end if finish is None else finish
        self.events.append(
            {
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "name": name,
                "cat": cat,
                "ts": self.ts(begin),
                "dur": round(max(0.0, finish - begin) * 1e6, 3),
                "args": args,
            }
        )

    def meta(self, pid: int, name: str, args: dict[str, Any], tid: int | None = None) -> None:
        event = {"ph": "M", "pid": pid, "name": name, "args": args}
        if tid is not None:
            event["tid"] = tid
        self.events.append(event)

    def thread(self, pid: int, tid: int, name: str, args: dict[str, Any] | None = None) -> None:
        if (pid, tid) not in self.named_threads:
            self.named_threads.add((pid, tid))
            self.meta(pid, "thread_name", {"name": name, **(args or {})}, tid)

    def lane(self, pid: int, key: Any, name: str, args: dict[str, Any]) -> int:
        """The trace's tid for ``key`` on a track (a Python thread's ident, a process group):
        2, 3, ... in order of first appearance."""
        if (pid, key) not in self.small_tids:
            self.small_tids[(pid, key)] = self.threads_of.get(pid, FIRST_THREAD)
            self.threads_of[pid] = self.small_tids[(pid, key)] + 1
        tid = self.small_tids[(pid, key)]
        self.thread(pid, tid, name, args)
        return tid

    def python_thread(self, pid: int, ident: int | None, kind: str) -> int:
        """The trace's tid for a Python thread of a process: small and stable (2, 3, ... per
        track, in order of first appearance; 0 and 1 are the process and its RRefs). Perfetto
        drops a tid above 2^32, which a Python thread ident is, and puts the event on the pid's
        own track; the real ident is in the thread's name and args."""
        ident = ident if type(ident) is int else 0  # (a damaged row: a REAL, a string)
        return self.lane(pid, ident, f"{kind} {ident:#x}", {"ident": ident})

    # -- tracks --------------------------------------------------------------------------------
    def processes(self, ranks: list[inspect.StoredRank], procs: list[inspect.StoredProcess]) -> None:
        for proc in procs:
            track = proc.proc_id
            self.track_of_proc[proc.proc_id] = track
            rank, restart = proc.rank, proc.restart or 0
            again = f", {self.attempt(restart, proc.connected_at)}" if restart or self.elastic else ""
            if proc.kind == "child":
                label = f"{proc.name or 'process'} (pid {proc.pid}, started by rank {rank}{again})"
            else:
                self.track_of_rank.setdefault((rank, restart), track)
                label = f"rank {rank}" + (f" · {proc.name}" if proc.name else "") + f" (pid {proc.pid}{again})"
            self.meta(track, "process_name", {"name": label})
            if proc.kind == "child" and proc.connected_at is not None:  # the launcher never saw it start: telemetry did
                self.thread(track, PROCESS_THREAD, "process")
                self.span(
                    track,
                    PROCESS_THREAD,
                    proc.name or f"pid {proc.pid}",
                    proc.connected_at,
                    proc.ended_at or proc.stopped_at,
                    "process",
                    {"pid": proc.pid, "started_by_rank": rank},
                )
            self.meta(
                track,
                "process_sort_index",
                {"sort_index": (rank if rank is not None else 999) * 1000 + restart * 10 + (proc.kind == "child")},
            )
        for row in ranks:
            key = (row.rank, row.restart)
            if key not in self.track_of_rank:  # no telemetry from it: the launcher's view only
                track = 1_000_000 + row.rank * 1000 + row.restart
                self.track_of_rank[key] = track
                self.meta(track, "process_name", {"name": f"rank {row.rank} (pid {row.pid})"})
            track = self.track_of_rank[key]
            if row.started_at is not None:
                self.thread(track, PROCESS_THREAD, "process")
                self.span(
                    track,
                    PROCESS_THREAD,
                    f"rank {row.rank}",
                    row.started_at,
                    row.ended_at,
                    "rank",
                    {"pid": row.pid, "state": row.state, "exit_code": row.exit_code, "restart": row.restart},
                )

    # -- calls, with flow arrows to what the callee ran for them -------------------------------
    def calls(
        self, calls: list[inspect.StoredCall], serving: list[inspect.StoredServed], procs: list[inspect.StoredProcess]
    ) -> None:
        ended = {p.proc_id: p.ended_at for p in procs}
        calls = self._longest(calls, "calls", ended)
        serving = self._longest(serving, "served", ended)
        served_for = pair_served(calls, serving)
        for row in calls:
            pid = self.track_of_proc.get(row.proc_id)
            if pid is None:
                continue
            tid = self.python_thread(pid, row.thread, "thread")
            finish = row.ended_at if row.ended_at is not None else ended.get(row.proc_id)
            self.span(
                pid,
                tid,
                f"{row.kind} → {row.callee}: {row.func}",
                row.started_at,
                finish,
                "rpc",
                {"callee": row.callee, "func": row.func, "site": row.call_site, "status": row.status or "unfinished"},
            )
            target = served_for.get((row.proc_id, row.call_id))
            if target is not None and self.track_of_proc.get(target.proc_id) is not None:
                flow = f"{row.proc_id}.{row.call_id}"
                self.events.append(
                    {
                        "ph": "s",
                        "pid": pid,
                        "tid": tid,
                        "name": "rpc",
                        "cat": "rpc",
                        "id": flow,
                        "ts": self.ts(row.started_at),
                    }
                )
                callee = self.track_of_proc[target.proc_id]
                self.events.append(
                    {
                        "ph": "f",
                        "bp": "e",
                        "pid": callee,
                        "tid": self.python_thread(callee, target.thread, "rpc thread"),
                        "name": "rpc",
                        "cat": "rpc",
                        "id": flow,
                        "ts": self.ts(max(target.started_at, row.started_at)),
                    }
                )
        for row in serving:
            pid = self.track_of_proc.get(row.proc_id)
            if pid is None:
                continue
            tid = self.python_thread(pid, row.thread, "rpc thread")
            finish = row.ended_at if row.ended_at is not None else ended.get(row.proc_id)
            self.span(pid, tid, row.func, row.started_at, finish, "served", {"nbytes": row.nbytes})

    def _longest(self, rows: list[Any], what: str, ended: dict[int, float | None]) -> list[Any]:
        if len(rows) <= MAX_SPANS or not self.max_events:
            return rows
        self.left_out[what] = len(rows) - MAX_SPANS

        def duration(row: Any) -> float:
            finish = row.ended_at if row.ended_at is not None else (ended.get(row.proc_id) or self.end)
            return finish - row.started_at

        return sorted(rows, key=duration, reverse=True)[:MAX_SPANS]

    # -- RRefs, losses, exits ------------------------------------------------------------------
    def rrefs(
        self, rows: list[inspect.StoredRRef], handles: list[inspect.StoredHandle], procs: list[inspect.StoredProcess]
    ) -> None:
        # The owner is the process that was that RPC rank in the RRef's world (stores before
        # schema 7 have world 0 only): with mp.spawn, a worker the rank spawned, not the rank.
        owners = {}
        for proc in procs:
            if proc.rpc_rank is not None and proc.proc_id in self.track_of_proc:
                owners.setdefault((proc.restart or 0, proc.world or 0, proc.rpc_rank), self.track_of_proc[proc.proc_id])
        released: dict[tuple[int, int, str], float] = {}
        held: set[tuple[int, int, str]] = set()
        for handle in handles:
            key = (handle.restart or 0, handle.world or 0, handle.rref_id)
            if handle.released_at is None:
                held.add(key)
            else:
                released[key] = max(released.get(key, 0.0), handle.released_at)
        spans = []
        for row in rows:
            if row.created_at is None or row.owner_rank is None:
                continue
            key = (row.restart or 0, row.world or 0, row.rref_id)
            gone = row.value_freed_at or (released.get(key) if key not in held else None)
            spans.append((row, key, gone))
        if len(spans) > MAX_RREFS and self.max_events:
            self.left_out["rrefs"] = len(spans) - MAX_RREFS
            spans.sort(key=lambda span: (span[2] or self.end) - span[0]["created_at"], reverse=True)
            spans = spans[:MAX_RREFS]
        for row, (restart, world, _), gone in spans:
            track = owners.get((restart, world, row.owner_rank))
            if track is None:  # its owner never reported: nowhere true to draw it
                self.left_out["rrefs_of_unknown_owners"] = self.left_out.get("rrefs_of_unknown_owners", 0) + 1
                continue
            self.thread(track, RREF_THREAD, "RRefs")
            self.span(
                track,
                RREF_THREAD,
                f"RRef {row.type or '?'}",
                row.created_at,
                gone,
                "rref",
                {
                    "rref_id": row.rref_id,
                    "world": world,
                    "creator": row.creator,
                    "site": row.call_site,
                    "nbytes": row.nbytes,
                    "shape": row.shape,
                    "device": row.device,
                },
            )

    # -- collectives, linked across ranks by (pg, seq) ----------------------------------------
    def collectives(self, spans: list[inspect.CollectiveSpan], procs: list[inspect.StoredProcess]) -> None:
        ended = {p.proc_id: p.ended_at or p.stopped_at for p in procs}
        sets: dict[tuple[int, str, int], list[Any]] = defaultdict(list)
        for span in spans:
            if span.proc_id in self.track_of_proc:
                sets[(span.restart, span.pg, span.seq)].append(span)

        def finish(span: Any) -> float:
            return span.completed_at if span.completed_at is not None else (ended.get(span.proc_id) or self.end)

        kept = list(sets.items())
        room = min(MAX_COLLECTIVES, self.max_events // 4)
        if self.max_events and sum(len(members) for _, members in kept) > room:
            kept.sort(key=lambda kv: max(finish(x) for x in kv[1]) - min(x.entered_at for x in kv[1]), reverse=True)
            chosen, total = [], 0
            for key, members in kept:
                if total + len(members) > room:
                    break
                chosen.append((key, members))
                total += len(members)
            self.left_out["collectives"] = sum(len(members) for _, members in kept) - total
            kept = chosen
        for (restart, pg, seq), members in kept:
            members.sort(key=lambda x: x.entered_at)
            flow = f"coll:{restart}:{pg}:{seq}"
            first = members[0].entered_at
            for index, span in enumerate(members):
                track = self.track_of_proc[span.proc_id]
                tid = self.lane(
                    track, ("pg", pg), f"collectives pg {pg}" + (f" ({span.group})" if span.group else ""), {"pg": pg}
                )
                self.span(
                    track,
                    tid,
                    f"{span.op or '?'} #{seq}",
                    span.entered_at,
                    finish(span),
                    "collective",
                    {
                        "op": span.op,
                        "pg": pg,
                        "group": span.group,
                        "seq": seq,
                        "sizes": span.sizes,
                        "dtypes": span.dtypes,
                        "bytes": span.bytes,
                        "late_by_s": round(span.entered_at - first, 6),
                        "flow": flow,
                        "state": "completed" if span.completed_at is not None else "in flight",
                    },
                )
                if len(members) > 1:
                    phase = "s" if index == 0 else "f" if index == len(members) - 1 else "t"
                    event = {
                        "ph": phase,
                        "pid": track,
                        "tid": tid,
                        "name": "collective",
                        "cat": "collective",
                        "id": flow,
                        "ts": self.ts(span.entered_at),
                    }
                    if phase == "f":
                        event["bp"] = "e"
                    self.events.append(event)

    def losses(self, rows: list[inspect.StoredLoss]) -> None:
        series: dict[tuple[int, int, str], list[tuple[float, float]]] = defaultdict(list)
        for row in rows:
            if row.time is None:
                continue
            values = {"loss": row.loss, **(row.metrics or {})}
            for name, value in values.items():
                if isinstance(value, (int, float)):
                    series[(row.rank, row.restart or 0, name)].append((row.time, value))
        # Every series gets an even share of the events left (200 metrics of 2,500 steps made
        # 500,000 counter events, 85 MB), and never more than MAX_POINTS.
        room = max(0, self.max_events - len(self.events) - 2 * len(self.track_of_rank)) if self.max_events else 0
        share = min(MAX_POINTS, max(2, room // max(1, len(series)))) if self.max_events else None
        for (rank, restart, name), points in series.items():
            track = self.track_of_rank.get((rank, restart))
            if track is None:
                continue
            if share is not None and len(points) > share:
                self.left_out["counter_points"] = self.left_out.get("counter_points", 0) + len(points) - share
                step = len(points) / share
                points = [points[min(len(points) - 1, int(round((i + 1) * step)) - 1)] for i in range(share)]
            for t, value in points:
                if math.isfinite(value):
                    self.events.append({"ph": "C", "pid": track, "name": name, "ts": self.ts(t), "args": {name: value}})
                else:  # inf, -inf, nan: not JSON, nor a counter value; an instant on the rank's track says it
                    self.events.append(
                        {
                            "ph": "i",
                            "s": "t",
                            "pid": track,
                            "tid": PROCESS_THREAD,
                            "ts": self.ts(t),
                            "cat": "metric",
                            "name": f"{name}={value}",
                            "args": {"metric": name, "value": str(value)},
                        }
                    )

    def exits(self, ranks: list[inspect.StoredRank]) -> None:
        for row in ranks:
            track = self.track_of_rank.get((row.rank, row.restart))
            if row.ended_at is not None and track is not None:
                self.events.append(
                    {
                        "ph": "i",
                        "s": "p",
                        "pid": track,
                        "tid": PROCESS_THREAD,
                        "ts": self.ts(row.ended_at),
                        "name": f"rank {row.rank} {row.state}"
                        + (f" (exit {row.exit_code})" if row.exit_code is not None else ""),
                        "args": {"exit_code": row.exit_code, "state": row.state},
                    }
                )
        if self.elastic:  # each membership change, when it began, with why
            for rnd in self.record.rounds:
                at = epoch_or_none(rnd.get("at")) if isinstance(rnd, dict) else None
                if at is not None:
                    self.events.append(
                        {
                            "ph": "i",
                            "s": "g",
                            "pid": 0,
                            "tid": 0,
                            "ts": self.ts(max(at, self.start)),
                            "name": describe_round(rnd),
                            "args": {"why": rnd.get("why"), "members": rnd.get("members")},
                        }
                    )
            return
        firsts: dict[int, float] = {}
        for row in ranks:
            if row.restart and row.started_at is not None:
                firsts[row.restart] = min(firsts.get(row.restart, row.started_at), row.started_at)
        for restart, t in sorted(firsts.items()):
            self.events.append(
                {"ph": "i", "s": "g", "pid": 0, "tid": 0, "ts": self.ts(t), "name": f"restart {restart}", "args": {}}
            )

    def attempt(self, restart: int, started: float | None) -> str:
        """How a track names its attempt: "restart 2", or an elastic run's round going on when it
        began ("round 2": by time, as another node's ranks count their own restarts)."""
        rnd = self.record.round_at(started) if self.elastic else None
        return f"round {rnd.get('round')}" if rnd is not None else f"restart {restart}"

    def spawned_ends(self, procs: list[inspect.StoredProcess]) -> None:
        """An end marker on each spawned process's track (the launcher's ranks have theirs)."""
        for proc in procs:
            end = proc.ended_at or proc.stopped_at
            track = self.track_of_proc.get(proc.proc_id)
            if proc.kind != "child" or end is None or track is None:
                continue
            code = proc.exit_code
            self.events.append(
                {
                    "ph": "i",
                    "s": "p",
                    "pid": track,
                    "tid": PROCESS_THREAD,
                    "ts": self.ts(end),
                    "name": f"{proc.name or 'pid ' + str(proc.pid)} ended"
                    + (f" (exit {code})" if code is not None else ""),
                    "args": {"exit_code": code, "pid": proc.pid},
                }
            )


def _a_time(t: Any) -> bool:
    """An epoch time the trace can start from (a number, finite, between 1970 and 2242)."""
    return isinstance(t, (int, float)) and 0 <= t <= 2**33


def _a_span(value: Any) -> bool:
    """A trace time or duration (µs) a viewer can place: finite, within ±30,000 years."""
    return isinstance(value, (int, float)) and math.isfinite(value) and abs(value) < 1e18


def _spelled(value: Any) -> Any:
    """Arguments as strict JSON: a non-finite float as its word ("inf", "nan")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _spelled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_spelled(v) for v in value]
    return value
