"""Panels for ``rpcctl launch``'s live view: RRefs per owner, latest losses per rank, stragglers.

``dashboard_panels(run_dir)`` is called by the live view. It reads through the inspect SDK, one
fresh read of the store per call (never a connection held open: the server switches the file
out of WAL mode when the run ends, which needs it to itself).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from rich.text import Text

from rpcctl import inspect
from rpcctl.console import render_table, sanitize
from rpcctl.base.errors import RpcctlError

# The last losses of each rank the trend is drawn from, and the loss columns the panel shows.
TREND_STEPS = 24
LOSS_COLUMNS = ("rank", "last_at", "last", "trend")


def dashboard_panels(run_dir: Path) -> list[Any]:
    """Rich renderables for the live view; [] when the run has no telemetry (yet). Read through
    the inspect SDK, so the panel says what ``rpcctl inspect rrefs`` and ``inspect losses`` say."""
    run_dir = Path(run_dir)
    if not inspect.has_telemetry(run_dir):
        return []
    try:
        owners = inspect.rref_owners(run_dir)
        summaries = inspect.loss_summaries(inspect.losses(run_dir, last=TREND_STEPS))
    except (RpcctlError, sqlite3.Error):  # a store being created or switched out of WAL: next frame
        return []
    panels: list[Any] = []
    if owners:
        rrefs = inspect.view("rrefs")  # the panels name the views of inspect.VIEWS as every surface does
        panels.append(
            render_table(
                owners,
                inspect.OwnerSummary.COLUMNS,
                title=f"{rrefs.title} by owner",
                hint=f"rpcctl inspect {rrefs.word} shows them",
            )
        )
    if summaries:
        columns = [c for c in inspect.LossSummary.COLUMNS if c.key in LOSS_COLUMNS]
        losses = inspect.view("losses")
        panels.append(
            render_table(summaries, columns, title=losses.title, hint=f"rpcctl inspect {losses.word} shows them")
        )
    slow = _stragglers(Path(run_dir))
    if slow:
        panels.append(Text("\n".join(f"STRAGGLER: {sanitize(s.describe())}" for s in slow), style="yellow"))
    return panels


def _stragglers(run_dir: Path) -> list[Any]:
    from rpcctl.inspect import stragglers

    try:
        return stragglers(run_dir)
    except Exception:  # a store being switched out of WAL mode at the run's end: next frame
        return []
