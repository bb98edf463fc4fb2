"""The RRefs view: one record per RRef (``rrefs``), per-owner summaries (``rref_owners``), and
what was still referenced at shutdown (``leaked_rrefs``).

RRef states: ``pending`` (created by ``rpc.remote``, not yet confirmed by the owner) → ``live``
→ ``deleted`` (every known reference dropped, or the owner freed the value). RRefs dropped
before the creator's telemetry looked at them (it looks every 0.1 s: most that lived under 0.2 s;
longer on a loaded machine) are not listed one by one: ``OwnerSummary.short_lived`` counts them.

How an RRef ended (``ending``), once its processes stopped:

- ``at shutdown``: a holder still referenced it when it began ``rpc.shutdown()``, which then
  released it. Normal for RRefs a program keeps to the end (a parameter server's, a shared
  store's): nothing to do.
- ``held unused``: the same, but no holder had used it (``to_here``, ``local_value``, a proxy
  call, passing it in a call) for the last ``UNUSED_MIN_S`` and for at least half the time it
  was held: the reference kept the owner's value alive after its last use. Judged only for
  ``rpc.remote`` results, whose value exists for the reference; an ``rpc.RRef(value)`` is a
  handle on an object its owner keeps anyway (a model's parameter).
- ``leaked``: its value outlived every reference to it. All holders had dropped their RRefs at
  least ``LEAK_GRACE_S`` before the owner's process ended, yet the owner still held the value then
  (a list, a cache, a closure kept it). Only values the owner could watch (weakly referable:
  tensors, modules, objects) are judged; for an int or a list nothing is claimed. Judged only
  for ``rpc.remote`` results too: an ``rpc.RRef(value)`` is a handle on the owner's own object,
  which outlives it by design (a model's parameter).

The table shows the ending in STATE instead of ``deleted``; the JSON has both.
"""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rpcctl.console import HIGH, KEY, LOW, Column, human_bytes, human_seconds, human_time, iso_time, join
from rpcctl.base.errors import UsageError
from rpcctl.telemetry.reader import StoreReader, column, has_telemetry, loads
from rpcctl.base.states import RRefEnding, RRefState
from rpcctl.inspect.workers import shared_worlds

RREF_STATES = tuple(RRefState)
AT_SHUTDOWN, AT_EXIT, HELD_UNUSED, LEAKED = (
    RRefEnding.AT_SHUTDOWN,
    RRefEnding.AT_EXIT,
    RRefEnding.HELD_UNUSED,
    RRefEnding.LEAKED,
)
ENDINGS = tuple(e.flag for e in RRefEnding)  # --state filters on how an RRef ended, too (either spelling)
UNUSED_MIN_S = 2.0  # held unused: no use in at least this long before rpc.shutdown() (and half the time held)
LEAK_GRACE_S = 1.0  # between the last release and the owner's shutdown: the owner's free takes a message


def _shape(value: Any) -> str:
    return "(" + ", ".join(str(v) for v in value) + (",)" if len(value) == 1 else ")")


@dataclass
class RRefRecord:
    rref_id: str  # torch's GloballyUniqueId of the RRef, "created_on:local_id"
    owner: str | None
    owner_rank: int | None
    creator: str | None
    creator_rank: int | None
    holders: list[str]  # workers holding a reference now (creator and forks)
    type: str | None
    shape: list[int] | None
    dtype: str | None
    device: str | None
    nbytes: int | None
    state: RRefState
    created_at: str | None
    confirmed_at: str | None
    deleted_at: str | None
    call_site: str | None
    callee: str | None
    kind: str  # remote (rpc.remote) | local (rpc.RRef(value) on its owner)
    forks: int  # references received by other workers, ever
    live_at_shutdown: bool
    restart: int
    world: int = 0  # the RPC world (one init_rpc group: a script that mp.spawns twice has two)
    ending: RRefEnding | None = None  # at shutdown | held unused | leaked (see the module docstring)
    last_used_at: str | None = None  # the latest use by any holder (of one kept to rpc.shutdown(): or when it got it)
    unused_s: float | None = None  # held unused: how long before rpc.shutdown() it was last used
    # Leaked: distributed autograd contexts its owner still had open at its end (they keep the
    # tensors their calls sent: the likely holder, rather than the program's own list or cache).
    owner_autograd_contexts: int | None = None
    # Where its tensors' memory starts (live bytes two RRefs share are counted once); not in --json.
    storages: list[int] | None = field(default=None, metadata={"json": False})

    @property
    def shown_state(self) -> str:
        """STATE in the table: how it ended, where that says more than ``deleted``."""
        if self.ending == HELD_UNUSED:
            return f"held unused {human_seconds(self.unused_s)}" if self.unused_s is not None else "held unused"
        return {AT_SHUTDOWN: "released at shutdown", AT_EXIT: "released at exit", LEAKED: "leaked"}.get(
            self.ending or "", self.state
        )

    COLUMNS = (
        Column("world", justify="right", priority=KEY, varies=True),
        Column("rref_id", "RREF", priority=KEY),
        Column("owner", priority=KEY),
        Column("creator", detail=True),
        Column("holders", fmt=join, wrap=True),
        Column("type", priority=HIGH, wrap=True),
        Column("shape", fmt=_shape, priority=HIGH),
        Column("dtype", detail=True, priority=LOW),
        Column("device", priority=LOW),
        Column("nbytes", "BYTES", fmt=human_bytes, justify="right", priority=HIGH),
        Column("shown_state", "STATE", priority=KEY),
        Column("created_at", "CREATED", fmt=human_time, detail=True),
        Column("last_used_at", "LAST USED", fmt=human_time, detail=True),
        Column("callee", detail=True, wrap=True),
        Column("call_site", "CALL SITE", wrap=True),
        Column("kind", detail=True, priority=LOW),
        Column("forks", detail=True, justify="right", priority=LOW),
        Column("restart", detail=True, justify="right", priority=LOW),
    )


