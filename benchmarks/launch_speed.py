"""Wall time of `rpcctl launch` against `torchrun --standalone` on the same RPC script.

    python benchmarks/launch_speed.py [--nproc 4] [--pairs 7]

Each pair runs both launchers back to back, in alternating order (so neither always runs on a
warmer machine), on benchmarks/rpc_hello.py: init_rpc, one rpc_sync, shutdown. Reports the
median of each, the median of the per-pair ratios, and every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "rpc_hello.py"


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the samples here")
    args = parser.parse_args()

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "rpc_hello.yaml"
        config.write_text(f"name: rpc-hello\nscript: {SCRIPT}\nnproc_per_node: {args.nproc}\n")
        commands = {
            "torchrun": [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={args.nproc}",
                str(SCRIPT),
            ],
            "rpcctl": [
                sys.executable,
                "-m",
                "rpcctl",
                "launch",
                str(config),
                "--no-live",
                "--runs-dir",
                str(Path(tmp) / "runs"),
            ],
        }
        timed(commands["rpcctl"], env)  # warm the page cache for both (same torch files)
        samples: dict[str, list[float]] = {"torchrun": [], "rpcctl": []}
        for i in range(args.pairs):
            order = ["torchrun", "rpcctl"] if i % 2 == 0 else ["rpcctl", "torchrun"]
            for name in order:
                samples[name].append(timed(commands[name], env))
            print(
                f"pair {i + 1}/{args.pairs}: torchrun {samples['torchrun'][-1]:.2f}s"
                f"  rpcctl {samples['rpcctl'][-1]:.2f}s",
                file=sys.stderr,
            )

    ratios = [r / t for r, t in zip(samples["rpcctl"], samples["torchrun"])]
    summary = {
        "nproc": args.nproc,
        "pairs": args.pairs,
        "cpus": os.cpu_count(),
        "torchrun_median_s": statistics.median(samples["torchrun"]),
        "rpcctl_median_s": statistics.median(samples["rpcctl"]),
        "ratio_median": statistics.median(ratios),
        "samples": samples,
    }
    print(f"ranks: {args.nproc}, pairs: {args.pairs}, cpus: {os.cpu_count()}")
    print(
        f"torchrun --standalone  median {summary['torchrun_median_s']:.2f}s"
        f"  (min {min(samples['torchrun']):.2f}, max {max(samples['torchrun']):.2f})"
    )
    print(
        f"rpcctl launch          median {summary['rpcctl_median_s']:.2f}s"
        f"  (min {min(samples['rpcctl']):.2f}, max {max(samples['rpcctl']):.2f})"
    )
    print(f"rpcctl / torchrun      median of paired ratios {summary['ratio_median']:.2f}x  (target <= 0.60x)")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
