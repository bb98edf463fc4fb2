"""The rank's telemetry reporter: runs inside every rank, and in the processes ranks spawn.

(Not "worker": that is RPC's name for a rank's identity, ``worker0``, and ``inspect workers``.)

::

    rank (bootstrapped by rpcctl)           process the rank spawns (mp.spawn, Popen python)
    reporter.start() ── before the script   sitecustomize → hooks when torch is imported
      ├ hooks on torch.distributed.rpc      rpc.init_rpc() → joining(): connect, sender
      └ connect + sender thread             report() also joins
    reporter.stop()  ── after the script    atexit → stop()
                                            os._exit → stop() (see below)

    forked child (DataLoader worker, mp fork): inherits the hooks, drops the parent's
    connection and queue, and joins only if it calls init_rpc(), init_process_group() or report().

A process that joined sends its last cycle (the queue, the final collectives read, ``bye``)
however it exits: ``atexit`` where the interpreter ends normally (a rank, a spawn-method worker:
``sys.exit``), and ``os._exit`` (wrapped once a process joins: ``flush_at_os_exit``), which is how
multiprocessing's fork and forkserver workers end (popen_fork: ``os._exit(process._bootstrap())``,
whether the target returned, raised or called ``sys.exit``; a fork Pool's workers too), and how a
user's own code may end one. Both are bounded by ``EXIT_FLUSH_S``: a launcher that stopped
reading never holds an exit longer. The wrapper flushes only in the process that joined (a
forked child that did not join has no reporter of its own), and a process killed by a signal
says nothing.

The sender thread wakes every ``SEND_INTERVAL_S``: it drains the queue the hooks append to,
turns it into events (each family's processor, ``families.FAMILIES``), adds a probe (cpu, rss, threads,
CUDA memory — never initialising CUDA) every ``PROBE_INTERVAL_S``, and writes one JSON line. A send that
fails ends telemetry for the process; nothing the user's code calls ever waits on it.

Nothing happens at import: a rank forked from a pre-warmed parent creates its thread and
socket in ``start()``.
"""

from __future__ import annotations

import atexit
import collections
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from rpcctl.base.devices import parse_visible_devices
from rpcctl.base.procstat import NUM_THREADS, RSS_PAGES, STIME, UTIME, stat_fields
from rpcctl.rank import families, patch, rrefs
from rpcctl.wire import protocol

_reporter: _Reporter | None = None
_lock = threading.Lock()
_fork_hook_registered = False
EXIT_FLUSH_S = 2.0  # the most a process's last cycle holds its exit (atexit and os._exit alike)


def start() -> None:
    """Start telemetry in a rank (the bootstrap calls this before the user's script)."""
    if not _wanted():
        return
    rank = os.environ.get("RANK", "")
    os.environ[protocol.ENV_RANK] = rank
    os.environ[protocol.ENV_RANK_PID] = str(os.getpid())
    for family in families.FAMILIES:  # before the script (collectives: before it creates a process group)
        if family.at_start is not None:
            family.at_start()
    reporter = _get()
    _install_hooks()
    reporter.activate()


def stop(timeout: float = EXIT_FLUSH_S) -> None:
    """Flush and stop; bounded by ``timeout``. Safe to call twice, or without ``start()``."""
    reporter = _reporter
    if reporter is not None and reporter.pid == os.getpid():
        reporter.stop(timeout)


def flush_at_os_exit() -> None:
    """Make ``os._exit`` send this process's last cycle first (``stop``, at most ``EXIT_FLUSH_S``),
    once per interpreter (a forked child inherits the wrapper; it flushes only a reporter of its
    own). No atexit runs at ``os._exit``: without this a fork worker's last cycle, its last
    collectives read and anything queued since the previous one (its RPC name, a loss) is lost."""
    original = os._exit
    if getattr(original, "_rpcctl_flushes", False):
        return

    def _exit(status: int) -> NoReturn:
        try:
            stop(EXIT_FLUSH_S)
        except BaseException:  # noqa: BLE001 - nothing may keep the process from exiting
            pass
        original(status)

    _exit._rpcctl_flushes = True  # type: ignore[attr-defined]
    _exit.__wrapped__ = original  # type: ignore[attr-defined]
    _exit.__doc__ = original.__doc__
    os._exit = _exit


def report(step: int | None = None, loss: float | None = None, **metrics: float) -> None:
    """Queue a metrics record; never blocks, and does nothing outside rpcctl."""
    report_loss(step, loss, metrics.pop("epoch", None), metrics, "report")


