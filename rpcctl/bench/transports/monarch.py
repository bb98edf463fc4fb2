"""Monarch actor endpoints (optional: ``pip install 'rpcctl[monarch]'``, the ``torchmonarch``
wheel, which co-installs with the pinned torch). See docs/monarch.md and docs/bench.md.

One rank is Monarch's controller: it spawns a process mesh of one process on this host
(``this_host().spawn_procs``) with one ``_Echo`` actor, and calls it with the same payloads as
every other transport (``_monarch_actor``); Monarch's own mesh process does the serving, so this adapter runs as a
single rank, like Ray's.

Two rows, two ways a tensor can travel:

- ``monarch``: ``actor.echo.call_one(tensor).get()``. Endpoint arguments and results are
  pickled (cloudpickle; a tensor is its storage's bytes) into the message, which Monarch's
  Rust runtime (hyperactor) carries over a Unix socket to the mesh process, and back.
- ``monarch-rdma``: the path Monarch offers for bulk tensors, ``monarch.rdma.RDMABuffer``.
  The controller registers its payload and an output tensor as two buffers (per call) and
  sends only the two handles; the actor reads the payload into a tensor of its own
  (``read_into``) and writes it back into the output (``write_from``). Without an ibverbs
  device (this machine, any CPU host without InfiniBand or EFA) Monarch moves those bytes over
  its TCP fallback (``monarch.configure(rdma_allow_tcp_fallback=True)``); ``observe()``
  records the backend and the row gets a note saying so.

Startup: the ``import`` part is ``torch`` and ``monarch.actor`` (a Monarch user moving tensors
imports both, as torch RPC's row imports torch); ``init`` spawns the mesh and the actor and
waits until the actor answers; ``first_call`` is the first echo of a tensor (the mesh process
imports torch then).
"""

from __future__ import annotations

from typing import Any

from rpcctl.bench.transports import RankContext, Transport, register

INSTALL_HINT = "pip install 'rpcctl[monarch]'"


def _monarch_missing() -> str | None:
    """Without importing it (that takes seconds): the module, from the torchmonarch
    distribution (an unrelated PyPI package is also called ``monarch``)."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    try:
        if importlib.util.find_spec("monarch") is not None and version("torchmonarch"):
            return None
    except PackageNotFoundError:
        pass
    return f"torchmonarch is not installed ({INSTALL_HINT})"


class MonarchTransport(Transport):
    kind = "monarch"
    summary = "Monarch actor endpoint calls (tensors pickled in the message)"
    ops = {"latency": ("endpoint_call",), "payload": ("endpoint_call",), "throughput": ("endpoint_call",)}
    processes = 1
    install_hint = INSTALL_HINT
    modules = ("torch", "monarch.actor")

    @classmethod
    def unavailable(cls) -> str | None:
        return _monarch_missing()

    def setup(self, ctx: RankContext) -> None:
        from monarch.actor import this_host

        from rpcctl.bench.transports._monarch_actor import Echo

        self.ctx = ctx
        self.procs = this_host().spawn_procs(per_host={"procs": 1})
        self.actor = self.procs.spawn("echo", Echo)
        self.actor.echo.call_one(0).get()  # wait until the actor answers

    def issue(self, op: str, payload: Any) -> Any:
        return self.actor.echo.call_one(payload)

    def wait(self, op: str, handle: Any) -> Any:
        return handle.get()

    def teardown(self) -> None:
        self.procs.stop().get()


class MonarchRdmaTransport(MonarchTransport):
    kind = "monarch-rdma"
    summary = "Monarch RDMABuffer read/write (tensor bytes outside the message)"
    ops = {"payload": ("rdma_echo",)}
    modules = ("torch", "monarch.actor", "monarch.rdma")

    @classmethod
    def mismatches(cls, settings: dict[str, Any], observed: dict[str, Any]) -> list[str]:
        if observed.get("rdma_backend") == "tcp":
            return ["no ibverbs device here, so RDMABuffer moved the bytes over Monarch's TCP fallback"]
        return []

    def setup(self, ctx: RankContext) -> None:
        import monarch

        monarch.configure(rdma_allow_tcp_fallback=True)
        super().setup(ctx)

    def observe(self) -> dict[str, Any]:
        from monarch.rdma import get_rdma_backend

        return {"rdma_backend": get_rdma_backend()}

    def issue(self, op: str, payload: Any) -> Any:
        import torch
        from monarch.rdma import RDMABuffer

        out = torch.empty_like(payload)
        return self.actor.rdma_echo.call_one(RDMABuffer(payload), RDMABuffer(out), payload.numel()), out

    def wait(self, op: str, handle: Any) -> Any:
        future, out = handle
        future.get()
        return out


register(MonarchTransport)
register(MonarchRdmaTransport)
