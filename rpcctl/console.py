"""The only place that owns Rich consoles and turns records into tables or JSON.

Results go to stdout, messages and progress to stderr. ``--json`` output is one document of
plain data in raw units (bytes, seconds, ISO-8601 times), ``[]`` when empty, and no banners.
Tests inject their own ``Console`` (fixed width, no colour) through ``set_console``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from rich.console import Console as RichConsole
from rich.table import Table
from rich.text import Text


class Console:
    def __init__(self, out: RichConsole | None = None, err: RichConsole | None = None):
        no_color = bool(os.environ.get("NO_COLOR"))
        # Piped output (grep, a file) keeps whole rows: Rich would otherwise cut tables at 80
        # columns. A terminal, or COLUMNS, still sets the width.
        width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 4096
        self.out = out or RichConsole(highlight=False, no_color=no_color, soft_wrap=False, width=width)
        self.err = err or RichConsole(stderr=True, highlight=False, no_color=no_color, soft_wrap=True)

    @property
    def is_terminal(self) -> bool:
        return self.out.is_terminal

    def print(self, *objects: Any, **kwargs: Any) -> None:
        self.out.print(*objects, **kwargs)

    def info(self, message: str) -> None:
        self.err.print(sanitize(message), markup=False)

    def note(self, message: str) -> None:
        self.err.print(f"[dim]{sanitize(message, markup=True)}[/dim]")

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/yellow] {sanitize(message, markup=True)}")

    def error(self, message: str) -> None:
        self.err.print(f"[bold red]error:[/bold red] {sanitize(message, markup=True)}")

    def raw(self, text: str) -> None:
        """Text that must reach stdout byte for byte (a script, a file's content)."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def json(self, document: Any) -> None:
        # Plain write, not Rich: JSON must never be wrapped, highlighted or re-flowed.
        sys.stdout.write(json.dumps(to_jsonable(document), indent=2) + "\n")
        sys.stdout.flush()


# SGR ("select graphic rendition": colour, bold) is the one escape sequence a rank's output may
# send to a terminal. Everything else (OSC: window title, clipboard writes; CSI: cursor moves,
# screen clears; C1 controls; bidi overrides that reorder what is shown) is made visible.
_SGR_OR_INVISIBLE = re.compile(r"(\x1b\[[0-9;:]*m)|[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    found = match.group()  # one invisible character, or a whole SGR sequence: show its ESC
    code = ord(found[0])
    return (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}") + found[1:]


def sanitize(text: str, *, sgr: bool = False, markup: bool = False) -> str:
    """Text that came from a rank or a file, made safe for a terminal: control characters and
    escape sequences shown as ``\\x1b``-style codes (tabs and newlines kept). ``sgr=True`` lets
    colour sequences through (streamed rank output); ``markup=True`` also escapes Rich markup,
    for text embedded in a markup string. The one place that decides what reaches a terminal."""
    text = _SGR_OR_INVISIBLE.sub(lambda m: m.group() if sgr and m.group(1) else _visible(m), text)
    if markup:
        from rich.markup import escape

        text = escape(text)
    return text


_console: Console | None = None


def get_console() -> Console:
    global _console
    if _console is None:
        _console = Console()
    return _console


def set_console(console: Console | None) -> None:
    global _console
    _console = console


# ---------------------------------------------------------------------------------------------
# Records → tables / JSON


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a record type, declared once: the table and the JSON both come from it.

    ``key`` is the record's attribute and the JSON key; ``fmt`` humanises the raw value for the
    table only; ``detail`` columns are left out of the table unless asked for; ``wrap`` columns
    (long free text) wrap on a narrow terminal, so that the others (names, ids, status) are
    never cut.
    """

    key: str
    header: str | None = None
    fmt: Callable[[Any], str] | None = None
    justify: str = "left"
    detail: bool = False
    wrap: bool = False

    @property
    def title(self) -> str:
        return self.header or self.key.replace("_", " ").upper()

    def cell(self, record: Any) -> Text:
        """The value as plain text: never parsed as markup, control characters made visible."""
        value = record.get(self.key) if isinstance(record, dict) else getattr(record, self.key)
        if value is None:
            return Text("-")
        try:
            shown = self.fmt(value) if self.fmt else str(value)
        except (TypeError, ValueError):  # a value of the wrong type from a damaged record
            shown = repr(value)
        return Text(sanitize(shown))


def render_table(
    records: Sequence[Any],
    columns: Sequence[Column],
    *,
    title: str | None = None,
    detail: bool = False,
    empty: str = "nothing to show",
) -> Table | str:
    if not records:
        return empty
    shown = [c for c in columns if detail or not c.detail]
    table = Table(title=title, title_justify="left", header_style="bold", box=None, pad_edge=False)
    for column in shown:
        table.add_column(column.title, justify=column.justify, no_wrap=not column.wrap, overflow="fold" if column.wrap else "ellipsis")
    for record in records:
        table.add_row(*(column.cell(record) for column in shown))
    return table


def to_jsonable(value: Any) -> Any:
    """Plain JSON data in raw units: dataclasses → dicts, datetimes → ISO-8601, NaN → null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "__fspath__"):
        return os.fspath(value)
    if hasattr(value, "value") and hasattr(type(value), "__members__"):  # Enum
        return value.value
    return value


# ---------------------------------------------------------------------------------------------
# Humanising formatters (tables only; JSON keeps raw units)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    minutes, seconds = divmod(int(s), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def human_time(ts: float | str) -> str:
    """A wall-clock time (epoch seconds or ISO-8601) as local HH:MM:SS, with the date if not today."""
    moment = datetime.fromisoformat(ts) if isinstance(ts, str) else datetime.fromtimestamp(ts, timezone.utc)
    local = moment.astimezone()
    return local.strftime("%H:%M:%S" if local.date() == datetime.now().date() else "%Y-%m-%d %H:%M")


def iso_time(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat()


def join(values: Iterable[Any]) -> str:
    return ",".join(str(v) for v in values) or "-"