def report_loss(step: int | None, loss: Any, epoch: Any, metrics: dict[str, Any], source: str) -> None:
    """``report`` for rpcctl's own callbacks too (``steps``: ``source`` names the library)."""
    reporter = _reporter
    if reporter is None or not reporter.active:
        if not _wanted():
            return
        reporter = joining()
        if reporter is None:
            return
    try:
        epoch = None if epoch is None else _number(epoch)
        event = {
            "e": "loss",
            "step": None if step is None else int(step),
            "loss": None if loss is None else _number(loss),
            "metrics": {str(k): _number(v) for k, v in metrics.items()},
            "epoch": None if epoch is None else int(epoch),
            "t": time.time(),
        }
    except (TypeError, ValueError) as exc:
        raise TypeError(f"rpcctl.report() takes numbers: {exc}") from None
    if source != "report":
        event["source"] = source
    reporter.post(event)


def joining(hooks: bool = True) -> _Reporter | None:
    """A process joins telemetry (a spawned child at init_rpc or init_process_group, or on its
    first report; a Monarch mesh process at ``import monarch``, with ``hooks=False``: see
    ``autohook``)."""
    if not _wanted():
        return None
    reporter = _get()
    if hooks:
        _install_hooks()
    reporter.activate()
    return reporter if reporter.active else None


def join_at_init_rpc() -> Callable[[dict[str, Any]], None]:
    """What the ``init_rpc`` and ``init_process_group`` hooks call (``patch.set_join``): join
    telemetry now, so a spawned child shows up even if the rendezvous then hangs; the init_rpc
    hook posts the "rpc" event after."""
    joining()
    return _post_now


def _post_now(event: dict[str, Any]) -> None:
    """Post and send within the millisecond, not at the next cycle: a rank's RPC name is how
    every view and the hang diagnosis know it, and the rank may stop (SIGSTOP, a deadlock
    that starves its threads) right after init_rpc."""
    post(event)
    reporter = _reporter
    if reporter is not None:
        reporter.wake.set()


def _install_hooks() -> None:
    """The RRef hooks now if torch is imported, else as soon as it is: never import torch
    here (a rank that does not use it must not pay for it)."""
    from rpcctl.rank import autohook

    autohook.install(join=join_at_init_rpc, report=report_loss)


def set_hooks(on: bool, only: str | None = None) -> None:
    """Turn this process's RPC hooks on or off while telemetry runs (off: each hook calls straight
    through; the sender thread keeps running); ``only``: one family of those with RPC hooks
    (``Family.rpc_hooks``). For measuring what they cost, in the same process:
    benchmarks/telemetry_cost.py."""
    reporter = _reporter
    if reporter is None or not reporter.active:
        return
    for family in families.FAMILIES:
        if not family.rpc_hooks or only is not None and family.name != only:
            continue
        if on:
            family.observer.activate(reporter.queue)
        else:
            family.observer.deactivate()


def _adopt(family: families.Family) -> None:
    """A family registered at run time (``families.register``): prepared if torch is patched,
    activated if telemetry runs, its import hooks installed; the sender makes its processor at
    its next cycle."""
    patch.prepare(family.observer)
    reporter = _reporter
    if reporter is not None and reporter.active and reporter.pid == os.getpid():
        family.observer.activate(reporter.queue)
    if family.imports:
        from rpcctl.rank import autohook

        autohook.watch(family.imports)


families.listen(_adopt)


def post(event: dict[str, Any]) -> None:
    reporter = _reporter
    if reporter is not None and reporter.active:
        reporter.post(event)


def _number(value: Any) -> float | None:
    number = float(value)  # a tensor converts here, in the caller's thread (so no graph is kept)
    return None if math.isnan(number) else number


def _wanted() -> bool:
    return bool(os.environ.get(protocol.ENV_SOCKET)) and os.environ.get(protocol.ENV_DISABLE, "0") in ("", "0")


def _get() -> _Reporter:
    global _reporter, _fork_hook_registered
    with _lock:
        if _reporter is None or _reporter.pid != os.getpid():
            _reporter = _Reporter()
        if not _fork_hook_registered:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook_registered = True
        return _reporter


