"""A run's whole store as it was recorded, every restart: what ``rpcctl trace`` draws a timeline
from (``store_history``), as typed records (``rpcctl.inspect.stored``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rpcctl.inspect.losses import from_most_direct_source
from rpcctl.inspect.stored import (
    StoredCall,
    StoredHandle,
    StoredLoss,
    StoredProcess,
    StoredRank,
    StoredRRef,
    StoredServed,
)
from rpcctl.telemetry.reader import StoreReader


@dataclass
class StoreHistory:
    """Every record of the tables a timeline needs, and when the run ended (or 'now' while it
    lives). ``losses``: each rank's from its most direct source in each restart, as ``inspect
    losses`` counts them (a loss reported and printed is one)."""

    ranks: list[StoredRank]
    procs: list[StoredProcess]
    calls: list[StoredCall]
    serving: list[StoredServed]
    rrefs: list[StoredRRef]
    handles: list[StoredHandle]
    losses: list[StoredLoss]
    end: float


def store_history(run_dir: Path) -> StoreHistory:
    with StoreReader(run_dir) as s:
        ranks, procs, calls, serving = s.ranks(), s.procs(), s.calls(), s.serving()
        rrefs, handles, losses, end = s.rrefs(), s.handles(), s.losses(), s.closed_at or s.now
    return StoreHistory(
        ranks=StoredRank.all(ranks),
        procs=StoredProcess.all(procs),
        calls=StoredCall.all(calls),
        serving=StoredServed.all(serving),
        rrefs=StoredRRef.all(rrefs),
        handles=StoredHandle.all(handles),
        losses=StoredLoss.all(from_most_direct_source(losses)),
        end=end,
    )
