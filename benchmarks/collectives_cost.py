"""What recording collectives costs a DDP-style step loop, measured by separate launches,
interleaved: ``rpcctl launch`` with telemetry (collectives recorded), ``rpcctl launch`` with
telemetry off (``RPCCTL_TELEMETRY_DISABLE=1``: no sender thread, no Flight Recorder set up),
and ``torchrun --standalone``, in rotating order over several rounds.

    python benchmarks/collectives_cost.py                 # 5 rounds, 3 ranks, ~4 min on 2 cores
    python benchmarks/collectives_cost.py --rounds 9 --steps 3000 --json

Each launch runs the same loop in 3 ranks (gloo, CPU): per step a small matmul and one
all_reduce of 4 KiB (``--numel`` floats), ``--steps`` steps after 200 of warm-up. Each rank
times its own loop (wall and process CPU time); rank 0 prints the slowest rank's wall rate
and the mean CPU time per step. An A/B inside one process would miss what runs in both arms
(the sender thread, the recorder), hence separate launches. A round's ratio is rate(arm) /
rate(telemetry off); the report is the median over rounds with the lowest and highest.
The target is ≥ 0.97 (issue 27).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

LOOP = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist

    steps, numel = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    w = torch.randn(64, 64)
    grad = torch.ones(numel)
    for _ in range(200):
        dist.all_reduce(grad)
    dist.barrier()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        x = torch.randn(32, 64) @ w
        grad.fill_(float(x.mean()))
        dist.all_reduce(grad)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    mine = torch.tensor([wall, cpu], dtype=torch.float64)
    slowest = mine.clone(); dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    total = mine.clone(); dist.all_reduce(total)
    if dist.get_rank() == 0:
        print(f"RESULT rate={steps / slowest[0].item():.3f} cpu_ms={1e3 * total[1].item() / dist.get_world_size() / steps:.4f}", flush=True)
    dist.destroy_process_group()
    """
)
RESULT = re.compile(r"RESULT rate=([\d.]+) cpu_ms=([\d.]+)")
ARMS = ("telemetry", "off", "torchrun")


def launch(arm: str, folder: Path, steps: int, numel: int, nproc: int) -> tuple[float, float]:
    script = folder / "loop.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if arm == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               str(script), str(steps), str(numel)]
    else:
        config = folder / f"{arm}.yaml"
        config.write_text(json.dumps({
            "name": f"coll-cost-{arm}", "script": str(script), "args": [str(steps), str(numel)], "nproc_per_node": nproc,
            "timeout": 600, "env": {"OMP_NUM_THREADS": "1", **({"RPCCTL_TELEMETRY_DISABLE": "1"} if arm == "off" else {})},
        }))
        cmd = [sys.executable, "-m", "rpcctl", "launch", str(config), "--no-live", "--runs-dir", str(folder / "runs")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    found = RESULT.search(out.stdout + out.stderr)
    if out.returncode != 0 or not found:
        raise SystemExit(f"{arm}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return float(found.group(1)), float(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--numel", type=int, default=1024)
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "loop.py").write_text(LOOP)
        for round_ in range(args.rounds):
            order = ARMS[round_ % 3:] + ARMS[: round_ % 3]  # rotate: drift hits every arm alike
            for arm in order:
                results[arm].append(launch(arm, folder, args.steps, args.numel, args.nproc))
                print(f"round {round_ + 1} {arm}: {results[arm][-1][0]:.1f} steps/s, {results[arm][-1][1]:.3f} ms CPU/step",
                      file=sys.stderr)
    summary = {}
    for arm in ("telemetry", "torchrun"):
        rate = [a[0] / b[0] for a, b in zip(results[arm], results["off"])]
        cpu = [a[1] / b[1] for a, b in zip(results[arm], results["off"])]
        summary[arm] = {"rate_ratio_median": statistics.median(rate), "rate_ratio_min": min(rate), "rate_ratio_max": max(rate),
                        "cpu_ratio_median": statistics.median(cpu)}
    summary["raw"] = results
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    for arm in ("telemetry", "torchrun"):
        s = summary[arm]
        print(f"{arm} / telemetry off: rate x{s['rate_ratio_median']:.3f} (min {s['rate_ratio_min']:.3f}, max {s['rate_ratio_max']:.3f}),"
              f" CPU per step x{s['cpu_ratio_median']:.3f}")


if __name__ == "__main__":
    main()
