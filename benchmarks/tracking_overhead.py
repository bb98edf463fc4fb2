"""What RRef tracking costs: the same script's ``rpc.remote`` throughput under ``torchrun``
and under ``rpcctl launch`` (telemetry on, and off for reference).

    python benchmarks/tracking_overhead.py                  # 3 alternating trials, ~5 min
    python benchmarks/tracking_overhead.py --trials 3 --calls 3000 --json
    python benchmarks/tracking_overhead.py --micro | --gil   # in-process costs only, seconds

The workload (this same file, run as 2 ranks): rank 0 creates ``--calls`` RRefs on rank 1 with
``rpc.remote(worker1, echo, (tensor,))``, ``--window`` at a time, and waits until the owner
has created each one. Two shapes per trial:

- ``churn``: each window's RRefs are dropped before the next (RRefs that live < 0.2 s, which
  rpcctl counts per call site instead of listing);
- ``hold``: every RRef stays alive until the round ends (each is listed: ids resolved, value
  described on the owner, sent and stored).

Each trial runs torchrun, rpcctl with telemetry, rpcctl without, in turn (so drift on a shared
machine hits all three alike); the report is the median over trials of each one's calls/s,
and the ratio to torchrun. The target in issue 3: ≥ 0.95 (goal 0.97) with telemetry on.

On a busy machine (a shared 2-core box), separate launches vary by more than the effect
measured (TensorPipe's pollers alone keep both cores busy). So the rpcctl run also measures
paired rounds in the same two processes, tracking on then off (order alternating; off = the
hooks call straight through): ``paired`` is the median per-pair throughput ratio. And
``--micro`` measures, in one process and without RPC, the CPU that tracking adds to each
``rpc.remote``: the hook on the caller and the sender thread's work per RRef (tracking does
not touch the call itself; an RRef that lives past 0.2 s costs one more entry in a batched
describe call to its owner).

``--gil`` measures how long other threads (in a rank: torch's RPC threads, which need the GIL to
run Python callbacks) wait while the sender thread works through a burst of events, with the
sender's slicing (a short sleep every ``GIL_SLICE`` items) and without.

Last, the figure least blurred by load: the CPU time telemetry's own threads used (every rank's
sender thread and the launcher's server thread, each measured with its thread CPU clock, as
``rpcctl inspect workers`` shows it), as a share of the CPU time the ranks used.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = re.compile(r"RESULT (\{.*\})")


# ---------------------------------------------------------------------------------------------
# The workload (runs as each rank)


def echo(x):
    return x


def workload(calls: int, window: int, rounds: int) -> None:
    import torch
    import torch.distributed.rpc as rpc

    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    if rank == 0:
        x = torch.ones(16)

        def one_round(hold: bool) -> float:
            kept = []
            start = time.perf_counter()
            for _ in range(0, calls, window):
                batch = [rpc.remote("worker1", echo, args=(x,)) for _ in range(window)]
                torch.futures.wait_all([r._get_future() for r in batch])  # created on the owner
                if hold:
                    kept.extend(batch)
            elapsed = time.perf_counter() - start
            del kept
            return calls / elapsed

        one_round(False)  # warm-up: connections, thread pools, first pickling
        rates: dict[str, list[float]] = {"churn": [], "hold": []}
        for _ in range(rounds):
            for shape in ("churn", "hold"):
                rates[shape].append(one_round(shape == "hold"))
        result: dict = {k: statistics.median(v) for k, v in rates.items()}
        tracking = _tracking_queue()
        if tracking is not None:
            from rpcctl.rank.rrefs import hooks

            pairs: dict[str, list[float]] = {"churn": [], "hold": []}
            for i in range(2 * rounds):
                for shape in ("churn", "hold"):
                    measured = {}
                    for on in (True, False) if i % 2 == 0 else (False, True):
                        hooks._q = tracking if on else None
                        measured[on] = one_round(shape == "hold")
                    hooks._q = tracking
                    pairs[shape].append(measured[True] / measured[False])
            result["paired"] = {k: statistics.median(v) for k, v in pairs.items()}
        print("RESULT " + json.dumps(result), flush=True)
    rpc.shutdown()


class _StandInRRef:
    """Stands in for the UserRRef that remote() returns, in a process without RPC."""

    def __str__(self) -> str:
        return (
            "UserRRef(RRefId = GloballyUniqueId(created_on=0, local_id=1),"
            " ForkId = GloballyUniqueId(created_on=0, local_id=2))"
        )

    def confirmed_by_owner(self) -> bool:
        return False  # stays in the poll list: no describe RPC in a process without RPC


def _tracked(hooks, handles: list, released=None) -> list:
    """Queued entries for ``handles``, as the remote() hook makes them (``released``: the hook's
    callback, which queues a handle again when it dies)."""
    items = []
    for handle in handles:
        ref = hooks.Ref(handle, released)
        ref.kind, ref.to, ref.func, ref.target, ref.code, ref.lasti, ref.t, ref.seen = (
            "r",
            "worker1",
            echo,
            None,
            echo.__code__,
            0,
            0.0,
            0,
        )
        items.append(ref)
    return items


def gil(cycles: int = 10, per_cycle: int = 2000) -> dict[str, dict[str, float]]:
    """How long other threads wait for the GIL while the sender thread works, sliced as rpcctl
    does it (a pause every ``GIL_SLICE`` items) and unsliced. Each cycle lists ``per_cycle`` new
    RRefs and then sees them all released (the end of a round that held them): 2 × per_cycle
    events, processed and encoded. A pinger thread sleeps 200 µs in a loop and records how late
    it wakes while the sender works: an RPC thread that needs the GIL waits as long."""
    import gc
    import threading

    from rpcctl.rank import reporter
    from rpcctl.wire import protocol
    from rpcctl.rank.rrefs import hooks, sender

    gc.freeze()  # as in a rank forked by rpcctl: a full collection must not land in a cycle
    report = {}
    sliced = sender.GIL_SLICE
    for label, slice_ in (("unsliced", 1 << 30), (f"sliced every {sliced}", sliced)):
        sender.GIL_SLICE = slice_
        tracker, queue = sender.Tracker(), []
        tracker._send_describes = lambda final: None  # no RPC here
        work = [[_StandInRRef() for _ in range(per_cycle)] for _ in range(cycles)]
        delays: list[float] = []
        busy, done = threading.Event(), threading.Event()

        def pinger(done: threading.Event = done, busy: threading.Event = busy, delays: list[float] = delays) -> None:
            while not done.is_set():
                start = time.perf_counter()
                time.sleep(0.0002)
                late = time.perf_counter() - start - 0.0002
                if busy.is_set():
                    delays.append(late)

        thread = threading.Thread(target=pinger)
        thread.start()
        hooks._q = queue
        cpu = []
        try:
            for handles in work:
                items = _tracked(hooks, handles, hooks._released)
                busy.set()
                started = time.thread_time()
                events = tracker.process(items, 10.0)
                del items
                handles.clear()  # all released: the callbacks queue them
                events += tracker.process(list(queue), 10.0)
                queue.clear()
                reporter.send_in_slices(lambda message: bool(protocol.encode(message)), events)
                cpu.append(time.thread_time() - started)
                busy.clear()
                time.sleep(0.05)
        finally:
            hooks._q = None
            sender.GIL_SLICE = sliced
            done.set()
            thread.join()
        delays.sort()
        report[label] = {
            "sender_cpu_ms_per_cycle": statistics.median(cpu) * 1e3,
            "wait_p50_us": delays[len(delays) // 2] * 1e6 if delays else 0.0,
            "wait_p99_us": delays[int(len(delays) * 0.99)] * 1e6 if delays else 0.0,
            "wait_max_us": delays[-1] * 1e6 if delays else 0.0,
        }
    return report


def micro(repeats: int = 15, n: int = 5000) -> dict[str, float]:
    """Microseconds of CPU that tracking adds per rpc.remote, in this process and without RPC
    (best of ``repeats``: the run least disturbed by other load). The call itself (its pickling,
    the owner's work) is untouched by tracking; only the creator's hook and sender thread cost."""
    import collections

    import torch

    from rpcctl.rank import patch
    from rpcctl.rank.rrefs import hooks, sender

    patch.install()
    x = torch.ones(16)
    Handle = _StandInRRef

    def bare(to, func, args=None, kwargs=None, timeout=-1.0):
        return Handle()

    hook = hooks.wrap_remote(bare, -1.0)
    queue: collections.deque = collections.deque()

    def sender_items(alive: bool) -> tuple[list, list]:
        """100 queued handles as the hook makes them (and the handles, if they stay alive)."""
        handles = [Handle() for _ in range(100)]
        return _tracked(hooks, handles), handles if alive else []

    cases = {
        "caller: remote() with the hook": lambda: (hook("worker1", echo, (x,)), len(queue) > 4096 and queue.clear()),
        "caller: remote() without": lambda: (bare("worker1", echo, (x,)), len(queue) > 4096 and queue.clear()),
    }
    best: dict[str, float] = {}
    hooks._q = queue
    try:
        for _ in range(repeats):
            for name, fn in cases.items():
                start = time.thread_time()
                for _ in range(n):
                    fn()
                best[name] = min(best.get(name, 1e9), (time.thread_time() - start) / n * 1e6)
            for label, alive in (("short-lived (counted)", False), ("listed (ids, owner, site)", True)):
                batches = [sender_items(alive) for _ in range(n // 100)]
                start = time.thread_time()  # CPU: the sender's pauses cost the job nothing
                for items, _handles in batches:
                    sender.Tracker().process(items, 10.0)
                key = f"sender thread, per RRef {label}"
                best[key] = min(best.get(key, 1e9), (time.thread_time() - start) / n * 1e6)
                del batches
    finally:
        hooks._q = None
    return best


def _tracking_queue():
    """The live tracking queue when this rank runs under rpcctl with telemetry on, else None."""
    hooks = sys.modules.get("rpcctl.rank.rrefs.hooks")
    return getattr(hooks, "_q", None)


# ---------------------------------------------------------------------------------------------
# The driver


def _telemetry_share(runs: Path) -> float | None:
    """The latest "rpcctl" run's telemetry CPU share, as ``rpcctl inspect workers`` reports it."""
    sys.path.insert(0, str(ROOT))
    from rpcctl import inspect

    latest = max(
        (p for p in runs.iterdir() if json.loads((p / "run.json").read_text()).get("name") == "rpcctl"),
        key=lambda p: p.stat().st_mtime,
        default=None,
    )
    cost = inspect.telemetry_cost(latest) if latest is not None else None
    return cost.share if cost is not None else None


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> dict[str, float]:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    match = RESULT.search(proc.stdout) or RESULT.search(proc.stderr)
    if proc.returncode != 0 or match is None:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(match.group(1))


def _emit(document: dict, as_json: bool, title: str, lines: list[str]) -> None:
    print(json.dumps(document, indent=2) if as_json else "\n".join([title, *lines]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--calls", type=int, default=4000, help="RRefs per round")
    parser.add_argument("--window", type=int, default=64, help="RRefs in flight")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per launch (median taken)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--micro", action="store_true", help="only the in-process cost breakdown (seconds, no RPC)")
    parser.add_argument(
        "--gil", action="store_true", help="only the GIL waits the sender thread causes other threads (no RPC)"
    )
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workload:
        workload(args.calls, args.window, args.rounds)
        return
    if args.gil:
        waits = gil()
        _emit(
            waits,
            args.json,
            "Sender thread at work (lists 2000 RRefs, then sees them all released; 4000 events per cycle):",
            [
                f"  {label:18} sender CPU {w['sender_cpu_ms_per_cycle']:5.1f} ms/cycle;"
                "  another thread waits for the GIL"
                f" p50 {w['wait_p50_us']:6.0f} µs  p99 {w['wait_p99_us']:6.0f} µs  max {w['wait_max_us']:6.0f} µs"
                for label, w in waits.items()
            ],
        )
        return
    if args.micro:
        costs = micro()
        _emit(
            costs,
            args.json,
            "CPU per rpc.remote, best of 15 (µs):",
            [f"  {name:50}{value:8.2f}" for name, value in costs.items()],
        )
        return

    script = Path(__file__).resolve()
    work_args = ["--workload", "--calls", str(args.calls), "--window", str(args.window), "--rounds", str(args.rounds)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    timeout = 300.0
    samples: dict[str, list[dict[str, float]]] = {"torchrun": [], "rpcctl": [], "rpcctl-no-telemetry": []}
    with tempfile.TemporaryDirectory(prefix="rpcctl-overhead-") as tmp:
        runs = Path(tmp) / "runs"
        configs = {}
        for name, extra_env in (("rpcctl", {}), ("rpcctl-no-telemetry", {"RPCCTL_TELEMETRY_DISABLE": "1"})):
            config = Path(tmp) / f"{name}.yaml"
            config.write_text(
                json.dumps(
                    {
                        "name": name,
                        "script": str(script),
                        "args": work_args,
                        "nproc_per_node": 2,
                        "timeout": timeout,
                        "env": extra_env,
                    }
                )
            )
            configs[name] = config
        commands = {
            "torchrun": [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                str(script),
                *work_args,
            ],
            "rpcctl": [
                sys.executable,
                "-m",
                "rpcctl",
                "launch",
                str(configs["rpcctl"]),
                "--no-live",
                "--runs-dir",
                str(runs),
            ],
            "rpcctl-no-telemetry": [
                sys.executable,
                "-m",
                "rpcctl",
                "launch",
                str(configs["rpcctl-no-telemetry"]),
                "--no-live",
                "--runs-dir",
                str(runs),
            ],
        }
        shares: list[float] = []
        for trial in range(args.trials):
            for name, cmd in commands.items():
                samples[name].append(_run(cmd, env, timeout))
                if name == "rpcctl" and (share := _telemetry_share(runs)) is not None:
                    shares.append(share)
            if not args.json:
                line = "  ".join(
                    f"{n}: churn {s[-1]['churn']:.0f}/s hold {s[-1]['hold']:.0f}/s" for n, s in samples.items()
                )
                print(f"trial {trial + 1}/{args.trials}  {line}", file=sys.stderr, flush=True)

    report = {"calls": args.calls, "window": args.window, "rounds": args.rounds, "trials": args.trials, "results": {}}
    base = {shape: statistics.median(s[shape] for s in samples["torchrun"]) for shape in ("churn", "hold")}
    for name, runs_ in samples.items():
        report["results"][name] = {}
        for shape in ("churn", "hold"):
            rate = statistics.median(s[shape] for s in runs_)
            report["results"][name][shape] = {"calls_per_s": rate, "ratio_to_torchrun": rate / base[shape]}
    if shares:
        report["telemetry_cpu_share"] = statistics.median(shares)
    paired = [s["paired"] for s in samples["rpcctl"] if "paired" in s]
    if paired:
        report["paired_on_off"] = {key: statistics.median(p[key] for p in paired) for key in paired[0]}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"\nrpc.remote throughput, median of {args.trials} trials"
        f" ({args.calls} RRefs per round, {args.window} in flight):"
    )
    print(f"{'':22}{'churn':>12}{'ratio':>8}{'hold':>12}{'ratio':>8}")
    for name, shapes in report["results"].items():
        c, h = shapes["churn"], shapes["hold"]
        print(
            f"{name:22}{c['calls_per_s']:10.0f}/s{c['ratio_to_torchrun']:8.3f}{h['calls_per_s']:10.0f}/s{h['ratio_to_torchrun']:8.3f}"
        )
    if "paired_on_off" in report:
        p = report["paired_on_off"]
        print(
            f"{'paired, on / off':22}{'':12}{p['churn']:8.3f}{'':12}{p['hold']:8.3f}"
            "   (same processes, alternating rounds)"
        )
    if "telemetry_cpu_share" in report:
        print(
            "\ntelemetry's own threads (ranks' senders + launcher's server) used"
            f" {report['telemetry_cpu_share']:.2%} of the\n"
            "CPU time the ranks used (median over trials; measured by those threads, so not blurred by load)"
        )


if __name__ == "__main__":
    main()
