"""Parameter server: trainers train a model that lives on another worker.

Pattern shown: rank 0 is a parameter server that owns a small linear-regression model.
Ranks 1..N-1 are trainers. Each trainer, inside a ``dist_autograd.context()``:
  1. runs the forward pass on the server (``ps.rpc_sync().forward(x)``); RPC records the
     send/recv so the autograd graph spans both workers,
  2. computes the loss locally and calls ``dist_autograd.backward(context_id, [loss])``,
     which sends gradients back to the server (stored per context, not in ``.grad``),
  3. calls ``DistributedOptimizer.step(context_id)``, which updates the parameters on
     their owner from that context's gradients.
Trainers share the same model, so each sees the loss fall as all of them train it.

Run it with either:
    rpcctl launch configs/parameter_server.yaml
    torchrun --standalone --nproc-per-node 3 configs/scripts/parameter_server.py
"""

import os
import threading

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch import nn
from torch.distributed.optim import DistributedOptimizer

N_FEATURES = 8
STEPS = 30
LR = 0.05
NOISE = 0.01  # the labels' noise: the best model's loss is about NOISE**2


class ParameterServer:
    """Owns the model on rank 0; trainers call it through an RRef."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(N_FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def parameter_rrefs(self) -> list[rpc.RRef]:
        # DistributedOptimizer needs an RRef to every parameter it updates.
        return [rpc.RRef(p) for p in self.model.parameters()]


# One server per job: the first trainer to ask creates it, the others get the same one.
_server = None
_server_lock = threading.Lock()


def get_parameter_server() -> ParameterServer:
    """Runs on rank 0 (called via rpc.remote)."""
    global _server
    with _server_lock:
        if _server is None:
            _server = ParameterServer()
        return _server


def true_weights() -> tuple[torch.Tensor, float]:
    """The target the model should learn; identical on every rank (fixed seed)."""
    g = torch.Generator().manual_seed(1234)
    return torch.randn(N_FEATURES, 1, generator=g), 0.5


def train(rank: int) -> None:
    # An RRef to the server object living on worker0.
    ps = rpc.remote("worker0", get_parameter_server)
    opt = DistributedOptimizer(torch.optim.SGD, ps.rpc_sync().parameter_rrefs(), lr=LR)

    # This trainer's synthetic data (seeded by rank): y = x @ w + b + noise.
    g = torch.Generator().manual_seed(rank)
    w, b = true_weights()
    x = torch.randn(64, N_FEATURES, generator=g)
    y = x @ w + b + NOISE * torch.randn(64, 1, generator=g)

    losses = []
    for step in range(STEPS):
        # Each step gets its own distributed-autograd context (gradients live there).
        with dist_autograd.context() as context_id:
            pred = ps.rpc_sync().forward(x)  # forward runs on worker0
            loss = nn.functional.mse_loss(pred, y)  # loss on this trainer
            dist_autograd.backward(context_id, [loss])  # grads flow back to worker0
            opt.step(context_id)  # SGD update, applied on worker0
        losses.append(loss.item())
        print(f"step {step} loss {losses[-1]:.4f}", flush=True)

    # A regression in the example (or in RPC) should fail the job: the loss halves, or it is at
    # the noise floor already (a trainer that starts after the others trained the shared model
    # begins near it: 0.000157 -> 0.000104 was seen, and is a model that learned).
    learned = losses[-1] < 0.5 * losses[0] or losses[-1] < 10 * NOISE**2
    assert learned, f"loss did not go down: {losses[0]} -> {losses[-1]}"


def main() -> None:
    # The torchrun environment contract: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    assert world_size >= 2, "needs a parameter server and at least one trainer"
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=60)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=options)

    if rank > 0:
        train(rank)
    # The server does no work of its own: it serves RPCs until every trainer reaches
    # shutdown (graceful shutdown is a barrier across all workers).
    rpc.shutdown()

    if rank == 0:
        w, b = true_weights()
        model = get_parameter_server().model
        err = (model.weight.detach().T - w).abs().max().item()
        print(f"parameter server: max |w - w_true| = {err:.4f}, bias = {model.bias.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
