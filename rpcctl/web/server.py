"""The live page: ``rpcctl web [RUN]`` and ``rpcctl launch --web``.

A stdlib HTTP server that serves one run's page and, at ``/api/view``, the next view of it
as JSON (the page polls it once a second, so it follows the run without a reload).

Who can read it (a run's page shows its config, errors and log text):

- it listens on 127.0.0.1 only, on a free port;
- every request must carry the unguessable token of the printed URL (``?token=``, 256 bits,
  compared in constant time);
- the Host header must be ``127.0.0.1:PORT`` or ``localhost:PORT`` and an Origin header, when
  sent, that same origin: a page elsewhere that resolves its own name to 127.0.0.1 (DNS
  rebinding) is refused before the token is even looked at;
- it is read-only: GET only (anything else: 405), nothing in a request changes anything;
- responses are ``no-store``, never framed, and the page's Content-Security-Policy lets it
  run only its own scripts and connect only to this server.

What a local neighbour without the token can do to it is bounded. Two stages::

    accept ──▶ the front (one thread, a selector): reads every connection's request head,
               at most MAX_HEAD_BYTES, within REQUEST_HEAD_S of its accept
                 │ a whole head
                 ▼
               MAX_CONNECTIONS threads: one request each (parse, check, answer), then close

- a connection that sends nothing, or dribbles, holds no thread: only its socket and what it
  sent (at most ``MAX_HEAD_BYTES``), and for at most ``REQUEST_HEAD_S`` (a deadline over all its
  reads, not a timeout per read); a request whose head is whole is answered at once, however
  many such connections there are (200 idle ones delayed the token's request by 7 s when a
  thread read each head);
- at most ``MAX_WAITING`` connections (fewer under a low open-files limit) wait for their
  head: a new one beyond them closes the one that has waited longest; an ``accept`` that finds
  no descriptor left does the same, so the server never stops on EMFILE;
- at most ``MAX_CONNECTIONS`` threads answer, each at most ``REQUEST_HEAD_S`` per answer to a
  client that does not read it; the connection is closed after one request (HTTP/1.0);
- a connection reset, refused, cut or timed out is counted (``LiveServer.dropped``), never
  printed: the console is the job's. ``RPCCTL_DEBUG=1`` prints one line for each.
"""

from __future__ import annotations

import collections
import errno
import hmac
import io
import json
import os
import queue
import resource
import secrets
import selectors
import socket
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rpcctl.console import get_console
from rpcctl.base.errors import RpcctlError
from rpcctl.web import stacks
from rpcctl.web.page import render, require_plotly, run_view, view_json

VIEW_PATH = "/api/view"
# The page polls once a second; several tabs (or a fast poller) share one read of the store.
VIEW_MAX_AGE_S = 0.5
# Threads that answer requests (each a whole request head): a few tabs polling need a handful.
MAX_CONNECTIONS = 16
# The request line and headers of a request must have arrived this long after its accept.
REQUEST_HEAD_S = 10.0
# A request head is at most this long (a browser's is under 8 KiB).
MAX_HEAD_BYTES = 32 * 1024
# Connections waiting for their head, at most (and at most a quarter of the open-files limit):
# their memory is bounded by MAX_WAITING * MAX_HEAD_BYTES (16 MiB).
MAX_WAITING = 512


