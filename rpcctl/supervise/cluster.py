"""Node-level rendezvous and job-wide decisions for multi-node runs, over torch's TCPStore.

One launcher runs per node. Node 0's launcher hosts a TCPStore on ``master_addr:master_port``
(bound to that address only); every launcher joins it::

    node r:  set node/r = {host, pid, ...}         node 0: waits for node/0..N-1 (rdzv_timeout),
                                                   then sets run = {run_id, worker port}
    node r:  get run  (blocks until node 0 publishes it)
    ... ranks run on every node (round 0) ...
    any node: a rank fails      → set round<n>/failed = {node, host, rank, message, final}
    any node: Ctrl-C / SIGTERM  → set job/cancelled
    every node polls round<n>/failed and job/cancelled; on news it tears its own ranks down
    restarts left (max_restarts), failure not final:
      node r:  set round<n+1>/node/r                node 0: waits for round<n+1>/node/* (rdzv_timeout),
                                                   then sets round<n+1>/go = {worker port} or {abort}
      node r:  waits for round<n+1>/go; the ranks restart (TORCHELASTIC_RESTART_COUNT = n+1)
    node r:  set done/r = status; node 0 keeps the store up until every node is done

A restart is torchrun's: a failure anywhere tears down every node and every launcher meets
again under the same secret. A node that does not come back within ``rdzv_timeout`` (or that
ended instead) makes node 0 publish an abort naming it, and the job ends everywhere.

Every value is signed with HMAC-SHA256 under the per-run secret (``RPCCTL_SECRET``, the same on
every node), so nothing on the network can forge a failure or a run id; values are JSON, never
pickle. torch is imported here only for multi-node runs.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from rpcctl.base.errors import RpcctlError, UsageError
from rpcctl.base.states import RunStatus

SECRET_ENV = "RPCCTL_SECRET"


class RendezvousError(RpcctlError):
    def __init__(self, message: str, node: int | None = None, host: str | None = None):
        super().__init__(message)
        self.node, self.host = node, host


@dataclass
class ClusterNews:
    kind: RunStatus  # failed | cancelled
    node: int
    info: dict[str, Any]


def secret_from_env() -> bytes:
    secret = os.environ.get(SECRET_ENV, "")
    if len(secret) < 16:
        raise UsageError(
            f"multi-node runs need a shared per-run secret of at least 16 characters in ${SECRET_ENV}, the same on "
            f"every node (e.g. export {SECRET_ENV}=$(python3 -c 'import secrets; print(secrets.token_hex(16))')); "
            "`rpcctl sbatch` sets one for you"
        )
    return secret.encode()


class _Waiting:
    """Says what the launcher waits for: once at first, then every ``every`` seconds."""

    def __init__(self, say, every: float = 15.0):
        self.say, self.every = say, every
        self.what: str | None = None
        self.since = self.last = time.monotonic()

    def __call__(self, what: str, why: str, timeout: float) -> None:
        now = time.monotonic()
        if what != self.what:
            self.what, self.since, self.last = what, now, now
            self.say(f"rpcctl: waiting up to rdzv_timeout ({timeout:g}s) for {what}: {why}")
        elif now - self.last >= self.every:
            self.last = now
            self.say(f"rpcctl: still waiting for {what} after {now - self.since:.0f}s: {why}")


def wait_to_resolve(host: str, *, timeout: float, say=lambda message: None, poll: float = 0.2) -> str:
    """``host``'s IPv4 address, once it resolves (a pod starts before the Service publishes its
    own name): whether this node is the one to host a rendezvous can only be told after."""
    deadline = time.monotonic() + timeout
    waiting = _Waiting(say)
    what = f"the rendezvous endpoint '{host}' to resolve (a pod's DNS name appears once its Service publishes it)"
    while True:
        try:
            return socket.gethostbyname(host)
        except OSError as exc:
            why = f"{exc.strerror or exc}"
        if time.monotonic() + poll > deadline:
            raise RendezvousError(f"gave up waiting for {what} after rdzv_timeout ({timeout:g}s): {why}")
        waiting(what, why, timeout)
        time.sleep(poll)
        poll = min(poll * 1.5, 2.0)


def wait_for_master(
    host: str, port: int, *, node_rank: int, timeout: float, say=lambda message: None, poll: float = 0.2
) -> str:
    """The master's IPv4 address, once it can be used: pods start before their DNS names resolve
    and before node 0 listens. Until ``timeout``, retry resolving ``host``; then node 0 checks that
    the address is its own (a stale record names a pod that is gone), and every other node that
    node 0's rendezvous accepts connections. Says what it waits for; ``RendezvousError`` at the end."""
    deadline = time.monotonic() + timeout
    waiting = _Waiting(say)
    while True:
        try:
            ip = socket.gethostbyname(host)
        except OSError as exc:
            why, what = (
                f"{exc.strerror or exc}",
                f"master_addr '{host}' to resolve (a pod's DNS name appears once its Service publishes it)",
            )
        else:
            why, what = _usable(ip, port, node_rank), f"node 0's rendezvous at {host} ({ip}):{port}"
            if node_rank == 0:
                what = f"master_addr '{host}' ({ip}) to be an address of this node"
            if why is None:
                return ip
        if time.monotonic() + poll > deadline:
            raise RendezvousError(
                f"node {node_rank} gave up waiting for {what} after rdzv_timeout ({timeout:g}s): {why}", node_rank
            )
        waiting(what, why, timeout)
        time.sleep(poll)
        poll = min(poll * 1.5, 2.0)


