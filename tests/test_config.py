"""``rpcctl.config.load_config``: YAML → ``JobSpec``, and how its errors reach the user.

Part 1: what a good config loads to (defaults, ``${VAR}`` expansion, ``--set`` and ``-n``
overrides, path resolution, name and value coercion).
Part 2: a corpus of bad inputs. Each must raise ``ConfigError`` whose ``where`` is ``FILE:LINE``
(``FILE:LINE:COL`` for YAML syntax errors, the line where the parser found the problem), the
``--set KEY=VALUE`` / ``-n N`` origin, or the bare file where no line exists; whose ``key`` is
the dotted key path; and whose message carries a phrase that tells the user what to do.
Part 3: the same errors through the CLI: exit code 2, one ``error:`` line, no traceback, and
no run directory.

Everything here is in-process and file-only: no process is spawned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pydantic
import pytest
import yaml
from rich.console import Console as RichConsole
from typer.testing import CliRunner

from rpcctl.cli import app
from rpcctl.commands import launch as launch_cmd
from rpcctl.commands.launch import parse_ranks
from rpcctl.config import DEFAULT_PRELOAD, JobSpec, dump_spec, load_config
from rpcctl.console import Console, set_console
from rpcctl.base.errors import ConfigError, UsageError

UNSET = "RPCCTL_TEST_SURELY_UNSET_VAR"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(UNSET, raising=False)
    monkeypatch.delenv("RPCCTL_DEBUG", raising=False)
    monkeypatch.delenv("RPCCTL_RUNS_DIR", raising=False)


@pytest.fixture
def write(tmp_path, script):
    """Write a config next to ``train.py`` and return its path."""

    def _write(text: str, name: str = "job.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write


# =============================================================================================
# Part 1: good configs


def test_defaults(write, script):
    spec = load_config(write("script: train.py\n"))
    assert isinstance(spec, JobSpec)
    assert spec.name == "job"
    assert spec.script == script.resolve()
    assert spec.script.is_absolute()
    assert spec.args == []
    assert spec.nproc_per_node == 1
    assert spec.env == {}
    assert spec.timeout is None
    assert spec.max_restarts == 0
    assert spec.grace == 5.0
    assert spec.devices == "inherit"
    assert spec.rpc.init is False
    assert spec.rpc.name == "worker{rank}"
    assert spec.rpc.rpc_timeout == 60.0
    assert spec.rpc.num_worker_threads == 16
    assert spec.rpc.device_maps == {} and spec.rpc.devices == []
    assert spec.losses.pattern is None
    assert spec.master_port is None
    assert spec.start_method == "fork"
    assert spec.preload == DEFAULT_PRELOAD


def test_full_config(write, script):
    spec = load_config(
        write(
            """\
name: my-job.v2
script: train.py
args: [--epochs, 3]
nproc_per_node: 2
env: {MY_FLAG: on-purpose}
timeout: 30.5
max_restarts: 2
grace: 0
devices: [cuda:1, cpu]
rpc:
  init: true
  name: "trainer{local_rank}"
  rpc_timeout: 5
  num_worker_threads: 4
  device_maps: {trainer1: {"0": "1"}}
losses:
  pattern: 'step (?P<step>\\d+) loss (?P<loss>[0-9.]+)'
master_port: 29511
start_method: spawn
preload: [numpy]
"""
        )
    )
    assert spec.name == "my-job.v2"
    assert spec.args == ["--epochs", "3"]
    assert spec.nproc_per_node == 2
    assert spec.env == {"MY_FLAG": "on-purpose"}
    assert spec.timeout == 30.5
    assert spec.max_restarts == 2
    assert spec.grace == 0
    assert spec.devices == [1, "cpu"]  # "cuda:1" → 1
    assert spec.rpc.init is True
    assert spec.rpc.name == "trainer{local_rank}"
    assert spec.rpc.rpc_timeout == 5.0
    assert spec.rpc.num_worker_threads == 4
    assert spec.rpc.device_maps == {"trainer1": {"0": "1"}}
    assert spec.losses.pattern.startswith("step ")
    assert spec.master_port == 29511
    assert spec.start_method == "spawn"
    assert spec.preload == ["numpy"]


def test_accepts_str_path(write):
    assert load_config(str(write("script: train.py\n"))).name == "job"


def test_spec_is_frozen(write):
    spec = load_config(write("script: train.py\n"))
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.nproc_per_node = 3  # type: ignore[misc]


# --- ${VAR} expansion -------------------------------------------------------------------------


def test_env_var_expansion(write, monkeypatch):
    monkeypatch.setenv("RPCCTL_T_DATA", "/data/set")
    monkeypatch.setenv("RPCCTL_T_N", "3")
    spec = load_config(
        write(
            f"""\
script: train.py
nproc_per_node: ${{RPCCTL_T_N}}
args:
  - --data=${{RPCCTL_T_DATA}}/train
  - ${{{UNSET}:-fallback}}
  - ${{{UNSET}:-}}
  - ${{RPCCTL_T_N:-9}}
env:
  PRICE: "$$5"
  LITERAL: "$${{RPCCTL_T_DATA}}"
  LONE: cost$5
"""
        )
    )
    assert spec.nproc_per_node == 3  # an expanded string still validates as an int
    assert spec.args == ["--data=/data/set/train", "fallback", "", "3"]  # the set variable beats its default
    assert spec.env == {"PRICE": "$5", "LITERAL": "${RPCCTL_T_DATA}", "LONE": "cost$5"}


def test_env_var_expansion_in_script_path(tmp_path, write, monkeypatch):
    sub = tmp_path / "code"
    sub.mkdir()
    (sub / "run.py").write_text("")
    monkeypatch.setenv("RPCCTL_T_SUB", "code")
    assert load_config(write("script: ${RPCCTL_T_SUB}/run.py\n")).script == (sub / "run.py").resolve()


def test_nested_defaults_are_expanded(write, monkeypatch):
    monkeypatch.setenv("RPCCTL_T_B", "from-b")
    monkeypatch.delenv("RPCCTL_T_A", raising=False)
    spec = load_config(
        write(
            f"""\
script: train.py
env:
  ONE: ${{RPCCTL_T_A:-${{RPCCTL_T_B}}}}
  TWO: ${{RPCCTL_T_A:-${{{UNSET}:-deep}}}}/x
  SET: ${{RPCCTL_T_B:-${{{UNSET}}}}}
  BRACES: ${{RPCCTL_T_A:-{{a}}}}
