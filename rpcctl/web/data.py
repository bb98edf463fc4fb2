"""A run as plain data for the page: the run record and what the inspect SDK returns.

``run_snapshot(run_dir)`` is called once for ``rpcctl report`` and about once a second by the
live page. It reads the run only through ``rpcctl.records.runs`` (the record) and ``rpcctl.inspect``
(the telemetry store); the in-flight call summary is shown when the SDK has ``inspect.calls``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpcctl import inspect
from rpcctl.console import epoch_of
from rpcctl.records.runs import hang_diagnoses, load_record
from rpcctl.base.states import RunStatus

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
    devices: list[inspect.DeviceRecord] = field(default_factory=list)
    usage: list[Any] = field(default_factory=list)  # inspect.UsageSample: CPU and RSS per probe
    calls: Any = None  # inspect's CallsReport (pending, summary, serving); None: calls not recorded
    collectives: Any = None  # inspect's CollectivesReport (per pg and op, per rank, stragglers)
    telemetry_cost: str | None = None
    hang_diagnoses: list[str] = field(default_factory=list)  # the hang watchdog's, oldest first
    attempts: list[inspect.RankAttempt] = field(default_factory=list)  # every rank's every restart (from the store)

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
        return [inspect.RankAttempt(rank=r.rank, restart=self.record.restarts, pid=r.pid, state=r.state, exit_code=r.exit_code,
                                    started_at=r.started_at, ended_at=r.ended_at) for r in self.record.ranks]

    @property
    def hosts(self) -> list[str]:
        hosts = {w.host for w in self.workers if w.host}
        return sorted(hosts or {self.record.host})


def parse_time(iso: str | None) -> float | None:
    """Epoch seconds of a stamp from the store or the record; None for none or a malformed one."""
    try:
        return epoch_of(iso or None)
    except ValueError:
        return None


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
    snapshot.losses = inspect.losses(run_dir)
    snapshot.loss_summaries = inspect.loss_summaries(snapshot.losses, inspect.line_counts(run_dir))
    snapshot.rrefs = inspect.rrefs(run_dir)
    snapshot.owners = inspect.rref_owners(run_dir, records=snapshot.rrefs)
    snapshot.workers = inspect.workers(run_dir)
    snapshot.devices = inspect.gpus(run_dir)
    snapshot.usage = inspect.usage(run_dir)
    snapshot.attempts = inspect.rank_attempts(run_dir)
    calls = getattr(inspect, "calls", None)  # call tracking, where this rpcctl has it
    snapshot.calls = calls(run_dir) if callable(calls) else None
    snapshot.collectives = inspect.collectives(run_dir)
    cost = inspect.telemetry_cost(run_dir)
    snapshot.telemetry_cost = cost.describe() if cost is not None else None
    return snapshot


def thin(points: list[Any], limit: int = MAX_POINTS_PER_SERIES) -> list[Any]:
    """At most ``limit`` points, evenly spaced, always ending at the last one."""
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[min(len(points) - 1, int(round((i + 1) * step)) - 1)] for i in range(limit)]
