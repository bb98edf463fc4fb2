"""Live views on a real terminal: the panel of `rpcctl launch` and `rpcctl inspect --watch`.

Each runs on a pseudo-terminal (tests/terminal.py): Ctrl-C is the byte a keyboard sends, and
what was drawn is read back through a terminal emulator as the final screen.
"""

from __future__ import annotations

import time

import pytest

from rpcctl import inspect
from conftest import assert_no_process_left, only_run, record, start_rpcctl, wait_until, write_config
from terminal import CTRL_C, run_on_terminal, screen_text

pytestmark = pytest.mark.timeout(90)

LOOP = """
import itertools, os, sys, time
rank = int(os.environ["RANK"])
steps = range(int(sys.argv[1])) if len(sys.argv) > 1 else itertools.count()
# Rank 1's lines carry text that is Rich markup, to be shown as it is, never interpreted.
suffix = " [/] [red]" if rank == 1 else ""
for step in steps:
    print(f"step {step} loss {1.0 / (step + 1) + rank:.4f}{suffix}", flush=True)
    time.sleep(0.3)
"""


def test_ctrl_c_on_the_live_view_stops_the_job_and_leaves_one_final_panel(tmp_path, runs_dir):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    config = write_config(tmp_path, name="looping", script=str(script), nproc_per_node=2)
    pressed = []

    def press_ctrl_c_once_both_ranks_print(output: bytes, _pid: int) -> bytes | None:
        if not pressed and b"[rank0]: step 2 " in output and b"[rank1]: step 2 " in output:
            pressed.append(time.monotonic())
            return CTRL_C
        return None

    rc, output = run_on_terminal(
        ["launch", str(config), "--runs-dir", str(runs_dir)], press_ctrl_c_once_both_ranks_print, timeout=60
    )
    screen = screen_text(output)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    assert pressed, f"the ranks' lines never showed:\n{screen}"
    assert rc == 130, screen
    assert record(run_dir)["status"] == "cancelled"

    lines = screen.splitlines()
    run_id = record(run_dir)["run_id"]
    # The panel is redrawn in place while the job runs; what stays is one final panel,
    # under the ranks' output, with the stop message above or below it but never inside.
    titles = [i for i, line in enumerate(lines) if line.startswith("looping") and run_id in line]
    assert len(titles) == 1, screen
    header = lines[titles[0] + 1].split()
    assert header[:5] == ["RANK", "PID", "STATE", "DEVICE", "EXIT"], screen
    rank0, rank1 = (line.split() for line in lines[titles[0] + 2 : titles[0] + 4])
    assert rank0[:3] == ["0", str(record(run_dir)["ranks"][0]["pid"]), "killed"], screen
    assert rank1[:3] == ["1", str(record(run_dir)["ranks"][1]["pid"]), "killed"], screen
    assert rank1[-2:] == ["[/]", "[red]"], screen
    assert sum("stopping the job" in line for line in lines) == 1, screen
    assert "[rank0]: step 1 loss 0.5000" in lines and "[rank1]: step 1 loss 1.5000 [/] [red]" in lines, screen


def test_inspect_watch_follows_a_running_job_and_exits_when_it_ends(tmp_path, runs_dir):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    config = write_config(tmp_path, name="counting", script=str(script), args=["20"], nproc_per_node=2)
    launcher = start_rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir))
    try:
        run_dir = only_run(runs_dir)
        wait_until(lambda: inspect.losses(run_dir), 30, "the first loss")
        rc, output = run_on_terminal(
            ["inspect", "losses", run_dir.name, "--watch", "--runs-dir", str(runs_dir)], lambda *_: None, timeout=60
        )
        assert launcher.wait(timeout=30) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    screen = screen_text(output)
    assert rc == 0, screen
    assert_no_process_left(run_dir)
    # It redrew while the job ran (one render per second; the job runs ~6 s)...
    assert output.count(b"Per rank") >= 3, screen
    # ...and the screen it leaves is the finished run's: all 20 steps of both ranks.
    per_rank = screen[screen.index("Per rank") :].splitlines()[2:4]
    # RANK N FIRST MIN AT LAST AT: the count, then LAST and where it is.
    assert [row.split()[:2] + row.split()[6:9] for row in per_rank] == [
        ["0", "20", "0.05", "step", "19"],
        ["1", "20", "1.05", "step", "19"],
    ], screen
