"""The only place that owns Rich consoles and turns records into tables or JSON.

Results go to stdout, messages and progress to stderr. ``--json`` output is one document of
plain data in raw units (bytes, seconds, ISO-8601 times), ``[]`` when empty, and no banners.
Tests inject their own ``Console`` (fixed width, no colour) through ``set_console``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from rich.console import Console as RichConsole
from rich.table import Table
from rich.text import Text


class _Serialised:
    """A live panel's console whose every print holds the panel's lock (``Console.above``)."""

    def __init__(self, console: RichConsole, lock: Any):
        self.console, self.lock = console, lock

    @property
    def is_terminal(self) -> bool:
        return self.console.is_terminal

    def print(self, *objects: Any, **kwargs: Any) -> None:
        with self.lock:
            self.console.print(*objects, **kwargs)


class Console:
    """stdout for results, stderr for messages; while ``logging_to(path)`` holds, every message
    (info, note, warning, error, detail) is also appended to ``path`` as plain text, one
    UTC-timestamped line each: the launcher keeps its own story in ``launcher.log`` so."""

    def __init__(self, out: RichConsole | None = None, err: RichConsole | None = None):
        no_color = bool(os.environ.get("NO_COLOR"))
        # Piped output (grep, a file) keeps whole rows: Rich would otherwise cut tables at 80
        # columns. A terminal, or COLUMNS, still sets the width.
        width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 4096
        self.out = out or RichConsole(highlight=False, no_color=no_color, soft_wrap=False, width=width)
        self.err = err or RichConsole(stderr=True, highlight=False, no_color=no_color, soft_wrap=True)
        self._log: IO[str] | None = None
        self._log_path: Path | None = None
        self._above: _Serialised | None = None  # a live panel's console, while one is drawn

    @contextlib.contextmanager
    def logging_to(self, path: Path) -> Iterator[None]:
        """Also append every message to ``path`` (created 0600) until the block ends. A log
        that cannot be written (a full disk) is given up with one warning: never the job."""
        from rpcctl.base.private import private_open

        if self._log is not None:  # already logging (a nested block): one file at a time
            yield
            return
        try:
            self._log, self._log_path = private_open(path, "a", encoding="utf-8", errors="backslashreplace"), path
        except OSError as exc:
            self.err.print(
                f"[yellow]warning:[/yellow] cannot write {sanitize(str(path), markup=True)}:"
                f" {sanitize(exc.strerror or str(exc), markup=True)}"
            )
        try:
            yield
        finally:
            log, self._log = self._log, None
            if log is not None:
                with contextlib.suppress(OSError):
                    log.close()

    @contextlib.contextmanager
    def above(self, live: RichConsole, lock: Any) -> Iterator[None]:
        """While a live panel is drawn on ``live``: streamed lines (``stream``) and, on a terminal,
        messages print through it, above the panel; written straight to the terminal they would
        land inside the panel and leave a stale copy of it behind. ``lock`` is the one the panel
        redraws under: each print holds it from start to end, because Rich works out how many
        lines of the old frame to erase before it takes its own write lock, so two threads
        printing at once (the ranks' pumps, the launcher) would each draw a frame and erase one."""
        saved = self.err
        self._above = _Serialised(live, lock)
        if self.err.is_terminal:
            self.err = self._above
        try:
            yield
        finally:
            self.err, self._above = saved, None

    def stream(self, line: str) -> None:
        """One line of a rank's output, made safe by the caller (``sanitize(sgr=True)``: its colour
        kept), to stdout."""
        above = self._above
        if above is not None:
            above.print(Text.from_ansi(line), highlight=False, soft_wrap=True)
        else:
            self.raw(line + "\n")

    def _to_log(self, level: str, message: str) -> None:
        log = self._log
        if log is None:
            return
        stamp = utc_stamp(time.time())
        text = sanitize(message).replace("\n", "\n" + " " * (len(stamp) + 1))
        try:
            log.write(f"{stamp} {level}{text}\n")
            log.flush()
        except OSError as exc:
            self._log = None
            self.err.print(
                f"[yellow]warning:[/yellow] stopped writing {sanitize(str(self._log_path), markup=True)}: "
                f"{sanitize(exc.strerror or str(exc), markup=True)}"
            )
            with contextlib.suppress(OSError):
                log.close()

    @property
    def is_terminal(self) -> bool:
        return self.out.is_terminal

    def print(self, *objects: Any, **kwargs: Any) -> None:
        self.out.print(*objects, **kwargs)

    def info(self, message: str) -> None:
        self.err.print(sanitize(message), markup=False)
        self._to_log("", message)

    def note(self, message: str) -> None:
        self.err.print(f"[dim]{sanitize(message, markup=True)}[/dim]")
        self._to_log("", message)

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/yellow] {sanitize(message, markup=True)}")
        self._to_log("warning: ", message)

    def error(self, message: str) -> None:
        self.err.print(f"[bold red]error:[/bold red] {sanitize(message, markup=True)}")
        self._to_log("error: ", message)

    def detail(self, message: str, *, label: str = "", style: str | None = None) -> None:
        """A message's further lines (a root cause, a traceback): ``label`` in bold, then the
        text, which is data (escaped, never markup)."""
        text = Text.assemble((label, "bold"), " " if label else "", sanitize(message), style=style or "")
        self.err.print(text, highlight=False)
        self._to_log(f"{label} " if label else "", message)

    def raw(self, text: str) -> None:
        """Text that must reach stdout byte for byte (a script, a file's content)."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def raw_bytes(self, data: bytes) -> None:
        """Bytes that must reach stdout as they are (``rpcctl logs --raw``)."""
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

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


# Column priorities: a key column (ids, names, status) is never hidden nor cut; on a narrow
# terminal the columns of the highest priority number are hidden first (rightmost first).
KEY, HIGH, NORMAL, LOW = 0, 1, 2, 3
WRAP_MIN = 20  # a wrap column is folded down to this width before anything is hidden


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a record type, declared once: the table and the JSON both come from it.

    ``key`` is the record's attribute and the JSON key; ``fmt`` humanises the raw value for the
    table only (a ``ColumnScale`` picks one scale for the whole column from its values);
    ``detail`` columns are left out of the table unless asked for (``--wide``); ``wrap``
    columns (long free text) fold on a narrow terminal; ``priority`` (``KEY``, ``HIGH``,
    ``NORMAL``, ``LOW``) says which columns ``render_table`` hides first when even folded text
    does not fit: a cell is shown whole, folded, or its column hidden (and named in a footnote),
    never cut with an ellipsis, but for ``clip`` columns: a glimpse of text kept whole
    elsewhere (a rank's latest line in the live panel), cut with "…" to keep one line a row.
    ``style`` gives a cell its style from the raw value (a state's colour). A ``varies`` column is
    shown only where its records' values differ, empty ones aside (WORLD: most runs have one RPC
    world, and a launched rank has none); a ``sparse`` column only where one of its records has a
    value (ROUND: only an elastic run has rounds). A display
    column (``key`` a property that dresses a field for people: RANK as ``└`` for a child)
    names in ``shows`` the field it shows: ``--filter`` compares that field, never the dressing.
    """

    key: str
    header: str | None = None
    fmt: Callable[[Any], str] | ColumnScale | None = None
    justify: str = "left"
    detail: bool = False
    wrap: bool = False
    priority: int = NORMAL
    clip: bool = False
    style: Callable[[Any], str] | None = None
    varies: bool = False
    sparse: bool = False
    shows: str | None = None

    @property
    def title(self) -> str:
        return self.header or self.key.replace("_", " ").upper()

    def value(self, record: Any) -> Any:
        return record.get(self.key) if isinstance(record, dict) else getattr(record, self.key)

    def formatter(self, records: Sequence[Any]) -> Callable[[Any], str] | None:
        """The formatter for these records: a ``ColumnScale`` looks at every value first."""
        if isinstance(self.fmt, ColumnScale):
            return self.fmt.pick([v for v in (self.value(r) for r in records) if isinstance(v, (int, float))])
        return self.fmt

    def cell(self, record: Any, fmt: Callable[[Any], str] | None = None) -> Text:
        """The value as plain text: never parsed as markup, control characters made visible."""
        value = self.value(record)
        if value is None:
            return Text("-")
        fmt = fmt or self.formatter([record])
        try:
            shown = fmt(value) if fmt else str(value)
        except (TypeError, ValueError):  # a value of the wrong type from a damaged record
            shown = repr(value)
        return Text(sanitize(shown), style=self.style(value) if self.style else "")


