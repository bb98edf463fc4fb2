"""Why ``rpc.tuning: auto`` was slower at some payloads: what each of its settings does to the
memory an RPC echo allocates, counted in page faults (which the load on a shared machine does
not blur) beside the wall time (which it does).

    python benchmarks/rpc_allocation.py                 # every setting, 2 interleaved rounds, ~2 min
    python benchmarks/rpc_allocation.py --rounds 3 --json

Each setting is one ``rpcctl launch`` of 2 ranks (forked, as ``rpcctl bench`` runs them): rank 0
echoes a ``uint8`` tensor of each size off rank 1 with ``rpc_sync``, then keeps 64 8-byte
``rpc_async`` calls in flight. Per call: minor page faults of both processes (``getrusage``:
every fault is a fresh 4 KiB page, or 2 MiB one with huge pages, that the kernel had to zero
and map) and the median wall time. The settings:

=========  ==========================================================================
default    TensorPipe's defaults (shm transport already: ``rpcctl bench`` observes it)
thp        THP_MEM_ALLOC_ENABLE=1: c10 puts CPU tensors ≥ 2 MiB on 2 MiB-aligned,
           huge-page-advised memory
malloc     glibc keeps freed blocks < 32 MiB for reuse (MALLOC_MMAP_THRESHOLD_,
           MALLOC_TRIM_THRESHOLD_), applied with mallopt in each rank
auto       what ``rpc.tuning: auto`` sets now (thp + malloc)
=========  ==========================================================================
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = re.compile(r"RESULT (\{.*\})")
SIZES = [1 << 10, 256 << 10, 4 << 20, 16 << 20, 64 << 20]


def echo(x):
    return x


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def workload(calls: int) -> None:
    import torch
    import torch.distributed.rpc as rpc

    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    if rank == 0:
        result = {}

        def measure(label, n, one_call):
            for _ in range(3):
                one_call()  # warm-up: buffers, connections, heap growth
            mine, theirs = faults(), rpc.rpc_sync("worker1", faults)
            times = []
            for _ in range(n):
                start = time.perf_counter()
                one_call()
                times.append(time.perf_counter() - start)
            mine, theirs = faults() - mine, rpc.rpc_sync("worker1", faults) - theirs
            result[label] = {"faults_per_call": (mine + theirs) / n, "p50_s": statistics.median(times)}

        for size in SIZES:
            payload = torch.ones(size, dtype=torch.uint8)
            n = max(4, min(calls, (256 << 20) // size))
            measure(
                f"echo {size >> 10} KiB" if size < (1 << 20) else f"echo {size >> 20} MiB",
                n,
                lambda payload=payload: rpc.rpc_sync("worker1", echo, args=(payload,)),
            )
        tiny = torch.ones(8, dtype=torch.uint8)
        measure(
            "64 in flight",
            max(4, calls // 4),
            lambda: torch.futures.wait_all([rpc.rpc_async("worker1", echo, args=(tiny,)) for _ in range(64)]),
        )
        result["64 in flight"]["faults_per_call"] /= 64
        result["64 in flight"]["p50_s"] /= 64
        print("RESULT " + json.dumps(result), flush=True)
    rpc.shutdown()


def settings() -> dict[str, dict[str, str]]:
    sys.path.insert(0, str(ROOT))
    from rpcctl.base.rpc_settings import AUTO_SETTINGS, MALLOC_REUSE

    return {
        "default": {},
        "thp": {"THP_MEM_ALLOC_ENABLE": "1"},
        "malloc": dict(MALLOC_REUSE),
        "auto": dict(AUTO_SETTINGS["env"]),
    }


def launch(env_settings: dict[str, str], calls: int, tmp: Path) -> dict:
    config = tmp / "job.yaml"
    config.write_text(
        json.dumps(
            {
                "name": "rpc-allocation",
                "script": str(Path(__file__).resolve()),
                "args": ["--workload", "--calls", str(calls)],
                "nproc_per_node": 2,
                "timeout": 600,
                "env": env_settings,
            }
        )
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["RPCCTL_TELEMETRY_DISABLE"] = "1"  # the allocations measured are RPC's alone
    cmd = [sys.executable, "-m", "rpcctl", "launch", str(config), "--no-live", "--runs-dir", str(tmp / "runs")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=700)
    match = RESULT.search(proc.stdout)
    if proc.returncode != 0 or match is None:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=40, help="calls per case (fewer for large payloads)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workload:
        workload(args.calls)
        return
    configs = settings()
    samples: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="rpcctl-rpc-allocation-") as tmp:
        for r in range(args.rounds):
            names = list(configs)
            names = names[r % len(names) :] + names[: r % len(names)]  # rotate: drift hits every setting alike
            for name in names:
                samples[name].append(launch(configs[name], args.calls, Path(tmp)))
                print(f"round {r + 1}/{args.rounds}: {name} done", file=sys.stderr, flush=True)
    cases = list(samples["default"][0])
    report = {
        name: {
            case: {
                "faults_per_call": statistics.median(s[case]["faults_per_call"] for s in runs),
                "p50_s": statistics.median(s[case]["p50_s"] for s in runs),
            }
            for case in cases
        }
        for name, runs in samples.items()
    }
    if args.json:
        print(json.dumps({"settings": configs, "rounds": args.rounds, "results": report}, indent=2))
        return
    print(f"page faults per call, both ranks (median of {args.rounds} launches; wall p50 in brackets):")
    print(f"{'':14}" + "".join(f"{name:>22}" for name in configs))
    for case in cases:
        cells = "".join(
            f"{report[n][case]['faults_per_call']:10.1f} [{report[n][case]['p50_s'] * 1e3:7.2f} ms]" for n in configs
        )
        print(f"{case:14}{cells}")


if __name__ == "__main__":
    main()
