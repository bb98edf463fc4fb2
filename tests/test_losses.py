"""Losses end to end: the parser's rules and ``--explain``, real launched runs that print
epoch-local steps and ``\\r`` progress bars, every view keyed the same way (table, summary,
JSON, plot, live panel), a store written by an older rpcctl, and the real libraries run under
``rpcctl launch`` where they are installed."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import textwrap
from pathlib import Path

import pytest
from rich.console import Console as RichConsole

from rpcctl import inspect
from rpcctl.wire import protocol
from rpcctl.views.dashboard import dashboard_panels
from rpcctl.telemetry.losses import LossParser
from conftest import assert_no_process_left, launch_job, only_run, record, rpcctl, write_config
from terminal import CTRL_C, run_on_terminal, screen_text

pytestmark = pytest.mark.timeout(180)
CORPUS_SCRIPTS = Path(__file__).resolve().parent / "corpus" / "scripts"


# ---------------------------------------------------------------------------------------------
# The parser's rules


@pytest.mark.parametrize(
    "line, rule, loss, step, epoch, metrics",
    [
        ('{"step": 1, "loss": 1.0}', "dict", 1.0, 1, None, {}),
        ('{"epoch": 2, "global_step": 40, "train_loss": 0.5, "lr": 0.001}', "dict", 0.5, 40, 2, {"lr": 0.001}),
        (
            "{'loss': '1.0', 'grad_norm': '0.3', 'learning_rate': '5e-05', 'epoch': '0.25'}",
            "dict",
            1.0,
            None,
            None,
            {"grad_norm": 0.3, "learning_rate": 5e-05, "epoch": 0.25},
        ),
        ("Epoch 0:  75%|███████▌  | 3/4 [00:00<00:00, 25.00it/s, v_num=0, train_loss=0.330]", "bar", 0.33, 3, 0, {}),
        ("Epoch 1/1  ━━━━━━━━━━━━ 4/4 0:00:00 • 0:00:00 353.65it/s train_loss: 1.602", "bar", 1.602, 4, 1, {}),
        (
            "1/4 ━━━━━━━━━━━━━━━━━━━━ 0s 4ms/step - loss: 16.6221 - mae: 3.5156",
            "bar",
            16.6221,
            1,
            None,
            {"mae": 3.5156},
        ),
        (
            "train:  50%|█████     | 30/60 [00:00<00:00, 100.0it/s, loss=0.123, acc=0.5]",
            "bar",
            0.123,
            30,
            None,
            {"acc": 0.5},
        ),
        ("epoch 2 step 10 loss=0.52 acc=0.9", "text", 0.52, 10, 2, {"acc": 0.9}),
        ("Train Epoch: 1 [640/60000 (1%)]\tLoss: 2.300000", "text", 2.3, 640, 1, {}),
        (
            "Epoch: [0][ 3/8]\tLoss 6.9078e+00 (6.9078e+00)\tAcc@1  50.00 ( 48.12)",
            "text",
            6.9078,
            3,
            0,
            {"Acc@1": 50.0},
        ),
        ("Epoch 3: 0.52", "epoch", 0.52, None, 3, {}),
    ],
)
def test_each_rule_yields_loss_step_epoch_and_metrics(line, rule, loss, step, epoch, metrics):
    explained = LossParser().explain(line)
    assert explained.rule == rule, explained.reason
    assert (explained.parsed.loss, explained.parsed.step, explained.parsed.epoch, explained.parsed.metrics) == (
        loss,
        step,
        epoch,
        metrics,
    )


@pytest.mark.parametrize(
    "line, why",
    [
        ("{'train_runtime': '0.02', 'train_loss': '5.178', 'epoch': '1'}", "run summary"),
        ("{'eval_loss': '0.5', 'eval_runtime': '0.1'}", "without a training loss key"),
        ("Epoch 0:   0%|          | 0/4 [00:00<?, ?it/s]", "no training loss value"),
        ("epoch 3 done", "no training loss value"),
        ("hello", "no 'loss' or 'epoch'"),
    ],
)
def test_lines_that_yield_nothing_say_why(line, why):
    explained = LossParser().explain(line)
    assert explained.parsed is None and why in explained.reason


def test_an_epoch_header_dates_the_lines_after_it_and_a_bar_reset_is_not_a_step():
    parser = LossParser()
    assert parser.parse("Epoch 2/3") is None
    assert (parser.parse("4/4 ━━━━━━━━━━━━ 0s 2ms/step - loss: 2.2383").epoch, parser.epoch) == (2, 2)
    # Lightning draws the next epoch's bar at 0/N with the last value still on it.
    assert parser.parse("Epoch 1:   0%|          | 0/4 [00:00<?, ?it/s, train_loss=2.2383]") is None
    assert parser.parse("Epoch 1:  25%|██▌       | 1/4 [00:00<00:00, train_loss=1.5]").step == 1


def test_explain_on_the_command_line(tmp_path):
    lines = ["Epoch 2/3", "3/4 ━━━━━━━━━━━━ 0s 5ms/step - loss: 0.52 - acc: 0.9", "val_loss=0.3"]
    result = rpcctl("inspect", "losses", *(a for line in lines for a in ("--explain", line)))
    assert result.returncode == 0, result.stderr
    assert "an epoch header" in result.stdout
    assert "yields: loss 0.52, epoch 2, step 3, acc 0.9  (rule: bar)" in result.stdout
    assert "yields: nothing" in result.stdout
    document = json.loads(rpcctl("inspect", "losses", "--json", "--explain", "[bold]loss=1[/bold] {'x': 1}").stdout)
    assert document == [
        {
            "line": "[bold]loss=1[/bold] {'x': 1}",
            "rule": "dict",
            "matched": False,
            "loss": None,
            "epoch": None,
            "step": None,
            "metrics": {},
            "why": "a Python dict without a training loss key (loss, train_loss, training_loss, "
            "train/loss, train_loss_step)",
        }
    ]


# ---------------------------------------------------------------------------------------------
# Launched runs

EPOCH_STEPS = """
import sys
for epoch in range(3):
    for step in range(4):
        print(f"epoch {epoch} step {step} loss={1 + 10 * epoch + step} acc={0.1 * (epoch + 1):.1f}", flush=True)