@dataclass
class OwnerSummary:
    owner: str
    owner_rank: int | None
    live: int
    pending: int
    deleted: int
    live_bytes: int
    short_lived: int  # dropped before telemetry's next look (~0.1-0.2 s): counted, not listed
    world: int = 0

    COLUMNS = (
        Column("world", justify="right", priority=KEY, varies=True),
        Column("owner", priority=KEY),
        Column("live", justify="right", priority=KEY),
        Column("pending", justify="right"),
        Column("deleted", justify="right"),
        Column("live_bytes", "LIVE BYTES", fmt=human_bytes, justify="right"),
        Column("short_lived", "SHORT-LIVED", justify="right"),
    )


def rrefs(
    run_dir: Path, *, owner: str | None = None, state: str | None = None, restart: int | None = None
) -> list[RRefRecord]:
    """One record per RRef of the run's latest restart (or ``restart``), oldest first. ``state``:
    one of RREF_STATES, or an ending (``at-shutdown`` or ``at shutdown``, ``leaked``)."""
    ending = RRefEnding.from_flag(state) if state is not None else None
    if state is not None and state not in RREF_STATES and ending is None:
        raise UsageError(f"unknown RRef state '{state}' (choose from {', '.join(RREF_STATES + ENDINGS)})")
    with StoreReader(run_dir) as s:
        latest = s.latest_restart()
        records = _rrefs(s, latest if restart is None else restart)
    if restart is None or restart == latest:
        records = _with_other_launches(Path(run_dir), latest, records)
    if owner is not None:
        records = [r for r in records if owner in (r.owner, str(r.owner_rank))]
    if state is not None:
        records = [r for r in records if r.state == state or ending is not None and r.ending == ending]
    return records


