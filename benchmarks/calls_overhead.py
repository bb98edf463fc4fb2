"""What call tracking (and the RRef tracking beside it) costs, measured A/B in the same
processes under one ``rpcctl launch``:

    python benchmarks/calls_overhead.py                 # 9 pairs of rounds, ~1-2 min
    python benchmarks/calls_overhead.py --pairs 15 --calls 5000 --steps 300 --json

Two ranks. Rank 0 runs rounds in pairs, tracking on then off, the order alternating from pair
to pair (so drift on a shared machine hits both arms alike):

- ``remote``: ``--calls`` sequential ``rpc.remote(worker1, echo, (tensor,))``, each waited for
  until the owner ran it (the RRef dropped at once, as most are);
- ``train``: ``--steps`` steps of a small parameter-server loop (``rpc_sync`` the weights from
  worker1, forward and backward of a 2-layer MLP, ``rpc_sync`` the gradients back).

Off means no tracking at all on the hot path: rank 0 calls torch's own functions (unwrapped)
and both ranks' hook queues are unset (worker1's server-side wrapper then only calls
through: one Python frame, which it cannot shed because torch captured it at ``init_rpc``).
On is what every rank runs by default. The figure is the ratio on/off of each pair's
throughput: median and spread (min, quartiles, max) over the pairs; beside it, the ratio of
rank 0's CPU time per call (all its threads, telemetry's sender included), off/on, which a
loaded machine blurs less than wall time. Targets (issue 8):
``remote`` ≥ 0.97, ``train`` ≥ 0.98 (tracking ≤ 2% of a step).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tracking_overhead import ROOT, _run  # noqa: E402 - the same launcher driver


def echo(x):
    return x


class ParameterServer:
    def __init__(self):
        import torch

        self.params = [torch.randn(256, 256) * 0.01, torch.zeros(256), torch.randn(10, 256) * 0.01, torch.zeros(10)]

    def weights(self):
        return self.params

    def update(self, grads):
        for p, g in zip(self.params, grads):
            p -= 0.01 * g
        return True


_ps = None


def ps_weights():
    return _ps.weights()


def ps_update(grads):
    return _ps.update(grads)


def make_ps():
    global _ps
    _ps = ParameterServer()


def set_tracking(on: bool) -> None:
    """Both ranks: point the hooks at the telemetry queue, or at nothing (they call through)."""
    from rpcctl.telemetry import calls
    from rpcctl.telemetry.rrefs import hooks

    global _queue
    if "_queue" not in globals():
        _queue = calls._q
    calls._q = hooks._q = _queue if on else None


def workload(calls: int, steps: int, pairs: int) -> None:
    import torch
    import torch.distributed.rpc as rpc

    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    if rank == 0:
        from rpcctl.telemetry import calls as tracking

        if tracking._q is None:
            raise SystemExit("telemetry is off in this rank: run this under rpcctl launch with telemetry on")
        hooked = {"remote": rpc.remote, "rpc_sync": rpc.rpc_sync}
        plain = {name: inspect.unwrap(fn) for name, fn in hooked.items()}
        rpc.rpc_sync("worker1", make_ps)
        x = torch.ones(16)
        batch, target = torch.randn(64, 256), torch.randint(0, 10, (64,))

        def remote_round(api) -> tuple[float, float]:
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                api["remote"]("worker1", echo, args=(x,))._get_future().wait()
            return calls / (time.perf_counter() - start), (time.process_time() - cpu) / calls

        def train_round(api) -> tuple[float, float]:
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                w1, b1, w2, b2 = (p.requires_grad_() for p in api["rpc_sync"]("worker1", ps_weights))
                loss = torch.nn.functional.cross_entropy(torch.relu(batch @ w1.T + b1) @ w2.T + b2, target)
                loss.backward()
                api["rpc_sync"]("worker1", ps_update, args=([w1.grad, b1.grad, w2.grad, b2.grad],))
            return steps / (time.perf_counter() - start), (time.process_time() - cpu) / steps

        def arm(on: bool, work) -> tuple[float, float]:
            rpc.rpc_sync("worker1", set_tracking, args=(on,))
            set_tracking(on)
            return work(hooked if on else plain)

        for work in (remote_round, train_round):  # warm-up: connections, thread pools, allocator
            work(plain)
            work(hooked)
        result: dict[str, dict] = {}
        for name, work in (("remote", remote_round), ("train", train_round)):
            ratios, cpu_ratios, on_rates, off_rates = [], [], [], []
            for pair in range(pairs):
                rates, cpus = {}, {}
                for on in ((True, False) if pair % 2 == 0 else (False, True)):
                    rates[on], cpus[on] = arm(on, work)
                ratios.append(rates[True] / rates[False])
                cpu_ratios.append(cpus[False] / cpus[True])  # rank 0's CPU per call, off / on: 1.0 = free
                on_rates.append(rates[True])
                off_rates.append(rates[False])
            quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
            result[name] = {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_q1": quartiles[0],
                            "ratio_q3": quartiles[2], "ratio_max": max(ratios), "on_per_s": statistics.median(on_rates),
                            "off_per_s": statistics.median(off_rates), "ratios": ratios,
                            "cpu_ratio_median": statistics.median(cpu_ratios), "cpu_ratio_min": min(cpu_ratios),
                            "cpu_ratio_max": max(cpu_ratios)}
        set_tracking(True)
        rpc.rpc_sync("worker1", set_tracking, args=(True,))
        print("RESULT " + json.dumps(result), flush=True)
    rpc.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=9, help="A/B pairs of rounds per workload")
    parser.add_argument("--calls", type=int, default=5000, help="sequential rpc.remote per round")
    parser.add_argument("--steps", type=int, default=200, help="training steps per round")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workload:
        workload(args.calls, args.steps, args.pairs)
        return
    script = Path(__file__).resolve()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="rpcctl-calls-overhead-") as tmp:
        config = Path(tmp) / "calls-overhead.yaml"
        work_args = ["--workload", "--calls", str(args.calls), "--steps", str(args.steps), "--pairs", str(args.pairs)]
        config.write_text(json.dumps({"name": "calls-overhead", "script": str(script), "args": work_args, "nproc_per_node": 2,
                                      "timeout": 1800}))
        result = _run([sys.executable, "-m", "rpcctl", "launch", str(config), "--no-live", "--runs-dir", str(Path(tmp) / "runs")], env, 1800)
    report = {"calls": args.calls, "steps": args.steps, "pairs": args.pairs, "results": result}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"tracking on / off, same processes, {args.pairs} interleaved pairs (median [min, q1–q3, max]):")
    for name, label in (("remote", f"{args.calls} sequential rpc.remote"), ("train", f"{args.steps} parameter-server steps")):
        r = result[name]
        print(f"  {label:32} {r['ratio_median']:.3f}  [{r['ratio_min']:.3f}, {r['ratio_q1']:.3f}–{r['ratio_q3']:.3f}, {r['ratio_max']:.3f}]"
              f"   on {r['on_per_s']:.0f}/s, off {r['off_per_s']:.0f}/s")
        print(f"  {'':32} rank 0's CPU per call, off/on: {r['cpu_ratio_median']:.3f} [{r['cpu_ratio_min']:.3f}, {r['cpu_ratio_max']:.3f}]")


if __name__ == "__main__":
    main()
