"""``rpcctl.planning.plan.build_plan``: JobSpec + node facts → LaunchPlan (the torchrun env contract).

``build_plan`` takes the node's facts as an argument, so these tests hand it ``NodeFacts``
made up on the spot: that is injection of the facts the planner is defined over, not a mock of
anything. Where the facts list GPUs, the GPUs are invented: no GPU, driver or CUDA is needed or
touched. The CLI tests at the bottom go through the real ``probe_node`` with
``CUDA_VISIBLE_DEVICES=""`` so that the machine's GPUs (if any) do not change the result.

Nothing here spawns a process or creates a run directory.
"""

from __future__ import annotations

from dataclasses import replace

import json
import os
import socket
import sys
from pathlib import Path

import pytest
from rich.console import Console as RichConsole
from typer.testing import CliRunner

from rpcctl.cli import app
from rpcctl.commands import launch as launch_cmd
from rpcctl.config import DEFAULT_PRELOAD, JobSpec, load_config
from rpcctl.console import Console, set_console
from rpcctl.base.errors import ConfigError
from rpcctl.planning.plan import LaunchPlan, NodeFacts, build_plan

LOOPBACK_IF = "lo-test0"  # a made-up interface name, so we can see it is passed through
PORT = 29555
RUN_ID = "job-20240101-000000-abcd"


def facts(gpus: tuple[str, ...] = ()) -> NodeFacts:
    # Injected node facts (hand-made, not probed). `gpus` fakes the visible GPU ids.
    return NodeFacts(hostname="node-a", socket_ifname=LOOPBACK_IF, gpus=gpus, master_port=PORT, launcher_pid=4242)


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return tmp_path / "runs" / RUN_ID


@pytest.fixture(autouse=True)
def _no_omp(monkeypatch):
    # build_plan reads os.environ for OMP_NUM_THREADS (as torchrun does); start from "unset".
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.fixture
def spec(script):
    def _spec(**fields) -> JobSpec:
        return JobSpec.model_validate({"name": "job", "script": script, **fields})

    return _spec


def plan_for(spec: JobSpec, run_dir: Path, gpus: tuple[str, ...] = (), restart: int = 0) -> LaunchPlan:
    return build_plan(spec, facts(gpus), run_id=RUN_ID, run_dir=run_dir, restart=restart)


# --- the env contract -------------------------------------------------------------------------


def test_torchrun_env_contract_per_rank(spec, run_dir, script):
    plan = plan_for(spec(nproc_per_node=3, max_restarts=4, args=["--lr", 0.1]), run_dir)
    assert len(plan.ranks) == 3
    for i, rank in enumerate(plan.ranks):
        assert (rank.rank, rank.local_rank) == (i, i)
        expected = {
            "RANK": str(i),
            "LOCAL_RANK": str(i),
            "WORLD_SIZE": "3",
            "LOCAL_WORLD_SIZE": "3",
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_NAME": "default",
            "ROLE_RANK": str(i),
            "ROLE_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(PORT),
            "TORCHELASTIC_RUN_ID": RUN_ID,
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "4",
            "TORCHELASTIC_ERROR_FILE": str(run_dir / "errors" / f"rank-{i}.json"),
            "TP_SOCKET_IFNAME": LOOPBACK_IF,
            "GLOO_SOCKET_IFNAME": LOOPBACK_IF,
            "RPCCTL_RUN_ID": RUN_ID,
            "RPCCTL_RUN_DIR": str(run_dir),
            "RPCCTL_RESTART": "0",
            "RPCCTL_ERROR_FILE": str(run_dir / "errors" / f"rank-{i}.json"),
            "RPCCTL_STACK_FILE": str(run_dir / "stacks" / f"rank-{i}.txt"),
            "PYTHONUNBUFFERED": "1",
        }
        assert {k: rank.env.get(k) for k in expected} == expected
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in rank.env.items())
        assert rank.error_file == rank.env["TORCHELASTIC_ERROR_FILE"]
        assert rank.log == str(run_dir / "logs" / f"rank-{i}.log")
        assert rank.argv == [sys.executable, "-P", "-m", "rpcctl.rank.runtime", str(script), "--lr", "0.1"]
        assert rank.script_argv == [str(script), "--lr", "0.1"]
    # per-rank files are distinct
    for attr in ("error_file", "log"):
        assert len({getattr(r, attr) for r in plan.ranks}) == 3
    assert len({r.env["RPCCTL_STACK_FILE"] for r in plan.ranks}) == 3


