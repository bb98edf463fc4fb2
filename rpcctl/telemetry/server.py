"""The launcher's side of telemetry: one thread that owns the socket and the store.

Lifecycle (the launcher calls these; all but ``start``/``close`` may come from any thread)::

    server = TelemetryServer(run_dir, spec, world_size)
    env = server.start()           # store + socket exist; add env to every rank
    server.rank_started(...)       # ┐
    server.log_line(rank, line)    # ├ queued for the server thread: cheap, never block
    server.rank_exited(...)        # │
    server.round_meeting(restart)  # ┘ elastic: the attempt another node's ranks start in
    server.close()                 # drain, commit, close the socket; the db stays readable

The server thread waits on the listening socket, the worker connections and a wake-up pipe,
and commits at most every ``COMMIT_INTERVAL_S``, so a reader sees a change within ~0.1 s.

``health()`` says whether what the store holds can be trusted as the job's story right now (the
hang watchdog asks before it reads silence as a stall): not when the store can no longer be
written, the thread is gone or has not gone round its loop for ``LOOP_STALE_S``, or a fault of its
own (an accept that failed, an error in the loop) is recent; ``healthy_since`` is when it last
became trustworthy, so a silence that began while it was not counts from then.
Connections are accepted only from the same user (SO_PEERCRED), on top of the socket's 0600
mode, and other nodes only after the HMAC challenge: both in ``channel``. The store is SQLite
in WAL mode while the run lives and a single plain file after.
"""

from __future__ import annotations

import collections
import os
import selectors
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpcctl.wire import protocol
from rpcctl.telemetry.channel import (
    OUT_OF_DESCRIPTORS,
    LineBuffer,
    Refusals,
    Reserve,
    accept_local,
    challenge,
    close_unix,
    connection_cap,
    is_answer,
    listen_unix,
    worker_env,
)
from rpcctl.telemetry.losses import LossParser
from rpcctl.telemetry.store import ProcInfo, StoreWriter

if TYPE_CHECKING:
    from rpcctl.config import JobSpec

COMMIT_INTERVAL_S = 0.1
LOOP_STALE_S = 5.0  # the thread has not gone round its loop for this long: it is not reading
RECV_BYTES = 256 * 1024  # one read of a connection
MAX_PENDING = 32 * 1024 * 1024  # unfinished lines all connections hold together; beyond, the largest holder is cut off
# a fault that keeps coming (accept failing for want of descriptors) holds until this long after the last
FAULT_HOLD_S = 1.0
ACCEPT_PAUSE_S = 0.05  # after such a failure the listener is not polled for this long (it stays readable: no spin)
MAX_BACKOFF_S = 1.0  # the longest pause after the same fault of the loop again and again
# What an event with a missing or ill-typed field raises in the store: the event is dropped.
BAD_EVENT_ERRORS = (KeyError, TypeError, ValueError, OverflowError, sqlite3.InterfaceError, sqlite3.ProgrammingError)


@dataclass(frozen=True)
class TelemetryHealth:
    """Whether the store is the job's story now (``impaired``: None) and since when without a break."""

    impaired: str | None  # why not: what a person reads ("the telemetry store cannot be written: disk is full")
    healthy_since: float  # wall-clock time since which nothing impaired it


