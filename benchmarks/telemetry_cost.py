"""What rpcctl's telemetry costs a job, measured in pairs: hooks on and hooks off, in the same
ranks of one ``rpcctl launch``, interleaved over several rounds.

    python benchmarks/telemetry_cost.py                      # 9 rounds of every shape, ~2.5 min
    python benchmarks/telemetry_cost.py --rounds 9 --json
    python benchmarks/telemetry_cost.py --shapes remote-churn --profile   # where the hooks' time goes
    python benchmarks/telemetry_cost.py --only calls     # one family of hooks (rrefs | calls) on and off

Why pairs: separate launches on a shared machine vary by more than the effect (one launch can
be 20% off the next for no reason of its own). Here the same two processes run each shape with
the hooks on and with them off (``rpcctl.rank.reporter.set_hooks``: off, every hook calls
straight through, in both ranks; the sender threads keep running, as they would), in blocks of
alternating order (on-off, off-on, ...), so drift and warm-up hit both sides alike. A round's ratio is
``rate(on) / rate(off)``; the report is the median over rounds, with the lowest and highest
ratio beside it. 1.00 means free; the target is ≥ 0.97 for every shape.

The shapes (``SHAPES``; each is a function of the rank-0 context that does a fixed amount of work
and returns how many operations it did; add one there and it is measured like the others):

============  ==================================================================================
remote-churn  ``rpc.remote`` + wait for the owner to create it + drop, one at a time (6,400 a side)
remote-64     ``rpc.remote`` with 64 in flight, each window dropped before the next (6,400)
async-64      ``rpc_async`` with 64 in flight (6,400)
train-step    a parameter-server step: remote forward, distributed autograd backward,
              ``DistributedOptimizer`` over parameter RRefs (``rpc.RRef(p)`` on the owner)
============  ==================================================================================

``--profile`` runs the chosen shapes once more with the hooks on under cProfile (in rank 0, which
makes the calls) and prints the functions of rpcctl's telemetry by their own time per operation.
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

ROOT = Path(__file__).resolve().parent.parent
CALLS = 6400  # 128 a block: 2 windows of 64 in flight


# ---------------------------------------------------------------------------------------------
# The workload: runs as each rank (rank 0 drives, rank 1 owns and serves)


def echo(x):
    return x


class Model:
    """The parameter server's model (lives on rank 1)."""

    def __init__(self):
        import torch

        self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))

    def forward(self, x):
        return self.net(x)

    def parameter_rrefs(self):
        import torch.distributed.rpc as rpc

        return [rpc.RRef(p) for p in self.net.parameters()]


def remote_churn(ctx, n: int) -> int:
    rpc, x = ctx["rpc"], ctx["x"]
    for _ in range(n):
        rref = rpc.remote("worker1", echo, args=(x,))
        rref._get_future().wait()  # created on the owner
        del rref
    return n


