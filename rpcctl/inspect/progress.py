"""How far a restart of a run has got, as the store saw it: what the watchdog's hang check reads
once a check (``progress``)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from rpcctl.telemetry.reader import StoreReader


@dataclass
class Progress:
    """``running``: the processes of the restart not ended (rows); ``marks``: the latest call
    counted, long call ended and loss; ``groups``: the running processes' process groups (a
    collective completing is progress); ``joined_through``: rank → when the first process it
    spawned joined RPC (an mp.spawn program: the rank waits, its children are the workers);
    ``pg_joined_through``: the same for init_process_group; ``ended``: the restart's ranks whose
    processes have ended (rows)."""

    running: list[sqlite3.Row]
    marks: list[float]
    groups: list[sqlite3.Row]
    joined_through: dict[int, float]
    pg_joined_through: dict[int, float]
    ended: list[sqlite3.Row]


def progress(run_dir: Path, restart: int) -> Progress:
    with StoreReader(run_dir) as s:  # one read: the watchdog's dumps wait until it is closed
        return Progress(running=s.running_procs(restart), marks=s.last_progress(restart), groups=s.running_coll_groups(restart),
                        joined_through=s.joined_through_children(restart),
                        pg_joined_through=s.joined_through_children(restart, "pg_join_at"), ended=s.ended_ranks(restart))
