"""``rpcctl sbatch CONFIG --nodes N``: submit a multi-node job to SLURM (``--nodes MIN:MAX``: elastic)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer

from rpcctl.commands.common import RunsDirOption, write_output
from rpcctl.config import load_config
from rpcctl.console import get_console
from rpcctl.base.private import make_parents
from rpcctl.records.runs import check_runs_dir, default_runs_dir, write_json_atomic
from rpcctl.schedulers.nodes import parse_nodes, spec_nodes
from rpcctl.schedulers.slurm import batch_script, submit


def sbatch(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The job's YAML config.", show_default=False)],
    nodes: Annotated[
        Optional[str],
        typer.Option(
            "--nodes",
            "--nnodes",
            "-N",
            metavar="N|MIN:MAX",
            help="Nodes to run on, one launcher each; MIN:MAX: elastic, on as many as SLURM gives at once "
            "(--nodes=MIN-MAX, --no-kill) (default: the config's nnodes).",
            show_default=False,
        ),
    ] = None,
    partition: Annotated[
        Optional[str], typer.Option("--partition", "-p", help="SLURM partition.", show_default=False)
    ] = None,
    time_limit: Annotated[
        Optional[str], typer.Option("--time", "-t", help="SLURM time limit, e.g. 1:00:00.", show_default=False)
    ] = None,
    set_: Annotated[
        Optional[list[str]],
        typer.Option("--set", "-s", help="Override a config key (passed on to every launcher).", show_default=False),
    ] = None,
    sbatch_arg: Annotated[
        Optional[list[str]],
        typer.Option(
            "--sbatch-arg", help="Extra #SBATCH directive, e.g. --gpus-per-node=8. Repeatable.", show_default=False
        ),
    ] = None,
    runs_dir: RunsDirOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the batch script and submit nothing.")] = False,
) -> None:
    """Write a batch script that runs CONFIG on N nodes with srun, and submit it."""
    console = get_console()
    spec = load_config(config, set_ or [])  # bad configs fail here, before SLURM sees them
    wanted = parse_nodes(nodes, "--nodes") if nodes is not None else spec_nodes(spec)
    runs = (runs_dir or default_runs_dir()).resolve()
    script = batch_script(
        config=config.resolve(),
        name=spec.name,
        nodes=wanted,
        runs_dir=runs,
        overrides=set_ or [],
        partition=partition,
        time_limit=time_limit,
        extra_sbatch=sbatch_arg or [],
    )
    if dry_run:
        console.raw(script)
        return
    for warning in check_runs_dir(runs, f"--runs-dir {runs}"):  # the script is read by sbatch later: no one may swap it
        console.warn(warning)
    make_parents(runs / "script")
    path = runs / f"sbatch-{spec.name}-{datetime.now():%Y%m%d-%H%M%S}.sh"
    write_output(path, script, "--runs-dir")  # 0600 (a --set value can be a secret), renamed into place
    job_id = submit(path)
    write_json_atomic(
        path.with_suffix(".json"),
        {
            "slurm_job_id": job_id,
            "script": str(path),
            "config": str(config.resolve()),
            "nodes": str(wanted) if wanted.elastic else wanted.high,
        },
    )
    console.print(job_id)
    console.info(
        f"rpcctl: submitted SLURM job {job_id} ({wanted} node(s)); script {path}; output {runs}/slurm-{job_id}.out"
    )
