"""The supervisor decides, others listen (``rpcctl.records.events``); runs are followed and stopped
through the facade (``rpcctl.launch.control``): who may know whom, the bus's promises, the live
view drawn from what it is told."""

from __future__ import annotations

import ast
import dataclasses
import io
import os
import subprocess
import sys
from pathlib import Path

import psutil
from rich.console import Console as RichConsole

import rpcctl
from rpcctl.launch import control
from rpcctl.console import Console
from rpcctl.records.events import Events, Notice, RankOutput, RunSaved
from rpcctl.records.runs import RankState, RunRecord, now_iso, save_record
from rpcctl.base.states import RankStatus, RunStatus

PACKAGE = Path(rpcctl.__file__).parent
CLI = [PACKAGE / "cli.py", *sorted((PACKAGE / "commands").glob("*.py"))]


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (under ``TYPE_CHECKING`` and in functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_live_view_and_the_supervisor_do_not_know_each_other():
    assert not {m for m in _imports(PACKAGE / "supervise" / "live.py") if m.startswith("rpcctl.supervise.supervisor")}
    assert not {
        m
        for m in _imports(PACKAGE / "supervise" / "supervisor.py")
        if m.startswith(("rpcctl.supervise.live", "rpcctl.console"))
    }


def test_the_cli_neither_signals_nor_polls_processes_nor_imports_the_supervisor():
    for path in CLI:
        imports = _imports(path)
        assert not {
            m
            for m in imports
            if m.startswith(("rpcctl.supervise.supervisor", "rpcctl.processes.procs", "psutil", "signal"))
        }, path
        calls = {
            node.func.attr
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        }
        assert not calls & {"send_signal", "kill", "terminate", "sleep"}, (
            path,
            calls & {"send_signal", "kill", "terminate", "sleep"},
        )


def test_only_the_console_sets_its_err():
    for path in PACKAGE.rglob("*.py"):
        if path.name == "console.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                else []
            )
            assert not any(isinstance(t, ast.Attribute) and t.attr == "err" for t in targets), (
                f"{path}:{node.lineno} sets .err"
            )


def test_a_failing_listener_neither_stops_the_publisher_nor_keeps_the_event_from_the_others(capfd):
    events = Events()
    heard: list[object] = []

    def broken(_event):
        raise ZeroDivisionError("a listener's bug")

    events.subscribe(broken)
    events.subscribe(heard.append)
    events.publish(Notice("first"))
    events.publish(RankOutput(0, "step 1", final=True, new=True))
    assert heard == [Notice("first"), RankOutput(0, "step 1", final=True, new=True)]
    err = capfd.readouterr().err
    assert err.count("a listener failed") == 2 and "ZeroDivisionError" in err


def _record(run_dir: Path, pid: int, started: float, status: RunStatus = RunStatus.RUNNING) -> RunRecord:
    return RunRecord(
        run_id=run_dir.name,
        name="job",
        status=status,
        run_dir=str(run_dir),
        config_path=None,
        script="train.py",
        world_size=2,
        nproc_per_node=2,
        start_method="fork",
        host="here",
        launcher_pid=pid,
        launcher_started=started,
        master_addr="127.0.0.1",
        master_port=29500,
        started_at=now_iso(),
        ranks=[RankState(rank=0, local_rank=0), RankState(rank=1, local_rank=1)],
    )


def test_the_live_view_draws_from_the_snapshots_and_lines_it_is_told(tmp_path):
    from rpcctl.supervise.live import LiveView

    buffer = io.StringIO()
    console = Console(out=RichConsole(file=buffer, width=150, no_color=True), err=RichConsole(file=io.StringIO()))
    record = _record(tmp_path / "run-1", os.getpid(), psutil.Process().create_time())
    view = LiveView(console, record)
    running = dataclasses.replace(
        record,
        ranks=[
            RankState(0, 0, pid=os.getpid(), state=RankStatus.RUNNING),
            RankState(1, 1, state=RankStatus.FAILED, exit_code=3),
        ],
    )
    view(RunSaved(running))  # the record it was made with says both ranks are pending
    for event in (
        RankOutput(0, "epoch 1 done", final=True, new=True),
        RankOutput(0, "train 3/10", final=False, new=True),
        RankOutput(1, "Traceback ends", final=True, new=True),
    ):
        view(event)
    console.print(view)
    rows = {
        line.split()[0]: line.split() for line in buffer.getvalue().splitlines() if line.split()[:1] in (["0"], ["1"])
    }
    assert rows["0"][1:3] == [str(os.getpid()), "running"] and rows["0"][-2:] == ["train", "3/10"], buffer.getvalue()
    assert rows["1"][1:4] == ["-", "failed", "cpu"] and rows["1"][-3:] == ["3", "Traceback", "ends"], buffer.getvalue()
    view(RankOutput(0, "train 10/10", final=True, new=True))  # the bar's last state ends its line
    assert view.latest_line(0) == "train 10/10"


def test_follow_ends_once_the_run_ended_or_its_launcher_is_gone(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(gone.pid).create_time()
    gone.wait()
    lost = tmp_path / "lost"
    lost.mkdir()
    save_record(_record(lost, gone.pid, started))
    assert list(control.follow(lost, every=0.01)) == [True]  # the record says running; nothing will end it now
    live = tmp_path / "live"
    live.mkdir()
    record = _record(live, os.getpid(), psutil.Process().create_time())
    save_record(record)
    rounds = control.follow(live, every=0.01)
    assert [next(rounds), next(rounds)] == [False, False]
    save_record(dataclasses.replace(record, status=RunStatus.SUCCEEDED, ended_at=now_iso()))
    assert list(rounds) == [True]
    assert list(control.follow(tmp_path / "removed", every=0.01)) == [True]
