"""The losses view: loss records per rank (``losses``), per-rank summaries with a sparkline and
how many printed lines matched (``loss_summaries``), the last steps as a grid (``loss_grid``), and
a PNG chart (``plot_losses``).

How records are keyed (the same in the table, the plot, the JSON and the live view): a rank's
records are keyed by (epoch, step) when those increase strictly in arrival order (global steps,
or steps that restart every epoch: ``epoch 2 step 10``); otherwise, where steps repeat or are
not printed at all, by arrival order (``seq``). Either way the last row of the grid is the last
record that arrived, so LAST in the summary is the value the grid ends on.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rpcctl.console import HIGH, KEY, LOW, Column, fmt_loss, human_time, iso_time
from rpcctl.base.errors import RpcctlError, UsageError
from rpcctl.base.private import write_private_atomic
from rpcctl.wire.protocol import LOSS_SOURCES
from rpcctl.telemetry.reader import StoreReader, column, loads

BY_STEP, BY_ARRIVAL = "step", "arrival"


@dataclass
class LossRecord:
    rank: int
    step: int | None  # as printed or reported; None when there was none
    loss: float | None
    epoch: int | None
    metrics: dict[str, float | None] = field(default_factory=dict)
    time: str | None = None
    # log (parsed from the rank's output) | report (rpcctl.report) | transformers | lightning (the trainer)
    source: str = "log"
    restart: int = 0
    seq: int = 0  # arrival index on the rank (0, 1, ...)
    keyed_by: str = BY_STEP  # step: (epoch, step) orders this rank's records; arrival: seq does
    rule: str | None = None  # the parser rule that matched (``inspect losses --explain``)

    COLUMNS = (
        Column("rank", justify="right", priority=KEY),
        Column("epoch", justify="right", priority=KEY),
        Column("step", justify="right", priority=KEY),
        Column("seq", "#", justify="right", priority=KEY),
        Column("loss", fmt=fmt_loss, justify="right", priority=KEY),
        Column("time", fmt=human_time),
        Column("source", detail=True),
        Column("rule", detail=True),
    )

    @property
    def key(self) -> tuple[int, ...]:
        if self.keyed_by == BY_ARRIVAL:
            return (self.seq,)
        return (-1 if self.epoch is None else self.epoch, -1 if self.step is None else self.step)

    @property
    def where(self) -> str:
        """Where the record sits, in words: ``epoch 2 step 10``, ``step 10``, ``#12``."""
        if self.keyed_by == BY_ARRIVAL:
            return f"#{self.seq + 1}"
        parts = ([f"epoch {self.epoch}"] if self.epoch is not None else []) + (
            [f"step {self.step}"] if self.step is not None else []
        )
        return " ".join(parts) or f"#{self.seq + 1}"


@dataclass
class LossSummary:
    rank: int
    count: int
    first: float | None
    min: float | None
    min_at: str | None  # where the minimum is (LossRecord.where)
    last: float | None
    last_at: str | None
    lines: int | None  # lines of the rank's output the parser read (None: an older store)
    matched: int | None  # of which yielded a loss
    keyed_by: str
    trend: str  # a sparkline of the last losses (table only)
    # Where the rank's losses came from (``LossRecord.source``): from rpcctl.report() or a
    # library's callback no printed line needs to match (its prints are ignored, never counted twice).
    source: str = "log"

    COLUMNS = (
        Column("rank", justify="right", priority=KEY),
        Column("count", "N", justify="right"),
        Column("first", fmt=fmt_loss, justify="right", priority=HIGH),
        Column("min", fmt=fmt_loss, justify="right", priority=HIGH),
        Column("min_at", "AT"),
        Column("last", fmt=fmt_loss, justify="right", priority=KEY),
        Column("last_at", "AT"),
        Column("lines_matched", "MATCHED", justify="right", priority=LOW),
        Column("trend", priority=LOW),
    )

    @property
    def lines_matched(self) -> str | None:
        """``60/120``: printed lines that gave a loss, of those the parser read; for a rank whose
        losses came from rpcctl.report() or a library's callback, where they came from instead
        (``from lightning``): its printed lines need no match, and 5/26 read as a parse failing."""
        if self.source != "log":
            return f"from {self.source}"
        return None if self.lines is None else f"{self.matched}/{self.lines}"


