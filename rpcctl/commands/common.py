"""Options shared by several commands, so the same flag means the same thing everywhere."""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rpcctl.console import Column
from rpcctl.base.errors import UsageError

RunsDirOption = Annotated[
    Optional[Path],
    typer.Option("--runs-dir", help="Where runs live (default: ./runs, or $RPCCTL_RUNS_DIR).", show_default=False),
]
RunArgument = Annotated[
    Optional[str],
    typer.Argument(
        metavar="RUN",
        help="Run id (or a unique prefix) or run directory (default: the latest run).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document (raw units) instead of a table.")]
WideOption = Annotated[bool, typer.Option("--wide", help="Show every column.")]
WatchOption = Annotated[
    bool, typer.Option("--watch", "-w", help="Refresh the view until the run ends (Ctrl-C to stop).")
]


def rank_option(what: str = "Only this rank", default: str = "every rank") -> Any:
    """``--rank/-r N``, repeatable wherever a command takes a rank: ``-r 0 -r 2``."""
    return typer.Option(
        "--rank", "-r", metavar="N", help=f"{what}; repeatable (default: {default}).", show_default=False
    )


RankOption = Annotated[Optional[list[int]], rank_option()]


def output_option(what: str, *aliases: str) -> Any:
    """``--output/-o FILE``: the file a command writes, the same flag everywhere (``aliases``:
    old spellings that users' scripts still use)."""
    return typer.Option("--output", "-o", *aliases, help=what, show_default=False)


def no_match(things: str, **filters: object) -> str | None:
    """What an empty filtered view says (it exits 0): ``no RRefs match owner=worker1, state=live``;
    None when no filter was given."""
    given = ", ".join(f"{key}={value}" for key, value in filters.items() if value is not None)
    return f"no {things} match {given}" if given else None


FilterOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--filter",
        metavar="KEY=VALUE",
        show_default=False,
        help="Only the rows whose KEY says VALUE; also KEY!=VALUE, and KEY>N (>=, <, <=) for numbers in raw units "
        "and for times (started_at>=2026-12-01). KEY: a key of --json or a column's header; repeat to require several.",
    ),
]

_OPERATOR_CHARS = re.compile(r"[=!<>]")
_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Filter:
    """One ``--filter KEY OP VALUE``, checked against a view's declared columns and keys."""

    column: Column
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.column.key}{self.op}{self.value}"

    def matches(self, record: Any) -> bool:
        raw = self.column.value(record)
        if self.op in ("=", "=="):
            return self._says(record, raw)
        if self.op == "!=":
            return not self._says(record, raw)
        compare = _ORDER[self.op]
        number = _number(self.value)
        if number is not None:  # numbers as numbers: 10 > 9
            return isinstance(raw, (int, float)) and not isinstance(raw, bool) and compare(raw, number)
        return isinstance(raw, str) and compare(raw, self.value)  # ISO times sort as text

    def _says(self, record: Any, raw: Any) -> bool:
        """VALUE is the raw value as text (what --json says) or the cell as the table shows it."""
        if isinstance(raw, bool):  # as --json writes it: true, false
            return self.value.lower() == ("true" if raw else "false")
        return (raw is not None and str(raw) == self.value) or self.column.cell(record).plain == self.value


