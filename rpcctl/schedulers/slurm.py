"""SLURM: read node count, node rank and master host from an ``srun`` step's environment, and
write the batch script that ``rpcctl sbatch`` submits.

Under ``srun --ntasks-per-node=1 rpcctl launch CONFIG`` no flag is needed:

==================================  =======================================================
SLURM_STEP_NUM_NODES / SLURM_NNODES  nnodes
SLURM_NODEID                         node_rank
SLURM_STEP_NODELIST / ..._JOB_...    master_addr: its first host (``scontrol show hostnames``)
SLURM_STEP_TASKS_PER_NODE            must be 1: one launcher per node
==================================  =======================================================

An elastic job (``nnodes: "MIN:MAX"`` or ``--nnodes MIN:MAX``, issue 43) keeps its range, and
its rendezvous endpoint is that first host (torchrun's ``--rdzv-endpoint $head:port``): the
launcher there hosts it; no node rank is read (the rendezvous numbers the nodes). A SLURM job
never grows after it starts, so the step's node count caps MAX (``MIN:N``): the first round
starts as soon as every node SLURM gave has come, not after a last call for nodes that cannot
come. A step of fewer than MIN or more than MAX nodes is refused (exit 2).

``rpcctl sbatch --nodes MIN:MAX`` writes ``--nodes=MIN-MAX`` (SLURM starts the job on as many
nodes as it can give at once, at least MIN) and ``--no-kill`` (a node that fails leaves the
allocation and the job goes on), without ``#SBATCH --ntasks-per-node=1`` (with it SLURM gave
MIN nodes where MAX were idle). The step runs ``--kill-on-bad-exit=0`` (one node's launcher
that dies does not end the others') and the script ends with node 0's exit code, the
rendezvous host's verdict on the whole job, which its run record holds.

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
from rpcctl.schedulers.nodes import Nodes


def in_srun_step(env: Mapping[str, str]) -> bool:
    return "SLURM_STEP_ID" in env and "SLURM_NODEID" in env


def _number(env: Mapping[str, str], name: str, low: int) -> int:
    text = env[name].strip()
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) < low:
        raise UsageError(f"${name}={env[name]!r} is not a whole number of at least {low}: is this a SLURM step?")
    return int(text)


def step_nodes(env: Mapping[str, str]) -> tuple[int, str]:
    """The srun step's node count and the variable that said it."""
    for name in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"):
        if env.get(name, "").strip():
            return _number(env, name, 1), name
    return 1, "SLURM_NNODES"


def slurm_flags(env: Mapping[str, str], wanted: Nodes | None = None) -> dict[str, tuple[Any, str]]:
    """Config values implied by the SLURM step we run in (empty outside srun or on one node).
    ``wanted``: the nodes the job asks for (a flag, else its config); a range makes it elastic."""
    if not in_srun_step(env):
        return {}
    nnodes, name = step_nodes(env)
    elastic = wanted is not None and wanted.elastic
    if nnodes <= 1 and not elastic:
        return {}
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1"
    if tasks.split("(")[0] != "1":
        raise UsageError(
            f"rpcctl runs one launcher per node, but this srun step has {tasks} tasks per node: "
            "use srun --ntasks-per-node=1 (nproc_per_node sets the ranks per node)"
        )
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    master = first_host(nodelist)
    if elastic:
        if not wanted.low <= nnodes <= wanted.high:
            raise UsageError(
                f"nnodes {wanted} (elastic), but this srun step has {nnodes} node(s) (${name}): "
                + (
                    "a SLURM job never grows, so it would wait for nodes that cannot come"
                    if nnodes < wanted.low
                    else "one launcher per node, and at most MAX of them"
                )
                + f"; run it on {wanted.low} to {wanted.high} nodes "
                f"(srun -N, sbatch --nodes={wanted.low}-{wanted.high})"
            )
        return {  # MAX capped at what SLURM gave; the rendezvous numbers the nodes
            "nnodes": (f"{wanted.low}:{nnodes}", f"{name}={nnodes} (of nnodes {wanted}: a SLURM job does not grow)"),
            "master_addr": (master, f"first of SLURM_JOB_NODELIST={nodelist}"),
        }
    return {
        "nnodes": (nnodes, f"SLURM_NNODES={nnodes}"),
        "node_rank": (_number(env, "SLURM_NODEID", 0), f"SLURM_NODEID={env['SLURM_NODEID']}"),
        "master_addr": (master, f"SLURM_JOB_NODELIST={nodelist}"),
    }


