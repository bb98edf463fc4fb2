"""Where rpcctl's CPU goes in a rank, native frames included: ``benchmarks/launch_cost.py``'s
launches of one shape, telemetry on and off in alternating order, each under ``perf record``
(software cpu-clock sampling: it needs no hardware counters, so it works in a VM), and the
samples of the driving rank within its timed loop turned into µs per operation, by thread and,
for the calling thread, by native function, on minus off.

    python benchmarks/launch_cost_perf.py sync --pairs 2 --seconds 8
    python benchmarks/launch_cost_perf.py async --top 20 --threads main python
    python benchmarks/launch_cost_perf.py ddp --pairs 2        # rank 0's samples (one rank of 3), per step

Python 3.11 shows no Python function to perf: the Python code rpcctl adds shows as
``_PyEval_EvalFrameDefault`` and the C functions it calls (``time_time``, dict lookups, pybind's
dispatcher); torch's work by its own C++ names. The threads: ``main`` (the caller), ``python``
(threads Python started and nobody renamed: rpcctl's sender is one), ``pt_thread_pool``
(torch's RPC threads), ``TP_*`` (TensorPipe's; its shared-memory reactor busy-polls, so its
CPU follows the wall time). Needs ``perf`` (``apt install linux-perf`` or ``linux-tools``).

Measured (2026-12-06, a quiet machine, 2 pairs of 8 s, sync): before 15b53a3 the caller thread
+7.0 µs per call (``_PyEval_EvalFrameDefault`` +4.4 of it, the rest ~0.2 each: time, frames,
nbytes), the sender +7.2; after (rpc_sync sampled per function), ``_PyEval_EvalFrameDefault``
+2.1 and the sender +3.6, while the caller's total still moved by ±10 µs pair to pair.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launch_cost  # noqa: E402 - the launches, as that benchmark makes them
from launch_cost import compile_linear  # noqa: E402 - RE2: rank output and perf's lines in linear time

FREQ = 4000  # samples per second per thread
SAMPLE = compile_linear(r"^\s*(\S.*?)\s+(\d+)/(\d+)\s+([\d.]+):\s+[0-9a-f]+\s+(.*?)\s+\((\S+)\)\s*$")
WINDOW = compile_linear(r"RESULT .*? n=(\d+) window=([\d.]+),([\d.]+) pid=(\d+)")


def one(shape: str, arm: str, args: argparse.Namespace, folder: Path) -> dict[tuple[str, str], float]:
    """One launch under perf: the driving rank's µs per operation by (thread, function)."""
    cmd, env = launch_cost.command(arm, shape, folder, args)
    data = folder / f"{shape}-{arm}.data"
    run = subprocess.run(
        [
            "perf",
            "record",
            "-q",
            "-k",
            "CLOCK_MONOTONIC",
            "-e",
            "cpu-clock",
            "-F",
            str(FREQ),
            "-o",
            str(data),
            "--",
            *cmd,
        ],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=900,
    )
    found = WINDOW.search(run.stdout + run.stderr)
    if run.returncode != 0 or not found:
        raise SystemExit(f"{shape} {arm}: exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    n, t0, t1, pid = int(found.group(1)), float(found.group(2)), float(found.group(3)), found.group(4)
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,time,ip,sym,dso"],
        capture_output=True,
        text=True,
        timeout=900,
    ).stdout
    data.unlink()
    samples: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in script.splitlines():
        sample = SAMPLE.match(line)
        if not sample:
            continue
        comm, sample_pid, tid, t, sym, dso = sample.groups()
        if sample_pid != pid or not t0 <= float(t) <= t1:
            continue
        thread = "main" if tid == pid else ("TP_*" if comm.startswith("TP_") else comm.strip())
        samples[(thread, sym if sym != "[unknown]" else dso.rsplit("/", 1)[-1])] += 1
    return {key: k / FREQ / n * 1e6 for key, k in samples.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("shape", choices=sorted(launch_cost.SHAPES))
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--transport", choices=("default", "uv"), default="default", help="as launch_cost.py's")
    parser.add_argument(
        "--threads",
        nargs="+",
        default=["main"],
        metavar="THREAD",
        help="whose functions to list (main, python: rpcctl's sender among others, pt_thread_pool, TP_*)",
    )
    args = parser.parse_args(argv)
    if shutil.which("perf") is None:
        raise SystemExit("needs perf (linux-perf)")
    args.calls = args.fanouts = args.steps = 10**9
    args.numel, args.nproc, args.base = 1024, 3, None
    mean = {"on": collections.Counter(), "off": collections.Counter()}
    with tempfile.TemporaryDirectory(prefix="launch-cost-perf-") as tmp:
        for i in range(args.pairs):
            for arm in ("on", "off") if i % 2 == 0 else ("off", "on"):
                per_op = one(args.shape, arm, args, Path(tmp))
                print(
                    f"pair {i + 1} {arm}: main thread"
                    f" {sum(v for (t, _), v in per_op.items() if t == 'main'):.1f} µs per op",
                    file=sys.stderr,
                )
                for key, us in per_op.items():
                    mean[arm][key] += us / args.pairs
    threads: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for i, arm in enumerate(("on", "off")):
        for (thread, _), us in mean[arm].items():
            threads[thread][i] += us
    print(f"{args.shape}: µs per op by thread, on / off / on - off")
    for thread, (on, off) in sorted(threads.items(), key=lambda kv: -sum(kv[1]))[:10]:
        print(f"  {thread:20s} {on:9.2f} {off:9.2f} {on - off:+9.2f}")
    for thread in args.threads:
        keys = {key for arm in mean.values() for key in arm if key[0] == thread}
        diff = sorted(((mean["on"][k] - mean["off"][k], k[1]) for k in keys), reverse=True)
        print(f"thread {thread} by function, on - off (µs per op), most added first:")
        for d, sym in diff[: args.top]:
            print(f"  {d:+7.2f}  {sym[:110]}")


if __name__ == "__main__":
    main()
