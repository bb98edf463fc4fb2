"""The bench's per-rank program: ``rpcctl.rank.runtime worker.py --unit UNIT.json``.

rpcctl's launcher starts it in every rank of one *unit* (a transport at one world size).
The unit file (written by ``rpcctl.bench.runner``) names the transport, its settings, the
cases, the timing, and the events file. Rank 0 drives and appends one JSON line per event
to the events file, which the bench command follows for its progress bar and its results::

    {"event": "case", "case": {...}}                      rank 0 starts a case
    {"event": "result", "result": {...BenchResult...},    the case's figures, and the raw timings
     "measured": {"samples_s": [...], ...}}               (merged when a case runs in several rounds)
    {"event": "observed", "observed": {...}}              what rank 0 saw of its setup
    {"event": "done"}                                     every case of the unit finished

Rank 0's events are the only output; anything printed lands in the rank logs of the unit's run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

PEER_GRACE_S = 5.0


class Events:
    """Append-only JSON lines, one ``write`` per event so a reader never sees half a line."""

    def __init__(self, path: str | os.PathLike[str] | None):
        self.path = Path(path) if path else None

    def emit(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"event": event, "time": time.time(), **fields}) + "\n"
        with open(self.path, "a") as f:
            f.write(line)


def run_unit(unit: dict, ctx=None, events: Events | None = None, started_s: float | None = None) -> list[dict]:
    """Run one unit in this rank; rank 0 returns the results (as dicts), the others ``[]``.

    ``started_s``: this process's age (seconds) when the worker began, for the start-up row."""
    import importlib

    from rpcctl.bench.transports import RankContext, TransportSpec, adapter, create

    ctx = ctx or RankContext.from_env()
    spec = TransportSpec.from_dict(unit["transport"])
    cls = adapter(spec.kind)
    # The framework's own imports first, before the bench's (numpy, torch for the payloads), so
    # that a framework is charged for what its users import and nothing else.
    began = time.perf_counter()
    for module in cls.modules:
        importlib.import_module(module)
    import_s = time.perf_counter() - began

    from rpcctl.bench.measure import closed_loop, measure, pipelined
    from rpcctl.bench.results import result_from_measurement, unsupported_result
    from rpcctl.bench.suites import TINY_BYTES, Case, Timing, collective_payload, payload

    timing = Timing(**unit["timing"])
    cases = [Case(**c) for c in unit["cases"]]
    point_to_point = [c for c in cases if c.suite in ("latency", "payload", "throughput")]
    collectives = [c for c in cases if c.suite == "collective"]
    train = [c for c in cases if c.suite == "train"]
    startup = [c for c in cases if c.suite == "startup"]
    events = events or Events(None)
    driver = ctx.rank == 0
    transport = create(spec)
    results: list[dict] = []
    first_call_s: list[float] = []  # the first round trip or collective of this process

    def emit(result: dict, measured: dict | None = None) -> None:
        results.append(result)
        events.emit("result", result=result, **({"measured": measured} if measured is not None else {}))

    def timed_first(check):
        began = time.perf_counter()
        outcome = check()
        if not first_call_s:
            first_call_s.append(time.perf_counter() - began)
        return outcome

    began = time.perf_counter()
    transport.setup(ctx)
    init_s = time.perf_counter() - began
    # Move everything alive so far (torch's modules, the agent) out of the collector's sight:
    # the collection before each repeat then costs microseconds instead of a third of a second.
    gc.collect()
    gc.freeze()
    ok = False
    try:
        if driver:
            payloads: dict[int, Any] = {}
            for case in point_to_point:
                events.emit("case", case=case.to_dict())
                reason = cls.unsupported(case)
                if reason:
                    emit(unsupported_result(spec.name, case, reason))
                    continue
                x = transport.native(payloads.setdefault(case.payload_bytes, payload(case.payload_bytes)))
                echoed = timed_first(lambda case=case, x=x: _check_echo(transport, case.op, x))

                def run_batch(calls: int, case=case, x=x):
                    transport.prepare(case.op, x, calls, case.in_flight)
                    if case.in_flight == 1:
                        return closed_loop(lambda: transport.wait(case.op, transport.issue(case.op, x)), calls)
                    return pipelined(lambda: transport.issue(case.op, x), lambda h: transport.wait(case.op, h), calls, case.in_flight)

                measurement = measure(run_batch, timing)
                emit(result_from_measurement(spec.name, case, measurement.__dict__, bytes_per_call=echoed), measurement.__dict__)
            if startup and not first_call_s and _p2p_op(cls):
                timed_first(lambda: _check_echo(transport, _p2p_op(cls), transport.native(payload(TINY_BYTES))))
            events.emit("observed", transport=spec.name, observed=transport.observe())
            if ctx.world_size > 1:
                transport.stop()
        else:
            try:
                transport.serve()
            except Exception:
                # A server's error is almost always the driver going away. The launcher names the
                # first rank to fail as the root cause, so give the driver's own error the time to
                # land first (the launcher tears this rank down meanwhile).
                time.sleep(PEER_GRACE_S)
                raise
        for case in collectives:
            if driver:
                events.emit("case", case=case.to_dict())
            reason = cls.unsupported(case)  # the same answer on every rank: all skip together
            if reason:
                if driver:
                    emit(unsupported_result(spec.name, case, reason))
                continue
            x = collective_payload(case.payload_bytes)
            moved = timed_first(lambda case=case, x=x: _check_collective(transport, case.op, x, ctx.world_size))
            work = transport.native(x.clone())  # collectives may work in place

            def run_collectives(calls: int, case=case, work=work):
                return closed_loop(lambda: transport.collective(case.op, work), calls)

            measurement = measure(run_collectives, timing, agree=transport.agree)
            if driver:
                emit(result_from_measurement(spec.name, case, measurement.__dict__, bytes_per_call=moved), measurement.__dict__)
        if startup and not first_call_s and cls.ops.get("collective"):
            timed_first(lambda: _check_collective(transport, cls.ops["collective"][0], collective_payload(TINY_BYTES), ctx.world_size))
        for case in train:
            if driver:
                events.emit("case", case=case.to_dict())
            measured = transport.train(case, timing)
            if driver:
                emit(result_from_measurement(spec.name, case, measured, bytes_per_call=None), measured)
        if driver and startup and first_call_s:
            before = started_s or 0.0
            total = before + import_s + init_s + first_call_s[0]
            parts = {"interpreter": [before], "import": [import_s], "init": [init_s], "first_call": [first_call_s[0]]}
            measured = {"samples_s": [total], "repeat_medians_s": [total], "repeat_rates": [1 / total],
                        "calls_per_repeat": 1, "warmup_calls": 0, "parts_s": parts}
            for case in startup:
                events.emit("case", case=case.to_dict())
                emit(result_from_measurement(spec.name, case, measured, bytes_per_call=None), measured)
        ok = True
    finally:
        gc.unfreeze()
        # A graceful teardown waits for every rank; after an error some never come, and the
        # error would hide behind the hang. So: teardown when all went well, abort otherwise.
        if ok:
            transport.teardown()
        else:
            transport.abort()
    if driver:
        events.emit("done")
    return results


