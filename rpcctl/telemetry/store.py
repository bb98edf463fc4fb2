"""The telemetry store's writer: one SQLite file per run (``<run_dir>/telemetry.db``).

One writer (the launcher's ``TelemetryServer``), any number of readers, while the run is live
(WAL mode) and after it ends (the server checkpoints and leaves a single plain file). The
tables, their columns and the schema's versions are in ``schema.py``.

Every read is in ``reader.py`` (``StoreReader``, a method per query): the SQL of the store
lives in these two files and nowhere else.

Only the standard library: the launcher imports this and must stay light.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rpcctl.base.private import private_file
from rpcctl.wire.protocol import LOSS_SOURCES
from rpcctl.telemetry.schema import DDL, SCHEMA_VERSION, pg_label


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


# SQLite's result codes for a store that can no longer be written: disk full, I/O error, read
# only (the run directory removed), cannot open (its journal), rather than a bad statement.
_STORAGE_ERRORS = {13: "SQLITE_FULL", 10: "SQLITE_IOERR", 8: "SQLITE_READONLY", 14: "SQLITE_CANTOPEN"}


def _flag(value: Any) -> int | None:
    return None if value is None else int(bool(value))


def _print_warning(message: str) -> None:
    print(f"rpcctl: warning: {message}", file=sys.stderr)


class StoreWriter:
    """The single writer. Not thread-safe: the server's one thread owns it.

    When the storage fails (a full disk, the run directory removed), the writer warns once
    through ``warn`` and turns into a sink: later writes are dropped, and nothing it does raises
    again, so telemetry never stops a rank or the launcher."""

    def __init__(self, path: Path, warn: Callable[[str], None] = _print_warning):
        self.path = path
        self.warn = warn
        self.failed: str | None = None
        private_file(path)  # 0600 before SQLite opens it: its -wal and -shm copy the mode
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(DDL)
        self.db.execute("BEGIN")
        self.dirty = False
        self._loss_seq: dict[tuple[int, int, str], int] = {}  # (rank, restart, source) → next seq
        # RPC worlds and c10d worlds, numbered apart (``_world_of``): rendezvous → (world, {rank: proc_id})
        self._worlds: dict[tuple[int, str, int | None], tuple[int, dict[int | None, int]]] = {}
        self._next_world: dict[int, int] = {}  # restart → the next world's number
        self._pg_worlds: dict[tuple[int, str, int | None], tuple[int, dict[int | None, int]]] = {}
        self._next_pg_world: dict[int, int] = {}
        self.set_meta(schema_version=SCHEMA_VERSION, opened_at=time.time())

    # -- transactions ------------------------------------------------------------------------
    def commit(self) -> None:
        if self.dirty and self.failed is None:
            try:
                self.db.execute("COMMIT")
                self.db.execute("BEGIN")
            except sqlite3.Error as exc:
                self._storage_failed(exc)
            self.dirty = False

    def _x(self, sql: str, params: tuple | list = ()) -> sqlite3.Cursor | None:
        if self.failed is not None:
            return None
        self.dirty = True
        try:
            return self.db.execute(sql, params)
        except sqlite3.Error as exc:
            self._storage_failed(exc)
            return None

    def _storage_failed(self, exc: sqlite3.Error) -> None:
        """Degrade on a storage error; re-raise anything else (a bad statement is a bug, bad
        input is the caller's to reject)."""
        if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) not in _STORAGE_ERRORS:
            raise exc
        self.failed = str(exc)
        self.warn(f"telemetry store {self.path}: {exc}: telemetry is no longer recorded for this run (the job goes on)")
        try:
            self.db.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def close(self) -> None:
        self.set_meta(closed_at=time.time())
        if self.failed is None:
            try:
                self.db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._storage_failed(exc)
        if self.failed is None:
            try:
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                # A single plain file once the run is over: readable without write access to -shm.
                # (Fails harmlessly while a reader has the file open: it then stays in WAL mode.)
                self.db.execute("PRAGMA journal_mode=DELETE")
            except sqlite3.Error:
                pass
        try:
            self.db.close()
        except sqlite3.Error:
            pass

    def set_meta(self, **values: Any) -> None:
        for key, value in values.items():
            self._x("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    # -- the launcher's view -------------------------------------------------------------------
    def rank_started(self, rank: int, restart: int, pid: int, local_rank: int, device: str, t: float) -> None:
        self._x(
            "INSERT OR REPLACE INTO ranks (rank, restart, pid, local_rank, device, state, started_at)"
            " VALUES (?, ?, ?, ?, ?, 'running', ?)",
            (rank, restart, pid, local_rank, device, t),
        )

    def rank_exited(self, rank: int, pid: int, state: str, exit_code: int | None, t: float) -> None:
        self._x(
            "UPDATE ranks SET state = ?, exit_code = ?, ended_at = ? WHERE rank = ? AND pid = ?",
            (state, exit_code, t, rank, pid),
        )

    def loss(
        self,
        rank: int,
        restart: int,
        step: int | None,
        epoch: int | None,
        loss: float | None,
        metrics: dict[str, float] | None,
        t: float,
        source: str,
        rule: str | None = None,
    ) -> int:
        """Add a loss record; returns its id."""
        key = (rank, restart, source)
        seq = self._loss_seq.get(key, 0)
        self._loss_seq[key] = seq + 1
        cursor = self._x(
            "INSERT INTO losses (rank, restart, step, epoch, loss, metrics, time, source, seq, rule)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rank, restart, step, epoch, loss, _json(metrics or None), t, source, seq, rule),
        )
        return int(cursor.lastrowid) if cursor is not None else -1  # -1: the store has failed

    def replace_loss(self, loss_id: int, loss: float | None, metrics: dict[str, float] | None, t: float) -> None:
        """A redraw of the same step (a progress bar after ``set_postfix``) replaces its value."""
        self._x(
            "UPDATE losses SET loss = ?, metrics = ?, time = ? WHERE id = ?", (loss, _json(metrics or None), t, loss_id)
        )

    def log_lines(self, rank: int, restart: int, lines: int, matched: int) -> None:
        """Add to the count of lines the loss parser read on (rank, restart), and of those that matched."""
        self._x(
            "INSERT INTO log_lines (rank, restart, lines, matched) VALUES (?, ?, ?, ?) ON CONFLICT (rank, restart)"
            " DO UPDATE SET lines = lines + excluded.lines, matched = matched + excluded.matched",
            (rank, restart, lines, matched),
        )

    # -- processes -----------------------------------------------------------------------------
    def proc_connected(self, hello: dict[str, Any], restart: int, t: float) -> int:
        cursor = self._x(
            "INSERT INTO procs (host, pid, ppid, rank, restart, kind, connected_at, last_seen)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                hello.get("host"),
                hello.get("pid"),
                hello.get("ppid"),
                hello.get("rank"),
                restart,
                hello.get("kind"),
                t,
                t,
            ),
        )
        return int(cursor.lastrowid) if cursor is not None else -1

    def set_proc_restart(self, proc_id: int, restart: int) -> None:
        self._x("UPDATE procs SET restart = ? WHERE proc_id = ?", (restart, proc_id))

    def proc_ended(self, proc_id: int, t: float) -> None:
        self._x("UPDATE procs SET ended_at = ? WHERE proc_id = ? AND ended_at IS NULL", (t, proc_id))
        # A process that is gone holds no references any more.
        self._x("UPDATE handles SET released_at = ? WHERE proc_id = ? AND released_at IS NULL", (t, proc_id))

    # -- events from a process -----------------------------------------------------------------
    def apply(self, proc: ProcInfo, event: dict[str, Any]) -> None:
        """Store one event (already checked: ``protocol.refusal``) by its handler in ``HANDLERS``."""
        handler = HANDLERS.get(str(event.get("e")))
        if handler is not None:
            handler(self, proc, event, float(event.get("t") or time.time()))

    def _ev_probe(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "UPDATE procs SET last_seen = ?, cpu_percent = ?, rss_bytes = ?, threads = ?, device = ?,"
            " cuda_visible_devices = ?, gpu_memory_bytes = ?, gpus = ?, dropped = ?, cpu_s = coalesce(?, cpu_s),"
            " telemetry_cpu_s = coalesce(?, telemetry_cpu_s)"
            " WHERE proc_id = ?",
            (
                t,
                ev.get("cpu_percent"),
                ev.get("rss_bytes"),
                ev.get("threads"),
                ev.get("device"),
                ev.get("cuda_visible_devices"),
                ev.get("gpu_memory_bytes"),
                _json(ev.get("gpus")),
                ev.get("dropped", 0),
                ev.get("cpu_s"),
                ev.get("telemetry_cpu_s"),
                proc.proc_id,
            ),
        )
        # The history behind the latest values (the report's CPU and RSS over time), one row per
        # probe: PROBE_INTERVAL_S apart, so an hour of 8 ranks is ~30k small rows.
        self._x(
            "INSERT INTO probes (proc_id, t, cpu_percent, rss_bytes) VALUES (?, ?, ?, ?)",
            (proc.proc_id, t, ev.get("cpu_percent"), ev.get("rss_bytes")),
        )

    def _ev_rpc(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        proc.name, proc.rpc_rank = ev.get("name"), ev.get("rpc_rank")
        proc.world = self._world_of(proc, proc.rpc_rank, ev, self._worlds, self._next_world)
        # Where the world met: runs of separate launches that met there are one job (``inspect.shared_worlds``).
        self.set_meta(
            **{f"rpc_world.{proc.restart}.{proc.world}": {"rdv": ev.get("rdv"), "world_size": ev.get("world_size")}}
        )
        self._x(
            "UPDATE procs SET last_seen = ?, name = ?, rpc_rank = ?, world_size = ?, device_maps = ?, devices = ?,"
            " world = ? WHERE proc_id = ?",
            (
                t,
                proc.name,
                proc.rpc_rank,
                ev.get("world_size"),
                _json(ev.get("device_maps")),
                _json(ev.get("devices")),
                proc.world,
                proc.proc_id,
            ),
        )
        for rank, name in (ev.get("workers") or {}).items():
            self._x(
                "INSERT OR REPLACE INTO rpc_workers (restart, world, rpc_rank, name) VALUES (?, ?, ?, ?)",
                (proc.restart, proc.world, int(rank), name),
            )

    @staticmethod
    def _world_of(
        proc: ProcInfo,
        rank: int | None,
        ev: dict[str, Any],
        worlds: dict,
        next_world: dict[int, int],
        stays: bool = False,
    ) -> int:
        """The world (RPC's or c10d's) a process joins as ``rank``: the open one of its rendezvous,
        unless its rank is taken there (a second mp.spawn round reusing the address, or a later
        one on a new port); ``stays``: not by itself (c10d: init_process_group again)."""
        key = (proc.restart, ev.get("rdv") or "", ev.get("world_size"))
        opened = worlds.get(key)
        if opened is None or (rank in opened[1] and not (stays and opened[1][rank] == proc.proc_id)):
            world = next_world.get(proc.restart, 0)
            next_world[proc.restart] = world + 1
            opened = worlds[key] = (world, {})
        opened[1][rank] = proc.proc_id
        return opened[0]

    def _ev_rref(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        value = ev.get("value") or {}
        self._x(
            "INSERT INTO rrefs (restart, world, rref_id, kind, owner_rank, owner, creator_rank, creator, creator_proc,"
            " callee, call_site, type, shape, dtype, device, nbytes, created_at, confirmed_at, value_watched, storages)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (restart, world, rref_id) DO UPDATE SET kind = excluded.kind,"
            " creator_rank = excluded.creator_rank,"
            " creator = excluded.creator, creator_proc = excluded.creator_proc,"
            " callee = coalesce(excluded.callee, callee),"
            " call_site = coalesce(excluded.call_site, call_site), created_at = min(created_at, excluded.created_at),"
            " owner = coalesce(excluded.owner, owner), owner_rank = coalesce(excluded.owner_rank, owner_rank),"
            " type = coalesce(excluded.type, type), shape = coalesce(excluded.shape, shape),"
            " dtype = coalesce(excluded.dtype, dtype), device = coalesce(excluded.device, device),"
            " nbytes = coalesce(excluded.nbytes, nbytes), confirmed_at = coalesce(confirmed_at, excluded.confirmed_at),"
            " value_watched = coalesce(excluded.value_watched, value_watched),"
            " storages = coalesce(excluded.storages, storages)",
            (
                proc.restart,
                proc.world,
                ev["id"],
                ev.get("kind"),
                ev.get("owner_rank"),
                ev.get("owner"),
                proc.rpc_rank,
                proc.name,
                proc.proc_id,
                ev.get("callee"),
                ev.get("site"),
                value.get("type"),
                _json(value.get("shape")),
                value.get("dtype"),
                value.get("device"),
                value.get("nbytes"),
                t,
                t if ev.get("confirmed") else None,
                _flag(ev.get("watched")),
                _json(value.get("storages")),
            ),
        )
        self._handle(proc, ev["id"], ev.get("fork") or "", "creator", t)

    def _ev_conf(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "UPDATE rrefs SET confirmed_at = ? WHERE restart = ? AND world = ? AND rref_id = ?"
            " AND confirmed_at IS NULL",
            (t, proc.restart, proc.world, ev["id"]),
        )

    def _ev_desc(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        """The owner describes a value (it may report before the creator's event arrives). For an
        RRef it made with rpc.RRef(value) and handed out at once, it also says where (``site``)."""
        value = ev.get("value") or {}
        local = ev.get("kind") == "local"
        self._x(
            "INSERT INTO rrefs (restart, world, rref_id, kind, owner_rank, owner, creator_rank, creator, creator_proc,"
            " call_site, type, shape, dtype, device, nbytes, created_at, value_watched, storages)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (restart, world, rref_id) DO UPDATE SET"
            " owner = coalesce(owner, excluded.owner), owner_rank = coalesce(owner_rank, excluded.owner_rank),"
            " kind = CASE WHEN excluded.kind = 'local' THEN 'local' ELSE kind END,"
            " creator_rank = coalesce(creator_rank, excluded.creator_rank),"
            " creator = coalesce(creator, excluded.creator),"
            " creator_proc = coalesce(creator_proc, excluded.creator_proc),"
            " call_site = coalesce(call_site, excluded.call_site),"
            # The owner's type wins (a fork carries TorchScript's view: 'Tensor' for a Parameter),
            # but for ScriptModule, where the fork's class name says more.
            " type = CASE WHEN excluded.type LIKE '%ScriptModule' THEN coalesce(type, excluded.type)"
            " ELSE coalesce(excluded.type, type) END,"
            " shape = excluded.shape, dtype = excluded.dtype, device = excluded.device, storages = excluded.storages,"
            " nbytes = excluded.nbytes, value_watched = coalesce(excluded.value_watched, value_watched)",
            (
                proc.restart,
                proc.world,
                ev["id"],
                "local" if local else "remote",
                proc.rpc_rank,
                proc.name,
                proc.rpc_rank if local else None,
                proc.name if local else None,
                proc.proc_id if local else None,
                ev.get("site"),
                value.get("type"),
                _json(value.get("shape")),
                value.get("dtype"),
                value.get("device"),
                value.get("nbytes"),
                t,
                _flag(ev.get("watched")),
                _json(value.get("storages")),
            ),
        )

    def _ev_vfree(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "UPDATE rrefs SET value_freed_at = ? WHERE restart = ? AND world = ? AND rref_id = ?",
            (t, proc.restart, proc.world, ev["id"]),
        )

    def _ev_fork(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        # The creator may be untracked, or have dropped its handle before reporting: the fork
        # alone is enough to list the RRef.
        self._x(
            "INSERT INTO rrefs (restart, world, rref_id, kind, owner_rank, type, created_at)"
            " VALUES (?, ?, ?, 'remote', ?, ?, ?)"
            " ON CONFLICT (restart, world, rref_id) DO UPDATE SET type = coalesce(type, excluded.type)",
            (proc.restart, proc.world, ev["id"], ev.get("owner_rank"), ev.get("type"), t),
        )
        self._handle(proc, ev["id"], ev.get("fork") or "", "fork", t)

    def _ev_rel(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "UPDATE handles SET released_at = ? WHERE restart = ? AND world = ? AND rref_id = ? AND fork_id = ?"
            " AND proc_id = ? AND released_at IS NULL",
            (t, proc.restart, proc.world, ev["id"], ev.get("fork") or "", proc.proc_id),
        )

    def _ev_used(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "UPDATE handles SET last_used_at = max(coalesce(last_used_at, 0), ?)"
            " WHERE restart = ? AND world = ? AND rref_id = ? AND fork_id = ? AND proc_id = ?",
            (t, proc.restart, proc.world, ev["id"], ev.get("fork") or "", proc.proc_id),
        )

    def _ev_churn(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "INSERT INTO churn (restart, world, proc_id, owner, callee, call_site, count) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (restart, world, proc_id, owner, callee, call_site)"
            " DO UPDATE SET count = count + excluded.count",
            (
                proc.restart,
                proc.world,
                proc.proc_id,
                ev.get("owner") or "?",
                ev.get("callee") or "?",
                ev.get("site") or "?",
                int(ev.get("n", 1)),
            ),
        )

    def _ev_loss(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        rank = proc.rpc_rank if proc.rpc_rank is not None else proc.rank
        source = ev.get("source")
        # a process never sends a printed line's
        source = source if source in LOSS_SOURCES and source != "log" else "report"
        self.loss(
            rank if rank is not None else -1,
            proc.restart,
            ev.get("step"),
            ev.get("epoch"),
            ev.get("loss"),
            ev.get("metrics"),
            t,
            source,
        )

    # -- calls (``rpcctl.rank.calls``) ------------------------------------------------------
    def _ev_join(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x("UPDATE procs SET rpc_join_at = coalesce(rpc_join_at, ?) WHERE proc_id = ?", (t, proc.proc_id))

    def _ev_call(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "INSERT OR REPLACE INTO calls (restart, proc_id, call_id, kind, caller, caller_rank, callee, func,"
            " call_site, thread, started_at, nbytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                proc.restart,
                proc.proc_id,
                int(ev["id"]),
                str(ev.get("kind")),
                proc.name,
                proc.rpc_rank,
                str(ev.get("callee")),
                str(ev.get("func")),
                str(ev.get("site")),
                _int(ev.get("thread")),
                t,
                _int(ev.get("nbytes")),
            ),
        )

    def _ev_cend(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "UPDATE calls SET ended_at = ?, status = ? WHERE proc_id = ? AND call_id = ?",
            (t, str(ev.get("status")), proc.proc_id, int(ev["id"])),
        )

    def _merged_hist(self, sql: str, key: tuple, ev: dict[str, Any]) -> dict[str, int]:
        """A stats row's stored histogram plus the event's ``h``."""
        row = self.db.execute(sql, key).fetchone()
        hist = json.loads(row[0]) if row and row[0] else {}
        for bucket, n in dict(ev.get("h") or {}).items():
            hist[str(int(bucket))] = hist.get(str(int(bucket)), 0) + int(n)
        return hist

    def _ev_cstat(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        key = (proc.proc_id, str(ev["callee"]), str(ev["func"]), str(ev["kind"]))
        hist = self._merged_hist(
            "SELECT hist FROM call_stats WHERE proc_id = ? AND callee = ? AND func = ? AND kind = ?", key, ev
        )
        self._x(
            "INSERT INTO call_stats (restart, proc_id, caller, caller_rank, callee, func, kind, count, errors,"
            " timeouts, total_s, max_s, hist, updated_at, request_bytes)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (proc_id, callee, func, kind)"
            " DO UPDATE SET count = count + excluded.count, errors = errors + excluded.errors,"
            " request_bytes = coalesce(request_bytes, 0) + excluded.request_bytes,"
            " timeouts = timeouts + excluded.timeouts, total_s = total_s + excluded.total_s,"
            " max_s = max(max_s, excluded.max_s), hist = excluded.hist, updated_at = excluded.updated_at,"
            " caller = coalesce(excluded.caller, caller), caller_rank = coalesce(excluded.caller_rank, caller_rank)",
            (
                proc.restart,
                proc.proc_id,
                proc.name,
                proc.rpc_rank,
                *key[1:],
                int(ev.get("n", 0)),
                int(ev.get("err", 0)),
                int(ev.get("tmo", 0)),
                float(ev.get("sum", 0.0)),
                float(ev.get("max", 0.0)),
                _json(hist),
                t,
                max(0, _int(ev.get("bytes")) or 0),
            ),
        )

    def _ev_srv(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "INSERT OR REPLACE INTO serving (restart, proc_id, serve_id, worker, worker_rank, thread, func, nbytes,"
            " started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                proc.restart,
                proc.proc_id,
                int(ev["id"]),
                proc.name,
                proc.rpc_rank,
                _int(ev.get("thread")),
                str(ev.get("func")),
                _int(ev.get("nbytes")),
                t,
            ),
        )

    def _ev_send(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x("UPDATE serving SET ended_at = ? WHERE proc_id = ? AND serve_id = ?", (t, proc.proc_id, int(ev["id"])))

    def _ev_pgjoin(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x("UPDATE procs SET pg_join_at = coalesce(pg_join_at, ?) WHERE proc_id = ?", (t, proc.proc_id))

    def _ev_pgw(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        """Who the process is in the c10d world its init_process_group made (``rank.collectives``:
        sent before its groups): the collectives rows carry that rank and world from then on."""
        proc.dist_rank = _int(ev.get("rank"))
        proc.pg_world = self._world_of(proc, proc.dist_rank, ev, self._pg_worlds, self._next_pg_world, stays=True)
        self._x(
            "UPDATE procs SET dist_rank = ?, pg_world = ? WHERE proc_id = ?",
            (proc.dist_rank, proc.pg_world, proc.proc_id),
        )

    def _coll_key(self, proc: ProcInfo, ev: dict[str, Any]) -> tuple[int | None, int, str]:
        """(rank, world, pg) of a collectives row: the process's rank in its c10d world, where it has one."""
        rank = proc.dist_rank if proc.dist_rank is not None else proc.rank
        return rank, proc.pg_world, pg_label(str(ev["pg"]), proc.pg_world)

    def _ev_coll(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        done = int(ev["done"])
        self._x(
            "INSERT INTO coll_groups (restart, proc_id, rank, world, pg, name, size, entered, completed, completed_at,"
            " cur_seq, cur_op, cur_sizes, cur_dtypes, cur_bytes, cur_since, updated_at, ranks)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (proc_id, pg) DO UPDATE SET name = coalesce(excluded.name, name),"
            " size = coalesce(excluded.size, size), ranks = coalesce(excluded.ranks, ranks),"
            " completed_at = CASE WHEN excluded.completed > completed THEN excluded.completed_at ELSE completed_at END,"
            " entered = excluded.entered, completed = excluded.completed,"
            " cur_seq = excluded.cur_seq, cur_op = excluded.cur_op,"
            " cur_sizes = excluded.cur_sizes, cur_dtypes = excluded.cur_dtypes, cur_bytes = excluded.cur_bytes,"
            " cur_since = excluded.cur_since, updated_at = excluded.updated_at",
            (
                proc.restart,
                proc.proc_id,
                *self._coll_key(proc, ev),
                ev.get("name"),
                _int(ev.get("size")),
                int(ev["enq"]),
                done,
                t if done > 0 else None,
                _int(ev.get("seq")),
                ev.get("op"),
                _json(ev.get("sizes")),
                _json(ev.get("dtypes")),
                _int(ev.get("bytes")),
                ev.get("since"),
                t,
                _json(ev.get("ranks")),
            ),
        )

    def _ev_cop(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        rank, world, pg = self._coll_key(proc, ev)
        key = (proc.proc_id, pg, str(ev["op"]))
        hist = self._merged_hist("SELECT hist FROM coll_stats WHERE proc_id = ? AND pg = ? AND op = ?", key, ev)
        self._x(
            "INSERT INTO coll_stats (restart, proc_id, rank, world, pg, op, count, bytes, total_s, max_s, hist,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (proc_id, pg, op) DO UPDATE SET count = count + excluded.count,"
            " bytes = coalesce(bytes, 0) + excluded.bytes, total_s = total_s + excluded.total_s,"
            " max_s = max(max_s, excluded.max_s), hist = excluded.hist, updated_at = excluded.updated_at",
            (
                proc.restart,
                proc.proc_id,
                rank,
                world,
                *key[1:],
                max(0, int(ev.get("n") or 0)),
                max(0, _int(ev.get("bytes")) or 0),
                float(ev.get("sum") or 0.0),
                float(ev.get("max") or 0.0),
                _json(hist),
                t,
            ),
        )

    def _ev_cent(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "INSERT OR REPLACE INTO collectives (restart, proc_id, rank, world, pg, seq, op, sizes, dtypes, bytes,"
            " entered_at, completed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                proc.restart,
                proc.proc_id,
                *self._coll_key(proc, ev),
                int(ev["seq"]),
                ev.get("op"),
                _json(ev.get("sizes")),
                _json(ev.get("dtypes")),
                _int(ev.get("bytes")),
                ev.get("entered"),
                ev.get("completed"),
            ),
        )

    def _ev_shutdown(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        if ev.get("done"):
            self._x(
                "UPDATE procs SET rpc_shutdown_done_at = ?, autograd_contexts = ? WHERE proc_id = ?",
                (t, _int(ev.get("autograd_contexts")), proc.proc_id),
            )
        else:
            self._x(
                "UPDATE procs SET rpc_shutdown_at = coalesce(rpc_shutdown_at, ?) WHERE proc_id = ?", (t, proc.proc_id)
            )

    def _ev_bye(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        self._x(
            "UPDATE procs SET stopped_at = ?, last_seen = ?, dropped = ? WHERE proc_id = ?",
            (t, t, ev.get("dropped", 0), proc.proc_id),
        )

    def _ev_cexit(self, proc: ProcInfo, ev: dict[str, Any], t: float) -> None:
        """A process this one started ended: its exit status (minus the signal's number if a
        signal ended it), on the latest row of that pid whose parent this process is."""
        self._x(
            "UPDATE procs SET exit_code = ?"
            " WHERE proc_id = (SELECT max(proc_id) FROM procs WHERE pid = ? AND ppid = ? AND restart = ?)",
            (int(ev["code"]), int(ev["pid"]), proc.pid, proc.restart),
        )

    def heartbeat(self, proc: ProcInfo, t: float) -> None:
        self._x("UPDATE procs SET last_seen = ? WHERE proc_id = ?", (t, proc.proc_id))

    def _handle(self, proc: ProcInfo, rref_id: str, fork_id: str, role: str, t: float) -> None:
        self._x(
            "INSERT OR IGNORE INTO handles (restart, world, rref_id, fork_id, proc_id, holder, role, acquired_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (proc.restart, proc.world, rref_id, fork_id, proc.proc_id, proc.name, role, t),
        )


# Each event a process sends (``protocol.EVENT_FIELDS``; which family sends it: ``rank.families``)
# → the writer's method that stores it, keyed by the event's name: the one table ``apply`` reads.
# An event not here is not stored (``error``: the sender's own fault). A new event is its fields
# in ``protocol`` and one entry here (``tests/test_families.py`` checks both ways).
Handler = Callable[["StoreWriter", "ProcInfo", dict[str, Any], float], None]
HANDLERS: dict[str, Handler] = {
    "probe": StoreWriter._ev_probe,
    "rpc": StoreWriter._ev_rpc,
    "bye": StoreWriter._ev_bye,
    # RRefs
    "rref": StoreWriter._ev_rref,
    "conf": StoreWriter._ev_conf,
    "desc": StoreWriter._ev_desc,
    "vfree": StoreWriter._ev_vfree,
    "fork": StoreWriter._ev_fork,
    "rel": StoreWriter._ev_rel,
    "used": StoreWriter._ev_used,
    "churn": StoreWriter._ev_churn,
    "shutdown": StoreWriter._ev_shutdown,
    # calls
    "join": StoreWriter._ev_join,
    "cstat": StoreWriter._ev_cstat,
    "call": StoreWriter._ev_call,
    "cend": StoreWriter._ev_cend,
    "srv": StoreWriter._ev_srv,
    "send": StoreWriter._ev_send,
    # collectives
    "coll": StoreWriter._ev_coll,
    "cop": StoreWriter._ev_cop,
    "cent": StoreWriter._ev_cent,
    "pgjoin": StoreWriter._ev_pgjoin,
    "pgw": StoreWriter._ev_pgw,
    # children, steps
    "cexit": StoreWriter._ev_cexit,
    "loss": StoreWriter._ev_loss,
}
NOT_STORED = ("error",)


class ProcInfo:
    """What the server remembers of one connected process."""

    __slots__ = ("proc_id", "pid", "rank", "restart", "name", "rpc_rank", "world", "dist_rank", "pg_world")

    def __init__(self, proc_id: int, pid: int | None, rank: int | None, restart: int):
        self.proc_id, self.pid, self.rank, self.restart = proc_id, pid, rank, restart
        self.name: str | None = None
        self.rpc_rank: int | None = None
        self.world = 0  # the RPC world it joined (``StoreWriter._world_of``)
        self.dist_rank: int | None = None  # its rank in its c10d world, and which (``_ev_pgw``)
        self.pg_world = 0


# ---------------------------------------------------------------------------------------------
# Readers
