"""Horovod collectives over its Gloo controller: ``allreduce``, ``broadcast``, ``allgather``.

Optional: Horovod's last release (0.28.1) has no wheel that builds against current torch from
pip; ``scripts/build_horovod.sh`` builds it (no build isolation, C++17, Gloo only). Without it
the rows are skipped with that hint.

What ``horovodrun`` would do, done by the ranks themselves: rank 0 serves Horovod's HTTP
rendezvous (bound to the loopback address, not to every interface as ``horovodrun`` does), its
port reaches the other ranks through the side channel on MASTER_PORT, and every rank sets the
``HOROVOD_*`` environment of its slot before ``hvd.init()``.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from typing import Any

from rpcctl.bench.transports import RankContext, Transport, register

# Our op names → Horovod's calls (the same names as the gloo rows they are compared with).
OPS = ("all_reduce", "broadcast", "all_gather")


class HorovodTransport(Transport):
    kind = "horovod"
    summary = "Horovod 0.28 (Gloo controller): allreduce, broadcast, allgather"
    ops = {"collective": OPS}
    modules = ("torch", "horovod.torch")
    install_hint = "scripts/build_horovod.sh (builds horovod 0.28.1 against the installed torch, ~3 min)"

    @classmethod
    def unavailable(cls) -> str | None:
        if importlib.util.find_spec("horovod") is None:
            return f"horovod is not installed ({cls.install_hint})"
        return None

    @classmethod
    def env_for(cls, settings: dict[str, Any]) -> dict[str, str]:
        return {"HOROVOD_LOG_LEVEL": "warning"}

    def setup(self, ctx: RankContext) -> None:
        from rpcctl.bench.transports._store import SideChannel

        self.ctx = ctx
        self.side = SideChannel(ctx)
        self._httpd = None
        port = 0
        if ctx.rank == 0:
            port = self._serve_rendezvous(ctx)
        port = int(self.side.share("horovod-rendezvous", str(port))[0])
        os.environ.update(
            {
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": ctx.master_addr,
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                "HOROVOD_GLOO_IFACE": _interface_of(ctx.master_addr),
                "HOROVOD_HOSTNAME": "localhost",
                "HOROVOD_RANK": str(ctx.rank),
                "HOROVOD_SIZE": str(ctx.world_size),
                "HOROVOD_LOCAL_RANK": str(ctx.rank),
                "HOROVOD_LOCAL_SIZE": str(ctx.world_size),
                "HOROVOD_CROSS_RANK": "0",
                "HOROVOD_CROSS_SIZE": "1",
            }
        )
        import horovod.torch as hvd

        hvd.init()
        if hvd.size() != ctx.world_size or hvd.rank() != ctx.rank:
            raise RuntimeError(
                f"horovod sees rank {hvd.rank()} of {hvd.size()}, the launcher {ctx.rank} of {ctx.world_size}"
            )
        self.hvd = hvd

    def _serve_rendezvous(self, ctx: RankContext) -> int:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self._httpd = RendezvousHTTPServer((ctx.master_addr, 0), RendezvousHandler, 0)
        threading.Thread(target=self._httpd.serve_forever, name="horovod-rendezvous", daemon=True).start()
        self._httpd.init(get_host_assignments(parse_hosts(f"localhost:{ctx.world_size}"), ctx.world_size))
        return self._httpd.server_address[1]

    def collective(self, op: str, tensor: Any) -> Any:
        hvd = self.hvd
        if op == "all_reduce":
            return hvd.allreduce(tensor, op=hvd.Sum)
        if op == "broadcast":
            return hvd.broadcast(tensor, root_rank=0)
        if op == "all_gather":
            return hvd.allgather(tensor)
        raise ValueError(f"horovod has no collective {op!r}")

    def agree(self, value: int) -> int:
        return int(self.hvd.broadcast_object(int(value), root_rank=0))

    def issue(self, op: str, payload: Any) -> Any:
        raise NotImplementedError("horovod has no point-to-point op")

    def teardown(self) -> None:
        self.hvd.shutdown()
        self.side.barrier("horovod-down")  # rank 0's rendezvous stays up until every rank is done
        self.side.close()
        if self._httpd is not None:
            self._httpd.shutdown()


def _interface_of(address: str) -> str:
    """The network interface that holds ``address`` (``lo`` for loopback)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    return "lo"


register(HorovodTransport)