"""
        )
    )
    # SET: the default is not expanded when the variable is set, so its unset variable is fine.
    assert spec.env == {"ONE": "from-b", "TWO": "deep/x", "SET": "from-b", "BRACES": "{a}"}


def test_expanded_values_take_the_field_type(write, monkeypatch):
    # ${VAR} yields a string; for a typed key it is read as that type (a quoted "4" is not).
    monkeypatch.setenv("RPCCTL_T_N", "3")
    monkeypatch.setenv("RPCCTL_T_INIT", "true")
    monkeypatch.setenv("RPCCTL_T_TIMEOUT", "2.5")
    spec = load_config(
        write(
            "script: train.py\nnproc_per_node: ${RPCCTL_T_N}\nrpc:\n"
            "  init: ${RPCCTL_T_INIT}\n  rpc_timeout: ${RPCCTL_T_TIMEOUT}\n"
        )
    )
    assert (spec.nproc_per_node, spec.rpc.init, spec.rpc.rpc_timeout) == (3, True, 2.5)
    monkeypatch.setenv("RPCCTL_T_TIMEOUT", "inf")
    with pytest.raises(ConfigError, match="finite number"):
        load_config(write("script: train.py\nrpc:\n  rpc_timeout: ${RPCCTL_T_TIMEOUT}\n"))


def test_anchors_aliases_and_merge_keys(write, monkeypatch):
    monkeypatch.setenv("RPCCTL_T_DATA", "/d")
    spec = load_config(
        write(
            """\
script: train.py
args: &common [--data, &data "${RPCCTL_T_DATA}/x"]
env:
  <<: {A: "1", B: "2"}
  B: own
  DATA: *data
rpc:
  device_maps: {w1: &m {"0": "1"}, w2: *m}
