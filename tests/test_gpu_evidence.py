"""GPU evidence in a hang verdict (issue 41, item 5) on a real NVIDIA GPU: nvidia-smi's view of
each GPU, read without CUDA in the reader. Skips without a GPU; scripts/gpu_check.sh runs it
with every other GPU path (the verdict of an NCCL hang with its GPU lines included)."""

from __future__ import annotations

import shutil

import pytest

from rpcctl.base import gpu_now

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (nvidia-smi)"),
]


def test_each_gpu_is_read_with_its_memory_and_use_without_cuda():
    import sys

    gpus = gpu_now.snapshot()
    assert gpus, "nvidia-smi answered nothing"
    for gpu in gpus:
        assert gpu.memory_total_bytes and gpu.memory_total_bytes > 2**30 and gpu.uuid.startswith("GPU-"), gpu
        assert gpu.memory_used_bytes is not None and gpu.utilization_pct is not None, gpu
        assert gpu.describe().startswith(f"GPU {gpu.index} ("), gpu.describe()
    assert "torch" not in sys.modules or not sys.modules["torch"].cuda.is_initialized()  # nothing here made a context
