"""Losses at the training library's own global step (``rpcctl.rank.steps``): a real Hugging
Face Trainer and a real Lightning run under rpcctl, the script unchanged, with gradient
accumulation and a logging interval (tests/workers/library_steps.py). Needs the libraries (the
corpus extra); each test skips without its library."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import WORKERS, assert_no_process_left, only_run, rpcctl, write_config

from rpcctl import inspect

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "library, module, source", [("hf", "transformers", "transformers"), ("lightning", "pytorch_lightning", "lightning")]
)
def test_losses_arrive_at_the_librarys_global_step_and_once(library, module, source, tmp_path, runs_dir):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: pip install -c constraints.txt -e '.[test,corpus]' to run this test")
    truth_file = tmp_path / "truth.json"
    config = write_config(
        tmp_path, name=library, script=str(WORKERS / "library_steps.py"), args=[library, str(truth_file)]
    )
    # the libraries take seconds to import
    result = rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live", timeout=100)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "not read from the trainer" not in result.stderr
    truth = json.loads(truth_file.read_text())  # what the library recorded: HF's global steps 2, 4, 6; the steps
    # Lightning's own CSVLogger wrote, 1, 3, 5 (its step counts optimizer steps before this one: issue 40, item 6)
    assert [t["step"] for t in truth] == ([2, 4, 6] if library == "hf" else [1, 3, 5])
    records = inspect.losses(run_dir)
    # Each logged optimizer step once, at its global step, with the library's value; the
    # records are keyed by that step (no epoch: it is global).
    assert [(r.rank, r.step, r.epoch, r.source) for r in records] == [(0, t["step"], None, source) for t in truth]
    assert [r.loss for r in records] == pytest.approx([t["loss"] for t in truth], rel=1e-5)
    assert all(r.keyed_by == inspect.BY_STEP for r in records)
    assert "epoch" in records[-1].metrics
    # The library's printed losses were read too (the fallback), and are not counted again.
    lines, matched = inspect.line_counts(run_dir)[0]
    assert matched >= 1, result.stdout