class FittedTable:
    """A table laid out for the width it is printed at (a terminal, a Live view, a pipe).

    Columns keep their natural width when the table fits. Otherwise wrap columns fold (down to
    ``WRAP_MIN``); if that is not enough, whole columns are hidden, highest priority number
    first (the rightmost of equals first), and a footnote names them. Key columns are never
    hidden, and never cut: a key that is also a wrap column (a function name) may fold.
    """

    GAP = 2  # Rich's padding between two columns (none at the edges: pad_edge=False)

    def __init__(self, columns: Sequence[Column], rows: list[list[Text]], *, title: str | None, hint: str):
        from rich.cells import cell_len

        self.columns = list(columns)
        self.rows = rows
        self.title = title
        self.hint = hint
        self.natural = [
            max(cell_len(line) for line in [c.title] + [ln for row in rows for ln in row[i].plain.split("\n")])
            for i, c in enumerate(self.columns)
        ]

    def _floor(self, i: int) -> int:
        column = self.columns[i]
        if not (column.wrap or column.clip):
            return self.natural[i]
        return min(self.natural[i], max(WRAP_MIN, *(len(word) for word in column.title.split())))

    def layout(self, width: int) -> dict[int, int]:
        """The columns shown (indices, in order) and their widths, for a table at most ``width`` wide."""
        shown = list(range(len(self.columns)))

        def room() -> int:
            return width - self.GAP * (len(shown) - 1)

        while sum(self._floor(i) for i in shown) > room():
            hideable = [i for i in shown if self.columns[i].priority != KEY]
            if not hideable:
                break
            shown.remove(max(hideable, key=lambda i: (self.columns[i].priority, i)))
        floors = {i: self._floor(i) for i in shown}
        if sum(floors.values()) > room():  # even the keys do not fit: they fold, never cropped
            floors = {i: min(self.natural[i], 4) for i in shown}
        return _fill({i: self.natural[i] for i in shown}, floors, room())

    def __rich_console__(self, console: RichConsole, options: Any):
        widths = self.layout(options.max_width)
        if self.title:
            yield Text(self.title, style="italic")
        table = Table(header_style="bold", box=None, pad_edge=False)
        for i, width in widths.items():
            column = self.columns[i]
            table.add_column(
                column.title,
                justify=column.justify,
                width=width,
                no_wrap=column.clip or width >= self.natural[i],
                overflow="ellipsis" if column.clip else "fold",
            )
        for row in self.rows:
            table.add_row(*(row[i] for i in widths))
        yield table
        hidden = [c.title for i, c in enumerate(self.columns) if i not in widths]
        if hidden:
            yield Text(f"hidden to fit {options.max_width} columns: {', '.join(hidden)} ({self.hint})", style="dim")


