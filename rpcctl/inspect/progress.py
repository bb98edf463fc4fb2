"""How far a restart of a run has got, as the store saw it: what the watchdog's hang check reads
once a check (``progress``), as typed records (``rpcctl.inspect.stored``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rpcctl.inspect.stored import StoredGroup, StoredProcess
from rpcctl.telemetry.reader import StoreReader


@dataclass
class Progress:
    """``running``: the processes of the restart not ended; ``marks``: the latest call counted,
    long call ended and loss; ``groups``: the running processes' process groups (a collective
    completing is progress); ``joined_through``: rank → when the first process it spawned joined
    RPC (an mp.spawn program: the rank waits, its children are the workers);
    ``pg_joined_through``: the same for init_process_group; ``ended``: the restart's ranks whose
    processes have ended."""

    running: list[StoredProcess]
    marks: list[float]
    groups: list[StoredGroup]
    joined_through: dict[int, float]
    pg_joined_through: dict[int, float]
    ended: list[StoredProcess]


def progress(run_dir: Path, restart: int) -> Progress:
    with StoreReader(run_dir) as s:  # one read: the watchdog's dumps wait until it is closed
        running, groups, ended = s.running_procs(restart), s.running_coll_groups(restart), s.ended_ranks(restart)
        marks = s.last_progress(restart)
        joined, pg_joined = s.joined_through_children(restart), s.joined_through_children(restart, "pg_join_at")
    return Progress(
        running=StoredProcess.all(running),
        marks=marks,
        groups=StoredGroup.all(groups),
        joined_through=joined,
        pg_joined_through=pg_joined,
        ended=StoredProcess.all(ended),
    )