"""
        )
    )
    assert spec.args == ["--data", "/d/x"]
    assert spec.env == {"A": "1", "B": "own", "DATA": "/d/x"}  # the mapping's own key beats the merge
    assert spec.rpc.device_maps == {"w1": {"0": "1"}, "w2": {"0": "1"}}
    spec = load_config(write("script: train.py\nenv: {&k KEY: a, OTHER: *k}\n"))  # an anchor on a key
    assert spec.env == {"KEY": "a", "OTHER": "KEY"}


def test_set_into_an_aliased_mapping_changes_only_that_key(write):
    spec = load_config(
        write("script: train.py\nrpc:\n  device_maps: {w1: &m {'0': '1'}, w2: *m}\n"), ["rpc.device_maps.w2.0=cuda:2"]
    )
    assert spec.rpc.device_maps == {"w1": {"0": "1"}, "w2": {"0": "cuda:2"}}


def test_set_values_are_not_env_expanded(write):
    # Documented: expansion applies to file values only.
    spec = load_config(write("script: train.py\n"), [f"env.A=${{{UNSET}}}"])
    assert spec.env == {"A": f"${{{UNSET}}}"}


# --- --set and -n -----------------------------------------------------------------------------


def test_set_overrides_with_yaml_typed_values(write):
    spec = load_config(
        write("script: train.py\nnproc_per_node: 1\nargs: [old]\nrpc:\n  init: false\n"),
        [
            "nproc_per_node=2",
            "args=[--lr, 0.1, 7]",
            "rpc.init=true",
            "rpc.num_worker_threads=8",
            "env.NEW_VAR=1",  # creates the env mapping
            "timeout=null",
            "devices=[0, cpu]",
            "losses.pattern=loss=(?P<loss>\\S+)",
            "name=custom_name",
        ],
    )
    assert spec.nproc_per_node == 2
    assert spec.args == ["--lr", "0.1", "7"]
    assert spec.rpc.init is True
    assert spec.rpc.num_worker_threads == 8
    assert spec.env == {"NEW_VAR": "1"}
    assert spec.timeout is None
    assert spec.devices == [0, "cpu"]
    assert spec.losses.pattern == "loss=(?P<loss>\\S+)"
    assert spec.name == "custom_name"


def test_later_set_wins_and_value_may_contain_equals(write):
    spec = load_config(write("script: train.py\n"), ["args=[a]", "args=[--x=1]", "env.OPTS=a=b"])
    assert spec.args == ["--x=1"]
    assert spec.env == {"OPTS": "a=b"}


def test_set_empty_value_is_empty_string(write):
    assert load_config(write("script: train.py\n"), ["env.EMPTY="]).env == {"EMPTY": ""}


def test_nproc_override_beats_file_and_set(write):
    path = write("script: train.py\nnproc_per_node: 2\n")
    assert load_config(path, nproc_per_node=4).nproc_per_node == 4
    assert load_config(path, ["nproc_per_node=3"], nproc_per_node=5).nproc_per_node == 5


def test_set_script_resolves_against_config_folder(tmp_path, write):
    (tmp_path / "other.py").write_text("")
    assert load_config(write("script: train.py\n"), ["script=other.py"]).script == (tmp_path / "other.py").resolve()


# --- paths, names, coercion -------------------------------------------------------------------


def test_script_relative_to_config_folder_not_cwd(tmp_path, monkeypatch):
    (tmp_path / "cfgs").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "scripts" / "t.py"
    target.write_text("")
    cfg = tmp_path / "cfgs" / "job.yaml"
    cfg.write_text("script: ../scripts/t.py\n")
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = load_config(cfg)
    assert spec.script == target.resolve()
    assert spec.script.is_absolute()
    # a relative config path works too
    monkeypatch.chdir(tmp_path)
    assert load_config(Path("cfgs/job.yaml")).script == target.resolve()


def test_absolute_script_path(tmp_path):
    elsewhere = tmp_path / "a" / "b"
    elsewhere.mkdir(parents=True)
    target = elsewhere / "abs.py"
    target.write_text("")
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    cfg = cfg_dir / "job.yaml"
    cfg.write_text(f"script: {target}\n")
    assert load_config(cfg).script == target


def test_script_tilde_is_expanded(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "s.py").write_text("")
    monkeypatch.setenv("HOME", str(home))
    cfg = tmp_path / "job.yaml"
    cfg.write_text("script: ~/s.py\n")
    assert load_config(cfg).script == home / "s.py"


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("job.yaml", "job"),
        ("My Job!.yaml", "My-Job"),
        ("__private__.yaml", "private"),
        ("résumé run.yml", "r-sum-run"),
        ("ééé.yaml", "job"),  # nothing usable left → a fallback name
        ("exp.v2.yaml", "exp.v2"),
    ],
)
def test_name_defaults_to_sanitised_file_stem(write, filename, expected):
    spec = load_config(write("script: train.py\n", name=filename))
    assert spec.name == expected


def test_explicit_name_is_kept(write):
    assert load_config(write("name: explicit\nscript: train.py\n", name="Other Name.yaml")).name == "explicit"


def test_args_and_env_coerced_to_strings(write):
    spec = load_config(
        write(
            "script: train.py\nargs: [--epochs, 3, 0.5, -1, x]\nenv: {INT: 1, FLOAT: 1.5, T: true, F: false, S: text}\n"
        )
    )
    assert spec.args == ["--epochs", "3", "0.5", "-1", "x"]
    assert all(isinstance(a, str) for a in spec.args)
    assert spec.env == {"INT": "1", "FLOAT": "1.5", "T": "true", "F": "false", "S": "text"}


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ("cpu", "cpu"),
        ("auto", "auto"),
        ("inherit", "inherit"),
        ("[0, 1]", [0, 1]),
        ("['cuda:3', cpu]", [3, "cpu"]),
        ("['2', cpu]", [2, "cpu"]),
    ],
)
def test_devices_forms(write, devices, expected):
    spec = load_config(write(f"script: train.py\nnproc_per_node: 2\ndevices: {devices}\n"))
    assert spec.devices == expected


def test_dump_spec_round_trips(write):
    spec = load_config(write("script: train.py\nargs: [a, 1]\nrpc: {init: true}\n"))
    data = yaml.safe_load(dump_spec(spec))
    assert data["script"] == str(spec.script)
    assert data["args"] == ["a", "1"]
    assert JobSpec.model_validate(data) == spec


# =============================================================================================
# Part 2: the bad-input corpus


@dataclass
class Bad:
    text: str | None  # config text; None: see `path`
    # "{file}:LINE", "{file}:LINE:" (a prefix: YAML syntax errors add a column), "{file}", "--set ...", None
    where: str | None
    key: str | None
    phrases: tuple[str, ...]
    overrides: list[str] = field(default_factory=list)
    nproc: int | None = None
    path: str = "file"  # "file", "missing" (no such file) or "dir" (a directory)
    one_line: bool = True  # the message is a single line


BAD: dict[str, Bad] = {
    # --- YAML itself
    "yaml-unclosed-bracket": Bad(
        "script: train.py\nargs: [a, b\nnproc_per_node: 2\n",
        "{file}:3:",
        None,
        ("YAML syntax error", "expected ',' or ']'"),
    ),
    "yaml-bad-indentation": Bad(
        "script: train.py\nrpc:\n  init: true\n   name: x\n",
        "{file}:4:",
        None,
        ("YAML syntax error", "mapping values are not allowed"),
    ),
    "yaml-dedent-mid-mapping": Bad(
        "script: train.py\nrpc:\n    init: true\n  name: x\n",
        "{file}:4:",
        None,
        ("YAML syntax error", "while parsing a block mapping"),
    ),
    "yaml-tab-indent": Bad(
        "script: train.py\n\tnproc_per_node: 2\n", "{file}:2:", None, ("YAML syntax error", "tab character")
    ),
    "empty-file": Bad("", "{file}", None, ("config file is empty", "'script'")),
    "comments-only-file": Bad("# nothing here\n\n", "{file}", None, ("config file is empty",)),
    "file-is-a-list": Bad(
        "- script: train.py\n- nproc_per_node: 2\n", "{file}:1", None, ("must be a mapping", "got a list")
    ),
    "file-is-a-scalar": Bad("\n\njust some text\n", "{file}:3", None, ("must be a mapping", "got a single value")),
    "missing-config-file": Bad(None, None, None, ("config file not found",), path="missing"),
    "config-path-is-directory": Bad(None, None, None, ("is a directory",), path="dir"),
    # --- keys
    "unknown-top-level-key": Bad(
        "script: train.py\nnprocs_per_node: 2\n",
        "{file}:2",
        "nprocs_per_node",
        ("unknown key 'nprocs_per_node'", "did you mean 'nproc_per_node'?"),
    ),
    "unknown-nested-key": Bad(
        "script: train.py\nrpc:\n  init: true\n  num_worker_thread: 4\n",
        "{file}:4",
        "rpc.num_worker_thread",
        ("unknown key 'rpc.num_worker_thread'", "did you mean 'rpc.num_worker_threads'?"),
    ),
    "unknown-nested-key-no-close-match": Bad(
        "script: train.py\nrpc:\n  zzz: 1\n", "{file}:3", "rpc.zzz", ("unknown key 'rpc.zzz'", "known keys: init, name")
    ),
    "missing-required-script": Bad("nproc_per_node: 2\n", "{file}", "script", ("missing required key 'script'",)),
    "script-file-missing": Bad("name: x\nscript: nope.py\n", "{file}:2", "script", ("script not found", "nope.py")),
    "duplicate-top-level-key": Bad(
        "script: train.py\nnproc_per_node: 2\nnproc_per_node: 3\n",
        "{file}:3",
        "nproc_per_node",
        ("duplicate key 'nproc_per_node'",),
    ),
    "duplicate-nested-key": Bad(
        "script: train.py\nrpc:\n  init: true\n  init: false\n", "{file}:4", "rpc.init", ("duplicate key 'init'",)
    ),
    # --- types and ranges
    "wrong-type-int": Bad(
        "script: train.py\n\nnproc_per_node: two\n", "{file}:3", "nproc_per_node", ("valid integer", "'two'")
    ),
    "wrong-type-fraction": Bad(
        "script: train.py\nnproc_per_node: 2.5\n", "{file}:2", "nproc_per_node", ("fractional part",)
    ),
    "nproc-zero": Bad(
        "script: train.py\nnproc_per_node: 0\n", "{file}:2", "nproc_per_node", ("greater than or equal to 1", "got 0")
    ),
    "nproc-too-big": Bad(
        "script: train.py\nnproc_per_node: 5000\n", "{file}:2", "nproc_per_node", ("less than or equal to 1024",)
    ),
    "timeout-negative": Bad("script: train.py\ntimeout: -1\n", "{file}:2", "timeout", ("greater than 0", "got -1")),
    "timeout-zero": Bad("script: train.py\ntimeout: 0\n", "{file}:2", "timeout", ("greater than 0",)),
    "grace-negative": Bad(
        "script: train.py\ngrace: -1\n", "{file}:2", "grace", ("greater than or equal to 0", "got -1")
    ),
    "max-restarts-negative": Bad(
        "script: train.py\nmax_restarts: -1\n", "{file}:2", "max_restarts", ("greater than or equal to 0",)
    ),
    "nested-out-of-range": Bad(
        "script: train.py\nrpc:\n  num_worker_threads: 0\n",
        "{file}:3",
        "rpc.num_worker_threads",
        ("greater than or equal to 1",),
    ),
    "master-port-out-of-range": Bad("script: train.py\nmaster_port: 70000\n", "{file}:2", "master_port", ("65535",)),
    "start-method-unknown": Bad(
        "script: train.py\nstart_method: forkserver\n", "{file}:2", "start_method", ("'fork' or 'spawn'", "forkserver")
    ),
    "args-not-a-list": Bad("script: train.py\nargs: {a: 1}\n", "{file}:2", "args", ("valid list",)),
    "env-not-a-mapping": Bad("script: train.py\nenv: [A, B]\n", "{file}:2", "env", ("valid dictionary",)),
    "name-invalid": Bad("script: train.py\nname: 'bad name'\n", "{file}:2", "name", ("bad name",)),
    # --- ${VAR}
    "unset-var-in-list": Bad(
        f"script: train.py\nargs:\n  - --lr\n  - ${{{UNSET}}}\n",
        "{file}:4",
        "args.1",
        (f"{UNSET} is not set", f"${{{UNSET}:-default}}"),
    ),
    "unset-var-in-mapping": Bad(
        f"script: train.py\nenv:\n  FOO: pre-${{{UNSET}}}\n", "{file}:3", "env.FOO", (f"{UNSET} is not set",)
    ),
    # --- --set / -n
    "set-without-equals": Bad(
        "script: train.py\n", "--set nproc_per_node", None, ("expected KEY=VALUE",), overrides=["nproc_per_node"]
    ),
    "set-empty-key": Bad("script: train.py\n", "--set =3", None, ("expected KEY=VALUE",), overrides=["=3"]),
    "set-empty-path-part": Bad(
        "script: train.py\n", "--set a..b=1", None, ("bad key path 'a..b'",), overrides=["a..b=1"]
    ),
    "set-unparsable-value": Bad(
        "script: train.py\n",
        "--set args=[1, 2",
        "args",
        ("cannot parse value",),
        overrides=["args=[1, 2"],
        one_line=False,
    ),
    "set-into-list": Bad(
        "script: train.py\nargs: [a]\n",
        "--set args.x=1",
        "args.x",
        ("'args' is not a mapping", "no key 'x'"),
        overrides=["args.x=1"],
    ),
    "set-into-scalar": Bad(
        "script: train.py\nnproc_per_node: 2\n",
        "--set nproc_per_node.x=1",
        "nproc_per_node.x",
        ("'nproc_per_node' is not a mapping",),
        overrides=["nproc_per_node.x=1"],
    ),
    "set-unknown-key": Bad(
        "script: train.py\n",
        "--set nprocs_per_node=2",
        "nprocs_per_node",
        ("did you mean 'nproc_per_node'?",),
        overrides=["nprocs_per_node=2"],
    ),
    "set-unknown-nested-key": Bad(
        "script: train.py\nrpc: {init: true}\n",
        "--set rpc.bogus=1",
        "rpc.bogus",
        ("unknown key 'rpc.bogus'",),
        overrides=["rpc.bogus=1"],
    ),
    "set-out-of-range": Bad(
        "script: train.py\nnproc_per_node: 2\n",
        "--set nproc_per_node=0",
        "nproc_per_node",
        ("greater than or equal to 1",),
        overrides=["nproc_per_node=0"],
    ),
    "set-wrong-type": Bad(
        "script: train.py\n", "--set rpc.init=maybe", "rpc.init", ("valid boolean",), overrides=["rpc.init=maybe"]
    ),
    "set-missing-script": Bad(
        "script: train.py\n",
        "--set script=gone.py",
        "script",
        ("script not found", "gone.py"),
        overrides=["script=gone.py"],
    ),
    "n-zero": Bad("script: train.py\n", "-n 0", "nproc_per_node", ("greater than or equal to 1",), nproc=0),
    # --- devices
    "devices-bad-entry": Bad(
        "script: train.py\nnproc_per_node: 2\ndevices: [0, gpu]\n",
        "{file}:3",
        "devices.1",
        ("device entry 'gpu'", "GPU index", "'cpu'"),
    ),
    "devices-bad-word": Bad(
        "script: train.py\ndevices: gpu\n", "{file}:2", "devices", ("'cpu', 'auto', 'inherit'", "'gpu'")
    ),
    "devices-bad-type": Bad("script: train.py\ndevices: {a: 1}\n", "{file}:2", "devices", ("or a list", "got dict")),
    "devices-bool-entry": Bad("script: train.py\ndevices: [true]\n", "{file}:2", "devices.0", ("device entry True",)),
    # --- losses
    "losses-bad-regex": Bad(
        "script: train.py\nlosses:\n  pattern: 'loss=(\\d+'\n", "{file}:3", "losses.pattern", ("not a valid regex",)
    ),
    "losses-no-loss-group": Bad(
        "script: train.py\nlosses:\n  pattern: 'loss=(?P<value>\\d+)'\n",
        "{file}:3",
        "losses.pattern",
        ("(?P<loss>...)",),
    ),
    # --- env
    "env-bad-var-name": Bad(
        "script: train.py\nenv: {GOOD: 1, 1BAD: x}\n",
        "{file}:2",
        "env.1BAD",
        ("'1BAD' is not a valid environment variable name",),
    ),
    "env-var-name-with-dash": Bad("script: train.py\nenv:\n  MY-VAR: x\n", "{file}:3", "env.MY-VAR", ("'MY-VAR'",)),
    # --- rpc.name
    "rpc-name-unknown-field": Bad(
        "script: train.py\nrpc:\n  name: 'w{rnk}'\n",
        "{file}:3",
        "rpc.name",
        ("bad name template", "only {rank} and {local_rank}"),
    ),
    "rpc-name-positional": Bad(
        "script: train.py\nrpc:\n  name: 'w{0}'\n", "{file}:3", "rpc.name", ("bad name template",)
    ),
    "rpc-name-unclosed-brace": Bad(
        "script: train.py\nrpc:\n  name: 'w{rank'\n", "{file}:3", "rpc.name", ("bad name template",)
    ),
    # --- found by this corpus, fixed since
    "devices-length-mismatch": Bad(
        "script: train.py\nnproc_per_node: 2\ndevices: [0, 1, 2]\n",
        "{file}:3",
        "devices",
        ("devices lists 3 entries but nproc_per_node is 2",),
    ),
    "devices-length-mismatch-via-n": Bad(
        "script: train.py\nnproc_per_node: 2\ndevices: [0, 1]\n",
        "{file}:3",
        "devices",
        ("nproc_per_node is 3",),
        nproc=3,
    ),
    "devices-length-mismatch-via-set": Bad(
        "script: train.py\nnproc_per_node: 2\n",
        "--set devices=[0]",
        "devices",
        ("devices lists 1 entries",),
        overrides=["devices=[0]"],
    ),
    "set-below-a-non-mapping-leaf": Bad(
        "script: train.py\n", "--set rpc.init.x=1", "rpc.init", ("valid boolean",), overrides=["rpc.init.x=1"]
    ),
    "null-list-entry": Bad("script: train.py\nargs:\n  - --x\n  - null\n", "{file}:4", "args.1", ("(got None)",)),
    "null-env-value": Bad("script: train.py\nenv:\n  FOO:\n", "{file}:3", "env.FOO", ("(got None)",)),
    "bool-for-int": Bad(
        "script: train.py\nnproc_per_node: true\n", "{file}:2", "nproc_per_node", ("expected a number, got True",)
    ),
    "yaml-unhashable-key": Bad("script: train.py\n? [a, b]\n: 1\n", "{file}:2:3", None, ("unhashable",)),
    # --- issue 15 item 11: silently accepted before (each of these loaded, with a wrong value)
    "quoted-int": Bad(
        'script: train.py\nnproc_per_node: "4"\n',
        "{file}:2",
        "nproc_per_node",
        ("got the string '4'", "without quotes"),
    ),
    "quoted-float": Bad("script: train.py\ngrace: '5'\n", "{file}:2", "grace", ("got the string '5'",)),
    "quoted-bool": Bad(
        'script: train.py\nrpc:\n  init: "true"\n', "{file}:3", "rpc.init", ("got the string 'true'", "without quotes")
    ),
    "int-for-bool": Bad(
        "script: train.py\nrpc:\n  init: 1\n", "{file}:3", "rpc.init", ("expected true or false, got 1",)
    ),
    "set-quoted-int": Bad(
        "script: train.py\n",
        "--set nproc_per_node='2'",
        "nproc_per_node",
        ("got the string '2'",),
        overrides=["nproc_per_node='2'"],
    ),
    "octal-looking-int": Bad(
        "script: train.py\nnproc_per_node: 010\n",
        "{file}:2",
        "nproc_per_node",
        ("ambiguous number 010", "octal 8", "write 10"),
    ),
    "octal-looking-arg": Bad(
        "script: train.py\nargs:\n  - --mode\n  - 0755\n", "{file}:4", "args.1", ("octal 493", "quote it ('0755')")
    ),
    "octal-looking-set": Bad(
        "script: train.py\n",
        "--set master_port=029500",
        "master_port",
        ("ambiguous number 029500", "write 29500"),
        overrides=["master_port=029500"],
    ),
    "exponent-without-dot": Bad("script: train.py\ngrace: 1e3\n", "{file}:2", "grace", ("needs a dot",)),
    "base-60-looking-arg": Bad(
        "script: train.py\nargs: [--time, 1:30]\n", "{file}:2", "args.1", ("base 60", "quote it ('1:30')")
    ),
    "rpc-timeout-inf": Bad(
        "script: train.py\nrpc:\n  rpc_timeout: .inf\n", "{file}:3", "rpc.rpc_timeout", ("finite number", "inf")
    ),
    "rpc-timeout-nan": Bad(
        "script: train.py\nrpc:\n  rpc_timeout: .nan\n", "{file}:3", "rpc.rpc_timeout", ("finite number",)
    ),
    "rpc-timeout-negative": Bad(
        "script: train.py\nrpc:\n  rpc_timeout: -1\n", "{file}:3", "rpc.rpc_timeout", ("greater than 0",)
    ),
    "timeout-inf": Bad("script: train.py\ntimeout: .inf\n", "{file}:2", "timeout", ("finite number",)),
    "var-unterminated": Bad(
        "script: train.py\nenv:\n  A: ${HOME\n", "{file}:3", "env.A", ("unterminated", "'}' is missing")
    ),
    "var-shell-form": Bad(
        "script: train.py\nenv:\n  A: ${HOME-x}\n", "{file}:3", "env.A", ("only ${NAME} and ${NAME:-default}",)
    ),
    "var-no-name": Bad(
        "script: train.py\nenv:\n  A: ${}\n", "{file}:3", "env.A", ("expected ${NAME}", "$$ for a literal $")
    ),
    "var-nested-default-unset": Bad(
        f"script: train.py\nenv:\n  A: ${{{UNSET}:-${{{UNSET}_B}}}}\n", "{file}:3", "env.A", (f"{UNSET}_B is not set",)
    ),
    # --- issue 15 item 9: YAML bombs and odd shapes (the bounded-memory ones are in Part 4)
    "yaml-recursive-alias": Bad("script: train.py\nargs: &a [x, *a]\n", "{file}:2", "args.1", ("recursive alias *a",)),
    "yaml-alias-without-anchor": Bad(
        "script: train.py\nargs: *nope\n", "{file}:2", "args", ("alias *nope has no anchor",)
    ),
    "yaml-too-deep-block": Bad(
        "script: train.py\nenv:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 40)),
        "{file}:34",
        "env." + ".".join(f"k{i}" for i in range(1, 32)),
        ("nested more than 32 levels",),
    ),
    "yaml-two-documents": Bad("script: train.py\n---\nscript: other.py\n", "{file}:2", None, ("one YAML document",)),
    "yaml-python-tag": Bad(
        "script: !!python/name:os.system train.py\n", "{file}:1", "script", ("unsupported YAML tag",)
    ),
    "yaml-set-tag": Bad("script: train.py\nargs: !!set {a, b}\n", "{file}:2", "args", ("unsupported YAML tag",)),
    # --- issue 13: a nested typo names the nested key, on its own line
    "unknown-nested-key-named-like-a-type": Bad(
        "script: train.py\nrpc:\n  int: true\n",
        "{file}:3",
        "rpc.int",
        ("unknown key 'rpc.int'", "did you mean 'rpc.init'?"),
    ),
    "set-unknown-nested-key-named-like-a-type": Bad(
        "script: train.py\n",
        "--set rpc.int=true",
        "rpc.int",
        ("unknown key 'rpc.int'", "did you mean 'rpc.init'?"),
        overrides=["rpc.int=true"],
    ),
    "env-key-named-like-a-type": Bad("script: train.py\nenv:\n  str: [x]\n", "{file}:3", "env.str", ("got ['x']",)),
}

XFAIL: dict[str, str] = {}  # case id → reason, for known bugs (strict)


def _bad_params() -> list:
    params = []
    for case_id, case in BAD.items():
        marks = [pytest.mark.xfail(reason=XFAIL[case_id], strict=True)] if case_id in XFAIL else []
        params.append(pytest.param(case, id=case_id, marks=marks))
    return params


def _load_bad(tmp_path: Path, case: Bad) -> tuple[ConfigError, Path]:
    (tmp_path / "train.py").write_text("")
    if case.path == "missing":
        path = tmp_path / "no-such.yaml"
    elif case.path == "dir":
        path = tmp_path / "adir.yaml"
        path.mkdir()
    else:
        path = tmp_path / "job.yaml"
        path.write_text(case.text)
    with pytest.raises(ConfigError) as info:
        load_config(path, case.overrides, nproc_per_node=case.nproc)
    return info.value, path


def test_corpus_is_big_enough():
    assert len([c for c in BAD if c not in XFAIL]) >= 14


@pytest.mark.parametrize("case", _bad_params())
def test_bad_config(tmp_path, case: Bad):
    error, path = _load_bad(tmp_path, case)
    rendered = str(error)
    if case.where is None:
        assert error.where is None
        assert str(path) in rendered  # the message itself names the file
    else:
        where = case.where.format(file=path)
        if where.endswith(":"):  # YAML syntax error: FILE:LINE:COL
            assert error.where is not None and error.where.startswith(where), error.where
            assert error.where[len(where) :].isdigit(), error.where
        else:
            assert error.where == where
        assert rendered.startswith(f"{error.where}: ")
    assert error.key == case.key
    if case.key:
        assert f"key '{case.key}'" in rendered
    for phrase in case.phrases:
        assert phrase in error.message, (phrase, error.message)
    if case.one_line:
        assert "\n" not in error.message  # one error, one line ("also ..." lines would mean several)
    assert error.exit_code == 2


def test_several_errors_first_by_line_then_also(write):
    path = write("script: train.py\ngrace: -1\nnproc_per_node: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    error = info.value
    assert error.where == f"{path}:2"
    assert error.key == "grace"
    assert f"\n  also {path}:3: key 'nproc_per_node': " in error.message


def test_bad_env_name_message_names_the_variable(write):
    # Works today: the variable is named in the message, even though the location is the `env:` line.
    path = write("script: train.py\nenv:\n  GOOD: 1\n  1BAD: x\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "'1BAD'" in info.value.message
    assert info.value.where.startswith(f"{path}:")


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("script: train.py\nnproc_per_node: 2\ndevices:\n  - 0\n  - gpu\n", 5, "devices.1"),
        ("script: train.py\nenv:\n  GOOD: 1\n  1BAD: x\n", 4, "env.1BAD"),
    ],
    ids=["devices-entry", "env-name"],
)
def test_entry_errors_point_at_the_entry(write, text, line, key):
    path = write(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (info.value.where, info.value.key) == (f"{path}:{line}", key)


def test_devices_word_message_has_no_repeated_got(write):
    with pytest.raises(ConfigError) as info:
        load_config(write("script: train.py\ndevices: gpu\n"))
    assert info.value.message.count("got 'gpu'") == 1


def test_set_parse_error_is_one_line(write):
    with pytest.raises(ConfigError) as info:
        load_config(write("script: train.py\n"), ["args=[1, 2"])
    assert "\n" not in info.value.message
    assert "<unicode string>" not in info.value.message


def test_unset_var_is_checked_even_when_set_overrides_the_key(write):
    # Documented order (expansion before overrides): --set cannot rescue an unset ${VAR}.
    path = write(f"script: train.py\nargs:\n  - ${{{UNSET}}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["args=[x]"])
    assert info.value.where == f"{path}:3"


# =============================================================================================
# Part 2b: hostile files (issue 15 items 9 and 12), each loaded in a child process whose address
# space may grow by at most 200 MB past what its imports take, and with a deadline: so a bomb
# that still went off ends as a MemoryError or a timeout, a test failure, never a stuck machine.

MEMORY_BUDGET = 200 << 20

_BOUNDED = textwrap.dedent(
    """
    import json, resource, sys
    from rpcctl.commands.launch import parse_ranks
    from rpcctl.config import load_config
    from rpcctl.base.errors import RpcctlError
    status = open("/proc/self/status").read()
    vm = int(status.split("VmSize:")[1].split()[0]) * 1024
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[1]), vm + int(sys.argv[1])))
    try:
        exec(sys.argv[2])
        error = None
    except RpcctlError as exc:
        error = str(exc)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss
    print(json.dumps({"error": error, "grown": grown}))
    """
)


def run_bounded(statement: str, cwd: Path, timeout: float = 60) -> dict:
    """Run ``statement`` in a child with ``MEMORY_BUDGET``: its RpcctlError (or None) and peak RSS growth."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _BOUNDED, str(MEMORY_BUDGET), statement],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{statement} did not finish in {timeout} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["grown"] < MEMORY_BUDGET, result
    return result