def _after_fork_in_child() -> None:
    global _reporter, _lock
    _lock = threading.Lock()
    old = _reporter
    _reporter = None
    patch.after_fork_in_child()  # the hooks' side of every family
    for family in families.FAMILIES:  # the sender's
        if family.after_fork is not None:
            family.after_fork()
    if old is not None:
        old.abandon()


class _Reporter:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.queue: collections.deque[Any] = collections.deque()
        self.active = False
        self.failed = False
        self.dropped = 0
        self.cpu_s = 0.0  # CPU time of the sender thread: what telemetry costs this process, off the hot path
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.wake = threading.Event()  # set: the sender cycles now (stop, or an event that must not wait)
        self._process: Any = None
        self._cuda_devices: int | None = None

    # -- lifecycle (caller's thread) -----------------------------------------------------------
    def activate(self) -> None:
        with _lock:
            if self.active or self.failed:
                return
            path = os.environ.get(protocol.ENV_SOCKET)
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(5.0)
                sock.connect(path)
                sock.sendall(protocol.encode(self._hello()))
            except OSError as exc:
                self.failed = True
                print(f"rpcctl: telemetry disabled in pid {os.getpid()}: cannot reach {path}: {exc}", file=sys.stderr)
                return
            self._sock = sock
            self._process = _ProcStat.open() or _psutil_process()
            self.active = True
            patch.activate(self.queue)
            self._thread = threading.Thread(target=self._run, name="rpcctl-telemetry", daemon=True)
            self._thread.start()
        atexit.register(stop)
        flush_at_os_exit()

    def _hello(self) -> dict[str, Any]:
        rank_text = os.environ.get(protocol.ENV_RANK) or os.environ.get("RANK")
        rank_pid = os.environ.get(protocol.ENV_RANK_PID)
        return {
            "k": "hello",
            "pid": self.pid,
            "ppid": os.getppid(),
            "host": socket.gethostname(),
            "rank": int(rank_text) if rank_text and rank_text.lstrip("-").isdigit() else None,
            "kind": "rank" if rank_pid == str(self.pid) else "child",
            "t": time.time(),
        }

    def post(self, event: dict[str, Any]) -> None:
        if len(self.queue) < protocol.MAX_QUEUE:
            self.queue.append(event)
        else:
            self.dropped += 1

    def stop(self, timeout: float) -> None:
        thread = self._thread
        if not self.active or thread is None:
            return
        self._stop.set()
        self.wake.set()
        if thread is not threading.current_thread():
            thread.join(timeout)
        patch.deactivate()
        self.active = False
        if not thread.is_alive() and self._sock is not None:
            self._sock.close()
            self._sock = None

    def abandon(self) -> None:
        """In a forked child: let go of the parent's connection without touching it."""
        self.active = False
        if self._sock is not None:
            try:
                os.close(self._sock.detach())
            except OSError:
                pass
            self._sock = None

    # -- the sender thread -----------------------------------------------------------------------
    def _run(self) -> None:
        cycle = families.Cycle()
        processors: dict[str, families.Processor] = {}  # family → its processor, made once per thread
        known: tuple[families.Family, ...] = ()
        next_probe = 0.0
        stopping = False
        while not stopping:
            self.wake.wait(protocol.SEND_INTERVAL_S)
            self.wake.clear()
            stopping = self._stop.is_set()
            cycle_started = time.thread_time()
            now = time.time()
            cycle.items = [self.queue.popleft() for _ in range(len(self.queue))]
            try:
                if families.FAMILIES is not known:  # the first cycle, or a family registered since
                    known = families.FAMILIES
                    processors.update(
                        (f.name, f.processor(cycle)) for f in known if f.processor and f.name not in processors
                    )
                events: list[dict[str, Any]] = []
                for processor in processors.values():
                    events.extend(processor.process(now, stopping))
                if stopping or time.monotonic() >= next_probe:
                    events.append(self._probe(now))
                    next_probe = time.monotonic() + protocol.PROBE_INTERVAL_S
                if stopping:
                    events.append({"e": "bye", "dropped": self._dropped(), "t": now})
            except Exception as exc:  # a bug here must not take the user's job down
                events = [{"e": "error", "message": repr(exc), "t": now}]
            if events and not send_in_slices(self._send, events):
                break
            self.cpu_s += time.thread_time() - cycle_started
        patch.deactivate()
        self.active = False

    def _dropped(self) -> int:
        return self.dropped + patch.dropped()

    def _send(self, message: dict[str, Any]) -> bool:
        sock = self._sock
        if sock is None:
            return False
        try:
            sock.sendall(protocol.encode(message))
            return True
        except OSError:
            self._sock = None
            try:
                sock.close()
            except OSError:
                pass
            return False

    def _probe(self, now: float) -> dict[str, Any]:
        event: dict[str, Any] = {
            "e": "probe",
            "t": now,
            "dropped": self._dropped(),
            "telemetry_cpu_s": self.cpu_s,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
        if self._process is not None:
            try:
                event.update(self._process.read())
            except Exception:
                pass
        event.update(_cuda_probe())
        return event


class _ProcStat:
    """The probe's process figures from one read of ``/proc/self/stat`` (Linux): what psutil's
    ``oneshot`` gave (cpu_percent as psutil computes it, cpu_s, rss_bytes, threads) for a
    fraction of its CPU (see ``benchmarks/launch_cost.py``). Opened at each read: a descriptor
    kept open could be closed, or its number reused, by the job."""

    TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
    PAGE = os.sysconf("SC_PAGE_SIZE")

    def __init__(self) -> None:
        self.last: tuple[float, float] | None = None  # (cpu_s, monotonic) of the last read: cpu_percent's baseline

    @classmethod
    def open(cls) -> _ProcStat | None:
        try:
            probe = cls()
            probe.read()  # the first read only sets cpu_percent's baseline
            return probe
        except (OSError, ValueError, IndexError, AttributeError):  # no /proc (or no sysconf)
            return None

    def read(self) -> dict[str, Any]:
        wall = time.monotonic()
        fields = stat_fields()
        cpu_s = (int(fields[UTIME]) + int(fields[STIME])) * self.TICK_S
        out: dict[str, Any] = {
            "cpu_s": cpu_s,
            "rss_bytes": int(fields[RSS_PAGES]) * self.PAGE,
            "threads": int(fields[NUM_THREADS]),
        }
        if self.last is not None:
            spent, elapsed = cpu_s - self.last[0], wall - self.last[1]
            out["cpu_percent"] = round(spent / elapsed * 100, 1) if elapsed > 0 else 0.0
        self.last = (cpu_s, wall)
        return out


class _PsutilProbe:
    """The probe's process figures from psutil, where there is no /proc."""

    def __init__(self, process: Any) -> None:
        self.process = process

    def read(self) -> dict[str, Any]:
        with self.process.oneshot():
            times = self.process.cpu_times()
            return {
                "cpu_percent": self.process.cpu_percent(None),
                "cpu_s": times.user + times.system,
                "rss_bytes": self.process.memory_info().rss,
                "threads": self.process.num_threads(),
            }


def _psutil_process() -> _PsutilProbe | None:
    try:
        import psutil

        process = psutil.Process()
        process.cpu_percent(None)  # the first call only sets the baseline
        return _PsutilProbe(process)
    except Exception:
        return None


def send_in_slices(send: Callable[[dict[str, Any]], bool], events: list[dict[str, Any]]) -> bool:
    """Send ``events`` as batches of GIL_SLICE, pausing in between: encoding is pure Python
    under the GIL, and a cycle with thousands of events must not stall the RPC threads."""
    every = rrefs.sender.GIL_SLICE  # read each time: benchmarks/tracking_overhead.py --gil varies it
    starts = range(0, len(events), every)
    return all(send({"k": "batch", "ev": events[start : start + every]}) for start in rrefs.in_slices(starts, every=1))


def _cuda_probe() -> dict[str, Any]:
    """CUDA placement and memory of this process, only where torch already initialised CUDA."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return {"device": "cpu"}
    try:
        visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")) or []
        gpus, total_reserved = [], 0
        current = cuda.current_device()
        for index in range(cuda.device_count()):
            reserved = int(cuda.memory_reserved(index))
            if reserved == 0 and index != current:
                continue
            props = cuda.get_device_properties(index)
            entry = {
                "index": index,
                "physical": visible[index] if index < len(visible) else str(index),
                "name": props.name,
                "total_bytes": int(props.total_memory),
                "reserved_bytes": reserved,
                "allocated_bytes": int(cuda.memory_allocated(index)),
            }
            if reserved:
                free, total = cuda.mem_get_info(index)
                entry["device_used_bytes"] = int(total - free)
            gpus.append(entry)
            total_reserved += reserved
        return {"device": f"cuda:{current}", "gpus": gpus, "gpu_memory_bytes": total_reserved}
    except Exception:
        return {"device": "cuda"}
