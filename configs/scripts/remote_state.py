"""Remote state: several ranks update one object owned by a single worker.

Pattern shown: rank 0 owns a small key-value store and wraps it in a local ``rpc.RRef``.
It passes that RRef to every other rank over RPC; each rank updates the store through
``rref.rpc_sync()``; rank 0 then reads the final state back with ``rref.local_value()``
and checks that no update was lost. Requests run on the owner's RPC thread pool, so the
store guards its state with a lock.

Run it with either:
    rpcctl launch configs/remote_state.yaml
    torchrun --standalone --nproc-per-node 3 configs/scripts/remote_state.py
"""

import os
import threading

import torch.distributed.rpc as rpc

UPDATES_PER_RANK = 20


class KVStore:
    """A counter plus a key-value map, owned by one worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # several RPC threads may call us at once
        self.counter = 0
        self.data: dict[str, int] = {}

    def increment(self, key: str, by: int = 1) -> int:
        with self._lock:
            self.counter += by
            self.data[key] = self.data.get(key, 0) + by
            return self.counter

    def snapshot(self) -> tuple[int, dict[str, int]]:
        with self._lock:
            return self.counter, dict(self.data)


# Runs on each updating rank: rank 0 sends it the store's RRef.
def run_updates(store: rpc.RRef, n: int) -> str:
    me = rpc.get_worker_info().name
    for _ in range(n):
        store.rpc_sync().increment(me)
    return me


def main() -> None:
    # The torchrun environment contract: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=60)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=options)

    if rank == 0:
        # A local object wrapped in an RRef: worker0 is its owner.
        store = rpc.RRef(KVStore())
        # Every other rank updates it concurrently.
        futs = [
            rpc.rpc_async(f"worker{r}", run_updates, args=(store, UPDATES_PER_RANK))
            for r in range(1, world_size)
        ]
        done = [f.wait() for f in futs]
        print(f"updates finished on {done}", flush=True)

        counter, data = store.local_value().snapshot()
        print(f"final counter = {counter}", flush=True)
        for key in sorted(data):
            print(f"  {key}: {data[key]}", flush=True)

        expected = UPDATES_PER_RANK * (world_size - 1)
        assert counter == expected, f"lost updates: {counter} != {expected}"
        assert data == {f"worker{r}": UPDATES_PER_RANK for r in range(1, world_size)}
        print("remote_state OK", flush=True)

    rpc.shutdown()


if __name__ == "__main__":
    main()
