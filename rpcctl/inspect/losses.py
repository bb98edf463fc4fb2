"""The losses view: loss records per rank and step (``losses``), per-rank summaries with a
sparkline, the last steps as a grid, and a PNG chart (``plot_losses``)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rpcctl.console import Column, human_time, iso_time
from rpcctl.errors import UsageError
from rpcctl.inspect._store import _loads, _Store


@dataclass
class LossRecord:
    rank: int
    step: int  # the printed/reported step; else the epoch; else the loss's index on that rank
    loss: float | None
    epoch: int | None
    metrics: dict[str, float | None] = field(default_factory=dict)
    time: str | None = None
    source: str = "log"  # log (parsed from the rank's output) | report (rpcctl.report)
    restart: int = 0

    COLUMNS = (
        Column("rank", justify="right"),
        Column("step", justify="right"),
        Column("epoch", justify="right"),
        Column("loss", fmt=lambda v: f"{v:.6g}", justify="right"),
        Column("time", fmt=human_time),
        Column("source", detail=True),
    )


@dataclass
class LossSummary:
    rank: int
    count: int
    first: float | None
    min: float | None
    min_step: int | None
    last: float | None
    last_step: int | None
    trend: str  # a sparkline of the last losses (table only)

    COLUMNS = (
        Column("rank", justify="right"),
        Column("count", "N", justify="right"),
        Column("first", fmt=lambda v: f"{v:.6g}", justify="right"),
        Column("min", fmt=lambda v: f"{v:.6g}", justify="right"),
        Column("min_step", "AT STEP", justify="right"),
        Column("last", fmt=lambda v: f"{v:.6g}", justify="right"),
        Column("last_step", "STEP", justify="right"),
        Column("trend"),
    )


def losses(run_dir: Path, *, rank: int | None = None, restart: int | None = None) -> list[LossRecord]:
    """Loss records in arrival order. A rank that used rpcctl.report() has its parsed prints
    left out, so a loss is never counted twice."""
    with _Store(run_dir) as s:
        restart = s.latest_restart() if restart is None else restart
        rows = s.rows("SELECT * FROM losses WHERE restart = ? ORDER BY id", (restart,))
    reported = {row["rank"] for row in rows if row["source"] == "report"}
    records = []
    for row in rows:
        if row["source"] == "log" and row["rank"] in reported:
            continue
        if rank is not None and row["rank"] != rank:
            continue
        records.append(
            LossRecord(
                rank=row["rank"], step=row["step"], loss=row["loss"], epoch=row["epoch"], metrics=_loads(row["metrics"]) or {},
                time=iso_time(row["time"]), source=row["source"], restart=restart,
            )
        )
    return records


_SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int = 24) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    if len(values) > width:  # keep the shape: sample evenly, always ending at the last value
        step = len(values) / width
        values = [values[min(len(values) - 1, int(round((i + 1) * step)) - 1)] for i in range(width)]
    low, high = min(finite), max(finite)
    span = high - low or 1.0
    return "".join(" " if v is None or not math.isfinite(v) else _SPARKS[int((v - low) / span * (len(_SPARKS) - 1))] for v in values)


def loss_summaries(records: list[LossRecord]) -> list[LossSummary]:
    by_rank: dict[int, list[LossRecord]] = defaultdict(list)
    for record in records:
        by_rank[record.rank].append(record)
    out = []
    for rank in sorted(by_rank):
        rows = by_rank[rank]
        finite = [r for r in rows if r.loss is not None and math.isfinite(r.loss)]
        best = min(finite, key=lambda r: r.loss) if finite else None  # type: ignore[arg-type, return-value]
        out.append(
            LossSummary(
                rank=rank, count=len(rows), first=rows[0].loss, min=best.loss if best else None,
                min_step=best.step if best else None, last=rows[-1].loss, last_step=rows[-1].step,
                trend=sparkline([r.loss for r in rows]),
            )
        )
    return out


def loss_grid(records: list[LossRecord], last: int = 10) -> tuple[list[int], list[int], dict[tuple[int, int], float | None]]:
    """The last ``last`` steps × ranks: (steps, ranks, {(step, rank): loss})."""
    cells: dict[tuple[int, int], float | None] = {}
    for record in records:
        cells[(record.step, record.rank)] = record.loss
    steps = sorted({step for step, _ in cells})[-last:]
    ranks = sorted({rank for _, rank in cells})
    return steps, ranks, cells


def plot_losses(records: list[LossRecord], path: Path, title: str | None = None) -> None:
    """Write a loss-per-step chart (one line per rank) to ``path`` (PNG). Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'rpcctl[plot]'") from None
    by_rank: dict[int, list[LossRecord]] = defaultdict(list)
    for record in records:
        by_rank[record.rank].append(record)
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    for rank in sorted(by_rank):
        rows = [r for r in by_rank[rank] if r.loss is not None]
        axes.plot([r.step for r in rows], [r.loss for r in rows], label=f"rank {rank}", linewidth=1.5)
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    if title:
        axes.set_title(title)
    if by_rank:
        axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    try:
        figure.savefig(path, format="png")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)
