"""A run as plain data for the page: the run record and what the inspect SDK returns.

``run_snapshot(run_dir)`` is called once for ``rpcctl report`` and about once a second by the
live page. It reads the run only through ``rpcctl.records.runs`` (the record) and ``rpcctl.inspect``
(the telemetry store): every view of ``inspect.VIEWS`` once, by its name (``views``), and what the
page adds (loss summaries, owners, usage, attempts, the telemetry's cost).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpcctl import inspect
from rpcctl.records.runs import epoch_or_none, hang_diagnoses, load_record
from rpcctl.base.states import RankStatus, RunStatus

# Enough points to draw a curve; a long run is thinned evenly (always keeping the last point).
MAX_POINTS_PER_SERIES = 2000


@dataclass
class RunSnapshot:
    """What the page shows of one run at one moment."""

    record: Any  # rpcctl.records.runs.RunRecord
    status: str  # the effective status: running, succeeded, failed, cancelled, lost
    config_text: str | None
    taken_at: float
    losses: list[inspect.LossRecord] = field(default_factory=list)
    loss_summaries: list[inspect.LossSummary] = field(default_factory=list)
    rrefs: list[inspect.RRefRecord] = field(default_factory=list)
    owners: list[inspect.OwnerSummary] = field(default_factory=list)
    workers: list[inspect.WorkerRecord] = field(default_factory=list)
    placement: list[inspect.PlacementRecord] = field(default_factory=list)
    usage: list[Any] = field(default_factory=list)  # inspect.UsageSample: CPU and RSS per probe
    calls: Any = None  # inspect's CallsReport (pending, summary, serving); None: calls not recorded
    collectives: Any = None  # inspect's CollectivesReport (per pg and op, per rank, stragglers)
    telemetry_cost: str | None = None
    hang_diagnoses: list[str] = field(default_factory=list)  # the hang watchdog's, oldest first
    attempts: list[inspect.RankAttempt] = field(default_factory=list)  # every rank's every restart (from the store)
    views: dict[str, Any] = field(default_factory=dict)  # every view of inspect.VIEWS, by name: what it read

    @property
    def started(self) -> float:
        return parse_time(self.record.started_at) or self.taken_at

    @property
    def ended(self) -> float | None:
        return parse_time(self.record.ended_at)

    @property
    def duration_s(self) -> float:
        return max(0.0, (self.ended or self.taken_at) - self.started)

    @property
    def live(self) -> bool:
        return self.status == RunStatus.RUNNING

    def since_start(self, iso: str | None) -> float | None:
        """Seconds from the run's start to ``iso`` (the x axis of every time chart)."""
        moment = parse_time(iso)
        return None if moment is None else round(moment - self.started, 3)

    @property
    def rank_attempts(self) -> list[Any]:
        """What the timeline draws: every attempt from the store, or, where it has none (no
        telemetry), the record's latest attempt of each rank (restart = the run's restarts)."""
        if self.attempts:
            return self.attempts
        return [
            inspect.RankAttempt(
                rank=r.rank,
                restart=self.record.restarts,
                pid=r.pid,
                state=r.state,
                exit_code=r.exit_code,
                started_at=r.started_at,
                ended_at=r.ended_at,
            )
            for r in self.record.ranks
        ]

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """An elastic run's rounds, one per attempt in order (``RunRecord.rounds``); [] otherwise."""
        rounds = self.record.rounds
        return [r for r in rounds if isinstance(r, dict)] if isinstance(rounds, list) else []

    def attempt_name(self, restart: int, started: float | None) -> str | None:
        """How the report names an attempt that began at epoch ``started``: an elastic run's
        "round 2" (the round going on then: another node's ranks count their own restarts),
        "restart 2" where the run restarted, None for a run of one attempt."""
        rnd = self.record.round_at(started)
        if rnd is not None:
            return f"round {rnd.get('round')}"
        return f"restart {restart}" if restart or self.record.restarts else None

    @property
    def latest_attempt(self) -> int:
        """The restart number of the latest attempt (an elastic run's: its rounds less one)."""
        return max([self.record.restarts, len(self.rounds) - 1, *(a.restart for a in self.attempts)])

    @property
    def hosts(self) -> list[str]:
        hosts = {w.host for w in self.workers if w.host}
        return sorted(hosts or {self.record.host})


