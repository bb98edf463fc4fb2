"""``rpcctl launch`` is a drop-in for ``torchrun`` (issue 39): the same line, the word replaced.

One module fixture runs the same script, with the same options and arguments, under torch 2.13's
own ``torchrun``, under ``rpcctl launch`` (which also writes ``--save-config``) and under
``rpcctl launch`` of that saved config; each rank writes its ``sys.argv`` and environment to a
file. The tests compare them (the contract's variables only: rpcctl adds its own ``RPCCTL_*``,
torchrun its agent's, the known differences of docs/torchrun.md). Every option of torch's own
parser, in every spelling and as ``--opt=value``, goes through ``rpcctl launch --dry-run``
in-process, so a torch release with a new option fails here until rpcctl handles it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import assert_no_process_left
from rpcctl.cli import app
from rpcctl.config.torchrun import BY_DEST, OPTIONS, POSITIONALS
from rpcctl.planning.plan import free_port

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
CONTRACT = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "MASTER_ADDR",
    "MASTER_PORT",
)
# What differs by design (docs/torchrun.md, "Known differences"): the error file is the run's
# (errors/rank-N.json), and no agent hosts a store (rank 0 does: TORCHELASTIC_USE_AGENT_STORE
# would make it a client of a store nobody serves).
KNOWN_DIFFERENT = {"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE", "MASTER_PORT"}
DUMP = """\
import json, os, sys
with open(os.path.join(os.environ["DUMP_DIR"], f"rank-{os.environ['RANK']}.json"), "w") as f:
    json.dump({"argv": sys.argv, "env": dict(os.environ)}, f)
print(f"hello from rank {os.environ['RANK']}")
"""
ALL_REDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
with open(os.path.join(os.environ["DUMP_DIR"], f"reduced-{os.environ['RANK']}"), "w") as f:
    f.write(str(t.item()))
"""
ARGS = ["--lr", "0.1", "-h", "--", "--nproc-per-node", "3", "x y"]  # the script's, untouched


def _env(tmp: Path, dump: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "SLURM_", "TORCHELASTIC_", "RPCCTL_"))
        and k not in ("OMP_NUM_THREADS", "JOB_COMPLETION_INDEX")
    }
    dump.mkdir()
    return {**env, "DUMP_DIR": str(dump), "RPCCTL_RUNS_DIR": str(tmp / "runs"), "NO_COLOR": "1", "COLUMNS": "200"}