def load_bounded(path: Path, timeout: float = 60) -> dict:
    return run_bounded(f"load_config({str(path)!r})", path.parent, timeout)


def billion_laughs(levels: int = 9) -> str:
    lines = ["script: train.py", 'args: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"env{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_in_bounded_memory(tmp_path, script):
    path = tmp_path / "laughs.yaml"
    path.write_text(billion_laughs())
    assert path.stat().st_size < 600  # 9**9 strings once expanded
    result = load_bounded(path)
    assert "more than 10,000 values" in result["error"] and "aliases count" in result["error"], result
    assert f"{path}:" in result["error"]


def test_a_bomb_inside_a_known_key_is_refused_too(tmp_path, script):
    # Every anchor inside `args`, a key the schema accepts: stopped by the parser's budget.
    levels = ["&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
        f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)
    ]
    path = tmp_path / "laughs.yaml"
    path.write_text("script: train.py\nargs: [" + ", ".join(levels) + "]\n")
    result = load_bounded(path)
    assert "more than 10,000 values" in result["error"] and "key 'args." in result["error"], result


@pytest.mark.parametrize("shape", ["flow-lists", "flow-mappings"])
def test_20000_deep_nesting_is_refused(tmp_path, script, shape):
    opener, closer = ("[", "]") if shape == "flow-lists" else ("{a: ", "}")
    path = tmp_path / "deep.yaml"
    path.write_text("script: train.py\nargs: " + opener * 20000 + closer * 20000 + "\n")
    result = load_bounded(path)
    assert result["error"] and "nest" in result["error"], result  # ours (32 levels) or libyaml's own bound
    assert "Recursion" not in result["error"]