def parse_filters(specs: list[str] | None, columns: Sequence[Column], fields: Sequence[str] = ()) -> list[Filter]:
    """``--filter`` arguments → filters. KEY is a column's key, one of ``fields`` (the record's
    other JSON keys), or a column's header (``rank``, ``duration``: any case, ``_`` for a
    space). A malformed one, an unknown key or a comparison with nothing to compare is a usage
    error that names the valid keys. A display column (``Column.shows``) filters on the field it
    shows: ``RANK`` is ``rank``; its own key (``rank_shown``) is no filter key."""
    compared = [Column(c.shows) if c.shows else c for c in columns]  # in the columns' order
    by_key = {c.key: c for c in compared} | {f: Column(f) for f in fields if f not in {c.key for c in compared}}
    by_header = {_header_key(c.title): k for c, k in zip(columns, compared)}
    keys = ", ".join(by_key)
    filters = []
    for spec in specs or []:
        split = _split_filter(spec)
        if split is None:
            raise UsageError(
                f"--filter '{spec}': expected KEY=VALUE, KEY!=VALUE or KEY>N (>=, <, <=) (valid keys: {keys})"
            )
        key, op, value = split
        column = by_key.get(key) or by_header.get(_header_key(key))
        if column is None:
            raise UsageError(f"--filter '{spec}': unknown key '{key}' (valid keys: {keys}; or a column's header)")
        number = _number(value)
        if op in _ORDER and (not value or (number is not None and not math.isfinite(number))):
            raise UsageError(f"--filter '{spec}': {op} needs a number or a time to compare with")
        filters.append(Filter(column, op, value))
    return filters


def _split_filter(spec: str) -> tuple[str, str, str] | None:
    """KEY, OP, VALUE at the first operator, in one pass (a regex with a lazy KEY took seconds
    on a long argument without one); None when there is no KEY or no operator."""
    found = _OPERATOR_CHARS.search(spec)
    if found is None:
        return None
    at = found.start()
    op = spec[at : at + 2] if spec[at : at + 2] in ("!=", ">=", "<=", "==") else spec[at]
    key = spec[:at].strip()
    if op == "!" or not key:
        return None
    return key, op, spec[at + len(op) :].strip()


def _header_key(title: str) -> str:
    return title.strip().lower().replace(" ", "_")


def scalar_fields(record_type: type) -> list[str]:
    """The fields of a record dataclass that hold one value (text, a number, a state, or none):
    the JSON keys that ``--filter`` can compare. Lists and nested records are left out, so a
    header can name its column (``runs``: RANKS is ``world_size``, not the ``ranks`` list)."""
    hints = typing.get_type_hints(record_type)

    def scalar(hint: Any) -> bool:
        return typing.get_origin(hint) is None and isinstance(hint, type) and issubclass(hint, (str, int, float))

    names = []
    for field in dataclasses.fields(record_type):
        hint = hints[field.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(hint) if a is not type(None)]
        else:
            options = [hint]
        if all(scalar(option) for option in options):
            names.append(field.name)
    return names


def keep(records: Sequence[Any], filters: Sequence[Filter]) -> list[Any]:
    return [r for r in records if all(f.matches(r) for f in filters)]


def filtered_empty(things: str, filters: Sequence[Filter]) -> str | None:
    """What an empty filtered view says: ``no runs match status=failed, duration_s>60``; None
    without a filter."""
    return f"no {things} match {', '.join(map(str, filters))}" if filters else None


def check_output(path: Path, flag: str = "") -> None:
    """Exit 2 before any work if an output target cannot be written: it is not a regular file
    (a device, a FIFO, a directory, a link), or its folder takes not one byte (a full disk)
    (``private.check_writable``)."""
    from rpcctl.base.private import check_writable

    output_to(path, check_writable, flag)


def write_output(path: Path, data: str | bytes, flag: str = "") -> None:
    """An output file (-o): a new 0600 file renamed into place (``private.write_private_atomic``,
    the one writer of every file a user names); a failure is one message, exit 2 (``flag``
    names the option in it), and leaves the old file as it was."""
    from rpcctl.base.private import write_private_atomic

    output_to(path, lambda p: write_private_atomic(p, data), flag)


def output_to(path: Path, write: Callable[[Path], Any], flag: str = "") -> None:
    """``write(path)``; an ``OSError`` becomes one message naming the path (and flag), exit 2."""
    try:
        write(path)
    except OSError as exc:
        raise UsageError(f"{flag + ' ' if flag else ''}cannot write {path}: {exc.strerror or exc}") from None
