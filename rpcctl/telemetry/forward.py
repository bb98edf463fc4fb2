"""Telemetry of a node other than node 0: relayed to node 0's server, so that node 0's store
holds every rank of a multi-node run.

``TelemetryForwarder`` stands in for ``TelemetryServer`` on nodes 1..N-1 (same calls). Ranks
connect to a local Unix socket (mode 0600) exactly as they would on one node, and only the
run's owner gets in (the same-user check of ``channel.accept_local``, as on node 0); each
connection is relayed byte for byte over its own TCP connection to node 0, and the launcher's
own events go over one more. Every TCP connection first answers node 0's HMAC challenge with
the run's secret (``RPCCTL_SECRET``); the payload stays JSON lines, never pickle.
"""

from __future__ import annotations

import collections
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rpcctl.wire import protocol
from rpcctl.telemetry.losses import LossParser
from rpcctl.telemetry.channel import (
    OUT_OF_DESCRIPTORS,
    Refusals,
    Reserve,
    accept_local,
    close_unix,
    connect_authenticated,
    connection_cap,
    listen_unix,
    worker_env,
)


class TelemetryForwarder:
    def __init__(self, run_dir: Path, address: tuple[str, int], secret: bytes, loss_pattern: str | None = None):
        self.run_dir, self.address, self.secret = Path(run_dir), address, secret
        self._loss_pattern = loss_pattern
        self._listener: socket.socket | None = None
        self._socket_path: Path | None = None
        self._private_dir: str | None = None
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=100_000)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.refused = Refusals("telemetry relay")  # local connections from another user
        self.refused_connections = 0  # over the cap, or shed for want of a descriptor
        self._relays = 0  # connections relayed now (each a thread and two descriptors)
        self._lock = threading.Lock()
        self._said: set[str] = set()

    def start(self) -> dict[str, str]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        listener, path, self._private_dir = listen_unix(self.run_dir)
        listener.settimeout(0.2)
        self._listener, self._socket_path = listener, path
        # Its descriptor reserve and cap, here and not on its thread: from the limit as the relay
        # starts, not as it was whenever the thread first ran (a limit lowered meanwhile made a cap
        # of 1 under load, and the relay refused by its cap where it was to run out: CI).
        limits = (Reserve(), max(1, connection_cap(1) // 2))
        for target, name, args in (
            (self._accept_loop, "rpcctl-telemetry-relay", limits),
            (self._send_loop, "rpcctl-telemetry-launcher", ()),
        ):
            thread = threading.Thread(target=target, name=name, args=args, daemon=True)
            thread.start()
            self._threads.append(thread)
        return worker_env(path)

    # -- the launcher's calls (same as TelemetryServer's; never block) ---------------------------
    def rank_started(self, rank: int, pid: int, local_rank: int, device: str, restart: int) -> None:
        self._post("started", [rank, pid, local_rank, device, restart])

    def rank_exited(self, rank: int, pid: int, state: str, exit_code: int | None) -> None:
        self._post("exited", [rank, pid, state, exit_code])

    def round_meeting(self, restart: int) -> None:
        """Only the store's host counts the job's attempts (``TelemetryServer.round_meeting``)."""

    def log_line(self, rank: int, line: str) -> None:
        # Only lines that may hold a loss or an epoch header are of use to node 0 (it parses them,
        # one parser per rank): filter here rather than ship every line across.
        if self._loss_pattern is not None or LossParser.may_matter(line):
            self._post("log", [rank, line])

    def _post(self, op: str, args: list[Any]) -> None:
        if self._stopping.is_set():  # closed (or failed to start): nothing more is sent
            return
        self._events.append({"k": "launcher", "op": op, "args": args})
        self._wake.set()

    # -- threads ---------------------------------------------------------------------------------
    def _send_loop(self) -> None:
        try:
            sock = connect_authenticated(self.address, self.secret)
        except OSError as exc:
            self.errors.append(f"launcher events: {exc}")
            return
        with sock:
            while True:
                self._wake.wait(0.2)
                self._wake.clear()
                batch = []
                while self._events:
                    batch.append(protocol.encode(self._events.popleft()))
                if batch:
                    try:
                        sock.sendall(b"".join(batch))
                    except OSError as exc:
                        self.errors.append(f"launcher events: {exc}")
                        return
                if self._stopping.is_set() and not self._events:
                    return

    def _accept_loop(self, reserve: Reserve, cap: int) -> None:
        """Accept and relay, until closed; no input ends it. A connection over the cap (each costs
        a thread and two descriptors: ``channel.connection_cap``, for half the descriptors) is
        refused; an accept failing for want of a descriptor sheds the waiting one (``reserve``)
        and rests."""
        assert self._listener is not None
        try:
            while not self._stopping.is_set():
                try:
                    local = accept_local(self._listener, self.refused)
                except TimeoutError:
                    continue
                except OSError as exc:
                    if exc.errno not in OUT_OF_DESCRIPTORS:
                        return  # the listener is closed
                    self.refused_connections += reserve.shed(self._listener)
                    self._say_once(
                        "descriptors", f"out of file descriptors ({exc.strerror}): telemetry connections are refused"
                    )
                    time.sleep(0.05)
                    continue
                if local is None:
                    continue
                with self._lock:
                    full = self._relays >= cap
                    self._relays += not full
                if full:
                    local.close()
                    self.refused_connections += 1
                    self._say_once(
                        "cap", f"{cap} connections are relayed, the most it takes: it refuses more, and counts them"
                    )
                    continue
                thread = threading.Thread(target=self._relay, args=(local,), name="rpcctl-telemetry-pipe", daemon=True)
                thread.start()
                self._threads = [t for t in self._threads if t.is_alive()]
                self._threads.append(thread)
        finally:
            reserve.close()

    def _say_once(self, what: str, message: str) -> None:
        if what not in self._said:
            self._said.add(what)
            try:
                print(f"rpcctl: telemetry relay: {message}", file=sys.stderr)
            except (OSError, ValueError):
                pass

    def _relay(self, local: socket.socket) -> None:
        try:
            self._pipe(local)
        finally:
            with self._lock:
                self._relays -= 1

    def _pipe(self, local: socket.socket) -> None:
        try:
            remote = connect_authenticated(self.address, self.secret)
        except OSError as exc:
            if len(self.errors) < 100:  # (a flood of connections while node 0 is unreachable: bounded)
                self.errors.append(f"relay: {exc}")
            local.close()
            return
        with local, remote:
            while True:
                try:
                    data = local.recv(1 << 20)
                except OSError:
                    data = b""
                if not data:
                    return
                try:
                    remote.sendall(data)
                except OSError:
                    return

    def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=3)
        close_unix(self._listener, self._socket_path, self._private_dir)