def test_many_values_without_aliases_are_refused(tmp_path, script):
    path = tmp_path / "wide.yaml"
    path.write_text("script: train.py\nargs: [" + ", ".join(["a"] * 200_000) + "]\n")  # 600 kB, under the size cap
    result = load_bounded(path)
    assert "more than 10,000 values" in result["error"], result


def test_a_config_over_1_mib_is_refused_before_parsing(tmp_path, script):
    path = tmp_path / "big.yaml"
    path.write_text("script: train.py\nenv:\n" + "".join(f"  V{i}: value-{i}\n" for i in range(80_000)))
    assert path.stat().st_size > 1 << 20
    result = load_bounded(path)
    assert "too big" in result["error"] and "limit is 1 MiB" in result["error"], result
    # A sparse 8 GiB file: refused by its size, never read.
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as f:
        f.truncate(8 << 30)
    result = load_bounded(huge, timeout=30)
    assert "too big" in result["error"], result


def test_a_fifo_as_config_path_is_refused_without_blocking(tmp_path, script):
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    result = load_bounded(fifo, timeout=30)  # opening a FIFO for reading blocks until a writer comes
    assert result["error"] == f"config path is a FIFO, not a regular file: {fifo}", result


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_as_config_path_is_refused(tmp_path, script, device):
    result = load_bounded(Path(device), timeout=30)
    assert result["error"] == f"config path is a character device, not a regular file: {device}", result


