"""Shard and aggregate, in Monarch: place data in several processes, compute where it lives.
The torch RPC version is configs/scripts/shard_aggregate.py; docs/monarch.md compares them.

A mesh of 3 processes holds one ``Shard`` actor each. The controller sends each process its
chunk once (``shards.slice(procs=r).load.call_one(chunk)``: torch RPC keeps an RRef to a
value made on the owner); then one call to the whole mesh (``shards.partial_stats.call()``)
runs on every shard at once and returns a ValueMesh of partial results, aggregated here. The
shards never come back.

Run it with:
    rpcctl launch configs/monarch/shard_aggregate.yaml
    python configs/monarch/shard_aggregate.py
"""

import torch
from monarch.actor import Actor, current_rank, endpoint, this_host

N_PROCS = 3


class Shard(Actor):
    def __init__(self) -> None:
        self.x: torch.Tensor | None = None
        self.rank = current_rank()["procs"]  # its place in the mesh (a sliced call sees a slice)

    @endpoint
    def load(self, chunk: torch.Tensor) -> int:
        self.x = chunk.clone()
        return self.rank

    @endpoint
    def partial_stats(self) -> torch.Tensor:
        """Count, sum and sum of squares of each column of this process's shard."""
        x = self.x
        return torch.stack([torch.full((x.shape[1],), float(x.shape[0]), dtype=x.dtype), x.sum(0), (x * x).sum(0)])


def main() -> None:
    data = torch.randn(1000, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    procs = this_host().spawn_procs(per_host={"procs": N_PROCS})
    shards = procs.spawn("shards", Shard)
    chunks = torch.tensor_split(data, N_PROCS)
    for r, chunk in enumerate(chunks):
        owner = shards.slice(procs=r).load.call_one(chunk).get()
        print(f"shard of {chunk.shape[0]} rows held by proc {owner}", flush=True)
    partials = shards.partial_stats.call().get()  # every shard at once: a ValueMesh
    n, total, total_sq = torch.stack([p for _, p in partials.items()]).sum(0)
    mean = total / n
    std = ((total_sq - n * mean**2) / (n - 1)).sqrt()
    print(f"distributed mean = {[round(v, 4) for v in mean.tolist()]}", flush=True)
    print(f"distributed std  = {[round(v, 4) for v in std.tolist()]}", flush=True)
    assert torch.allclose(mean, data.mean(0)) and torch.allclose(std, data.std(0))
    procs.stop().get()
    print("shard_aggregate OK: matches the local computation", flush=True)


if __name__ == "__main__":
    main()
