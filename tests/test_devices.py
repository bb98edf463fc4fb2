"""CUDA_VISIBLE_DEVICES is read one way everywhere (the plan, the in-rank probe, inspect gpus)."""

from __future__ import annotations

import pytest

from rpcctl.base.devices import parse_visible_devices


@pytest.mark.parametrize(
    ("value", "visible"),
    [
        (None, None),  # unset: every GPU
        ("", []),
        ("-1", []),
        ("0,2", ["0", "2"]),
        (" 1 , 0 ", ["1", "0"]),
        ("0,-1,1", ["0"]),  # CUDA stops at the first invalid entry
        ("1,x,2", ["1"]),
        ("GPU-8f6a2c3e-1b2c,MIG-4d5e", ["GPU-8f6a2c3e-1b2c", "MIG-4d5e"]),
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, visible):
    assert parse_visible_devices(value) == visible


def test_the_plan_the_probe_and_inspect_gpus_read_it_the_same_way(monkeypatch):
    import importlib

    from rpcctl.planning.plan import visible_gpus

    gpus = importlib.import_module("rpcctl.inspect.gpus")  # the module: rpcctl.inspect.gpus is also the view function

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,-1,2")
    assert visible_gpus() == ["3"]
    assert gpus._physical("cuda:0", gpus._visible("3,-1,2")) == "cuda:3"
    assert gpus._physical("cuda:1", gpus._visible("3,-1,2")) == "cuda:1"  # not visible: left as the process named it