def losses(
    run_dir: Path, *, rank: int | None = None, restart: int | None = None, last: int | None = None
) -> list[LossRecord]:
    """Loss records in arrival order. Each rank's come from one source, the most direct it has
    (``LOSS_SOURCES``: rpcctl.report(), a library's trainer, its parsed prints), so a loss is
    never counted twice. ``last``: only each rank's latest ``last``."""
    with StoreReader(run_dir) as s:
        restart = s.latest_restart() if restart is None else restart
        # per rank and source with `last`, so that the rule below still leaves `last` of the kept source
        rows = s.losses(restart, last=last)
    records: list[LossRecord] = []
    by_rank: dict[int, list[LossRecord]] = defaultdict(list)
    for row in from_most_direct_source(rows):
        if rank is not None and row["rank"] != rank:
            continue
        seq = column(row, "seq")  # stores before version 4 have none: the row order is the same
        kept = by_rank[row["rank"]]
        record = LossRecord(
            rank=row["rank"],
            step=row["step"],
            loss=_number(row["loss"]),
            epoch=row["epoch"],
            metrics=loads(row["metrics"]) or {},
            time=iso_time(row["time"]),
            source=row["source"],
            restart=restart,
            seq=len(kept) if seq is None else seq,
            rule=column(row, "rule"),
        )
        kept.append(record)
        records.append(record)
    for kept in by_rank.values():
        _choose_keys(kept)
    return records


def from_most_direct_source(rows: list) -> list:
    """The store's loss rows (with ``rank``, ``restart`` and ``source``) of each rank's most
    direct source in each restart (``LOSS_SOURCES``): the same loss reported and printed counts once."""
    best: dict[tuple[int, int], int] = {}  # (rank, restart) → the index in LOSS_SOURCES of its most direct source
    for row in rows:
        key = (row["rank"], row["restart"])
        best[key] = min(best.get(key, len(LOSS_SOURCES)), _precedence(row["source"]))
    return [row for row in rows if _precedence(row["source"]) == best[(row["rank"], row["restart"])]]


def _precedence(source: str | None) -> int:
    """A source's rank in LOSS_SOURCES; one a store was given by something else comes last."""
    return LOSS_SOURCES.index(source) if source in LOSS_SOURCES else len(LOSS_SOURCES)


def _choose_keys(records: list[LossRecord]) -> None:
    """Key a rank's records by (epoch, step) if those increase strictly as they arrive, else by arrival."""
    keys = [(r.epoch, r.step) for r in records]
    numeric = [(-1 if e is None else e, -1 if s is None else s) for e, s in keys]
    by_step = all(k != (None, None) for k in keys) and all(a < b for a, b in zip(numeric, numeric[1:]))
    for record in records:
        record.keyed_by = BY_STEP if by_step else BY_ARRIVAL


def line_counts(run_dir: Path, *, restart: int | None = None) -> dict[int, tuple[int, int]]:
    """rank → (lines the loss parser read, lines that yielded a loss); {} for stores before version 4."""
    with StoreReader(run_dir) as s:
        restart = s.latest_restart() if restart is None else restart
        try:
            rows = s.log_lines(restart)
        except Exception:  # noqa: BLE001 - an older store has no such table
            return {}
    return {row["rank"]: (row["lines"], row["matched"]) for row in rows}


def with_metric(records: list[LossRecord], metric: str | None) -> list[LossRecord]:
    """The records as if ``metric`` were the loss (those that have it); the records as they are for None."""
    if metric is None or metric == "loss":
        return records
    return [replace(r, loss=r.metrics[metric]) for r in records if r.metrics.get(metric) is not None]


def metric_names(records: list[LossRecord]) -> list[str]:
    return sorted({name for r in records for name in r.metrics})


_SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int = 24) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    if len(values) > width:  # keep the shape: sample evenly, always ending at the last value
        step = len(values) / width
        values = [values[min(len(values) - 1, int(round((i + 1) * step)) - 1)] for i in range(width)]
    low, high = min(finite), max(finite)
    span = high / 2 - low / 2 or 1.0  # halves: 1e308 - -1e308 is inf, and inf / inf is NaN
    return "".join(
        " " if v is None or not math.isfinite(v) else _SPARKS[int((v / 2 - low / 2) / span * (len(_SPARKS) - 1))]
        for v in values
    )


