"""The ``train`` suite: parameter-server training steps over RPC.

Rank 0 owns a small MLP (the parameter server); ranks 1..N-1 are trainers. A step, on a
trainer, inside a distributed-autograd context: forward on the server
(``ps.rpc_sync().forward(x)``), loss locally, ``dist_autograd.backward``, then
``DistributedOptimizer.step`` (SGD, applied on the server). So each step is three RPC round
trips plus the autograd messages: the overhead an RPC training loop pays per step.

Each trainer warms up, calibrates its steps per repeat, meets the others at a barrier on the
server, then times ``repeats`` repeats. Per repeat, the job's rate is the sum of the trainers'
steps/s (the trainers run at the same time); step times are pooled across trainers.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any

N_FEATURES, HIDDEN, N_OUT = 64, 128, 8
LR = 0.01
COLLECT_TIMEOUT_S = 600.0


class ParameterServer:
    def __init__(self) -> None:
        import torch
        from torch import nn

        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(N_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, N_OUT))

    def forward(self, x):
        # Trainers step concurrently (Hogwild): an optimizer step may update a weight in place
        # while another trainer's backward still needs the value its forward used. Running on
        # clones keeps those values intact; gradients still flow to the real parameters. Not
        # torch.func.functional_call: it swaps the module's attributes for the call, and two
        # trainers' forwards at once (RPC runs them on two threads) put the real parameters
        # back under each other's feet: a backward then failed with "modified by an inplace
        # operation" (seen in CI under load).
        import torch.nn.functional as F

        first, first_bias, second, second_bias = (p.clone() for p in self.model.parameters())
        return F.linear(F.relu(F.linear(x, first, first_bias)), second, second_bias)

    def parameter_rrefs(self) -> list:
        import torch.distributed.rpc as rpc

        return [rpc.RRef(p) for p in self.model.parameters()]


class _ServerState:
    """Rank 0's side of one training case: the server, the start barrier, the trainers' reports."""

    def __init__(self, trainers: int):
        self.server = ParameterServer()
        self.barrier = threading.Barrier(trainers)
        self.reports: dict[int, dict] = {}
        self.done = threading.Condition()


_state: _ServerState | None = None
_state_lock = threading.Lock()


def _get_state(trainers: int) -> _ServerState:
    global _state
    with _state_lock:
        if _state is None:
            _state = _ServerState(trainers)
        return _state


# -- run on rank 0 by the trainers -------------------------------------------------------------


def _get_server(trainers: int) -> ParameterServer:
    return _get_state(trainers).server


def _arrive(trainers: int) -> None:
    _get_state(trainers).barrier.wait(timeout=COLLECT_TIMEOUT_S)


def _report(trainers: int, rank: int, report: dict) -> None:
    state = _get_state(trainers)
    with state.done:
        state.reports[rank] = report
        state.done.notify_all()


# -- the suite ---------------------------------------------------------------------------------


def run(ctx: Any, timing: Any, worker_name, batch: int = 32) -> dict | None:
    trainers = ctx.world_size - 1
    if trainers < 1:
        raise ValueError("the train suite needs a world size of at least 2 (a server and a trainer)")
    if ctx.rank == 0:
        state = _get_state(trainers)
        with state.done:
            if not state.done.wait_for(lambda: len(state.reports) == trainers, timeout=COLLECT_TIMEOUT_S):
                raise TimeoutError(f"only {len(state.reports)} of {trainers} trainers reported")
        return combine([state.reports[r] for r in sorted(state.reports)])
    _train(ctx.rank, trainers, timing, worker_name(0), batch)
    return None


def _train(rank: int, trainers: int, timing: Any, server: str, batch: int) -> None:
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.distributed.optim import DistributedOptimizer

    from rpcctl.bench.measure import closed_loop, repeat, warm_up

    ps = rpc.remote(server, _get_server, args=(trainers,))
    optimizer = DistributedOptimizer(torch.optim.SGD, ps.rpc_sync().parameter_rrefs(), lr=LR)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, N_FEATURES, generator=generator)
    y = torch.randn(batch, N_OUT, generator=generator)

    def step() -> None:
        with dist_autograd.context() as context_id:
            loss = torch.nn.functional.mse_loss(ps.rpc_sync().forward(x), y)
            dist_autograd.backward(context_id, [loss])
            optimizer.step(context_id)

    def run_batch(steps: int):
        return closed_loop(step, steps)

    steps, warmup_steps = warm_up(run_batch, timing)
    rpc.rpc_sync(server, _arrive, args=(trainers,))  # every trainer is warm: start together
    measured = repeat(run_batch, timing, steps, warmup_steps)
    report = {
        "samples_s": measured.samples_s,
        "repeat_medians_s": measured.repeat_medians_s,
        "repeat_rates": measured.repeat_rates,
        "steps": steps,
        "warmup": warmup_steps,
    }
    rpc.rpc_sync(server, _report, args=(trainers, rank, report))


def combine(reports: list[dict]) -> dict:
    """The job's figures from the trainers' reports: rates add up per repeat, times pool."""
    repeats = min(len(r["repeat_rates"]) for r in reports)
    return {
        "samples_s": [s for r in reports for s in r["samples_s"]],
        "repeat_medians_s": [statistics.median(r["repeat_medians_s"][i] for r in reports) for i in range(repeats)],
        "repeat_rates": [sum(r["repeat_rates"][i] for r in reports) for i in range(repeats)],
        "calls_per_repeat": sum(r["steps"] for r in reports),
        "warmup_calls": sum(r["warmup"] for r in reports),
    }
