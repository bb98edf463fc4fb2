"""Options shared by several commands, so the same flag means the same thing everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rpcctl.console import Column
from rpcctl.errors import UsageError

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


FilterOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--filter", metavar="KEY=VALUE", show_default=False,
        help="Only the rows whose KEY says VALUE (a column's key, as in --json; repeat to require several).",
    ),
]


@dataclass(frozen=True)
class Filter:
    """One ``--filter KEY=VALUE``, checked against a view's declared columns."""

    column: Column
    value: str

    def __str__(self) -> str:
        return f"{self.column.key}={self.value}"

    def matches(self, record: Any) -> bool:
        """VALUE is the raw value as text (what --json says) or the cell as the table shows it."""
        raw = self.column.value(record)
        return (raw is not None and str(raw) == self.value) or self.column.cell(record).plain == self.value


def parse_filters(specs: list[str] | None, columns: Sequence[Column]) -> list[Filter]:
    """``--filter`` arguments → filters; a malformed one or an unknown key is a usage error
    that names the valid keys (the view's column keys)."""
    keys = ", ".join(c.key for c in columns)
    filters = []
    for spec in specs or []:
        key, sep, value = spec.partition("=")
        column = next((c for c in columns if c.key == key.strip()), None)
        if not sep or not key.strip():
            raise UsageError(f"--filter '{spec}': expected KEY=VALUE (valid keys: {keys})")
        if column is None:
            raise UsageError(f"--filter '{spec}': unknown key '{key.strip()}' (valid keys: {keys})")
        filters.append(Filter(column, value.strip()))
    return filters


def keep(records: Sequence[Any], filters: Sequence[Filter]) -> list[Any]:
    return [r for r in records if all(f.matches(r) for f in filters)]


def filtered_empty(things: str, filters: Sequence[Filter]) -> str | None:
    """``no_match`` for ``--filter``: ``no runs match status=failed``; None without a filter."""
    return no_match(things, **{f.column.key: f.value for f in filters})

