"""An RPC program in the shape of PyTorch's examples (parameter server, rnn, rl): launched as ONE
rank, it mp.spawns its own workers, each of which sets MASTER_ADDR/MASTER_PORT itself and
calls init_rpc on localhost with its own port.

Worker 0 owns nothing and calls; worker 1 owns a ``Server`` made with ``rpc.remote``, called
through the examples' ``_call_method`` helper: FORWARDS calls of ``Server.forward`` and GRADS of
``Server.grads``.

Environment:
- HOLD_S: worker 0 then calls ``Server.pause`` once (1.3 s: listed by the caller and the callee)
  and a plain function for HOLD_S seconds (a program that runs long while its parent waits in
  ``mp.spawn``).
- RAISE: once worker 0 is done, worker 1 keeps an RRef owned by worker 0 (in a global) and
  raises ``ValueError(RAISE)`` before ``rpc.shutdown()`` (worker 0 waits until mp.spawn ends it).
"""

import os
import socket
import threading
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

FORWARDS, GRADS = 7, 3
KEPT = []
GO = threading.Event()


class Server:
    def __init__(self):
        self.weight = torch.ones(4)

    def forward(self, x):
        return self.weight * x

    def grads(self):
        return self.weight.clone()

    def pause(self, seconds):
        time.sleep(seconds)  # long enough for both sides to list the call


def make(n):
    return torch.ones(n)


def go():
    GO.set()


def _call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def _remote_method(method, rref, *args, **kwargs):
    return rpc.rpc_sync(rref.owner(), _call_method, args=[method, rref] + list(args), kwargs=kwargs)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)
    if rank == 0:
        server = rpc.remote("worker1", Server)
        for _ in range(FORWARDS):
            _remote_method(Server.forward, server, torch.ones(4))
        for _ in range(GRADS):
            _remote_method(Server.grads, server)
        if os.environ.get("HOLD_S"):
            _remote_method(Server.pause, server, 1.3)
        del server
        until = time.monotonic() + float(os.environ.get("HOLD_S", "0"))
        while time.monotonic() < until:
            rpc.rpc_sync("worker1", make, args=(1,))
            time.sleep(0.2)
        if os.environ.get("RAISE"):
            rpc.rpc_sync("worker1", go)
    if os.environ.get("RAISE") and rank == 1:
        GO.wait(120)  # worker 0 is done
        KEPT.append(rpc.remote("worker0", make, args=(16,)))  # still referenced when it fails
        KEPT[-1].to_here()
        time.sleep(0.5)  # long enough to be listed, not counted as short-lived
        raise ValueError(os.environ["RAISE"])
    if os.environ.get("RAISE"):
        time.sleep(60)  # torn down by mp.spawn once worker 1 failed
    rpc.shutdown()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, free_port()), nprocs=2, join=True)