def _fill(natural: dict[int, int], floor: dict[int, int], room: int) -> dict[int, int]:
    """Widths between floor and natural that fit in ``room``: the widest columns give way first."""
    if sum(natural.values()) <= room:
        return dict(natural)
    if sum(floor.values()) >= room:
        return dict(floor)
    low, high = 0, max(natural.values())
    while low < high:  # the largest cap at which every column, capped, still fits
        cap = (low + high + 1) // 2
        if sum(max(floor[i], min(natural[i], cap)) for i in natural) <= room:
            low = cap
        else:
            high = cap - 1
    return {i: max(floor[i], min(natural[i], low)) for i in natural}


def render_table(
    records: Sequence[Any],
    columns: Sequence[Column],
    *,
    title: str | None = None,
    detail: bool = False,
    empty: str = "nothing to show",
    hint: str = "--json shows them",
) -> FittedTable | Text:
    """Records as a table that fits the terminal (see ``FittedTable``), or ``empty`` (plain
    text: it may quote the user's filter, which is never markup).

    ``hint`` ends the footnote that names hidden columns: how to see them in this command
    (``--wide`` adds columns, it cannot make room for them: every view with a table has ``--json``)."""
    if not records:
        return Text(sanitize(empty))
    shown = [c for c in columns if (detail or not c.detail) and _has_something_to_say(c, records)]
    formatters = [c.formatter(records) for c in shown]
    rows = [[c.cell(record, fmt) for c, fmt in zip(shown, formatters)] for record in records]
    return FittedTable(shown, rows, title=title, hint=hint)


def _has_something_to_say(column: Column, records: Sequence[Any]) -> bool:
    """False for a ``varies`` column whose records agree, or a ``sparse`` one where none has a value."""
    if not (column.varies or column.sparse):
        return True
    values = {repr(v) for v in (column.value(r) for r in records) if v is not None and v != ""}
    return len(values) > 1 if column.varies else bool(values)


def to_jsonable(value: Any) -> Any:
    """Plain JSON data in raw units: dataclasses → dicts, datetimes → ISO-8601, NaN → null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_jsonable(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.metadata.get("json", True)
        }
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
# Humanising formatters (tables only; JSON keeps raw units). Each is total over numbers: NaN, ±inf,
# 1e308 and an integer of 400 digits read as a few characters ("inf s", "7.9e+289 EiB"), never a
# traceback, never a 180-digit figure.


def _real(n: float) -> float:
    """``n`` as a float: an integer beyond a float's range is ±inf (float() raises)."""
    try:
        return float(n)
    except OverflowError:
        return math.inf if n > 0 else -math.inf


def human_bytes(n: float) -> str:
    n = _real(n)
    if not math.isfinite(n):
        return f"{n} B"
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            break
        n /= 1024
    if unit == "B":
        return f"{sign}{n:.0f} B"
    return f"{sign}{n:.1f} {unit}" if n < 1e4 else f"{sign}{n:.2g} {unit}"