print("done", flush=True)
"""

TQDM_LIKE = r"""
import sys
for stream in (sys.stderr, sys.stdout):  # tqdm draws on stderr by default; some point it at stdout
    for step in range(60):
        stream.write(f"\rtrain: {step + 1:3d}/60 [00:00<00:00, 99.0it/s, loss={2 - step / 60:.4f}]")
        stream.flush()
    stream.write("\n")
    stream.flush()
"""


def launch_script(tmp_path: Path, runs_dir: Path, source: str, name: str = "job", **keys) -> tuple:
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    config = write_config(tmp_path, script=str(script), name=name, **keys)
    result = rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live", timeout=120)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    assert result.returncode == 0, result.stderr + result.stdout
    return result, run_dir


def test_epoch_local_steps_are_keyed_by_epoch_and_step_everywhere(tmp_path, runs_dir):
    _, run_dir = launch_script(tmp_path, runs_dir, EPOCH_STEPS, name="epochs")
    records = inspect.losses(run_dir)
    assert [(r.epoch, r.step, r.loss) for r in records] == [(e, s, 1 + 10 * e + s) for e in range(3) for s in range(4)]
    assert {r.keyed_by for r in records} == {inspect.BY_STEP}

    table = rpcctl("inspect", "losses", "--runs-dir", str(runs_dir), "--last", "5", env=_columns(200)).stdout
    grid = table[table.index("Last 5 steps") : table.index("Per rank")].splitlines()
    assert grid[1].split() == ["EPOCH", "STEP", "RANK", "0"]
    assert [row.split() for row in grid[2:7]] == [
        ["1", "3", "14"],
        ["2", "0", "21"],
        ["2", "1", "22"],
        ["2", "2", "23"],
        ["2", "3", "24"],
    ]
    # LAST agrees with the grid's last row, and says where it is; 12 of 13 printed lines matched.
    summary = table[table.index("Per rank") :].splitlines()[2].split()
    assert summary[:9] == ["0", "12", "1", "1", "epoch", "0", "step", "0", "24"] and summary[9:13] == [
        "epoch",
        "2",
        "step",
        "3",
    ]
    assert summary[13] == "12/13"

    document = json.loads(rpcctl("inspect", "losses", "--runs-dir", str(runs_dir), "--json").stdout)
    assert [(d["epoch"], d["step"], d["seq"], d["keyed_by"], d["rule"]) for d in document][-1] == (
        2,
        3,
        11,
        "step",
        "text",
    )
    summaries = json.loads(rpcctl("inspect", "losses", "--runs-dir", str(runs_dir), "--json", "--summary").stdout)
    assert [(s["rank"], s["count"], s["last"], s["last_at"], s["lines"], s["matched"]) for s in summaries] == [
        (0, 12, 24.0, "epoch 2 step 3", 13, 12)
    ]

    metric = rpcctl(
        "inspect", "losses", "--runs-dir", str(runs_dir), "--metric", "acc", "--last", "1", env=_columns(200)
    ).stdout
    assert "Last 1 steps: acc" in metric and "0.3" in metric.splitlines()[2]
    bad = rpcctl("inspect", "losses", "--runs-dir", str(runs_dir), "--metric", "nope")
    assert bad.returncode == 2 and "--metric nope: no record" in bad.stderr and "metrics: acc" in bad.stderr

    # The live view's panel ends on the same record.
    console = RichConsole(width=120, no_color=True, record=True, file=io.StringIO())
    for panel in dashboard_panels(run_dir):
        console.print(panel)
    losses_panel = console.export_text()
    # Its columns in inspect losses' order: RANK, LAST, LAST AT, then the trend.
    assert losses_panel.splitlines()[-1].split()[:6] == ["0", "24", "epoch", "2", "step", "3"]


def _columns(width: int) -> dict[str, str]:
    return {**os.environ, "COLUMNS": str(width)}


def test_a_progress_bar_under_launch_every_update_captured_and_readable_output(tmp_path, runs_dir):
    result, run_dir = launch_script(tmp_path, runs_dir, TQDM_LIKE, name="bar")
    # The console shows each bar's last state: one line per bar, not 60, not the \r history.
    bar_lines = [line for line in result.stdout.splitlines() if "train:" in line]
    assert bar_lines == ["[rank0]: train:  60/60 [00:00<00:00, 99.0it/s, loss=1.0167]"] * 2, result.stdout
    logs = rpcctl("logs", "--runs-dir", str(runs_dir)).stdout.splitlines()
    assert logs == ["[rank0]: train:  60/60 [00:00<00:00, 99.0it/s, loss=1.0167]"] * 2
    # The log file keeps every byte.
    assert (run_dir / "logs" / "rank-0.log").read_bytes().count(b"\r") == 120
    # Every update's loss, both bars: steps 1..60 twice, so by arrival (steps repeat).
    records = inspect.losses(run_dir)
    assert [(r.step, r.loss) for r in records] == [(s + 1, round(2 - s / 60, 4)) for s in range(60)] * 2
    assert {r.keyed_by for r in records} == {inspect.BY_ARRIVAL}


BAR_THEN_WAIT = r"""
import sys, time
for step in range(1, 8):
    sys.stderr.write(f"\rtrain {step}/10 loss={1 / step:.4f}")
    sys.stderr.flush()
    time.sleep(0.05)