def parse_time(iso: str | None) -> float | None:
    """Epoch seconds of a stamp from the store or the record; None for none or a malformed one."""
    return epoch_or_none(iso or None)


def run_snapshot(run_dir: Path) -> RunSnapshot:
    record = load_record(run_dir)
    config = run_dir / "config.yaml"
    snapshot = RunSnapshot(
        record=record,
        status=record.effective_status,
        config_text=config.read_text(errors="replace") if config.is_file() else None,
        taken_at=time.time(),
        hang_diagnoses=hang_diagnoses(run_dir),
    )
    if not inspect.has_telemetry(run_dir):
        return snapshot
    found = snapshot.views = inspect.read_all(run_dir)
    snapshot.losses, snapshot.rrefs, snapshot.workers = found["losses"], found["rrefs"], found["workers"]
    snapshot.placement, snapshot.calls, snapshot.collectives = found["placement"], found["calls"], found["collectives"]
    snapshot.loss_summaries = inspect.loss_summaries(snapshot.losses, inspect.line_counts(run_dir))
    snapshot.owners = inspect.rref_owners(run_dir, records=snapshot.rrefs)
    snapshot.usage = inspect.usage(run_dir)
    snapshot.attempts = inspect.rank_attempts(run_dir)
    cost = inspect.telemetry_cost(run_dir)
    snapshot.telemetry_cost = cost.describe() if cost is not None else None
    return snapshot


def thin(points: list[Any], limit: int = MAX_POINTS_PER_SERIES) -> list[Any]:
    """At most ``limit`` points, evenly spaced, always ending at the last one."""
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[min(len(points) - 1, int(round((i + 1) * step)) - 1)] for i in range(limit)]


# ---------------------------------------------------------------------------------------------
# Every process of the run on the timeline: its rows, grouped past a bound

# The timeline draws at most this many rows: past it, a world's spawned processes (then a rank's,
# then blocks of ranks) share a row, and the page says so. A process that failed, was killed or
# was lost keeps a row of its own (up to KEPT_BAD_ROWS of them).
MAX_TIMELINE_ROWS = 60
KEPT_BAD_ROWS = 10
_SEVERITY = (
    RankStatus.FAILED,
    RankStatus.KILLED,
    RankStatus.LOST,
    RankStatus.ORPHANED,
    RankStatus.RUNNING,
    RankStatus.STOPPED,
    RankStatus.PENDING,
    RankStatus.EXITED,
    RankStatus.SUCCEEDED,
)
_BAD = {RankStatus.FAILED, RankStatus.KILLED, RankStatus.LOST, RankStatus.ORPHANED}


@dataclass
class Life:
    """One process's life (a rank's attempt, or a spawned process), or a group's span."""

    start: float  # seconds since the run's start
    end: float  # its end, or now for one still running
    state: str  # RankStatus word; a group's: its members' most severe
    how: str  # how it ended, for people: "exit code 0", "killed by SIGTERM", "running"
    restart: int
    pid: int | None = None
    states: dict[str, int] = field(default_factory=dict)  # a group's members by state


@dataclass
class ProcessRow:
    """One row of the timeline: a process (a rank with one life per attempt, or one spawned
    process), or a group of them (``members`` > 1)."""

    label: str
    lives: list[Life]
    kind: str  # rank | child | ranks | children (the last two: groups)
    rank: int | None
    world: int | None = None
    members: int = 1


@dataclass
class Timeline:
    rows: list[ProcessRow]
    processes: int  # every process drawn, alone or in a group
    ranks: int
    spawned: int
    grouped: str | None = None  # what shares a row, said once (None: every process has its own)


def _ending(state: str, exit_code: int | None, signal: str | None) -> str:
    if signal:
        return f"killed by {signal}"
    if state in (RankStatus.RUNNING, RankStatus.STOPPED, RankStatus.PENDING):
        return str(state)
    if exit_code is not None:
        return f"exit code {exit_code}"
    return "killed by a signal" if state == RankStatus.KILLED else str(state)


def _summary(states: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(states.items(), key=lambda item: severity(item[0])))


