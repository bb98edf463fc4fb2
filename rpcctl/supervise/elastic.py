"""Elastic membership: a job of MIN to MAX nodes, on torch.distributed.elastic's own rendezvous.

torchrun's ``--nnodes MIN:MAX --rdzv-backend c10d --rdzv-endpoint HOST:PORT``: the launcher of
the node whose address is the endpoint hosts a TCPStore there; every launcher (that one too)
joins torch's ``DynamicRendezvousHandler`` over it (its c10d backend), as torchrun's agent does.
What rpcctl adds:

- **Nothing on the network can forge a membership.** The handler keeps its state as a pickle
  in the store, and unpickles what it reads. ``SignedBackend`` seals every state it writes with
  HMAC-SHA256 under the run's secret (``RPCCTL_SECRET``, as the static rendezvous) and refuses,
  before anything is unpickled, a state that is not sealed so; rpcctl's own values beside it are
  signed JSON (``SignedStore``).
- **Rounds.** Each completed rendezvous is a round: the handler gives this node's group rank and
  the number of nodes; every node then writes what it is (host, address, ranks it runs) under the
  round, and group rank 0 publishes where the ranks meet (``MASTER_ADDR``, a free port). A node's
  ranks are ``RANK = (ranks of the nodes before it) + LOCAL_RANK``.
- **When a round ends**, every node's ranks stop and the nodes meet again (``next_round``):
  a node that wants to join (the handler's wait list: ``waiting``), a node of the round that was
  cancelled (``left``: Ctrl-C or SIGTERM there, a spot node's preemption; the host's cancel
  ends every node instead), a node of the round whose launcher stopped beating (``lost``), a rank
  that failed anywhere (``report_failure`` / ``poll``, as the static rendezvous tells failures).
  The next round starts with whoever is there, once at least MIN are (after ``last_call`` for
  more, torchrun's wait); below MIN within the join timeout the job ends with one reason. A round
  that ended because membership changed is not a restart (``max_restarts`` counts failures with
  the same members).
- The store's host must stay: it is the rendezvous (torchrun's c10d backend has the same limit).
  The run's id and the telemetry port are the host's (``run``), so its run directory and store
  hold the whole job, every round.

torch is imported here only for elastic runs.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from rpcctl.base.errors import RpcctlError
from rpcctl.base.states import RunStatus
from rpcctl.supervise.cluster import (
    ClusterNews,
    RendezvousError,
    SignedStore,
    import_tcpstore,
    wait_for_master,
    wait_to_resolve,
)

MAC_BYTES = 32  # HMAC-SHA256, raw, in front of every state the handler writes


class ForgedStateError(RpcctlError):
    """A rendezvous state in the store that is not sealed with this run's secret."""


def signed_backend(inner: Any, secret: bytes, where: str) -> Any:
    """torch's ``RendezvousBackend`` around ``inner`` (its c10d backend) that seals what it writes
    and refuses what is not sealed (``ForgedStateError``, before the handler unpickles it)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend

    class SignedBackend(RendezvousBackend):
        @property
        def name(self) -> str:
            return inner.name

        def _seal(self, state: bytes) -> bytes:
            return hmac.new(secret, state, hashlib.sha256).digest() + state

        def _open(self, sealed: bytes) -> bytes:
            mac, state = sealed[:MAC_BYTES], sealed[MAC_BYTES:]
            if len(sealed) < MAC_BYTES or not hmac.compare_digest(
                mac, hmac.new(secret, state, hashlib.sha256).digest()
            ):
                raise ForgedStateError(
                    f"the elastic rendezvous state at {where} is not sealed with this run's secret: refused, "
                    "never read (check that $RPCCTL_SECRET is the same on every node)"
                )
            return state

        def get_state(self):
            got = inner.get_state()
            return None if got is None else (self._open(got[0]), got[1])

        def set_state(self, state: bytes, token: Any = None):
            got = inner.set_state(self._seal(state), token)
            return None if got is None else (self._open(got[0]), got[1], got[2])

    return SignedBackend()


@dataclass(frozen=True)
class ElasticSettings:
    """What an elastic job's launchers agree on (all but ``nproc`` the same on every node)."""

    endpoint: str  # host of the rendezvous store (torchrun's --rdzv-endpoint host)
    port: int
    rdzv_id: str  # torchrun's --rdzv-id: which job this rendezvous is
    min_nodes: int
    max_nodes: int
    nproc: int  # ranks on this node
    join_timeout: float = 600.0  # torchrun's rdzv_conf join_timeout
    last_call: float = 30.0  # rdzv_conf last_call_timeout: once MIN are there, the wait for more
    keep_alive: float = 5.0  # rdzv_conf keep_alive_interval (torch's heartbeat)
    keep_alive_attempts: int = 3  # rdzv_conf keep_alive_max_attempt
    lost_after: float = 15.0  # a member whose launcher beat for none of this long is lost


