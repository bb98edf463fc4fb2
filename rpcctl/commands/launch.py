"""``rpcctl launch CONFIG``: run a job, or show its plan with ``--dry-run``."""

from __future__ import annotations

import dataclasses
import os
import re
from functools import partial
from pathlib import Path
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from rpcctl.commands.common import JsonOption, RunsDirOption
from rpcctl.config import load_config, locate
from rpcctl.console import KEY, Column, Console, get_console, human_bytes, human_seconds, render_table, sanitize
from rpcctl.base.frames import ALL_FRAMES_ENV
from rpcctl.base.errors import ConfigError, JobCancelledError, JobFailedError, UsageError
from rpcctl.launch.launcher import launch as launch_job
from rpcctl.launch.launcher import DEFAULT_MASTER_PORT, plan_job
from rpcctl.planning.plan import ENV_COLUMNS, LaunchPlan, RankPlan
from rpcctl.planning.preflight import check_before_spawn
from rpcctl.records.runs import RunRecord
from rpcctl.base.states import RunStatus
from rpcctl.schedulers.k8s import pod_flags, weak_node_rank
from rpcctl.planning.plan import visible_gpus
from rpcctl.schedulers.slurm import slurm_flags


def launch(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The job's YAML config.", show_default=False)],
    set_: Annotated[
        Optional[list[str]],
        typer.Option("--set", "-s", help="Override a config key: KEY.PATH=VALUE (YAML value). Repeatable.", show_default=False),
    ] = None,
    nproc_per_node: Annotated[Optional[int], typer.Option("--nproc-per-node", "-n", help="Ranks on this node (overrides the config).", show_default=False)] = None,
    runs_dir: RunsDirOption = None,
    no_live: Annotated[bool, typer.Option("--no-live", help="Plain rank-prefixed output instead of the live view (always plain when not on a terminal).")] = False,
    ranks: Annotated[Optional[str], typer.Option("--ranks", help="Show only these ranks' output on the console, e.g. 0,2 or 0-3 (logs keep everything).", show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the launch plan (commands, environment, devices, logs) and start nothing.")] = False,
    json_: JsonOption = False,
    hang_timeout: Annotated[Optional[float], typer.Option("--hang-timeout", help="Seconds without progress (no call ended, no loss, no output) before rpcctl diagnoses a hang; 0: off (default: the config's hang_timeout, 300 if unset).", show_default=False)] = None,
    keep_on_hang: Annotated[bool, typer.Option("--keep-on-hang", help="On a hang, dump and diagnose but keep the job running (config: on_hang: keep).")] = False,
    all_frames: Annotated[bool, typer.Option("--all-frames", help="Keep rpcctl's own frames (its bootstrap, its call tracking) in the ranks' tracebacks.")] = False,
    web: Annotated[bool, typer.Option("--web", help="Serve the run's live page on 127.0.0.1 while it runs (the URL is printed; needs rpcctl[report]).")] = False,
    nnodes: Annotated[Optional[int], typer.Option("--nnodes", help="Nodes in the job; run one launcher per node (under srun: from SLURM; in a pod: PET_NNODES).", show_default=False, rich_help_panel="Multi-node")] = None,
    node_rank: Annotated[Optional[int], typer.Option("--node-rank", help="This node's rank, 0 to nnodes-1 (under srun: SLURM_NODEID; in a pod: PET_NODE_RANK or JOB_COMPLETION_INDEX).", show_default=False, rich_help_panel="Multi-node")] = None,
    master_addr: Annotated[Optional[str], typer.Option("--master-addr", help="Host of node 0, which hosts the rendezvous (under srun: the job's first node; in a pod: PET_MASTER_ADDR).", show_default=False, rich_help_panel="Multi-node")] = None,
    master_port: Annotated[Optional[int], typer.Option("--master-port", help="Rendezvous port on node 0 (default: 29500 on several nodes, a free port on one; in a pod: PET_MASTER_PORT).", show_default=False, rich_help_panel="Multi-node")] = None,
) -> None:
    """Launch a job: spawn its ranks, stream their output, supervise them to the end.

    Multi-node values come from a flag, else the environment (a SLURM step's, a Kubernetes
    pod's), else the config; --dry-run says where each came from.

    Exit code: 0 when every rank succeeds; 1 when the job fails (the root-cause rank is
    named); 2 for a bad config or flag (nothing is started); 128 + N when stopped by signal N
    (130 SIGINT, 143 SIGTERM, 129 SIGHUP, 131 SIGQUIT).
    """
    console = get_console()
    flags = environment_flags(config, set_ or [])
    flags.update(_given(("nnodes", "--nnodes", nnodes), ("node_rank", "--node-rank", node_rank), ("master_addr", "--master-addr", master_addr),
                        ("master_port", "--master-port", master_port), ("hang_timeout", "--hang-timeout", hang_timeout),
                        ("on_hang", "--keep-on-hang", "keep" if keep_on_hang else None)))
    spec = load_config(config, set_ or [], nproc_per_node=nproc_per_node, flags=flags)
    if all_frames:  # in each rank's planned environment: the plan, --dry-run and config.yaml show it
        spec = spec.model_copy(update={"env": {**spec.env, ALL_FRAMES_ENV: "1"}})
    first_rank = spec.node_rank * spec.nproc_per_node  # ranks are global: this node's come from here
    shown = parse_ranks(ranks, first_rank + spec.nproc_per_node, first_rank) if ranks is not None else None
    if nproc_per_node is not None:
        flags["nproc_per_node"] = (nproc_per_node, f"-n {nproc_per_node}")
    located = partial(_located, config, set_ or [], flags)  # errors found later name where the key was set
    if json_ and not dry_run:
        raise UsageError("--json goes with --dry-run (a running job streams its output; see `rpcctl runs --json`)")
    if dry_run:
        plan = located(lambda: _checked_plan(spec, runs_dir))
        sources = value_sources(spec, plan, config, set_ or [], flags)
        if json_:
            console.json({**plan.to_dict(), "sources": sources})
        else:
            render_plan(console, plan, sources)
        return
    page = None
    if web:
        from rpcctl.web.server import LaunchPage

        page = LaunchPage(console)  # checks the extra is installed before anything starts
    try:
        record = located(lambda: launch_job(
            spec,
            runs_dir=runs_dir,
            console=console,
            live=not no_live and console.is_terminal,
            ranks_shown=shown,
            config_path=config,
            on_start=page.start if page else None,
        ))
    finally:
        if page is not None:
            page.stop()  # the page stops with the job
    _conclude(console, record)


def _given(*flags: tuple[str, str, Any]) -> dict[str, tuple[Any, str]]:
    """The config keys set by a flag: key → (value, how it was written)."""
    return {key: (value, f"{flag} {value}") for key, flag, value in flags if value is not None}


def _conclude(console: Console, record: RunRecord) -> None:
    """Say how the job ended; a job that did not succeed leaves, as for bench, through the cli's
    error boundary (its exit code)."""
    try:
        with console.logging_to(Path(record.run_dir) / "launcher.log"):  # the verdict too
            render_outcome(console, record)
    except OSError:  # the terminal went away (SIGHUP): the record says it all, the code still counts
        pass
    if record.status == RunStatus.CANCELLED:
        raise JobCancelledError(record.reason or "cancelled", record.exit_code or 130, reported=True)
    if record.status != RunStatus.SUCCEEDED:
        raise JobFailedError(f"job '{record.name}' {record.status} (run {record.run_id})", reported=True)


def environment_flags(config: Path, overrides: list[str], env=os.environ) -> dict[str, tuple[Any, str]]:
    """Values the environment gives: a SLURM step's, else a pod's (``rpcctl.schedulers.k8s``). An Indexed
    Job's completion index alone is a node rank only for a config of several nodes."""
    flags = slurm_flags(env)
    if flags:
        return flags
    flags = pod_flags(env, gpus=len(visible_gpus()))
    if weak_node_rank(flags) and load_config(config, overrides, flags={k: v for k, v in flags.items() if k != "node_rank"}).nnodes == 1:
        del flags["node_rank"]
    return flags


# What --dry-run says the origin of: the values a node of a multi-node job takes from flags,
# the environment or the config.
SOURCED_KEYS = ("nnodes", "node_rank", "master_addr", "master_port", "nproc_per_node")
SOURCE_COLUMNS = (Column("key", priority=KEY), Column("value", priority=KEY), Column("source", "FROM", wrap=True, priority=KEY))


def value_sources(spec, plan: LaunchPlan, config: Path, overrides: list[str], flags: dict) -> list[dict[str, Any]]:
    """Where each of ``SOURCED_KEYS`` came from: a flag, the environment (``SLURM_NODEID=1``,
    ``PET_NNODES=2``), ``--set``, the file's line, or the default."""
    rows = []
    for key in SOURCED_KEYS:
        source, value = locate(config, key, overrides=overrides, flags=flags), getattr(spec, key)
        if source == str(config):  # not in the file: the default
            source = "default"
        if key == "master_port" and value is None:  # several nodes: torchrun's; one: the free port the plan took
            value, source = (DEFAULT_MASTER_PORT, "default (several nodes)") if spec.multi_node else (plan.master_port, "default (a free port)")
        rows.append({"key": key, "value": value, "source": source})
    return rows


def _checked_plan(spec, runs_dir: Path | None) -> LaunchPlan:
    check_before_spawn(spec)  # what `launch` would refuse, a dry run refuses too
    return plan_job(spec, runs_dir)[0]


def _located(config: Path, overrides: list[str], flags: dict, action):
    """Give config errors found before spawn (a GPU that is not there, a port in use) the file
    and line of their key, or the flag that set it."""
    try:
        return action()
    except ConfigError as exc:
        if exc.where or not exc.key:
            raise
        raise ConfigError(exc.message, where=locate(config, exc.key, overrides=overrides, flags=flags), key=exc.key) from None


_RANKS_PART = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def parse_ranks(text: str, world_size: int, first: int = 0) -> set[int]:
    """``--ranks``: ranks and ranges, ``0-2,5``, of this node's ranks ``first`` to
    ``world_size - 1`` (global ranks: node k of a multi-node job has k*nproc onwards). A range
    is checked before it is expanded."""
    if not text.strip():
        raise UsageError("--ranks '': no rank given: write ranks and ranges like 0,2 or 0-3")
    has = f"the job has ranks 0-{world_size - 1}" if first == 0 else f"this node has ranks {first}-{world_size - 1}"
    ranks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        match = _RANKS_PART.fullmatch(part)
        if match is None:
            raise UsageError(f"--ranks: '{part}' is not a rank or a range like 0-3")
        low, high = (int(n) if len(n) < 19 else 10**18 for n in (match.group(1), match.group(2) or match.group(1)))
        if low > high:
            raise UsageError(f"--ranks: '{part}' is an empty range (write {high}-{low})")
        if low < first:
            raise UsageError(f"--ranks: rank {low} is not on this node ({has})")
        if high >= world_size:
            raise UsageError(f"--ranks: rank {max(low, world_size)} does not exist ({has})")
        ranks.update(range(low, high + 1))
    return ranks


def render_plan(console: Console, plan: LaunchPlan, sources: list[dict[str, Any]] | None = None) -> None:
    preload = f" (preload {sanitize(', '.join(plan.preload), markup=True)})" if plan.preload else ""
    console.print(
        f"[bold]{sanitize(plan.name, markup=True)}[/bold]: {plan.world_size} rank(s), start method {plan.start_method}{preload}, "
        f"rendezvous {sanitize(plan.master_addr, markup=True)}:{plan.master_port}\nrun directory: {sanitize(plan.run_dir, markup=True)}\n"
    )
    shared = {k: v for k, v in plan.ranks[0].env.items() if all(r.env.get(k) == v for r in plan.ranks)}
    own = [dataclasses.replace(r, env={k: v for k, v in r.env.items() if k not in shared}) for r in plan.ranks]
    console.print(render_table(own, RankPlan.COLUMNS, title="Ranks"))
    console.print(f"\n[bold]Command[/bold] (every rank)\n  {sanitize(' '.join(plan.ranks[0].argv), markup=True)}\n")
    variables = [{"variable": k, "value": v} for k, v in shared.items()]
    console.print(render_table(variables, ENV_COLUMNS, title="Environment (every rank, on top of the launcher's)"))
    if sources:
        console.print()
        console.print(render_table(sources, SOURCE_COLUMNS, title="Where the node's values came from (flags, then the environment, then the config)"))


def render_leaks(console: Console, record: RunRecord) -> None:
    """How the run's RRefs ended, worded by whether the user should act: values that outlived
    every reference (a leak), references held to the end but unused long before (each kept its
    value alive for nothing): a warning each, with where they were made; and RRefs a program
    held, in use, until rpc.shutdown() released them (normal: one line saying so)."""
    from rpcctl.inspect import AT_EXIT, AT_SHUTDOWN, HELD_UNUSED, LEAKED, ended_rrefs

    ended = ended_rrefs(Path(record.run_dir))
    leaks = [r for r in ended if r.ending == LEAKED]
    unused = sorted((r for r in ended if r.ending == HELD_UNUSED), key=lambda r: -(r.unused_s or 0.0))
    held = sum(1 for r in ended if r.ending == AT_SHUTDOWN)
    at_exit = sum(1 for r in ended if r.ending == AT_EXIT)
    if leaks:
        console.warn(
            f"{len(leaks)} RRef value(s) leaked: each outlived every reference to it, because its owner still held it "
            f"elsewhere when it shut down{_leak_holder(leaks)}. Where they were made "
            f"(`rpcctl inspect rrefs {record.run_id} --state leaked` lists them all):"
        )
        _list_rrefs(console, leaks, lambda r: "")
    if unused:
        console.warn(
            f"{len(unused)} RRef(s) were held unused until rpc.shutdown(): no holder had used them (to_here, a proxy call, "
            f"passing them on) for the last {human_seconds(unused[-1].unused_s)} or more, and each kept its value alive on "
            f"its owner until then; `del` an RRef after its last use to free its value. Longest unused first "
            f"(`rpcctl inspect rrefs {record.run_id} --state held-unused` lists them all):"
        )
        _list_rrefs(console, unused, lambda r: f", unused for {human_seconds(r.unused_s)}")
    if at_exit:  # a holder that failed (or was killed) before rpc.shutdown(): not "at shutdown"
        from rpcctl.inspect import ended_without_shutdown

        unshut = ended_without_shutdown(Path(record.run_dir))
        who = f": {', '.join(unshut)} never called rpc.shutdown() (failed or stopped)" if unshut else ""
        console.info(
            f"rpcctl: {at_exit} RRef(s) were still referenced when their holders ended without rpc.shutdown(){who}, "
            f"and were released as {'it' if len(unshut) == 1 else 'they'} ended "
            f"(`rpcctl inspect rrefs {record.run_id} --state at-exit`)"
        )
    if held:
        console.info(
            f"rpcctl: {held} RRef(s) were still referenced, and in use, when rpc.shutdown() began, which released them: normal "
            f"for RRefs a program keeps to the end, nothing to do (`rpcctl inspect rrefs {record.run_id} --state at-shutdown`)"
        )


def _leak_holder(leaks: list) -> str:
    """What likely held leaked values: distributed autograd contexts their owners still had open
    (they keep the tensors their calls sent), or the program's own structures."""
    contexts = sum(r.owner_autograd_contexts or 0 for r in leaks)
    if contexts:
        return (f": their owners still had {contexts} distributed autograd context(s) open, which keep the tensors their "
                "calls sent until released: the likely holder (every `with dist_autograd.context()` exited before "
                "rpc.shutdown() releases them), rather than a list or a cache of the program's")
    return " (a list, a cache, a closure of the program's)"


def _list_rrefs(console: Console, records: list, more: Callable[[Any], str]) -> None:
    for r in records[:10]:
        size = f" ({human_bytes(r.nbytes)})" if r.nbytes else ""
        console.detail(f"  {r.rref_id} owned by {r.owner}: {r.type or '?'}{size}{more(r)}, created at {r.call_site or '?'}")
    if len(records) > 10:
        console.detail(f"  ... and {len(records) - 10} more")


def render_outcome(console: Console, record: RunRecord) -> None:
    render_leaks(console, record)
    took = human_seconds(record.duration_s)
    where = f"run {record.run_id}"
    if record.status == RunStatus.SUCCEEDED:
        restarts = f" after {record.restarts} restart(s)" if record.restarts else ""
        console.info(f"rpcctl: job '{record.name}' succeeded in {took}{restarts} ({where}, logs in {record.run_dir}/logs)")
        return
    if record.status == RunStatus.CANCELLED:
        stopped = "; ranks stopped" if any(s.pid for s in record.ranks) else ""
        console.info(f"rpcctl: job '{record.name}' {record.reason} after {took}{stopped} ({where})")
        return
    cause = record.root_cause
    console.error(f"job '{record.name}' failed after {took} ({where})")
    if cause is None:
        return
    on_node = ""
    if cause.node is not None:
        on_node = f" on node {cause.node}" + (f" ({cause.host})" if cause.host else "")
    if cause.rank >= 0:
        how = f"killed by {cause.signal}" if cause.signal else f"exit code {cause.exit_code}"
        pid = f"pid {cause.pid}, " if cause.pid else ""
        console.detail(f"rank {cause.rank}{on_node} ({pid}{how}): {cause.message}", label="root cause:")
    else:  # the launcher's own message (a rendezvous one names its node already)
        where = "" if cause.message.startswith(("node ", "the launcher of node ")) else on_node
        console.detail(f"{where.strip()} {cause.message}".lstrip(), label="root cause:")
    if cause.traceback:
        console.detail(cause.traceback.rstrip(), style="dim")
    elif cause.log_tail:
        console.detail(f"last lines of rank {cause.rank}:", style="bold")
        console.detail("\n".join(f"  {line}" for line in cause.log_tail), style="dim")
    others = [s for s in record.ranks if s.rank != cause.rank]
    if others:
        console.detail(
            "other ranks: " + ", ".join(f"{s.rank} {s.state}" + (f" ({s.signal})" if s.signal else "") for s in others)
        )
    if cause.rank >= 0 and cause.node is not None:
        console.detail(f"log: on node {cause.node}{f' ({cause.host})' if cause.host else ''}, run {record.run_id}: logs/rank-{cause.rank}.log")
    elif cause.rank >= 0:
        console.detail(f"log: {record.run_dir}/logs/rank-{cause.rank}.log")
    if record.restarts:
        console.detail(f"restarts: {record.restarts} of {record.max_restarts}")
