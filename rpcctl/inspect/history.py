"""A run's whole store as it was recorded, every restart: what ``rpcctl trace`` draws a timeline
from (``store_history``). Rows, not records: the trace reads each table's own columns."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from rpcctl.telemetry.reader import StoreReader


@dataclass
class StoreHistory:
    """Every row of the tables a timeline needs, and when the run ended (or 'now' while it lives)."""

    ranks: list[sqlite3.Row]
    procs: list[sqlite3.Row]
    calls: list[sqlite3.Row]
    serving: list[sqlite3.Row]
    rrefs: list[sqlite3.Row]
    handles: list[sqlite3.Row]
    losses: list[sqlite3.Row]
    end: float


def store_history(run_dir: Path) -> StoreHistory:
    with StoreReader(run_dir) as s:
        return StoreHistory(ranks=s.ranks(), procs=s.procs(), calls=s.calls(), serving=s.serving(), rrefs=s.rrefs(),
                            handles=s.handles(), losses=s.losses(), end=s.closed_at or s.now)