def test_plan_fields(spec, run_dir, script):
    plan = plan_for(spec(nproc_per_node=2), run_dir)
    assert plan.run_id == RUN_ID
    assert plan.run_dir == str(run_dir)
    assert plan.name == "job"
    assert plan.script == str(script)
    assert (plan.world_size, plan.nproc_per_node) == (2, 2)
    assert (plan.master_addr, plan.master_port) == ("127.0.0.1", PORT)
    assert plan.restart == 0
    json.dumps(plan.to_dict())  # plain data, as --dry-run --json prints it
    assert plan.to_dict()["ranks"][1]["env"]["RANK"] == "1"


def test_single_rank(spec, run_dir):
    (rank,) = plan_for(spec(), run_dir).ranks
    assert rank.env["WORLD_SIZE"] == rank.env["LOCAL_WORLD_SIZE"] == "1"
    assert rank.env["RANK"] == "0"


def test_build_plan_is_pure(spec, run_dir):
    s = spec(nproc_per_node=2, rpc={"init": True}, devices="auto")
    assert plan_for(s, run_dir, gpus=("0", "1")) == plan_for(s, run_dir, gpus=("0", "1"))
    assert not run_dir.exists() and not run_dir.parent.exists()  # nothing written


def test_spec_env_present_and_contract_wins(spec, run_dir):
    plan = plan_for(
        spec(
            nproc_per_node=2,
            env={
                "MY_VAR": "x",
                "NUM": 3,
                "RANK": "99",
                "MASTER_ADDR": "10.0.0.1",
                "MASTER_PORT": "1",
                "TP_SOCKET_IFNAME": "eth0",
                "RPCCTL_RUN_ID": "fake",
            },
        ),
        run_dir,
    )
    for i, rank in enumerate(plan.ranks):
        assert rank.env["MY_VAR"] == "x"
        assert rank.env["NUM"] == "3"
        assert rank.env["RANK"] == str(i)
        assert rank.env["MASTER_ADDR"] == "127.0.0.1"
        assert rank.env["MASTER_PORT"] == str(PORT)
        assert rank.env["TP_SOCKET_IFNAME"] == LOOPBACK_IF
        assert rank.env["RPCCTL_RUN_ID"] == RUN_ID


# --- OMP_NUM_THREADS --------------------------------------------------------------------------


def test_omp_set_to_one_when_several_ranks(spec, run_dir):
    assert all(r.env["OMP_NUM_THREADS"] == "1" for r in plan_for(spec(nproc_per_node=2), run_dir).ranks)


def test_omp_not_set_for_one_rank(spec, run_dir):
    assert "OMP_NUM_THREADS" not in plan_for(spec(nproc_per_node=1), run_dir).ranks[0].env


def test_omp_from_spec_env_is_kept(spec, run_dir):
    plan = plan_for(spec(nproc_per_node=2, env={"OMP_NUM_THREADS": 4}), run_dir)
    assert all(r.env["OMP_NUM_THREADS"] == "4" for r in plan.ranks)


def test_omp_from_launcher_env_is_left_alone(spec, run_dir):
    # The ranks inherit the launcher's environment; the contract must not override it.
    plan = build_plan(
        spec(nproc_per_node=2), replace(facts(()), omp_num_threads_set=True), run_id=RUN_ID, run_dir=run_dir
    )
    assert all("OMP_NUM_THREADS" not in r.env for r in plan.ranks)


# --- devices (GPU ids below are faked through NodeFacts.gpus) -----------------------------------


def test_devices_cpu_hides_gpus(spec, run_dir):
    plan = plan_for(spec(nproc_per_node=2, devices="cpu"), run_dir, gpus=("0", "1"))
    assert [(r.device, r.env["CUDA_VISIBLE_DEVICES"]) for r in plan.ranks] == [("cpu", ""), ("cpu", "")]


def test_devices_cpu_beats_spec_env(spec, run_dir):
    plan = plan_for(spec(devices="cpu", env={"CUDA_VISIBLE_DEVICES": "3"}), run_dir, gpus=("0",))
    assert plan.ranks[0].env["CUDA_VISIBLE_DEVICES"] == ""


