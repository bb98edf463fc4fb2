"""The inspection SDK: typed records over a run's telemetry store, live or after the run.

Used by ``rpcctl inspect``, the live dashboard and the launcher's end-of-run report::

    from rpcctl import inspect
    run_dir = resolve_run(None)                      # rpcctl.runs
    inspect.rrefs(run_dir, owner="worker1", state="live")   -> list[RRefRecord]
    inspect.rref_owners(run_dir)                     -> list[OwnerSummary]
    inspect.workers(run_dir)                         -> list[WorkerRecord]
    inspect.gpus(run_dir)                            -> list[DeviceRecord]
    inspect.losses(run_dir, rank=0)                  -> list[LossRecord]
    inspect.leaked_rrefs(run_dir)                    -> list[RRefRecord]
    inspect.telemetry_cost(run_dir)                  -> TelemetryCost | None
    inspect.dump_stacks(run_dir, rank)               -> list[StackDump] (rank, then its children)

Each record type declares its columns once (``COLUMNS``): the table and the JSON keys come from
the same fields. JSON keeps raw units (bytes, seconds, ISO-8601 times).

RRef states: ``pending`` (created by ``rpc.remote``, not yet confirmed by the owner) → ``live``
→ ``deleted`` (every known reference dropped, or the owner freed the value). RRefs that lived
less than 0.2 s are not listed one by one: ``OwnerSummary.short_lived`` counts them.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpcctl import stacks
from rpcctl.console import Column, human_bytes, human_seconds, human_time, iso_time, join
from rpcctl.errors import RpcctlError, UsageError
from rpcctl.runs import load_record, rank_stack_file
from rpcctl.telemetry import protocol, store

RREF_STATES = ("pending", "live", "deleted")
WORKER_STATES = ("starting", "running", "exited", "failed", "killed")


def _shape(value: Any) -> str:
    return "(" + ", ".join(str(v) for v in value) + (",)" if len(value) == 1 else ")")


def _percent(value: float) -> str:
    return f"{value:.0f}%"


def _age(value: float) -> str:
    return human_seconds(value)


# ---------------------------------------------------------------------------------------------
# Records


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
    state: str
    created_at: str | None
    confirmed_at: str | None
    deleted_at: str | None
    call_site: str | None
    callee: str | None
    kind: str  # remote (rpc.remote) | local (rpc.RRef(value) on its owner)
    forks: int  # references received by other workers, ever
    live_at_shutdown: bool
    restart: int

    COLUMNS = (
        Column("rref_id", "RREF"),
        Column("owner"),
        Column("creator", detail=True),
        Column("holders", fmt=join),
        Column("type"),
        Column("shape", fmt=_shape),
        Column("dtype", detail=True),
        Column("device"),
        Column("nbytes", "BYTES", fmt=human_bytes, justify="right"),
        Column("state"),
        Column("created_at", "CREATED", fmt=human_time, detail=True),
        Column("callee", detail=True),
        Column("call_site", "CALL SITE"),
        Column("kind", detail=True),
        Column("forks", detail=True, justify="right"),
        Column("restart", detail=True, justify="right"),
    )


@dataclass
class OwnerSummary:
    owner: str
    owner_rank: int | None
    live: int
    pending: int
    deleted: int
    live_bytes: int
    short_lived: int  # created and dropped within 0.2 s: counted, not listed

    COLUMNS = (
        Column("owner"),
        Column("live", justify="right"),
        Column("pending", justify="right"),
        Column("deleted", justify="right"),
        Column("live_bytes", "LIVE BYTES", fmt=human_bytes, justify="right"),
        Column("short_lived", "SHORT-LIVED", justify="right"),
    )


@dataclass
class WorkerRecord:
    rank: int | None  # the launcher's rank (a spawned child: the rank that spawned it)
    name: str | None  # RPC worker name, once init_rpc ran
    host: str | None
    pid: int | None
    state: str  # starting | running | exited | failed | killed
    exit_code: int | None
    cpu_percent: float | None
    rss_bytes: int | None
    device: str | None
    gpu_memory_bytes: int | None
    heartbeat_age_s: float | None
    stale: bool  # running, but no heartbeat for STALE_AFTER_S
    kind: str  # rank | child (a process the rank spawned itself)
    rpc_rank: int | None
    parent_pid: int | None
    threads: int | None
    restart: int
    cuda_visible_devices: str | None
    device_maps: dict[str, dict[str, str]] | None
    dropped_events: int
    started_at: str | None
    ended_at: str | None
    cpu_s: float | None  # CPU time the process used, all threads (at its last probe)
    telemetry_cpu_s: float | None  # of which rpcctl's telemetry sender thread

    COLUMNS = (
        Column("rank", justify="right"),
        Column("name"),
        Column("kind", detail=True),
        Column("host", detail=True),
        Column("pid", justify="right"),
        Column("state"),
        Column("exit_code", "EXIT", justify="right"),
        Column("cpu_percent", "CPU", fmt=_percent, justify="right"),
        Column("rss_bytes", "RSS", fmt=human_bytes, justify="right"),
        Column("threads", detail=True, justify="right"),
        Column("device"),
        Column("gpu_memory_bytes", "GPU MEM", fmt=human_bytes, justify="right"),
        Column("heartbeat_age_s", "HEARTBEAT", fmt=_age, justify="right"),
        Column("cuda_visible_devices", "CUDA VISIBLE", detail=True),
        Column("dropped_events", "DROPPED", detail=True, justify="right"),
        Column("cpu_s", "CPU TIME", fmt=human_seconds, detail=True, justify="right"),
        Column("telemetry_cpu_s", "TELEMETRY CPU", fmt=human_seconds, detail=True, justify="right"),
    )


@dataclass
class DeviceRecord:
    device: str  # "cuda:N" (physical index) or "cpu"
    name: str | None
    ranks: list[int]
    workers: list[str]
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    rref_bytes: int  # bytes of live RRef values on this device
    rrefs: int

    COLUMNS = (
        Column("device"),
        Column("name"),
        Column("ranks", fmt=join),
        Column("workers", fmt=join, detail=True),
        Column("memory_used_bytes", "MEM USED", fmt=human_bytes, justify="right"),
        Column("memory_total_bytes", "MEM TOTAL", fmt=human_bytes, justify="right"),
        Column("rrefs", "RREFS", justify="right"),
        Column("rref_bytes", "RREF BYTES", fmt=human_bytes, justify="right"),
    )


@dataclass
class LossRecord:
    rank: int
    step: int  # the printed/reported step; else the epoch; else the loss's index on that rank
    loss: float | None
    epoch: int | None
    metrics: dict[str, float | None] = field(default_factory=dict)
    time: str | None = None
    source: str = "log"  # log (parsed from the rank's output) | report (rpcctl.report)
    restart: int = 0

    COLUMNS = (
        Column("rank", justify="right"),
        Column("step", justify="right"),
        Column("epoch", justify="right"),
        Column("loss", fmt=lambda v: f"{v:.6g}", justify="right"),
        Column("time", fmt=human_time),
        Column("source", detail=True),
    )


@dataclass
class LossSummary:
    rank: int
    count: int
    first: float | None
    min: float | None
    min_step: int | None
    last: float | None
    last_step: int | None
    trend: str  # a sparkline of the last losses (table only)

    COLUMNS = (
        Column("rank", justify="right"),
        Column("count", "N", justify="right"),
        Column("first", fmt=lambda v: f"{v:.6g}", justify="right"),
        Column("min", fmt=lambda v: f"{v:.6g}", justify="right"),
        Column("min_step", "AT STEP", justify="right"),
        Column("last", fmt=lambda v: f"{v:.6g}", justify="right"),
        Column("last_step", "STEP", justify="right"),
        Column("trend"),
    )


# ---------------------------------------------------------------------------------------------
# Opening a store


class _Store:
    """One read of a run's store: the connection, its meta, and 'now' for ages and states."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.db = store.connect(protocol.db_path(self.run_dir))
        self.meta = {}
        if self.db is not None:
            self.meta = {row["key"]: row["value"] for row in self.rows("SELECT key, value FROM meta")}
            self.meta = {k: _loads(v) for k, v in self.meta.items()}
        self.closed_at: float | None = self.meta.get("closed_at")
        self.now = time.time()

    @property
    def live(self) -> bool:
        return self.db is not None and self.closed_at is None

    def rows(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        if self.db is None:
            return []
        try:
            return self.db.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []  # the server has not created the schema yet
            raise RpcctlError(f"cannot read {protocol.db_path(self.run_dir)}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise RpcctlError(f"cannot read {protocol.db_path(self.run_dir)}: {exc}") from None

    def latest_restart(self) -> int:
        rows = self.rows("SELECT max(restart) AS r FROM (SELECT restart FROM ranks UNION ALL SELECT restart FROM procs)")
        return int(rows[0]["r"]) if rows and rows[0]["r"] is not None else 0

    def close(self) -> None:
        if self.db is not None:
            self.db.close()

    def __enter__(self) -> _Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def has_telemetry(run_dir: Path) -> bool:
    return protocol.db_path(run_dir).is_file()


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# RRefs


def rrefs(run_dir: Path, *, owner: str | None = None, state: str | None = None, restart: int | None = None) -> list[RRefRecord]:
    """One record per RRef of the run's latest restart (or ``restart``), oldest first."""
    if state is not None and state not in RREF_STATES:
        raise UsageError(f"unknown RRef state '{state}' (choose from {', '.join(RREF_STATES)})")
    with _Store(run_dir) as s:
        records = _rrefs(s, s.latest_restart() if restart is None else restart)
    if owner is not None:
        records = [r for r in records if owner in (r.owner, str(r.owner_rank))]
    if state is not None:
        records = [r for r in records if r.state == state]
    return records


def _rrefs(s: _Store, restart: int) -> list[RRefRecord]:
    procs = {row["proc_id"]: row for row in s.rows("SELECT * FROM procs WHERE restart = ?", (restart,))}
    names = {row["rpc_rank"]: row["name"] for row in s.rows("SELECT rpc_rank, name FROM rpc_workers WHERE restart = ?", (restart,))}
    handles: dict[str, list[sqlite3.Row]] = defaultdict(list)
    for row in s.rows("SELECT * FROM handles WHERE restart = ?", (restart,)):
        handles[row["rref_id"]].append(row)
    rows = s.rows("SELECT * FROM rrefs WHERE restart = ? ORDER BY created_at, rref_id", (restart,))
    types_by_id = {row["rref_id"]: row["type"] for row in rows}
    records = []
    for row in rows:
        mine = handles.get(row["rref_id"], [])
        holders = sorted({_holder(h, procs) for h in mine if h["released_at"] is None})
        released = [h["released_at"] for h in mine]
        freed = row["value_freed_at"]
        deleted_at = freed
        if deleted_at is None and mine and all(r is not None for r in released):
            deleted_at = max(released)
        if deleted_at is not None:
            state = "deleted"
        elif row["kind"] == "remote" and row["confirmed_at"] is None:
            state = "pending"
        else:
            state = "live"
        owner_rank = row["owner_rank"]
        records.append(
            RRefRecord(
                rref_id=row["rref_id"],
                owner=row["owner"] or names.get(owner_rank),
                owner_rank=owner_rank,
                creator=row["creator"] or names.get(row["creator_rank"]) or names.get(_created_on(row["rref_id"])),
                creator_rank=row["creator_rank"] if row["creator_rank"] is not None else _created_on(row["rref_id"]),
                holders=holders,
                type=row["type"],
                shape=_loads(row["shape"]),
                dtype=row["dtype"],
                device=row["device"],
                nbytes=row["nbytes"],
                state=state,
                created_at=iso_time(row["created_at"]),
                confirmed_at=iso_time(row["confirmed_at"]),
                deleted_at=iso_time(deleted_at),
                call_site=row["call_site"],
                callee=_callee(row["callee"], types_by_id),
                kind=row["kind"] or "remote",
                forks=sum(1 for h in mine if h["role"] == "fork"),
                live_at_shutdown=_live_at_shutdown(mine, freed, procs),
                restart=restart,
            )
        )
    return records


_ON_RREF = re.compile(r"^rref\((?P<id>[\d:]+)\)\.(?P<method>.+)$")


def _callee(callee: str | None, types_by_id: dict[str, str | None]) -> str | None:
    """``rref(0:3).value`` (a method called through ``rref.remote()``) → ``Accumulator.value``."""
    match = _ON_RREF.match(callee or "")
    if match is None:
        return callee
    type_name = types_by_id.get(match["id"])
    return f"{type_name}.{match['method']}" if type_name else callee


def _created_on(rref_id: str) -> int | None:
    head = rref_id.split(":", 1)[0]
    return int(head) if head.isdigit() else None


def _holder(handle: sqlite3.Row, procs: dict[int, sqlite3.Row]) -> str:
    proc = procs.get(handle["proc_id"])
    return handle["holder"] or (proc["name"] if proc is not None and proc["name"] else f"pid {proc['pid'] if proc else '?'}")


def _live_at_shutdown(handles: list[sqlite3.Row], freed: float | None, procs: dict[int, sqlite3.Row]) -> bool:
    """A reference its holder still had when it began rpc.shutdown() (or, without one, exited)."""
    for handle in handles:
        proc = procs.get(handle["proc_id"])
        if proc is None:
            continue
        end = proc["rpc_shutdown_at"] or proc["ended_at"]
        if end is None or handle["acquired_at"] is None or handle["acquired_at"] > end:
            continue
        released = handle["released_at"]
        if (released is None or released >= end) and (freed is None or freed >= end):
            return True
    return False


def rref_owners(run_dir: Path, *, restart: int | None = None, records: list[RRefRecord] | None = None) -> list[OwnerSummary]:
    """Per owner: RRefs by state, bytes of live values, and short-lived RRefs (counted only)."""
    with _Store(run_dir) as s:
        restart = s.latest_restart() if restart is None else restart
        if records is None:
            records = _rrefs(s, restart)
        churn = s.rows("SELECT owner, sum(count) AS n FROM churn WHERE restart = ? GROUP BY owner", (restart,))
    summaries: dict[str, OwnerSummary] = {}

    def summary(owner: str, rank: int | None) -> OwnerSummary:
        if owner not in summaries:
            summaries[owner] = OwnerSummary(owner, rank, 0, 0, 0, 0, 0)
        elif summaries[owner].owner_rank is None:
            summaries[owner].owner_rank = rank
        return summaries[owner]

    for record in records:
        entry = summary(record.owner or "?", record.owner_rank)
        setattr(entry, record.state, getattr(entry, record.state) + 1)
        if record.state == "live" and record.nbytes:
            entry.live_bytes += record.nbytes
    for row in churn:
        summary(row["owner"] or "?", None).short_lived += int(row["n"] or 0)
    return sorted(summaries.values(), key=lambda e: (e.owner_rank is None, e.owner_rank or 0, e.owner))


def leaked_rrefs(run_dir: Path) -> list[RRefRecord]:
    """RRefs some worker still referenced when it began rpc.shutdown() (or exited without it),
    with their creation site: what the launcher reports at the end of a run."""
    if not has_telemetry(run_dir):
        return []
    return [r for r in rrefs(run_dir) if r.live_at_shutdown]


# ---------------------------------------------------------------------------------------------
# Workers


_LAUNCHER_STATES = {"running": "running", "pending": "starting", "succeeded": "exited", "failed": "failed", "killed": "killed"}


def workers(run_dir: Path) -> list[WorkerRecord]:
    """Every rank of the latest restart (the launcher's view, with its probes), then the
    processes those ranks spawned that joined RPC or reported metrics."""
    with _Store(run_dir) as s:
        restart = s.latest_restart()
        ranks = s.rows("SELECT * FROM ranks WHERE restart = ? ORDER BY rank", (restart,))
        procs = s.rows("SELECT * FROM procs WHERE restart = ? ORDER BY proc_id", (restart,))
        records: list[WorkerRecord] = []
        used: set[int] = set()
        for rank in ranks:
            # pid and rank together: on a multi-node run pids repeat across hosts.
            proc = next((p for p in reversed(procs) if (p["rank"], p["pid"]) == (rank["rank"], rank["pid"])), None)
            if proc is not None:
                used.add(proc["proc_id"])
            records.append(_worker(s, proc, rank, restart))
        for proc in procs:
            if proc["proc_id"] not in used:
                records.append(_worker(s, proc, None, restart))
    records.sort(key=lambda w: (w.rank if w.rank is not None else 1 << 30, w.kind != "rank", w.rpc_rank or 0, w.pid or 0))
    return records


def _worker(s: _Store, proc: sqlite3.Row | None, rank: sqlite3.Row | None, restart: int) -> WorkerRecord:
    ended = proc["ended_at"] if proc is not None else None
    if rank is not None:
        state = _LAUNCHER_STATES.get(rank["state"], rank["state"])
        if state == "running" and proc is None:
            state = "starting"
    else:
        state = "running" if ended is None and s.live else "exited"
    running = state == "running" and proc is not None and ended is None and s.live
    age = max(0.0, s.now - proc["last_seen"]) if running and proc["last_seen"] is not None else None
    placed = rank["device"] if rank is not None else None
    probed = proc["device"] if proc is not None else None
    device = probed if probed and probed != "cpu" else (placed or probed)
    started = rank["started_at"] if rank is not None else (proc["connected_at"] if proc is not None else None)
    finished = rank["ended_at"] if rank is not None and rank["ended_at"] is not None else ended
    return WorkerRecord(
        rank=rank["rank"] if rank is not None else (proc["rank"] if proc is not None else None),
        name=proc["name"] if proc is not None else None,
        host=proc["host"] if proc is not None else None,
        pid=rank["pid"] if rank is not None else proc["pid"],
        state=state,
        exit_code=rank["exit_code"] if rank is not None else None,
        cpu_percent=proc["cpu_percent"] if proc is not None and running else None,
        rss_bytes=proc["rss_bytes"] if proc is not None and running else None,
        device=device,
        gpu_memory_bytes=proc["gpu_memory_bytes"] if proc is not None and running else None,
        heartbeat_age_s=age,
        stale=age is not None and age > protocol.STALE_AFTER_S,
        kind=proc["kind"] if proc is not None and proc["kind"] else "rank",
        rpc_rank=proc["rpc_rank"] if proc is not None else None,
        parent_pid=proc["ppid"] if proc is not None else None,
        threads=proc["threads"] if proc is not None and running else None,
        restart=restart,
        cuda_visible_devices=proc["cuda_visible_devices"] if proc is not None else None,
        device_maps=_loads(proc["device_maps"]) if proc is not None else None,
        dropped_events=int(proc["dropped"] or 0) if proc is not None else 0,
        started_at=iso_time(started),
        ended_at=iso_time(finished),
        cpu_s=_column(proc, "cpu_s"),
        telemetry_cpu_s=_column(proc, "telemetry_cpu_s"),
    )


def _column(row: sqlite3.Row | None, key: str) -> Any:
    """A column that stores written by an older rpcctl may lack."""
    return row[key] if row is not None and key in row.keys() else None


@dataclass
class TelemetryCost:
    """What rpcctl's telemetry cost a run, in CPU time, measured by the threads that do it: the
    sender thread of each process and the launcher's server thread. Not included: the hooks
    on the calling threads (about a microsecond per rpc.remote, see
    benchmarks/tracking_overhead.py --micro) and, on a multi-node run, other nodes' relays."""

    processes_cpu_s: float  # every tracked process, all threads, at its last probe
    senders_cpu_s: float
    server_cpu_s: float | None  # None: a store written by an older rpcctl
    share: float | None  # (senders + server) / processes

    def describe(self) -> str:
        server = f" + launcher {human_seconds(self.server_cpu_s)}" if self.server_cpu_s is not None else ""
        share = f" = {self.share:.1%} of the processes' {human_seconds(self.processes_cpu_s)}" if self.share is not None else ""
        return f"telemetry CPU: senders {human_seconds(self.senders_cpu_s)}{server}{share}"


def telemetry_cost(run_dir: Path) -> TelemetryCost | None:
    """The run's telemetry cost so far (every restart); None before any process reported."""
    with _Store(run_dir) as s:
        columns = {row["name"] for row in s.rows("PRAGMA table_info(procs)")}
        if "telemetry_cpu_s" not in columns:  # a store written by an older rpcctl, or none yet
            return None
        row = s.rows("SELECT sum(cpu_s) AS cpu, sum(telemetry_cpu_s) AS telemetry FROM procs")[0]
        server = s.meta.get("server_cpu_s")
    if row["cpu"] is None:
        return None
    spent = (row["telemetry"] or 0.0) + (server or 0.0)
    return TelemetryCost(row["cpu"], row["telemetry"] or 0.0, server, spent / row["cpu"] if row["cpu"] > 0 else None)


# ---------------------------------------------------------------------------------------------
# Devices


def gpus(run_dir: Path) -> list[DeviceRecord]:
    """Per device (physical GPU, or "cpu"): ranks placed there, memory, live RRef bytes on it."""
    live_rrefs = [r for r in rrefs(run_dir) if r.state != "deleted"]
    workers_ = workers(run_dir)
    devices: dict[str, DeviceRecord] = {}

    def device(key: str) -> DeviceRecord:
        if key not in devices:
            devices[key] = DeviceRecord(key, None, [], [], None, None, 0, 0)
        return devices[key]

    visible_of: dict[str | None, list[str]] = {}
    with _Store(run_dir) as s:
        procs = s.rows("SELECT * FROM procs WHERE restart = ?", (s.latest_restart(),))
    for proc in procs:
        visible_of[proc["name"]] = [v.strip() for v in (proc["cuda_visible_devices"] or "").split(",") if v.strip()]
        if proc["ended_at"] is not None:
            continue
        for gpu in _loads(proc["gpus"]) or []:
            entry = device(f"cuda:{gpu.get('physical', gpu.get('index'))}")
            entry.name = entry.name or gpu.get("name")
            entry.memory_total_bytes = gpu.get("total_bytes") or entry.memory_total_bytes
            used = gpu.get("device_used_bytes")
            if used is not None:
                entry.memory_used_bytes = max(entry.memory_used_bytes or 0, used)
    for worker in workers_:
        key = _physical(worker.device or "cpu", visible_of.get(worker.name) or _visible(worker.cuda_visible_devices))
        entry = device(key)
        if worker.rank is not None and worker.rank not in entry.ranks and worker.kind == "rank":
            entry.ranks.append(worker.rank)
        label = worker.name or f"pid {worker.pid}"
        if label not in entry.workers:
            entry.workers.append(label)
        if key == "cpu" and worker.rss_bytes:
            entry.memory_used_bytes = (entry.memory_used_bytes or 0) + worker.rss_bytes
    for record in live_rrefs:
        if not record.device:
            continue
        key = _physical(record.device, visible_of.get(record.owner) or [])
        entry = device(key)
        entry.rrefs += 1
        entry.rref_bytes += record.nbytes or 0
    return sorted(devices.values(), key=lambda d: (d.device == "cpu", _device_index(d.device)))


def _visible(text: str | None) -> list[str]:
    return [v.strip() for v in (text or "").split(",") if v.strip()]


def _physical(device: str, visible: list[str]) -> str:
    """A process's 'cuda:N' → the physical 'cuda:M' its CUDA_VISIBLE_DEVICES maps N to."""
    if device.startswith("cuda"):
        index = device.partition(":")[2]
        if index.isdigit() and int(index) < len(visible) and visible[int(index)].isdigit():
            return f"cuda:{visible[int(index)]}"
        return device if index else "cuda:0"
    return "cpu" if device.startswith("cpu") else device


def _device_index(device: str) -> int:
    tail = device.partition(":")[2]
    return int(tail) if tail.isdigit() else 0


# ---------------------------------------------------------------------------------------------
# Losses


def losses(run_dir: Path, *, rank: int | None = None, restart: int | None = None) -> list[LossRecord]:
    """Loss records in arrival order. A rank that used rpcctl.report() has its parsed prints
    left out, so a loss is never counted twice."""
    with _Store(run_dir) as s:
        restart = s.latest_restart() if restart is None else restart
        rows = s.rows("SELECT * FROM losses WHERE restart = ? ORDER BY id", (restart,))
    reported = {row["rank"] for row in rows if row["source"] == "report"}
    records = []
    for row in rows:
        if row["source"] == "log" and row["rank"] in reported:
            continue
        if rank is not None and row["rank"] != rank:
            continue
        records.append(
            LossRecord(
                rank=row["rank"], step=row["step"], loss=row["loss"], epoch=row["epoch"], metrics=_loads(row["metrics"]) or {},
                time=iso_time(row["time"]), source=row["source"], restart=restart,
            )
        )
    return records


_SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int = 24) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    if len(values) > width:  # keep the shape: sample evenly, always ending at the last value
        step = len(values) / width
        values = [values[min(len(values) - 1, int(round((i + 1) * step)) - 1)] for i in range(width)]
    low, high = min(finite), max(finite)
    span = high - low or 1.0
    return "".join(" " if v is None or not math.isfinite(v) else _SPARKS[int((v - low) / span * (len(_SPARKS) - 1))] for v in values)


def loss_summaries(records: list[LossRecord]) -> list[LossSummary]:
    by_rank: dict[int, list[LossRecord]] = defaultdict(list)
    for record in records:
        by_rank[record.rank].append(record)
    out = []
    for rank in sorted(by_rank):
        rows = by_rank[rank]
        finite = [r for r in rows if r.loss is not None and math.isfinite(r.loss)]
        best = min(finite, key=lambda r: r.loss) if finite else None  # type: ignore[arg-type, return-value]
        out.append(
            LossSummary(
                rank=rank, count=len(rows), first=rows[0].loss, min=best.loss if best else None,
                min_step=best.step if best else None, last=rows[-1].loss, last_step=rows[-1].step,
                trend=sparkline([r.loss for r in rows]),
            )
        )
    return out


def loss_grid(records: list[LossRecord], last: int = 10) -> tuple[list[int], list[int], dict[tuple[int, int], float | None]]:
    """The last ``last`` steps × ranks: (steps, ranks, {(step, rank): loss})."""
    cells: dict[tuple[int, int], float | None] = {}
    for record in records:
        cells[(record.step, record.rank)] = record.loss
    steps = sorted({step for step, _ in cells})[-last:]
    ranks = sorted({rank for _, rank in cells})
    return steps, ranks, cells


def plot_losses(records: list[LossRecord], path: Path, title: str | None = None) -> None:
    """Write a loss-per-step chart (one line per rank) to ``path`` (PNG). Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'rpcctl[plot]'") from None
    by_rank: dict[int, list[LossRecord]] = defaultdict(list)
    for record in records:
        by_rank[record.rank].append(record)
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    for rank in sorted(by_rank):
        rows = [r for r in by_rank[rank] if r.loss is not None]
        axes.plot([r.step for r in rows], [r.loss for r in rows], label=f"rank {rank}", linewidth=1.5)
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    if title:
        axes.set_title(title)
    if by_rank:
        axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    try:
        figure.savefig(path, format="png")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)


# ---------------------------------------------------------------------------------------------
# Stacks


@dataclass
class StackDump:
    """The Python stacks of one live process of a rank: the rank itself, or a process it
    started (``mp.spawn``, ``subprocess``) that registered for dumps (``rpcctl.stacks``)."""

    rank: int
    pid: int
    kind: str  # rank | child
    cmdline: list[str]
    text: str | None  # None: the child wrote nothing in time


def dump_stacks(run_dir: Path, rank: int, timeout: float = 5.0) -> list[StackDump]:
    """Ask a live rank to dump its Python stacks (SIGUSR1 → faulthandler), then every live
    process it started that can dump them; return the dumps in that order."""
    record = load_record(run_dir)
    state = next((r for r in record.ranks if r.rank == rank), None)
    if state is None:
        raise UsageError(f"run {record.run_id} has no rank {rank} (ranks 0..{len(record.ranks) - 1})")
    if state.state != "running" or state.pid is None:
        raise UsageError(f"rank {rank} is not running (state: {state.state}): no stack to dump")
    if not _belongs_to_run(state.pid, record.run_id):
        raise UsageError(f"pid {state.pid} of rank {rank} is gone or no longer part of run {record.run_id}")
    descendants = stacks.registered_descendants(run_dir, state.pid)
    try:
        text = stacks.dump(state.pid, rank_stack_file(run_dir, rank), timeout)
    except ProcessLookupError:
        raise UsageError(f"rank {rank} (pid {state.pid}) exited before its stack could be dumped") from None
    except PermissionError:
        raise UsageError(f"not allowed to signal pid {state.pid} of rank {rank}") from None
    if text is None:
        raise UsageError(f"rank {rank} (pid {state.pid}) wrote no stack within {timeout:.0f} s: is faulthandler registered (rpcctl runtime)?")
    dumps = [StackDump(rank, state.pid, "rank", [], text)]
    for pid, cmdline, path in descendants:
        try:
            child_text = stacks.dump(pid, path, timeout)
        except (ProcessLookupError, PermissionError):
            continue  # it exited meanwhile
        dumps.append(StackDump(rank, pid, "child", cmdline, child_text))
    return dumps


def _belongs_to_run(pid: int, run_id: str) -> bool:
    import psutil

    try:
        return psutil.Process(pid).environ().get("RPCCTL_RUN_ID") == run_id
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return False