def severity(state: str) -> int:
    """Where a state sorts among endings, the worst first (failed, killed, ... succeeded)."""
    return _SEVERITY.index(state) if state in _SEVERITY else len(_SEVERITY)


def _natural_key(name: str) -> tuple:
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1, name)


def process_rows(snap: RunSnapshot, limit: int = MAX_TIMELINE_ROWS) -> Timeline:
    """Every process of the run as the timeline's rows: each rank (a life per attempt, from the
    store) followed by the processes it spawned (the workers view's children of the latest
    attempt), by world then name. Past ``limit`` rows, spawned processes are grouped by their
    rank and world, then by rank, then ranks by blocks, until the rows fit; the bad ones
    (failed, killed, lost) keep their own row."""
    now = round((snap.ended or snap.taken_at) - snap.started, 3)
    latest = {r.rank: r for r in snap.record.ranks}
    several = len({w.world for w in snap.workers if w.kind != "rank" and w.world is not None}) > 1
    ranks: dict[int, ProcessRow] = {}
    for attempt in snap.rank_attempts:
        start = snap.since_start(attempt.started_at)
        if start is None:
            continue
        end = snap.since_start(attempt.ended_at)
        record = latest.get(attempt.rank)
        signal = record.signal if record is not None and attempt.restart == snap.record.restarts else None
        row = ranks.setdefault(attempt.rank, ProcessRow(f"rank {attempt.rank}", [], "rank", attempt.rank))
        row.lives.append(
            Life(
                start,
                now if end is None else end,
                str(attempt.state),
                _ending(attempt.state, attempt.exit_code, signal),
                attempt.restart,
                attempt.pid,
            )
        )
    children: dict[int | None, list[ProcessRow]] = {}
    for worker in snap.workers:
        if worker.kind == "rank":
            continue
        start = snap.since_start(worker.started_at)
        if start is None:
            continue
        end = snap.since_start(worker.ended_at)
        who = worker.name or f"pid {worker.pid}"
        where = f" · world {worker.world}" if several and worker.world is not None else ""
        life = Life(
            start,
            now if end is None else end,
            str(worker.state),
            _ending(worker.state, worker.exit_code, None),
            worker.restart,
            worker.pid,
        )
        children.setdefault(worker.rank, []).append(
            ProcessRow(f"└ {who}{where}", [life], "child", worker.rank, worker.world)
        )
    for rows in children.values():
        rows.sort(key=lambda r: (r.world if r.world is not None else -1, _natural_key(r.label), r.lives[0].pid or 0))
    order = sorted(set(ranks) | {r for r in children if r is not None})
    spawned = sum(len(rows) for rows in children.values())
    timeline = Timeline([], processes=len(ranks) + spawned, ranks=len(ranks), spawned=spawned)

    def individual() -> list[ProcessRow]:
        out = []
        for rank in order:
            out += ([ranks[rank]] if rank in ranks else []) + children.get(rank, [])
        return out + children.get(None, [])

    rows = individual()
    if len(rows) > limit:
        rows, timeline.grouped = _grouped(order, ranks, children, limit)
    seen: dict[str, int] = {}
    for row in rows:  # plotly merges rows of the same name: each gets its own
        seen[row.label] = seen.get(row.label, 0) + 1
        if seen[row.label] > 1:
            row.label = (
                f"{row.label} (pid {row.lives[0].pid})" if row.members == 1 else f"{row.label} ({seen[row.label]})"
            )
    for row in rows:
        if not row.lives:
            continue
        last = row.lives[-1]
        row.label = f"{row.label}: {last.how if row.members == 1 else _summary(last.states)}"
    timeline.rows = rows
    return timeline


def _group(label: str, rows: list[ProcessRow], kind: str, rank: int | None, world: int | None = None) -> ProcessRow:
    """Rows as one: a life per restart, from the first start to the last end, in the most
    severe state of its members (hover and label: how many ended how)."""
    by_restart: dict[int, list[Life]] = {}
    members = 0
    for row in rows:
        members += row.members
        for life in row.lives:
            by_restart.setdefault(life.restart, []).append(life)
    lives = []
    for restart, group in sorted(by_restart.items()):
        states: dict[str, int] = {}
        for life in group:
            for state, n in (life.states or {life.state: 1}).items():
                states[state] = states.get(state, 0) + n
        worst = min(states, key=severity)
        lives.append(
            Life(min(x.start for x in group), max(x.end for x in group), worst, _summary(states), restart, None, states)
        )
    return ProcessRow(label, lives, kind, rank, world, members)