def caps_the_range(flags: Mapping[str, tuple[Any, str]]) -> bool:
    """``slurm_flags`` gave an elastic range capped at the step's nodes: it stands over a flag's
    range (which it already took in)."""
    value = flags.get("nnodes", (None, ""))[0]
    return isinstance(value, str) and "a SLURM job does not grow" in flags["nnodes"][1]


def first_host(nodelist: str) -> str:
    if not nodelist:
        raise UsageError("SLURM_JOB_NODELIST is empty: cannot tell which node hosts the rendezvous")
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
        ).stdout
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
    nodes: int | Nodes,
    runs_dir: Path,
    overrides: list[str],
    partition: str | None,
    time_limit: str | None,
    extra_sbatch: list[str],
    python: str = sys.executable,
) -> str:
    """A batch script that runs one rpcctl launcher per node with ``srun``; on MIN to MAX nodes
    when ``nodes`` is an elastic range."""
    runs = check_directive_value(str(runs_dir), "--runs-dir")
    if "\\" in runs:  # in --output, a backslash turns sbatch's %j off
        raise UsageError(f"--runs-dir {runs!r}: a backslash cannot be in the path of sbatch's --output")
    elastic = isinstance(nodes, Nodes) and nodes.elastic
    count = nodes.high if isinstance(nodes, Nodes) else nodes
    directives = [directive("the config's name", name, "--job-name")]
    if elastic:  # no --ntasks-per-node here: with it, sbatch --nodes=1-2 got 1 node where 2 were idle
        directives += [f"#SBATCH --nodes={nodes.low}-{nodes.high}", "#SBATCH --no-kill"]
    else:
        directives += [f"#SBATCH --nodes={count}", "#SBATCH --ntasks-per-node=1"]
    directives.append(directive("--runs-dir", runs.replace("%", "%%") + "/slurm-%j.out", "--output"))
    if partition:
        directives.append(directive("--partition", partition, "--partition"))
    if time_limit:
        directives.append(directive("--time", time_limit, "--time"))
    directives += [extra_directive(d) for d in extra_sbatch]
    launch = [*module_command("rpcctl", python), "launch", str(config), "--no-live", "--runs-dir", str(runs_dir)]
    if elastic:
        launch += ["--nnodes", str(nodes)]
    for override in overrides:
        launch += ["--set", override]
    head = [
        "#!/bin/bash",
        *directives,
        "# Written by `rpcctl sbatch`. One launcher per node; each reads its node rank, the node",
        "# count and the master host from SLURM. The secret that signs the nodes' rendezvous is",
        "# made here, at run time, and reaches every node through srun's environment only.",
        "set -euo pipefail",
        'export RPCCTL_SECRET="$(' + shlex.quote(python) + " -c 'import secrets; print(secrets.token_hex(16))')\"",
        f"mkdir -p {shlex.quote(str(runs_dir))}",
    ]
    if not elastic:
        return "\n".join(
            [*head, "srun --ntasks-per-node=1 --kill-on-bad-exit=1 " + " ".join(shlex.quote(a) for a in launch), ""]
        )
    exit_file = shlex.quote(str(runs_dir)) + '/slurm-"$SLURM_JOB_ID".node0-exit'
    keep = '"$@"; code=$?; if [ "$SLURM_NODEID" = 0 ]; then echo "$code" > "$RPCCTL_NODE0_EXIT"; fi; exit "$code"'
    return "\n".join(
        [
            *head,
            f"# Elastic ({nodes}): SLURM starts the job on {nodes.low} to {nodes.high} nodes and adds none later; a "
            "node lost (--no-kill)",
            "# or whose launcher dies (--kill-on-bad-exit=0) leaves the job, which goes on while MIN remain.",
            "# The job's exit code is node 0's, the rendezvous host's verdict on the whole job.",
            f"export RPCCTL_NODE0_EXIT={exit_file}",
            'rm -f "$RPCCTL_NODE0_EXIT"',
            "set +e",
            "srun --ntasks-per-node=1 --kill-on-bad-exit=0 --no-kill bash -c "
            + shlex.quote(keep)
            + " rpcctl-node "
            + " ".join(shlex.quote(a) for a in launch),
            "step=$?",
            'node0=$(cat "$RPCCTL_NODE0_EXIT" 2>/dev/null || true)',
            'rm -f "$RPCCTL_NODE0_EXIT"',
            'exit "${node0:-$step}"',
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
        raise RpcctlError(
            "sbatch is not installed here (is this a SLURM login node?); use --dry-run to see the script"
        ) from None
    if result.returncode != 0:
        raise RpcctlError(f"sbatch failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout.strip().split(";")[0]
