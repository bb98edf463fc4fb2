"""torch.distributed with the Gloo backend: a send/recv ping-pong, and its collectives.

Rank 0 sends the payload to rank 1, which receives it into a preallocated buffer and sends it
straight back. Before each batch rank 0 tells rank 1 (untimed, on its own tag) how many bytes,
how many calls and how many in flight, so rank 1 can preallocate and echo exactly that many.
With several in flight, rank 0 keeps that many ``isend``/``irecv`` pairs outstanding (one
receive buffer each) and rank 1 echoes them in order.

Collectives (``all_reduce``, ``broadcast``, ``all_gather``) are torch's own gloo collectives:
the baseline every other framework's collective rows are compared with (``VS GLOO``).
"""

from __future__ import annotations

from typing import Any

from rpcctl.bench.transports import RankContext, Transport, register

CONTROL_TAG, DATA_TAG = 1, 2
STOP, BATCH = 0, 1


class GlooTransport(Transport):
    kind = "gloo"
    summary = "torch.distributed Gloo send/recv ping-pong; all_reduce, broadcast, all_gather"
    ops = {
        "latency": ("send_recv",),
        "payload": ("send_recv",),
        "throughput": ("send_recv",),
        "collective": ("all_reduce", "broadcast", "all_gather"),
    }
    modules = ("torch", "torch.distributed")

    def setup(self, ctx: RankContext) -> None:
        import torch.distributed as dist

        self.ctx = ctx
        dist.init_process_group("gloo", init_method="env://", rank=ctx.rank, world_size=ctx.world_size)
        self._slots: list[Any] = []
        self._next = 0

    def _control(self, *values: int, dst: int = 1) -> None:
        import torch
        import torch.distributed as dist

        dist.send(torch.tensor(values, dtype=torch.int64), dst=dst, tag=CONTROL_TAG)

    def prepare(self, op: str, payload: Any, calls: int, in_flight: int) -> None:
        import torch

        self._control(BATCH, payload.numel(), calls, in_flight)
        self._slots = [torch.empty_like(payload) for _ in range(min(in_flight, calls))]
        self._next = 0

    def issue(self, op: str, payload: Any) -> Any:
        import torch.distributed as dist

        buffer = self._slots[self._next % len(self._slots)]
        self._next += 1
        received = dist.irecv(buffer, src=1, tag=DATA_TAG)
        sent = dist.isend(payload, dst=1, tag=DATA_TAG)
        return sent, received, buffer

    def wait(self, op: str, handle: Any) -> Any:
        sent, received, buffer = handle
        sent.wait()
        received.wait()
        return buffer

    def serve(self) -> None:
        import torch
        import torch.distributed as dist

        control = torch.zeros(4, dtype=torch.int64)
        while True:
            dist.recv(control, src=0, tag=CONTROL_TAG)
            command, nbytes, calls, in_flight = (int(v) for v in control)
            if command == STOP:
                return
            buffers = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(min(in_flight, calls))]
            sends: list[Any] = [None] * len(buffers)
            for i in range(calls):
                slot = i % len(buffers)
                if sends[slot] is not None:
                    sends[slot].wait()  # the buffer is still going out from an earlier echo
                dist.recv(buffers[slot], src=0, tag=DATA_TAG)
                sends[slot] = dist.isend(buffers[slot], dst=0, tag=DATA_TAG)
            for work in sends:
                if work is not None:
                    work.wait()

    def collective(self, op: str, tensor: Any) -> Any:
        import torch
        import torch.distributed as dist

        if op == "all_reduce":
            dist.all_reduce(tensor)  # in place, as DDP does with its buckets
            return tensor
        if op == "broadcast":
            dist.broadcast(tensor, src=0)
            return tensor
        if op == "all_gather":
            out = torch.empty(self.ctx.world_size * tensor.numel(), dtype=tensor.dtype)
            dist.all_gather(list(out.chunk(self.ctx.world_size)), tensor)
            return out
        raise ValueError(f"gloo has no collective {op!r}")

    def agree(self, value: int) -> int:
        import torch
        import torch.distributed as dist

        decided = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(decided, src=0)
        return int(decided.item())

    def stop(self) -> None:
        for rank in range(1, self.ctx.world_size):
            self._control(STOP, 0, 0, 0, dst=rank)

    def teardown(self) -> None:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


register(GlooTransport)
