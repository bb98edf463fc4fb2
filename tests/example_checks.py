"""What each example under configs/ must print, however it is launched."""

from __future__ import annotations

import re


def _check_remote_call(out: str) -> None:
    assert "rpc_sync  -> worker1: add_and_scale = [2.0, 4.0, 6.0]" in out
    assert "rpc_async -> worker1:" in out
    assert "remote_call OK" in out


def _check_remote_object(out: str) -> None:
    assert "rref.owner() = worker1" in out
    assert "rref.remote().value().to_here() = [1.0, 2.0, 3.0, 4.0] (computed on worker1)" in out
    assert "remote_object OK" in out


def _check_remote_state(out: str) -> None:
    assert "final counter = 40" in out  # 2 updating ranks x 20 updates
    assert "worker1: 20" in out and "worker2: 20" in out
    assert "remote_state OK" in out


def _check_shard_aggregate(out: str) -> None:
    for r in range(3):
        assert f"owned by worker{r}" in out
    assert "shard_aggregate OK" in out


def _check_parameter_server(out: str) -> None:
    # Lines from the two trainers interleave; group the losses by step.
    by_step: dict[int, list[float]] = {}
    for m in re.finditer(r"step (\d+) loss (\d+\.\d{4})\b", out):
        by_step.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    assert sorted(by_step) == list(range(30)), sorted(by_step)
    assert all(len(v) == 2 for v in by_step.values()), "expected one line per trainer per step"
    first, last = by_step[0], by_step[29]
    assert max(last) < 0.5 * min(first), (first, last)
    m = re.search(r"max \|w - w_true\| = (\d+\.\d+)", out)
    assert m and float(m.group(1)) < 0.1, m


def _check_ddp(out: str) -> None:
    assert "weights identical on all 3 ranks: True" in out
    for rank in range(3):
        assert f"rank {rank} step 39 loss" in out
    m = re.search(r"max \|w - w_true\| = (\d+\.\d+)", out)
    assert m and float(m.group(1)) < 0.2, m
    assert "ddp OK" in out


def _check_rpc_ddp(out: str) -> None:
    for trainer in (1, 2):
        assert f"trainer{trainer}: dense layer identical on every trainer: True" in out
        assert f"trainer{trainer} step 29 loss" in out
        assert f"trainer{trainer} rpc_ddp OK" in out


CHECKS = {
    "remote_call": _check_remote_call,
    "remote_object": _check_remote_object,
    "remote_state": _check_remote_state,
    "shard_aggregate": _check_shard_aggregate,
    "parameter_server": _check_parameter_server,
    "ddp": _check_ddp,
    "rpc_ddp": _check_rpc_ddp,
}


# configs/monarch/: the same patterns in Monarch (docs/monarch.md), the same results.
def _check_monarch_remote_call(out: str) -> None:
    assert "add_and_scale = [2.0, 4.0, 6.0]" in out
    assert "futures   -> [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [3.0, 6.0, 9.0]]" in out
    assert "failure   -> ActorError: True" in out and "remote_call OK" in out


def _check_monarch_remote_object(out: str) -> None:
    assert "owner is another process: True" in out and "calls = 2" in out
    assert "acc.value.call_one().get() = [1.0, 2.0, 3.0, 4.0]" in out and "remote_object OK" in out


def _check_monarch_remote_state(out: str) -> None:
    assert "final counter = 40" in out and "updater0: 20" in out and "updater1: 20" in out
    assert "remote_state OK" in out


def _check_monarch_parameter_server(out: str) -> None:
    _check_parameter_server(out)


MONARCH_CHECKS = {
    "remote_call": _check_monarch_remote_call,
    "remote_object": _check_monarch_remote_object,
    "remote_state": _check_monarch_remote_state,
    "shard_aggregate": lambda out: (
        (all(f"held by proc {r}" in out for r in range(3)) and "shard_aggregate OK" in out) or _fail(out)
    ),
    "parameter_server": _check_monarch_parameter_server,
}


def _fail(out: str) -> None:
    raise AssertionError(out[-2000:])
