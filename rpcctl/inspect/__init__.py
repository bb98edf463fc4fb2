"""The inspection SDK: typed records over a run's telemetry store, live or after the run.

Used by ``rpcctl inspect``, the live dashboard and the launcher's end-of-run report::

    from rpcctl import inspect
    run_dir = resolve_run(None)                      # rpcctl.records.runs
    inspect.rrefs(run_dir, owner="worker1", state="live")   -> list[RRefRecord]
    inspect.rref_owners(run_dir)                     -> list[OwnerSummary]
    inspect.workers(run_dir)                         -> list[WorkerRecord]
    inspect.spawned_name(run_dir, rank, pid)         -> str | None (RPC name of a process the rank spawned)
    inspect.ended_without_shutdown(run_dir)          -> list[str] (processes that never began rpc.shutdown())
    inspect.placement(run_dir)                       -> list[PlacementRecord] (inspect.gpus: the same, the CLI's word)
    inspect.losses(run_dir, rank=0)                  -> list[LossRecord]
    inspect.leaked_rrefs(run_dir)                    -> list[RRefRecord] (values that outlived their RRefs)
    inspect.ended_rrefs(run_dir)                     -> list[RRefRecord] (leaked, or released at shutdown)
    inspect.telemetry_cost(run_dir)                  -> TelemetryCost | None
    inspect.usage(run_dir)                           -> list[UsageSample] (CPU, RSS per probe)
    inspect.rank_attempts(run_dir)                   -> list[RankAttempt] (every rank's every restart)
    inspect.latest_attempt(run_dir)                  -> int (the latest restart: what restart= may be at most)
    inspect.dump_stacks(run_dir, rank)               -> list[StackDump] (rank, then its children)
    inspect.collectives(run_dir)                     -> CollectivesReport (per group and op; per rank)
    inspect.collective_spans(run_dir)                -> list[CollectiveSpan] (sampled and in-flight collectives,
                                                        for the trace)
    inspect.progress(run_dir, restart)               -> Progress (the watchdog's hang check: what moved last)
    inspect.store_history(run_dir)                   -> StoreHistory (every restart's records: rpcctl trace)

Each record type declares its columns once (``COLUMNS``): the table and the JSON keys come from
the same fields. JSON keeps raw units (bytes, seconds, ISO-8601 times).

One module per view, over the store's reads (``rpcctl.telemetry.reader``: ``StoreReader``, the only
SQL outside the writer; these modules hold none)::

    rrefs.py    RRefRecord, OwnerSummary: rrefs, rref_owners, leaked_rrefs, ended_rrefs (RRef states, endings)
    workers.py  WorkerRecord: workers, spawned_name, ended_without_shutdown, shared_worlds (a job of several launches),
                shutdown_waits
    gpus.py     PlacementRecord: placement (gpus)
    losses.py   LossRecord, LossSummary, LossGrid: losses, line_counts, loss_summaries, loss_grid, sparkline,
                with_metric, x_axis, plot_losses
    stacks.py   StackDump: dump_stacks
    cost.py     TelemetryCost: telemetry_cost
    calls.py    CallsReport (PendingCall, CallSummary, ServingRecord): calls
    collectives.py  CollectivesReport (CollectiveSummary, RankCollectives, CollectiveStraggler), CollectiveSpan:
                collectives, collective_spans, collective_stragglers (Flight Recorder)
    stragglers.py  Straggler: stragglers (step rate, call latency far off the others')
    usage.py    UsageSample: usage (every probe's CPU and RSS)
    attempts.py RankAttempt: rank_attempts (one per rank and restart; the run record keeps the latest)
    progress.py Progress: progress (running processes, last progress marks: the watchdog's hang check)
    views.py    View: VIEWS, view, read_all (the one list of views every surface draws from)
    history.py  StoreHistory: store_history (every restart's records, for rpcctl trace's timeline)
    stored.py   StoredRank, StoredProcess, StoredGroup, StoredCall, StoredServed, StoredRRef, StoredHandle, StoredLoss:
                the store's rows as typed records (what progress and store_history hold)

The views themselves are one list (``views.py``: ``VIEWS``, each a name, its record type, its
reader and its title): the CLI's ``inspect`` commands, the report's sections, the live page and
the terminal's panels all draw from it, under one name per view. A new view is a reader, a record
and one entry there.

This package re-exports every public name, so ``inspect.rrefs(...)`` is the function (the
``rrefs`` module is ``rpcctl.inspect.rrefs`` only through ``sys.modules``/``import``).
"""

