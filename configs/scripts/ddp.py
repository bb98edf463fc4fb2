"""Plain DistributedDataParallel training on gloo (CPU): every rank is a trainer.

Pattern shown: ``init_process_group("gloo")`` from the environment (env://), a model wrapped
in ``DistributedDataParallel``; each rank trains on its own shard of the data, and DDP averages
the gradients with an all_reduce in every backward, so every rank holds the same model after
every step. At the end the ranks compare their weights (an all_gather) and rank 0 prints them.

Run it with either:
    rpcctl launch configs/ddp.yaml
    torchrun --standalone --nproc-per-node 3 configs/scripts/ddp.py
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

N_FEATURES = 16
BATCH = 32
STEPS = 40
LR = 0.05


def main() -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same true weights and initial model on every rank
    w_true = torch.randn(N_FEATURES, 1)
    model = DDP(nn.Linear(N_FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    for step in range(STEPS):
        x = torch.randn(BATCH, N_FEATURES, generator=data)
        y = x @ w_true + 0.01 * torch.randn(BATCH, 1, generator=data)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP: the gradients are all_reduced here
        optimizer.step()
        if step % 5 == 0 or step == STEPS - 1:
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)

    weights = model.module.weight.detach().clone()
    gathered = [torch.empty_like(weights) for _ in range(world_size)]
    dist.all_gather(gathered, weights)
    if rank == 0:
        same = all(torch.equal(gathered[0], w) for w in gathered)
        error = (weights.t() - w_true).abs().max().item()
        print(f"weights identical on all {world_size} ranks: {same}")
        print(f"max |w - w_true| = {error:.4f}")
        print("ddp OK" if same and error < 0.2 else "ddp FAILED")
    dist.barrier()  # every rank done with the group before any tears it down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