def _usable(ip: str, port: int, node_rank: int) -> str | None:
    """None if node 0 can bind ``ip`` (node 0) or node 0 accepts on ``ip:port``; else why not."""
    if node_rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((ip, 0))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    return f"{exc.strerror}"
            return None  # any other problem is reported by the real bind, with its port
    try:
        with socket.create_connection((ip, port), timeout=2):
            return None
    except OSError as exc:
        return f"{exc.strerror or exc}"


class SignedStore:
    """JSON values in a TCPStore, each signed with HMAC-SHA256 under the run's secret (key and
    value together): a value nothing but a node of this run could have written, or an error."""

    def __init__(self, raw: Any, secret: bytes, where: str):
        self.raw, self.secret, self.where = raw, secret, where

    def put(self, key: str, value: dict[str, Any]) -> None:
        body = json.dumps(value, sort_keys=True).encode()
        mac = hmac.new(self.secret, key.encode() + b"\0" + body, hashlib.sha256).hexdigest().encode()
        self.raw.set(key, mac + b"." + body)

    def get(self, key: str) -> dict[str, Any]:
        raw = bytes(self.raw.get(key))
        mac, _, body = raw.partition(b".")
        expected = hmac.new(self.secret, key.encode() + b"\0" + body, hashlib.sha256).hexdigest().encode()
        if not hmac.compare_digest(mac, expected):
            raise RendezvousError(
                f"rendezvous value '{key}' at {self.where} is not signed with this run's secret: check that "
                f"${SECRET_ENV} is the same on every node"
            )
        return json.loads(body)

    def has(self, key: str) -> bool:
        return self.raw.check([key])

    def wait(self, key: str, timeout: float) -> dict[str, Any]:
        """The value once it is there (``RendezvousError`` after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not self.has(key):
            if time.monotonic() > deadline:
                raise RendezvousError(f"'{key}' did not appear at the rendezvous {self.where} within {timeout:g} s")
            time.sleep(0.05)
        return self.get(key)


def import_tcpstore():
    # c10d logs a harmless "hostname of the client socket cannot be retrieved" warning in
    # network namespaces; quiet it in the launcher only (the ranks keep their own settings).
    saved = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        from torch.distributed import TCPStore
    finally:
        if saved is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = saved
    return TCPStore


class NodeRendezvous:
    def __init__(
        self, *, node_rank: int, nnodes: int, master_addr: str, master_port: int, timeout: float, secret: bytes
    ):
        self.node_rank, self.nnodes = node_rank, nnodes
        self.master_addr, self.master_port = master_addr, master_port
        self.timeout, self.secret = timeout, secret
        self.store = None
        self.signed: SignedStore | None = None  # the store's values, signed (set by join())
        self.shared: dict[str, Any] = {}
        self.master_ip = ""  # set by reach()
        self._seen_news = False
        self.round = 0  # 0 for the first attempt, n after the n-th restart
        self.gone: set[int] = set()  # nodes known to have ended or vanished: finish() waits for no one there
        # Liveness: every launcher bumps its beat/<node> counter as it polls; node 0 notes when
        # each counter last moved (on its own clock: no cross-node clock comparisons).
        self._beats: dict[int, tuple[int, float]] = {}

    def reach(self, say=lambda message: None) -> str:
        """Resolve the master and, on nodes other than 0, wait until node 0 listens (up to
        ``rdzv_timeout``, saying what is awaited); the address the ranks will use too."""
        import_tcpstore()  # torch takes seconds to import: before the wait, not after it
        self.master_ip = wait_for_master(
            self.master_addr, self.master_port, node_rank=self.node_rank, timeout=self.timeout, say=say
        )
        return self.master_ip

    # -- signed values --------------------------------------------------------------------------

    def _put(self, key: str, value: dict[str, Any]) -> None:
        self.signed.put(key, value)

    def _get(self, key: str) -> dict[str, Any]:
        return self.signed.get(key)

    def _has(self, key: str) -> bool:
        return self.signed.has(key)

    # -- the protocol ---------------------------------------------------------------------------

    def join(self, *, host: str, run_id: str, pick_port, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Meet every node; return the run's shared facts {run_id, worker_port, nodes, **extra}
        (node 0's ``extra`` wins: it publishes the run document)."""
        TCPStore = import_tcpstore()
        master_ip = self.master_ip
        try:
            if self.node_rank == 0:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((master_ip, self.master_port))
                listener.listen(128)
                self.store = TCPStore(
                    master_ip,
                    self.master_port,
                    None,
                    True,
                    timedelta(seconds=self.timeout),
                    wait_for_workers=False,
                    master_listen_fd=listener.detach(),
                )
            else:
                self.store = TCPStore(master_ip, self.master_port, None, False, timedelta(seconds=self.timeout))
        except OSError as exc:
            raise RendezvousError(
                f"cannot {'host' if self.node_rank == 0 else 'reach'} the rendezvous"
                f" at {master_ip}:{self.master_port}: {exc}"
            ) from None
        except RuntimeError as exc:
            raise RendezvousError(
                f"node {self.node_rank} could not reach the rendezvous at {master_ip}:{self.master_port} within "
                f"{self.timeout:g}s (is node 0's launcher running?): {str(exc).splitlines()[0]}"
            ) from None
        self.signed = SignedStore(self.store, self.secret, f"{self.master_addr}:{self.master_port}")
        self._put(f"node/{self.node_rank}", {"host": host, "pid": os.getpid(), "at": time.time()})
        if self.node_rank == 0:
            deadline = time.monotonic() + self.timeout
            missing = list(range(self.nnodes))
            while missing and time.monotonic() < deadline:
                missing = [r for r in missing if not self._has(f"node/{r}")]
                time.sleep(0.05)
            if missing:
                raise RendezvousError(
                    f"node(s) {', '.join(map(str, missing))} of {self.nnodes} never arrived at the rendezvous "
                    f"{master_ip}:{self.master_port} within {self.timeout:g}s"
                )
            nodes = {r: self._get(f"node/{r}")["host"] for r in range(self.nnodes)}
            self._put("run", {**(extra or {}), "run_id": run_id, "worker_port": pick_port(master_ip), "nodes": nodes})
        try:
            self.shared = self._get("run")
            return self.shared
        except RuntimeError as exc:
            raise RendezvousError(
                f"node 0 never published the run within {self.timeout:g}s: {str(exc).splitlines()[0]}"
            ) from None

    def node_name(self, node: int) -> str:
        host = self.shared.get("nodes", {}).get(str(node))
        return f"node {node} ({host})" if host else f"node {node}"

    def report_failure(self, info: dict[str, Any], *, final: bool = False) -> None:
        """``final``: this node will not restart (its deadline passed, its launcher crashed)."""
        key = f"round{self.round}/failed"
        if not self._has(key):
            self._put(key, {"node": self.node_rank, "final": final, **info})

    def report_cancelled(self, reason: str) -> None:
        if not self._has("job/cancelled"):
            self._put("job/cancelled", {"node": self.node_rank, "reason": reason})

    def poll(self, stale_after: float = 20.0) -> ClusterNews | None:
        """News from another node (a failure, a cancellation, a silent node), at most once."""
        if self._seen_news:
            return None
        try:
            return self._poll(stale_after)
        except RuntimeError as exc:  # the store (node 0's launcher) is gone
            self._seen_news = True
            message = (
                f"lost contact with the rendezvous on node 0 ({self.master_addr}:{self.master_port}):"
                f" {str(exc).splitlines()[0]}"
            )
            return ClusterNews(RunStatus.FAILED, 0, {"node": 0, "rank": -1, "message": message, "final": True})

    def _poll(self, stale_after: float) -> ClusterNews | None:
        self.store.add(f"beat/{self.node_rank}", 1)
        if self.node_rank == 0:
            now = time.monotonic()
            for node in range(1, self.nnodes):
                if self._has(f"done/{node}"):
                    continue
                beat = self.store.add(f"beat/{node}", 0)
                last, since = self._beats.get(node, (-1, now))
                if beat != last:
                    self._beats[node] = (beat, now)
                elif now - since > stale_after:
                    self._seen_news = True
                    self.gone.add(node)
                    message = f"the launcher of {self.node_name(node)} stopped answering for {stale_after:g}s"
                    return ClusterNews(RunStatus.FAILED, node, {"node": node, "rank": -1, "message": message})
        for kind, key in ((RunStatus.FAILED, f"round{self.round}/failed"), (RunStatus.CANCELLED, "job/cancelled")):
            if self._has(key):
                info = self._get(key)
                if info["node"] != self.node_rank:
                    self._seen_news = True
                    return ClusterNews(kind, info["node"], info)
        return None

    def rejoin(self, pick_port, stop=lambda: False) -> int | None:
        """Meet every node again after a failure (each arrives once its own ranks are torn down)
        and return the ranks' new rendezvous port; None if the job was cancelled meanwhile.
        Raises ``RendezvousError`` naming a node that did not come back within ``rdzv_timeout``."""
        self.round += 1
        self._seen_news, self._beats = False, {}
        go_key = f"round{self.round}/go"
        try:
            self._put(f"round{self.round}/node/{self.node_rank}", {"pid": os.getpid(), "at": time.time()})
            if self.node_rank == 0:
                outcome = self._wait_for_nodes(pick_port, stop)
                if outcome is None:
                    return None
                self._put(go_key, outcome)
            deadline = time.monotonic() + self.timeout + 30  # node 0 decides within rdzv_timeout
            while not self._has(go_key):
                if stop() or self._has("job/cancelled"):
                    return None
                if time.monotonic() > deadline:
                    raise RendezvousError(
                        f"node 0 did not restart the job within {self.timeout:g}s",
                        0,
                        self.shared.get("nodes", {}).get("0"),
                    )
                time.sleep(0.05)
            go = self._get(go_key)
        except RuntimeError as exc:  # the store (node 0's launcher) is gone
            raise RendezvousError(
                f"lost contact with the rendezvous on node 0 ({self.master_addr}:{self.master_port}) while restarting: "
                f"{str(exc).splitlines()[0]}",
                0,
                self.shared.get("nodes", {}).get("0"),
            ) from None
        if "abort" in go:
            raise RendezvousError(go["abort"], go.get("node"), go.get("host"))
        return go["worker_port"]

    def _wait_for_nodes(self, pick_port, stop) -> dict[str, Any] | None:
        """Node 0: the next round's go (a port, or an abort that names the node missing)."""
        deadline = time.monotonic() + self.timeout
        missing = [r for r in range(1, self.nnodes)]
        while True:
            if stop() or self._has("job/cancelled"):
                return None
            ended = [r for r in missing if self._has(f"done/{r}")]
            if ended:
                node = ended[0]
                status = self._get(f"done/{node}")["status"]
                reason = f"{self.node_name(node)} ended ({status}) instead of restarting with the others"
                break
            missing = [r for r in missing if not self._has(f"round{self.round}/node/{r}")]
            if not missing:
                return {"worker_port": pick_port(self.master_ip), "round": self.round}
            if time.monotonic() > deadline:
                node = missing[0]
                names = ", ".join(self.node_name(r) for r in missing)
                reason = f"{names} did not come back for restart {self.round} within rdzv_timeout ({self.timeout:g}s)"
                break
            time.sleep(0.05)
        self.gone.update(missing)
        return {"abort": reason, "node": node, "host": self.shared.get("nodes", {}).get(str(node))}

    def finish(self, status: RunStatus, wait: float = 60) -> None:
        """Say this node is done; node 0 keeps the store up until all nodes said so."""
        try:
            self._put(f"done/{self.node_rank}", {"status": status})
            if self.node_rank == 0:
                # Nodes waiting to restart with us learn at once that there is no next round.
                next_go = f"round{self.round + 1}/go"
                if not self._has(next_go):
                    self._put(
                        next_go,
                        {
                            "abort": f"node 0 ended the job ({status})",
                            "node": 0,
                            "host": self.shared.get("nodes", {}).get("0"),
                        },
                    )
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline:
                    if all(self._has(f"done/{r}") for r in range(self.nnodes) if r not in self.gone):
                        break
                    time.sleep(0.1)
        except RuntimeError:
            pass  # the store is gone: node 0 ended first, nothing left to tell