def _rrefs(s: StoreReader, restart: int) -> list[RRefRecord]:
    # An RRef is (world, id): a script that mp.spawns twice has two worlds with the same ids
    # and names (stores before schema 7 have one world, 0).
    procs = {row["proc_id"]: row for row in s.procs(restart)}
    names = {(_world(row), row["rpc_rank"]): row["name"] for row in s.rpc_workers(restart)}
    handles: dict[tuple[int, str], list[sqlite3.Row]] = defaultdict(list)
    for row in s.handles(restart):
        handles[(_world(row), row["rref_id"])].append(row)
    rows = s.rrefs(restart)
    types_by_id = {(_world(row), row["rref_id"]): row["type"] for row in rows}
    # Stores before schema 6 have no uses: there, no reference can be told held unused.
    version = s.schema_version()
    knows_uses = version is not None and version >= 6
    records = []
    for row in rows:
        world = _world(row)
        mine = handles.get((world, row["rref_id"]), [])
        holders = sorted({_holder(h, procs) for h in mine if h["released_at"] is None})
        released = [h["released_at"] for h in mine]
        freed = row["value_freed_at"]
        deleted_at = freed
        if deleted_at is None and mine and all(r is not None for r in released):
            deleted_at = max(released)
        if deleted_at is not None:
            state = RRefState.DELETED
        elif row["kind"] == "remote" and row["confirmed_at"] is None:
            state = RRefState.PENDING
        else:
            state = RRefState.LIVE
        owner_rank = row["owner_rank"]
        held_to = _held_to_end(mine, freed, procs)
        at_shutdown = held_to is not None
        last_used, unused_s = (
            _last_use(mine, procs) if at_shutdown and knows_uses else (_latest_use(mine) if knows_uses else None, None)
        )
        owner_proc = _owner_proc(row, world, procs)
        if _leaked(row, mine, owner_proc):
            ending = LEAKED
        elif at_shutdown and row["kind"] != "local" and unused_s is not None and unused_s >= UNUSED_MIN_S:
            ending = HELD_UNUSED
        else:
            ending = held_to
        records.append(
            RRefRecord(
                rref_id=row["rref_id"],
                owner=row["owner"] or names.get((world, owner_rank)),
                owner_rank=owner_rank,
                creator=row["creator"]
                or names.get((world, row["creator_rank"]))
                or names.get((world, _created_on(row["rref_id"]))),
                creator_rank=row["creator_rank"] if row["creator_rank"] is not None else _created_on(row["rref_id"]),
                holders=holders,
                type=row["type"],
                shape=loads(row["shape"]),
                dtype=row["dtype"],
                device=row["device"],
                nbytes=row["nbytes"],
                state=state,
                created_at=iso_time(row["created_at"]),
                confirmed_at=iso_time(row["confirmed_at"]),
                deleted_at=iso_time(deleted_at),
                call_site=row["call_site"],
                callee=_callee(row["callee"], world, types_by_id),
                kind=row["kind"] or "remote",
                forks=sum(1 for h in mine if h["role"] == "fork"),
                live_at_shutdown=at_shutdown,
                restart=restart,
                world=world,
                ending=ending,
                last_used_at=iso_time(last_used),
                unused_s=unused_s if ending == HELD_UNUSED else None,
                storages=loads(column(row, "storages")),
                owner_autograd_contexts=column(owner_proc, "autograd_contexts") if ending == LEAKED else None,
            )
        )
    return records


_FILLED = (
    "type",
    "shape",
    "dtype",
    "device",
    "nbytes",
    "call_site",
    "callee",
    "creator",
    "creator_rank",
    "created_at",
    "confirmed_at",
    "storages",
)
_ENDING_ORDER = (HELD_UNUSED, AT_SHUTDOWN, AT_EXIT)


def _with_other_launches(run_dir: Path, restart: int, records: list[RRefRecord]) -> list[RRefRecord]:
    """This run's RRefs and those of the runs it is one job with (``workers.shared_worlds``: other
    launches whose processes met this run's in one RPC world): each RRef once, told by all. Its
    owner's run knows what it is (type, shape, where it was made, ``local`` for an
    ``rpc.RRef(value)``); its holders' runs know when they used and released it. An owner's run
    alone never sees a holder of another launch let go: its RRefs stayed ``live``."""
    try:
        shared = [w for w in shared_worlds(run_dir, restart) if w.others]
    except Exception:  # noqa: BLE001 - the other runs are a courtesy: this run's own view stands
        return records
    if not shared:
        return records
    ours = {w.world: set(w.ours) for w in shared}
    parts: dict[tuple[int, str], list[tuple[RRefRecord, set[str]]]] = {}
    for record in records:
        parts.setdefault((record.world, record.rref_id), []).append((record, ours.get(record.world, set())))
    for world in shared:
        for _, other_dir, their_world, names in world.others:
            try:
                with StoreReader(other_dir) as o:
                    theirs = [r for r in _rrefs(o, o.latest_restart()) if r.world == their_world]
            except Exception:  # noqa: BLE001 - a damaged store beside this one
                continue
            for record in theirs:
                moved = replace(record, world=world.world, restart=restart)
                parts.setdefault((world.world, record.rref_id), []).append((moved, set(names)))
    merged = [_merged(found) for found in parts.values()]
    return sorted(merged, key=lambda r: (r.created_at or "", r.world, r.rref_id))


