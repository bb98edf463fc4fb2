"""DistributedDataParallel and RPC in one job (the pattern of PyTorch's tutorial "Combining
Distributed DataParallel with Distributed RPC Framework"), on gloo (CPU).

Rank 0 is a parameter server that owns a large embedding table; ranks 1..N-1 are trainers.
Every rank calls ``init_process_group("gloo")`` and then ``init_rpc``, both from the
environment (env://, one rendezvous port for both). The trainers make a process group of their
own (``new_group``) and wrap their small dense layer in DDP over it. Each step, inside a
``dist_autograd.context()``, a trainer:
  1. looks its batch up in the remote embedding table (``table.rpc_sync().forward``),
  2. runs the DDP-wrapped dense layer and computes the loss locally,
  3. calls ``dist_autograd.backward``: DDP all_reduces the dense layer's gradients among the
     trainers, and RPC sends the table's gradients to the parameter server,
  4. calls ``DistributedOptimizer.step``, which updates the table on the server and the dense
     layer on each trainer.
At the end the trainers check their dense layers are identical (DDP kept them in sync).

Run it with either:
    rpcctl launch configs/rpc_ddp.yaml
    torchrun --standalone --nproc-per-node 3 configs/scripts/rpc_ddp.py
"""

import threading

import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch import nn
from torch.distributed.optim import DistributedOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

NUM_EMBEDDINGS = 100
EMBEDDING_DIM = 16
N_CLASSES = 4
BATCH = 16
STEPS = 30
LR = 0.3


class EmbeddingTable:
    """Owned by the parameter server (rank 0); trainers reach it through an RRef."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.table = nn.EmbeddingBag(NUM_EMBEDDINGS, EMBEDDING_DIM, mode="sum")

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.table(indices, offsets)

    def parameter_rrefs(self) -> list[rpc.RRef]:
        return [rpc.RRef(p) for p in self.table.parameters()]


_table = None
_table_lock = threading.Lock()


def get_table() -> EmbeddingTable:
    """Runs on the parameter server: one table shared by every trainer."""
    global _table
    with _table_lock:
        if _table is None:
            _table = EmbeddingTable()
        return _table


def batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bags of 3 indices; the label is the first index's class (index mod N_CLASSES)."""
    indices = torch.randint(0, NUM_EMBEDDINGS, (BATCH * 3,), generator=generator)
    offsets = torch.arange(0, BATCH * 3, 3)
    labels = indices[offsets] % N_CLASSES
    return indices, offsets, labels


def train(rank: int, trainers: dist.ProcessGroup) -> None:
    table = rpc.remote("ps", get_table)
    torch.manual_seed(1)  # the same dense layer on every trainer
    dense = DDP(nn.Linear(EMBEDDING_DIM, N_CLASSES), process_group=trainers)
    params = table.rpc_sync().parameter_rrefs() + [rpc.RRef(p) for p in dense.parameters()]
    optimizer = DistributedOptimizer(torch.optim.SGD, params, lr=LR)
    data = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for step in range(STEPS):
        indices, offsets, labels = batch(data)
        with dist_autograd.context() as context_id:
            embedded = table.rpc_sync().forward(indices, offsets)
            loss = nn.functional.cross_entropy(dense(embedded), labels)
            dist_autograd.backward(context_id, [loss])
            optimizer.step(context_id)
        losses.append(loss.item())
        if step % 5 == 0 or step == STEPS - 1:
            print(f"trainer{rank} step {step} loss {loss.item():.4f}", flush=True)
    weights = dense.module.weight.detach().clone()
    gathered = [torch.empty_like(weights) for _ in range(dist.get_world_size(trainers))]
    dist.all_gather(gathered, weights, group=trainers)
    same = all(torch.equal(gathered[0], w) for w in gathered)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5  # mean of the first and last 5 steps
    print(f"trainer{rank}: dense layer identical on every trainer: {same}; mean loss {first:.4f} -> {last:.4f}")
    print(f"trainer{rank} rpc_ddp OK" if same and last < first else f"trainer{rank} rpc_ddp FAILED")


def main() -> None:
    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world_size = dist.get_rank(), dist.get_world_size()
    trainers = dist.new_group(list(range(1, world_size)))  # every rank calls new_group
    rpc.init_rpc("ps" if rank == 0 else f"trainer{rank}", rank=rank, world_size=world_size)
    if rank != 0:
        train(rank, trainers)
    rpc.shutdown()  # the server serves until every trainer is done
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
