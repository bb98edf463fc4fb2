"""Parameter server, in Monarch: trainers train a model that lives in another process.
The torch RPC version is configs/scripts/parameter_server.py; docs/monarch.md compares them.

Monarch has no distributed autograd and no DistributedOptimizer: the server actor owns the
model and its optimizer; each trainer actor pulls the weights (an endpoint returning
tensors), runs forward and backward on a local copy, and pushes its gradients (an endpoint
taking tensors), which the server applies with SGD. The server handles one message at a time,
so pushes never interleave. Two trainers in a mesh of 2 processes train at once (one call to
the mesh); they print their losses, which reach the rank's log.

Run it with:
    rpcctl launch configs/monarch/parameter_server.yaml
    python configs/monarch/parameter_server.py
"""

import torch
from monarch.actor import Actor, current_rank, endpoint, this_host
from torch import nn

N_FEATURES = 8
STEPS = 30
LR = 0.05


def true_weights() -> tuple[torch.Tensor, float]:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(N_FEATURES, 1, generator=g), 0.5


class ParameterServer(Actor):
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(N_FEATURES, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR)

    @endpoint
    def weights(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]

    @endpoint
    def push(self, grads: list[torch.Tensor]) -> None:
        for p, g in zip(self.model.parameters(), grads):
            p.grad = g
        self.opt.step()

    @endpoint
    def error(self) -> float:
        w, _ = true_weights()
        return (self.model.weight.detach().T - w).abs().max().item()


class Trainer(Actor):
    @endpoint
    def train(self, ps) -> list[float]:
        rank = current_rank()["procs"] + 1
        g = torch.Generator().manual_seed(rank)
        w, b = true_weights()
        x = torch.randn(64, N_FEATURES, generator=g)
        y = x @ w + b + 0.01 * torch.randn(64, 1, generator=g)
        model = nn.Linear(N_FEATURES, 1)
        losses = []
        for step in range(STEPS):
            with torch.no_grad():
                for p, v in zip(model.parameters(), ps.weights.call_one().get()):
                    p.copy_(v)
            model.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            ps.push.call_one([p.grad for p in model.parameters()]).get()
            losses.append(loss.item())
            print(f"step {step} loss {losses[-1]:.4f}", flush=True)
        return losses


def main() -> None:
    server_procs = this_host().spawn_procs(per_host={"procs": 1})
    ps = server_procs.spawn("ps", ParameterServer)
    trainer_procs = this_host().spawn_procs(per_host={"procs": 2})
    trainers = trainer_procs.spawn("trainers", Trainer)
    for _, losses in trainers.train.call(ps).get().items():
        assert losses[-1] < 0.5 * losses[0], f"loss did not go down: {losses[0]} -> {losses[-1]}"
    err = ps.error.call_one().get()
    print(f"parameter server: max |w - w_true| = {err:.4f}", flush=True)
    trainer_procs.stop().get()
    server_procs.stop().get()


if __name__ == "__main__":
    main()
