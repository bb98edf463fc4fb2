"""The bench's per-rank program: ``rpcctl.runtime worker.py --unit UNIT.json``.

rpcctl's launcher starts it in every rank of one *unit* (a transport at one world size).
The unit file (written by ``rpcctl.bench.runner``) names the transport, its settings, the
cases, the timing, and the events file. Rank 0 drives and appends one JSON line per event
to the events file, which the bench command follows for its progress bar and its results::

    {"event": "case", "case": {...}}                      rank 0 starts a case
    {"event": "result", "result": {...BenchResult...}}    the case's figures
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


def run_unit(unit: dict, ctx=None, events: Events | None = None) -> list[dict]:
    """Run one unit in this rank; rank 0 returns the results (as dicts), the others ``[]``."""
    from rpcctl.bench.measure import closed_loop, measure, pipelined
    from rpcctl.bench.results import result_from_measurement
    from rpcctl.bench.suites import Case, Timing, payload
    from rpcctl.bench.transports import RankContext, TransportSpec, create

    ctx = ctx or RankContext.from_env()
    spec = TransportSpec.from_dict(unit["transport"])
    timing = Timing(**unit["timing"])
    cases = [Case(**c) for c in unit["cases"]]
    point_to_point = [c for c in cases if c.suite != "train"]
    train = [c for c in cases if c.suite == "train"]
    events = events or Events(None)
    driver = ctx.rank == 0
    transport = create(spec)
    results: list[dict] = []

    transport.setup(ctx)
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
                x = payloads.setdefault(case.payload_bytes, payload(case.payload_bytes))
                echoed = _check_echo(transport, case.op, x)

                def run_batch(calls: int, case=case, x=x):
                    transport.prepare(case.op, x, calls, case.in_flight)
                    if case.in_flight == 1:
                        return closed_loop(lambda: transport.wait(case.op, transport.issue(case.op, x)), calls)
                    return pipelined(lambda: transport.issue(case.op, x), lambda h: transport.wait(case.op, h), calls, case.in_flight)

                measurement = measure(run_batch, timing)
                result = result_from_measurement(spec.name, case, measurement.__dict__, bytes_per_call=echoed)
                results.append(result)
                events.emit("result", result=result)
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
        for case in train:
            if driver:
                events.emit("case", case=case.to_dict())
            measured = transport.train(case, timing)
            if driver:
                result = result_from_measurement(spec.name, case, measured, bytes_per_call=None)
                results.append(result)
                events.emit("result", result=result)
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


def _check_echo(transport, op: str, x) -> int:
    """One untimed round trip that must bring back the payload intact; returns bytes moved."""
    import torch

    transport.prepare(op, x, 1, 1)
    back = transport.wait(op, transport.issue(op, x))
    if not isinstance(back, torch.Tensor) or back.shape != x.shape or not torch.equal(back, x):
        raise AssertionError(f"{op}: the echoed payload differs from what was sent ({x.numel()} bytes)")
    return x.numel() * x.element_size() + back.numel() * back.element_size()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rpcctl-bench-worker")
    parser.add_argument("--unit", required=True, help="the unit file (JSON) written by `rpcctl bench`")
    args = parser.parse_args(argv)
    unit = json.loads(Path(args.unit).read_text())
    run_unit(unit, events=Events(unit.get("events")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