def human_seconds(s: float) -> str:
    s = _real(s)
    if not math.isfinite(s):
        return f"{s} s"
    if s < 0:
        return "-" + human_seconds(-s)
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s >= 1e5 * 3600:  # 11 years and more: in years, a few digits
        return f"{s / 31_557_600:.3g} y"
    minutes, seconds = divmod(int(s), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def parse_iso(stamp: str) -> datetime:
    """An ISO-8601 stamp as an aware datetime. One without an offset is UTC, as rpcctl writes its
    stamps: a hand-edited record must read the same in every view (naive, it read as local time in
    some and UTC in others, and its duration could not be taken at all). ValueError if malformed."""
    moment = datetime.fromisoformat(stamp)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def epoch_of(stamp: str | None) -> float | None:
    """An ISO-8601 stamp (or None) as epoch seconds: the inverse of ``iso_time``."""
    return None if stamp is None else parse_iso(stamp).timestamp()


def _moment(ts: float) -> datetime | None:
    """Epoch seconds as an aware datetime; None for a time no calendar has (NaN, ±inf, year 33658)."""
    try:
        return datetime.fromtimestamp(ts, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


NO_TIME = "invalid time"  # what human_time shows for a time no calendar has
NO_STAMP = "????-??-??T??:??:??.???Z"  # utc_stamp's, as wide as a stamp: lines stay aligned


def human_time(ts: float | str) -> str:
    """A wall-clock time (epoch seconds or ISO-8601) as local HH:MM:SS, with the date if not today."""
    moment = parse_iso(ts) if isinstance(ts, str) else _moment(ts)
    if moment is None:
        return NO_TIME
    try:
        local = moment.astimezone()
    except (OverflowError, OSError, ValueError):  # year 1 or 9999 in UTC, beyond the calendar in local time
        return NO_TIME
    return local.strftime("%H:%M:%S" if local.date() == datetime.now().date() else "%Y-%m-%d %H:%M")


def iso_time(ts: float | None) -> str | None:
    """Epoch seconds as ISO-8601 (JSON's times); None for None, and for a time no calendar has."""
    moment = None if ts is None else _moment(ts)
    return None if moment is None else moment.isoformat()


def utc_stamp(ts: float) -> str:
    """``2026-12-03T23:18:21.123Z``: the stamp of launcher.log lines and ``logs --timestamps``."""
    moment = _moment(ts)
    return NO_STAMP if moment is None else moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def join(values: Iterable[Any]) -> str:
    return ",".join(str(v) for v in values) or "-"


def significant(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant figures in fixed notation (1234 → "1234", 0.0031 → "0.00310");
    beyond 10^15 or below 10^-9, in exponent notation ("1.00e+308"), never a 309-digit figure."""
    value = _real(value)
    if value == 0 or not math.isfinite(value):
        return f"{value:.{max(digits - 1, 0)}f}" if value == 0 else str(value)
    exponent = math.floor(math.log10(abs(value)))
    if exponent >= 15 or exponent < -9:
        return f"{value:.{max(digits - 1, 0)}e}"
    decimals = max(digits - 1 - exponent, 0)
    shown = f"{value:.{decimals}f}"
    if decimals and len(shown.replace("-", "").replace(".", "").lstrip("0")) > digits:  # 9.996 → 10.00
        shown = f"{value:.{decimals - 1}f}"
    return shown


def fmt_loss(value: float) -> str:
    """A loss or metric: 4 significant figures (0.001234, 12.35, 1235), the exponent only past 10^4."""
    value = _real(value)
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else str(value)
    return f"{value:.4g}"


class ColumnScale:
    """A column formatter that picks one scale for all the column's cells, from their values:
    ``pick(values)`` returns the formatter for each cell. The JSON keeps raw units."""

    def __init__(self, pick: Callable[[Sequence[float]], Callable[[Any], str]]):
        self.pick = pick

    def __call__(self, value: Any) -> str:  # one value alone: its own scale
        return self.pick([value])(value)


def _rate_for(values: Sequence[float]) -> Callable[[Any], str]:
    top = max((abs(_real(v)) for v in values), default=0.0)
    divisor, suffix = (1e6, " M") if top >= 1e6 else (1e3, " k") if top >= 1e4 else (1.0, "")
    return lambda v: significant(_real(v) / divisor, 3) + suffix


def _bandwidth_for(values: Sequence[float]) -> Callable[[Any], str]:
    """GB/s values; MB/s for the whole column when its largest would read 0.xx GB/s or less."""
    top = max((abs(_real(v)) for v in values), default=0.0)
    factor, unit = (1.0, "GB/s") if top >= 1 else (1e3, "MB/s")
    return lambda v: f"{significant(_real(v) * factor, 3)} {unit}"


rate_scale = ColumnScale(_rate_for)  # calls or steps per second: 2269 and 13000 read "2.27 k", "13.0 k"
bandwidth_scale = ColumnScale(_bandwidth_for)  # a value in GB/s
