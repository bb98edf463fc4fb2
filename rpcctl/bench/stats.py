"""Statistics for one measured case: percentiles over every timed call, noise across repeats.

A case is measured as ``repeats`` repeats of the same calibrated number of calls, after a
warm-up that is thrown away. Two kinds of figures come out of it:

- **distribution** — p50/p90/p99/min/max/mean over every timed call of every repeat (pooled).
  Percentiles interpolate linearly between order statistics (numpy's default), so with ``n``
  samples p99 is only a real tail figure when ``n`` is well above 100; ``n`` is always reported.
- **noise** — each repeat gives one estimate (its median call time, or its calls/s); ``spread``
  is the range of those estimates relative to their median. A run is flagged ``noisy`` when the
  spread is wider than ``NOISY_SPREAD``: the repeats disagree by more than that, so differences
  smaller than the spread between two rows (or two runs) are not evidence of anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NOISY_SPREAD = 0.20  # repeats whose estimates span more than ±10% around the median
MIN_TOLERANCE = 0.05  # a change under 5% is never called a regression, however quiet the runs


@dataclass(frozen=True)
class Summary:
    """The distribution of per-call times (seconds) of one case."""

    n: int
    p50: float
    p90: float
    p99: float
    min: float
    max: float
    mean: float


def summarize(samples: Sequence[float]) -> Summary:
    """Percentiles of ``samples`` (seconds). Raises ``ValueError`` on an empty or non-finite input."""
    data = np.asarray(samples, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no samples to summarize")
    if not np.all(np.isfinite(data)):
        raise ValueError("samples must be finite")
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    return Summary(
        n=int(data.size),
        p50=float(p50),
        p90=float(p90),
        p99=float(p99),
        min=float(data.min()),
        max=float(data.max()),
        mean=float(data.mean()),
    )


def spread(estimates: Sequence[float]) -> float:
    """(max - min) / median of per-repeat estimates; 0.0 for fewer than two repeats."""
    values = [float(v) for v in estimates]
    if len(values) < 2:
        return 0.0
    middle = float(np.median(values))
    if middle <= 0 or not math.isfinite(middle):
        return math.inf
    return (max(values) - min(values)) / middle


def is_noisy(spread_value: float | None) -> bool:
    return spread_value is not None and spread_value > NOISY_SPREAD


def tolerance(*spreads: float | None) -> float:
    """How far apart two figures must be before the difference is more than noise.

    Half the widest spread (the spread is a full range, a change is measured from the middle),
    and never under ``MIN_TOLERANCE``.
    """
    known = [s for s in spreads if s is not None and math.isfinite(s)]
    return max([MIN_TOLERANCE, *(s / 2 for s in known)])


def calls_per_repeat(per_call_s: float, target_s: float, min_calls: int, max_calls: int) -> int:
    """Calibrate a repeat: enough calls to last ``target_s``, within [min_calls, max_calls]."""
    if per_call_s <= 0 or not math.isfinite(per_call_s):
        return max_calls
    return int(min(max_calls, max(min_calls, math.ceil(target_s / per_call_s))))
