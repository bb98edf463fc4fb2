"""The collectives view: what each rank's process groups ran (``rpcctl inspect collectives``).

From the store's ``coll_groups`` (per rank and group: the last collective entered and completed,
and the one in flight), ``coll_stats`` (per rank, group and op: count, input bytes, a duration
histogram) and ``collectives`` (sampled collectives), which ``rank.collectives`` fills from
torch's Flight Recorder. A group's ``pg`` is its name on every rank (c10d's, ``rpc`` for RPC's own
group: ``rank.collectives``; the recorder's per-process id in stores before schema 9), with its
members. Durations are upper bounds (gloo records no completion time: see that
module); p50/p99 come from histogram bucket middles, as the calls view's do.

Stragglers (arrival skew): for each sampled collective that every rank of its group listed, the
skew is the last rank's entry minus the first's, and the last rank is the one the others waited
for. Over the last ``RECENT_SAMPLED`` sampled collectives (or ``PER_RANK`` per rank of the run,
if more: enough that every rank's entry into the same ones is there; read about 4 times a
second by the live view, so a window, not the run), the rank last most often in a group is
flagged only when all of these hold (a balanced run, where who comes last is chance and the skew
scheduling noise, flags nobody):

- ``MIN_COMPARED`` collectives or more were compared;
- it was last at least ``OFTEN`` × its fair share (compared / group size), and 3 times;
- the median skew when it was last is ``MIN_SKEW_S`` or more (less is scheduling noise on a
  loaded host, and costs the others nothing that matters);
- and ``RATIO`` × or more the median skew of the collectives where another rank was last
  (on a balanced run the two medians are alike, whoever is last most often by chance).

A rank late into one collective of several per step (DDP: the first bucket) is last in that one
and by chance in the others: flagged when the late ones are about 1/(n+1) of the group's
collectives or more on n ranks (a quarter on 3 ranks, 1 in 65 on 64), but only half or more on 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpcctl.console import KEY, Column, human_bytes, human_seconds, join
from rpcctl.wire.histogram import quantile
from rpcctl.telemetry.reader import StoreReader, column, loads
from rpcctl.inspect.stored import StoredGroup


RECENT_SAMPLED = 10_000
PER_RANK = 16
MIN_COMPARED = 5
OFTEN = 1.5
MIN_SKEW_S = 0.01
RATIO = 5.0


def _members(ranks: list[int] | None) -> str:
    """A group's ranks, runs of three or more as ranges: ``0-63``, ``1,2``, ``0,2-5``."""
    if not ranks:
        return "-"
    parts: list[str] = []
    start = prev = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        parts.append(str(start) if prev == start else f"{start},{prev}" if prev == start + 1 else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ",".join(parts)


def _duration(value: float | None) -> str:
    if value is None:
        return "-"
    return human_seconds(value) if value >= 0.01 else f"{value * 1e3:.2f} ms"


@dataclass
class CollectiveSummary:
    """One process group and op, over every rank."""

    pg: str
    group: str | None
    op: str
    count: int  # collectives completed, summed over ranks
    ranks: list[int]
    bytes: int  # input bytes, summed over ranks
    p50_s: float | None
    p99_s: float | None
    max_s: float | None

    COLUMNS = (
        Column("pg", "PG", priority=KEY),
        Column("group", detail=True),
        Column("op", priority=KEY),
        Column("count", justify="right"),
        Column("ranks", fmt=join),
        Column("bytes", fmt=human_bytes, justify="right"),
        Column("p50_s", "P50", fmt=_duration, justify="right"),
        Column("p99_s", "P99", fmt=_duration, justify="right"),
        Column("max_s", "MAX", fmt=_duration, justify="right", detail=True),
    )


@dataclass
class RankCollectives:
    """One rank's view of one process group: the last collective entered and completed, and
    the one it is inside now (while the run lives). ``pg`` names the group on every rank (its
    c10d name; ``rpc``: RPC's own gloo group); ``members``, its global ranks as c10d gave them to
    the process (None: RPC's group, or a store before schema 9)."""

    rank: int | None
    pg: str
    group: str | None
    entered: int  # sequence number of the last collective entered
    completed: int  # … and of the last one completed
    inside: str | None  # "all_reduce #5 (4 KiB float32)": the collective in flight, once read
    inside_s: float | None  # for how long
    members: list[int] | None = None

    COLUMNS = (
        Column("rank", priority=KEY),
        Column("pg", "PG", priority=KEY),
        Column("group", detail=True),
        Column("members", fmt=_members, detail=True),
        Column("entered", "LAST ENTERED", justify="right"),
        Column("completed", "LAST COMPLETED", justify="right"),
        Column("inside", "INSIDE NOW", fmt=lambda v: v or "-", wrap=True),
        Column("inside_s", "FOR", fmt=_duration, justify="right"),
    )


@dataclass
class CollectiveStraggler:
    """Per process group: the rank that entered the sampled collectives last most often, and by
    how much (arrival skew: its entry minus the earliest rank's; clocks of one host, or of
    several hosts as far as they agree). Only a flagged one (the module's rule)."""

    pg: str
    rank: int | None
    last: int  # how many of the compared collectives it entered last
    compared: int  # sampled collectives every rank of the group listed
    skew_p50_s: float | None  # median skew when it was last
    skew_max_s: float | None
    proc_id: int | None = None  # the process that is that rank of the group (a rank, or a process it spawned)

    COLUMNS = (
        Column("pg", "PG", priority=KEY),
        Column("rank", "LAST MOST OFTEN", priority=KEY),
        Column("last", "TIMES LAST", justify="right"),
        Column("compared", "OF", justify="right"),
        Column("skew_p50_s", "SKEW P50", fmt=_duration, justify="right"),
        Column("skew_max_s", "SKEW MAX", fmt=_duration, justify="right"),
    )


@dataclass
class CollectivesReport:
    summary: list[CollectiveSummary]
    ranks: list[RankCollectives]
    stragglers: list[CollectiveStraggler]


def _stragglers(rows: list[Any]) -> list[CollectiveStraggler]:
    """The flagged stragglers of each group (see the module's docstring for the rule)."""
    by_seq: dict[tuple[str, int], dict[int, float]] = {}
    members: dict[str, set[int]] = {}
    procs: dict[tuple[str, int], int | None] = {}
    for row in rows:
        if row["entered_at"] is None or row["rank"] is None:
            continue
        by_seq.setdefault((row["pg"], row["seq"]), {})[row["rank"]] = row["entered_at"]
        members.setdefault(row["pg"], set()).add(row["rank"])
        procs[(row["pg"], row["rank"])] = column(row, "proc_id")
    result = []
    for pg, ranks in sorted(members.items()):
        if len(ranks) < 2:
            continue
        last_of: dict[int, list[float]] = {}
        compared = 0
        for (group, _seq), arrivals in by_seq.items():
            if group != pg or set(arrivals) != ranks:
                continue
            compared += 1
            rank = max(arrivals, key=lambda r: arrivals[r])
            last_of.setdefault(rank, []).append(arrivals[rank] - min(arrivals.values()))
        if not last_of:
            continue
        rank, skews = max(last_of.items(), key=lambda kv: (len(kv[1]), sum(kv[1])))
        skews.sort()
        others = sorted(x for r, xs in last_of.items() if r != rank for x in xs)
        p50 = skews[(len(skews) - 1) // 2]
        typical = others[(len(others) - 1) // 2] if others else 0.0
        if (
            compared >= MIN_COMPARED
            and len(skews) >= max(3.0, OFTEN * compared / len(ranks))
            and p50 >= MIN_SKEW_S
            and p50 >= RATIO * typical
        ):
            result.append(CollectiveStraggler(pg, rank, len(skews), compared, p50, skews[-1], procs.get((pg, rank))))
    return result


def sampled_arrivals(s: StoreReader, restart: int) -> list[Any]:
    """(pg, seq, rank, entered_at, proc_id) of the last ``RECENT_SAMPLED`` sampled collectives (``PER_RANK``
    a rank of the run, if more)."""
    world = s.record.world_size if s.record is not None else 0
    return s.sampled_collectives(restart, max(RECENT_SAMPLED, PER_RANK * world))


def collective_stragglers(run_dir: Path) -> list[CollectiveStraggler]:
    """The flagged stragglers of each process group (latest restart): what ``inspect workers``
    and the live view flag."""
    with StoreReader(run_dir) as s:
        rows = sampled_arrivals(s, s.latest_restart())
    return _stragglers(rows)


# The recorder's dtype names (c10's ScalarType) as torch spells them.
_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
}


def in_flight(group: StoredGroup) -> str | None:
    """``all_reduce #5 (4.0 KiB float32)`` for a process group with a collective in flight."""
    if group.cur_seq is None or group.entered is None or group.entered <= group.completed:
        return None
    dtypes = sorted({_DTYPES.get(str(d), str(d)) for d in loads(group.cur_dtypes) or []})
    what = " ".join(x for x in (human_bytes(group.cur_bytes) if group.cur_bytes else "", "/".join(dtypes)) if x)
    return f"{group.cur_op} #{group.cur_seq}" + (f" ({what})" if what else "")


@dataclass
class CollectiveSpan:
    """One collective on one rank, for the trace: a sampled one (``completed_at`` its upper
    bound), or the one a rank was inside when it last reported (``completed_at`` None)."""

    proc_id: int
    rank: int | None
    restart: int
    pg: str
    group: str | None
    seq: int
    op: str | None
    sizes: Any
    dtypes: Any
    bytes: int | None
    entered_at: float
    completed_at: float | None


def collective_spans(run_dir: Path) -> list[CollectiveSpan]:
    """Every sampled collective of every restart, and each rank's collective in flight at its
    last report (a hung run's), in order of entry."""
    with StoreReader(run_dir) as s:
        rows = s.collective_spans()
        flying = s.collectives_in_flight()
    spans = [
        CollectiveSpan(
            r["proc_id"],
            r["rank"],
            r["restart"] or 0,
            r["pg"],
            r["name"],
            r["seq"],
            r["op"],
            loads(r["sizes"]),
            loads(r["dtypes"]),
            r["bytes"],
            r["entered_at"],
            r["completed_at"],
        )
        for r in rows
    ]
    seen = {(x.proc_id, x.pg, x.seq) for x in spans}
    spans += [
        CollectiveSpan(
            r["proc_id"],
            r["rank"],
            r["restart"] or 0,
            r["pg"],
            r["name"],
            r["cur_seq"],
            r["cur_op"],
            loads(r["cur_sizes"]),
            loads(r["cur_dtypes"]),
            r["cur_bytes"],
            r["cur_since"],
            None,
        )
        for r in flying
        if (r["proc_id"], r["pg"], r["cur_seq"]) not in seen
    ]
    return sorted(spans, key=lambda x: x.entered_at)


def collectives(run_dir: Path, *, restart: int | None = None) -> CollectivesReport:
    """Per process group and op over all ranks, per rank and group, and per group the rank
    that arrives last most often (latest restart)."""
    with StoreReader(run_dir) as s:
        restart = s.latest_restart() if restart is None else restart
        live = s.live
        now = s.now
        groups = s.coll_groups(restart)
        stats = s.coll_stats(restart)
        sampled = sampled_arrivals(s, restart)
    names = {row["pg"]: row["name"] for row in groups}
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for row in stats:
        entry = merged.setdefault(
            (row["pg"], row["op"]), {"count": 0, "bytes": 0, "max": 0.0, "hist": {}, "ranks": set()}
        )
        entry["count"] += row["count"]
        entry["bytes"] += row["bytes"] or 0
        entry["max"] = max(entry["max"], row["max_s"] or 0.0)
        entry["ranks"].add(row["rank"])
        for b, n in (loads(row["hist"]) or {}).items():
            entry["hist"][int(b)] = entry["hist"].get(int(b), 0) + int(n)
    summary = []
    for (pg, op), e in sorted(merged.items(), key=lambda kv: (kv[0][0], -kv[1]["count"])):
        timed = op != "?" and sum(e["hist"].values()) > 0
        summary.append(
            CollectiveSummary(
                pg,
                names.get(pg),
                op,
                e["count"],
                sorted(r for r in e["ranks"] if r is not None),
                e["bytes"],
                min(quantile(e["hist"], 0.5), e["max"]) if timed else None,
                min(quantile(e["hist"], 0.99), e["max"]) if timed else None,
                e["max"] if timed else None,
            )
        )
    ranks = []
    for row in groups:
        group = StoredGroup.of(row)
        inside = in_flight(group) if live and row["proc_ended"] is None else None
        ranks.append(
            RankCollectives(
                row["rank"],
                row["pg"],
                row["name"],
                row["entered"] or 0,
                row["completed"] or 0,
                inside,
                max(0.0, now - row["cur_since"]) if inside and row["cur_since"] else None,
                group.members,
            )
        )
    return CollectivesReport(summary, ranks, _stragglers(sampled))
