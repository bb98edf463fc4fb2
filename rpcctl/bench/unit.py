"""The program every rank of a bench unit runs: ``rpcctl.rank.runtime unit.py --unit UNIT.json``.

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

    ``started_s``: this process's age (seconds) when the program began, for the start-up row."""
    import importlib

    from rpcctl.bench.transports import RankContext, TransportSpec, adapter

    ctx = ctx or RankContext.from_env()
    spec = TransportSpec.from_dict(unit["transport"])
    cls = adapter(spec.kind)
    # The framework's own imports first, before the bench's (numpy, torch for the payloads), so
    # that a framework is charged for what its users import and nothing else.
    began = time.perf_counter()
    for module in cls.modules:
        importlib.import_module(module)
    import_s = time.perf_counter() - began

    # The bench's own modules now: after the framework's, and before gc.freeze below.
    from rpcctl.bench import measure, results  # noqa: F401
    from rpcctl.bench.suites import Case, Timing

    cases = [Case(**c) for c in unit["cases"]]
    run = _UnitRun(spec, cls, ctx, Timing(**unit["timing"]), events or Events(None))
    began = time.perf_counter()
    run.transport.setup(ctx)
    init_s = time.perf_counter() - began
    # Move everything alive so far (torch's modules, the agent) out of the collector's sight:
    # the collection before each repeat then costs microseconds instead of a third of a second.
    gc.collect()
    gc.freeze()
    ok = False
    try:
        startup = [c for c in cases if c.suite == "startup"]
        if run.driver:
            run.point_to_point(
                [c for c in cases if c.suite in ("latency", "payload", "throughput")], first_call=bool(startup)
            )
        else:
            run.serve()
        run.collectives([c for c in cases if c.suite == "collective"], first_call=bool(startup))
        run.train([c for c in cases if c.suite == "train"])
        if run.driver and startup and run.first_call_s:
            run.startup(startup, {"interpreter": started_s or 0.0, "import": import_s, "init": init_s})
        ok = True
    finally:
        gc.unfreeze()
        # A graceful teardown waits for every rank; after an error some never come, and the
        # error would hide behind the hang. So: teardown when all went well, abort otherwise.
        if ok:
            run.transport.teardown()
        else:
            run.transport.abort()
    if run.driver:
        run.events.emit("done")
    return run.results


