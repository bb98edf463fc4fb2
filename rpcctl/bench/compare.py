"""``rpcctl bench compare OLD.json NEW.json``: ratios per row, and regressions beyond the noise.

Rows match on (suite, transport, op, payload, in flight, world size). For each match the
*speed* ratio NEW/OLD is computed (1/p50 for latency and payload, calls/s for throughput and
train), so >1 is always better. A change counts only when it is larger than the noise of the
two rows: half the wider of their repeat spreads, and never less than 5%
(``rpcctl.bench.stats.tolerance``). Anything inside that band is ``same``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpcctl.bench.results import RATE_SUITES, BenchReport, BenchResult, RowId, fmt_rate, fmt_us
from rpcctl.bench.stats import tolerance
from rpcctl.console import Column, human_bytes, render_table

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
            out.append(Comparison(
                **row.row_id(), metric=metric, old=_metric(before)[1] if before else None, new=_metric(after)[1] if after else None,
                speedup=None, tolerance=None, verdict=ADDED if before is None else REMOVED,
            ))
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
        out.append(Comparison(
            **row.row_id(), metric=metric, old=_metric(before)[1], new=_metric(after)[1], speedup=speedup, tolerance=band, verdict=verdict,
        ))
    return out


def machine_differences(old: BenchReport, new: BenchReport) -> list[str]:
    """Facts that differ between the two runs' machines (comparisons across them are weaker)."""
    keys = ("hostname", "cpu", "logical_cpus", "torch", "platform")
    return [f"{k}: {old.machine.get(k)!r} → {new.machine.get(k)!r}" for k in keys if old.machine.get(k) != new.machine.get(k)]


# -- rendering ---------------------------------------------------------------------------------


def _case(c: Comparison) -> str:
    if c.suite == "payload":
        return human_bytes(c.payload_bytes or 0)
    if c.suite == "throughput":
        return f"×{c.in_flight} in flight"
    if c.suite == "train":
        return f"world {c.world_size}"
    return human_bytes(c.payload_bytes or 0)


def _figure(c: Comparison, value: float | None) -> str:
    if value is None:
        return "-"
    return fmt_rate(value) + "/s" if c.metric == "calls_per_s" else fmt_us(value)


def _change(c: Comparison) -> str:
    if c.speedup is None:
        return "-"
    return f"{(c.speedup - 1) * 100:+.1f}%"


def _verdict(c: Comparison) -> str:
    return {SLOWER: "[red]REGRESSION[/red]", FASTER: "[green]faster[/green]"}.get(c.verdict, c.verdict)


COLUMNS = [
    Column("suite", "SUITE"),
    Column("transport", "TRANSPORT"),
    Column("op", "OP"),
    Column("case", "CASE", justify="right"),
    Column("old_fmt", "OLD", justify="right"),
    Column("new_fmt", "NEW", justify="right"),
    Column("change", "SPEED", justify="right"),
    Column("noise", "NOISE", justify="right"),
    Column("verdict_fmt", "VERDICT"),
]


def render_comparisons(comparisons: list[Comparison]):
    records = [
        {
            "suite": c.suite,
            "transport": c.transport,
            "op": c.op,
            "case": _case(c),
            "old_fmt": _figure(c, c.old),
            "new_fmt": _figure(c, c.new),
            "change": _change(c),
            "noise": f"±{c.tolerance * 100:.0f}%" if c.tolerance is not None else "-",
            "verdict_fmt": _verdict(c),
        }
        for c in comparisons
    ]
    return render_table(records, COLUMNS, title="NEW vs OLD (SPEED: + is faster)", empty="no rows to compare")


def summary_counts(comparisons: list[Comparison]) -> dict[str, int]:
    counts = {v: 0 for v in (FASTER, SLOWER, SAME, ADDED, REMOVED)}
    for c in comparisons:
        counts[c.verdict] += 1
    return counts
