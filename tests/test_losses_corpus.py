"""Losses from the logs real libraries print: the saved corpus (tests/data/losses/, made by
tests/corpus/generate.py from tiny real trainings) goes through the same path as a rank's output
(the pump's splitter, the telemetry server, the store, ``inspect.losses``) and must give what
the library itself recorded (its ``*.truth.json``). No library is needed to run these."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rpcctl import inspect
from rpcctl.base.lines import LineSplitter, final_lines
from rpcctl.telemetry.server import TelemetryServer

DATA = Path(__file__).resolve().parent / "data" / "losses"
CASES = sorted(json.loads((DATA / "cases.json").read_text()))


def load(case: str) -> tuple[bytes, list[dict]]:
    return (DATA / f"{case}.log").read_bytes(), json.loads((DATA / f"{case}.truth.json").read_text())


def through_the_server(tmp_path: Path, output: bytes, rank: int = 0) -> list[inspect.LossRecord]:
    """Feed ``output`` as the launcher would (each state the terminal drew, once) and read it back."""
    server = TelemetryServer(tmp_path / "run")
    server.start()
    try:
        splitter = LineSplitter()
        for piece in splitter.feed(output) + splitter.close():
            if piece.new:
                server.log_line(rank, piece.text)
    finally:
        server.close()
    return inspect.losses(tmp_path / "run")


def test_the_corpus_covers_every_library_the_issue_names():
    libraries = {lib for case in json.loads((DATA / "cases.json").read_text()).values() for lib in case["versions"]}
    assert {"transformers", "pytorch-lightning", "keras", "tqdm", "rich"} <= libraries
    assert {
        "torch_mnist",
        "torch_imagenet",
        "plain_epoch_steps",
        "plain_json",
        "lightning_rich",
        "lightning_tqdm",
    } <= set(CASES)


@pytest.mark.parametrize("case", ["hf_trainer_plain", "hf_trainer_tqdm"])
def test_hugging_face_trainer_dicts_with_quoted_numbers(tmp_path, case):
    output, truth = load(case)
    records = through_the_server(tmp_path, output)
    # Every logged step, none of the bar's redraws, not the run summary's mean train_loss.
    assert [r.loss for r in records] == pytest.approx([t["loss"] for t in truth], rel=1e-3)
    assert [r.metrics["epoch"] for r in records] == pytest.approx([t["epoch"] for t in truth])
    assert all({"grad_norm", "learning_rate"} <= set(r.metrics) for r in records)
    # The dicts print no step: the records are keyed by arrival, #1..#8 (the truth's steps 1..8).
    assert [r.where for r in records] == [f"#{t['step']}" for t in truth]
    assert {r.rule for r in records} == {"dict"}


@pytest.mark.parametrize("case", ["lightning_tqdm", "lightning_rich"])
def test_lightning_progress_bars(tmp_path, case):
    output, truth = load(case)
    records = through_the_server(tmp_path, output)
    assert all(r.keyed_by == inspect.BY_STEP and r.rule == "bar" for r in records)
    got = {(r.epoch, r.step): r.loss for r in records}
    expected = {(t["epoch"], t["step"]): t["loss"] for t in truth}
    if case == "lightning_tqdm":  # tqdm redraws at every batch: every step, its own value
        assert list(got) == list(expected)
    else:  # Rich draws one frame into a pipe, at the end: the last step
        assert list(got) == [list(expected)[-1]]
    for key, loss in got.items():
        assert loss == pytest.approx(expected[key], rel=5e-3), key  # the bar shows 3 significant digits


def test_keras_progress_bar_steps_and_epochs_as_keras_prints_them(tmp_path):
    output, truth = load("keras_fit")
    records = through_the_server(tmp_path, output)
    expected = {(t["epoch"], t["step"]): t for t in truth}
    # "Epoch 1/2" then "1/4 ━━ … loss: …" (first batch, 1-based), then "4/4 …" when the epoch ends.
    assert [(r.epoch, r.step) for r in records] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    for r in records:
        assert r.loss == pytest.approx(expected[(r.epoch, r.step)]["loss"], rel=1e-4)
        assert r.metrics["mae"] == pytest.approx(expected[(r.epoch, r.step)]["mae"], rel=1e-4)


@pytest.mark.parametrize("case", ["tqdm_stderr", "tqdm_stdout"])
def test_tqdm_set_postfix_every_update_and_a_readable_log(tmp_path, case):
    output, truth = load(case)
    records = through_the_server(tmp_path, output)
    by_step = {r.step: r.loss for r in records}
    # Each step's own value (tqdm redraws a step after set_postfix: the redraw replaces it), and
    # the final redraw at 60/60 with the last value.
    assert sorted(by_step) == list(range(len(truth) + 1))
    for t in truth:
        assert by_step[t["step"]] == pytest.approx(t["loss"], rel=5e-3), t  # 3 significant digits
    assert all(r.keyed_by == inspect.BY_STEP for r in records)
    # What `rpcctl logs` and the console show: the bar's last state, one line, not 120.
    assert len(final_lines(output)) == 1 and "60/60" in final_lines(output)[0]


@pytest.mark.parametrize("case", ["torch_mnist", "torch_imagenet", "plain_epoch_steps", "plain_json"])
def test_printed_steps_and_epochs(tmp_path, case):
    output, truth = load(case)
    records = through_the_server(tmp_path, output)
    assert [(r.epoch, r.step) for r in records] == [(t.get("epoch"), t["step"]) for t in truth]
    assert [r.loss for r in records] == pytest.approx([t["loss"] for t in truth], rel=1e-4)
    assert all(r.keyed_by == inspect.BY_STEP for r in records)
    if case == "plain_epoch_steps":  # steps restart every epoch: keyed by (epoch, step), acc a metric
        assert [r.metrics["acc"] for r in records] == pytest.approx([t["acc"] for t in truth])
    if case == "plain_json":
        assert all(r.metrics == {"lr": 0.05} for r in records)
    if case == "torch_imagenet":
        assert all(r.metrics["Acc@1"] == 50.0 for r in records)


def test_loss_only_prints_are_keyed_by_arrival(tmp_path):
    output, truth = load("plain_keyvalue")
    records = through_the_server(tmp_path, output)
    assert [r.loss for r in records] == pytest.approx([t["loss"] for t in truth])
    assert [r.where for r in records] == [f"#{i + 1}" for i in range(len(truth))]


@pytest.mark.parametrize("case", CASES)
def test_every_case_counts_the_lines_it_read_and_matched(tmp_path, case):
    output, _ = load(case)
    records = through_the_server(tmp_path, output)
    lines, matched = inspect.line_counts(tmp_path / "run")[0]
    states = [p for p in LineSplitter().feed(output) if p.new]
    assert lines >= len(states) and 0 < matched <= lines
    assert matched >= len(records)  # a redraw of the same step matched a line and replaced its record
