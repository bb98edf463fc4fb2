"""SLURM: read node count, node rank and master host from an ``srun`` step's environment, and
write the batch script that ``rpcctl sbatch`` submits.

Under ``srun --ntasks-per-node=1 rpcctl launch CONFIG`` no flag is needed:

==================================  =======================================================
SLURM_STEP_NUM_NODES / SLURM_NNODES  nnodes
SLURM_NODEID                         node_rank
SLURM_STEP_NODELIST / ..._JOB_...    master_addr: its first host (``scontrol show hostnames``)
SLURM_STEP_TASKS_PER_NODE            must be 1: one launcher per node
==================================  =======================================================

The batch script's ``#SBATCH`` lines are read by sbatch, not by the shell: one line each (a
newline would end the directive and start a shell line, and the first line that is not a
directive ends them all), split into words at white space, with ``"..."``/``'...'`` grouping,
a backslash escaping the next character, and an unquoted ``#`` starting a comment (sbatch's
``_get_argument``, src/sbatch/opt.c). So a value with a newline or another control character
is refused (exit 2, naming its flag), and a word that is not plain is written in double quotes
(``directive_word``). In ``--output``, ``%`` is sbatch's pattern character: a runs directory's
own ``%`` is written ``%%``. What the shell runs is quoted with ``shlex.quote``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rpcctl.base.errors import RpcctlError, UsageError
from rpcctl.base.python_cmd import module_command


def in_srun_step(env: Mapping[str, str]) -> bool:
    return "SLURM_STEP_ID" in env and "SLURM_NODEID" in env


def slurm_flags(env: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    """Config values implied by the SLURM step we run in (empty outside srun or on one node)."""
    if not in_srun_step(env):
        return {}
    nnodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    if nnodes <= 1:
        return {}
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1"
    if tasks.split("(")[0] != "1":
        raise UsageError(
            f"rpcctl runs one launcher per node, but this srun step has {tasks} tasks per node: "
            "use srun --ntasks-per-node=1 (nproc_per_node sets the ranks per node)"
        )
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    master = first_host(nodelist)
    return {
        "nnodes": (nnodes, f"SLURM_NNODES={nnodes}"),
        "node_rank": (int(env["SLURM_NODEID"]), f"SLURM_NODEID={env['SLURM_NODEID']}"),
        "master_addr": (master, f"SLURM_JOB_NODELIST={nodelist}"),
    }


def first_host(nodelist: str) -> str:
    if not nodelist:
        raise UsageError("SLURM_JOB_NODELIST is empty: cannot tell which node hosts the rendezvous")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RpcctlError(f"`scontrol show hostnames {nodelist}` failed: {exc}") from None
    hosts = out.split()
    if not hosts:
        raise RpcctlError(f"`scontrol show hostnames {nodelist}` printed no host")
    return hosts[0]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def check_directive_value(value: str, flag: str) -> str:
    """``value`` if it can stand in an ``#SBATCH`` line; a UsageError naming ``flag`` if not."""
    bad = _CONTROL.search(value)
    if bad:
        what = "newline" if bad.group() in "\r\n" else "control character"
        raise UsageError(f"{flag} {value!r}: a {what} ({bad.group()!r}) cannot be in an #SBATCH directive")
    return value


def directive_word(word: str) -> str:
    """One word of an ``#SBATCH`` line, as sbatch reads it back: plain, or in double quotes with
    ``\\`` and ``\"`` escaped (white space, quotes and ``#`` inside stay in the word)."""
    if _PLAIN_WORD.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def directive(flag: str, value: str, option: str) -> str:
    """``#SBATCH --option=value`` for the value of rpcctl's ``flag``, checked and quoted."""
    return f"#SBATCH {directive_word(f'{option}={check_directive_value(value, flag)}')}"


def extra_directive(text: str) -> str:
    """An ``--sbatch-arg``: its words as a shell would split them (``-A acct``, ``--comment='a b'``),
    each written as sbatch reads a word back."""
    check_directive_value(text, "--sbatch-arg")
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--sbatch-arg {text!r}: {exc}") from None
    if not words:
        raise UsageError("--sbatch-arg '': an empty directive")
    return "#SBATCH " + " ".join(directive_word(w) for w in words)


def batch_script(
    *,
    config: Path,
    name: str,
    nodes: int,
    runs_dir: Path,
    overrides: list[str],
    partition: str | None,
    time_limit: str | None,
    extra_sbatch: list[str],
    python: str = sys.executable,
) -> str:
    """A batch script that runs one rpcctl launcher per node with ``srun``."""
    runs = check_directive_value(str(runs_dir), "--runs-dir")
    if "\\" in runs:  # in --output, a backslash turns sbatch's %j off
        raise UsageError(f"--runs-dir {runs!r}: a backslash cannot be in the path of sbatch's --output")
    directives = [
        directive("the config's name", name, "--job-name"),
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        directive("--runs-dir", runs.replace("%", "%%") + "/slurm-%j.out", "--output"),
    ]
    if partition:
        directives.append(directive("--partition", partition, "--partition"))
    if time_limit:
        directives.append(directive("--time", time_limit, "--time"))
    directives += [extra_directive(d) for d in extra_sbatch]
    launch = [*module_command("rpcctl", python), "launch", str(config), "--no-live", "--runs-dir", str(runs_dir)]
    for override in overrides:
        launch += ["--set", override]
    return "\n".join(
        [
            "#!/bin/bash",
            *directives,
            "# Written by `rpcctl sbatch`. One launcher per node; each reads its node rank, the node",
            "# count and the master host from SLURM. The secret that signs the nodes' rendezvous is",
            "# made here, at run time, and reaches every node through srun's environment only.",
            "set -euo pipefail",
            "export RPCCTL_SECRET=\"$(" + shlex.quote(python) + " -c 'import secrets; print(secrets.token_hex(16))')\"",
            f"mkdir -p {shlex.quote(str(runs_dir))}",
            "srun --ntasks-per-node=1 --kill-on-bad-exit=1 " + " ".join(shlex.quote(a) for a in launch),
            "",
        ]
    )


def submit(script: Path) -> str:
    """Submit ``script``; it is removed if sbatch fails (or is not there): nothing was queued."""
    try:
        return _submit(script)
    except BaseException:
        script.unlink(missing_ok=True)
        raise


def _submit(script: Path) -> str:
    try:
        result = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise RpcctlError("sbatch is not installed here (is this a SLURM login node?); use --dry-run to see the script") from None
    if result.returncode != 0:
        raise RpcctlError(f"sbatch failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout.strip().split(";")[0]
