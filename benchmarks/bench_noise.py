"""How still does ``rpcctl bench`` hold? The same bench in four set-ups, each run several times:

    one launch per transport (rounds 1, the old way)  vs  transports interleaved (rounds 3)
    ranks free to move                                vs  each rank pinned to a core (--pin)

For every set-up, two figures, medians over the rows (transport × case):

- ``row noise``: the noise band the table shows (half the range of the repeats, ±%);
- ``run-to-run``: how far a row's speed relative to ``rpc`` (VS RPC) moves between runs of the
  same set-up (half the range over the runs, ±%): the drift one launch per transport cannot
  see, and the figure a reader of VS RPC relies on.

Set-ups run in turn (A B C D, A B C D, ...) so that the machine's drift falls on all of them.
Run it on the machine you care about; the figures in docs/bench.md came from this script.

    python benchmarks/bench_noise.py [--runs 3] [--transports rpc,gloo,tcp] [--suites latency,payload]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETUPS = {
    "one launch each": ["--rounds", "1"],
    "interleaved x3": ["--rounds", "3"],
    "one launch each, pinned": ["--rounds", "1", "--pin"],
    "interleaved x3, pinned": ["--rounds", "3", "--pin"],
}


def run_bench(args: list[str], runs_dir: Path) -> tuple[dict, float]:
    began = time.monotonic()
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("rpcctl")),
            "bench",
            "--quick",
            "--json",
            "--runs-dir",
            str(runs_dir),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout), time.monotonic() - began


def row_key(row: dict) -> tuple:
    return (row["transport"], row["suite"], row["op"], row["payload_bytes"], row["in_flight"])


def half_range(values: list[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / 2 / middle if middle else float("inf")


def summarize(documents: list[dict]) -> dict[str, float]:
    noise = [r["spread"] / 2 for d in documents for r in d["results"] if r.get("supported", True)]
    ratios: dict[tuple, list[float]] = {}
    for d in documents:
        for r in d["results"]:
            if r["transport"] != "rpc" and r.get("vs_rpc"):
                ratios.setdefault(row_key(r), []).append(r["vs_rpc"])
    drift = [half_range(v) for v in ratios.values() if len(v) == len(documents)]
    noisy = [r["noisy"] for d in documents for r in d["results"] if r.get("supported", True)]
    return {
        "row_noise": statistics.median(noise),
        "run_to_run": statistics.median(drift) if drift else float("nan"),
        "noisy_share": sum(noisy) / len(noisy),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each set-up (default 3)")
    parser.add_argument("--transports", default="rpc,gloo,tcp")
    parser.add_argument("--suites", default="latency,payload")
    parser.add_argument("--repeats", type=int, default=6, help="repeats per row, split between the rounds (default 6)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    common = ["--transport", args.transports, "--suite", args.suites, "--repeats", str(args.repeats)]
    documents: dict[str, list[dict]] = {name: [] for name in SETUPS}
    seconds: dict[str, list[float]] = {name: [] for name in SETUPS}
    with tempfile.TemporaryDirectory(prefix="bench-noise-") as tmp:
        for i in range(args.runs):
            for name, extra in SETUPS.items():
                document, took = run_bench(common + extra, Path(tmp))
                documents[name].append(document)
                seconds[name].append(took)
                print(f"run {i + 1}/{args.runs}: {name}: {took:.0f} s", file=sys.stderr, flush=True)
    figures = {
        name: {**summarize(docs), "seconds": statistics.median(seconds[name])} for name, docs in documents.items()
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"{'set-up':26} {'row noise':>10} {'run-to-run':>11} {'noisy rows':>11} {'time':>7}")
    for name, f in figures.items():
        print(
            f"{name:26} {f['row_noise'] * 100:>9.0f}% {f['run_to_run'] * 100:>10.0f}%"
            f" {f['noisy_share'] * 100:>10.0f}% {f['seconds']:>6.0f}s"
        )
    base = figures["one launch each"]["run_to_run"]
    for name, f in figures.items():
        if name != "one launch each" and base:
            change = f["run_to_run"] / base - 1
            print(
                f"{name}: run-to-run spread of VS RPC {abs(change) * 100:.0f}%"
                f" {'smaller' if change < 0 else 'larger'} than one launch each"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