def test_a_config_is_parsed_once(write, monkeypatch):
    # The parser class is wrapped (not replaced) to count its uses: it was run twice per file before.
    from rpcctl.config import bounded_yaml

    parsed = []

    class Counting(bounded_yaml._Loader):
        def __init__(self, text):
            parsed.append(text)
            super().__init__(text)

    monkeypatch.setattr(bounded_yaml, "_Loader", Counting)
    text = "script: train.py\nnproc_per_node: 2\n"
    assert load_config(write(text), ["grace=1"]).grace == 1
    assert parsed == [text, "1"]  # the file once, the --set value once


def test_a_symlink_to_a_regular_file_is_fine(tmp_path, script):
    (tmp_path / "real.yaml").write_text("script: train.py\n")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "real.yaml")
    assert load_config(tmp_path / "link.yaml").nproc_per_node == 1


# =============================================================================================
# Part 3: through the CLI


@pytest.fixture
def cli(monkeypatch, tmp_path):
    """A CliRunner with a fixed-width, colourless console (injected as documented in rpcctl.console),
    cwd in tmp_path, and a launcher that refuses to start anything: these tests must never spawn."""

    def _must_not_launch(*args, **kwargs):
        raise AssertionError("launch_job was called: the CLI tried to start a job")

    monkeypatch.setattr(launch_cmd, "launch_job", _must_not_launch)
    monkeypatch.chdir(tmp_path)
    set_console(
        Console(
            out=RichConsole(width=400, no_color=True, highlight=False, force_terminal=False, soft_wrap=False),
            err=RichConsole(
                stderr=True, width=400, no_color=True, highlight=False, force_terminal=False, soft_wrap=True
            ),
        )
    )
    runner = CliRunner()
    yield runner
    set_console(None)