def loss_summaries(records: list[LossRecord], counts: dict[int, tuple[int, int]] | None = None) -> list[LossSummary]:
    by_rank: dict[int, list[LossRecord]] = defaultdict(list)
    for record in records:
        by_rank[record.rank].append(record)
    counts = counts or {}
    out = []
    for rank in sorted(set(by_rank) | set(counts)):
        rows = by_rank.get(rank, [])
        finite = [r for r in rows if r.loss is not None and math.isfinite(r.loss)]
        best = min(finite, key=lambda r: r.loss) if finite else None  # type: ignore[arg-type, return-value]
        lines, matched = counts.get(rank, (None, None))
        out.append(
            LossSummary(
                rank=rank,
                count=len(rows),
                first=rows[0].loss if rows else None,
                min=best.loss if best else None,
                min_at=best.where if best else None,
                last=rows[-1].loss if rows else None,
                last_at=rows[-1].where if rows else None,
                lines=lines,
                matched=matched,
                keyed_by=rows[0].keyed_by if rows else BY_STEP,
                trend=sparkline([r.loss for r in rows]),
                source=rows[-1].source if rows else "log",
            )
        )
    return out


@dataclass
class LossGrid:
    """The last rows of records × ranks. Rows are keys (``LossRecord.key``), all by step or all
    by arrival (when any rank shown is keyed by arrival)."""

    keyed_by: str
    rows: list[tuple[int, ...]]
    ranks: list[int]
    cells: dict[tuple[tuple[int, ...], int], float | None]
    labels: dict[tuple[int, ...], tuple[int | None, int | None]]  # key → (epoch, step) as printed

    @property
    def has_epochs(self) -> bool:
        return any(epoch is not None for epoch, _ in self.labels.values())


def loss_grid(records: list[LossRecord], last: int = 10) -> LossGrid:
    keyed_by = BY_ARRIVAL if any(r.keyed_by == BY_ARRIVAL for r in records) else BY_STEP
    cells: dict[tuple[tuple[int, ...], int], float | None] = {}
    labels: dict[tuple[int, ...], tuple[int | None, int | None]] = {}
    for record in records:
        key = (record.seq,) if keyed_by == BY_ARRIVAL else record.key
        cells[(key, record.rank)] = record.loss
        labels.setdefault(key, (record.epoch, record.step))
    rows = sorted({key for key, _ in cells})[-last:]
    ranks = sorted({rank for _, rank in cells})
    return LossGrid(keyed_by, rows, ranks, cells, labels)


def x_axis(records: list[LossRecord]) -> tuple[str, Callable[[LossRecord], int]]:
    """The x axis of a chart of ``records``: the printed step when every rank counts steps
    globally, else each record's arrival index on its rank (1-based). Returns (title, x of a record)."""
    if records and all(r.keyed_by == BY_STEP and r.epoch is None and r.step is not None for r in records):
        return "step", lambda r: r.step  # type: ignore[return-value]
    return "record, in arrival order (steps restart or repeat)", lambda r: r.seq + 1


class NothingToPlot(RpcctlError):
    """--plot on a run (or rank, or metric) with no values: no picture is written."""


def plot_losses(
    records: list[LossRecord],
    path: Path,
    *,
    title: str | None = None,
    metric: str | None = None,
    log_scale: bool = False,
) -> None:
    """Write a chart of the loss (or ``metric``) per step, one line per rank, to ``path`` (PNG).

    The x axis: ``x_axis``. Needs matplotlib. Raises NothingToPlot, writing nothing, when there is no value to draw."""
    name = metric or "loss"
    records = with_metric(records, metric)
    by_rank: dict[int, list[LossRecord]] = defaultdict(list)
    for record in records:
        if record.loss is not None and math.isfinite(record.loss) and (not log_scale or record.loss > 0):
            by_rank[record.rank].append(record)
    if not by_rank:
        raise NothingToPlot(
            f"no {name} values{' above 0 (for --log)' if log_scale and records else ''} to plot: {path} not written"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'rpcctl[plot]'") from None
    x_title, x_of = x_axis([r for rows in by_rank.values() for r in rows])
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    for rank in sorted(by_rank):
        rows = by_rank[rank]
        axes.plot(
            [x_of(r) for r in rows],
            [r.loss for r in rows],
            label=f"rank {rank}",
            linewidth=1.5,
            marker="." if len(rows) < 40 else None,
        )
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel(x_title)
    axes.set_ylabel(name)
    if log_scale:
        axes.set_yscale("log")
    if title:
        axes.set_title(title)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    png = io.BytesIO()
    try:
        figure.savefig(png, format="png")
    finally:
        plt.close(figure)
    try:  # the one writer of a file a user names: 0600, renamed into place, never into a FIFO, a device or a link
        write_private_atomic(path, png.getvalue())
    except OSError as exc:
        raise UsageError(f"--plot cannot write {path}: {exc.strerror or exc}") from None


def _number(value):
    """A stored loss as a float, or None: a store written by anything may hold text there."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