def _merged(parts: list[tuple[RRefRecord, set[str]]]) -> RRefRecord:
    """One RRef told by several runs: the owner's run's record, with what only the holders' runs know."""
    owner = next((r for r, names in parts if r.owner in names), parts[0][0])
    others = [r for r, _ in parts if r is not owner]
    if not others:
        return owner
    filled = {
        name: next((getattr(r, name) for r in others if getattr(r, name) is not None), None)
        for name in _FILLED
        if getattr(owner, name) is None
    }
    used = [r.last_used_at for r, _ in parts if r.last_used_at]
    merged = replace(
        owner,
        **filled,
        holders=sorted({h for r, _ in parts for h in r.holders}),
        forks=sum(r.forks for r, _ in parts),
        last_used_at=max(used) if used else None,
        live_at_shutdown=any(r.live_at_shutdown for r, _ in parts),
    )
    if owner.state == RRefState.DELETED or any(r.state != RRefState.DELETED for r in others):
        return merged
    ended = [r for r in others if r.ending is not None]
    ending = min(
        ended,
        key=lambda r: _ENDING_ORDER.index(r.ending) if r.ending in _ENDING_ORDER else len(_ENDING_ORDER),
        default=None,
    )
    return replace(
        merged,
        state=RRefState.DELETED,
        deleted_at=max(r.deleted_at or "" for r in others) or None,
        ending=ending.ending if ending is not None else None,
        unused_s=ending.unused_s if ending is not None else None,
    )


_ON_RREF = re.compile(r"^rref\((?P<id>[\d:]+)\)\.(?P<method>.+)$")


def _world(row: sqlite3.Row) -> int:
    return column(row, "world") or 0


def _callee(callee: str | None, world: int, types_by_id: dict[tuple[int, str], str | None]) -> str | None:
    """``rref(0:3).value`` (a method called through ``rref.remote()``) → ``Accumulator.value``."""
    match = _ON_RREF.match(callee or "")
    if match is None:
        return callee
    type_name = types_by_id.get((world, match["id"]))
    return f"{type_name}.{match['method']}" if type_name else callee


def _created_on(rref_id: str) -> int | None:
    head = rref_id.split(":", 1)[0]
    return int(head) if head.isdigit() else None


def _holder(handle: sqlite3.Row, procs: dict[int, sqlite3.Row]) -> str:
    proc = procs.get(handle["proc_id"])
    return handle["holder"] or (
        proc["name"] if proc is not None and proc["name"] else f"pid {proc['pid'] if proc else '?'}"
    )


def _holder_end(handle: sqlite3.Row, proc: sqlite3.Row | None) -> float | None:
    """When the holder stopped using RPC: it began rpc.shutdown() (or, without one, exited). A
    worker that serves others calls rpc.shutdown() at once and serves inside it: a reference it
    was handed meanwhile ends when rpc.shutdown() returned."""
    if proc is None:
        return None
    began, acquired = proc["rpc_shutdown_at"], handle["acquired_at"]
    if began is not None and acquired is not None and acquired > began:
        return column(proc, "rpc_shutdown_done_at") or proc["ended_at"]
    return began or proc["ended_at"]


def _held_to_end(handles: list[sqlite3.Row], freed: float | None, procs: dict[int, sqlite3.Row]) -> RRefEnding | None:
    """AT_SHUTDOWN where a holder still had the reference when it stopped using RPC
    (``_holder_end``); AT_EXIT where the only such holders ended without rpc.shutdown() (they
    failed, were killed, or stopped first: nothing released it but their end); None else."""
    found = None
    for handle in handles:
        proc = procs.get(handle["proc_id"])
        if proc is None:
            continue
        end = _holder_end(handle, proc)
        if end is None or handle["acquired_at"] is None or handle["acquired_at"] > end:
            continue
        released = handle["released_at"]
        if (released is None or released >= end) and (freed is None or freed >= end):
            if proc["rpc_shutdown_at"] is not None:
                return AT_SHUTDOWN
            found = AT_EXIT
    return found


def _last_use(handles: list[sqlite3.Row], procs: dict[int, sqlite3.Row]) -> tuple[float | None, float | None]:
    """Of the references held into rpc.shutdown(): the latest use (a holder that never used its
    reference counts from when it got it), and how long before its holder's shutdown that was;
    None where it was not that long unused for at least half the time it was held."""
    latest, idle, held = None, None, None
    for handle in handles:
        proc = procs.get(handle["proc_id"])
        end = _holder_end(handle, proc)
        acquired = handle["acquired_at"]
        if (
            end is None
            or acquired is None
            or acquired > end
            or (handle["released_at"] is not None and handle["released_at"] < end)
        ):
            continue
        if proc["rpc_shutdown_at"] is None:  # it ended without rpc.shutdown(): its last uses were never reported
            idle, held = None, None
            break
        used = max(acquired, column(handle, "last_used_at") or 0.0)
        latest = used if latest is None else max(latest, used)
        idle = end - used if idle is None else min(idle, end - used)
        held = end - acquired if held is None else max(held, end - acquired)
    if idle is None or held is None or idle < 0.5 * held:
        return latest, None
    return latest, idle


def _latest_use(handles: list[sqlite3.Row]) -> float | None:
    """The latest use by any holder of an RRef not held into rpc.shutdown() (one deleted before)."""
    uses = [column(h, "last_used_at") for h in handles if column(h, "last_used_at") is not None]
    return max(uses) if uses else None