def _assert_config_error(result, runs: Path, *must_contain: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    stderr = result.stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[0] == errors[0], stderr
    # anything after the one message is its own continuation ("  also FILE:LINE: ..."), not another message
    assert all(line.startswith("  also ") for line in lines[1:]), stderr
    for text in must_contain:
        assert text in errors[0], (text, stderr)
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert not runs.exists(), "a bad config must not create a run directory"
    return errors[0]


CLI_BAD = {
    "unknown-key": (
        "script: train.py\nnprocs_per_node: 2\n",
        [],
        2,
        "nprocs_per_node",
        "did you mean 'nproc_per_node'?",
    ),
    "out-of-range": (
        "script: train.py\nname: ok\nnproc_per_node: 0\n",
        [],
        3,
        "nproc_per_node",
        "greater than or equal to 1",
    ),
    "nested-typo": (
        "script: train.py\nrpc:\n  num_worker_thread: 4\n",
        [],
        3,
        "rpc.num_worker_thread",
        "num_worker_threads",
    ),
    "missing-script": ("script: missing.py\n", [], 1, "script", "script not found"),
    "unset-var": (f"script: train.py\nargs: [--x]\nenv:\n  A: ${{{UNSET}}}\n", [], 4, "env.A", "is not set"),
    "bad-regex": ("script: train.py\nlosses:\n  pattern: '('\n", [], 3, "losses.pattern", "not a valid regex"),
    "duplicate": ("script: train.py\ngrace: 1\ngrace: 2\n", [], 3, "grace", "duplicate key"),
}


@pytest.mark.parametrize("case", list(CLI_BAD.values()), ids=list(CLI_BAD))
def test_cli_bad_config(cli, tmp_path, script, case):
    text, extra, line, key, phrase = case
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    runs = tmp_path / "runs"
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(runs), *extra])
    error = _assert_config_error(result, runs, f"{cfg}:{line}: key '{key}': ", phrase)
    assert error.startswith(f"error: {cfg}:{line}: key '{key}': ")


def test_cli_yaml_syntax_error(cli, tmp_path, script):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("script: train.py\nrpc:\n  init: true\n   name: x\n")
    runs = tmp_path / "runs"
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(runs)])
    _assert_config_error(result, runs, f"error: {cfg}:4:", "YAML syntax error")


def test_cli_bad_set(cli, tmp_path, script):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text("script: train.py\nargs: [a]\n")
    runs = tmp_path / "runs"
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(runs), "--set", "args.x=1"])
    _assert_config_error(result, runs, "error: --set args.x=1: key 'args.x': 'args' is not a mapping")
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(runs), "-s", "nproc_per_node"])
    _assert_config_error(result, runs, "error: --set nproc_per_node: expected KEY=VALUE")


def test_cli_bad_n(cli, tmp_path, script):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text("script: train.py\n")
    runs = tmp_path / "runs"
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(runs), "-n", "0"])
    _assert_config_error(result, runs, "error: -n 0: key 'nproc_per_node': ")


def test_cli_missing_config_file(cli, tmp_path):
    runs = tmp_path / "runs"
    missing = tmp_path / "nope.yaml"
    result = cli.invoke(app, ["launch", str(missing), "--runs-dir", str(runs)])
    _assert_config_error(result, runs, "config file not found", str(missing))


def test_cli_gpu_that_does_not_exist(cli, tmp_path, script):
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text("script: train.py\ndevices: [0]\n")
    runs = tmp_path / "runs"
    # CUDA_VISIBLE_DEVICES="" makes probe_node see no GPUs, whatever this machine has.
    result = cli.invoke(
        app, ["launch", str(cfg), "--runs-dir", str(runs), "--dry-run"], env={"CUDA_VISIBLE_DEVICES": ""}
    )
    _assert_config_error(result, runs, "key 'devices.0'", "GPU 0 does not exist", "visible GPUs: none")


def test_cli_gpu_that_does_not_exist_names_the_file(cli, tmp_path, script):
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text("script: train.py\ndevices: [0]\n")
    result = cli.invoke(
        app, ["launch", str(cfg), "--runs-dir", str(tmp_path / "runs"), "--dry-run"], env={"CUDA_VISIBLE_DEVICES": ""}
    )
    assert f"{cfg}:2" in result.stderr


def test_cli_debug_adds_traceback(cli, tmp_path, script):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("script: train.py\ngrace: -1\n")
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(tmp_path / "runs")], env={"RPCCTL_DEBUG": "1"})
    assert result.exit_code == 2
    assert "Traceback" in result.stderr
    assert f"error: {cfg}:2: key 'grace': " in result.stderr


