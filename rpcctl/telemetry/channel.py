"""The telemetry channel: how a process reaches the run's store, and who may.

Written once, used by both ends that accept connections: ``server.TelemetryServer`` (the
launcher of node 0, which owns the store) and ``forward.TelemetryForwarder`` (the launcher of
every other node, which relays to node 0). The messages are listed in ``protocol``.

Two ways in::

    rank, or a process it spawned                    launcher of node 1..N-1
      │ Unix socket, run directory, mode 0600          │ TCP to node 0
      │ + same user (SO_PEERCRED): ``accept_local``     │ + HMAC challenge with the run's secret
      ▼                                                ▼
    node's launcher (server, or forwarder ──TCP──▶ node 0's server)

- Local: the socket is the owner's alone (0600, in the run directory or a private 0700
  directory), and every accepted connection is checked again for the owner's uid: a socket
  made reachable by a looser directory, or a process that changed its uid, is still refused.
  Refusals are counted, and the first one from each uid is logged (``Refusals``).
- Across nodes: node 0 sends ``challenge`` (a fresh nonce); the peer's first line must be
  ``auth`` with ``HMAC-SHA256(secret, nonce)`` (``challenge``, ``is_answer``,
  ``connect_authenticated``). Then it speaks the same lines as a local worker.

Framing is one JSON object per line (``protocol.encode``/``decode``); ``LineBuffer`` splits a
stream into lines and refuses a line longer than ``protocol.MAX_LINE``.

Descriptors are the launcher's too: a door takes at most ``connection_cap`` connections (refused
beyond, counted), and keeps a ``Reserve`` descriptor to shed a connection when accept() fails for
want of one (EMFILE), so that a rank's processes connecting in a loop can neither spin its thread
nor take the descriptors its run record and logs need.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import socket
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpcctl.wire import protocol

# the rank package's sitecustomize, named, not imported
SITE_DIR = Path(__file__).resolve().parents[1] / "rank" / "_site"


# -- framing --------------------------------------------------------------------------------------


class LineBuffer:
    """Bytes from a stream → complete lines. What follows the last newline waits for more in a
    bytearray, which grows in place (``pending += data`` on bytes copied the whole line at every
    chunk: quadratic in the line, and twice its size at each step), and is copied out once, when
    its line ends. One chunk per read, however small the reads: no per-chunk object either."""

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = bytearray()

    @property
    def size(self) -> int:
        """Bytes waiting for the end of their line."""
        return len(self._tail)

    def feed(self, data: bytes) -> list[bytes] | None:
        """The lines ``data`` completes ([] if none yet); None when a line grew past MAX_LINE."""
        end = data.find(b"\n")
        if len(self._tail) + (len(data) if end < 0 else end) > protocol.MAX_LINE:
            return None
        if end < 0:
            self._tail += data
            return []
        self._tail += memoryview(data)[:end]
        first = bytes(self._tail)
        *lines, tail = data[end + 1 :].split(b"\n")
        self._tail = bytearray(tail)
        return None if len(tail) > protocol.MAX_LINE else [first, *lines]


# -- descriptors ---------------------------------------------------------------------------------

# accept() fails so when the process (EMFILE), the system (ENFILE) or the kernel's memory
# (ENOBUFS, ENOMEM) has no room for one more connection: the listener stays readable.
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
FD_HEADROOM = 64  # descriptors a launcher keeps for itself beyond its telemetry: run record, logs, pipes
FD_PER_RANK = 8  # and for each rank: its pipes, its log and its times file, a stack dump


def connection_cap(world_size: int) -> int:
    """How many telemetry connections a launcher holds at once: 16 per rank (a rank and the
    processes it starts), at least 1,024, but never so many that they would take the descriptors
    the launcher needs itself (``FD_HEADROOM`` and ``FD_PER_RANK``) under its RLIMIT_NOFILE;
    at least one per rank all the same."""
    wanted = max(1024, 16 * world_size)
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    room = soft - _open_descriptors() - FD_HEADROOM - FD_PER_RANK * world_size
    return max(world_size, min(wanted, room))


def _open_descriptors() -> int:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 32


class Reserve:
    """One descriptor held back for when the process runs out (``OUT_OF_DESCRIPTORS``): ``shed``
    closes it, accepts the connection that waits and closes that at once, and opens it again.
    Without it the listener stays readable, the connection waits, and a loop around it spins."""

    def __init__(self) -> None:
        self.fd = self._open()

    @staticmethod
    def _open() -> int:
        try:
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1

    def shed(self, listener: socket.socket) -> bool:
        """Accept one waiting connection and close it at once; True if one was."""
        self.close()
        try:
            conn, _ = listener.accept()
        except OSError:
            shed = False
        else:
            conn.close()
            shed = True
        self.fd = self._open()
        return shed

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


# -- the local socket ----------------------------------------------------------------------------


def listen_unix(run_dir: Path) -> tuple[socket.socket, Path, str | None]:
    """The run's telemetry socket (mode 0600), and the private directory that holds it when
    the run directory's path is too long for a Unix socket (else None)."""
    path, private_dir = run_dir / protocol.SOCKET_NAME, None
    if len(os.fsencode(path)) > protocol.MAX_SOCKET_PATH:
        # Too long for sun_path: a private directory (0700) holds it instead.
        private_dir = tempfile.mkdtemp(prefix="rpcctl-")
        path = Path(private_dir) / protocol.SOCKET_NAME
    if path.exists() or path.is_symlink():
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(128)
    return listener, path, private_dir