def _ranks(dump: Path, n: int) -> list[dict]:
    return [json.loads((dump / f"rank-{r}.json").read_text()) for r in range(n)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same line under torchrun, rpcctl launch (with --save-config) and rpcctl launch CONFIG."""
    tmp = tmp_path_factory.mktemp("dropin")
    (tmp / "train.py").write_text(DUMP)
    options = [
        "--nproc_per_node=2",
        "--master-addr",
        "127.0.0.1",
        "--rdzv-id",
        "dropin",
        "--role",
        "trainer",
        "--max-restarts",
        "0",
        "--local-ranks-filter",
        "1",
    ]
    out = {}
    for name in ("torchrun", "rpcctl", "config"):
        port = str(free_port())
        env = _env(tmp, tmp / f"dump-{name}")
        if name == "torchrun":
            cmd = [*TORCHRUN, *options, "--master-port", port, "train.py", *ARGS]
        elif name == "rpcctl":
            cmd = [
                sys.executable,
                "-m",
                "rpcctl",
                "launch",
                "--no-live",
                "--save-config",
                "job.yaml",
                *options,
                "--master-port",
                port,
                "train.py",
                *ARGS,
            ]
        else:
            cmd = [sys.executable, "-m", "rpcctl", "launch", "--no-live", "job.yaml", "--master-port", port]
        result = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=90)
        assert result.returncode == 0, (name, result.stdout, result.stderr)
        out[name] = {"port": port, "ranks": _ranks(tmp / f"dump-{name}", 2), "result": result}
    runs_dir = tmp / "runs"
    run_dirs = sorted(p for p in runs_dir.iterdir() if (p / "run.json").is_file())
    assert len(run_dirs) == 2
    for run_dir in run_dirs:
        assert_no_process_left(run_dir)
    out["tmp"], out["runs_dir"] = tmp, runs_dir
    # True: the line's
    out["run_dirs"] = {json.loads((d / "run.json").read_text())["config_path"] is None: d for d in run_dirs}
    return out


def _contract(rank: dict) -> dict[str, str | None]:
    return {k: rank["env"].get(k) for k in CONTRACT}


def test_ranks_see_what_torchrun_ranks_see(runs):
    for theirs, ours in zip(runs["torchrun"]["ranks"], runs["rpcctl"]["ranks"]):
        assert ours["argv"] == theirs["argv"] == ["train.py", *ARGS]
        mine, torch_ = _contract(ours), _contract(theirs)
        assert {k: v for k, v in mine.items() if k not in KNOWN_DIFFERENT} == {
            k: v for k, v in torch_.items() if k not in KNOWN_DIFFERENT
        }
        assert torch_["MASTER_PORT"] == runs["torchrun"]["port"] and mine["MASTER_PORT"] == runs["rpcctl"]["port"]
        assert mine["TORCHELASTIC_RUN_ID"] == "dropin" and mine["ROLE_NAME"] == "trainer"
        assert torch_["TORCHELASTIC_USE_AGENT_STORE"] == "True" and mine["TORCHELASTIC_USE_AGENT_STORE"] is None
        assert mine["TORCHELASTIC_ERROR_FILE"].endswith(f"errors/rank-{mine['RANK']}.json")
        # the whole environment: docs/torchrun.md's known differences are all there is
        assert set(theirs["env"]) - set(ours["env"]) == {"TORCHELASTIC_USE_AGENT_STORE"}
        assert {k for k in set(ours["env"]) - set(theirs["env"]) if not k.startswith("RPCCTL_")} <= {
            "TP_SOCKET_IFNAME",
            "GLOO_SOCKET_IFNAME",
            "PYTHONUNBUFFERED",
            "PYTHONPATH",
        }
        assert {k for k in set(ours["env"]) & set(theirs["env"]) if ours["env"][k] != theirs["env"][k]} == {
            "MASTER_PORT",
            "DUMP_DIR",
            "TORCHELASTIC_ERROR_FILE",
        }


def test_the_console_shows_the_local_ranks_filter_picks(runs):
    for name in ("torchrun", "rpcctl"):
        shown = runs[name]["result"].stdout + runs[name]["result"].stderr
        assert "hello from rank 1" in shown and "hello from rank 0" not in shown, (name, shown)
    config = runs["config"]["result"].stdout  # a console filter, not part of the job: the saved config shows every rank
    assert "hello from rank 0" in config and "hello from rank 1" in config


def test_saved_config_runs_the_same_job(runs):
    assert (runs["tmp"] / "job.yaml").stat().st_mode & 0o777 == 0o600
    for line, config in zip(runs["rpcctl"]["ranks"], runs["config"]["ranks"]):
        assert config["argv"] == line["argv"]
        # what differs between any two runs: the port, the run's id and files, the rank's pid
        varying = {"MASTER_PORT", "TORCHELASTIC_ERROR_FILE", "DUMP_DIR"} | {
            k for k in {*line["env"], *config["env"]} if k.startswith("RPCCTL_") and k != "RPCCTL_ARGV0"
        }
        assert {k: v for k, v in line["env"].items() if k not in varying} == {
            k: v for k, v in config["env"].items() if k not in varying
        }
        assert line["env"]["RPCCTL_ARGV0"] == config["env"]["RPCCTL_ARGV0"] == "train.py"
        assert config["env"]["TORCHELASTIC_RUN_ID"] == "dropin"


def _cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})


def _json(result) -> dict | list:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[min(i for i in (result.stdout.find("{"), result.stdout.find("[")) if i >= 0) :])


def test_saved_config_plans_the_same(runs, monkeypatch):
    monkeypatch.chdir(runs["tmp"])
    port, dry = str(free_port()), str(runs["tmp"] / "runs-dry")
    line = _cli(
        "launch",
        "--dry-run",
        "--json",
        "--runs-dir",
        dry,
        "--nproc_per_node=2",
        "--rdzv-id",
        "dropin",
        "--role",
        "trainer",
        "--master-port",
        port,
        "train.py",
        *ARGS,
    )
    saved = _cli("launch", "--dry-run", "--json", "job.yaml", "--master-port", port, "--runs-dir", dry)
    plans = [_json(r) for r in (line, saved)]
    for plan in plans:
        plan.pop("sources")
    strip = lambda plan: json.loads(json.dumps(plan).replace(plan["run_id"], "RUN"))  # noqa: E731
    assert strip(plans[0]) == strip(plans[1])


def test_runs_shows_the_command_line(runs):
    lines = {tuple(r["command_line"] or ()) for r in _json(_cli("runs", "--json", "--runs-dir", str(runs["runs_dir"])))}
    line = next(c for c in lines if "train.py" in c)
    assert (
        list(line[line.index("train.py") + 1 :]) == ARGS
        and line[:2] == ("rpcctl", "launch")
        and "--nproc_per_node=2" in line
    )
    table = _cli("runs", "--wide", "--runs-dir", str(runs["runs_dir"]), env={"COLUMNS": "400"})
    assert (
        "COMMAND" in table.stdout
        and "rpcctl launch --no-live --save-config job.yaml --nproc_per_node=2" in table.stdout
    ), table.stdout


def test_the_command_line_is_kept_bounded_and_shown_sanitized(runs):
    """A line's words are data: an escape sequence in an argument is shown as its code, never
    sent to the terminal; a huge line is kept capped (256 words of at most 1,024 characters)."""
    from rpcctl.console import render_table
    from rpcctl.records.runs import RunRecord, bounded_command, load_record

    words = bounded_command(
        ["rpcctl", "launch", "train.py", "\x1b[2J\x1b]0;owned\x07", "y" * 5000, *map(str, range(400))]
    )
    assert len(words) == 257 and words[-1] == "... (149 more)" and len(words[4]) <= 1100
    record = load_record(runs["run_dirs"][True])
    record.command_line = words
    from rich.console import Console

    console = Console(width=400, record=True, force_terminal=False)
    console.print(render_table([record], RunRecord.COLUMNS, detail=True))
    text = console.export_text()
    assert "\x1b" not in text and "\\x1b[2J" in text and "COMMAND" in text


def test_inspect_views_work_on_a_line_run(runs):
    run_dir = str(runs["run_dirs"][True])
    workers = _json(_cli("inspect", "workers", run_dir, "--json"))
    assert sorted(w["rank"] for w in workers if w.get("kind") != "child") == [0, 1]
    assert _cli("logs", run_dir).exit_code == 0


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """-m MODULE (2 ranks, a gloo all_reduce) and --no-python PROGRAM (1 rank) under torchrun and
    rpcctl launch. The -m line names no port: torchrun's standalone rendezvous, MASTER_ADDR localhost."""
    tmp = tmp_path_factory.mktemp("programs")
    (tmp / "dumpmod.py").write_text(DUMP + ALL_REDUCE)
    (tmp / "prog.sh").write_text(
        '#!/bin/sh\nprintf "%s\\n" "$0" "$@" > "$DUMP_DIR/argv-$RANK"\nenv > "$DUMP_DIR/env-$RANK"\n'
    )
    (tmp / "prog.sh").chmod(0o700)
    out = {}
    for form in (["-m", "dumpmod", "--lr", "0.1"], ["--no-python", "./prog.sh", "--lr", "0.1"]):
        for name, head in (("torchrun", TORCHRUN), ("rpcctl", [sys.executable, "-m", "rpcctl", "launch", "--no-live"])):
            dump = tmp / f"dump-{name}{form[0]}"
            options = (
                ["--nproc-per-node", "2"]
                if form[0] == "-m"
                else ["--nproc-per-node", "1", "--rdzv-id", "progs", "--master-port", str(free_port())]
            )
            result = subprocess.run(
                [*head, *options, *form], cwd=tmp, env=_env(tmp, dump), capture_output=True, text=True, timeout=90
            )
            assert result.returncode == 0, (name, form, result.stdout, result.stderr)
            out[name, form[0]] = dump
    for run_dir in (p for p in (tmp / "runs").iterdir() if (p / "run.json").is_file()):
        assert_no_process_left(run_dir)
    return out


def test_a_module_runs_as_torchruns_does(programs):
    """... with torchrun's MASTER_ADDR of a line without a port (localhost), on which both ranks
    meet for a real all_reduce; the run ids are each launcher's own (torchrun's a UUID)."""
    for theirs, ours in zip(*(_ranks(programs[name, "-m"], 2) for name in ("torchrun", "rpcctl"))):
        assert (
            ours["argv"] == theirs["argv"]
            and ours["argv"][0].endswith("dumpmod.py")
            and ours["argv"][1:] == ["--lr", "0.1"]
        )
        differ = KNOWN_DIFFERENT | {"TORCHELASTIC_RUN_ID"}
        assert {k: v for k, v in _contract(ours).items() if k not in differ} == {
            k: v for k, v in _contract(theirs).items() if k not in differ
        }
        assert (
            ours["env"]["MASTER_ADDR"] == theirs["env"]["MASTER_ADDR"] == "localhost"
            and ours["env"]["WORLD_SIZE"] == "2"
        )
        assert (programs[("rpcctl", "-m")] / f"reduced-{ours['env']['RANK']}").read_text() == "2.0"


def test_a_program_runs_as_torchruns_does(programs):
    """--no-python: the rank is the program (its argv as torchrun gives it), with the contract."""

    def seen(dump: Path) -> tuple[str, dict[str, str]]:
        return (dump / "argv-0").read_text(), dict(
            line.split("=", 1) for line in (dump / "env-0").read_text().splitlines() if "=" in line
        )

    theirs, ours = seen(programs["torchrun", "--no-python"]), seen(programs["rpcctl", "--no-python"])
    assert ours[0] == theirs[0] == "./prog.sh\n--lr\n0.1\n"
    mine, torch_ = ({k: env.get(k) for k in CONTRACT if k not in KNOWN_DIFFERENT} for env in (ours[1], theirs[1]))
    assert mine == torch_ and mine["RANK"] == "0"


# ---------------------------------------------------------------------------------------------
# Every option of torch's parser, through --dry-run (in-process: typer's runner)

SAMPLES = {
    "nnodes": "1",
    "nproc_per_node": "2",
    "rdzv_backend": "c10d",
    "rdzv_endpoint": "127.0.0.1:29400",
    "rdzv_id": "abc",
    "rdzv_conf": "join_timeout=30",
    "max_restarts": "2",
    "monitor_interval": "0.5",
    "start_method": "spawn",
    "event_log_handler": "null",
    "role": "trainer",
    "log_dir": "logs",
    "redirects": "3",
    "tee": "1",
    "local_ranks_filter": "0",
    "duplicate_stdout_filters": "apple",
    "duplicate_stderr_filters": "pear",
    "node_rank": "0",
    "master_addr": "127.0.0.1",
    "master_port": "29517",
    "local_addr": "127.0.0.1",
    "logs_specs": "mine",
    "numa_binding": "node",
    "signals_to_handle": "SIGTERM,SIGUSR1",
    "shutdown_timeout": "7",
}
REFUSED = {"logs_specs", "numa_binding"}
# What each accepted option does to the plan (the rank-0 env, argv), where it shows there.
EFFECTS = {
    "nproc_per_node": lambda p: p["world_size"] == 2,
    "rdzv_id": lambda p: p["ranks"][0]["env"]["TORCHELASTIC_RUN_ID"] == "abc",
    "max_restarts": lambda p: p["ranks"][0]["env"]["TORCHELASTIC_MAX_RESTARTS"] == "2",
    "role": lambda p: p["ranks"][0]["env"]["ROLE_NAME"] == "trainer",
    "master_port": lambda p: p["master_port"] == 29517,
    "signals_to_handle": lambda p: p["ranks"][0]["env"]["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGUSR1",
    "module": lambda p: p["ranks"][0]["argv"][-4:-2] == ["-m", "dumpmod"],
    "no_python": lambda p: p["ranks"][0]["argv"][-4] == "--no-python",
    "virtual_local_rank": lambda p: (
        p["ranks"][0]["env"]["LOCAL_RANK"] == "0" and p["ranks"][0]["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    ),
}


def _torch_options():
    import torch.distributed.run as run

    return [a for a in run.get_args_parser()._actions if a.option_strings and a.dest != "help"]


@pytest.fixture
def here(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(DUMP)
    (tmp_path / "dumpmod.py").write_text(DUMP)
    program = tmp_path / "prog.sh"
    program.write_text('#!/bin/sh\nenv > "$DUMP_DIR/rank-$RANK.env"\n')
    program.chmod(0o700)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _dry(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, ["launch", "--dry-run", "--json", *args], env={"COLUMNS": "200", **(env or {})})


def test_every_torchrun_option_has_a_row():
    ours = {o.dest: set(o.names) for o in OPTIONS}
    theirs = {a.dest: set(a.option_strings) for a in _torch_options()}
    assert ours == theirs
    import torch.distributed.run as run

    assert {a.dest for a in run.get_args_parser()._actions if not a.option_strings} == set(POSITIONALS)


@pytest.mark.parametrize("dest", list(BY_DEST))  # torch's own, by test_every_torchrun_option_has_a_row
def test_every_spelling_through_dry_run(here, dest):
    option = BY_DEST[dest]
    target = ["dumpmod"] if dest == "module" else ["./prog.sh"] if dest == "no_python" else ["train.py"]
    for spelling in option.names:
        forms = [[spelling]] if option.flag else [[spelling, SAMPLES[dest]]]
        if not option.flag and spelling.startswith("--"):
            forms.append([f"{spelling}={SAMPLES[dest]}"])
        for form in forms:
            result = _dry(*form, *target, "--lr", "0.1")
            if dest in REFUSED:
                assert result.exit_code == 2, (form, result.output)
                assert spelling in result.output and "instead" in result.output, result.output
                continue
            assert result.exit_code == 0, (form, result.output)
            plan = json.loads(result.stdout[result.stdout.index("{") :])
            assert plan["ranks"][0]["argv"][-2:] == ["--lr", "0.1"], plan["ranks"][0]["argv"]
            assert EFFECTS.get(dest, lambda p: True)(plan), (form, plan["ranks"][0])


def test_pet_variables_are_torchruns_defaults(here):
    result = _dry("train.py", env={"PET_MAX_RESTARTS": "3", "PET_ROLE": "pet", "PET_NPROC_PER_NODE": "2"})
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout[result.stdout.index("{") :])
    assert (
        plan["world_size"] == 2
        and plan["ranks"][0]["env"]["TORCHELASTIC_MAX_RESTARTS"] == "3"
        and plan["ranks"][0]["env"]["ROLE_NAME"] == "pet"
    )
    assert {"key": "nproc_per_node", "value": 2, "source": "PET_NPROC_PER_NODE=2"} in plan["sources"]
    # torchrun's words, no GPU: the CPUs
    cpu = _dry("train.py", env={"PET_NPROC_PER_NODE": "auto", "CUDA_VISIBLE_DEVICES": ""})
    assert json.loads(cpu.stdout[cpu.stdout.index("{") :])["world_size"] == len(os.sched_getaffinity(0)), cpu.output
    flag = _dry("--role", "line", "train.py", env={"PET_ROLE": "pet"})  # the line beats the environment
    assert json.loads(flag.stdout[flag.stdout.index("{") :])["ranks"][0]["env"]["ROLE_NAME"] == "line"


def test_a_c10d_endpoint_on_port_0_is_a_free_port(here):
    """`--rdzv-backend c10d --rdzv-endpoint localhost:0` (what --standalone means to torchrun): one
    node, a free port."""
    result = _dry("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "train.py")
    plan = json.loads(result.stdout[result.stdout.index("{") :])
    assert (
        result.exit_code == 0
        and plan["master_port"] > 0
        and plan["ranks"][0]["env"]["MASTER_PORT"] == str(plan["master_port"])
    )
    assert _dry("--rdzv-endpoint", "n0:70000", "train.py").exit_code == 2


def test_the_launchers_own_nccl_setting_is_left_alone(here):
    """torchrun sets TORCH_NCCL_ASYNC_ERROR_HANDLING=1 only where the launcher's environment does not set it."""
    ours = _dry("train.py", env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    assert (
        "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in json.loads(ours.stdout[ours.stdout.index("{") :])["ranks"][0]["env"]
    ), ours.output
    unset = _dry("train.py", env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": None})
    assert (
        json.loads(unset.stdout[unset.stdout.index("{") :])["ranks"][0]["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    )


def test_nproc_per_node_words_mean_what_torchrun_makes_of_them(here):
    cpus = len(os.sched_getaffinity(0))
    for word in ("auto", "cpu"):
        result = _dry("--nproc-per-node", word, "train.py", env={"CUDA_VISIBLE_DEVICES": ""})
        assert result.exit_code == 0 and json.loads(result.stdout[result.stdout.index("{") :])["world_size"] == cpus, (
            result.output
        )
    gpu = _dry("--nproc-per-node", "gpu", "train.py", env={"CUDA_VISIBLE_DEVICES": ""})
    assert gpu.exit_code == 2 and "--nproc-per-node gpu" in gpu.output and "no GPU" in gpu.output, gpu.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--nnodes", "2:1", "train.py"], ["nnodes '2:1': MIN is above MAX"]),
        (["--rdzv-backend", "etcd", "train.py"], ["--rdzv-backend etcd", "signed rendezvous"]),
        (["job.yaml", "train.py"], ["a config and a script on one line"]),
        (["missing.py", "--lr", "1"], ["script not found: missing.py"]),
        (["--no-python", "no-such-program-39"], ["program not found: no-such-program-39"]),
        (["--set", "timeout=5", "train.py"], ["--set timeout=5", "--save-config"]),
        (["--ranks", "0", "--local-ranks-filter", "0", "train.py"], ["--ranks and --local-ranks-filter"]),
        (["-m", "2fast"], ["not a dotted module name"]),
        (["job.conf"], ["job.conf looks like a config", ".yaml or .yml"]),
        (["run.sh"], ["not valid Python", "takes --no-python"]),
        (["--no-python", "-m", "dumpmod"], ["--no-python and -m"]),
        (["--nproc-per-node", "two", "train.py"], ["--nproc-per-node two"]),
        (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:29400", "train.py"], ["--node-rank"]),
    ],
)
def test_bad_lines_are_one_message_exit_2(here, args, words):
    (here / "job.yaml").write_text("script: train.py\nnproc_per_node: 2\n")
    (here / "job.conf").write_text("script: train.py\nnproc_per_node: 2\n")
    (here / "run.sh").write_text("#!/bin/sh\necho $RANK && true\n")
    result = _dry(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and all(w in result.output for w in words), result.output


def test_docs_list_every_option():
    """docs/torchrun.md's table is OPTIONS: every option, its spellings, what rpcctl does."""
    text = (REPO / "docs" / "torchrun.md").read_text().split("## Every option of torchrun's")[1].split("\n## ")[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`|]+)`[^|]* \| (.+) \|$", text, re.M)}
    for option in OPTIONS:
        assert rows.get(option.shown) == option.does, option.shown
        spellings = re.search(rf"^\| `{re.escape(option.shown)}`([^|]*)\|", text, re.M).group(0)
        assert all(f"`{name}`" in spellings for name in option.names), spellings
    assert set(rows) == {o.shown for o in OPTIONS}
    assert set(BY_DEST) == {o.dest for o in OPTIONS}
