"""``rpcctl bench compare OLD.json NEW.json``: ratios per row, and regressions beyond the noise.

Rows match on (suite, transport, op, payload, in flight, world size). For each match the
*speed* ratio NEW/OLD is computed (1/p50 for latency and payload, calls/s for throughput and
train), so >1 is always better. A change counts only when it is larger than the noise of the
two rows: half the wider of their repeat spreads, and never less than 5%
(``rpcctl.bench.stats.tolerance``). Anything inside that band is ``same``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rpcctl.bench.results import RATE_SUITES, BenchReport, BenchResult, RowId, fmt_rate, fmt_us
from rpcctl.bench.stats import tolerance
from rpcctl.console import KEY, Column, human_bytes, render_table

FASTER, SLOWER, SAME, ADDED, REMOVED = "faster", "slower", "same", "added", "removed"


@dataclass
class Comparison(RowId):
    metric: str  # the figure compared: p50_us or calls_per_s
    old: float | None
    new: float | None
    speedup: float | None  # NEW speed / OLD speed: >1 is better
    tolerance: float | None
    verdict: str

    @property
    def regression(self) -> bool:
        return self.verdict == SLOWER

    # -- what the table shows (the JSON keeps the raw fields) --

    @property
    def case(self) -> str:
        if self.suite == "throughput":
            return f"×{self.in_flight} in flight"
        if self.suite == "train":
            return f"world {self.world_size}"
        return human_bytes(self.payload_bytes or 0)

    @property
    def old_shown(self) -> str:
        return self._figure(self.old)

    @property
    def new_shown(self) -> str:
        return self._figure(self.new)

    @property
    def change(self) -> str:
        return "-" if self.speedup is None else f"{(self.speedup - 1) * 100:+.1f}%"

    @property
    def noise(self) -> str:
        return f"±{self.tolerance * 100:.0f}%" if self.tolerance is not None else "-"

    @property
    def verdict_shown(self) -> str:
        return {SLOWER: "REGRESSION"}.get(self.verdict, self.verdict)

    def _figure(self, value: float | None) -> str:
        if value is None:
            return "-"
        return fmt_rate(value) + "/s" if self.metric == "calls_per_s" else fmt_us(value)

    COLUMNS: ClassVar[list[Column]] = [
        Column("suite", "SUITE", priority=KEY),
        Column("transport", "TRANSPORT", priority=KEY),
        Column("op", "OP", priority=KEY),
        Column("case", "CASE", justify="right", priority=KEY),
        Column("old_shown", "OLD", justify="right"),
        Column("new_shown", "NEW", justify="right"),
        Column("change", "SPEED", justify="right", priority=KEY),
        Column("noise", "NOISE", justify="right"),
        Column("verdict_shown", "VERDICT", priority=KEY),
    ]


def _metric(row: BenchResult) -> tuple[str, float | None]:
    if row.suite in RATE_SUITES:
        return "calls_per_s", row.calls_per_s
    return "p50_us", row.p50_us


def compare(old: BenchReport, new: BenchReport) -> list[Comparison]:
    old_rows = {(r.transport, *r.key): r for r in old.results}
    new_rows = {(r.transport, *r.key): r for r in new.results}
    out: list[Comparison] = []
    for key in list(old_rows) + [k for k in new_rows if k not in old_rows]:
        before, after = old_rows.get(key), new_rows.get(key)
        row = after or before
        metric, _ = _metric(row)
        if before is None or after is None:
            out.append(
                Comparison(
                    **row.row_id(),
                    metric=metric,
                    old=_metric(before)[1] if before else None,
                    new=_metric(after)[1] if after else None,
                    speedup=None,
                    tolerance=None,
                    verdict=ADDED if before is None else REMOVED,
                )
            )
            continue
        speedup = after.speed / before.speed if before.speed and after.speed else None
        band = tolerance(before.spread, after.spread)
        if speedup is None:
            verdict = SAME
        elif speedup > 1 + band:
            verdict = FASTER
        elif speedup < 1 - band:
            verdict = SLOWER
        else:
            verdict = SAME
        out.append(
            Comparison(
                **row.row_id(),
                metric=metric,
                old=_metric(before)[1],
                new=_metric(after)[1],
                speedup=speedup,
                tolerance=band,
                verdict=verdict,
            )
        )
    return out


def machine_differences(old: BenchReport, new: BenchReport) -> list[str]:
    """Facts that differ between the two runs' machines (comparisons across them are weaker)."""
    keys = ("hostname", "cpu", "logical_cpus", "torch", "platform")
    return [
        f"{k}: {old.machine.get(k)!r} → {new.machine.get(k)!r}"
        for k in keys
        if old.machine.get(k) != new.machine.get(k)
    ]


def render_comparisons(comparisons: list[Comparison]):
    return render_table(
        comparisons, Comparison.COLUMNS, title="NEW vs OLD (SPEED: + is faster)", empty="no rows to compare"
    )


def summary_counts(comparisons: list[Comparison]) -> dict[str, int]:
    counts = {v: 0 for v in (FASTER, SLOWER, SAME, ADDED, REMOVED)}
    for c in comparisons:
        counts[c.verdict] += 1
    return counts
