"""GPU placement with real GPUs. Skipped on machines without one (CI has none); run on a GPU
machine to check what the plan promises: `devices: auto` gives each rank one GPU, seen as
cuda:0 through CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import pytest
from conftest import assert_no_process_left, only_run, rpcctl, write_config

from rpcctl.planning.plan import visible_gpus

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not visible_gpus(), reason="no GPU on this machine"),
]


def test_auto_gives_each_rank_its_own_gpu(tmp_path, runs_dir):
    gpus = visible_gpus()
    nproc = min(2, len(gpus))
    script = tmp_path / "gpu.py"
    script.write_text(
        "import os, torch\n"
        "x = torch.ones(1024, device='cuda')\n"
        "print('GPU', os.environ['RANK'], os.environ['CUDA_VISIBLE_DEVICES'],"
        " torch.cuda.device_count(), x.sum().item())\n"
    )
    config = write_config(tmp_path, script=str(script), nproc_per_node=nproc, devices="auto", preload=["torch"])
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir), timeout=170)
    assert_no_process_left(only_run(runs_dir))
    assert result.returncode == 0, result.stderr
    for rank in range(nproc):
        assert f"GPU {rank} {gpus[rank]} 1 1024.0" in result.stdout