def test_cli_ranks_out_of_range(cli, tmp_path, script):
    cfg = tmp_path / "two.yaml"
    cfg.write_text("script: train.py\nnproc_per_node: 2\n")
    runs = tmp_path / "runs"
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(runs), "--ranks", "5"])
    _assert_config_error(result, runs, "--ranks", "rank 5 does not exist", "0-1")
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(runs), "--ranks", "zero"])
    _assert_config_error(result, runs, "--ranks", "'zero'")


def test_cli_json_without_dry_run(cli, tmp_path, script):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text("script: train.py\n")
    runs = tmp_path / "runs"
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(runs), "--json"])
    _assert_config_error(result, runs, "--json goes with --dry-run")


# --- parse_ranks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", {0}), ("0,2", {0, 2}), ("0-3", {0, 1, 2, 3}), (" 1 , 0-1 ", {0, 1}), ("3-3", {3})],
)
def test_parse_ranks(text, expected):
    assert parse_ranks(text, 4) == expected


@pytest.mark.parametrize(
    ("text", "phrase"),
    [("x", "'x'"), ("1-", "'1-'"), ("", "''"), ("4", "rank 4 does not exist"), ("0-9", "rank 4"), ("-1", "'-1'")],
)
def test_parse_ranks_errors(text, phrase):
    with pytest.raises(UsageError) as info:
        parse_ranks(text, 4)
    assert phrase in str(info.value)


@pytest.mark.parametrize("text", ["0-99999999999", "99999999999", "0-" + "9" * 5000, "3,0-4294967296"])
def test_parse_ranks_checks_a_range_before_building_it(tmp_path, text):
    # Today's code built the whole set first (0-99999999999: 10 GB), so run it with a memory cap.
    result = run_bounded(f"parse_ranks({text!r}, 4)", tmp_path, timeout=30)
    assert result["error"] and "does not exist (the job has ranks 0-3)" in result["error"], result


def test_cli_ranks_empty(cli, tmp_path, script):
    cfg = tmp_path / "two.yaml"
    cfg.write_text("script: train.py\nnproc_per_node: 2\n")
    runs = tmp_path / "runs"
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(runs), "--dry-run", "--ranks", ""])
    _assert_config_error(result, runs, "--ranks '': no rank given", "0,2 or 0-3")


def test_parse_ranks_on_a_later_node():
    # Node 1 of a job with 4 ranks per node shows global ranks 4-7 (the pump keys lines by them).
    assert parse_ranks("4,6-7", 8, first=4) == {4, 6, 7}
    with pytest.raises(UsageError, match=r"rank 0 is not on this node \(this node has ranks 4-7\)"):
        parse_ranks("0-5", 8, first=4)
    with pytest.raises(UsageError, match=r"rank 8 does not exist \(this node has ranks 4-7\)"):
        parse_ranks("8", 8, first=4)


def test_cli_ranks_on_node_1(cli, tmp_path, script):
    cfg = tmp_path / "two.yaml"
    cfg.write_text("script: train.py\nnproc_per_node: 2\n")
    runs = tmp_path / "runs"
    node1 = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--runs-dir", str(runs)]
    result = cli.invoke(app, ["launch", str(cfg), *node1, "--ranks", "0"])
    _assert_config_error(result, runs, "--ranks: rank 0 is not on this node (this node has ranks 2-3)")


def test_parse_ranks_reversed_range():
    try:
        shown = parse_ranks("3-1", 4)
    except UsageError:
        return
    assert shown == {1, 2, 3}


BAD_HOSTS = {
    "label-over-63": ("a" * 64 + ".example", "a label of 64 characters"),
    "empty-label": ("node-0..svc", "an empty label"),
    "name-over-253": (".".join(["abcdefgh"] * 30), "269 characters; a host name has at most 253"),
    "newline": ("node-0\nsvc", "it holds "),  # '\n' (YAML folds it to ' ' in --set)
}


@pytest.mark.parametrize("source", ["file", "set", "flag", "env"])
@pytest.mark.parametrize("host", list(BAD_HOSTS), ids=list(BAD_HOSTS))
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "launch"])
def test_a_master_addr_no_resolver_takes_is_one_message_naming_its_source(
    cli, tmp_path, script, monkeypatch, source, host, dry_run
):
    """A DNS label over 63 characters, an empty label, a name over 253 or a control character,
    from the file, --set, --master-addr or $PET_MASTER_ADDR: exit 2 naming where it came from,
    before anything starts (the resolver raised UnicodeError: a traceback, in --dry-run too)."""
    value, phrase = BAD_HOSTS[host]
    monkeypatch.setenv("RPCCTL_SECRET", "0123456789abcdef0123")
    cfg = tmp_path / "job.yaml"
    text = "script: train.py\nnproc_per_node: 1\nnnodes: 2\nnode_rank: 1\n"
    args: list[str] = []
    if source == "file":
        text += f"master_addr: {json.dumps(value)}\n"
        where = f"{cfg}:5: key 'master_addr': not an IP address or a host name"
    elif source == "set":
        args = ["--set", f"master_addr={value}"]
        where = f"--set master_addr={value}: key 'master_addr': not an IP address or a host name"
    elif source == "flag":
        args = ["--master-addr", value]
        where = f"--master-addr {value}: key 'master_addr': not an IP address or a host name"
    else:
        monkeypatch.setenv("PET_MASTER_ADDR", value)
        where = f"$PET_MASTER_ADDR={value!r}" if len(value) <= 80 else "$PET_MASTER_ADDR="
        where += " is not an IP address or a host name" if len(value) <= 80 else ""
    cfg.write_text(text)
    runs = tmp_path / "runs"
    result = cli.invoke(app, ["launch", str(cfg), "--runs-dir", str(runs), *args, *(["--dry-run"] if dry_run else [])])
    # the message quotes it with repr in its "(got ...)"; its first line is checked
    if "\n" in value and source in ("set", "flag"):
        assert result.exit_code == 2 and "Traceback" not in result.output and not runs.exists(), result.output
        assert result.stderr.startswith(f"error: {where.splitlines()[0]}") and phrase in result.stderr, result.stderr
        return
    error = _assert_config_error(result, runs, phrase)
    assert error.startswith(f"error: {where}"), error


@pytest.mark.parametrize(
    "host", ["10.0.0.1", "node-0.train.default.svc.cluster.local", "a" * 63 + ".b", "fqdn.example."]
)
def test_a_master_addr_that_is_a_host_name_or_an_address_is_taken(write, host):
    spec = load_config(write(f"script: train.py\nnnodes: 2\nmaster_addr: {json.dumps(host)}\n"))
    assert spec.master_addr == host
