"""Remote call: run a function on another worker and get its result back.

Pattern shown: ``rpc.rpc_sync`` (blocks until the result arrives) and ``rpc.rpc_async``
(returns a Future at once; ``.wait()`` for the result). Rank 0 calls ranks 1..N-1.

Run it with either:
    rpcctl launch configs/remote_call.yaml
    torchrun --standalone --nproc-per-node 2 configs/scripts/remote_call.py
"""

import os

import torch
import torch.distributed.rpc as rpc


# Functions called remotely must live at module level: RPC pickles them by reference
# (``__main__.add_and_scale``), and the callee looks the name up in its own ``__main__``.
def add_and_scale(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """Runs on the callee."""
    return (a + b) * scale


def whoami() -> str:
    """Runs on the callee: returns the callee's worker name."""
    return rpc.get_worker_info().name


def main() -> None:
    # The torchrun environment contract: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=60)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=options)

    if rank == 0:
        a, b = torch.ones(3), torch.arange(3.0)
        for dst in range(1, world_size):
            callee = f"worker{dst}"

            # rpc_sync: blocks until the callee returns.
            name = rpc.rpc_sync(callee, whoami)
            result = rpc.rpc_sync(callee, add_and_scale, args=(a, b, 2.0))
            print(f"rpc_sync  -> {name}: add_and_scale = {result.tolist()}", flush=True)
            assert name == callee
            assert torch.equal(result, (a + b) * 2.0)

            # rpc_async: returns a Future immediately; overlap several calls, then wait.
            futs = [rpc.rpc_async(callee, add_and_scale, args=(a, b, float(s))) for s in (1, 2, 3)]
            results = [f.wait() for f in futs]
            print(f"rpc_async -> {callee}: {[r.tolist() for r in results]}", flush=True)
            for s, r in zip((1, 2, 3), results):
                assert torch.equal(r, (a + b) * s)
        print("remote_call OK", flush=True)

    # Other ranks do nothing but serve requests. shutdown() is a barrier by default
    # (graceful=True): every worker waits until all outstanding RPCs are done.
    rpc.shutdown()


if __name__ == "__main__":
    main()