def test_devices_inherit_leaves_cuda_visible_devices_alone(spec, run_dir):
    with_gpus = plan_for(spec(nproc_per_node=2), run_dir, gpus=("0", "1"))  # "inherit" is the default
    assert all("CUDA_VISIBLE_DEVICES" not in r.env for r in with_gpus.ranks)
    assert [r.device for r in with_gpus.ranks] == ["inherit", "inherit"]
    without = plan_for(spec(nproc_per_node=2, devices="inherit"), run_dir)
    assert all("CUDA_VISIBLE_DEVICES" not in r.env for r in without.ranks)
    assert [r.device for r in without.ranks] == ["cpu", "cpu"]


def test_devices_auto_round_robin(spec, run_dir):
    plan = plan_for(spec(nproc_per_node=3, devices="auto"), run_dir, gpus=("0", "1"))
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in plan.ranks] == ["0", "1", "0"]
    assert [r.device for r in plan.ranks] == ["cuda:0", "cuda:1", "cuda:0"]


def test_devices_auto_uses_the_visible_ids(spec, run_dir):
    # The node lets us use GPUs 4 and 7 (say CUDA_VISIBLE_DEVICES=4,7 in the launcher).
    plan = plan_for(spec(nproc_per_node=2, devices="auto"), run_dir, gpus=("4", "7"))
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in plan.ranks] == ["4", "7"]
    assert [r.device for r in plan.ranks] == ["cuda:4", "cuda:7"]


def test_devices_auto_without_gpus_is_cpu(spec, run_dir):
    plan = plan_for(spec(nproc_per_node=2, devices="auto"), run_dir, gpus=())
    assert [(r.device, r.env["CUDA_VISIBLE_DEVICES"]) for r in plan.ranks] == [("cpu", ""), ("cpu", "")]


def test_devices_explicit_list(spec, run_dir):
    plan = plan_for(spec(nproc_per_node=2, devices=[1, "cpu"]), run_dir, gpus=("0", "1"))
    assert [(r.device, r.env["CUDA_VISIBLE_DEVICES"]) for r in plan.ranks] == [("cuda:1", "1"), ("cpu", "")]


def test_devices_explicit_list_indexes_the_visible_gpus(spec, run_dir):
    plan = plan_for(spec(nproc_per_node=2, devices=[1, "cuda:0"]), run_dir, gpus=("6", "7"))
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in plan.ranks] == ["7", "6"]


@pytest.mark.parametrize(
    ("devices", "gpus", "key", "visible"),
    [([0, 2], ("0", "1"), "devices.1", "visible GPUs: 0, 1"), ([0], (), "devices.0", "visible GPUs: none")],
    ids=["beyond-visible", "no-gpus"],
)
def test_devices_explicit_gpu_that_does_not_exist(spec, run_dir, devices, gpus, key, visible):
    with pytest.raises(ConfigError) as info:
        plan_for(spec(nproc_per_node=len(devices), devices=devices), run_dir, gpus=gpus)
    assert info.value.key == key
    assert f"GPU {devices[-1] if key == 'devices.1' else devices[0]} does not exist" in info.value.message
    assert visible in info.value.message
    assert f"key '{key}'" in str(info.value)


# --- rpc, restarts, start method --------------------------------------------------------------


def test_rpc_init_spec_is_passed_as_json(spec, run_dir):
    plan = plan_for(
        spec(nproc_per_node=2, rpc={"init": True, "name": "w{local_rank}", "num_worker_threads": 4}), run_dir
    )
    docs = [json.loads(r.env["RPCCTL_RPC"]) for r in plan.ranks]
    assert docs[0] == docs[1]
    assert docs[0] == {
        "init": True,
        "name": "w{local_rank}",
        "rpc_timeout": 60.0,
        "num_worker_threads": 4,
        "device_maps": {},
        "devices": [],
        "tuning": "off",
    }


def test_rpc_tuning_auto_adds_the_tuned_env_but_the_users_env_wins(spec, run_dir):
    from rpcctl.base.rpc_settings import auto_rpc_env

    tuned = auto_rpc_env()
    assert tuned  # something to apply
    key = next(iter(tuned))
    plan = plan_for(spec(nproc_per_node=2, rpc={"tuning": "auto"}, env={key: "mine"}), run_dir)
    for rank in plan.ranks:
        assert rank.env[key] == "mine"
        assert all(rank.env[k] == v for k, v in tuned.items() if k != key)
    assert all(k not in r.env for r in plan_for(spec(nproc_per_node=2), run_dir).ranks for k in tuned)