def _grouped(
    order: list[int], ranks: dict[int, ProcessRow], children: dict[int | None, list[ProcessRow]], limit: int
) -> tuple[list[ProcessRow], str]:
    bad = [row for rows in children.values() for row in rows if row.lives[0].state in _BAD][:KEPT_BAD_ROWS]
    kept = {id(row) for row in bad}
    rest = {rank: [row for row in rows if id(row) not in kept] for rank, rows in children.items()}
    kept_note = f"; {len(bad)} that failed or were killed keep their own row" if bad else ""

    def by_world(rank: int | None) -> list[ProcessRow]:
        worlds: dict[int | None, list[ProcessRow]] = {}
        for row in rest.get(rank, []):
            worlds.setdefault(row.world, []).append(row)
        return [
            _group(
                f"└ {len(rows)} spawned{f' · world {world}' if world is not None else ''}",
                rows,
                "children",
                rank,
                world,
            )
            for world, rows in worlds.items()
        ]

    def whole(rank: int | None) -> list[ProcessRow]:
        rows = rest.get(rank, [])
        return [_group(f"└ {len(rows)} spawned by rank {rank}", rows, "children", rank)] if rows else []

    mine = {id(row): row for row in bad}
    for level, note in (
        (by_world, "each world's spawned processes of a rank share a row"),
        (whole, "each rank's spawned processes share a row"),
    ):
        rows: list[ProcessRow] = []
        for rank in [*order, None]:
            rows += (
                ([ranks[rank]] if rank in ranks else [])
                + [r for r in children.get(rank, []) if id(r) in mine]
                + level(rank)
            )
        if len(rows) <= limit:
            return rows, note + kept_note
    # Blocks of consecutive ranks, each a row, and their spawned processes a row.
    per_block = 2 if any(rest.values()) else 1
    size = 1
    while (len(order) + size - 1) // size * per_block + len(bad) > limit:
        size += 1
    rows = []
    for first in range(0, len(order), size):
        block = order[first : first + size]
        name = f"ranks {block[0]}-{block[-1]}" if len(block) > 1 else f"rank {block[0]}"
        if any(r in ranks for r in block):
            rows.append(_group(name, [ranks[r] for r in block if r in ranks], "ranks", block[0]))
        rows += [r for rank in block for r in children.get(rank, []) if id(r) in mine]
        spawned = [row for r in block for row in rest.get(r, [])]
        if spawned:
            rows.append(_group(f"└ {len(spawned)} spawned by {name}", spawned, "children", block[0]))
    rows += [r for r in children.get(None, []) if id(r) in mine]
    if rest.get(None):
        rows.append(_group(f"{len(rest[None])} other processes", rest[None], "children", None))
    spawned_note = ", and their spawned processes another" if any(rest.values()) else ""
    return rows, f"blocks of {size} ranks share a row{spawned_note}" + kept_note


def rank_ranges(ranks: list[int]) -> str:
    """Ranks as the ranks they are, never a count: "rank 0", "ranks 0-3, 7"."""
    values = sorted(set(ranks))
    if not values:
        return "-"
    spans: list[list[int]] = []
    for value in values:
        if spans and value == spans[-1][1] + 1:
            spans[-1][1] = value
        else:
            spans.append([value, value])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(values) == 1 else f"ranks {text}"


def name_ranges(names: list[str]) -> str:
    """Worker names, runs of one prefix with consecutive numbers folded: "w0-w2, ps"."""
    numbered: dict[str, list[int]] = {}
    plain: list[str] = []
    for name in dict.fromkeys(names):
        head = name.rstrip("0123456789")
        tail = name[len(head) :]
        if tail and (tail == "0" or not tail.startswith("0")):
            numbered.setdefault(head, []).append(int(tail))
        else:
            plain.append(name)
    parts = []
    for head, numbers in numbered.items():
        numbers.sort()
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            parts.append(f"{head}{start}" if start == prev else f"{head}{start}-{head}{prev}")
            if n is not None:
                start = prev = n
    return ", ".join(parts + plain) or "-"