def remote_64(ctx, n: int) -> int:
    rpc, torch, x = ctx["rpc"], ctx["torch"], ctx["x"]
    windows = max(1, n // 64)
    for _ in range(windows):
        window = [rpc.remote("worker1", echo, args=(x,)) for _ in range(64)]
        torch.futures.wait_all([r._get_future() for r in window])
        del window
    return windows * 64


def async_64(ctx, n: int) -> int:
    rpc, torch, x = ctx["rpc"], ctx["torch"], ctx["x"]
    windows = max(1, n // 64)
    for _ in range(windows):
        torch.futures.wait_all([rpc.rpc_async("worker1", echo, args=(x,)) for _ in range(64)])
    return windows * 64


def train_step(ctx, n: int) -> int:
    import torch.distributed.autograd as dist_autograd

    rpc, torch = ctx["rpc"], ctx["torch"]
    if "model" not in ctx:
        from torch.distributed.optim import DistributedOptimizer

        ctx["model"] = model = rpc.remote("worker1", Model)
        ctx["optimizer"] = DistributedOptimizer(torch.optim.SGD, model.rpc_sync().parameter_rrefs(), lr=0.01)
        ctx["batch"] = torch.randn(32, 64)
    model, optimizer, batch = ctx["model"], ctx["optimizer"], ctx["batch"]
    for _ in range(n):
        with dist_autograd.context() as context:
            loss = model.rpc_sync().forward(batch).pow(2).mean()
            dist_autograd.backward(context, [loss])
            optimizer.step(context)
    return n


# shape → (function, operations per side per round)
SHAPES = {
    "remote-churn": (remote_churn, CALLS),
    "remote-64": (remote_64, CALLS),
    "async-64": (async_64, CALLS),
    "train-step": (train_step, 500),  # 20 steps a block
}
# A round alternates on and off this many times per side: 256 calls a block (~0.1 s). The VM's
# fast and slow spells last a fraction of a second (where its scheduler puts TensorPipe's polling
# threads), and 10 blocks a side left single rounds 0.85-1.15x apart, the median of 11 ±3% from
# run to run; shorter still (50 a side, ~35 ms) a block is shorter than a sender cycle (0.1 s),
# and whether one falls in it decided the async-64 rounds.
BLOCKS = 25


ONLY = os.environ.get("RPCCTL_COST_ONLY") or None  # --only: toggle one family of hooks, the others stay on


def _set_hooks(on: bool) -> None:
    from rpcctl.rank import reporter

    reporter.set_hooks(on, ONLY)


def _job_cpu(ctx: dict) -> float:
    """CPU seconds so far of both ranks, all their threads (telemetry's sender threads, torch's
    RPC threads): what the job pays, which a loaded machine blurs less than wall time."""
    return time.process_time() + ctx["rpc"].rpc_sync("worker1", time.process_time)


def thread_cpu() -> dict[str, float]:
    """This process's CPU seconds so far by thread group: the main thread, each Python thread by
    its name, torch's and TensorPipe's native threads by their kernel name (``pt_thread_pool``,
    ``TP_UV_loop``, ...). From /proc's schedstat (nanoseconds); {} where there is none."""
    import threading

    named = {t.native_id: t.name for t in threading.enumerate()}
    groups: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return groups
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
        group = "main" if int(tid) == os.getpid() else named.get(int(tid)) or comm
        groups[group] = groups.get(group, 0.0) + ns / 1e9
    return groups


_GC = {"n": [0, 0, 0], "s": [0.0, 0.0, 0.0], "t0": 0.0}  # this process's collections by generation: count, seconds


def _count_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _GC["t0"] = time.perf_counter()
    else:
        _GC["n"][info["generation"]] += 1
        _GC["s"][info["generation"]] += time.perf_counter() - _GC["t0"]


def thread_cpu_and_gc() -> dict[str, float]:
    """thread_cpu, and the garbage collector's collections and seconds by generation so far
    ("gc gen2 n", "gc gen2 s"...): telemetry's objects living until the sender takes them can
    make a job collect more often."""
    import gc

    if _count_collection not in gc.callbacks:
        gc.callbacks.append(_count_collection)
    out = thread_cpu()
    for g in range(3):
        out[f"gc gen{g} n"] = float(_GC["n"][g])
        out[f"gc gen{g} s"] = _GC["s"][g]
    return out


def _both_threads(ctx: dict) -> dict[str, float]:
    mine = {f"rank0 {k}": v for k, v in thread_cpu_and_gc().items()}
    theirs = ctx["rpc"].rpc_sync("worker1", thread_cpu_and_gc)
    return mine | {f"rank1 {k}": v for k, v in theirs.items()}


def one_round(ctx: dict, shape: str, first_on: bool, threads: bool = False) -> dict:
    """One round of ``shape``: BLOCKS blocks per side, alternating; per side [ops, seconds,
    caller thread CPU seconds, both ranks' CPU seconds], and with ``threads`` each side's CPU
    seconds by thread group ("threads on" / "threads off")."""
    fn, ops = SHAPES[shape]
    block = max(1, ops // BLOCKS)
    totals: dict = {True: [0.0, 0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0, 0.0]}
    by_thread: dict[bool, dict[str, float]] = {True: {}, False: {}}
    for b in range(2 * BLOCKS):
        on = first_on if b % 2 == 0 else not first_on
        _set_hooks(on)
        ctx["rpc"].rpc_sync("worker1", _set_hooks, args=(on,))  # the callee's hooks too
        before = _both_threads(ctx) if threads else {}
        job_cpu = _job_cpu(ctx)
        cpu, start = time.thread_time(), time.perf_counter()
        done = fn(ctx, block)
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
        job_cpu = _job_cpu(ctx) - job_cpu
        for group, seconds in (_both_threads(ctx) if threads else {}).items():
            by_thread[on][group] = by_thread[on].get(group, 0.0) + seconds - before.get(group, 0.0)
        for i, value in enumerate((done, elapsed, cpu, job_cpu)):
            totals[on][i] += value
    totals["threads on"], totals["threads off"] = by_thread[True], by_thread[False]
    _set_hooks(True)
    ctx["rpc"].rpc_sync("worker1", _set_hooks, args=(True,))
    return totals


def workload(shapes: list[str], rounds: int, profile: bool, threads: bool, result_path: str) -> None:
    import torch
    import torch.distributed.rpc as rpc

    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    if rank == 0:
        if "rpcctl.rank.reporter" not in sys.modules:
            raise SystemExit("run under `rpcctl launch` with telemetry on: there is nothing to turn off here")
        ctx = {"rpc": rpc, "torch": torch, "x": torch.ones(16)}
        result: dict = {
            s: {"ratio": [], "on": [], "off": [], "cpu_on_us": [], "cpu_off_us": [], "job_on_us": [], "job_off_us": []}
            for s in shapes
        }
        for shape in shapes:  # warm-up: connections, thread pools, first pickling, the model
            SHAPES[shape][0](ctx, max(1, SHAPES[shape][1] // 10))
        for r in range(rounds):
            for i, shape in enumerate(shapes):
                totals = one_round(ctx, shape, first_on=(r + i) % 2 == 0, threads=threads)
                (on_ops, on_s, on_cpu, on_job), (off_ops, off_s, off_cpu, off_job) = totals[True], totals[False]
                row = result[shape]
                row["on"].append(on_ops / on_s)
                row["off"].append(off_ops / off_s)
                row["ratio"].append(row["on"][-1] / row["off"][-1])
                row["cpu_on_us"].append(on_cpu / on_ops * 1e6)
                row["cpu_off_us"].append(off_cpu / off_ops * 1e6)
                row["job_on_us"].append(on_job / on_ops * 1e6)
                row["job_off_us"].append(off_job / off_ops * 1e6)
                if threads:  # CPU by thread group, summed over the rounds: (seconds, ops) per side
                    sums = row.setdefault("threads", {})
                    for side, ops_done in (("on", on_ops), ("off", off_ops)):
                        for group, seconds in totals[f"threads {side}"].items():
                            cell = sums.setdefault(group, {"on": [0.0, 0], "off": [0.0, 0]})[side]
                            cell[0] += seconds
                            cell[1] += ops_done
        if profile:
            result = {"shapes": result, "profile": _profile(shapes, ctx)}
        else:
            result = {"shapes": result}
        ctx.clear()
        # A file, not a log line: rpcctl splits a rank's lines past 8 KiB, and --threads makes it longer.
        Path(result_path).write_text(json.dumps(result))
    rpc.shutdown()


def _profile(shapes: list[str], ctx: dict) -> dict[str, list]:
    """Per shape: rpcctl's telemetry functions by own time, µs per operation (hooks on)."""
    import cProfile
    import pstats

    telemetry_dir = str(ROOT / "rpcctl" / "rank")
    out = {}
    for shape in shapes:
        fn, ops = SHAPES[shape]
        profiler = cProfile.Profile()
        profiler.enable()
        done = fn(ctx, ops)
        profiler.disable()
        stats = pstats.Stats(profiler).stats
        rows = []
        for (path, line, name), (_, calls, own, cumulative, _) in stats.items():
            if path.startswith(telemetry_dir):
                rows.append(
                    [f"{Path(path).name}:{line} {name}", calls / done, own / done * 1e6, cumulative / done * 1e6]
                )
        rows.sort(key=lambda row: -row[2])
        out[shape] = rows[:12]
    return out


# ---------------------------------------------------------------------------------------------
# The driver


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def measure(
    shapes: list[str], rounds: int, profile: bool = False, timeout: float = 900.0, threads: bool = False
) -> dict:
    """Launch the workload once under rpcctl (2 ranks, telemetry on) and summarise its pairs."""
    script = Path(__file__).resolve()
    args = [
        "--workload",
        "--shapes",
        ",".join(shapes),
        "--rounds",
        str(rounds),
        *(["--profile"] if profile else []),
        *(["--threads"] if threads else []),
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="rpcctl-telemetry-cost-") as tmp:
        result = Path(tmp) / "result.json"
        args += ["--result", str(result)]
        config = Path(tmp) / "job.yaml"
        config.write_text(
            json.dumps(
                {"name": "telemetry-cost", "script": str(script), "args": args, "nproc_per_node": 2, "timeout": timeout}
            )
        )
        cmd = [
            sys.executable,
            "-m",
            "rpcctl",
            "launch",
            str(config),
            "--no-live",
            "--runs-dir",
            str(Path(tmp) / "runs"),
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 60)
        if proc.returncode != 0 or not result.exists():
            raise SystemExit(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        raw = json.loads(result.read_text())
    report = {"rounds": rounds, "blocks_per_side": BLOCKS, "target": 0.97, "shapes": {}}
    for shape in shapes:
        row = raw["shapes"][shape]
        report["shapes"][shape] = {
            "ops_per_side_per_round": SHAPES[shape][1] // BLOCKS * BLOCKS,
            "on_over_off": spread(row["ratio"]),
            "ops_per_s_on": statistics.median(row["on"]),
            "ops_per_s_off": statistics.median(row["off"]),
            "caller_cpu_us_per_op_on": statistics.median(row["cpu_on_us"]),
            "caller_cpu_us_per_op_off": statistics.median(row["cpu_off_us"]),
            "job_cpu_us_per_op_on": statistics.median(row["job_on_us"]),
            "job_cpu_us_per_op_off": statistics.median(row["job_off_us"]),
            # The CPU the job spends per operation without telemetry over with it: the speed
            # the job would keep were it CPU-bound (the same target, 0.97).
            "job_cpu_off_over_on": spread([off / on for on, off in zip(row["job_on_us"], row["job_off_us"])]),
        }
        if "threads" in row:  # µs per op by thread group, on and off, the largest extra first
            groups = {
                g: {side: (c[side][0] / c[side][1] * 1e6 if c[side][1] else 0.0) for side in ("on", "off")}
                for g, c in row["threads"].items()
            }
            report["shapes"][shape]["thread_cpu_us_per_op"] = dict(
                sorted(
                    ((g, c) for g, c in groups.items() if " gc " not in g),
                    key=lambda item: item[1]["off"] - item[1]["on"],
                )
            )
            # collections per million operations, and µs of collecting per operation, by rank and generation
            report["shapes"][shape]["gc"] = {g: c for g, c in groups.items() if " gc " in g and (c["on"] or c["off"])}
    if "profile" in raw:
        report["profile"] = raw["profile"]
    return report


def render(report: dict) -> str:
    lines = [
        f"telemetry on / off in the same ranks: {report['rounds']} rounds"
        f" of {report['blocks_per_side']} alternating blocks per side",
        "(speed: ops/s on over off; job CPU: both ranks' CPU per op, off over on; each the median of rounds,",
        " lowest-highest round beside it; CPU µs/op on / off: the calling thread's, and both ranks' all threads')",
        f"  {'shape':14}{'speed':>7}  {'range':>13}  {'job CPU':>7}  {'range':>13}  {'ops/s on':>9}  {'ops/s off':>9}"
        f"  {'caller µs/op':>15}  {'job µs/op':>15}",
    ]
    for shape, row in report["shapes"].items():
        r, j = row["on_over_off"], row["job_cpu_off_over_on"]
        verdict = "" if min(r["median"], j["median"]) >= report["target"] else f"  below {report['target']}"
        cpu = f"{row['caller_cpu_us_per_op_on']:6.1f} / {row['caller_cpu_us_per_op_off']:<6.1f}"
        job = f"{row['job_cpu_us_per_op_on']:6.1f} / {row['job_cpu_us_per_op_off']:<6.1f}"
        lines.append(
            f"  {shape:14}{r['median']:7.3f}  {r['min']:6.3f}-{r['max']:<6.3f}"
            f"  {j['median']:7.3f}  {j['min']:6.3f}-{j['max']:<6.3f}"
            f"  {row['ops_per_s_on']:9.0f}  {row['ops_per_s_off']:9.0f}  {cpu:>15}  {job:>15}{verdict}"
        )
    for shape, row in report["shapes"].items():
        if "thread_cpu_us_per_op" in row:
            lines.append(f"\n{shape}: CPU by thread, µs per operation on / off (largest extra first)")
            lines.extend(
                f"  {g:34} {c['on']:8.1f} / {c['off']:<8.1f} {c['on'] - c['off']:+8.1f}"
                for g, c in list(row["thread_cpu_us_per_op"].items())[:10]
            )
            if row.get("gc"):
                lines.append(
                    f"{shape}: garbage collections per million operations (n)"
                    " and µs per operation collecting (s), on / off"
                )
                lines.extend(f"  {g:34} {c['on']:8.1f} / {c['off']:<8.1f}" for g, c in row["gc"].items())
    for shape, rows in report.get("profile", {}).items():
        lines.append(f"\n{shape}: telemetry functions by own time (µs per operation; calls per operation)")
        lines.extend(
            f"  {own:7.2f} µs  {cum:7.2f} µs cumulative  {calls:5.2f}×  {name}" for name, calls, own, cum in rows
        )
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds",
        type=_positive,
        default=9,
        help="on/off pairs per shape (default 9: on 2 cores, 5 leave the median ±3%% from run to run)",
    )
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of: {', '.join(SHAPES)}")
    parser.add_argument("--profile", action="store_true", help="also profile the hooks (cProfile, hooks on)")
    parser.add_argument(
        "--only", choices=("rrefs", "calls"), help="turn only this family of hooks on and off (the others stay on)"
    )
    parser.add_argument("--threads", action="store_true", help="also show both ranks' CPU by thread, on and off")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(map(repr, unknown))}; known: {', '.join(SHAPES)}")
    if args.workload:
        workload(shapes, args.rounds, args.profile, args.threads, args.result)
        return
    if args.only:
        os.environ["RPCCTL_COST_ONLY"] = args.only  # the ranks inherit it
    report = measure(shapes, args.rounds, args.profile, threads=args.threads)
    report["only"] = args.only
    print(json.dumps(report, indent=2) if args.json else render(report))


if __name__ == "__main__":
    main()