def test_no_rpc_json_without_init(spec, run_dir):
    assert all("RPCCTL_RPC" not in r.env for r in plan_for(spec(nproc_per_node=2), run_dir).ranks)


def test_restart_count(spec, run_dir):
    plan = plan_for(spec(nproc_per_node=2, max_restarts=3), run_dir, restart=2)
    assert plan.restart == 2
    for rank in plan.ranks:
        assert rank.env["TORCHELASTIC_RESTART_COUNT"] == "2"
        assert rank.env["RPCCTL_RESTART"] == "2"
        assert rank.env["TORCHELASTIC_MAX_RESTARTS"] == "3"
        # same files across restarts (logs append, as the run layout says)
        assert rank.log == str(run_dir / "logs" / f"rank-{rank.rank}.log")


def test_fork_preloads(spec, run_dir):
    plan = plan_for(spec(), run_dir)
    assert plan.start_method == "fork"
    assert plan.preload == DEFAULT_PRELOAD
    custom = plan_for(spec(preload=["numpy", "json"]), run_dir)
    assert custom.preload == ["numpy", "json"]


def test_spawn_has_no_preload(spec, run_dir):
    plan = plan_for(spec(start_method="spawn", preload=["numpy"]), run_dir)
    assert plan.start_method == "spawn"
    assert plan.preload == []


def test_plan_from_loaded_config(tmp_path, script, run_dir):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("script: train.py\nargs: [--epochs, 2]\nnproc_per_node: 2\nenv: {FOO: bar}\n")
    plan = plan_for(load_config(cfg, ["rpc.init=true"]), run_dir)
    assert plan.ranks[1].argv[-3:] == [str(script.resolve()), "--epochs", "2"]
    assert plan.ranks[1].env["FOO"] == "bar"
    assert "RPCCTL_RPC" in plan.ranks[1].env


# --- rpcctl launch --dry-run ------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch, tmp_path):
    """CliRunner with a wide colourless console (injected, as rpcctl.console documents), cwd in
    tmp_path, and a launcher that fails loudly if called: a dry run must never start anything."""

    def _must_not_launch(*args, **kwargs):
        raise AssertionError("launch_job was called during a dry run")

    monkeypatch.setattr(launch_cmd, "launch_job", _must_not_launch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RPCCTL_RUNS_DIR", raising=False)
    set_console(
        Console(
            out=RichConsole(width=1000, no_color=True, highlight=False, force_terminal=False, soft_wrap=False),
            err=RichConsole(
                stderr=True, width=1000, no_color=True, highlight=False, force_terminal=False, soft_wrap=True
            ),
        )
    )
    yield CliRunner(env={"CUDA_VISIBLE_DEVICES": ""})  # no GPUs, whatever this machine has
    set_console(None)


@pytest.fixture
def config(tmp_path, script) -> Path:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        "script: train.py\nargs: [--steps, 5]\nnproc_per_node: 2\nmaster_port: 29777\nenv: {MY_VAR: hello}\n"
    )
    return cfg


def test_dry_run_json(cli, config, tmp_path, script):
    runs = tmp_path / "runs"
    result = cli.invoke(app, ["launch", str(config), "--dry-run", "--json", "--runs-dir", str(runs)])
    assert result.exit_code == 0, (result.output, result.exception)
    doc = json.loads(result.stdout)
    assert doc["name"] == "job"
    assert doc["world_size"] == doc["nproc_per_node"] == 2
    assert doc["master_addr"] == "127.0.0.1" and doc["master_port"] == 29777
    assert doc["script"] == str(script.resolve())
    assert Path(doc["run_dir"]) == runs.resolve() / doc["run_id"]
    assert doc["run_id"].startswith("job-")
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for i, rank in enumerate(doc["ranks"]):
        assert rank["env"]["RANK"] == str(i)
        assert rank["env"]["WORLD_SIZE"] == "2"
        assert rank["env"]["MASTER_PORT"] == "29777"
        assert rank["env"]["MY_VAR"] == "hello"
        assert rank["env"]["RPCCTL_RUN_DIR"] == doc["run_dir"]
        assert rank["device"] == "cpu"
        assert rank["log"] == str(Path(doc["run_dir"]) / "logs" / f"rank-{i}.log")
        assert rank["argv"][-3:] == [str(script.resolve()), "--steps", "5"]
    assert not runs.exists()
    assert not (tmp_path / "runs").exists()


