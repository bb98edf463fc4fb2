"""Failing job: rank 1 crashes mid-training while rank 0 is blocked waiting on it.

Pattern shown: what a real failure looks like. Rank 1 trains for a few steps and then
raises an uncaught ``RuntimeError``. Rank 0 is meanwhile blocked waiting for rank 1 to
report (over RPC) that training is done; that report never comes, so rank 0 never finishes:
the launcher has to notice that rank 1 died, tear rank 0 down, and report rank 1's
exception as the root cause. The job is *meant* to exit non-zero.

Run it with either:
    rpcctl launch configs/failing.yaml
    torchrun --standalone --nproc-per-node 2 configs/scripts/failing.py
"""

import os
import threading
import time

import torch.distributed.rpc as rpc

FAIL_RANK = 1
FAIL_STEP = 3

# Set on rank 0 when a trainer reports in; rank 0's main thread blocks on it.
_training_done = threading.Event()


def report_done() -> None:
    """Runs on rank 0 (called by rank 1 over RPC when its training loop finishes)."""
    _training_done.set()


def main() -> None:
    # The torchrun environment contract: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=60)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=options)

    if rank == FAIL_RANK:
        for step in range(10):
            print(f"step {step}", flush=True)
            time.sleep(0.2)  # pretend to work
            if step == FAIL_STEP:
                # Uncaught: this process dies with a traceback and exit code 1.
                raise RuntimeError(f"simulated failure in rank {rank} at step {step}")
        rpc.rpc_sync("worker0", report_done)  # never reached
    elif rank == 0:
        print(f"waiting for worker{FAIL_RANK} to finish training", flush=True)
        # Blocked like a rank stuck in a collective: a local wait does not notice that
        # rank 1 died (an RPC to it would fail fast with "eof" and muddy the root cause).
        # The timeout is only a safety net for runs outside a launcher.
        if not _training_done.wait(timeout=300):
            raise TimeoutError(f"worker{FAIL_RANK} never reported")

    rpc.shutdown()


if __name__ == "__main__":
    main()
