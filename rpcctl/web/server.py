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

What a local neighbour without the token can do to it is bounded:

- at most ``MAX_CONNECTIONS`` connections are served at once, one thread each. A connection
  beyond them waits up to ``SLOT_WAIT_S`` for a thread, and takes the place of a slow client
  (one still without its whole request head after ``SLOW_HEAD_S``, the one that has waited
  longest), which is closed; if no thread frees in time, it is closed unanswered. A browser sends
  its request head at once, so slow clients never keep it out;
- a request line and its headers must arrive within ``REQUEST_HEAD_S`` (a deadline over all
  the reads, not a timeout per read), or the connection is closed;
- a connection reset, refused or timed out is counted (``LiveServer.dropped``), never
  printed: the console is the job's. ``RPCCTL_DEBUG=1`` prints one line for each.
"""

from __future__ import annotations

import collections
import hmac
import io
import json
import os
import secrets
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rpcctl.console import get_console
from rpcctl.errors import RpcctlError
from rpcctl.web.page import render, require_plotly, run_view, view_json

VIEW_PATH = "/api/view"
# The page polls once a second; several tabs (or a fast poller) share one read of the store.
VIEW_MAX_AGE_S = 0.5
# Connections served at once (a thread each): a few tabs polling need a handful.
MAX_CONNECTIONS = 16
# The request line and headers of a request must have arrived this long after it began.
REQUEST_HEAD_S = 10.0
# A connection beyond MAX_CONNECTIONS waits this long for a thread before it is closed...
SLOT_WAIT_S = 5.0
# ...and may take the thread of one still without its request head after this long.
SLOW_HEAD_S = 1.0


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
        self.httpd = _BoundedServer(("127.0.0.1", port), self)
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
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

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


class _BoundedServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with at most ``MAX_CONNECTIONS`` threads, quiet about clients
    that go away (see the module's docstring)."""

    daemon_threads = True
    block_on_close = False  # closing does not wait for a slow client's thread
    request_queue_size = 128  # connections wait in the backlog while the threads are taken, not in SYN retries

    def __init__(self, address: tuple[str, int], live: LiveServer):
        self.live = live
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._lock = threading.Lock()
        self._waiting: dict[socket.socket, float] = {}  # connections reading a request head: since when
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        given_up = time.monotonic() + SLOT_WAIT_S
        while not self._slots.acquire(timeout=0.05):
            self._close_a_slow_one()
            if time.monotonic() >= given_up:
                self.live.drop("refused: every connection busy", client_address)
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread: the slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.reading_head(request, False)
            self._slots.release()

    def reading_head(self, connection: socket.socket, reading: bool) -> None:
        """``connection``'s thread waits for its request head (since its first read: a thread not
        yet run on a busy machine is not a slow client), or has it."""
        with self._lock:
            if reading:
                self._waiting[connection] = time.monotonic()
            else:
                self._waiting.pop(connection, None)

    def _close_a_slow_one(self) -> None:
        """Close the connection that has waited longest for its request head, if that is over
        ``SLOW_HEAD_S``: its thread's read ends, and the thread frees its slot."""
        with self._lock:
            slow = time.monotonic() - SLOW_HEAD_S
            if not self._waiting:
                return
            connection = min(self._waiting, key=self._waiting.__getitem__)
            if self._waiting[connection] > slow:
                return
            del self._waiting[connection]
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed by its thread meanwhile
        self.live.drop("closed: too slow, a newer connection took its place", connection_peer(connection))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that reset or closed mid-request: counted, no traceback on the job's console."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            self.live.drop(f"lost: {type(exc).__name__}", client_address)
        else:
            super().handle_error(request, client_address)  # a bug of ours: keep its traceback


def connection_peer(connection: socket.socket) -> Any:
    try:
        return connection.getpeername()
    except OSError:
        return None


class _HeadDeadline(io.RawIOBase):
    """The connection's reads, each given only what is left of the request head's deadline."""

    def __init__(self, connection: socket.socket, server: _BoundedServer):
        self.connection, self.server = connection, server
        self.deadline = time.monotonic() + REQUEST_HEAD_S
        self.reading = False

    def start(self) -> None:
        """A request begins: its head is due within ``REQUEST_HEAD_S``."""
        self.deadline = time.monotonic() + REQUEST_HEAD_S
        self.reading = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self.reading:
            self.reading = True
            self.server.reading_head(self.connection, True)
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"request head not received within {REQUEST_HEAD_S:g}s")
        self.connection.settimeout(left)
        return self.connection.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server_version = "rpcctl"
    sys_version = ""
    timeout = REQUEST_HEAD_S  # for writes: a client that does not read its answer does not hold a thread
    server: _BoundedServer

    @property
    def live(self) -> LiveServer:
        return self.server.live

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self._head = _HeadDeadline(self.connection, self.server)
        self.rfile = io.BufferedReader(self._head)

    def handle_one_request(self) -> None:
        self._head.start()
        super().handle_one_request()

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers
        self.server.reading_head(self.connection, False)
        self.connection.settimeout(self.timeout)
        return parsed

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # the launcher's console is the job's; requests are not news

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        if format.startswith("Request timed out"):
            self.live.drop("timed out", self.client_address)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        refusal = self._refusal()
        if refusal is not None:
            self._send_text(*refusal)
            return
        path = urlsplit(self.path).path
        try:
            if path == "/":
                self._send(HTTPStatus.OK, "text/html; charset=utf-8", render(run_view(self.live.run_dir), api=VIEW_PATH[1:]))
            elif path == VIEW_PATH:
                self._send(HTTPStatus.OK, "application/json", self.live.view_document())
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
