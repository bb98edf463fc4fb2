"""The store's rows as typed records: what ``progress`` (the watchdog's hang check) and
``store_history`` (``rpcctl trace``) return, so that no reader above the SDK indexes a column.

One record per table, each field a column of the same name (``StoredGroup.members`` is
``coll_groups.ranks``, decoded); a column a store written by an older rpcctl lacks reads as None,
as does a JSON column whose text is not JSON. The values are the store's own: a damaged row's
REAL where an INTEGER belongs stays what it is, for the reader to refuse.

==============  =================  ===============================================================
record          table              what a row is
==============  =================  ===============================================================
StoredRank      ranks              a rank's attempt as the launcher saw it (pid, state, exit code)
StoredProcess   procs              a process that connected: a rank, or one it spawned
StoredGroup     coll_groups        a process's process group: the last collective entered and
                                   completed, the one in flight
StoredCall      calls              a long call (1 s or more, or still in flight)
StoredServed    serving            a function a callee ran for a call
StoredRRef      rrefs              an RRef, on its owner
StoredHandle    handles            a reference a worker held to an RRef
StoredLoss      losses             a loss (and its metrics) a rank reported or printed
==============  =================  ===============================================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from rpcctl.telemetry.reader import loads
from rpcctl.telemetry.schema import pg_id

DEFAULT_PG = "0"  # the recorder's pg_id of the default group (init_process_group's)


class _Stored:
    """``of(row)``: the record of a store row (any mapping with ``keys()``, as ``sqlite3.Row``)."""

    JSON: ClassVar[tuple[str, ...]] = ()  # fields whose column is JSON text: decoded
    RENAMED: ClassVar[dict[str, str]] = {}  # field → its column, where the names differ

    @classmethod
    def of(cls, row: Any) -> Any:
        return cls.all([row])[0]

    @classmethod
    def all(cls, rows: list[Any]) -> list[Any]:
        """The records of rows of one query (their columns are the same: looked up once)."""
        if not rows:
            return []
        keys = set(rows[0].keys())
        columns = [(cls.RENAMED.get(f.name, f.name), f.name in cls.JSON) for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        present = [(name if name in keys else None, json) for name, json in columns]
        return [
            cls(*[None if name is None else loads(row[name]) if json else row[name] for name, json in present])
            for row in rows
        ]


@dataclass
class StoredRank(_Stored):
    rank: int
    restart: int
    pid: int | None
    state: str
    exit_code: int | None
    started_at: float | None
    ended_at: float | None


@dataclass
class StoredProcess(_Stored):
    """``kind``: "rank" or "child" (None in the oldest stores: a rank); ``world``: its RPC world,
    ``pg_world`` its c10d world; ``dist_rank``: its rank there."""

    proc_id: int
    host: str | None
    pid: int | None
    rank: int | None
    restart: int | None
    kind: str | None
    name: str | None
    rpc_rank: int | None
    world: int | None
    connected_at: float | None
    last_seen: float | None
    ended_at: float | None
    stopped_at: float | None
    rpc_join_at: float | None
    pg_join_at: float | None
    dist_rank: int | None
    pg_world: int | None
    exit_code: int | None


@dataclass
class StoredGroup(_Stored):
    """``entered`` / ``completed``: how many collectives of the group the process entered and
    completed; ``cur_*``: the one in flight (``cur_sizes`` / ``cur_dtypes`` as the JSON text the
    rank sent, comparable across ranks); ``members``: the group's global ranks as c10d gave them
    (None where unknown: RPC's group, a store before schema 9)."""

    JSON: ClassVar[tuple[str, ...]] = ("members",)
    RENAMED: ClassVar[dict[str, str]] = {"members": "ranks"}

    proc_id: int
    rank: int | None
    pg: str
    entered: int | None
    completed: int | None
    completed_at: float | None
    cur_seq: int | None
    cur_op: str | None
    cur_sizes: str | None
    cur_dtypes: str | None
    cur_bytes: int | None
    cur_since: float | None
    members: Any

    def __post_init__(self) -> None:
        ranks = self.members
        self.members = sorted(r for r in ranks if type(r) is int) if isinstance(ranks, list) else None

    @property
    def inside(self) -> bool:
        """Whether the process is inside a collective of the group (entered one more than it completed)."""
        return (self.entered or 0) > (self.completed or 0)

    @property
    def is_default(self) -> bool:
        """The default group's (init_process_group's), in whichever c10d world."""
        return pg_id(self.pg) == DEFAULT_PG


@dataclass
class StoredCall(_Stored):
    proc_id: int
    call_id: int
    restart: int | None
    kind: str | None
    callee: str | None
    func: str | None
    call_site: str | None
    thread: Any
    started_at: float
    ended_at: float | None
    status: str | None


@dataclass
class StoredServed(_Stored):
    proc_id: int
    serve_id: int
    restart: int | None
    worker: str | None
    thread: Any
    func: str | None
    nbytes: int | None
    started_at: float
    ended_at: float | None


@dataclass
class StoredRRef(_Stored):
    """``shape``: decoded from its JSON; ``value_freed_at``: when the owner freed the value."""

    JSON: ClassVar[tuple[str, ...]] = ("shape",)

    restart: int | None
    world: int | None
    rref_id: str
    owner_rank: int | None
    creator: str | None
    call_site: str | None
    type: str | None
    shape: Any
    device: str | None
    nbytes: int | None
    created_at: float | None
    value_freed_at: float | None


@dataclass
class StoredHandle(_Stored):
    restart: int | None
    world: int | None
    rref_id: str
    released_at: float | None


@dataclass
class StoredLoss(_Stored):
    """``metrics``: decoded from its JSON (None for none)."""

    JSON: ClassVar[tuple[str, ...]] = ("metrics",)

    rank: int | None
    restart: int | None
    time: float | None
    loss: float | None
    metrics: Any
    source: str | None
