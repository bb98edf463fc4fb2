"""A nested mp.spawn, run as one rpcctl rank: the rank mp.spawns one trainer, which mp.spawns two
workers of its own; each of those calls ``init_process_group`` on gloo (a world of 2 on a port the
trainer chose) and runs 3 all_reduce. The trainer itself joins no group: a process in the middle
of the tree that telemetry does not otherwise hear from.

argv[1]: ``clean`` (all end well), ``raise`` (the workers also join RPC, as ``g0`` and ``g1``, on a
second port; then ``g1`` raises ``ValueError`` after its all_reduce; mp.spawn in the trainer then
raises, and so does mp.spawn in the rank) or ``kill`` (the second worker kills itself with SIGKILL
there).
"""

import os
import signal
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(index, port, mode, rpc_port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=2)
    if mode == "raise":
        import torch.distributed.rpc as rpc

        options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{rpc_port}")
        rpc.init_rpc(f"g{index}", rank=index, world_size=2, rpc_backend_options=options)
    t = torch.ones(16)
    for _ in range(3):
        dist.all_reduce(t)
    print(f"worker {index} pid {os.getpid()} parent {os.getppid()}", flush=True)
    if mode == "raise" and index == 1:
        raise ValueError("the grandchild lost its shard")
    if mode == "kill" and index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()


def trainer(index, mode):
    print(f"trainer pid {os.getpid()} parent {os.getppid()}", flush=True)
    mp.spawn(worker, args=(free_port(), mode, free_port()), nprocs=2, join=True)


if __name__ == "__main__":
    mp.spawn(trainer, args=(sys.argv[1],), nprocs=1, join=True)
    print("all done", flush=True)
