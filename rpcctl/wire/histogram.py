"""The duration histogram of the wire (``cstat`` and ``cop`` events' ``h``): log-scale buckets,
4 per octave from 1 µs. Shared by both sides: the rank counts into it (``rank.calls``,
``rank.collectives``), the readers take quantiles from it (``inspect.calls``,
``inspect.collectives``). Standard library only."""

from __future__ import annotations

import math

HIST_BUCKETS_PER_OCTAVE = 4  # bucket b covers 2**(b/4) µs onwards


def bucket(seconds: float) -> int:
    """The histogram bucket of a duration: 4 per octave from 1 µs (b = 4·log2(µs))."""
    micros = seconds * 1e6
    return 0 if micros <= 1.0 else min(159, int(math.log2(micros) * HIST_BUCKETS_PER_OCTAVE))


def bucket_seconds(index: int) -> float:
    """A duration that stands for bucket ``index``: its geometric middle."""
    return 2 ** ((index + 0.5) / HIST_BUCKETS_PER_OCTAVE) / 1e6


def quantile(hist: dict[int, int], q: float) -> float | None:
    """The nearest-rank quantile: the ceil(q·n)-th duration's bucket, so the p99 of a few calls
    is the slowest one's (rounding the rank down showed the p99 of 3 calls as the second)."""
    total = sum(hist.values())
    if not total:
        return None
    rank, seen = max(1, math.ceil(q * total)), 0
    for index in sorted(hist):
        seen += hist[index]
        if seen >= rank:
            break
    return bucket_seconds(index)
