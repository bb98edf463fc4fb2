"""Panels for ``rpcctl launch``'s live view: RRefs per owner, latest losses per rank, stragglers.

``dashboard_panels(run_dir)`` is called about four times a second by the live view. It runs
three small aggregate queries on a fresh read-only connection (never one held open: the
server switches the file out of WAL mode when the run ends, which needs it to itself).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from rpcctl.console import human_bytes, sanitize
from rpcctl.inspect import sparkline
from rpcctl.telemetry import protocol, store

_OWNERS = """
SELECT coalesce(r.owner, w.name, '?') AS owner, count(*) AS n, sum(coalesce(r.nbytes, 0)) AS bytes
FROM rrefs r
LEFT JOIN rpc_workers w ON w.restart = r.restart AND w.rpc_rank = r.owner_rank
WHERE r.restart = ?1 AND r.value_freed_at IS NULL
  AND EXISTS (SELECT 1 FROM handles h WHERE h.restart = r.restart AND h.rref_id = r.rref_id AND h.released_at IS NULL)
GROUP BY 1 ORDER BY 1
"""
_CHURN = "SELECT owner, sum(count) AS n FROM churn WHERE restart = ?1 GROUP BY owner"
_LOSSES = """
SELECT rank, epoch, step, loss FROM (
  SELECT rank, epoch, step, loss, row_number() OVER (PARTITION BY rank ORDER BY id DESC) AS k
  FROM losses WHERE restart = ?1
    AND NOT (source = 'log' AND rank IN (SELECT rank FROM losses WHERE restart = ?1 AND source = 'report'))
) WHERE k <= 24 ORDER BY rank, k DESC
"""

def dashboard_panels(run_dir: Path) -> list[Any]:
    """Rich renderables for the live view; [] when the run has no telemetry (yet)."""
    try:
        db = store.connect(protocol.db_path(Path(run_dir)))
    except sqlite3.Error:
        return []
    if db is None:
        return []
    try:
        db.row_factory = None
        restart = db.execute("SELECT max(restart) FROM (SELECT restart FROM ranks UNION ALL SELECT restart FROM procs)").fetchone()[0] or 0
        owners = db.execute(_OWNERS, (restart,)).fetchall()
        churn = {row[0]: row[1] for row in db.execute(_CHURN, (restart,))}
        losses = db.execute(_LOSSES, (restart,)).fetchall()
    except sqlite3.Error:
        return []
    finally:
        db.close()
    panels: list[Any] = []
    if owners or churn:
        table = Table(title="RRefs by owner", title_justify="left", header_style="bold", box=None, pad_edge=False)
        for header in ("OWNER", "LIVE", "BYTES", "SHORT-LIVED"):
            table.add_column(header, justify="left" if header == "OWNER" else "right", no_wrap=True)
        seen = set()
        for owner, count, nbytes in owners:
            seen.add(owner)
            table.add_row(Text(sanitize(str(owner))), str(count), human_bytes(nbytes or 0), str(churn.get(owner, 0)))
        for owner in sorted(set(churn) - seen):
            table.add_row(Text(sanitize(str(owner))), "0", human_bytes(0), str(churn[owner]))
        panels.append(table)
    if losses:
        # The latest record of each rank: the value the table's last row and LAST show.
        table = Table(title="Losses", title_justify="left", header_style="bold", box=None, pad_edge=False)
        for header, justify in (("RANK", "right"), ("AT", "left"), ("LOSS", "right"), ("TREND", "left")):
            table.add_column(header, justify=justify, no_wrap=True)
        by_rank: dict[int, list[tuple[int | None, int | None, float | None]]] = {}
        for rank, epoch, step, loss in losses:
            by_rank.setdefault(rank, []).append((epoch, step, loss))
        for rank, rows in sorted(by_rank.items()):
            epoch, step, loss = rows[-1]
            at = " ".join([f"epoch {epoch}"] * (epoch is not None) + [f"step {step}"] * (step is not None)) or "-"
            table.add_row(str(rank), at, "-" if loss is None else f"{loss:.6g}", sparkline([r[2] for r in rows]))
        panels.append(table)
    slow = _stragglers(Path(run_dir))
    if slow:
        panels.append(Text("\n".join(f"STRAGGLER: {s.describe()}" for s in slow), style="yellow"))
    return panels


def _stragglers(run_dir: Path) -> list[Any]:
    from rpcctl.inspect import stragglers

    try:
        return stragglers(run_dir)
    except Exception:  # a store being switched out of WAL mode at the run's end: next frame
        return []