from __future__ import annotations

from rpcctl.telemetry.reader import has_telemetry
from rpcctl.inspect.attempts import RankAttempt, latest_attempt, rank_attempts
from rpcctl.inspect.calls import CallsReport, CallSummary, PendingCall, ServingRecord, calls
from rpcctl.inspect.collectives import (
    CollectiveSpan,
    CollectivesReport,
    CollectiveStraggler,
    CollectiveSummary,
    RankCollectives,
    collective_spans,
    collective_stragglers,
    collectives,
)
from rpcctl.inspect.cost import TelemetryCost, telemetry_cost
from rpcctl.inspect.gpus import PlacementRecord, gpus, placement
from rpcctl.inspect.history import StoreHistory, store_history
from rpcctl.inspect.losses import (
    BY_ARRIVAL,
    BY_STEP,
    LossGrid,
    LossRecord,
    LossSummary,
    NothingToPlot,
    line_counts,
    loss_grid,
    loss_summaries,
    losses,
    metric_names,
    plot_losses,
    sparkline,
    with_metric,
    x_axis,
)
from rpcctl.inspect.progress import Progress, progress
from rpcctl.inspect.rrefs import AT_EXIT, AT_SHUTDOWN, HELD_UNUSED, LEAKED
from rpcctl.inspect.rrefs import ENDINGS as RREF_ENDINGS
from rpcctl.inspect.rrefs import RREF_STATES, OwnerSummary, RRefRecord, ended_rrefs, leaked_rrefs, rref_owners, rrefs
from rpcctl.inspect.stacks import StackDump, dump_stacks
from rpcctl.inspect.stored import (
    StoredCall,
    StoredGroup,
    StoredHandle,
    StoredLoss,
    StoredProcess,
    StoredRank,
    StoredRRef,
    StoredServed,
)
from rpcctl.inspect.stragglers import Straggler, stragglers
from rpcctl.inspect.usage import UsageSample, usage
from rpcctl.inspect.views import VIEWS, View, read_all, view
from rpcctl.inspect.workers import (
    SharedWorld,
    WorkerRecord,
    ended_without_shutdown,
    shared_worlds,
    shutdown_waits,
    spawned_name,
    workers,
)

__all__ = [
    "RankAttempt",
    "rank_attempts",
    "latest_attempt",
    "CollectiveSpan",
    "CollectivesReport",
    "CollectiveStraggler",
    "CollectiveSummary",
    "RankCollectives",
    "collective_spans",
    "collective_stragglers",
    "collectives",
    "CallSummary",
    "CallsReport",
    "PendingCall",
    "ServingRecord",
    "Straggler",
    "calls",
    "stragglers",
    "AT_EXIT",
    "AT_SHUTDOWN",
    "HELD_UNUSED",
    "BY_ARRIVAL",
    "BY_STEP",
    "LEAKED",
    "RREF_ENDINGS",
    "RREF_STATES",
    "PlacementRecord",
    "placement",
    "LossGrid",
    "LossRecord",
    "LossSummary",
    "OwnerSummary",
    "RRefRecord",
    "StackDump",
    "TelemetryCost",
    "UsageSample",
    "WorkerRecord",
    "dump_stacks",
    "ended_rrefs",
    "gpus",
    "has_telemetry",
    "leaked_rrefs",
    "line_counts",
    "loss_grid",
    "loss_summaries",
    "losses",
    "metric_names",
    "NothingToPlot",
    "plot_losses",
    "rref_owners",
    "rrefs",
    "sparkline",
    "telemetry_cost",
    "usage",
    "with_metric",
    "workers",
    "x_axis",
    "ended_without_shutdown",
    "SharedWorld",
    "shared_worlds",
    "shutdown_waits",
    "spawned_name",
    "Progress",
    "progress",
    "StoreHistory",
    "store_history",
    "StoredCall",
    "StoredGroup",
    "StoredHandle",
    "StoredLoss",
    "StoredProcess",
    "StoredRank",
    "StoredRRef",
    "StoredServed",
    "VIEWS",
    "View",
    "read_all",
    "view",
]