def _p2p_op(cls) -> str | None:
    for suite in ("latency", "payload", "throughput"):
        if cls.ops.get(suite):
            return cls.ops[suite][0]
    return None


def _check_echo(transport, op: str, x) -> int:
    """One untimed round trip that must bring back the payload intact; returns bytes moved."""
    import torch

    transport.prepare(op, x, 1, 1)
    back = transport.wait(op, transport.issue(op, x))
    sent = transport.as_torch(x)
    if not isinstance(back, torch.Tensor) or back.shape != sent.shape or not torch.equal(back, sent):
        raise AssertionError(f"{op}: the echoed payload differs from what was sent ({sent.numel()} bytes)")
    return sent.numel() * sent.element_size() + back.numel() * back.element_size()


def _check_collective(transport, op: str, x, world_size: int) -> int:
    """One untimed collective whose result must be exact (sum, rank 0's copy, or every rank's
    copy in order: every rank contributes the same ``x``); returns the bytes of this rank's buffer."""
    import torch

    expected = {"all_reduce": x * world_size, "broadcast": x, "all_gather": x.repeat(world_size)}[op]
    back = transport.collective(op, transport.native(x.clone()))
    if not isinstance(back, torch.Tensor) or not torch.equal(back.reshape(-1), expected):
        raise AssertionError(f"{op}: the result differs from what {world_size} ranks of {x.numel()} values must give")
    return x.numel() * x.element_size()


def process_age_s() -> float | None:
    """Seconds since this process started (the kernel's start time, 10 ms ticks), or None."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time, ticks after boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def pin_to_core(rank: int) -> int | None:
    """Pin this process (and the threads it starts from now on) to one of the allowed cores."""
    try:
        cores = sorted(os.sched_getaffinity(0))
        core = cores[rank % len(cores)]
        os.sched_setaffinity(0, {core})
        return core
    except (AttributeError, OSError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rpcctl-bench-worker")
    parser.add_argument("--unit", required=True, help="the unit file (JSON) written by `rpcctl bench`")
    args = parser.parse_args(argv)
    started_s = process_age_s()
    unit = json.loads(Path(args.unit).read_text())
    if unit.get("pin"):
        pin_to_core(int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))))
    run_unit(unit, events=Events(unit.get("events")), started_s=started_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