class TelemetryServer:
    def __init__(
        self, run_dir: Path, spec: JobSpec | None = None, world_size: int = 1, warn: Callable[[str], None] | None = None
    ):
        self.run_dir = Path(run_dir)
        self._warn_store = warn
        self.world_size = world_size
        self.run_id = os.environ.get("RPCCTL_RUN_ID") or self.run_dir.name
        self._loss_pattern = spec.losses.pattern if spec is not None else None
        # One parser per rank (it remembers the rank's last epoch header), used on the pump's
        # thread only; the line counts too: the server thread copies them (a dict copy is atomic).
        self._parsers: dict[int, LossParser] = {}
        self._line_counts: dict[int, tuple[int, int]] = {}  # rank → (lines read, lines that matched)
        self._counts_written: dict[int, tuple[int, int]] = {}
        self._last_loss: dict[int, tuple[tuple[Any, ...], int]] = {}  # rank → ((restart, epoch, step), id)
        self._inbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self._store: StoreWriter | None = None
        self._listener: socket.socket | None = None
        self._socket_path: Path | None = None
        self._private_dir: str | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        self._restart_of_rank: dict[int, int] = {}
        self._attempt = 0  # this node's attempt, as of its last round_meeting: other nodes' ranks run in it
        # Keyed by (rank, pid), not pid: on a multi-node run pids repeat across hosts, and the
        # global rank tells the hosts apart.
        self._restart_of_proc: dict[tuple[int, int], int] = {}
        self._procs_by_key: dict[tuple[int, int], ProcInfo] = {}
        self.bad_messages = 0  # lines, messages and events refused (counted, dropped)
        self.refused = Refusals("telemetry server")  # local connections from another user
        self.refused_connections = 0  # connections refused (over the cap, or shed for want of a descriptor) or cut off
        self.faults = 0  # exceptions of the server's own that its guards caught
        self._said: set[str] = set()  # what it has said on stderr (each thing once)
        self._connections = 0
        self._max_connections = connection_cap(world_size)
        self._pending = 0  # bytes of unfinished lines all connections hold
        self._reserve: Reserve | None = None
        self._paused: dict[socket.socket, tuple[str, float]] = {}  # listeners not polled until (data, monotonic time)
        self._fault_until = 0.0  # monotonic time until which ``_fault`` holds
        self._tcp_listener: socket.socket | None = None
        self._secret = b""
        # What health() reads, written by the server thread (plain assignments: no lock needed).
        self._loop_at = 0.0  # monotonic time the thread last went round its loop
        self._fault: str | None = None  # a fault of the server's own that still holds (accept failing)
        self._fault_at = 0.0  # wall time of the last fault seen (0: none)
        self._stopped: str | None = None  # why the thread ended, if it did without being closed
        self._started_at = 0.0

    @property
    def socket_path(self) -> Path | None:
        return self._socket_path

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> dict[str, str]:
        """Create the store and the socket, start the thread; returns env vars for every rank."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._store = StoreWriter(
            protocol.db_path(self.run_dir), **({"warn": self._warn_store} if self._warn_store else {})
        )
        self._store.set_meta(run_id=self.run_id, world_size=self.world_size)
        self._listener = self._listen()
        self._store.set_meta(socket=str(self._socket_path))
        self._store.commit()
        self._max_connections = connection_cap(self.world_size)  # what the descriptors allow now
        self._reserve = Reserve()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._started_at = time.time()
        self._loop_at = time.monotonic()
        self._thread = threading.Thread(target=self._serve, name="rpcctl-telemetry", daemon=True)
        self._thread.start()
        return self.env()

    def health(self) -> TelemetryHealth:
        """Whether the store tells the job's story now; cheap, from any thread."""
        store, thread = self._store, self._thread
        if store is None or thread is None:
            reason = "the telemetry server is not running"
        elif self._stopped is not None or not thread.is_alive():
            reason = f"the telemetry server stopped ({self._stopped or 'its thread ended'})"
        elif store.failed is not None:
            reason = f"the telemetry store cannot be written ({store.failed})"
        elif time.monotonic() - self._loop_at > LOOP_STALE_S:
            reason = f"the telemetry server has read nothing for {time.monotonic() - self._loop_at:.0f} s"
        else:
            reason = self._fault
        if reason is not None:
            self._fault_at = time.time()
            return TelemetryHealth(reason, self._fault_at)
        return TelemetryHealth(None, max(self._started_at, self._fault_at))

    def env(self) -> dict[str, str]:
        assert self._socket_path is not None, "start() first"
        return worker_env(self._socket_path)

    def listen_tcp(self, listener: socket.socket, secret: bytes) -> None:
        """Also take other nodes' telemetry (multi-node runs, node 0 only) on ``listener``, a
        bound and listening TCP socket. A connection is trusted only after it answers an HMAC
        challenge with the run's secret; then it speaks the same JSON lines as a local worker,
        plus ``launcher`` messages that carry another node's launcher events. Call before start()."""
        assert self._thread is None, "listen_tcp() goes before start()"
        listener.setblocking(False)
        self._tcp_listener, self._secret = listener, secret

    def close(self) -> None:
        """Flush everything, close the socket, leave the db readable. Idempotent, bounded, and
        it never raises: what the thread left undone (it may have stopped) is done here, each
        item under its own guard."""
        if self._store is None:
            return
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._thread is None or not self._thread.is_alive():
            self._guarded("closing", self._drain_inbox)
            self._guarded("closing the store", self._store.close)
        self._store = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._wake_r = self._wake_w = -1
        if self._reserve is not None:
            self._reserve.close()
        self._guarded("closing the socket", self._remove_socket)

    # -- the launcher's calls (any thread; cheap) ----------------------------------------------
    def rank_started(
        self, rank: int, pid: int, local_rank: int, device: str, restart: int, remote: bool = False
    ) -> None:
        """A rank of this node, or (``remote``) of another, whose launcher relayed it."""
        self._post(("started", rank, pid, local_rank, device, restart, time.time(), remote))
        self._wake()  # rare, and views read the rank from the store: store it now, not in 0.1 s

    def rank_exited(self, rank: int, pid: int, state: str, exit_code: int | None) -> None:
        self._post(("exited", rank, pid, state, exit_code, time.time()))
        self._wake()

    def round_meeting(self, restart: int) -> None:
        """This node (the store's host) meets the others for its attempt ``restart``. It is in
        every round, so another node's ranks that start from now on are filed under it: their
        launcher counts only the rounds it was in (a node that joined in round 1 starts at 0)."""
        self._post(("meeting", restart))

    def log_line(self, rank: int, line: str) -> None:
        if self._store is None:  # closed (or telemetry failed to start): nothing is kept
            return
        parser = self._parsers.get(rank)
        if parser is None:
            parser = self._parsers[rank] = LossParser(self._loss_pattern)
        try:
            parsed = parser.parse(line)
        except Exception as exc:  # (the parser is total: this is a bug, and the line is not a record)
            parsed = None
            self._say_once(
                f"loss parser: {type(exc).__name__}",
                f"the loss parser failed on a line of rank {rank} ({_short(exc)}); it goes on",
            )
        lines, matched = self._line_counts.get(rank, (0, 0))
        self._line_counts[rank] = (lines + 1, matched + (parsed is not None))
        if parsed is not None:
            self._post(("loss", rank, parsed, time.time()))

    def _post(self, item: tuple[Any, ...]) -> None:
        if self._store is not None:
            self._inbox.append(item)

    # -- the server thread ---------------------------------------------------------------------
    def _listen(self) -> socket.socket:
        listener, self._socket_path, self._private_dir = listen_unix(self.run_dir)
        listener.setblocking(False)
        return listener

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _serve(self) -> None:
        """The thread: no input ends it. Each accept, message, event and inbox item is handled
        under its own guard, and the loop's turn under one more: what escapes a guard is said once
        on stderr, counted (``faults``), recorded for ``health()`` (``_fault_at``), and the thread
        serves on, pausing a little longer each time the very same fault comes again."""
        assert self._listener is not None and self._store is not None
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._listener, selectors.EVENT_READ, "accept")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            if self._tcp_listener is not None:
                selector.register(self._tcp_listener, selectors.EVENT_READ, "accept_tcp")
            last_commit = last_note = time.monotonic()
            repeated, last_fault = 0, ""
            while not self._stopping.is_set():
                self._loop_at = time.monotonic()
                try:
                    self._turn(selector)
                    if time.monotonic() - last_commit >= COMMIT_INTERVAL_S:
                        if time.monotonic() - last_note >= 1.0:
                            self._note_counts()
                            last_note = time.monotonic()
                        self._store.commit()
                        last_commit = time.monotonic()
                    repeated = 0
                except Exception as exc:
                    fault = f"{type(exc).__name__}: {exc}"
                    repeated = repeated + 1 if fault == last_fault else 1
                    last_fault = fault
                    self._own_fault("its loop", exc)
                    if repeated > 1:  # the same again: never a busy loop
                        time.sleep(min(MAX_BACKOFF_S, 0.01 * 2 ** min(repeated, 10)))
            self._close_down(selector)
        except BaseException as exc:  # never take the launcher down; say why telemetry stopped
            self._stopped = repr(exc)
            self._say(f"stopped: {_short(exc)}")
        finally:
            selector.close()

    def _turn(self, selector: selectors.BaseSelector) -> None:
        """One round: what is ready, then the inbox; each thing under its own guard."""
        if self._paused:
            self._resume_listeners(selector)
        for key, _ in selector.select(timeout=COMMIT_INTERVAL_S):
            try:
                if key.data == "accept":
                    self._accept(selector, key.fileobj, tcp=False)
                elif key.data == "accept_tcp":
                    self._accept(selector, key.fileobj, tcp=True)
                elif key.data == "wake":
                    _drain_pipe(self._wake_r)
                else:
                    self._read(selector, key.fileobj, key.data)
            except Exception as exc:
                self._own_fault("a connection", exc)
                if isinstance(key.data, _Conn):  # whatever it was, it does not come round again
                    self._disconnect(selector, key.fileobj, key.data)
        self._drain_inbox()
        if self._fault is not None and time.monotonic() > self._fault_until:
            self._fault = None  # the fault has passed

    def _close_down(self, selector: selectors.BaseSelector) -> None:
        """Closing: take what connected workers already sent, then stop; each step guarded."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                ready = [k for k, _ in selector.select(timeout=0.05) if isinstance(k.data, _Conn)]
            except Exception as exc:
                self._own_fault("closing", exc)
                break
            if not ready:
                break
            for key in ready:
                self._guarded("closing", self._read, selector, key.fileobj, key.data)
        for key in list(selector.get_map().values()):
            if isinstance(key.data, _Conn):
                self._disconnect(selector, key.fileobj, key.data)
        self._guarded("closing", self._drain_inbox)
        self._guarded("closing", self._note_counts)
        self._guarded("closing", self._store.commit)

    def _note_counts(self) -> None:
        assert self._store is not None
        # This thread is the launcher's whole share of telemetry work.
        self._store.set_meta(
            server_cpu_s=time.thread_time(),
            refused_messages=self.bad_messages,
            refused_connections=self.refused_connections,
            server_faults=self.faults,
        )

    # -- faults of its own -------------------------------------------------------------------------
    def _own_fault(self, where: str, exc: BaseException) -> None:
        """An exception a guard caught: counted, recorded for ``health()``, said once per kind."""
        self.faults += 1
        self._fault_at = time.time()
        self._say_once(f"{where}: {type(exc).__name__}", f"{where} failed ({_short(exc)}); it goes on")

    def _guarded(self, where: str, step: Callable[..., Any], *args: Any) -> None:
        try:
            step(*args)
        except Exception as exc:
            self._own_fault(where, exc)

    def _say_once(self, what: str, message: str) -> None:
        if what not in self._said and len(self._said) < 100:
            self._said.add(what)
            self._say(message)

    @staticmethod
    def _say(message: str) -> None:
        try:
            print(f"rpcctl: telemetry server: {message}", file=sys.stderr)
        except (OSError, ValueError):  # no stderr any more (closed, a full disk): telemetry never stops for it
            pass

    # -- connections -----------------------------------------------------------------------------
    def _accept(self, selector: selectors.BaseSelector, listener: Any, tcp: bool) -> None:
        try:
            conn = listener.accept()[0] if tcp else accept_local(listener, self.refused)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno not in OUT_OF_DESCRIPTORS:
                raise
            self._out_of_descriptors(selector, listener, exc)
            return
        if conn is None:
            return
        if self._connections >= self._max_connections:
            conn.close()
            self.refused_connections += 1
            self._fault_at = time.time()
            self._say_once(
                "cap",
                f"{self._connections} connections are open, the most it takes (the launcher's descriptors"
                " are for its own work too): it refuses more, and counts them",
            )
            return
        state = _Conn(remote=tcp)
        if tcp:
            state.nonce, line = challenge()
            try:
                conn.sendall(line)
            except OSError:
                conn.close()
                return
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ, state)
        self._connections += 1

    def _out_of_descriptors(self, selector: selectors.BaseSelector, listener: Any, exc: OSError) -> None:
        """accept() failed for want of a descriptor: the connection that waits is shed (through
        the reserve descriptor), the listener rests a moment, and the fault holds until such
        failures stop."""
        self._fault_at = time.time()
        self._fault = (
            f"the launcher is out of file descriptors ({exc.strerror or exc}): telemetry connections are refused"
        )
        self._fault_until = time.monotonic() + FAULT_HOLD_S
        if self._reserve is not None and self._reserve.shed(listener):
            self.refused_connections += 1
        self._say_once("descriptors", f"{self._fault}, and counted, while it lasts")
        data = "accept_tcp" if listener is self._tcp_listener else "accept"
        try:
            selector.unregister(listener)
        except (KeyError, ValueError):
            return
        self._paused[listener] = (data, time.monotonic() + ACCEPT_PAUSE_S)

    def _resume_listeners(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for listener, (data, until) in list(self._paused.items()):
            if now >= until:
                del self._paused[listener]
                selector.register(listener, selectors.EVENT_READ, data)

    def _authenticate(self, conn: _Conn, message: dict[str, Any]) -> None:
        if is_answer(self._secret, str(conn.nonce), message):
            conn.nonce = None
        else:
            conn.rejected = True
            self.bad_messages += 1

    def _read(self, selector: selectors.BaseSelector, sock: Any, conn: _Conn) -> None:
        try:
            data = sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._disconnect(selector, sock, conn)
            return
        before = conn.lines.size
        lines = conn.lines.feed(data)
        self._pending += conn.lines.size - before
        if lines is None:  # a line longer than protocol.MAX_LINE
            self.bad_messages += 1
            self._say_once(
                "long line", f"a connection sent a line longer than {protocol.MAX_LINE >> 20} MiB: it was cut off"
            )
            self._disconnect(selector, sock, conn)
            return
        for line in lines:
            try:
                if not self._line(conn, line):
                    self._disconnect(selector, sock, conn)
                    return
            except Exception as exc:  # a message no check foresaw: it alone is lost
                self.bad_messages += 1
                self._own_fault("a message", exc)
        if self._pending > MAX_PENDING:
            self._cut_largest(selector)

    def _line(self, conn: _Conn, line: bytes) -> bool:
        """Handle one line; False when its connection must end (a failed challenge)."""
        message = protocol.decode(line)
        if message is None:
            self.bad_messages += 1
            return True
        if conn.nonce is not None:  # another node: the first line must answer the challenge
            self._authenticate(conn, message)
            return not conn.rejected
        self._handle(conn, message)
        return True

    def _cut_largest(self, selector: selectors.BaseSelector) -> None:
        """Connections hold more than MAX_PENDING of unfinished lines: the one that holds the most
        is cut off (a rank's lines end within milliseconds; a line that never ends is no rank's)."""
        held = [
            (key.data.lines.size, key.fileobj, key.data)
            for key in selector.get_map().values()
            if isinstance(key.data, _Conn)
        ]
        if not held:
            return
        size, sock, conn = max(held, key=lambda item: item[0])
        self.refused_connections += 1
        self._say_once(
            "pending",
            f"connections held {self._pending >> 20} MiB of unfinished lines (at most {MAX_PENDING >> 20} MiB in"
            f" all): the one holding the most ({size >> 20} MiB) was cut off",
        )
        self._disconnect(selector, sock, conn)

    def _handle(self, conn: _Conn, message: dict[str, Any]) -> None:
        assert self._store is not None
        kind = message.get("k")
        now = time.time()
        if kind == "hello" and conn.proc is None and not protocol.valid_hello(message):
            self.bad_messages += 1
        elif kind == "hello" and conn.proc is None:
            pid = message.get("pid")
            rank = message.get("rank")
            key = (rank, pid) if isinstance(rank, int) and isinstance(pid, int) else None
            restart = self._restart_of_proc.get(key) if key else None
            if restart is None:
                restart = self._restart_of_rank.get(rank, 0) if isinstance(rank, int) else 0
            proc_id = self._store.proc_connected(message, restart, now)
            conn.proc = ProcInfo(proc_id, pid, rank, restart)
            if key:
                self._procs_by_key[key] = conn.proc
        elif kind == "launcher" and conn.remote and conn.proc is None:  # another node's launcher (authenticated)
            call = protocol.launcher_call(message)
            if call is None:
                self.bad_messages += 1
            elif call[0] == "started":
                self.rank_started(*call[1], remote=True)
            elif call[0] == "exited":
                self.rank_exited(*call[1])
            else:
                self.log_line(*call[1])
        elif kind == "batch" and conn.proc is not None:
            events = message.get("ev")
            if not isinstance(events, list):
                self.bad_messages += 1
                return
            self._store.heartbeat(conn.proc, now)
            for event in events:
                if not protocol.valid_event(event):
                    # an unknown kind, a field of the wrong type or out of bounds: dropped, the server goes on
                    self.bad_messages += 1
                    continue
                try:
                    self._store.apply(conn.proc, event)
                except BAD_EVENT_ERRORS:
                    self.bad_messages += 1  # what no check foresaw: this event is dropped, the server goes on
                except Exception as exc:
                    self.bad_messages += 1
                    self._own_fault("an event", exc)
        else:
            self.bad_messages += 1

    def _disconnect(self, selector: selectors.BaseSelector, sock: Any, conn: _Conn) -> None:
        """End a connection (never raises: it is what a guard does after a fault)."""
        try:
            selector.unregister(sock)
        except (KeyError, ValueError):
            return  # already ended
        self._connections -= 1
        self._pending -= conn.lines.size
        conn.lines = LineBuffer()
        try:
            sock.close()
        except OSError:
            pass
        if conn.proc is not None and self._store is not None:
            proc, conn.proc = conn.proc, None
            self._guarded("a connection's end", self._store.proc_ended, proc.proc_id, time.time())
            key = (proc.rank, proc.pid)
            if self._procs_by_key.get(key) is proc:
                del self._procs_by_key[key]

    def _drain_inbox(self) -> None:
        store = self._store
        assert store is not None
        while self._inbox:
            self._guarded("a launcher call", self._apply_item, store, self._inbox.popleft())
        self._guarded("the line counts", self._write_line_counts)

    def _apply_item(self, store: StoreWriter, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "loss":
            _, rank, parsed, t = item
            restart = self._restart_of_rank.get(rank, 0)
            key = (restart, parsed.epoch, parsed.step)
            last = self._last_loss.get(rank)
            if parsed.step is not None and last is not None and last[0] == key:
                # The same step drawn again: a bar redraws after set_postfix, with the new value.
                store.replace_loss(last[1], parsed.loss, parsed.metrics, t)
            else:
                loss_id = store.loss(
                    rank, restart, parsed.step, parsed.epoch, parsed.loss, parsed.metrics, t, "log", parsed.rule
                )
                self._last_loss[rank] = (key, loss_id)
        elif kind == "meeting":
            self._attempt = max(self._attempt, item[1])
        elif kind == "started":
            _, rank, pid, local_rank, device, restart, t, remote = item
            if remote:  # another node's: in this node's attempt (the node's own count, in a static job)
                restart = max(restart, self._attempt)
            self._restart_of_rank[rank] = restart
            self._restart_of_proc[(rank, pid)] = restart
            self._write_line_counts()  # what the previous attempt printed counts for it
            self._parsers.pop(rank, None)  # a new attempt starts with no epoch header seen
            store.rank_started(rank, restart, pid, local_rank, device, t)
            proc = self._procs_by_key.get((rank, pid))
            if proc is not None and proc.restart != restart:  # it connected before we heard of it
                proc.restart = restart
                store.set_proc_restart(proc.proc_id, restart)
        elif kind == "exited":
            _, rank, pid, state, exit_code, t = item
            store.rank_exited(rank, pid, state, exit_code, t)

    def _write_line_counts(self) -> None:
        store = self._store
        assert store is not None
        for rank, (lines, matched) in dict(self._line_counts).items():
            done_lines, done_matched = self._counts_written.get(rank, (0, 0))
            if lines != done_lines:
                store.log_lines(rank, self._restart_of_rank.get(rank, 0), lines - done_lines, matched - done_matched)
                self._counts_written[rank] = (lines, matched)

    def _remove_socket(self) -> None:
        if self._tcp_listener is not None:
            self._tcp_listener.close()
            self._tcp_listener = None
        close_unix(self._listener, self._socket_path, self._private_dir)
        self._listener = self._socket_path = self._private_dir = None


class _Conn:
    __slots__ = ("lines", "proc", "nonce", "rejected", "remote")

    def __init__(self, remote: bool = False) -> None:
        self.lines = LineBuffer()
        self.proc: ProcInfo | None = None
        self.nonce: str | None = None  # set until another node's connection answers its challenge
        self.rejected = False
        self.remote = remote  # over TCP from another node (authenticated): may carry that node's launcher calls


def _short(exc: BaseException) -> str:
    """An exception in a line of stderr: its repr (escapes what a terminal would act on), cut."""
    text = repr(exc)
    return text if len(text) <= 300 else text[:297] + "..."


def _drain_pipe(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass
