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
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rpcctl.errors import RpcctlError
from rpcctl.web.page import render, require_plotly, run_view, view_json

VIEW_PATH = "/api/view"
# The page polls once a second; several tabs (or a fast poller) share one read of the store.
VIEW_MAX_AGE_S = 0.5


class LiveServer:
    """Serves ``run_dir``'s live page until ``stop()``. ``url`` carries the token."""

    def __init__(self, run_dir: Path, port: int = 0):
        require_plotly()
        self.run_dir = Path(run_dir)
        self.token = secrets.token_urlsafe(32)
        self._view_lock = threading.Lock()
        self._view: tuple[float, str] | None = None
        self._thread: threading.Thread | None = None
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.live = self  # type: ignore[attr-defined]
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

    def view_document(self) -> str:
        with self._view_lock:
            now = time.monotonic()
            if self._view is None or now - self._view[0] > VIEW_MAX_AGE_S:
                self._view = (now, view_json(run_view(self.run_dir)))
            return self._view[1]


class _Handler(BaseHTTPRequestHandler):
    server_version = "rpcctl"
    sys_version = ""
    timeout = 30  # a client that opens a connection and sends nothing does not hold a thread for ever

    @property
    def live(self) -> LiveServer:
        return self.server.live  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # the launcher's console is the job's; requests are not news

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
