"""How far one node-0 telemetry server and store go (issue 27): the launcher's own
``TelemetryServer`` (in this process, as the launcher runs it: its thread, its SQLite store)
fed by synthetic ranks that speak the real protocol over the real channel (a Unix socket per
rank, ``hello`` then one ``batch`` per ``SEND_INTERVAL_S``), for 8 to 1,024 ranks.

    python benchmarks/telemetry_scale.py --quick              # 8 and 64 ranks, 3 s each (~30 s)
    python benchmarks/telemetry_scale.py                      # 8, 64, 256, 1024 ranks, 10 s each
    python benchmarks/telemetry_scale.py --sizes 8 512 --seconds 20 --json
    python benchmarks/telemetry_scale.py --measure            # re-measure the per-rank rates first

What each synthetic rank sends, per second (``RATES``): the events a real rank's sender sent
in a real job, counted on the wire by ``--measure``: 3 ranks (gloo, CPU) started with the real
rank-side telemetry (``rank.reporter.start``, as ``rpcctl.rank.runtime`` does), each step a
small matmul and an all_reduce of 4 KiB, an ``rpc_sync`` to rank 0 from the others, an
``rpc.remote`` held over 20 steps every 10 steps, and ``rpcctl.report(step, loss)``; the
tap is a ``TelemetryServer`` that counts the events of each kind per rank before storing
them. The loop runs as fast as it can (58 steps/s here, at load 17), and the sender's own
bounds (a ``coll`` per group a cycle, a ``cop`` per op a read, at most 16 ``cent`` a read,
a ``cstat`` per function a cycle) make that the most a rank sends of each kind; a GPU job of
1 to 10 steps/s sends fewer losses, calls and collectives, and the same probes. Each event is
shaped as the real one (the same fields, sizes and ids that count); the collectives every
rank lists have the same sequence numbers, rank N-1 entering each 20 ms late (a straggler
for ``inspect collectives`` to find).

Senders are ``--senders`` processes (each runs its share of the ranks, one socket each);
a rank whose sends fall behind keeps what it could not send, as the real sender's queue does,
and drops beyond ``protocol.MAX_QUEUE`` (counted). Reported per size: events/s offered and
stored, dropped, how far behind the store was when the senders stopped (drain), the server
thread's CPU (% of one core) and the process's memory growth (RSS) and store size, and the
time of ``inspect collectives --json`` and ``inspect workers --json`` (the CLI as a process,
on the live run, and the SDK call alone).

Where it bends (2026-12-06, this machine: 2 cores shared with five other jobs, load 7-11;
senders niced, and still on the same cores as the server, whose thread got 4-24% of a core).
The default run (busy rates, 10 s a size), then ``--gpu-rates --sizes 256 1024 --seconds 5``:

=====  =========  =======  ========  ======  =========  ============  ====  =====  ==========  ===========
ranks  rates      offered  stored/s  drain   server     events per    RSS   store  inspect     inspect
                  /s       (during)  after   CPU (run)  server CPU s  +MB   MB     coll CLI/   workers CLI/
                                                                                   SDK s       SDK s
=====  =========  =======  ========  ======  =========  ============  ====  =====  ==========  ===========
8      busy (96)  722      723       0       4%         16,900        1.1   4.4    3.4/0.07    4.1/0.16
64     busy       5,544    5,059     1.0 s   21%        23,600        2.2   6.3    3.6/0.25    4.1/0.62
256    busy       9,347*   4,559     14.8 s  16%        28,200        1.3   11     4.0/0.55    3.9/0.93
1024   busy       8,510*   4,313     60 s    15%        28,300        1.8   38     4.9/2.2     5.9/3.9
256    gpu (20)   3,810    2,623     2.4 s   18%        14,400        1.7   1.5    3.4/0.13    4.4/0.53
1024   gpu        10,309*  4,246     5.9 s   24%        18,000        3.7   3.5    3.0/0.19    5.4/1.79
=====  =========  =======  ========  ======  =========  ============  ====  =====  ==========  ===========

(* the senders could not offer the load on these 2 cores, and ran long: 256 busy ranks would
send 24,600/s, 1,024 98,000/s, 1,024 gpu ranks 20,700/s; the 1,024 busy senders took 77 s for
their 10 s and stored 659,000 events.) No event was dropped: the ranks' sockets and queues held
the backlog, which the server drained after. The straggler (rank N-1, 20 ms late) was found at
every size (in a shorter 1,024-rank run, 3 s, the starved senders listed too few collectives
on every rank to compare, and it was not).

So: the server thread stores 14,000 to 28,000 events per CPU second (fewer per batch: less;
every batch is a JSON decode and a heartbeat UPDATE, and a rank sends up to 10 a second
whatever its rate). One dedicated core therefore holds about 250 ranks of a busy CPU loop
(96 events/s a rank, 58 steps/s: the loss events alone are 58 of them) and 700 to 900 of a
GPU-paced job (about 20 events/s a rank). On this loaded machine, where the thread gets a
fifth of a core, it stores about 4,500 events/s: it keeps up with 64 busy ranks (or lags by a
second) and falls behind from 256 ranks on, by seconds to a minute. Its memory does not grow
with the load (a few MB); the store grows about 60 bytes an event. The views: ``inspect
collectives`` (SDK) 0.07 s at 8 ranks to 2.2 s at 1,024 with 659,000 events stored (the last
50,000 sampled collectives were read for stragglers then; 16,384 now: 0.3 s of that 2.2 was
comparing them), ``inspect workers`` 0.16 to 3.9 s (a row and a /proc look per rank, and the
stragglers' reads); as processes the CLI adds 2-3 s of
interpreter and imports on this machine at every size.

What moves the limit:

- the server is one thread decoding JSON and writing SQLite row by row, in one transaction per
  ``COMMIT_INTERVAL_S``; its cost is per event and per batch. Fewer events per rank moves it
  most: a ``loss`` per step is most of a busy loop's events (a per-cycle summary: the last
  step's loss and how many steps, would make it 10/s at most); a ``coll`` goes every cycle in a
  busy loop (the group's state changed): once a second unless a collective is in flight for a
  cycle (what the watchdog needs) would make it 1/s; the sampled ``cent`` (the first 64 of a
  group, then every 16th) could be one in 256 past the first minutes;
- the heartbeat: an UPDATE per batch (up to 10 a second a rank) where one a second would do;
- a per-step summary on the rank (per group: count, bytes, p50/p99 of the last second)
  instead of the per-cycle group state would bound a rank to a few events a second
  whatever its collective rate;
- batching on the server: ``executemany`` per event kind within a batch, and one JSON
  decode per batch (it is) rather than per event;
- past one core, a relay per node (``telemetry.forward`` already relays other nodes'
  telemetry to node 0) that merges its ranks' summaries would divide node 0's load by the
  ranks per node.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rpcctl.wire import protocol  # noqa: E402
from rpcctl.telemetry.server import TelemetryServer  # noqa: E402

# Events per second of one rank, by kind: measured with --measure (see the docstring) on this
# machine, 2026-12-06, 3 ranks, 462 steps each in 8 s (58 steps/s: the machine was at load 17),
# 96 events/s a rank. --measure replaces them for the run.
RATES: dict[str, float] = {
    "call": 0.13,
    "cend": 0.13,
    "cent": 8.47,
    "churn": 3.41,
    "coll": 5.77,
    "cop": 1.22,
    "cstat": 8.26,
    "desc": 4.42,
    "loss": 58.37,
    "probe": 0.8,
    "rel": 1.35,
    "rref": 1.47,
    "vfree": 2.53,
}
# A GPU job's rank at 5 steps/s, 4 collectives a step (DDP buckets), derived from RATES (not
# measured): what follows the step rate scales to 5/58 of it; coll stays (the group's state
# changes every cycle at 20 collectives/s), cent is 20/16 a second past the first 64 listed,
# cop and probe stay. About 20 events/s.
STEP_SCALE = 5 / 58.37
GPU_RATES = {
    kind: round(rate * STEP_SCALE, 2) if kind not in ("coll", "cop", "probe", "cent", "cstat") else rate
    for kind, rate in RATES.items()
}
GPU_RATES.update(cent=1.25, cstat=5.0)
FAKE_PID = 10_000_000  # synthetic ranks' pids: above any pid_max, never a real process
STRAGGLER_S = 0.02


# ---------------------------------------------------------------------------------------------
# The tap: the real server, counting what it is sent


class CountingServer(TelemetryServer):
    """The launcher's server, unchanged, that also counts the events it is sent (by kind and by
    rank) and the batches' bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events = 0
        self.keep: list[tuple[int | None, str, float]] | None = None  # --measure: (rank, kind, t) of every event

    def _handle(self, conn: Any, message: dict[str, Any]) -> None:
        if message.get("k") == "batch" and conn.proc is not None and isinstance(message.get("ev"), list):
            self.events += len(message["ev"])
            if self.keep is not None:
                self.keep.extend(
                    (conn.proc.rank, str(e.get("e")), float(e.get("t") or 0))
                    for e in message["ev"]
                    if isinstance(e, dict)
                )
        super()._handle(conn, message)


