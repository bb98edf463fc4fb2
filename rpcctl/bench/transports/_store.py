"""A side channel for adapters whose framework needs more than MASTER_PORT: torch's TCPStore on
MASTER_PORT (loopback on one node), to share the ports each rank picked and rank 0's decisions.

TensorFlow and Horovod bring their own servers (gRPC, Horovod's HTTP rendezvous) on ports of
their own; the launcher gives a job one free port, so each rank picks free ports itself and
publishes them here.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

TIMEOUT = timedelta(seconds=600)


class SideChannel:
    def __init__(self, ctx: Any):
        from torch.distributed import TCPStore

        self.ctx = ctx
        self.store = TCPStore(
            ctx.master_addr, ctx.master_port, ctx.world_size, is_master=ctx.rank == 0, timeout=TIMEOUT
        )
        self._agreed = 0

    def share(self, key: str, value: str) -> list[str]:
        """Every rank's ``value`` for ``key``, in rank order."""
        self.store.set(f"{key}/{self.ctx.rank}", value)
        return [self.store.get(f"{key}/{rank}").decode() for rank in range(self.ctx.world_size)]

    def agree(self, value: int) -> int:
        """Rank 0's ``value``, on every rank."""
        self._agreed += 1
        key = f"agree/{self._agreed}"
        if self.ctx.rank == 0:
            self.store.set(key, str(int(value)))
        return int(self.store.get(key).decode())

    def barrier(self, name: str) -> None:
        self.share(f"barrier/{name}", "1")

    def close(self) -> None:
        """The last word: rank 0 hosts the store, so it waits until every other rank has said
        goodbye (a rank still reading from the store when rank 0 exits would fail)."""
        if self.ctx.rank == 0:
            self.store.wait([f"closed/{rank}" for rank in range(1, self.ctx.world_size)], TIMEOUT)
        else:
            self.store.set(f"closed/{self.ctx.rank}", "1")


def free_port(host: str) -> int:
    """A port free on ``host`` right now (the framework binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
