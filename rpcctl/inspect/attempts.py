"""Every attempt of every rank (``rank_attempts``): the run record keeps only the latest
attempt of each rank; the store keeps one row per rank and restart."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rpcctl.console import Column, iso_time
from rpcctl.telemetry.reader import StoreReader


@dataclass
class RankAttempt:
    rank: int
    restart: int  # 0: the first attempt
    pid: int | None
    state: str  # a RankStatus word
    exit_code: int | None
    started_at: str | None  # ISO-8601
    ended_at: str | None  # None: still running (or the launcher never saw it end)

    COLUMNS = (
        Column("rank", justify="right"),
        Column("restart", justify="right"),
        Column("pid", justify="right"),
        Column("state"),
        Column("exit_code", "EXIT", justify="right"),
        Column("started_at", "STARTED"),
        Column("ended_at", "ENDED"),
    )


def rank_attempts(run_dir: Path) -> list[RankAttempt]:
    """One record per rank and restart, in order of restart then rank; [] without a store."""
    with StoreReader(run_dir) as s:
        rows = s.ranks()
    return [
        RankAttempt(
            rank=row["rank"],
            restart=row["restart"],
            pid=row["pid"],
            state=row["state"],
            exit_code=row["exit_code"],
            started_at=iso_time(row["started_at"]),
            ended_at=iso_time(row["ended_at"]),
        )
        for row in rows
    ]


def latest_attempt(run_dir: Path) -> int:
    """The run's latest attempt (its restart count: 0 before any restart; an elastic round is an
    attempt too); 0 without a store."""
    with StoreReader(run_dir) as s:
        return s.latest_restart()