class LiveServer:
    """Serves ``run_dir``'s live page until ``stop()``. ``url`` carries the token."""

    def __init__(self, run_dir: Path, port: int = 0):
        require_plotly()
        self.run_dir = Path(run_dir)
        self.token = secrets.token_urlsafe(32)
        self._view_lock = threading.Lock()
        self._view: tuple[float, str] | None = None
        self._thread: threading.Thread | None = None
        self.dropped: collections.Counter[str] = collections.Counter()  # connections refused, reset, timed out
        self._drop_lock = threading.Lock()
        self.httpd = _Front(("127.0.0.1", port), self)
        self.port = self.httpd.server_address[1]
        self.allowed_hosts = frozenset({f"127.0.0.1:{self.port}", f"localhost:{self.port}"})
        self.allowed_origins = frozenset(f"http://{host}" for host in self.allowed_hosts)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/?token={self.token}"

    def start(self) -> LiveServer:
        """Serve from a background thread (``launch --web``)."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="rpcctl-web", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on this thread until interrupted (``rpcctl web``)."""
        try:
            self.httpd.serve_forever()
        finally:
            self.httpd.server_close()

    def stop(self) -> None:
        self.httpd.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.httpd.server_close()

    def token_ok(self, query: str) -> bool:
        given = parse_qs(query).get("token", [""])[0]
        return hmac.compare_digest(given.encode(), self.token.encode())

    def drop(self, what: str, client: Any) -> None:
        """Count a connection that ended without an answer; a line only with ``RPCCTL_DEBUG``."""
        with self._drop_lock:
            self.dropped[what] += 1
            count = self.dropped[what]
        if os.environ.get("RPCCTL_DEBUG"):
            port = client[1] if isinstance(client, tuple) and len(client) > 1 else "?"
            get_console().note(f"rpcctl: live page: connection from port {port} {what} ({count} so far)")

    def view_document(self) -> str:
        with self._view_lock:
            now = time.monotonic()
            if self._view is None or now - self._view[0] > VIEW_MAX_AGE_S:
                self._view = (now, view_json(run_view(self.run_dir)))
            return self._view[1]


class _Waiting:
    """A connection whose request head is still coming: what it sent, and until when it may."""

    __slots__ = ("connection", "client", "data", "deadline")

    def __init__(self, connection: socket.socket, client: Any):
        self.connection, self.client = connection, client
        self.data = bytearray()
        self.deadline = time.monotonic() + REQUEST_HEAD_S  # read now: tests shorten it


def _end_of_head(data: bytearray, start: int) -> int:
    """Where the request head ends (just past its blank line), or -1; the search begins near
    ``start``, where the last one left off (a head dribbled byte by byte is scanned once)."""
    ends = [at + len(mark) for mark in (b"\r\n\r\n", b"\n\n") if (at := data.find(mark, max(0, start - 3))) >= 0]
    return min(ends) if ends else -1


def _close(connection: socket.socket) -> None:
    try:
        connection.close()
    except OSError:
        pass