time.sleep(120)  # stuck mid-bar: no newline ever comes
"""


def test_the_live_view_shows_a_bars_latest_state_and_the_console_its_last(tmp_path, runs_dir):
    script = tmp_path / "bar.py"
    script.write_text(BAR_THEN_WAIT)
    config = write_config(tmp_path, name="barred", script=str(script))
    pressed = []

    def press_ctrl_c_once_the_panel_shows_the_bar(output: bytes, _pid: int) -> bytes | None:
        # The rank's unfinished line is never echoed: only the panel can have drawn this.
        if not pressed and b"train 7/10 loss=0.1429" in output:
            pressed.append(True)
            return CTRL_C
        return None

    rc, output = run_on_terminal(
        ["launch", str(config), "--runs-dir", str(runs_dir)], press_ctrl_c_once_the_panel_shows_the_bar, timeout=60
    )
    screen = screen_text(output)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    assert pressed, f"the panel never showed the bar's latest state:\n{screen}"
    assert rc == 130 and record(run_dir)["status"] == "cancelled", screen
    # The bar's history never scrolled by: its last state is printed once, when the pipe closed.
    assert output.count(b"[rank0]: train") == 1 and "[rank0]: train 7/10 loss=0.1429" in screen, screen
    assert [r.step for r in inspect.losses(run_dir)] == list(range(1, 8))


def test_plot_integer_steps_log_scale_metric_and_title_and_no_blank_picture(tmp_path, runs_dir):
    pytest.importorskip("matplotlib", reason="pip install 'rpcctl[plot]'")
    _, run_dir = launch_script(tmp_path, runs_dir, EPOCH_STEPS, name="plotted")
    png = tmp_path / "acc.png"
    result = rpcctl(
        "inspect", "losses", "--runs-dir", str(runs_dir), "--plot", str(png), "--metric", "acc", "--log", "--summary"
    )
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # No losses: said so, exit 1, no file.
    empty_runs = tmp_path / "empty-runs"
    _, empty = launch_script(tmp_path, empty_runs, "print('no losses here')\n", name="quiet")
    blank = tmp_path / "blank.png"
    result = rpcctl("inspect", "losses", "--runs-dir", str(empty_runs), "--plot", str(blank))
    assert result.returncode == 1 and "no loss values to plot" in result.stderr and not blank.exists()
    text = rpcctl("inspect", "losses", "--runs-dir", str(empty_runs)).stdout
    assert "no losses were recorded (1 printed lines read, none matched)" in text  # the run ended: none will come


def test_the_plot_uses_the_chart_a_person_would_read(tmp_path, runs_dir):
    matplotlib = pytest.importorskip("matplotlib", reason="pip install 'rpcctl[plot]'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, run_dir = launch_script(tmp_path, runs_dir, EPOCH_STEPS, name="chart")
    captured = {}
    real_close = plt.close

    def keep(figure=None):  # look at the figure before it is closed
        if figure is not None:
            captured["axes"] = figure.axes[0]
        real_close(figure)

    plt.close = keep
    try:
        inspect.plot_losses(inspect.losses(run_dir), tmp_path / "l.png", title="chart  (run)", log_scale=True)
    finally:
        plt.close = real_close
    axes = captured["axes"]
    assert axes.get_title() == "chart  (run)" and axes.get_yscale() == "log"
    assert axes.get_xlabel().startswith("record, in arrival order")  # steps restart every epoch
    assert list(axes.lines[0].get_xdata()) == list(range(1, 13))
    assert all(float(t).is_integer() for t in axes.get_xticks())


# ---------------------------------------------------------------------------------------------
# A store written before version 4


def test_a_store_from_an_older_rpcctl_still_reads(tmp_path):
    run_dir = tmp_path / "old-run"
    run_dir.mkdir()
    db = sqlite3.connect(protocol.db_path(run_dir))
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
        "CREATE TABLE ranks (rank INTEGER, restart INTEGER, pid INTEGER, local_rank INTEGER, device TEXT, state TEXT,"
        " exit_code INTEGER, started_at REAL, ended_at REAL);"
        "CREATE TABLE procs (proc_id INTEGER PRIMARY KEY, restart INTEGER);"
        "CREATE TABLE losses (id INTEGER PRIMARY KEY, rank INTEGER, restart INTEGER, step INTEGER, epoch INTEGER,"
        " loss REAL, metrics TEXT, time REAL, source TEXT);"
        "INSERT INTO meta VALUES ('schema_version', '2');"
        "INSERT INTO losses (rank, restart, step, epoch, loss, time, source) VALUES (0, 0, 0, NULL, 1.0, 1, 'log'),"
        " (0, 0, 1, NULL, 0.5, 2, 'log'), (0, 0, 0, NULL, 0.4, 3, 'log');"
    )
    db.commit()
    db.close()
    records = inspect.losses(run_dir)
    assert [(r.seq, r.step, r.loss, r.keyed_by, r.rule) for r in records] == [
        (0, 0, 1.0, "arrival", None),
        (1, 1, 0.5, "arrival", None),
        (2, 0, 0.4, "arrival", None),
    ]
    assert inspect.line_counts(run_dir) == {}
    assert [s.lines_matched for s in inspect.loss_summaries(records, inspect.line_counts(run_dir))] == [None]


# ---------------------------------------------------------------------------------------------
# The real libraries under rpcctl launch (where installed: CI installs rpcctl[corpus]) whose
# losses are read from their prints. The Hugging Face Trainer and Lightning report through
# rpcctl's callbacks under launch instead: tests/test_library_steps.py runs them.


LIBRARY_CASES = {
    "keras": ("keras_fit.py", []),
    "tqdm": ("tqdm_postfix.py", ["--steps", "30"]),
}


@pytest.mark.parametrize("module", list(LIBRARY_CASES))
def test_a_real_library_run_under_launch(tmp_path, runs_dir, module, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")  # Keras 3 imports tensorflow unless told otherwise
    pytest.importorskip(module, reason="pip install -c constraints.txt -e '.[corpus]'")
    script, args = LIBRARY_CASES[module]
    truth = tmp_path / "truth.json"
    env_keys = {"env": {"CORPUS_TRUTH": str(truth), "KERAS_BACKEND": "torch", "PYTHONPATH": str(CORPUS_SCRIPTS)}}
    config = write_config(tmp_path, script=str(CORPUS_SCRIPTS / script), args=args, name=module, preload=[], **env_keys)
    result = rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live", timeout=170, cwd=tmp_path)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    expected = json.loads(truth.read_text())
    records = inspect.losses(run_dir)
    assert records, result.stdout[-3000:]
    if module == "keras":  # the bar is drawn at the first and the last batch of each epoch
        by_key = {(t["epoch"], t["step"]): t["loss"] for t in expected}
        assert [(r.epoch, r.step) for r in records] == [(1, 1), (1, 4), (2, 1), (2, 4)]
        assert [r.loss for r in records] == pytest.approx([by_key[(r.epoch, r.step)] for r in records], rel=1e-4)
    else:
        by_key = {(t.get("epoch"), t["step"]): t["loss"] for t in expected}
        got = {(r.epoch, r.step): r.loss for r in records if (r.epoch, r.step) in by_key}
        assert list(got) == list(by_key)
        assert list(got.values()) == pytest.approx(list(by_key.values()), rel=5e-3)


def test_matched_of_a_rank_whose_losses_were_reported_says_where_they_came_from(tmp_path, runs_dir):
    """A rank whose losses came from rpcctl.report() (or a library's callback) needs no printed line
    to match: MATCHED says where its losses came from (`from report`), not `0/6`, which read as the
    parser failing on a correct run (issue 40, item 7: Lightning's `5/26`)."""
    script = tmp_path / "reported.py"
    script.write_text(
        textwrap.dedent("""
        import rpcctl
        for step in range(1, 6):
            rpcctl.report(step=step, loss=1.0 / step)
            print(f"step {step} done")
        print("step 5 loss=0.2")  # printed too: ignored, never counted twice
    """)
    )
    result, run_dir, _ = launch_job(tmp_path, runs_dir, script=str(script))
    assert result.returncode == 0, result.stderr
    shown = rpcctl("inspect", "losses", str(run_dir), "--summary")
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.strip().startswith("0 "))
    assert "from report" in row and "/6" not in row, shown.stdout
    (summary,) = json.loads(rpcctl("inspect", "losses", str(run_dir), "--summary", "--json").stdout)
    assert (summary["count"], summary["last"], summary["source"]) == (5, 0.2, "report"), summary
