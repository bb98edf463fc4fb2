"""Stragglers: a rank whose step rate, or a worker whose calls' latency, is far off the others'
(``stragglers``), for ``inspect workers`` and the live view.

- step rate: loss/metrics records per second of each rank (of its most direct source, as
  ``inspect losses`` shows them) over the last ``WINDOW_S`` seconds
  (of the run so far, if shorter), from at most the last ``RECENT`` records; flagged below
  ``SLOWER`` × the median of the other ranks (which must have ``MIN_STEPS`` records or more);
- call latency: the mean duration of the calls each worker served, per function called on
  two workers or more; flagged above ``FASTER`` × the median of the other workers for that
  function (and at least 1 ms more);
- collective arrival skew: per process group, the rank the others wait for in its collectives
  (``inspect.collectives``' rule: last far more often than chance, by a skew that matters).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from rpcctl.console import human_seconds
from rpcctl.inspect.collectives import CollectiveStraggler, _stragglers, sampled_arrivals
from rpcctl.inspect.losses import from_most_direct_source
from rpcctl.telemetry.reader import StoreReader, loads

WINDOW_S = 30.0
RECENT = 5000
MIN_STEPS = 3
SLOWER = 0.5
FASTER = 3.0


@dataclass
class Straggler:
    rank: int | None
    worker: str | None
    metric: str  # step_rate (steps/s) | call_latency (seconds, of `func`) | collective_skew (seconds, p50, in `pg`)
    value: float
    others: float  # the median of the others (collective_skew: the largest skew)
    func: str | None = None
    pg: str | None = None  # collective_skew: the process group, and how often it was last of how many compared
    last: int | None = None
    compared: int | None = None
    # collective_skew: the process that is that rank of pg (a rank's child, in an mp.spawn job)
    proc_id: int | None = None

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else (self.worker or "?")
        if self.metric == "step_rate":
            return (
                f"{who}: {self.value:.2f} steps/s, the other ranks {self.others:.2f} steps/s "
                f"({self.others / max(self.value, 1e-9):.1f}× slower)"
            )
        if self.metric == "collective_skew":
            return (
                f"{who}: last into {self.last} of {self.compared} collectives of pg {self.pg}; the others waited"
                f" {human_seconds(self.value)} for it (p50, max {human_seconds(self.others)})"
            )
        return (
            f"{who}: calls to {self.worker} ({self.func}) take {human_seconds(self.value)}, to the others"
            f" {human_seconds(self.others)} ({self.value / max(self.others, 1e-9):.1f}× slower)"
        )


def stragglers(run_dir: Path) -> list[Straggler]:
    with StoreReader(run_dir) as s:
        restart = s.latest_restart()
        # a step the trainer reported and printed is one step
        rows = from_most_direct_source(s.recent_loss_times(restart, RECENT))
        stats = s.call_stats(restart)
        names = s.rank_of_name(restart)
        now = s.now if s.live else (s.closed_at or s.now)
        arrivals = sampled_arrivals(s, restart)
    return _slow_steps(rows, now) + _slow_callees(stats, names) + [_late(c) for c in _stragglers(arrivals)]


def _late(slow: CollectiveStraggler) -> Straggler:
    return Straggler(
        slow.rank,
        None,
        "collective_skew",
        slow.skew_p50_s or 0.0,
        slow.skew_max_s or 0.0,
        pg=slow.pg,
        last=slow.last,
        compared=slow.compared,
        proc_id=slow.proc_id,
    )


def _slow_steps(rows: list, now: float) -> list[Straggler]:
    if not rows:
        return []
    first = min(r["time"] for r in rows)
    window = min(WINDOW_S, max(now - first, 1e-3))
    counts: dict[int, int] = {}
    for row in rows:
        counts.setdefault(row["rank"], 0)
        if row["time"] >= now - window:
            counts[row["rank"]] += 1
    out = []
    for rank, count in counts.items():
        others = [n for r, n in counts.items() if r != rank]
        if not others or statistics.median(others) < MIN_STEPS:
            continue
        rate, typical = count / window, statistics.median(others) / window
        if rate < SLOWER * typical:
            out.append(Straggler(rank, None, "step_rate", rate, typical))
    return out


def _slow_callees(stats: list, names: dict[str, int]) -> list[Straggler]:
    # The mean of the timed calls: total_s sums the durations of those only (one rpc.remote in
    # REMOTE_SAMPLE is timed past a function's first REMOTE_TIMED_FIRST; every call is counted), and the
    # histogram counts them.
    timed: dict[tuple[str, str], list[float]] = {}
    for row in stats:
        entry = timed.setdefault((row["func"], row["callee"]), [0.0, 0])
        entry[0] += row["total_s"] or 0.0
        entry[1] += sum(int(n) for n in (loads(row["hist"]) or {}).values())
    by_func: dict[str, dict[str, float]] = {}
    for (func, callee), (total, n) in timed.items():
        if n:
            by_func.setdefault(func, {})[callee] = total / n
    out = []
    for func, means in by_func.items():
        for callee, mean in means.items():
            others = [m for c, m in means.items() if c != callee]
            if not others:
                continue
            typical = statistics.median(others)
            if mean > FASTER * typical and mean - typical >= 1e-3:
                out.append(Straggler(names.get(callee), callee, "call_latency", mean, typical, func))
    return out
