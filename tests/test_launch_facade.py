"""The launch facade owns the job's story (issue 42, item 4): the config is read once, a dry run
is the facade's (a library caller gets it, typed), the SLURM and pod resolution is the facade's,
and the plan has one builder, for the first attempt, each restart and each elastic round.

Real files, real environment variables (``monkeypatch.setenv``: the very ``os.environ`` the
facade reads), the real CLI; no rank is started here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rich.console import Console as RichConsole
from typer.testing import CliRunner

from rpcctl.cli import app
from rpcctl.console import Console, set_console

_OPENED: list[str] = []  # the paths opened while a test watches (``_watch_opens``)
_WATCHING: list[bool] = []


def _audit(event: str, args: tuple) -> None:
    if _WATCHING and event == "open" and args and isinstance(args[0], (str, bytes, Path)):
        _OPENED.append(str(args[0]))


sys.addaudithook(_audit)  # an audit hook cannot be removed: it records only while a test watches


@pytest.fixture
def opens():
    """The paths this process opens while the test runs (Python's audit events: os.open, open)."""
    _OPENED.clear()
    _WATCHING.append(True)
    yield _OPENED
    _WATCHING.clear()


@pytest.fixture
def cli(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    set_console(Console(
        out=RichConsole(width=1000, no_color=True, highlight=False, force_terminal=False, soft_wrap=False),
        err=RichConsole(stderr=True, width=1000, no_color=True, highlight=False, force_terminal=False, soft_wrap=True),
    ))
    yield CliRunner(env={"CUDA_VISIBLE_DEVICES": ""})
    set_console(None)


def test_a_dry_run_in_a_pod_reads_the_config_once(cli, tmp_path, monkeypatch, opens):
    """An Indexed Job's pod (its completion index alone: a node rank only for a config of several
    nodes) asks the config for its nodes, its spec and where five keys came from: it was read 6
    times (a load for the node count, one for the spec, one per key the environment did not set)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    config = tmp_path / "job.yaml"
    config.write_text("script: train.py\nnproc_per_node: 1\nnnodes: 2\nmaster_addr: 127.0.0.1\nmaster_port: 29511\n")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    opens.clear()  # from here: what rpcctl opens
    result = cli.invoke(app, ["launch", str(config), "--dry-run", "--json", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, (result.output, result.exception)
    sources = {row["key"]: row["source"] for row in json.loads(result.stdout)["sources"]}
    assert sources["node_rank"] == "JOB_COMPLETION_INDEX=1" and sources["nnodes"] == f"{config}:3"
    assert opens.count(str(config)) == 1, opens
