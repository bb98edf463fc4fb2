"""A script that mp.spawns its own gloo job (PyTorch's DDP tutorial's shape: ``mp.spawn(train,
nprocs=3)``, each worker ``init_process_group(rank=r, world_size=3)`` on a MASTER_PORT the script
chose free), run as one rpcctl rank. Each spawned worker runs collectives_job.py MODE as dist rank
r, so its collectives are known exactly (that file's docstring); argv[2] is how many rounds (two:
the same dist ranks 0..2 twice, two c10d worlds).
"""

import os
import runpy
import socket
import sys
from pathlib import Path

import torch.multiprocessing as mp

JOB = str(Path(__file__).resolve().parent / "collectives_job.py")
WORLD = 3


def worker(rank, port, mode):
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    sys.argv = [JOB, mode]
    runpy.run_path(JOB, run_name="__main__")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "clean"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for _ in range(rounds):
        mp.spawn(worker, args=(free_port(), mode), nprocs=WORLD, join=True)
    print("all rounds done", flush=True)