@dataclass
class Member:
    group_rank: int
    host: str
    address: str
    node_id: str  # this launcher, for the whole job (a uuid)
    nproc: int
    pid: int

    def name(self) -> str:
        return f"{self.host} (pid {self.pid})"


@dataclass
class Round:
    """One completed rendezvous: who is in it, and where its ranks meet."""

    number: int  # torch's round of the rendezvous
    group_rank: int  # this node's
    members: list[Member]  # by group rank
    master_addr: str
    master_port: int
    at: float = field(default_factory=time.time)

    @property
    def nnodes(self) -> int:
        return len(self.members)

    @property
    def world_size(self) -> int:
        return sum(m.nproc for m in self.members)

    @property
    def first_rank(self) -> int:
        """This node's first global rank: the ranks of the nodes before it."""
        return sum(m.nproc for m in self.members[: self.group_rank])

    def describe(self) -> list[dict[str, Any]]:
        return [{"group_rank": m.group_rank, "host": m.host, "pid": m.pid, "ranks": m.nproc} for m in self.members]


class ElasticRendezvous:
    """One node's side of an elastic job's membership (see the module's docstring)."""

    def __init__(self, settings: ElasticSettings, secret: bytes, host: str | None = None):
        self.settings = settings
        self.secret = secret
        self.host = host or socket.gethostname()
        self.node_id = uuid.uuid4().hex
        self.ip = ""  # the endpoint's address, once reached
        self.is_host = False
        self.store: SignedStore | None = None
        self.handler: Any = None
        self.backend: Any = None  # the signed backend the handler reads through
        self.round: Round | None = None
        self.shared: dict[str, Any] = {}  # the host's run document: run_id, telemetry_port, ...
        self.node_index = -1  # this launcher's place in the order nodes first came: its run directory's name
        self._beats: dict[str, tuple[int, float]] = {}
        self._seen_news = False
        self._listener: socket.socket | None = None  # the host's, bound by reach()

    @property
    def where(self) -> str:
        return f"{self.settings.endpoint}:{self.settings.port}"

    # What the launcher's telemetry wiring asks of a node rendezvous: the host holds the run's
    # store (node 0's role), the others forward to it on the address they reached it on.
    @property
    def node_rank(self) -> int:
        return 0 if self.is_host else max(1, self.node_index)

    @property
    def master_ip(self) -> str:
        return self.ip

    # -- meeting --------------------------------------------------------------------------------
    def reach(self, say=lambda message: None) -> str:
        """Decide whether this node hosts the store, and reach it. torchrun's rule, made exact: a
        launcher on a machine that owns the endpoint's address tries to bind its port; the first
        to bind hosts (it keeps the socket), any other (the port is taken: another launcher on
        the same machine, or on loopback) joins as a client, as every launcher elsewhere does."""
        import_tcpstore()
        s = self.settings
        started = time.monotonic()
        # A pod whose own name is the endpoint starts before its Service publishes it: told
        # "not local" then, it would wait as a client for itself until join_timeout.
        wait_to_resolve(s.endpoint, timeout=s.join_timeout, say=say)
        if _is_local_address(s.endpoint):
            ip = socket.gethostbyname(s.endpoint)
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # The last job's connections on this port may linger in TIME_WAIT: without this, the
            # bind fails, the node takes it for another launcher's and waits as a client for
            # itself (CI: an elastic sbatch right after another on the same port). A listener
            # that is there still refuses the bind: the first to bind still hosts.
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((ip, s.port))
                listener.listen(128)
            except OSError as exc:
                listener.close()
                if exc.errno != errno.EADDRINUSE:
                    raise RendezvousError(
                        f"cannot host the elastic rendezvous at {self.where}: {exc.strerror or exc}"
                    ) from None
            else:
                self._listener, self.is_host, self.ip = listener, True, ip
                return ip
        left = max(1.0, s.join_timeout - (time.monotonic() - started))
        self.ip = wait_for_master(s.endpoint, s.port, node_rank=1, timeout=left, say=say)
        return self.ip

    def open(self, *, run_id: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Open the store (the host serves it) and the handler; the run document: the host's
        ``run_id`` and ``extra`` (what every node needs of it: the telemetry port)."""
        TCPStore = import_tcpstore()
        # the ranks meet where rpcctl says, not on a store of torch's
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout

        s = self.settings
        try:
            if self.is_host:
                listener, self._listener = self._listener, None
                raw = TCPStore(
                    self.ip,
                    s.port,
                    None,
                    True,
                    timedelta(seconds=s.join_timeout),
                    wait_for_workers=False,
                    master_listen_fd=listener.detach(),
                )
            else:
                raw = TCPStore(self.ip, s.port, None, False, timedelta(seconds=s.join_timeout))
        except (OSError, RuntimeError) as exc:
            raise RendezvousError(
                f"cannot {'host' if self.is_host else 'reach'} the elastic rendezvous at {self.where}: "
                f"{str(exc).splitlines()[0]}"
            ) from None
        self.store = SignedStore(raw, self.secret, self.where)
        if self.is_host:  # first in the order of nodes, then the run document the others wait for
            self.node_index = int(raw.add("elastic/nodes", 1)) - 1
            self.store.put("elastic/run", {**(extra or {}), "run_id": run_id, "host": self.host})
        self.shared = self.store.wait("elastic/run", s.join_timeout)
        if not self.is_host:
            self.node_index = int(raw.add("elastic/nodes", 1)) - 1
        backend = signed_backend(C10dRendezvousBackend(raw, s.rdzv_id), self.secret, self.where)
        timeout = RendezvousTimeout(
            join=timedelta(seconds=s.join_timeout),
            last_call=timedelta(seconds=s.last_call),
            close=timedelta(seconds=min(30.0, s.join_timeout)),
        )
        self.backend = backend
        self.handler = DynamicRendezvousHandler.from_backend(
            s.rdzv_id,
            raw,
            backend,
            s.min_nodes,
            s.max_nodes,
            local_addr=self.ip if self.is_host else None,
            timeout=timeout,
            keep_alive_interval=max(1, round(s.keep_alive)),
            keep_alive_max_attempt=s.keep_alive_attempts,
        )
        return self.shared

    def next_round(self, pick_port) -> Round:
        """Meet the others (torch's rendezvous), then agree on the round's members and on where
        its ranks meet. ``RendezvousError`` with one reason when it cannot (below MIN in time)."""
        from torch.distributed.elastic.rendezvous.api import RendezvousError as TorchRendezvousError

        s = self.settings
        try:
            info = self.handler.next_rendezvous()
        except ForgedStateError as exc:
            raise RendezvousError(str(exc)) from None
        except TorchRendezvousError as exc:
            if type(exc).__name__ == "RendezvousClosedError":
                raise RendezvousError(
                    f"the elastic rendezvous at {self.where} was closed: its host ended the job"
                ) from None
            raise RendezvousError(
                f"the elastic rendezvous at {self.where} did not gather {s.min_nodes} node(s) "
                f"(--nnodes {s.min_nodes}:{s.max_nodes}) within {s.join_timeout:g} s: {_first_line(exc)}"
            ) from None
        number = int(getattr(getattr(getattr(self.handler, "_state_holder", None), "state", None), "round", 0))
        group_rank, nnodes = int(info.rank), int(info.world_size)
        me = Member(group_rank, self.host, _own_address(self.ip), self.node_id, s.nproc, os.getpid())
        self.store.put(f"elastic/r{number}/member/{group_rank}", me.__dict__)
        members = [Member(**self.store.wait(f"elastic/r{number}/member/{r}", s.join_timeout)) for r in range(nnodes)]
        if group_rank == 0:
            self.store.put(f"elastic/r{number}/go", {"master_addr": me.address, "master_port": pick_port(me.address)})
        go = self.store.wait(f"elastic/r{number}/go", s.join_timeout)
        self.round = Round(number, group_rank, members, go["master_addr"], int(go["master_port"]))
        self._beats, self._seen_news = {}, False
        return self.round

    # -- while a round runs ------------------------------------------------------------------------
    def waiting(self) -> int:
        """Nodes waiting to join (a new node, or one that left the round to restart)."""
        try:
            # The state's seal first, read straight from the store: torch's handler may answer from
            # its cache, or wait on its keep-alive thread's lock (a forged state went unseen here for
            # 40 s, 1 run in 12 under load, the poll loop still turning).
            self.backend.get_state()
            return int(self.handler.num_nodes_waiting())
        except ForgedStateError as exc:  # someone wrote the state without the secret: the job cannot trust it
            raise RendezvousError(str(exc)) from None
        except Exception:  # noqa: BLE001 - a store that cannot answer is told by poll()
            return 0

    def lost(self) -> Member | None:
        """A member of the round whose launcher has not beaten for ``lost_after`` (on this node's
        clock: counters, never another node's time)."""
        assert self.round is not None and self.store is not None
        self.store.raw.add(f"elastic/beat/{self.node_id}", 1)
        now = time.monotonic()
        for member in self.round.members:
            if member.node_id == self.node_id or self.store.has(f"elastic/done/{member.node_id}"):
                continue
            beat = int(self.store.raw.add(f"elastic/beat/{member.node_id}", 0))
            last, since = self._beats.get(member.node_id, (-1, now))
            if beat != last:
                self._beats[member.node_id] = (beat, now)
            elif now - since > self.settings.lost_after:
                return member
        return None

    def membership_news(self) -> str | None:
        """Why the round must end for a new one (a node waits to join, a member was lost), or None."""
        if self.waiting():
            return "a node is waiting to join"
        left = self.left()
        if left is not None:
            return f"{left.name()} left the job (cancelled)"
        gone = self.lost()
        return (
            None
            if gone is None
            else f"{gone.name()} was lost (its launcher stopped beating for {self.settings.lost_after:g} s)"
        )

    def left(self) -> Member | None:
        """A member of the round that ended cancelled (it left: Ctrl-C or SIGTERM on its launcher)."""
        assert self.round is not None and self.store is not None
        for member in self.round.members:
            key = f"elastic/done/{member.node_id}"
            if (
                member.node_id != self.node_id
                and self.store.has(key)
                and self.store.get(key).get("status") == RunStatus.CANCELLED
            ):
                return member
        return None

    def lost_soon(self, stop=lambda: False) -> str | None:
        """After a rank of a round of several nodes failed: whether that was a member lost (its
        ranks' peers fail before its launcher is missed), waiting up to ``lost_after`` to know."""
        if self.round is None or self.round.nnodes < 2:
            return None
        deadline = time.monotonic() + self.settings.lost_after + 1
        while time.monotonic() < deadline and not stop():
            news = self.membership_news()
            if news is not None:
                return news
            time.sleep(0.2)
        return None

    def report_failure(self, info: dict[str, Any], *, final: bool = False) -> None:
        key = f"elastic/r{self.round.number if self.round else 0}/failed"
        if not self.store.has(key):
            self.store.put(
                key,
                {"node": self.round.group_rank if self.round else -1, "node_id": self.node_id, "final": final, **info},
            )

    def report_cancelled(self, reason: str) -> None:
        """The host's cancel ends every node (the store goes with it); another node's is that node
        leaving (a spot node's SIGTERM): it says so when done (``finish``), the others go on."""
        if self.is_host and not self.store.has("elastic/cancelled"):
            self.store.put("elastic/cancelled", {"node_id": self.node_id, "reason": reason})

    def poll(self) -> ClusterNews | None:
        """News from another node of the round (a failure, a cancel), at most once a round."""
        if self._seen_news or self.round is None:
            return None
        try:
            for kind, key in (
                (RunStatus.FAILED, f"elastic/r{self.round.number}/failed"),
                (RunStatus.CANCELLED, "elastic/cancelled"),
            ):
                if self.store.has(key):
                    info = self.store.get(key)
                    if info.get("node_id") != self.node_id:
                        self._seen_news = True
                        return ClusterNews(kind, int(info.get("node", -1)), info)
        except RuntimeError as exc:  # the store (its host) is gone
            self._seen_news = True
            message = f"lost contact with the elastic rendezvous at {self.where}: {_first_line(exc)}"
            return ClusterNews(RunStatus.FAILED, -1, {"node": -1, "rank": -1, "message": message, "final": True})
        return None

    def finish(self, status: RunStatus, wait: float = 60) -> None:
        """Say this node is done; the host keeps the store up until the last round's others are."""
        try:
            self.store.put(f"elastic/done/{self.node_id}", {"status": status})
            if self.is_host and self.round is not None:
                deadline = time.monotonic() + wait
                others = [m.node_id for m in self.round.members if m.node_id != self.node_id]
                while time.monotonic() < deadline and not all(self.store.has(f"elastic/done/{n}") for n in others):
                    if self.lost() is not None:
                        break
                    time.sleep(0.1)
            if self.is_host:  # torch's shutdown closes the rendezvous for all: a node that leaves must not
                self.handler.shutdown()
        except Exception:  # noqa: BLE001 - the store is gone: nothing left to tell
            pass


def join_elastic(spec: Any, secret: bytes, port: int, say=lambda message: None) -> ElasticRendezvous:
    """This node's side of ``spec``'s elastic rendezvous (``nnodes: "MIN:MAX"``), its store reached
    (or bound: this node hosts it) on ``master_addr:port``, torchrun's ``--rdzv-endpoint``."""
    settings = ElasticSettings(
        endpoint=spec.master_addr,
        port=port,
        rdzv_id=getattr(spec, "rdzv_id", None) or spec.name,
        min_nodes=spec.min_nodes,
        max_nodes=spec.nnodes,
        nproc=spec.nproc_per_node,
        join_timeout=spec.rdzv_timeout,
        last_call=spec.rdzv_last_call,
        # torch drops a node unheard for 5 s, when rpcctl calls it lost
        keep_alive=1.0,
        keep_alive_attempts=5,
        lost_after=5.0,
    )
    node = ElasticRendezvous(settings, secret)
    node.reach(say)
    return node


def round_plan(spec: Any, facts: Any, rnd: Round, *, run_id: str, run_dir: Any, restart: int) -> Any:
    """The plan of this node's ranks in round ``rnd``: RANK from the nodes before this one,
    WORLD_SIZE the round's, MASTER_ADDR/PORT where group rank 0 said its ranks meet."""
    from rpcctl.planning.plan import Place, plan_attempt

    if any(m.nproc != rnd.members[0].nproc for m in rnd.members):
        raise RendezvousError(
            "the nodes of an elastic job run the same number of ranks each (nproc_per_node): "
            + ", ".join(f"{m.name()}: {m.nproc}" for m in rnd.members)
        )
    return plan_attempt(
        spec,
        facts,
        run_id=run_id,
        run_dir=run_dir,
        restart=restart,
        place=Place(rnd.nnodes, rnd.group_rank, rnd.master_addr, rnd.master_port),
    )


def round_entry(rnd: Round, why: str, at: str) -> dict[str, Any]:
    """A round as the run record lists it (``RunRecord.rounds``)."""
    return {
        "round": rnd.number,
        "nnodes": rnd.nnodes,
        "world_size": rnd.world_size,
        "group_rank": rnd.group_rank,
        "first_rank": rnd.first_rank,
        "members": rnd.describe(),
        "why": why,
        "at": at,
    }


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _is_local_address(host: str) -> bool:
    """Whether ``host`` resolves to an address of this machine (this node hosts the rendezvous)."""
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((ip, 0))
        except OSError:
            return False
    return True


def _own_address(toward: str) -> str:
    """This node's address on the route to ``toward`` (where the others reach its ranks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((toward, 9))
            return probe.getsockname()[0]
        except OSError:
            return toward
