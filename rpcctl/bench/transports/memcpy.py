"""In-memory copy: the ceiling no transport between processes can beat.

One process. A "round trip" copies the payload into a preallocated buffer and back into a
second one (two copies of the payload, the same bytes an echo moves), with ``Tensor.copy_``.
"""

from __future__ import annotations

from typing import Any

from rpcctl.bench.transports import RankContext, Transport, register


class MemcpyTransport(Transport):
    kind = "memcpy"
    summary = "copy there and back in memory (the ceiling)"
    ops = {"latency": ("copy",), "payload": ("copy",)}
    processes = 1

    def setup(self, ctx: RankContext) -> None:
        self.ctx = ctx

    def prepare(self, op: str, payload: Any, calls: int, in_flight: int) -> None:
        import torch

        self._there = torch.empty_like(payload)
        self._back = torch.empty_like(payload)

    def issue(self, op: str, payload: Any) -> Any:
        self._there.copy_(payload)
        self._back.copy_(self._there)
        return self._back

    def teardown(self) -> None:
        pass


register(MemcpyTransport)