# ---------------------------------------------------------------------------------------------
# --measure: a real 3-rank job's events, counted on the wire

LOOP = textwrap.dedent(
    """
    import os, sys, time
    from rpcctl.rank import reporter
    reporter.start()  # what rpcctl.rank.runtime does before the user's script
    import torch
    import torch.distributed as dist
    import torch.distributed.rpc as rpc
    import rpcctl

    def echo(x):
        return x

    def make():
        return torch.ones(64)

    seconds, rpc_port = float(sys.argv[1]), sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{rpc_port}"))
    w, grad, held = torch.randn(64, 64), torch.ones(1024), []
    end, step = time.time() + seconds, 0
    flag = torch.zeros(1)
    while True:
        flag.fill_(float(time.time() > end))
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        x = torch.randn(32, 64) @ w
        grad.fill_(float(x.mean()))
        dist.all_reduce(grad)
        if rank != 0:
            rpc.rpc_sync("w0", echo, args=(grad[:16],))
        if step % 10 == 0:
            held.append(rpc.remote("w0", make))
            if len(held) > 2:
                held.pop(0).to_here()
        rpcctl.report(step=step, loss=1.0 / (step + 1))
        step += 1
    held.clear()
    print("STEPS", rank, step, flush=True)
    rpc.shutdown()
    dist.destroy_process_group()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(seconds: float) -> tuple[dict[str, float], str]:
    """Per-rank events/s by kind of a real 3-rank job (the docstring's loop)."""
    with tempfile.TemporaryDirectory(prefix="tscale-m-") as tmp:
        folder = Path(tmp)
        (folder / "loop.py").write_text(LOOP)
        server = CountingServer(folder / "run", world_size=3)
        server.keep = []
        env = {
            **os.environ,
            **server.start(),
            "WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "OMP_NUM_THREADS": "1",
            "RPCCTL_RUN_ID": "measure",
        }
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)]))
        rpc_port = str(free_port())
        procs = [
            subprocess.Popen(
                [sys.executable, str(folder / "loop.py"), str(seconds), rpc_port],
                cwd=folder,
                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(3)
        ]
        outputs = []
        try:
            for proc in procs:
                outputs.append(proc.communicate(timeout=seconds + 120)[0])
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        time.sleep(0.5)
        server.close()
        if any(p.returncode for p in procs):
            raise SystemExit("the measured job failed:\n" + "\n".join(o[-2000:] for o in outputs))
        steps = [line.split()[2] for o in outputs for line in o.splitlines() if line.startswith("STEPS")]
        # The loop's window on each rank: its first and last loss (one a step); what was sent in it.
        per_kind: dict[str, list[float]] = {}
        for rank in range(3):
            mine = [(kind, t) for who, kind, t in server.keep if who == rank]
            losses = [t for kind, t in mine if kind == "loss"]
            if len(losses) < 2:
                raise SystemExit(f"rank {rank} reported {len(losses)} losses: no loop to measure")
            begin, end = min(losses), max(losses)
            for kind in {k for k, _ in mine}:
                per_kind.setdefault(kind, []).append(
                    sum(1 for k, t in mine if k == kind and begin <= t <= end) / (end - begin)
                )
        rates = {kind: round(statistics.mean(v), 2) for kind, v in sorted(per_kind.items()) if statistics.mean(v) > 0}
        return rates, f"3 ranks, {seconds:.0f} s, steps per rank {', '.join(steps)}"


# ---------------------------------------------------------------------------------------------
# Synthetic ranks (run in sender processes: --sender)


class SyntheticRank:
    """One rank's events, shaped as a real sender's (the fields, sizes and keys that the store
    uses), at ``rates`` per second; ids are new for what is new in a real run (RRefs, calls)."""

    def __init__(self, rank: int, world: int, rates: dict[str, float]):
        self.rank, self.world, self.rates = rank, world, rates
        self.owed = dict.fromkeys(rates, 0.0)
        self.seq = 0  # collectives entered (pg 0)
        self.listed = 0  # the last one listed (cent)
        self.step = 0
        self.ids = 0
        self.started = time.time()

    def hello(self) -> dict[str, Any]:
        return {
            "k": "hello",
            "pid": FAKE_PID + self.rank,
            "ppid": 1,
            "host": socket.gethostname(),
            "rank": self.rank,
            "kind": "rank",
            "t": time.time(),
        }

    def cycle(self, now: float, dt: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        # Collectives: the real loop ran ~300 all_reduce/s; sequence numbers advance with time,
        # the same on every rank, so the listed ones (every 16th) line up across ranks.
        self.seq = int((now - self.started) * 300) + 1
        for kind, rate in self.rates.items():
            self.owed[kind] += rate * dt
            while self.owed[kind] >= 1.0:
                self.owed[kind] -= 1.0
                event = self.event(kind, now)
                if event is not None:
                    out.append(event)
        return out

    def event(self, kind: str, now: float) -> dict[str, Any] | None:
        r = self.rank
        self.ids += 1
        if kind == "probe":
            return {
                "e": "probe",
                "t": now,
                "cpu_percent": 97.0,
                "rss_bytes": 512 << 20,
                "threads": 12,
                "device": "cpu",
                "cuda_visible_devices": None,
                "dropped": 0,
                "cpu_s": now - self.started,
                "telemetry_cpu_s": 0.01 * (now - self.started),
            }
        if kind == "coll":
            return {
                "e": "coll",
                "pg": "0",
                "name": "default_pg",
                "size": self.world,
                "enq": self.seq,
                "done": self.seq - 1,
                "t": now,
            }
        if kind == "cop":
            return {
                "e": "cop",
                "pg": "0",
                "op": "all_reduce",
                "n": 300,
                "bytes": 300 * 4096,
                "sum": 0.3,
                "max": 0.004,
                "h": {"9": 150, "10": 140, "12": 10},
                "t": now,
            }
        if kind == "cent":  # every rank lists the same sequence numbers, rank N-1 late into each
            self.listed += 16
            entered = self.started + self.listed / 300 + (STRAGGLER_S if r == self.world - 1 else 0.0001 * (r % 7))
            return {
                "e": "cent",
                "pg": "0",
                "seq": self.listed,
                "op": "all_reduce",
                "sizes": [[1024]],
                "dtypes": ["Float"],
                "bytes": 4096,
                "entered": entered,
                "completed": entered + STRAGGLER_S + 0.003,
                "t": now,
            }
        if kind == "loss":
            self.step += 1
            return {"e": "loss", "step": self.step, "loss": 1.0 / self.step, "t": now}
        if kind == "cstat":
            return {
                "e": "cstat",
                "callee": "w0",
                "func": "echo",
                "kind": "rpc_sync",
                "n": 30,
                "err": 0,
                "tmo": 0,
                "sum": 0.03,
                "max": 0.002,
                "h": {"9": 20, "10": 10},
                "bytes": 30 * 64,
                "t": now,
            }
        if kind == "churn":
            return {"e": "churn", "owner": "w0", "callee": "w0", "site": "loop.py:38 in <module>", "n": 1, "t": now}
        if kind == "rref":
            return {
                "e": "rref",
                "id": f"{r}:{self.ids}",
                "fork": f"{r}:{self.ids}",
                "owner": "w0",
                "owner_rank": 0,
                "kind": "remote",
                "callee": "w0",
                "site": "loop.py:38 in <module>",
                "confirmed": True,
                "t": now,
            }
        if kind in ("rel", "used", "conf", "vfree"):
            return {"e": kind, "id": f"{r}:{self.ids - 3}", "fork": f"{r}:{self.ids - 3}", "t": now}
        if kind in ("desc", "fork"):
            return {
                "e": kind,
                "id": f"0:{self.ids}",
                "fork": f"{r}:{self.ids}",
                "owner_rank": 0,
                "type": "Tensor",
                "value": {"type": "Tensor", "shape": [64], "dtype": "float32", "device": "cpu", "nbytes": 256},
                "t": now,
            }
        if kind in ("call", "srv"):
            return {
                "e": kind,
                "id": self.ids,
                "kind": "rpc_sync",
                "callee": "w0",
                "func": "echo",
                "site": "loop.py:33",
                "thread": 1,
                "nbytes": 64,
                "t": now,
            }
        if kind in ("cend", "send"):
            return {"e": kind, "id": self.ids - 1, "status": "ok", "t": now}
        return None  # rpc, join, pgjoin, shutdown, bye: once a run, not a rate


def sender(socket_path: str, first: int, count: int, world: int, rates: dict[str, float], seconds: float) -> None:
    """Run ranks first..first+count-1: connect them, say "ready", read the start time from
    stdin, run until start + seconds; print one JSON line of counts."""
    os.nice(10)  # the server (the launcher's thread) first, as a node-0 launcher would want it
    ranks = [SyntheticRank(r, world, rates) for r in range(first, first + count)]
    socks = []
    for rank in ranks:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(socket_path)
        sock.sendall(protocol.encode(rank.hello()))
        socks.append(sock)
    # One real event a rank sends once: joined RPC (so that inspect workers names it).
    pending: list[list[dict[str, Any]]] = [
        [{"e": "pgjoin", "call": "init_process_group", "t": time.time()}] for _ in ranks
    ]
    generated = sent = dropped = 0
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    while time.time() < start_at:
        time.sleep(0.01)
    for rank in ranks:
        rank.started = start_at
    interval = protocol.SEND_INTERVAL_S
    tick, last = start_at, start_at
    while True:
        now = time.time()
        if now >= start_at + seconds:
            break
        for i, rank in enumerate(ranks):
            events = rank.cycle(now, now - last)
            generated += len(events)
            pending[i].extend(events)
            if len(pending[i]) > protocol.MAX_QUEUE:  # the real sender's queue bound: drop and count
                dropped += len(pending[i]) - protocol.MAX_QUEUE
                del pending[i][: len(pending[i]) - protocol.MAX_QUEUE]
            if pending[i]:
                socks[i].sendall(protocol.encode({"k": "batch", "ev": pending[i]}))
                sent += len(pending[i])
                pending[i] = []
        last = now
        tick += interval
        time.sleep(max(0.0, tick - time.time()))
    behind = max(0.0, time.time() - tick)
    for i in range(len(ranks)):
        socks[i].sendall(
            protocol.encode({"k": "batch", "ev": pending[i] + [{"e": "bye", "dropped": 0, "t": time.time()}]})
        )
        sent += len(pending[i]) + 1
    for sock in socks:
        sock.close()
    print(json.dumps({"generated": generated, "sent": sent, "dropped": dropped, "behind_s": behind}), flush=True)


# ---------------------------------------------------------------------------------------------
# One size


def write_record(run_dir: Path, world: int) -> None:
    """A run.json as the launcher writes it, so the CLI resolves the run (live: this process)."""
    import psutil

    from rpcctl.records.runs import RankState, RunRecord, now_iso, save_record
    from rpcctl.base.states import RankStatus, RunStatus

    me = psutil.Process()
    save_record(
        RunRecord(
            run_id=run_dir.name,
            name="telemetry-scale",
            status=RunStatus.RUNNING,
            run_dir=str(run_dir),
            config_path=None,
            script="synthetic",
            world_size=world,
            nproc_per_node=world,
            start_method="spawn",
            host=socket.gethostname(),
            launcher_pid=os.getpid(),
            launcher_started=me.create_time(),
            master_addr="127.0.0.1",
            master_port=0,
            started_at=now_iso(),
            ranks=[
                RankState(rank=r, local_rank=r, pid=FAKE_PID + r, state=RankStatus.RUNNING, started_at=now_iso())
                for r in range(world)
            ],
        )
    )


def thread_cpu(native_id: int | None) -> float:
    import psutil

    for thread in psutil.Process().threads():
        if thread.id == native_id:
            return thread.user_time + thread.system_time
    return 0.0


def timed_cli(*args: str) -> tuple[float, int]:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "rpcctl", *args], capture_output=True, text=True, timeout=600, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"rpcctl {' '.join(args)}: exit {out.returncode}: {out.stderr[-2000:]}")
    return time.perf_counter() - started, len(out.stdout)


