"""The timing loops every transport shares, so that every row is measured the same way.

A *batch* is ``calls`` round trips with at most ``in_flight`` outstanding. Each call's time runs
from just before it is issued to the moment the driver sees its reply (FIFO, like a pipelined
client), so with one in flight it is the plain round-trip time and with more it is the latency
under load. A *case* is a warm-up (discarded, also used to calibrate), then ``repeats`` batches
of the same calibrated size, with the garbage collector off while the clock runs (and a
collection before each repeat, cheap once the worker has frozen its start-up objects).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rpcctl.bench.stats import calls_per_repeat
from rpcctl.bench.suites import Timing

clock = time.perf_counter_ns


@dataclass
class Batch:
    latencies_ns: list[int]  # one per call, in completion order
    elapsed_ns: int  # wall time of the whole batch

    @property
    def rate(self) -> float:
        """Calls per second over the batch."""
        return len(self.latencies_ns) / (self.elapsed_ns / 1e9) if self.elapsed_ns > 0 else float("inf")


@dataclass
class Measurement:
    """What a case produced: every timed call, and one estimate per repeat."""

    samples_s: list[float]
    repeat_medians_s: list[float]  # per repeat: the median call time
    repeat_rates: list[float]  # per repeat: calls per second
    calls_per_repeat: int
    warmup_calls: int


def pipelined(issue: Callable[[], Any], wait: Callable[[Any], Any], calls: int, in_flight: int) -> Batch:
    """Keep ``in_flight`` calls outstanding until ``calls`` have completed."""
    latencies = [0] * calls
    pending: deque[tuple[int, Any]] = deque()
    issued = done = 0
    start = clock()
    while issued < calls and len(pending) < in_flight:
        pending.append((clock(), issue()))
        issued += 1
    while pending:
        began, handle = pending.popleft()
        wait(handle)
        latencies[done] = clock() - began
        done += 1
        if issued < calls:
            pending.append((clock(), issue()))
            issued += 1
    return Batch(latencies, clock() - start)


def closed_loop(call: Callable[[], Any], calls: int) -> Batch:
    """One call at a time (the same as ``pipelined`` with one in flight, minus its bookkeeping)."""
    latencies = [0] * calls
    start = clock()
    for i in range(calls):
        began = clock()
        call()
        latencies[i] = clock() - began
    return Batch(latencies, clock() - start)


def alone(value: int) -> int:
    return value


def measure(run_batch: Callable[[int], Batch], timing: Timing, agree: Callable[[int], int] = alone) -> Measurement:
    """Warm up, calibrate, then time ``timing.repeats`` batches of ``run_batch(calls)``."""
    calls, warmup_calls = warm_up(run_batch, timing, agree)
    return repeat(run_batch, timing, calls, warmup_calls)


def warm_up(run_batch: Callable[[int], Batch], timing: Timing, agree: Callable[[int], int] = alone) -> tuple[int, int]:
    """Batches that double in size until ``warmup_s`` has passed; returns (calls per repeat,
    calls spent warming up). Connections, allocator caches and lazy initialisation settle here;
    nothing is kept but the pace, taken from the last batch (there are at least two: the first
    is cold).

    For a collective every rank runs this loop and must run the same batches: ``agree`` makes
    every rank take rank 0's value (when to stop warming up, calls per repeat)."""
    warmup_calls, size, batches = 0, max(1, timing.min_warmup_calls), 0
    spent_ns = 0
    while True:
        last = run_batch(size)
        warmup_calls += size
        batches += 1
        spent_ns += last.elapsed_ns
        if agree(int(batches >= 2 and (spent_ns >= timing.warmup_s * 1e9 or size >= timing.max_calls))):
            break
        size = min(size * 2, timing.max_calls)
    per_call_s = last.elapsed_ns / 1e9 / len(last.latencies_ns)
    return agree(calls_per_repeat(per_call_s, timing.repeat_s, timing.min_calls, timing.max_calls)), warmup_calls


def repeat(run_batch: Callable[[int], Batch], timing: Timing, calls: int, warmup_calls: int = 0) -> Measurement:
    """``timing.repeats`` timed batches of ``calls``; the collector runs between them, never during."""
    samples: list[float] = []
    medians: list[float] = []
    rates: list[float] = []
    was_enabled = gc.isenabled()
    try:
        for _ in range(timing.repeats):
            gc.collect()
            gc.disable()
            batch = run_batch(calls)
            gc.enable()
            seconds = [ns / 1e9 for ns in batch.latencies_ns]
            samples.extend(seconds)
            medians.append(statistics.median(seconds))
            rates.append(batch.rate)
    finally:
        if was_enabled:
            gc.enable()
    return Measurement(samples, medians, rates, calls, warmup_calls)