def _owner_proc(row: sqlite3.Row, world: int, procs: dict[int, sqlite3.Row]) -> sqlite3.Row | None:
    in_world = [p for p in procs.values() if _world(p) == world and p["rpc_rank"] == row["owner_rank"]]
    owner = next((p for p in in_world if p["kind"] == "rank"), None)
    if owner is None and row["owner_rank"] is not None:
        owner = next(iter(in_world), None)
    return owner


def _leaked(row: sqlite3.Row, handles: list[sqlite3.Row], owner: sqlite3.Row | None) -> bool:
    """The value outlived every reference: all released well before the owner shut down, and
    the owner (which watched it) still had it then."""
    if not column(row, "value_watched") or not handles or any(h["released_at"] is None for h in handles):
        return False
    if row["kind"] == "local":
        # rpc.RRef(value) of the owner's own object (DistributedOptimizer's of a live module's
        # parameters): it lives on by design; under load such RRefs outlived MIN_AGE_S, were
        # listed, and read "leaked" (CI, test_spawned_rrefs)
        return False
    # The owner's end, not when it began rpc.shutdown(): a server calls that at once and
    # serves on, inside it, until every worker is done.
    end = (owner["ended_at"] or owner["stopped_at"]) if owner is not None else None
    if end is None:
        return False  # the owner still runs: the value may yet be freed
    last_release = max(h["released_at"] for h in handles)
    freed = row["value_freed_at"]
    return last_release <= end - LEAK_GRACE_S and (freed is None or freed >= end)


def rref_owners(
    run_dir: Path, *, restart: int | None = None, records: list[RRefRecord] | None = None
) -> list[OwnerSummary]:
    """Per owner: RRefs by state, bytes of live values, and short-lived RRefs (counted only)."""
    with StoreReader(run_dir) as s:
        restart = s.latest_restart() if restart is None else restart
        if records is None:
            records = _rrefs(s, restart)
        churn = s.churn(restart)
    summaries: dict[tuple[int, str], OwnerSummary] = {}

    def summary(world: int, owner: str, rank: int | None) -> OwnerSummary:
        key = (world, owner)
        if key not in summaries:
            summaries[key] = OwnerSummary(owner, rank, 0, 0, 0, 0, 0, world)
        elif summaries[key].owner_rank is None:
            summaries[key].owner_rank = rank
        return summaries[key]

    inside = _inside_another(records)
    for record in records:
        entry = summary(record.world, record.owner or "?", record.owner_rank)
        setattr(entry, record.state.value, getattr(entry, record.state.value) + 1)
        if record.state == RRefState.LIVE and record.nbytes and id(record) not in inside:
            entry.live_bytes += record.nbytes
    for row in churn:
        summary(_world(row), row["owner"] or "?", None).short_lived += int(row["count"] or 0)
    return sorted(summaries.values(), key=lambda e: (e.world, e.owner_rank is None, e.owner_rank or 0, e.owner))


def _inside_another(records: list[RRefRecord]) -> set[int]:
    """Live RRefs whose memory a bigger live RRef of the same owner holds too (a parameter's RRef
    beside its module's): their bytes are that one's, counted once."""
    live = [r for r in records if r.state == RRefState.LIVE and r.storages and r.nbytes]
    by_storage: dict[tuple[int, str | None, int], list[RRefRecord]] = defaultdict(list)
    for record in live:
        for storage in record.storages or ():
            by_storage[(record.world, record.owner, storage)].append(record)
    inside = set()
    for record in live:
        bigger = [
            other
            for storage in record.storages or ()
            for other in by_storage[(record.world, record.owner, storage)]
            if other is not record and (other.nbytes or 0) > (record.nbytes or 0)
        ]
        if bigger and all(
            any(o in bigger for o in by_storage[(record.world, record.owner, st)]) for st in record.storages or ()
        ):
            inside.add(id(record))
    return inside


def leaked_rrefs(run_dir: Path) -> list[RRefRecord]:
    """RRefs whose value outlived every reference to it (``ending == "leaked"``), with their
    creation site: what the launcher warns about at the end of a run."""
    return [r for r in ended_rrefs(run_dir) if r.ending == LEAKED]


def ended_rrefs(run_dir: Path) -> list[RRefRecord]:
    """RRefs with an ``ending``: leaked, or released by ``rpc.shutdown()`` (the end-of-run report)."""
    if not has_telemetry(run_dir):
        return []
    return [r for r in rrefs(run_dir) if r.ending is not None]
