"""Every read of a run's telemetry store: the SQL beside ``schema.py``'s DDL and the writer, behind
named methods that the inspection SDK (``rpcctl.inspect``) calls. No other module holds SQL.

``StoreReader(run_dir)`` is one read: the connection, the run's meta, and 'now' (taken after
each query, so a row the server wrote meanwhile is never aged below its age). A store the server
has not created the tables of yet reads as empty; a damaged one is an ``RpcctlError``.

A method per question, named for what it returns (``procs(restart)``, ``open_calls``...); each
returns ``sqlite3.Row``s (or plain values) for the SDK to turn into typed records. Rows of a
store written by an older rpcctl may lack a column: ``column(row, key)`` reads it as None.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

from rpcctl.base.errors import DamagedRunError, RpcctlError
from rpcctl.records.runs import RunRecord, load_record
from rpcctl.base.states import RunStatus
from rpcctl.wire import protocol


SQLITE_HEADER = b"SQLite format 3\x00"
NEW_STORE_S = 10.0  # SQLite writes its header with the first commit, right after the file appears


def connect(path: Path) -> sqlite3.Connection | None:
    """A read-only connection, or None when the run has no telemetry store (yet). A file that
    is not one (empty for longer than a store takes to start, or not SQLite) raises
    ``DamagedRunError``: a damaged store must never read as a run that recorded nothing."""
    try:
        info = path.stat()
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DamagedRunError(path, exc.strerror or str(exc)) from None
    if not stat.S_ISREG(info.st_mode):
        return None
    if not header:
        if time.time() - info.st_mtime < NEW_STORE_S:
            return None
        raise DamagedRunError(path, "an empty file (0 bytes), not a telemetry store")
    if header != SQLITE_HEADER:
        raise DamagedRunError(path, "not an SQLite database")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0, check_same_thread=False)
    db.row_factory = sqlite3.Row
    return db


class StoreReader:
    """One read of a run's store: the connection, its meta, and 'now' for ages and states."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.db = connect(protocol.db_path(self.run_dir))
        self.meta = {}
        if self.db is not None:
            self.meta = {row["key"]: row["value"] for row in self._rows("SELECT key, value FROM meta")}
            self.meta = {k: loads(v) for k, v in self.meta.items()}
        self.closed_at: float | None = self.meta.get("closed_at")
        self.now = time.time()

    @property
    def live(self) -> bool:
        """The run is going on: its store is open and its launcher alive. A launcher killed
        with ``kill -9`` never closes the store: that run is over (``lost``) all the same."""
        return self.db is not None and self.closed_at is None and not self.launcher_gone

    @functools.cached_property
    def record(self) -> RunRecord | None:
        try:
            return load_record(self.run_dir)
        except RpcctlError:
            return None

    @functools.cached_property
    def launcher_gone(self) -> bool:
        """The run is ``lost``: its launcher died without ending it (read from run.json)."""
        return self.record is not None and self.record.effective_status == RunStatus.LOST

    def _rows(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        if self.db is None:
            return []
        try:
            rows = self.db.execute(sql, params).fetchall()
            self.now = time.time()  # after the read: a row the server wrote meanwhile is never aged below its age
            return rows
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []  # the server has not created the schema yet
            raise RpcctlError(f"cannot read {protocol.db_path(self.run_dir)}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise RpcctlError(f"cannot read {protocol.db_path(self.run_dir)}: {exc}") from None

    def close(self) -> None:
        if self.db is not None:
            self.db.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the run -------------------------------------------------------------------------------
    def latest_restart(self) -> int:
        rows = self._rows(
            "SELECT max(restart) AS r FROM (SELECT restart FROM ranks UNION ALL SELECT restart FROM procs)"
        )
        return int(rows[0]["r"]) if rows and rows[0]["r"] is not None else 0

    def schema_version(self) -> int | None:
        rows = self._rows("SELECT value FROM meta WHERE key = 'schema_version'")
        return int(rows[0]["value"]) if rows and str(rows[0]["value"]).isdigit() else None

    # -- ranks and processes -------------------------------------------------------------------
    def ranks(self, restart: int | None = None) -> list[sqlite3.Row]:
        """The launcher's ranks of one restart (by rank), or of every restart (by restart, rank)."""
        if restart is None:
            return self._rows("SELECT * FROM ranks ORDER BY restart, rank")
        return self._rows("SELECT * FROM ranks WHERE restart = ? ORDER BY rank", (restart,))

    def procs(self, restart: int | None = None, *, ordered: bool = False) -> list[sqlite3.Row]:
        """The processes that connected: of one restart, or of every restart (by ``proc_id``)."""
        if restart is None:
            return self._rows("SELECT * FROM procs ORDER BY proc_id")
        return self._rows(
            "SELECT * FROM procs WHERE restart = ?" + (" ORDER BY proc_id" if ordered else ""), (restart,)
        )

    def running_procs(self, restart: int) -> list[sqlite3.Row]:
        return self._rows("SELECT * FROM procs WHERE restart = ? AND ended_at IS NULL", (restart,))

    def ended_ranks(self, restart: int) -> list[sqlite3.Row]:
        """The restart's rank processes (not the ones they spawned) whose telemetry has ended."""
        return self._rows(
            "SELECT * FROM procs WHERE restart = ? AND ended_at IS NOT NULL AND kind = 'rank'", (restart,)
        )

    def spawned_name(self, rank: int, pid: int) -> str | None:
        rows = self._rows(
            "SELECT name FROM procs WHERE rank = ? AND pid = ? AND kind = 'child' AND name IS NOT NULL"
            " ORDER BY proc_id DESC LIMIT 1",
            (rank, pid),
        )
        return rows[0]["name"] if rows else None

    def ended_without_shutdown(self, restart: int) -> list[str]:
        rows = self._rows(
            "SELECT DISTINCT name FROM procs WHERE restart = ? AND rpc_join_at IS NOT NULL AND ended_at IS NOT NULL"
            " AND rpc_shutdown_at IS NULL AND name IS NOT NULL ORDER BY name",
            (restart,),
        )
        return [row["name"] for row in rows]

    def rank_of_name(self, restart: int) -> dict[str, int]:
        """RPC name → rank, for the ranks themselves (not the processes they spawned)."""
        rows = self._rows(
            "SELECT name, rank FROM procs WHERE restart = ? AND kind = 'rank' AND name IS NOT NULL", (restart,)
        )
        return {r["name"]: r["rank"] for r in rows}

    def joined_through_children(self, restart: int, column: str = "rpc_join_at") -> dict[int, float]:
        """rank → when the first process it spawned joined RPC (an mp.spawn program's ranks), or
        entered init_process_group (``column="pg_join_at"``)."""
        if column not in ("rpc_join_at", "pg_join_at"):
            raise ValueError(column)
        rows = self._rows(
            f"SELECT rank, min({column}) AS t FROM procs WHERE restart = ? AND kind = 'child'"
            f" AND {column} IS NOT NULL GROUP BY rank",
            (restart,),
        )
        return {r["rank"]: r["t"] for r in rows}

    def cpu_totals(self) -> sqlite3.Row | None:
        """Every process's CPU seconds and its telemetry's (``cpu``, ``telemetry``), summed; None
        for a store written before those columns (or none yet)."""
        columns = {row["name"] for row in self._rows("PRAGMA table_info(procs)")}
        if "telemetry_cpu_s" not in columns:
            return None
        return self._rows("SELECT sum(cpu_s) AS cpu, sum(telemetry_cpu_s) AS telemetry FROM procs")[0]

    def probes(self, restart: int) -> list[sqlite3.Row]:
        return self._rows(
            "SELECT p.rank, p.name, p.pid, p.kind, u.t, u.cpu_percent, u.rss_bytes FROM probes u"
            " JOIN procs p ON p.proc_id = u.proc_id WHERE p.restart = ? ORDER BY u.t",
            (restart,),
        )

    # -- RRefs ---------------------------------------------------------------------------------
    def rpc_workers(self, restart: int) -> list[sqlite3.Row]:
        return self._rows("SELECT * FROM rpc_workers WHERE restart = ?", (restart,))

    def rrefs(self, restart: int | None = None) -> list[sqlite3.Row]:
        """One restart's RRefs (by creation), or every restart's."""
        if restart is None:
            return self._rows("SELECT * FROM rrefs")
        return self._rows("SELECT * FROM rrefs WHERE restart = ? ORDER BY created_at, rref_id", (restart,))

    def handles(self, restart: int | None = None) -> list[sqlite3.Row]:
        if restart is None:
            return self._rows("SELECT * FROM handles")
        return self._rows("SELECT * FROM handles WHERE restart = ?", (restart,))

    def churn(self, restart: int) -> list[sqlite3.Row]:
        return self._rows("SELECT * FROM churn WHERE restart = ?", (restart,))

    # -- calls ---------------------------------------------------------------------------------
    def calls(self, restart: int | None = None, *, unfinished_only: bool = False) -> list[sqlite3.Row]:
        """One restart's long calls (oldest first; only those not ended), or every restart's."""
        if restart is None:
            return self._rows("SELECT * FROM calls")
        return self._rows(
            "SELECT * FROM calls WHERE restart = ?"
            + (" AND ended_at IS NULL" if unfinished_only else "")
            + " ORDER BY started_at",
            (restart,),
        )

    def serving(self, restart: int | None = None, *, unfinished_only: bool = False) -> list[sqlite3.Row]:
        """What processes ran for incoming calls, as ``calls``."""
        if restart is None:
            return self._rows("SELECT * FROM serving")
        return self._rows(
            "SELECT * FROM serving WHERE restart = ?"
            + (" AND ended_at IS NULL" if unfinished_only else "")
            + " ORDER BY started_at",
            (restart,),
        )

    def call_stats(self, restart: int) -> list[sqlite3.Row]:
        return self._rows("SELECT * FROM call_stats WHERE restart = ?", (restart,))

    def last_progress(self, restart: int) -> list[float]:
        """The latest marks of progress the store has: a call counted, a long call ended, a loss."""
        rows = self._rows(
            "SELECT (SELECT max(updated_at) FROM call_stats WHERE restart = ?) AS a,"
            " (SELECT max(ended_at) FROM calls WHERE restart = ?) AS b,"
            " (SELECT time FROM losses WHERE restart = ? ORDER BY id DESC LIMIT 1) AS c",
            (restart,) * 3,
        )
        return [m for m in (rows[0]["a"], rows[0]["b"], rows[0]["c"]) if m is not None] if rows else []

    # -- collectives ---------------------------------------------------------------------------
    def coll_groups(self, restart: int) -> list[sqlite3.Row]:
        """Process groups per rank (by rank, group), with ``proc_ended``: when their process ended."""
        return self._rows(
            "SELECT g.*, p.ended_at AS proc_ended FROM coll_groups g JOIN procs p USING (proc_id) WHERE g.restart = ?"
            " ORDER BY g.rank, g.pg",
            (restart,),
        )

    def running_coll_groups(self, restart: int) -> list[sqlite3.Row]:
        """The process groups of the processes still running."""
        return self._rows(
            "SELECT * FROM coll_groups WHERE restart = ? AND proc_id IN (SELECT proc_id FROM procs"
            " WHERE restart = ? AND ended_at IS NULL)",
            (restart, restart),
        )

    def coll_stats(self, restart: int) -> list[sqlite3.Row]:
        return self._rows("SELECT * FROM coll_stats WHERE restart = ? ORDER BY pg, op", (restart,))

    def sampled_collectives(self, restart: int, limit: int) -> list[sqlite3.Row]:
        """(pg, seq, rank, entered_at, proc_id) of the last ``limit`` sampled collectives."""
        return self._rows(
            "SELECT pg, seq, rank, entered_at, proc_id FROM collectives WHERE restart = ? ORDER BY rowid DESC LIMIT ?",
            (restart, limit),
        )

    def collective_spans(self) -> list[sqlite3.Row]:
        """Every sampled collective a rank entered, with its group's name (every restart)."""
        return self._rows(
            "SELECT c.*, g.name FROM collectives c LEFT JOIN coll_groups g USING (proc_id, pg)"
            " WHERE c.entered_at IS NOT NULL"
        )

    def collectives_in_flight(self) -> list[sqlite3.Row]:
        """The groups whose latest collective was entered and has not completed (every restart)."""
        return self._rows(
            "SELECT * FROM coll_groups WHERE cur_seq IS NOT NULL AND cur_since IS NOT NULL AND entered > completed"
        )

    # -- losses --------------------------------------------------------------------------------
    def losses(self, restart: int | None = None, *, last: int | None = None) -> list[sqlite3.Row]:
        """Loss rows in arrival order: of one restart (``last``: each rank and source's latest
        ``last``), or of every restart."""
        if restart is None:
            return self._rows("SELECT * FROM losses ORDER BY id")
        if last is None:
            return self._rows("SELECT * FROM losses WHERE restart = ? ORDER BY id", (restart,))
        return self._rows(
            "SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY rank, source ORDER BY id DESC) AS k"
            " FROM losses WHERE restart = ?) WHERE k <= ? ORDER BY id",
            (restart, last),
        )

    def recent_loss_times(self, restart: int, recent: int) -> list[sqlite3.Row]:
        """(rank, restart, time, source) of the store's latest ``recent`` losses, of this restart."""
        return self._rows(
            "SELECT rank, restart, time, source FROM losses WHERE restart = ?"
            " AND id > (SELECT coalesce(max(id), 0) - ? FROM losses) AND time IS NOT NULL",
            (restart, recent),
        )

    def log_lines(self, restart: int) -> list[sqlite3.Row]:
        return self._rows("SELECT rank, lines, matched FROM log_lines WHERE restart = ?", (restart,))


def has_telemetry(run_dir: Path) -> bool:
    return protocol.db_path(run_dir).is_file()


def loads(text: str | None) -> Any:
    """A JSON column's value; None for NULL or text that is not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def column(row: sqlite3.Row | None, key: str) -> Any:
    """A column that stores written by an older rpcctl may lack."""
    return row[key] if row is not None and key in row.keys() else None
