"""The page's text: escaped HTML tables and summaries for a run snapshot.

Tables come from the record types' ``COLUMNS`` (the same columns as ``rpcctl inspect``), so
the page, the terminal tables and the JSON agree. Every value is escaped here: this module is
the only one that writes HTML from data.
"""

from __future__ import annotations

import dataclasses
from html import escape
from typing import Any, Sequence

from rpcctl.console import Column, human_seconds
from rpcctl.base.states import RankStatus, RRefEnding, RRefState, ServingState
from rpcctl.web.data import RunSnapshot, name_ranges, parse_time, process_rows, rank_ranges
from rpcctl.records.runs import describe_round

MAX_TABLE_ROWS = 300


def html_table(
    records: Sequence[Any],
    columns: Sequence[Column],
    *,
    detail: bool = False,
    empty: str = "nothing to show",
    css: str = "",
) -> str:
    if not records:
        return f'<p class="empty">{escape(empty)}</p>'
    shown = [c for c in columns if detail or not c.detail]
    head = "".join(f'<th class="{c.justify}">{escape(c.title)}</th>' for c in shown)
    formatters = [c.formatter(records) for c in shown]  # one scale per column, as in the terminal
    rows = []
    for record in records[:MAX_TABLE_ROWS]:
        # str: Text → plain
        cells = "".join(
            f'<td class="{c.justify}">{escape(str(c.cell(record, fmt)))}</td>' for c, fmt in zip(shown, formatters)
        )
        rows.append(f"<tr>{cells}</tr>")
    more = f'<p class="note">… and {len(records) - MAX_TABLE_ROWS} more</p>' if len(records) > MAX_TABLE_ROWS else ""
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>{more}'


def facts(pairs: Sequence[tuple[str, Any]]) -> str:
    """A definition list of label → value (values escaped; None shown as '-')."""
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape('-' if v is None else str(v))}</dd>" for k, v in pairs)
    return f'<dl class="facts">{items}</dl>'


def summary(snap: RunSnapshot) -> str:
    record = snap.record
    pairs = [
        ("run", record.run_id),
        ("job", record.name),
        ("status", snap.status),
        ("started", record.started_at),
        ("ended", record.ended_at),
        ("duration", human_seconds(snap.duration_s)),
        ("ranks", f"{record.world_size} ({record.nnodes} node(s) × {record.nproc_per_node})"),
        ("restarts", f"{record.restarts} of {record.max_restarts}"),
        *_rounds_fact(snap),
        ("hosts", ", ".join(snap.hosts)),
        ("script", record.script),
        ("config", record.config_path),
        ("start method", record.start_method),
        ("rendezvous", f"{record.master_addr}:{record.master_port}"),
    ]
    if record.reason:
        pairs.append(("reason", record.reason))
    if snap.telemetry_cost:
        pairs.append(("telemetry", snap.telemetry_cost))
    out = [f'<p class="status status-{escape(snap.status)}">{escape(snap.status)}</p>', facts(pairs)]
    cause = record.root_cause
    if cause is not None:
        how = (
            f"killed by {cause.signal}"
            if cause.signal
            else (f"exit code {cause.exit_code}" if cause.exit_code is not None else "")
        )
        # a hang, a deadline
        where = f"rank {cause.rank}" if cause.rank >= 0 else f"found by the launcher ({cause.reason})"
        out.append(
            f'<h3>Root cause</h3><p class="root-cause">{escape(where)}{f" ({escape(how)})" if how else ""}: '
            f"{escape(cause.message)}</p>"
        )
        text = cause.traceback or "\n".join(cause.log_tail)
        if text:
            out.append(f'<pre class="traceback">{escape(text)}</pre>')
    if snap.config_text:
        out.append(f"<details><summary>Resolved config</summary><pre>{escape(snap.config_text)}</pre></details>")
    return "".join(out)


def losses(snap: RunSnapshot) -> str:
    from rpcctl.inspect import LossSummary

    rows = [dataclasses.replace(s, trend="") for s in snap.loss_summaries]  # the chart is the trend
    columns = [c for c in LossSummary.COLUMNS if c.key != "trend"]
    return html_table(
        rows, columns, empty="no losses recorded (rpcctl.report(step=..., loss=...) or printed 'loss=...' lines)"
    )


