"""The workers' CPU and RSS over time (``usage``): every probe a process sent, not only the
latest one that ``workers`` shows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rpcctl.console import Column, human_bytes, iso_time
from rpcctl.telemetry.reader import StoreReader


@dataclass
class UsageSample:
    rank: int | None  # the launcher's rank (a spawned child: the rank that spawned it)
    name: str | None  # RPC worker name, once init_rpc ran
    pid: int | None
    kind: str  # rank | child
    time: str  # ISO-8601
    cpu_percent: float | None
    rss_bytes: int | None

    COLUMNS = (
        Column("rank", justify="right"),
        Column("name"),
        Column("pid", justify="right"),
        Column("time"),
        Column("cpu_percent", "CPU", fmt=lambda v: f"{v:.0f}%", justify="right"),
        Column("rss_bytes", "RSS", fmt=human_bytes, justify="right"),
    )


def usage(run_dir: Path, *, restart: int | None = None) -> list[UsageSample]:
    """One sample per probe (about one a second per process) of the latest restart, in time
    order; [] for a store written before probes were kept."""
    with StoreReader(run_dir) as s:
        restart = s.latest_restart() if restart is None else restart
        rows = s.probes(restart)
    return [
        UsageSample(
            rank=row["rank"],
            name=row["name"],
            pid=row["pid"],
            kind=row["kind"] or "rank",
            time=iso_time(row["t"]),
            cpu_percent=row["cpu_percent"],
            rss_bytes=row["rss_bytes"],
        )
        for row in rows
    ]
