"""The launch facade owns the job's story (issue 42, item 4): the config is read once, a dry run
is the facade's (a library caller gets it, typed), the SLURM and pod resolution is the facade's,
and the plan has one builder, for the first attempt, each restart and each elastic round.

Real files, real environment variables (``monkeypatch.setenv``: the very ``os.environ`` the
facade reads), the real CLI; no rank is started here."""

from __future__ import annotations

import json
import shutil
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
    set_console(
        Console(
            out=RichConsole(width=1000, no_color=True, highlight=False, force_terminal=False, soft_wrap=False),
            err=RichConsole(
                stderr=True, width=1000, no_color=True, highlight=False, force_terminal=False, soft_wrap=True
            ),
        )
    )
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


@pytest.fixture
def srun_step(tmp_path, monkeypatch):
    """This process as node 1 of a two-node srun step (real variables; scontrol, with a slurm.conf
    of its own, expands the nodelist: no daemon is asked)."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed (apt-get install slurm-client)")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=rpcctltest\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=ALL\n"
    )
    for name, value in {
        "SLURM_CONF": str(conf),
        "SLURM_STEP_ID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_JOB_ID": "77",
    }.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def library_config(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    config = tmp_path / "job.yaml"
    config.write_text("script: train.py\nnproc_per_node: 2\nmaster_port: 29512\n")
    return config


def test_a_library_caller_in_an_srun_step_gets_slurms_node_values(srun_step, library_config):
    """``rpcctl.launch.job_from_config`` reads the step as ``rpcctl launch`` does: the node count,
    this node's rank and the head host, each with the variable that gave it."""
    from rpcctl.launch import job_from_config

    job = job_from_config(library_config)
    assert (job.spec.nnodes, job.spec.node_rank, job.spec.master_addr) == (2, 1, "localhost")
    assert job.scheduler.scheduler == "slurm"
    assert job.locate("node_rank") == "SLURM_NODEID=1" and job.locate("master_port") == f"{library_config}:3"


_PER_RUN = (
    "RPCCTL_RUN_ID",
    "RPCCTL_RUN_DIR",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "RPCCTL_ERROR_FILE",
    "RPCCTL_STACK_FILE",
)


def _contract(env: dict) -> dict:
    return {k: v for k, v in env.items() if k not in _PER_RUN}


def test_a_library_callers_dry_run_in_an_srun_step_is_the_clis(srun_step, library_config, cli, tmp_path):
    """``rpcctl.launch.dry_run``, with no CLI: node 1 of 2 plans ranks 2 and 3 of 4 with the head
    host as master and says SLURM gave it; ``rpcctl launch --dry-run --json`` renders the same."""
    from rpcctl.launch import dry_run, job_from_config

    described = dry_run(job_from_config(library_config), tmp_path / "runs")
    assert [(r.rank, r.local_rank, r.node_rank) for r in described.ranks] == [(2, 0, 1), (3, 1, 1)]
    assert all(
        r.env["WORLD_SIZE"] == "4" and r.env["GROUP_RANK"] == "1" and r.env["MASTER_ADDR"] == "127.0.0.1"
        for r in described.ranks
    )
    assert described.ranks[0].command[-1] == str(library_config.parent / "train.py")
    assert (described.scheduler.scheduler, described.nnodes, described.node_rank) == ("slurm", 2, 1)
    sources = {row["key"]: row["source"] for row in described.sources}
    assert sources["node_rank"] == "SLURM_NODEID=1" and sources["master_addr"] == "SLURM_JOB_NODELIST=localhost"
    result = cli.invoke(
        app, ["launch", str(library_config), "--dry-run", "--json", "--runs-dir", str(tmp_path / "runs")]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    shown = json.loads(result.stdout)
    mine = described.to_dict()
    assert shown["sources"] == mine["sources"]
    assert [(r["argv"], _contract(r["env"]), r["device"]) for r in shown["ranks"]] == [
        (r["argv"], _contract(r["env"]), r["device"]) for r in mine["ranks"]
    ]


def test_every_plan_is_made_by_plan_attempt():
    """The plan has one builder: the launcher's first attempt, the supervisor's restarts and the
    elastic rounds all call ``planning.plan.plan_attempt``; only it calls ``build_plan`` (the
    supervisor rebuilt a restart's plan itself, and the elastic round its own)."""
    import ast

    root = Path(__file__).resolve().parent.parent / "rpcctl"
    callers = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for call in ast.walk(fn):
                    if (
                        isinstance(call, ast.Call)
                        and getattr(call.func, "id", getattr(call.func, "attr", None)) == "build_plan"
                    ):
                        callers.append(f"{path.relative_to(root)}:{fn.name}")
    assert sorted(set(callers)) == ["planning/plan.py:plan_attempt"], callers


def test_a_restart_and_a_round_are_the_first_plan_moved(library_config, tmp_path):
    """``plan_attempt``: a restart changes the port and the restart count only; an elastic round
    the node count, this node's rank and where the ranks meet."""
    from rpcctl.config import load_config
    from rpcctl.planning.plan import Place, plan_attempt, probe_node

    spec = load_config(library_config)
    facts = probe_node(spec)
    first = plan_attempt(spec, facts, run_id="r", run_dir=tmp_path / "r")
    again = plan_attempt(spec, facts, run_id="r", run_dir=tmp_path / "r", restart=1, master_port=facts.master_port + 1)
    changed = {k for a, b in zip(first.ranks, again.ranks) for k in a.env if a.env[k] != b.env[k]}
    assert changed == {"MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "RPCCTL_RESTART"} and again.restart == 1
    rnd = plan_attempt(
        spec, facts, run_id="r", run_dir=tmp_path / "r", restart=2, place=Place(3, 2, "127.0.0.1", 29600)
    )
    assert [r.rank for r in rnd.ranks] == [4, 5] and rnd.world_size == 6 and rnd.master_port == 29600
    assert rnd.ranks[0].env["GROUP_RANK"] == "2" and rnd.ranks[0].env["GROUP_WORLD_SIZE"] == "3"


def test_a_library_launch_of_a_job_names_the_line_of_a_key_refused_before_spawn(tmp_path, monkeypatch):
    """``launch(job)``: a GPU the node does not have is refused before anything starts, at the
    config's line (``launch(spec)`` cannot say where the key was set)."""
    from rpcctl.base.errors import ConfigError
    from rpcctl.launch import job_from_config, launch

    (tmp_path / "train.py").write_text("print('hi')\n")
    config = tmp_path / "job.yaml"
    config.write_text("script: train.py\nnproc_per_node: 1\ndevices: [7]\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever this machine has
    with pytest.raises(ConfigError) as refused:
        launch(job_from_config(config), runs_dir=tmp_path / "runs", echo=False)
    assert refused.value.where == f"{config}:3" and refused.value.key == "devices.0"
    assert not (tmp_path / "runs").exists()
