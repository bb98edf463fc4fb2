"""The one list of views (``VIEWS``): each a name, its record type, its reader and its title.
Every surface draws from it under that name: ``rpcctl inspect NAME`` (``commands/inspect.py``
gives a view its flags and table; a view it adds nothing to is a table of ``record.COLUMNS`` and
its ``--json``), the report's and the live page's section ``NAME`` (``web/tables.py``: the
found records as a table of the same columns, unless it draws the view its own way; the live
page's JSON carries the same sections), and the terminal's live panels (``views/dashboard.py``).

A new view is a reader (``read(run_dir)`` → records, or a report), a record type declaring its
``COLUMNS``, and one entry here. ``command``: the word ``rpcctl inspect`` takes where users know
another (``inspect gpus`` is the placement view).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpcctl.inspect.calls import CallsReport, calls
from rpcctl.inspect.collectives import CollectivesReport, collectives
from rpcctl.inspect.gpus import PlacementRecord, placement
from rpcctl.inspect.losses import LossRecord, losses
from rpcctl.inspect.rrefs import RRefRecord, rrefs
from rpcctl.inspect.workers import WorkerRecord, workers


@dataclass(frozen=True)
class View:
    """``read(run_dir)``: what the view shows now (a list of ``record``, or one report of that
    type); ``title``: its heading on every page; ``command``: its word in ``rpcctl inspect``."""

    name: str
    record: type
    read: Callable[[Path], Any]
    title: str
    command: str = ""

    @property
    def word(self) -> str:
        return self.command or self.name


# In the report's order (after the run and its timeline).
VIEWS: list[View] = [
    View("losses", LossRecord, losses, "Losses"),
    View("rrefs", RRefRecord, rrefs, "RRefs"),
    View("placement", PlacementRecord, placement, "Placement", command="gpus"),
    View("workers", WorkerRecord, workers, "Workers"),
    View("calls", CallsReport, calls, "In-flight calls"),
    View("collectives", CollectivesReport, collectives, "Collectives"),
]


def view(name: str) -> View:
    """The view of that name (KeyError for none)."""
    for entry in VIEWS:
        if entry.name == name:
            return entry
    raise KeyError(name)


def read_all(run_dir: Path) -> dict[str, Any]:
    """Every view's records now, by name (one read of each)."""
    return {entry.name: entry.read(run_dir) for entry in VIEWS}