def close_unix(listener: socket.socket | None, path: Path | None, private_dir: str | None) -> None:
    if listener is not None:
        listener.close()
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    if private_dir is not None:
        try:
            os.rmdir(private_dir)
        except OSError:
            pass


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket; None where the system cannot
    say (not Linux: the socket's 0600 mode is then the only guard)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return None
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i")))
    except OSError:
        return -1  # unknown peer: refused
    return uid


@dataclass
class Refusals:
    """Local connections refused because another user made them: counted; the first one from
    each uid is logged on stderr (later ones only counted, so a loop cannot flood the log)."""

    where: str  # "telemetry server", "telemetry relay": who refused, for the log line
    count: int = 0
    uids: set[int] = field(default_factory=set)

    def refuse(self, uid: int) -> None:
        self.count += 1
        if uid not in self.uids:
            self.uids.add(uid)
            print(
                f"rpcctl: {self.where} refused a connection from uid {uid}: only the run's owner "
                f"(uid {os.getuid()}) may send telemetry",
                file=sys.stderr,
            )


def accept_local(listener: socket.socket, refusals: Refusals) -> socket.socket | None:
    """Accept one connection on the run's Unix socket: the connection if its peer is this
    user, else None (closed and counted). Raises what ``accept()`` raises (nothing pending,
    timeout, listener closed)."""
    conn, _ = listener.accept()
    uid = peer_uid(conn)
    if uid is not None and uid != os.getuid():
        conn.close()
        refusals.refuse(uid)
        return None
    return conn


def worker_env(socket_path: Path) -> dict[str, str]:
    """What every rank needs to reach the telemetry socket, and processes it spawns too."""
    paths = [str(SITE_DIR)]
    package_root = str(Path(__file__).resolve().parents[2])
    if not _on_default_path(package_root):
        paths.append(package_root)  # a source checkout: spawned children must import rpcctl
    existing = os.environ.get("PYTHONPATH")
    if existing:
        paths.append(existing)
    return {protocol.ENV_SOCKET: str(socket_path), "PYTHONPATH": os.pathsep.join(paths)}


def _on_default_path(directory: str) -> bool:
    import site

    default = set(site.getsitepackages())
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user:
        default.add(user)
    return os.path.realpath(directory) in {os.path.realpath(p) for p in default}


# -- across nodes: the HMAC challenge --------------------------------------------------------------


def challenge() -> tuple[str, bytes]:
    """A fresh nonce, and the ``challenge`` line that sends it."""
    nonce = secrets.token_hex(16)
    return nonce, protocol.encode({"k": "challenge", "nonce": nonce})


def _mac(secret: bytes, nonce: str) -> str:
    return hmac.new(secret, nonce.encode(), hashlib.sha256).hexdigest()


def is_answer(secret: bytes, nonce: str, message: dict[str, Any]) -> bool:
    """Whether ``message`` is the ``auth`` line that answers ``nonce`` with ``secret``."""
    return message.get("k") == "auth" and hmac.compare_digest(str(message.get("mac", "")), _mac(secret, nonce))


def connect_authenticated(address: tuple[str, int], secret: bytes, timeout: float = 10.0) -> socket.socket:
    """A TCP connection to node 0's server that has answered its challenge (blocking)."""
    sock = socket.create_connection(address, timeout=timeout)
    reader = sock.makefile("rb")
    message = protocol.decode(reader.readline(protocol.MAX_LINE))
    reader.close()
    if not message or message.get("k") != "challenge":
        sock.close()
        raise ConnectionError(f"no telemetry challenge from {address[0]}:{address[1]}")
    sock.sendall(protocol.encode({"k": "auth", "mac": _mac(secret, str(message["nonce"]))}))
    sock.settimeout(None)
    return sock
