"""Options shared by several commands, so the same flag means the same thing everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

RunsDirOption = Annotated[
    Optional[Path],
    typer.Option("--runs-dir", help="Where runs live (default: ./runs, or $RPCCTL_RUNS_DIR).", show_default=False),
]
RunArgument = Annotated[
    Optional[str],
    typer.Argument(metavar="RUN", help="Run id (or a unique prefix) or run directory (default: the latest run).", show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document (raw units) instead of a table.")]
WatchOption = Annotated[bool, typer.Option("--watch", "-w", help="Refresh the view until the run ends (Ctrl-C to stop).")]


def no_match(things: str, **filters: object) -> str | None:
    """What an empty filtered view says (it exits 0): ``no RRefs match owner=worker1, state=live``;
    None when no filter was given."""
    given = ", ".join(f"{key}={value}" for key, value in filters.items() if value is not None)
    return f"no {things} match {given}" if given else None