class _Front:
    """The listening socket and every connection still sending its request head, on one thread
    (a selector); whole heads go to at most ``MAX_CONNECTIONS`` answering threads (see the
    module's docstring). ``serve_forever``, ``shutdown``, ``server_close`` as socketserver's."""

    def __init__(self, address: tuple[str, int], live: LiveServer):
        self.live = live
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(128)
        except BaseException:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.max_waiting = MAX_WAITING if soft == resource.RLIM_INFINITY else max(8, min(MAX_WAITING, soft // 4))
        self._waiting: dict[int, _Waiting] = {}  # by file descriptor, oldest first
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake = socket.socketpair()
        self._wake_read.setblocking(False)
        self._heads: queue.SimpleQueue[tuple[socket.socket, Any, bytes] | None] = queue.SimpleQueue()
        self._answering = 0  # heads handed on and not yet answered
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    # -- the front's thread

    def serve_forever(self) -> None:
        self._stopped.clear()
        selector = self._selector
        selector.register(self.socket, selectors.EVENT_READ, "accept")
        selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        resting_until = 0.0  # out of descriptors, with none of ours to close: accept again after a moment
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                timeout = 0.05 if resting_until else 0.5
                if self._waiting:
                    timeout = max(0.0, min(timeout, next(iter(self._waiting.values())).deadline - now))
                for key, _ in selector.select(timeout):
                    if key.data == "accept":
                        if not self._accept():
                            selector.unregister(self.socket)
                            resting_until = time.monotonic() + 0.05
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._read(key.data)
                now = time.monotonic()
                if resting_until and now >= resting_until:
                    selector.register(self.socket, selectors.EVENT_READ, "accept")
                    resting_until = 0.0
                self._expire(now)
        finally:
            for data in ("accept", "wake"):
                try:
                    selector.unregister(self.socket if data == "accept" else self._wake_read)
                except (KeyError, ValueError):
                    pass
            for waiting in list(self._waiting.values()):
                self._forget(waiting)
            self._stopped.set()

    def _accept(self) -> bool:
        """Accept every connection that is there; False when out of descriptors and none of
        ours could be closed to make room (the listening socket then rests a moment)."""
        while True:
            try:
                connection, client = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if self._waiting:
                        self._make_room("closed: out of file descriptors, a newer connection took its place")
                        continue
                    self.live.drop("refused: out of file descriptors", None)
                    return False
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # gone before it was accepted
                raise
            with self._lock:
                answering = self._answering
            if answering >= self.max_waiting:  # the answering threads are that far behind: no more now
                self.live.drop("refused: every connection busy", client)  # counted before the close
                _close(connection)
                continue
            if len(self._waiting) >= self.max_waiting:
                self._make_room("closed: too many connections waiting, a newer one took its place")
            connection.setblocking(False)
            waiting = _Waiting(connection, client)
            self._waiting[connection.fileno()] = waiting
            self._selector.register(connection, selectors.EVENT_READ, waiting)

    def _make_room(self, why: str) -> None:
        oldest = next(iter(self._waiting.values()))
        self._forget(oldest, why)

    def _read(self, waiting: _Waiting) -> None:
        try:
            chunk = waiting.connection.recv(MAX_HEAD_BYTES + 1 - len(waiting.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._forget(waiting, f"lost: {type(exc).__name__}")
            return
        if not chunk:  # the client closed before its head was whole
            self._forget(waiting)
            return
        scanned = len(waiting.data)
        waiting.data += chunk
        end = _end_of_head(waiting.data, scanned)
        if end < 0:
            if len(waiting.data) > MAX_HEAD_BYTES:
                self._forget(waiting, f"closed: request head over {MAX_HEAD_BYTES // 1024} KiB")
            return
        self._unwatch(waiting)
        self._hand_on(waiting.connection, waiting.client, bytes(waiting.data[:end]))

    def _expire(self, now: float) -> None:
        while self._waiting:
            oldest = next(iter(self._waiting.values()))
            if oldest.deadline > now:
                return
            self._forget(oldest, "timed out")

    def _unwatch(self, waiting: _Waiting) -> None:
        self._waiting.pop(waiting.connection.fileno(), None)
        try:
            self._selector.unregister(waiting.connection)
        except (KeyError, ValueError):
            pass

    def _forget(self, waiting: _Waiting, dropped: str | None = None) -> None:
        """Stop watching ``waiting`` and close it; a ``dropped`` reason is counted first, so that
        whoever sees the close sees the count (a test that waits for the close asserts it)."""
        self._unwatch(waiting)
        if dropped is not None:
            self.live.drop(dropped, waiting.client)
        _close(waiting.connection)

    def _drain_wake(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    # -- the answering threads

    def _hand_on(self, connection: socket.socket, client: Any, head: bytes) -> None:
        with self._lock:
            self._answering += 1
            idle = len(self._threads) - (self._answering - 1)
            if idle <= 0 and len(self._threads) < MAX_CONNECTIONS:
                thread = threading.Thread(
                    target=self._answer_heads, name=f"rpcctl-web-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._heads.put((connection, client, head))

    def _answer_heads(self) -> None:
        while True:
            item = self._heads.get()
            if item is None:
                return
            connection, client, head = item
            try:
                connection.setblocking(True)
                # a client that does not read its answer holds a thread this long at most
                connection.settimeout(REQUEST_HEAD_S)
                _Handler(connection, client, self, head)
            except OSError as exc:
                self.live.drop(f"lost: {type(exc).__name__}", client)
            except Exception:  # a bug of ours: its traceback, and the server goes on
                traceback.print_exc()
            finally:
                _close(connection)
                with self._lock:
                    self._answering -= 1

    # -- socketserver's names

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (from another thread) and wait for it."""
        self._stopping.set()
        try:
            self._wake.send(b"x")
        except OSError:
            pass
        self._stopped.wait(timeout=5)

    def server_close(self) -> None:
        self._stopping.set()
        for _ in self._threads:
            self._heads.put(None)
        for closing in (self.socket, self._wake, self._wake_read):
            _close(closing)
        try:
            self._selector.close()
        except (OSError, RuntimeError):
            pass


class _SendAll(io.RawIOBase):
    """The handler's ``wfile``: every write whole (``sendall``), within the socket's timeout."""

    def __init__(self, connection: socket.socket):
        self.connection = connection

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.connection.sendall(data)
        return len(data)


class _Handler(BaseHTTPRequestHandler):
    """One request, whose head the front has read whole (``head``); the answer is written to
    the connection, which is then closed."""

    server_version = "rpcctl"
    sys_version = ""
    server: _Front

    def __init__(self, connection: socket.socket, client: Any, front: _Front, head: bytes):
        self._whole_head = head
        super().__init__(connection, client, front)

    @property
    def live(self) -> LiveServer:
        return self.server.live

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self._whole_head)  # nothing more is read from the client
        self.wfile = _SendAll(self.connection)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    def finish(self) -> None:
        pass  # the answering thread closes the connection (_Front._answer_heads)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # the launcher's console is the job's; requests are not news

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # a malformed request has its answer (400, 431...); the console is not told

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        refusal = self._refusal()
        if refusal is not None:
            self._send_text(*refusal)
            return
        path = urlsplit(self.path).path
        try:
            if path == "/":
                self._send(
                    HTTPStatus.OK, "text/html; charset=utf-8", render(run_view(self.live.run_dir), api=VIEW_PATH[1:])
                )
            elif path == VIEW_PATH:
                self._send(HTTPStatus.OK, "application/json", self.live.view_document())
            elif path == stacks.PATH:  # native stacks, read when asked (web/stacks.py)
                self._send(HTTPStatus.OK, "text/plain; charset=utf-8", stacks.live_native_text(self.live.run_dir))
            else:
                self._send_text(HTTPStatus.NOT_FOUND, "not found")
        except RpcctlError as exc:  # the run went away, or its store cannot be read
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, "application/json", json.dumps({"error": str(exc)}))

    def _refusal(self) -> tuple[HTTPStatus, str] | None:
        host = self.headers.get("Host", "")
        if host not in self.live.allowed_hosts:
            return HTTPStatus.FORBIDDEN, "forbidden: unexpected Host (open the URL rpcctl printed)"
        origin = self.headers.get("Origin")
        if origin is not None and origin not in self.live.allowed_origins:
            return HTTPStatus.FORBIDDEN, "forbidden: cross-origin request"
        if not self.live.token_ok(urlsplit(self.path).query):
            return HTTPStatus.FORBIDDEN, "forbidden: missing or wrong token (open the URL rpcctl printed)"
        return None

    def _read_only(self) -> None:
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET")
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_TRACE = do_CONNECT = _read_only  # noqa: N815

    def _send_text(self, status: HTTPStatus, text: str) -> None:
        self._send(status, "text/plain; charset=utf-8", text + "\n")

    def _send(self, status: HTTPStatus, content_type: str, body: str) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Content-Security-Policy", "frame-ancestors 'none'")
        self.end_headers()
        self.wfile.write(data)


class LaunchPage:
    """``rpcctl launch --web``: the run's live page, from its start to the job's end."""

    def __init__(self, console: Any):
        require_plotly()
        self.console = console
        self.server: LiveServer | None = None

    def start(self, record: Any) -> None:
        self.server = LiveServer(Path(record.run_dir)).start()
        self.console.info(f"rpcctl: live page at {self.server.url}")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