def test_all_frames_travels_in_the_plan_not_the_launchers_environment(cli, config, tmp_path, monkeypatch):
    # It used to be set in the launcher's os.environ for the ranks to inherit: the plan (and so
    # --dry-run and the run's config.yaml) did not show it, and the launcher's process kept it.
    monkeypatch.delenv("RPCCTL_ALL_FRAMES", raising=False)
    args = ["launch", str(config), "--dry-run", "--json", "--runs-dir", str(tmp_path / "runs")]
    plain = json.loads(cli.invoke(app, args).stdout)
    result = cli.invoke(app, [*args, "--all-frames"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert [r["env"].get("RPCCTL_ALL_FRAMES") for r in json.loads(result.stdout)["ranks"]] == ["1", "1"]
    assert [r["env"].get("RPCCTL_ALL_FRAMES") for r in plain["ranks"]] == [None, None]
    assert "RPCCTL_ALL_FRAMES" not in os.environ


def test_dry_run_json_applies_overrides(cli, config, tmp_path):
    runs = tmp_path / "runs"
    result = cli.invoke(
        app,
        [
            "launch",
            str(config),
            "--dry-run",
            "--json",
            "--runs-dir",
            str(runs),
            "-n",
            "3",
            "--set",
            "rpc.init=true",
            "-s",
            "devices=cpu",
        ],
    )
    assert result.exit_code == 0, (result.output, result.exception)
    doc = json.loads(result.stdout)
    assert len(doc["ranks"]) == 3
    assert all(json.loads(r["env"]["RPCCTL_RPC"])["init"] is True for r in doc["ranks"])
    assert all(r["env"]["CUDA_VISIBLE_DEVICES"] == "" for r in doc["ranks"])
    assert not runs.exists()


def test_dry_run_table(cli, config, tmp_path, script):
    runs = tmp_path / "runs"
    cfg = tmp_path / "three.yaml"
    cfg.write_text(config.read_text().replace("nproc_per_node: 2", "nproc_per_node: 3"))
    result = cli.invoke(app, ["launch", str(cfg), "--dry-run", "--runs-dir", str(runs)])
    assert result.exit_code == 0, (result.output, result.exception)
    out = result.stdout
    assert "3 rank(s)" in out
    assert "127.0.0.1:29777" in out
    assert f"run directory: {runs.resolve()}" in out
    rows = [line.split() for line in out.splitlines() if line.strip()]
    for i in range(3):
        row = next(r for r in rows if r[:2] == [str(i), str(i)])  # RANK LOCAL ...
        assert any(cell.endswith(f"logs/rank-{i}.log") for cell in row)
        assert f"RANK={i}" in row  # per-rank env is shown in the rank's row
    assert f"{sys.executable} -P -m rpcctl.rank.runtime {script.resolve()} --steps 5" in out
    assert "MY_VAR" in out and "hello" in out  # shared env in the environment table
    assert "MASTER_ADDR" in out
    assert not runs.exists()


def test_dry_run_default_runs_dir_not_created(cli, config, tmp_path):
    result = cli.invoke(app, ["launch", str(config), "--dry-run", "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout)["run_dir"].startswith(str((tmp_path / "runs").resolve()))
    assert not (tmp_path / "runs").exists()


# --- checks before spawn (issue 15 items 10 and 13) --------------------------------------------
# Each of these configs loaded and planned before, and failed only once the ranks ran (exit 1).
# Through the dry run (the same check as `launch`), then once through the real launcher.

PREFLIGHT = {
    # id: (config text, extra files {name: text}, key, phrases)
    "script-not-python": (
        "script: train.sh\n",
        {"train.sh": "#!/bin/sh\necho hi\nif [ 1 ]; then echo; fi\n"},
        "script",
        ("train.sh:2: not valid Python (invalid syntax)", "rpcctl runs the script with"),
    ),
    "script-binary": (
        "script: prog.py\n",
        {"prog.py": "\x7fELF\x00\x01"},
        "script",
        ("not valid Python", "null bytes"),
    ),
    "rpc-name-with-space": (
        "script: train.py\nrpc:\n  init: true\n  name: 'worker {rank}'\n",
        {},
        "rpc.name",
        ("worker name 'worker 0' (rank 0) is not one torch accepts", "A-Z a-z 0-9 _ - :"),
    ),
    "rpc-name-too-long": (
        "script: train.py\nrpc:\n  init: true\n  name: 'w{rank}" + "x" * 127 + "'\n",
        {},
        "rpc.name",
        ("1 to 127 characters",),
    ),
    "rpc-name-repeats": (
        "script: train.py\nnproc_per_node: 2\nrpc:\n  init: true\n  name: trainer\n",
        {},
        "rpc.name",
        ("ranks 0 and 1 would both be worker 'trainer'", "use {rank}"),
    ),
    "device-maps-unknown-worker": (
        "script: train.py\nnproc_per_node: 2\nrpc:\n  init: true\n  device_maps:\n    worker2: {cpu: cpu}\n",
        {},
        "rpc.device_maps.worker2",
        ("no worker 'worker2' in this job", "worker0, worker1"),
    ),
    "device-maps-gpu-not-there": (
        "script: train.py\nnproc_per_node: 2\nrpc:\n  init: true\n  device_maps:\n    worker1:\n      cuda:0: cuda:1\n",
        {},
        "rpc.device_maps.worker1.cuda:0",
        ("GPU cuda:0 does not exist for rank 0", "it sees 0 GPU(s)"),
    ),
    "device-maps-not-a-device": (
        "script: train.py\nnproc_per_node: 2\nrpc:\n  init: true\n  device_maps:\n    worker1: {'0': '1'}\n",
        {},
        "rpc.device_maps.worker1.0",
        ("'0' is not a device TensorPipe takes", "cuda:N or cpu"),
    ),
    "rpc-devices-gpu-not-there": (
        "script: train.py\nrpc:\n  init: true\n  devices: [cpu, 'cuda:3']\n",
        {},
        "rpc.devices.1",
        ("GPU cuda:3 does not exist",),
    ),
    "preload-misspelt": (
        "script: train.py\npreload: [json, torch.distributed.rcp]\n",
        {},
        "preload.1",
        ("no module named 'torch.distributed.rcp'",),
    ),
    "preload-no-such-package": (
        "script: train.py\npreload: [nosuchpackage_xyz]\n",
        {},
        "preload.0",
        ("'nosuchpackage_xyz'",),
    ),
    "ifname-missing": (
        "script: train.py\nifname: nosuchif0\n",
        {},
        "ifname",
        ("no network interface 'nosuchif0'", "it has: "),
    ),
}


@pytest.mark.parametrize("case", list(PREFLIGHT.values()), ids=list(PREFLIGHT))
def test_caught_before_spawn(cli, tmp_path, script, case):
    text, files, key, phrases = case
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(text)
    runs = tmp_path / "runs"
    result = cli.invoke(app, ["launch", str(cfg), "--dry-run", "--runs-dir", str(runs)])
    assert result.exit_code == 2, (result.output, result.exception)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in result.output, result.stderr
    # The config's line of the key (the last line of the text: each case puts its key there).
    assert errors[0].startswith(f"error: {cfg}:{len(text.splitlines())}: key '{key}': "), errors[0]
    for phrase in phrases:
        assert phrase in errors[0], (phrase, errors[0])
    assert not runs.exists()


def test_script_syntax_error_names_the_config_line_and_the_script_line(cli, tmp_path):
    (tmp_path / "train.py").write_text("import os\n\ndef f(:\n    pass\n")
    cfg = tmp_path / "job.yaml"
    cfg.write_text("name: x\nscript: train.py\n")
    result = cli.invoke(app, ["launch", str(cfg), "--dry-run"])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {cfg}:2: key 'script': {tmp_path / 'train.py'}:3: not valid Python"), (
        result.stderr
    )


def test_master_port_in_use_is_caught_and_named_where_it_was_set(cli, tmp_path, script):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = tmp_path / "job.yaml"
        cfg.write_text(f"script: train.py\nmaster_port: {port}\n")
        result = cli.invoke(app, ["launch", str(cfg), "--dry-run"])
        assert result.exit_code == 2
        assert result.stderr.startswith(
            f"error: {cfg}:2: key 'master_port': port {port} is already in use on 127.0.0.1"
        ), result.stderr
        cfg.write_text("script: train.py\nmaster_port: 1\n")
        result = cli.invoke(app, ["launch", str(cfg), "--dry-run", "--master-port", str(port)])
        assert result.exit_code == 2
        assert result.stderr.startswith(
            f"error: --master-port {port}: key 'master_port': port {port} is already in use"
        ), result.stderr
        result = cli.invoke(app, ["launch", str(cfg), "--dry-run", "--set", f"master_port={port}"])
        assert result.stderr.startswith(f"error: --set master_port={port}: key 'master_port': "), result.stderr
    free = cli.invoke(app, ["launch", str(cfg), "--dry-run", "--json", "--master-port", str(port)])
    assert free.exit_code == 0, free.output  # closed again: the check holds nothing


def _external_interface() -> str | None:
    import psutil

    loopback = psutil.net_if_addrs()
    for name, addrs in loopback.items():
        if not any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addrs):
            return name
    return None


def test_ifname_on_one_node_is_refused_not_exposed(cli, tmp_path, script):
    ifname = _external_interface()
    if ifname is None:
        pytest.skip("this host has no interface besides loopback")
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"script: train.py\nifname: {ifname}\n")
    result = cli.invoke(app, ["launch", str(cfg), "--dry-run", "--json"])
    assert result.exit_code == 2, result.output
    error = result.stderr.strip()
    assert error.startswith(
        f"error: {cfg}:2: key 'ifname': ifname '{ifname}' would make TensorPipe and Gloo listen beyond this machine"
    )
    assert "loopback only" in error and "several nodes" in error and "nnodes" in error
    assert result.stdout == ""  # no plan with TP_SOCKET_IFNAME=<external> is printed


def test_loopback_ifname_and_good_rpc_settings_pass(cli, tmp_path, script):
    from rpcctl.planning.plan import loopback_interface

    (tmp_path / "mymod.py").write_text("")  # the fork server runs in the launcher's cwd (python -m)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        f"script: train.py\nnproc_per_node: 2\nifname: {loopback_interface()}\n"
        "preload: [os.path, json.decoder, mymod, torch.distributed.rpc]\n"
        "rpc:\n  init: true\n  name: 'w:{rank}'\n  device_maps: {'w:1': {cpu: cpu}}\n  devices: [cpu]\n"
    )
    result = cli.invoke(app, ["launch", str(cfg), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ranks"][0]["env"]["TP_SOCKET_IFNAME"] == loopback_interface()


def test_multi_node_checks(tmp_path, script):
    from rpcctl.planning.preflight import check_before_spawn

    base = {"name": "job", "script": script, "nnodes": 2, "master_addr": "10.0.0.1"}
    # {local_rank} repeats on every node: rank 2 (node 1) would be worker 'w0' again.
    with pytest.raises(ConfigError, match=r"ranks 0 and 2 would both be worker 'w0'.*repeats on every node"):
        check_before_spawn(
            JobSpec.model_validate({**base, "nproc_per_node": 2, "rpc": {"init": True, "name": "w{local_rank}"}})
        )
    with pytest.raises(ConfigError, match="no network interface 'nosuchif0'") as info:
        check_before_spawn(JobSpec.model_validate({**base, "ifname": "nosuchif0"}))
    assert info.value.key == "ifname"
    ifname = _external_interface()
    if ifname is not None:
        check_before_spawn(JobSpec.model_validate({**base, "ifname": ifname}))  # several nodes: the point of ifname


def test_the_real_launcher_refuses_before_spawning(tmp_path, script):
    # Not a dry run: `rpcctl launch` itself, as a subprocess. Nothing may be spawned or created.
    from conftest import rpcctl

    cfg = tmp_path / "job.yaml"
    cfg.write_text("script: train.py\nnproc_per_node: 2\nrpc:\n  init: true\n  name: trainer\n")
    runs = tmp_path / "runs"
    result = rpcctl("launch", str(cfg), "--runs-dir", str(runs), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"error: {cfg}:5: key 'rpc.name': ranks 0 and 1 would both be worker 'trainer':"
        f" names must be unique (use {{rank}} in it)"
    )
    assert result.stdout == ""
    assert not runs.exists()


def test_a_fifo_as_script_is_refused_without_blocking(tmp_path):
    from rpcctl.planning.preflight import check_before_spawn

    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)  # JobSpec built in Python, as `rpcctl bench` does: no config loader in between
    with pytest.raises(ConfigError, match="is not a regular file"):
        check_before_spawn(JobSpec.model_validate({"name": "job", "script": fifo}))


def test_launch_api_refuses_before_making_the_run_directory(tmp_path, script):
    from rpcctl.launch.launcher import launch

    spec = JobSpec.model_validate({"name": "job", "script": script, "preload": ["nosuchpackage_xyz"]})
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError) as info:
        launch(spec, runs_dir=runs)
    assert info.value.key == "preload.0"
    assert not runs.exists()