def rrefs(snap: RunSnapshot) -> str:
    from rpcctl.inspect import OwnerSummary, RRefRecord

    live = [r for r in snap.rrefs if r.state != RRefState.DELETED]
    leaked = [r for r in snap.rrefs if r.ending == RRefEnding.LEAKED]
    held = sum(1 for r in snap.rrefs if r.ending == RRefEnding.AT_SHUTDOWN)
    at_exit = sum(1 for r in snap.rrefs if r.ending == RRefEnding.AT_EXIT)
    unused = sum(1 for r in snap.rrefs if r.ending == RRefEnding.HELD_UNUSED)
    parts = [
        '<p class="note">Ownership, per RPC world: on the left the workers that created or hold RRefs of another, '
        "on the right the owners, a line from each to the owner (dotted: held through a fork; grey: every RRef on it "
        "deleted). Marker size: bytes of live values owned.</p>",
        "<h3>Per owner</h3>",
        html_table(snap.owners, OwnerSummary.COLUMNS, empty="no RRefs"),
    ]
    if leaked:
        parts.append(
            f'<p class="warn">{len(leaked)} RRef value(s) leaked: each outlived every reference to it '
            "(its owner still held it elsewhere when it shut down).</p>"
        )
    if unused:
        parts.append(
            f'<p class="warn">{unused} RRef(s) were held unused until rpc.shutdown(): no holder had used them for '
            "a while before it, and each kept its value alive on its owner until then.</p>"
        )
    if at_exit:
        parts.append(
            f'<p class="note">{at_exit} RRef(s) were still held when their holders ended without rpc.shutdown() '
            "(failed or stopped), which released them.</p>"
        )
    if held:
        parts.append(
            f'<p class="note">{held} RRef(s) were held, in use, until rpc.shutdown(), which released them: '
            "normal, nothing to do.</p>"
        )
    parts.append(f"<h3>Live and pending RRefs ({len(live)} of {len(snap.rrefs)})</h3>")
    parts.append(html_table(live, RRefRecord.COLUMNS, empty="none live"))
    return "".join(parts)


def placement(snap: RunSnapshot) -> str:
    from rpcctl.inspect import PlacementRecord

    # RANKS as the ranks placed there ("rank 0", "ranks 0-3, 7": a lone "0" read as a count),
    # WORKERS as runs of names (a thousand spawned workers are "w0-w999", not a wall of names).
    shown = {"ranks": rank_ranges, "workers": name_ranges}
    columns = [dataclasses.replace(c, fmt=shown[c.key]) if c.key in shown else c for c in PlacementRecord.COLUMNS]
    return html_table(snap.placement, columns, detail=True, empty="no placement recorded")


def _rounds_fact(snap: RunSnapshot) -> list[tuple[str, str]]:
    """An elastic run's rounds in one line: how many, and where membership stands now."""
    rounds = snap.rounds
    if not rounds:
        return []
    last = rounds[-1]
    return [
        (
            "rounds",
            f"{len(rounds)}; now {describe_round(last)}",
        )
    ]


def workers(snap: RunSnapshot) -> str:
    from rpcctl.inspect import WorkerRecord

    return html_table(snap.workers, WorkerRecord.COLUMNS, empty="no workers recorded")


def timeline(snap: RunSnapshot) -> str:
    """Events in order: start, exits, the root cause; the hang watchdog's diagnoses; ranks
    running without a heartbeat."""
    events: list[tuple[float, str, str]] = [(0.0, "", f"run started on {', '.join(snap.hosts)}")]
    latest = {r.rank: r for r in snap.record.ranks}
    for rnd in snap.rounds:  # an elastic run: each membership change, when and why
        at = snap.since_start(rnd.get("at"))
        if at is not None:
            events.append(
                (
                    at,
                    "",
                    f"{describe_round(rnd)} ({rnd.get('why')})",
                )
            )
    newest = snap.latest_attempt
    for attempt in snap.rank_attempts:
        record = latest.get(attempt.rank)
        current = attempt.restart == newest
        name = (
            snap.attempt_name(attempt.restart, parse_time(attempt.started_at))
            if attempt.restart or snap.rounds
            else None
        )
        which = f"{name}, " if name else ""
        start = snap.since_start(attempt.started_at)
        if start is not None:
            device = f", {record.device}" if record is not None and record.device else ""
            events.append((start, "", f"rank {attempt.rank} started ({which}pid {attempt.pid}{device})"))
        end = snap.since_start(attempt.ended_at)
        if end is not None:
            signal = record.signal if record is not None and current else None
            # An earlier attempt's signal is not kept (the store has its state and exit code only).
            how = (
                f"killed by {signal}"
                if signal
                else (f"exit code {attempt.exit_code}" if attempt.exit_code is not None else "")
            )
            detail = f"{which}{how}".rstrip(", ")
            bad = "bad" if attempt.state in (RankStatus.FAILED, RankStatus.KILLED) else ""
            events.append((end, bad, f"rank {attempt.rank} {attempt.state}" + (f" ({detail})" if detail else "")))
    cause = snap.record.root_cause
    if cause is not None and snap.since_start(cause.timestamp) is not None:
        who = f"rank {cause.rank}" if cause.rank >= 0 else cause.reason
        events.append((snap.since_start(cause.timestamp), "bad", f"root cause: {who}: {cause.message}"))
    events.sort(key=lambda e: e[0])  # stable: the run's end stays after the exits at the same moment
    if snap.ended is not None:
        events.append((snap.duration_s, "", f"run {snap.status}"))
    items = "".join(
        f'<li class="{css}"><span class="t">{t:8.2f} s</span> {escape(text)}</li>' for t, css, text in events
    )
    parts = []
    story = process_rows(snap)
    if story.grouped:
        parts.append(
            f'<p class="note timeline-grouped">{story.processes} processes in {len(story.rows)} rows: '
            f"{escape(story.grouped)}. "
            "Each row's label says how its processes ended; <code>rpcctl inspect workers</code> lists every one.</p>"
        )
    parts.append(f'<ol class="events">{items}</ol>')
    for index, text in enumerate(snap.hang_diagnoses, 1):
        which = f" ({index} of {len(snap.hang_diagnoses)})" if len(snap.hang_diagnoses) > 1 else ""
        parts.append(f'<h3 class="bad">Hang diagnosis{which}</h3><pre class="hang-diagnosis">{escape(text)}</pre>')
    stale = [w for w in snap.workers if w.stale]
    if stale:
        lines = "".join(
            f"<li>rank {w.rank} ({escape(w.name or '?')}, pid {w.pid}): no heartbeat for "
            f"{escape(human_seconds(w.heartbeat_age_s or 0))}, see "
            f"<code>rpcctl stack {escape(snap.record.run_id)} --rank {w.rank}</code></li>"
            for w in stale
        )
        parts.append(f'<h3 class="bad">Possible hang</h3><ul class="hang">{lines}</ul>')
    return "".join(parts)


