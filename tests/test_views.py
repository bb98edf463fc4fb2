"""One view list serves every surface (issue 42, item 3): a view added in this test alone (a
reader, a record, one entry in ``inspect.VIEWS``) is ``rpcctl inspect NAME`` (table and
``--json``), a section of ``rpcctl report``'s page and of the live page's JSON, under its one
name, over a real run's files."""

from __future__ import annotations

import http.client
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console as RichConsole
from typer.testing import CliRunner

from conftest import launch_job
from rpcctl import inspect
from rpcctl.cli import app
from rpcctl.console import KEY, Column, Console, set_console

pytestmark = pytest.mark.timeout(60)


@dataclass
class ToyRecord:
    rank: int
    pid: int | None
    toy: str

    COLUMNS = (Column("rank", priority=KEY), Column("pid"), Column("toy", "TOY SAYS"))


def toys(run_dir: Path) -> list[ToyRecord]:
    """The toy view's reader: one record per rank attempt the store has (a real read)."""
    return [ToyRecord(a.rank, a.pid, f"toy of rank {a.rank} <b>") for a in inspect.rank_attempts(run_dir)]


TOY = inspect.View("toyview", ToyRecord, toys, "Toy things")


@pytest.fixture(scope="module")
def a_run(tmp_path_factory) -> Path:
    tmp_path = tmp_path_factory.mktemp("views")
    result, run_dir, _ = launch_job(tmp_path, tmp_path / "runs", nproc_per_node=2)
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.fixture
def toy_view():
    inspect.VIEWS.append(TOY)
    try:
        yield TOY
    finally:
        inspect.VIEWS.remove(TOY)


@pytest.fixture
def cli():
    set_console(
        Console(
            out=RichConsole(width=200, no_color=True, highlight=False, force_terminal=False, soft_wrap=False),
            err=RichConsole(stderr=True, width=200, no_color=True, highlight=False, force_terminal=False),
        )
    )
    runner = CliRunner()
    yield lambda *args: runner.invoke(app, list(args), catch_exceptions=False)
    set_console(None)


def test_a_new_view_is_an_inspect_command_with_its_table_and_json(a_run, toy_view, cli):
    result = cli("inspect", "toyview", str(a_run), "--json")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    document = json.loads(result.stdout)
    assert [(d["rank"], d["toy"]) for d in document] == [(0, "toy of rank 0 <b>"), (1, "toy of rank 1 <b>")]
    assert all(isinstance(d["pid"], int) for d in document)
    table = cli("inspect", "toyview", str(a_run))
    assert table.exit_code == 0 and "TOY SAYS" in table.stdout and "toy of rank 1" in table.stdout, table.stdout
    assert "toyview" in cli("inspect", "--help").stdout


def test_a_new_view_is_a_section_of_the_report(a_run, toy_view, cli, tmp_path):
    pytest.importorskip("plotly", reason="needs plotly: pip install -c constraints.txt -e '.[test]'")
    out = tmp_path / "report.html"
    result = cli("report", str(a_run), "-o", str(out))
    assert result.exit_code == 0, (result.stdout, result.stderr)
    html = out.read_text()
    assert '<section id="sec-toyview"><h2>Toy things</h2>' in html and '<a href="#sec-toyview">Toy things</a>' in html
    view = json.loads(
        re.search(r'<script type="application/json" id="rpcctl-view">(.*?)</script>', html, re.S).group(1)
    )
    section = view["html"]["toyview"]
    # escaped: text from a reader is data
    assert "TOY SAYS" in section and "toy of rank 0 &lt;b&gt;" in section and "<b>" not in section


def test_a_new_view_is_in_the_live_pages_json(a_run, toy_view):
    pytest.importorskip("plotly", reason="needs plotly: pip install -c constraints.txt -e '.[test]'")
    from rpcctl.web.server import LiveServer

    live = LiveServer(a_run).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=10)
        conn.request("GET", f"/api/view?token={live.token}")
        response = conn.getresponse()
        body = response.read()
        conn.close()
    finally:
        live.stop()
    assert response.status == 200, body[:200]
    section = json.loads(body)["html"]["toyview"]
    assert "toy of rank 1 &lt;b&gt;" in section
