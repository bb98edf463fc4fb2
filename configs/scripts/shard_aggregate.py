"""Shard and aggregate: split data across workers as RRefs, compute where the data lives.

Pattern shown: rank 0 splits a dataset into one shard per worker and places each shard
on its worker with ``rpc.remote`` (it keeps only RRefs). It then asks each owner to
compute a partial result on its own shard (``rpc_async(rref.owner(), fn, args=(rref,))``;
the owner reads the data with ``rref.local_value()``, so the shard is never copied back),
and aggregates the partials. The result must equal the same computation done locally.

Run it with either:
    rpcctl launch configs/shard_aggregate.yaml
    torchrun --standalone --nproc-per-node 3 configs/scripts/shard_aggregate.py
"""

import os

import torch
import torch.distributed.rpc as rpc


def make_shard(chunk: torch.Tensor) -> torch.Tensor:
    """Runs on the owner: the returned tensor stays there, behind the RRef."""
    return chunk.clone()


def partial_stats(shard: rpc.RRef) -> torch.Tensor:
    """Runs on the shard's owner: count, sum and sum of squares of each column."""
    x = shard.local_value()
    return torch.stack([torch.full((x.shape[1],), float(x.shape[0])), x.sum(0), (x * x).sum(0)])


def main() -> None:
    # The torchrun environment contract: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=60)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=options)

    if rank == 0:
        # Seeded synthetic dataset: 1000 rows, 4 columns.
        data = torch.randn(1000, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

        # One shard per worker (rank 0 keeps one too); uneven sizes are fine.
        chunks = torch.tensor_split(data, world_size)
        shards = [rpc.remote(f"worker{r}", make_shard, args=(c,)) for r, c in enumerate(chunks)]
        for s, c in zip(shards, chunks):
            print(f"shard of {c.shape[0]} rows owned by {s.owner().name}", flush=True)

        # Map: each owner computes on its shard, in parallel.
        futs = [rpc.rpc_async(s.owner(), partial_stats, args=(s,)) for s in shards]
        # Reduce: add the partials, then turn them into mean and std.
        n, total, total_sq = torch.stack([f.wait() for f in futs]).sum(0)
        mean = total / n
        std = ((total_sq - n * mean**2) / (n - 1)).sqrt()
        print(f"distributed mean = {[round(v, 4) for v in mean.tolist()]}", flush=True)
        print(f"distributed std  = {[round(v, 4) for v in std.tolist()]}", flush=True)

        # Check against the same computation on the whole dataset.
        assert torch.allclose(mean, data.mean(0)), (mean, data.mean(0))
        assert torch.allclose(std, data.std(0)), (std, data.std(0))
        print("shard_aggregate OK: matches the local computation", flush=True)

    rpc.shutdown()


if __name__ == "__main__":
    main()