def calls(snap: RunSnapshot) -> str:
    """The SDK's call report: calls in flight for 1 s or more, per caller → callee, what the
    callees run for whom (each table from its record type's columns)."""
    report = snap.calls
    if report is None:
        return '<p class="empty">in-flight calls: not recorded by this version of rpcctl</p>'
    parts = []
    for heading, records, empty in (
        (
            "In flight for 1 s or more, oldest first",
            getattr(report, "pending", []),
            "no call in flight for 1 s or more",
        ),
        ("Per caller → callee", getattr(report, "summary", []), "no calls recorded"),
        (
            "What the callees are running",
            [s for s in getattr(report, "serving", []) if getattr(s, "state", "") != ServingState.DONE],
            "nothing running",
        ),
    ):
        columns = getattr(records[0], "COLUMNS", None) if records else ()
        parts.append(f"<h3>{escape(heading)}</h3>" + html_table(records, columns or (), empty=empty))
    return "".join(parts)


def collectives(snap: RunSnapshot) -> str:
    """Per process group and op (count, p50/p99, bytes), the stragglers (arrival skew), and per
    rank the last collective entered and completed (the one inside, while the run lives)."""
    from rpcctl.inspect import CollectiveSummary, RankCollectives

    report = snap.collectives
    if report is None or not (report.summary or report.ranks):
        return '<p class="empty">no collectives recorded (no process group, or a torch without the Flight Recorder)</p>'
    parts = [
        '<p class="note">Times are upper bounds (gloo records no completion time). The trace '
        "(<code>rpcctl trace</code>) draws the sampled collectives on each rank's track, linked across ranks.</p>",
        "<h3>Per process group and op</h3>",
        html_table(report.summary, CollectiveSummary.COLUMNS, empty="none completed"),
    ]
    if report.stragglers:
        lines = "".join(
            f"<li>pg {escape(s.pg)}: rank {s.rank} entered last in {s.last} of {s.compared} collectives; the others "
            f"waited {escape(human_seconds(s.skew_p50_s or 0))} for it "
            f"(p50, max {escape(human_seconds(s.skew_max_s or 0))})</li>"
            for s in report.stragglers
        )
        parts.append(f'<h3 class="warn">Stragglers (arrival skew)</h3><ul class="stragglers">{lines}</ul>')
    else:
        parts.append(
            '<p class="note">No straggler: no rank arrives last far more often than the others '
            "by a skew that matters.</p>"
        )
    parts.append("<h3>Per rank</h3>" + html_table(report.ranks, RankCollectives.COLUMNS, empty="no process group"))
    return "".join(parts)


# The views this page draws its own way (by ``inspect.VIEWS`` name); any other view is the table
# of its records' COLUMNS.
DRAWN = {
    "losses": losses,
    "rrefs": rrefs,
    "placement": placement,
    "workers": workers,
    "calls": calls,
    "collectives": collectives,
}


def view_table(snap: RunSnapshot, view: Any) -> str:
    """A view of ``inspect.VIEWS`` that the page has no drawing of: its records (or its one
    report) as the table of its record type's columns."""
    found = snap.views.get(view.name)
    records = [] if found is None else found if isinstance(found, list) else [found]
    return html_table(
        records, getattr(view.record, "COLUMNS", ()), detail=True, empty=f"no {view.title.lower()} recorded"
    )


def run_sections(snap: RunSnapshot) -> dict[str, str]:
    """Section id → its HTML (the page's text; charts are separate): the run, its timeline, then
    each view of ``inspect.VIEWS`` under its name."""
    from rpcctl import inspect

    out = {"summary": summary(snap), "timeline": timeline(snap)}
    for view in inspect.VIEWS:
        out[view.name] = DRAWN[view.name](snap) if view.name in DRAWN else view_table(snap, view)
    return out