def run_size(world: int, seconds: float, senders: int, rates: dict[str, float]) -> dict[str, Any]:
    import psutil

    from rpcctl import inspect
    from rpcctl.console import to_jsonable

    with tempfile.TemporaryDirectory(prefix="tscale-") as tmp:
        runs = Path(tmp) / "runs"
        run_dir = runs / f"scale-{world}"
        run_dir.mkdir(parents=True)
        run_dir.chmod(0o700)
        rss0 = psutil.Process().memory_info().rss
        server = CountingServer(run_dir, world_size=world)
        server.start()
        write_record(run_dir, world)
        for r in range(world):
            server.rank_started(r, FAKE_PID + r, r, "cpu", 0)
        native = server._thread.native_id if server._thread is not None else None
        senders = max(1, min(senders, world))
        share = [world // senders + (1 if i < world % senders else 0) for i in range(senders)]
        procs, first = [], 0
        for count in share:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--sender",
                        str(server.socket_path),
                        str(first),
                        str(count),
                        str(world),
                        json.dumps(rates),
                        str(seconds),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            first += count
        for proc in procs:  # every rank connected and said hello
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("a sender failed to start")
        start_at = time.time() + 0.5
        for proc in procs:
            proc.stdin.write(f"{start_at!r}\n")
            proc.stdin.flush()
        while time.time() < start_at:
            time.sleep(0.01)
        cpu0, events0 = thread_cpu(native), server.events
        results = [json.loads(p.communicate(timeout=seconds + 300)[0].strip().splitlines()[-1]) for p in procs]
        assert all(p.returncode == 0 for p in procs)
        stopped = time.time()
        wall = stopped - start_at
        cpu_during = thread_cpu(native) - cpu0
        received_during = server.events - events0
        sent = sum(r["sent"] for r in results)
        deadline = time.time() + 120
        while server.events < sent and time.time() < deadline:
            time.sleep(0.02)
        drain = time.time() - stopped
        time.sleep(2 * 0.1)  # the last commit
        stored = server.events
        cpu_all = thread_cpu(native) - cpu0
        rss = psutil.Process().memory_info().rss - rss0
        inspect.workers(run_dir)  # imports and caches warm, as in the CLI's one call
        sdk_coll_s = _timed(lambda: json.dumps(to_jsonable(inspect.collectives(run_dir))))
        sdk_workers_s = _timed(lambda: json.dumps(to_jsonable(inspect.workers(run_dir))))
        cli_coll_s, coll_bytes = timed_cli("inspect", "collectives", str(run_dir), "--json")
        cli_workers_s, _ = timed_cli("inspect", "workers", str(run_dir), "--json")
        report = inspect.collectives(run_dir)
        db_bytes = sum(p.stat().st_size for p in run_dir.glob("telemetry.db*"))
        server.close()
        return {
            "ranks": world,
            "seconds": round(wall, 2),
            "senders": senders,
            "offered_per_s": round(sum(r["generated"] for r in results) / wall),
            "stored_per_s": round(received_during / wall),
            "stored": stored,
            "sent": sent,
            "dropped": sum(r["dropped"] for r in results) + server.bad_messages,
            "senders_behind_s": round(max(r["behind_s"] for r in results), 2),
            "drain_s": round(drain, 2),
            "server_cpu_pct": round(100 * cpu_during / wall),
            "events_per_cpu_s": round(stored / max(cpu_all, 1e-3)),
            "rss_growth_mb": round(rss / 2**20, 1),
            "db_mb": round(db_bytes / 2**20, 1),
            "inspect_collectives_s": round(cli_coll_s, 2),
            "inspect_workers_s": round(cli_workers_s, 2),
            "sdk_collectives_s": round(sdk_coll_s, 3),
            "sdk_workers_s": round(sdk_workers_s, 3),
            "collectives_json_kb": round(coll_bytes / 1024),
            "straggler_found": [s.rank for s in report.stragglers] == [world - 1],
        }


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


COLUMNS = (
    ("ranks", "RANKS"),
    ("offered_per_s", "OFFERED/s"),
    ("stored_per_s", "STORED/s"),
    ("dropped", "DROPPED"),
    ("senders_behind_s", "SENDERS BEHIND s"),
    ("drain_s", "DRAIN s"),
    ("server_cpu_pct", "SERVER CPU %"),
    ("events_per_cpu_s", "EVENTS/CPU s"),
    ("rss_growth_mb", "RSS +MB"),
    ("db_mb", "DB MB"),
    ("inspect_collectives_s", "INSPECT COLL s"),
    ("inspect_workers_s", "INSPECT WORKERS s"),
    ("sdk_collectives_s", "SDK COLL s"),
    ("sdk_workers_s", "SDK WORKERS s"),
    ("straggler_found", "STRAGGLER"),
)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sender":
        path, first, count, world, rates, seconds = sys.argv[2:8]
        sender(path, int(first), int(count), int(world), json.loads(rates), float(seconds))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=4, help="sender processes (default 4)")
    parser.add_argument("--quick", action="store_true", help="8 and 64 ranks, 3 s each")
    parser.add_argument("--measure", action="store_true", help="measure the per-rank rates on a real 3-rank job first")
    parser.add_argument(
        "--gpu-rates", action="store_true", help="a GPU job's rates (5 steps/s, 4 collectives a step: GPU_RATES)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rates = dict(GPU_RATES if args.gpu_rates else RATES)
    if args.measure:
        rates, how = measure(8.0)
        print(f"measured ({how}): {json.dumps(rates)}", file=sys.stderr)
    if not rates:
        raise SystemExit("no rates: run with --measure")
    sizes, seconds = ([8, 64], 3.0) if args.quick else (args.sizes, args.seconds)
    rows = []
    for world in sizes:
        rows.append(run_size(world, seconds, args.senders, rates))
        if not args.json:
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"rates_per_rank": rates, "load": os.getloadavg(), "sizes": rows}, indent=1))
        return
    print(
        f"per rank and second: {', '.join(f'{k} {v:g}' for k, v in rates.items())} ({sum(rates.values()):.0f} events);"
        f" load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    widths = [max(len(title), *(len(str(r[key])) for r in rows)) for key, title in COLUMNS]
    print("  ".join(title.rjust(w) for (_, title), w in zip(COLUMNS, widths)))
    for row in rows:
        print("  ".join(str(row[key]).rjust(w) for (key, _), w in zip(COLUMNS, widths)))


if __name__ == "__main__":
    main()
