"""What rpcctl's presence costs a rank, measured as a user meets it: the same script in separate
launches, ``rpcctl launch`` with telemetry on, ``rpcctl launch`` with ``RPCCTL_TELEMETRY_DISABLE=1``
(no hooks, no sender thread, no Flight Recorder set up), and ``torchrun --standalone``,
interleaved in rotating order over several rounds.

    python benchmarks/launch_cost.py                          # 10 rounds of every shape
    python benchmarks/launch_cost.py --shapes remote --rounds 12 --json
    python benchmarks/launch_cost.py --base /tmp/old/bin/python  # + an arm: telemetry on, an older rpcctl
    python benchmarks/launch_cost.py --profile remote         # one launch under py-spy --native, per arm

``benchmarks/collectives_cost.py`` is this script with ``--shapes ddp``. ``benchmarks/telemetry_cost.py``
is the other measure: the hooks alone, on and off inside one process; what runs in both of its
arms (the sender thread, its probes, the queue) is invisible to it, and visible here.

Each launch runs one shape (``SHAPES``; a loop of ~3 s after a warm-up) and prints, from the rank
that drives it, its wall rate and its process's CPU time per operation (every thread of it: the
sender's, torch's RPC threads'). On a shared machine the wall rate of one launch can be 20% off
the next for no reason of its own; CPU time per call is far steadier: decide by it, report both.
A round's ratio is arm / arm of the same round; the report is the median over rounds with the
lowest and highest. The target is ≥ 0.97 for on/off (issues 27 and 29).

==========  ========================================================================================
remote      rank 0: ``rpc.remote(worker1, torch.add, (x, 1)).to_here()``, one at a time (20,000)
sync        rank 0: ``rpc.rpc_sync(worker1, torch.add, (x, 1))``, a 16-float tensor (20,000)
async       rank 0: ``rpc_async`` fan-out: 16 calls to each of 2 workers in flight, then wait (1,000 rounds)
ddp         3 ranks (gloo): a small matmul and one all_reduce of 4 KiB per step, (``--steps``; the slowest
            rank's wall rate, the mean CPU per step)
==========  ========================================================================================

``--profile SHAPE`` runs SHAPE once per arm with every rank under ``py-spy record --native``
(``pip install py-spy``: a benchmark tool, not a dependency of rpcctl; it needs ptrace, as py-spy
does) and writes one speedscope file per arm and rank; ``--profile-top`` prints the functions
with the most samples in the driving rank, per arm, and by thread.

Measured (2026-12-06 10:32-10:53 UTC, 2 cores shared with a CI run and another helper's tests,
``uptime`` load average 1.6-4.3; ``--rounds 10 --seconds 2.5 --base`` the code before the cost2
branch (777df1e), 160 launches, 21 min). CPU ratios (b's CPU per op / a's: < 1, a costs more),
median (lowest..highest) over the 10 rounds:

======  ===================  ===================  ===================  ===================
shape   on/off               on/torchrun          off/torchrun         on/base (after/before)
======  ===================  ===================  ===================  ===================
remote  0.900 (0.741..1.090) 0.920 (0.654..1.196) 1.029 (0.711..1.255) 0.964 (0.744..1.220)
sync    0.928 (0.522..1.079) 0.926 (0.398..1.115) 0.960 (0.763..1.279) 0.940 (0.569..1.270)
async   0.944 (0.799..1.040) 0.945 (0.828..1.042) 1.033 (0.827..1.089) 0.974 (0.934..1.046)
ddp     1.029 (0.798..1.153) 1.083 (0.776..1.265) 1.007 (0.908..1.173) 0.986 (0.554..1.222)
======  ===================  ===================  ===================  ===================

Wall-rate ratios on/off: remote 1.02 (0.53..1.34), sync 0.76 (0.19..5.63), async 0.70
(0.56..1.14), ddp 1.01 (0.78..1.40). Single rounds still range over ±25%, so a median of 10 is
not good to 3%: the target (≥ 0.97) is met by ddp only here, and on/base says as little. The
sender thread's CPU per op, on (base): remote 7.9 (8.7) µs, sync 8.1 (8.6), async 368 (370)
per 32 calls, ddp 27.9 (44.2) per rank and step: 1.5-3.5% of a rank's CPU. The caller thread's
own CPU, on/off: remote 0.885, sync 0.874, async 0.957, ddp 1.029.

Measured again (2026-12-06 13:02-13:14 and 14:31-14:51 UTC, a quiet machine, load average 0.3-2.7,
``--shapes remote sync async --arms on off --rounds 10 --seconds 2.5``), CPU on/off, median
(lowest..highest), before and after 15b53a3 (rpc_sync timed per function, first 100 then 1 in 16;
the sender's share of a sync call 6.2 -> 3.5 µs, the hook's ~4.3 -> ~1.3 µs warm, ~2.2 since it
keeps its calls in flight in a table):

======  ===================  ===================
shape   before (1d89a24)     after (15b53a3)
======  ===================  ===================
remote  0.978 (0.747..1.049) 0.989 (0.750..1.161)
sync    0.956 (0.756..1.288) 0.947 (0.762..1.087)
async   0.913 (0.799..1.047) 0.983 (0.913..1.054)
======  ===================  ===================

(async's code was the same in both.) A median of 10 still moves by ±4% from run to run here, more
than what is left to find: single launches range over ±15% in CPU per op, with TensorPipe's
busy-polling reactor threads (two per rank pair) sharing 2 cores with the callers. So
``--transport uv`` (TensorPipe's TCP transport alone: no thread polls) measures the same hooks and
sender with a tenth of the spread; CPU on/off with it, 8 rounds (14:13-14:19 UTC, the code of
6e9532b: untimed rpc_sync calls kept in a table, the callee's served calls too), median
(lowest..highest): sync 0.968 (0.932..0.989), remote 0.964 (0.943..1.005), async 0.956
(0.905..0.980); the caller thread's own CPU 0.951, 0.951, 0.967; the sender's per op 2.6 µs, 5.8,
227 per 32 calls. So rpcctl costs these loopback loops 3-4.5% of the rank's CPU, a point or two
over the target (≥ 0.97): the caller's thread pays ~8-12 µs a call where its hooks measure
~2-4 µs warm in a micro-benchmark (``launch_cost_perf.py``: spread over the interpreter, no one
function), and the sender the rest.

Measured again (2026-12-06 16:10-17:20 UTC, a quiet machine, ``--transport uv``), after 6f78a98:
rpc_async timed per function, the first 100 then one in 64 (was one in 16 per process); the
sender tallies watched calls that ended well, and rpc.remote handles, by (callee, function).
CPU on/off, median (lowest..highest): 10 rounds, sync 0.977 (0.918..1.043), remote 0.965
(0.942..0.991), async 0.936 (0.899..1.020); 8 rounds an hour before, 0.980, 0.973, 0.960; async
in six runs of 5 rounds beside variants, 0.960-0.971. Before (1 run of 6 rounds, 64245de): 0.975,
0.970, 0.942. A median of 5-10 rounds still moves by ±2% from run to run for async, and a point
for the others. What the async fan-out's ~15 µs a call is made of, from variants of the hook run
as ``--base`` against ``on`` and ``off`` (5-8 rounds each; in situ, so ±1%): the hook calling
through at once costs nothing (base/off 1.012); its per-function schedule alone nothing (1.005);
its call site (``sys._getframe`` and the code lookup) 2-3% of the caller thread's CPU (2.1% in
8 interleaved rounds), under a point of the rank's; thread, start and the tuple, within the
noise; holding every future until the sender reads it with torch's ``done()`` and ``value()``
and frees it, ~5 µs a call of the sender's (~2.7 warm), 1.5-1.7% of the rank's.
``value()`` lets go of the GIL, as every method of torch's Future but ``done()`` does; reading
no outcome at all saved the sender only ~0.6 µs a call, and freeing the futures on the caller's
thread instead cost the caller more than the sender saved. Watching them by weak reference (the
job's thread frees them, as without rpcctl; the sender reads only those still alive) halved the
sender's CPU per op (214 -> 92 µs per 32 calls) and raised the caller's by as much: on/base
0.999, 6 rounds. Where a future is freed moves the cost; it does not remove it.
``benchmarks/launch_cost_perf.py`` samples both arms with perf instead (native frames; µs per op
by thread and function, on minus off) and shows what the ratios cannot: for sync, the caller's
``_PyEval_EvalFrameDefault`` +4.4 -> +2.1 µs and the sender +7.2 -> +3.6 µs per call.

Measured again (2026-12-06 19:30-19:43 UTC, a quiet machine, the code of 0a6aa6e, ``--shapes sync
remote async --arms on off --rounds 20 --seconds 3 --transport uv``), CPU on/off, median
(lowest..highest): sync 0.976 (0.852..1.057), remote 0.953 (0.813..1.074), async 0.968
(0.834..1.098); the caller thread's own CPU 0.954, 0.953, 0.966; the sender's per op 2.8 µs, 5.6,
223 per 32 calls. The same code has read, in medians of 5-10 rounds, remote 0.965 and 0.973, async
0.936-0.991 (0.991 beside a variant whose sender reads no outcome: 1.001, within the noise of it).
``launch_cost_perf.py remote``, 3 pairs then 2: the caller thread on - off -7.9 µs per call, then
+10.7; the sender +11.1, then +3.6. So the cost is 2-5% of a rank's CPU in these loopback loops,
and no one piece of it stands above a run's noise any more: what is left is what rpcctl records
per call (a call site, a start, an outcome; a record per RRef and per use of one).

Where the time goes. The sender, its sections timed in situ (one launch each, before the cost2
branch; ms over a ~4 s launch): sync 20 = summariser 12.4 (ended calls), send 3.6 (~0.09 ms a
cycle, encoding and the socket), probe 2.2 (psutil), tracker 0.9, the callee-stack look 0.5,
recorder 0.5; async 30 = harvest of the watched futures 17 (~5 µs a call; ~3.4 µs warm), send
4.3; ddp 38.5 = recorder 30 (a read of a full 256-entry ring: the dump 2.5 ms, unpickling 1.1,
decoding ≤ 3, each second), send 3.9. Cut since (micro-benchmarks, warm): the summariser's
stats key remembered (per ended rpc_sync 3.10 -> 2.55 µs, per watched rpc_async 3.94 -> 3.43, per
rpc.remote handle 1.17 -> 0.77); the probe from /proc/self/stat (157 -> 30 µs); recorder entries
sampled every 2 s, not read when nothing completed, and not decoded again once counted (1.31 ->
0.27 ms for a read of counted entries); the rpc_sync hook one frame shorter (4.8 -> 4.5 µs).
Not explained yet, and the larger part of what is left: the caller thread's own CPU is 4-13%
higher with telemetry on in the RPC shapes (remote +34 µs a call, sync +13, async +8), where the
hooks cost ~3-5 µs a call in micro-benchmarks; ``--profile`` got 40-50 py-spy samples in 4 s on
this load, too few to say where. On the Flight Recorder's side (ddp), torch gathers a Python
traceback for every entry (~8-18 µs per collective of the caller's, measured before), which
rpcctl cannot turn off (torch 2.13 has TORCH_FR_CPP_STACK, no switch for the Python stack). A
printing loop: a rank's line-buffered stdout (``lines.write_whole_lines``) costs 8.4 µs a print
to a pipe, against 17 µs unbuffered (PYTHONUNBUFFERED=1, which ranks run with) and 3.6 µs
block-buffered (torchrun's default to a pipe).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from rpcctl.base.linear_re import compile_linear  # RE2: a rank's output is matched in linear time

ROOT = Path(__file__).resolve().parent.parent

PROLOGUE = textwrap.dedent(
    """
    import glob, os, sys, threading, time
    import torch

    def add(x, y):
        return torch.add(x, y)

    TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")

    def thread_cpu_us(task):
        # a thread's CPU time: schedstat's run time (ns), else stat's utime + stime (clock ticks)
        try:
            with open(task + "/schedstat") as f:
                return int(f.read().split()[0]) / 1e3
        except FileNotFoundError:
            with open(task + "/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) * TICK_US

    def cpu_us():
        # (this process's CPU but its busy-polling transport threads', the calling thread's, rpcctl's
        # sender thread's) in µs: tensorpipe's shm reactor spins while it waits, so its CPU follows
        # the wall time (the machine's load), not the work done
        work = mine = sender = 0.0
        senders = {str(t.native_id) for t in threading.enumerate() if t.name == "rpcctl-telemetry"}
        for task in glob.glob("/proc/self/task/*"):
            try:
                with open(task + "/comm") as f:
                    if f.read().startswith("TP_SHM_reactor"):
                        continue
                used = thread_cpu_us(task)
            except OSError:  # a thread that ended meanwhile
                continue
            work += used
            tid = task.rsplit("/", 1)[1]
            if tid == str(os.getpid()):  # the main thread: the caller
                mine = used
            elif tid in senders:
                sender += used
        return work, mine, sender

    def profiler(seconds):
        # --profile: py-spy on this process for the timed loop, every thread, native frames too
        out = os.environ.get("LAUNCH_COST_PROFILE")
        if not out:
            return None
        import subprocess
        spy = subprocess.Popen([os.environ["LAUNCH_COST_PYSPY"], "record", "--native", "--threads", "--rate", "200",
                                "--format", "raw", "--duration", str(int(seconds)), "--pid", str(os.getpid()),
                                "--output", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached
        return spy

    def timed(loop, seconds, most, chunk, spy=None):
        # loop(chunk) until `seconds` passed or `most` operations were done
        wall0, (work0, mine0, sender0) = time.perf_counter(), cpu_us()
        WINDOW[0] = time.monotonic()
        n = 0
        while n < most and time.perf_counter() - wall0 < seconds:
            loop(chunk)
            n += chunk
        wall, (work, mine, sender) = time.perf_counter() - wall0, cpu_us()
        WINDOW[1] = time.monotonic()
        if spy is not None:
            spy.wait()
        return n, wall, work - work0, mine - mine0, sender - sender0

    WINDOW = [0.0, 0.0]  # the timed loop's CLOCK_MONOTONIC span: --perf keeps the samples within it

    def result(n, wall, work_us, mine_us, sender_us):
        print(f"RESULT rate={n / wall:.3f} cpu_us={work_us / n:.4f} caller_us={mine_us / n:.4f}"
              f" sender_us={sender_us / n:.4f} n={n} window={WINDOW[0]:.6f},{WINDOW[1]:.6f} pid={os.getpid()}",
              flush=True)
    """
)

RPC_SHAPE = textwrap.dedent(
    """
    import torch.distributed.rpc as rpc

    def main():
        shape, seconds, most = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        options = None
        if os.environ.get("LAUNCH_COST_TRANSPORT") == "uv":  # --transport uv: no busy-polling transport threads
            options = rpc.TensorPipeRpcBackendOptions(_transports=["uv"], _channels=["basic"])
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=options)
        if rank == 0:
            x = torch.ones(16)
            peers = [f"worker{i}" for i in range(1, world)]

            def remote(k):
                for _ in range(k):
                    rpc.remote("worker1", add, args=(x, 1)).to_here()

            def sync(k):
                for _ in range(k):
                    rpc.rpc_sync("worker1", add, args=(x, 1))

            def fan_out(k):
                for _ in range(k):
                    futs = [rpc.rpc_async(p, add, args=(x, 1)) for p in peers for _ in range(16)]
                    for f in futs:
                        f.wait()

            loop = {"remote": remote, "sync": sync, "async": fan_out}[shape]
            chunk = 10 if shape == "async" else 100
            timed(loop, seconds / 10, most, chunk)  # warm-up
            result(*timed(loop, seconds, most, chunk, profiler(seconds)))
        rpc.shutdown()

    main()
    """
)

DDP_SHAPE = textwrap.dedent(
    """
    import torch.distributed as dist

    def main():
        seconds, most, numel = float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        w = torch.randn(64, 64)
        grad = torch.ones(numel + 1)  # the last element: rank 0's "time is up", summed with the rest

        def steps(k, deadline=None):
            for _ in range(k):
                x = torch.randn(32, 64) @ w
                grad.fill_(float(x.mean()))
                grad[-1] = 1.0 if deadline is not None and time.perf_counter() > deadline else 0.0
                dist.all_reduce(grad)
                if grad[-1].item() > 0:
                    return True
            return False

        steps(200)
        dist.barrier()
        wall0, (work0, _, sender0) = time.perf_counter(), cpu_us()
        WINDOW[0] = time.monotonic()
        deadline = wall0 + seconds if dist.get_rank() == 0 else None
        n = 0
        while n < most:
            n += 10
            if steps(10, deadline):
                break
        wall, (work, _, sender) = time.perf_counter() - wall0, cpu_us()
        WINDOW[1] = time.monotonic()
        mine = torch.tensor([wall, work - work0, sender - sender0], dtype=torch.float64)
        slowest = mine.clone(); dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        total = mine.clone(); dist.all_reduce(total)
        if dist.get_rank() == 0:  # the slowest rank's rate, the mean CPU per step
            mean = total / dist.get_world_size()
            result(n, slowest[0].item(), mean[1].item(), mean[1].item(), mean[2].item())
        dist.destroy_process_group()

    main()
    """
)

# shape → (script body, ranks, its arguments from the command line's options)
SHAPES = {
    "remote": (RPC_SHAPE, lambda a: 2, lambda a: ["remote", str(a.seconds), str(a.calls)]),
    "sync": (RPC_SHAPE, lambda a: 2, lambda a: ["sync", str(a.seconds), str(a.calls)]),
    "async": (RPC_SHAPE, lambda a: 3, lambda a: ["async", str(a.seconds), str(a.fanouts)]),
    "ddp": (DDP_SHAPE, lambda a: a.nproc, lambda a: ["ddp", str(a.seconds), str(a.steps), str(a.numel)]),
}
RESULT = compile_linear(r"RESULT rate=([\d.]+) cpu_us=([\d.]+) caller_us=([\d.]+) sender_us=([\d.]+)")
ARMS = ("on", "off", "torchrun")
RATIOS = (("on", "off"), ("on", "torchrun"), ("off", "torchrun"), ("base", "off"), ("on", "base"))


def command(arm: str, shape: str, folder: Path, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    body, ranks, argv = SHAPES[shape]
    script = folder / f"{shape}.py"
    if not script.exists():
        script.write_text(PROLOGUE + body)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LAUNCH_COST_TRANSPORT": getattr(args, "transport", "default")}
    env.pop("RPCCTL_TELEMETRY_DISABLE", None)
    python = args.base if arm == "base" else sys.executable
    if arm == "torchrun":
        return [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(ranks(args)),
            str(script),
            *argv(args),
        ], env
    config = folder / f"{shape}-{arm}.yaml"
    config.write_text(
        json.dumps(
            {
                "name": f"cost-{shape}-{arm}",
                "script": str(script),
                "args": argv(args),
                "nproc_per_node": ranks(args),
                "timeout": 600,
                "env": {
                    "OMP_NUM_THREADS": "1",
                    "LAUNCH_COST_TRANSPORT": env["LAUNCH_COST_TRANSPORT"],
                    **({"RPCCTL_TELEMETRY_DISABLE": "1"} if arm == "off" else {}),
                },
            }
        )
    )
    return [python, "-m", "rpcctl", "launch", str(config), "--no-live", "--runs-dir", str(folder / "runs")], env


def launch(arm: str, shape: str, folder: Path, args: argparse.Namespace) -> tuple[float, ...]:
    cmd, env = command(arm, shape, folder, args)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=folder)
    found = RESULT.search(out.stdout + out.stderr)
    if out.returncode != 0 or not found:
        raise SystemExit(f"{shape} {arm}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return tuple(float(x) for x in found.groups())


# shape → arm → (rate, CPU µs per op, the caller thread's µs per op, the sender thread's µs per op)
Runs = dict[str, dict[str, list[tuple[float, ...]]]]


def measure(args: argparse.Namespace, folder: Path) -> Runs:
    arms = tuple(args.arms) + (("base",) if args.base else ())
    results = {shape: {arm: [] for arm in arms} for shape in args.shapes}
    for round_ in range(args.rounds):
        for shape in args.shapes:
            order = arms[round_ % len(arms) :] + arms[: round_ % len(arms)]  # rotate: drift hits every arm alike
            for arm in order:
                one = launch(arm, shape, folder, args)
                results[shape][arm].append(one)
                print(
                    f"round {round_ + 1} {shape} {arm}: {one[0]:.1f}/s, CPU per op {one[1]:.2f} µs"
                    f" (caller {one[2]:.2f}, sender {one[3]:.2f})",
                    file=sys.stderr,
                )
    return results


LOG_LINE = compile_linear(
    r"round \d+ (\w+) (\w+): ([\d.]+)/s, CPU per op ([\d.]+) µs \(caller ([\d.]+), sender ([\d.]+)\)"
)


def from_log(path: Path) -> Runs:
    """The launches a run's progress lines (its stderr) name: the figures of a run cut short."""
    results: Runs = {}
    for found in LOG_LINE.finditer(path.read_text()):
        shape, arm, *figures = found.groups()
        results.setdefault(shape, {}).setdefault(arm, []).append(tuple(float(x) for x in figures))
    return results


def summarise(results: Runs) -> dict[str, object]:
    summary: dict[str, object] = {}
    for shape, arms in results.items():
        shape_summary: dict[str, object] = {
            arm: {
                "rate_median": statistics.median(r[0] for r in runs),
                "cpu_us_median": statistics.median(r[1] for r in runs),
                "caller_us_median": statistics.median(r[2] for r in runs),
                "sender_us_median": statistics.median(r[3] for r in runs),
            }
            for arm, runs in arms.items()
        }
        for a, b in RATIOS:
            if a not in arms or b not in arms:
                continue
            ratios = {
                "rate": [x[0] / y[0] for x, y in zip(arms[a], arms[b])],
                "cpu": [y[1] / x[1] for x, y in zip(arms[a], arms[b])],  # higher is better, as the rate: b's CPU / a's
                "caller": [y[2] / x[2] for x, y in zip(arms[a], arms[b])],
            }
            shape_summary[f"{a}/{b}"] = {
                f"{key}{end}": f(values)
                for key, values in ratios.items()
                for end, f in (("", statistics.median), ("_min", min), ("_max", max))
            }
        shape_summary["raw"] = arms
        summary[shape] = shape_summary
    return summary


def print_summary(summary: dict[str, object]) -> None:
    print(
        "per arm: median rate, CPU per op (the caller thread's, rpcctl's sender thread's); "
        "a/b: a's rate / b's, b's CPU per op / a's (1.00: the same; < 1: a costs more), median (lowest..highest)"
    )
    for shape, s in summary.items():
        medians = ", ".join(
            f"{arm} {m['rate_median']:.0f}/s {m['cpu_us_median']:.1f} µs ({m['caller_us_median']:.1f},"
            f" {m['sender_us_median']:.1f})"
            for arm, m in s.items()
            if isinstance(m, dict) and "rate_median" in m
        )
        print(f"{shape}: {medians}")
        for a, b in RATIOS:
            r = s.get(f"{a}/{b}")
            if r:
                print(
                    f"  {a}/{b}: rate x{r['rate']:.3f} ({r['rate_min']:.3f}..{r['rate_max']:.3f}), "
                    f"CPU x{r['cpu']:.3f} ({r['cpu_min']:.3f}..{r['cpu_max']:.3f}), caller's CPU x{r['caller']:.3f}"
                )


def profile(args: argparse.Namespace, folder: Path) -> None:
    """Each arm once, its driving rank under py-spy for the timed loop (it starts py-spy on itself:
    a rank forked by rpcctl's rank server is then sampled as one under torchrun)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    if args.profile == "ddp":
        raise SystemExit("--profile: an RPC shape (remote, sync, async)")
    out_dir = Path(args.profile_out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    for arm in ARMS + (("base",) if args.base else ()):
        raw = out_dir / f"{args.profile}-{arm}.txt"
        os.environ.update(LAUNCH_COST_PROFILE=str(raw), LAUNCH_COST_PYSPY=spy)
        try:
            rate, cpu, caller, _ = launch(arm, args.profile, folder, args)
        finally:
            del os.environ["LAUNCH_COST_PROFILE"]
        print(f"{arm}: {rate:.1f}/s, CPU per op {cpu:.2f} µs (caller {caller:.2f}); {raw}", file=sys.stderr)
        if raw.exists():
            top(raw, args.profile_top)


def top(raw: Path, n: int) -> None:
    """The functions with the most samples (own and total) in a py-spy raw (collapsed) file."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        k = int(count)
        frames = stack.split(";")
        samples += k
        threads[next((f for f in frames if f.startswith("thread ")), "?")] += k
        own[frames[-1]] += k
        for frame in set(frames):
            total[frame] += k
    print(f"== {raw.name}: {samples} samples")
    for name, k in threads.most_common(12):
        print(f"  thread {k:6d} {name}")
    for name, k in own.most_common(n):
        print(f"  own    {k:6d} {name[:150]}")
    rpcctl_total = [(k, name) for name, k in total.items() if "rpcctl" in name]
    for k, name in sorted(rpcctl_total, reverse=True)[:n]:
        print(f"  total  {k:6d} {name[:150]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="each launch's timed loop (after 1/10 of it of warm-up)"
    )
    parser.add_argument("--calls", type=int, default=20_000, help="remote and sync: at most so many calls")
    parser.add_argument(
        "--fanouts", type=int, default=1000, help="async: at most so many rounds of 2 x 16 calls in flight"
    )
    parser.add_argument("--steps", type=int, default=20_000, help="ddp: at most so many steps")
    parser.add_argument("--numel", type=int, default=1024, help="ddp: floats all-reduced per step")
    parser.add_argument("--nproc", type=int, default=3, help="ddp: ranks")
    parser.add_argument(
        "--transport",
        choices=("default", "uv"),
        default="default",
        help="RPC shapes: uv is TensorPipe's TCP transport alone, with no busy-polling reactor thread"
        " sharing the cores with the callers (see Measured)",
    )
    parser.add_argument(
        "--base",
        help="an arm 'base', telemetry on, run by this Python: one whose sys.path finds an older rpcctl (see Measured)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--from-log", help="summarise the progress lines (stderr) of an earlier run instead of measuring"
    )
    parser.add_argument("--profile", choices=sorted(SHAPES), help="profile one launch of this shape per arm (py-spy)")
    parser.add_argument("--profile-out", default="profiles")
    parser.add_argument("--profile-top", type=int, default=25)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.profile:
            profile(args, Path(tmp))
            return
        summary = summarise(from_log(Path(args.from_log)) if args.from_log else measure(args, Path(tmp)))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)


if __name__ == "__main__":
    main()
