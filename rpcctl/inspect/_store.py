"""A read of a run's telemetry store, shared by every view: ``_Store`` (connection, meta and
'now'), and small helpers for its rows."""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from rpcctl.errors import RpcctlError
from rpcctl.runs import RunRecord, load_record
from rpcctl.states import RunStatus
from rpcctl.telemetry import protocol, store


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

    def rows(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
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


def _column(row: sqlite3.Row | None, key: str) -> Any:
    """A column that stores written by an older rpcctl may lack."""
    return row[key] if row is not None and key in row.keys() else None