class _UnitRun:
    """One unit's phases in this rank, in order: point-to-point cases (rank 0 drives, the others
    serve), collectives (every rank), training, then the start-up row (rank 0)."""

    def __init__(self, spec, cls, ctx, timing, events: Events):
        from rpcctl.bench.transports import create

        self.spec, self.cls, self.ctx, self.timing, self.events = spec, cls, ctx, timing, events
        self.driver = ctx.rank == 0
        self.transport = create(spec)
        self.results: list[dict] = []
        self.first_call_s: list[float] = []  # the first round trip or collective of this process

    def emit(self, result: dict, measured: dict | None = None) -> None:
        self.results.append(result)
        self.events.emit("result", result=result, **({"measured": measured} if measured is not None else {}))

    def timed_first(self, check):
        began = time.perf_counter()
        outcome = check()
        if not self.first_call_s:
            self.first_call_s.append(time.perf_counter() - began)
        return outcome

    def point_to_point(self, cases: list, *, first_call: bool) -> None:
        """Rank 0: each case timed against the serving ranks, then they are told to stop."""
        from rpcctl.bench.measure import closed_loop, measure, pipelined
        from rpcctl.bench.results import result_from_measurement, unsupported_result
        from rpcctl.bench.suites import TINY_BYTES, payload

        transport, cls, name = self.transport, self.cls, self.spec.name
        payloads: dict[int, Any] = {}
        for case in cases:
            self.events.emit("case", case=case.to_dict())
            reason = cls.unsupported(case)
            if reason:
                self.emit(unsupported_result(name, case, reason))
                continue
            x = transport.native(payloads.setdefault(case.payload_bytes, payload(case.payload_bytes)))
            echoed = self.timed_first(lambda case=case, x=x: _check_echo(transport, case.op, x))

            def run_batch(calls: int, case=case, x=x):
                transport.prepare(case.op, x, calls, case.in_flight)
                if case.in_flight == 1:
                    return closed_loop(lambda: transport.wait(case.op, transport.issue(case.op, x)), calls)
                return pipelined(
                    lambda: transport.issue(case.op, x), lambda h: transport.wait(case.op, h), calls, case.in_flight
                )

            measurement = measure(run_batch, self.timing)
            self.emit(
                result_from_measurement(name, case, measurement.__dict__, bytes_per_call=echoed), measurement.__dict__
            )
        if first_call and not self.first_call_s and _p2p_op(cls):
            self.timed_first(lambda: _check_echo(transport, _p2p_op(cls), transport.native(payload(TINY_BYTES))))
        self.events.emit("observed", transport=name, observed=transport.observe())
        if self.ctx.world_size > 1:
            transport.stop()

    def serve(self) -> None:
        """The other ranks: serve rank 0's point-to-point cases until it says stop."""
        try:
            self.transport.serve()
        except Exception:
            # A server's error is almost always the driver going away. The launcher names the
            # first rank to fail as the root cause, so give the driver's own error the time to
            # land first (the launcher tears this rank down meanwhile).
            time.sleep(PEER_GRACE_S)
            raise

    def collectives(self, cases: list, *, first_call: bool) -> None:
        """Every rank takes part in each collective; rank 0 reports."""
        from rpcctl.bench.measure import closed_loop, measure
        from rpcctl.bench.results import result_from_measurement, unsupported_result
        from rpcctl.bench.suites import TINY_BYTES, collective_payload

        transport, cls, driver, world_size = self.transport, self.cls, self.driver, self.ctx.world_size
        for case in cases:
            if driver:
                self.events.emit("case", case=case.to_dict())
            reason = cls.unsupported(case)  # the same answer on every rank: all skip together
            if reason:
                if driver:
                    self.emit(unsupported_result(self.spec.name, case, reason))
                continue
            x = collective_payload(case.payload_bytes)
            moved = self.timed_first(lambda case=case, x=x: _check_collective(transport, case.op, x, world_size))
            work = transport.native(x.clone())  # collectives may work in place

            def run_collectives(calls: int, case=case, work=work):
                return closed_loop(lambda: transport.collective(case.op, work), calls)

            measurement = measure(run_collectives, self.timing, agree=transport.agree)
            if driver:
                self.emit(
                    result_from_measurement(self.spec.name, case, measurement.__dict__, bytes_per_call=moved),
                    measurement.__dict__,
                )
        if first_call and not self.first_call_s and cls.ops.get("collective"):
            self.timed_first(
                lambda: _check_collective(
                    transport, cls.ops["collective"][0], collective_payload(TINY_BYTES), world_size
                )
            )

    def train(self, cases: list) -> None:
        from rpcctl.bench.results import result_from_measurement

        for case in cases:
            if self.driver:
                self.events.emit("case", case=case.to_dict())
            measured = self.transport.train(case, self.timing)
            if self.driver:
                self.emit(result_from_measurement(self.spec.name, case, measured, bytes_per_call=None), measured)

    def startup(self, cases: list, before_s: dict[str, float]) -> None:
        """Rank 0: the start-up row, from what this process measured on its way to the first call."""
        from rpcctl.bench.results import result_from_measurement

        parts = {key: [value] for key, value in before_s.items()} | {"first_call": [self.first_call_s[0]]}
        total = sum(value for (value,) in parts.values())
        measured = {
            "samples_s": [total],
            "repeat_medians_s": [total],
            "repeat_rates": [1 / total],
            "calls_per_repeat": 1,
            "warmup_calls": 0,
            "parts_s": parts,
        }
        for case in cases:
            self.events.emit("case", case=case.to_dict())
            self.emit(result_from_measurement(self.spec.name, case, measured, bytes_per_call=None), measured)


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
    parser = argparse.ArgumentParser(prog="rpcctl-bench-unit")
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
