"""The echo actor of the Monarch adapters (``monarch.py``). A module of its own, importing
``monarch.actor`` at the top: only the bench's Monarch rank and its mesh process import it
(Monarch sends an actor class by name, and the mesh process imports it from here), never the
launcher side, which only lists adapters."""

from __future__ import annotations

from monarch.actor import Actor, endpoint


class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def rdma_echo(self, src, dst, nbytes: int) -> None:
        """Read ``src`` (an RDMABuffer of the controller's payload) into a tensor of this
        process, then write that tensor into ``dst`` (the controller's output buffer)."""
        import torch

        t = torch.empty(nbytes, dtype=torch.uint8)
        src.read_into(t).get()
        dst.write_from(t).get()
