"""``rpcctl launch CONFIG``: run a job, or show its plan with ``--dry-run``."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from collections.abc import Callable
from types import SimpleNamespace
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperCommand

from rpcctl.commands.common import JsonOption, RunsDirOption, check_output, write_output
from rpcctl.config import ConfigFile, dump_spec
from rpcctl.config.torchrun import (
    OPTIONS,
    PROGRAM_DESTS,
    LineValues,
    TorchrunOption,
    given_or_env,
    line_flags,
    one_node_master_addr,
)
from rpcctl.console import KEY, Column, Console, get_console, human_bytes, human_seconds, render_table, sanitize
from rpcctl.base.frames import ALL_FRAMES_ENV
from rpcctl.base.errors import JobCancelledError, JobFailedError, UsageError
from rpcctl.launch.launcher import launch as launch_job
from rpcctl.launch.job import Resolution, config_resolution, job_from_config, job_from_line, line_resolution, over
from rpcctl.launch.dryrun import dry_run as dry_run_job
from rpcctl.planning.plan import ENV_COLUMNS, LaunchPlan, RankPlan
from rpcctl.planning.preflight import check_before_spawn
from rpcctl.records.runs import RunRecord
from rpcctl.base.states import RunStatus
from rpcctl.planning.plan import visible_gpus


def _torchrun_option(option: TorchrunOption) -> Any:
    """A typer option for one of torchrun's (``rpcctl.config.torchrun.OPTIONS``): every spelling,
    what rpcctl does with it as its help. A value is read as text: the option's reader checks it,
    as it checks the same option's ``PET_*`` variable."""
    kind = bool if option.flag else Optional[str]
    settings = {} if option.flag else {"metavar": option.metavar}
    return Annotated[
        kind,
        typer.Option(
            *option.names,
            *option.extra,
            help=option.does + ".",
            show_default=False,
            rich_help_panel="torchrun's options",
            **settings,
        ),
    ]


# the launch command's parameters, by dest
TORCHRUN = SimpleNamespace(**{option.dest: _torchrun_option(option) for option in OPTIONS})
CONFIG_SUFFIXES = (".yaml", ".yml")


def launch(
    ctx: typer.Context,
    target: Annotated[
        str,
        typer.Argument(
            metavar="CONFIG | SCRIPT",
            help="The job's YAML config (.yaml, .yml), or the script a torchrun line runs (a module with -m, a program "
            "with --no-python).",
            show_default=False,
        ),
    ],
    script_args: Annotated[
        Optional[list[str]],
        typer.Argument(
            metavar="ARGS", help="The script's own arguments, untouched (everything after SCRIPT).", show_default=False
        ),
    ] = None,
    set_: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set", "-s", help="Override a config key: KEY.PATH=VALUE (YAML value). Repeatable.", show_default=False
        ),
    ] = None,
    runs_dir: RunsDirOption = None,
    no_live: Annotated[
        bool,
        typer.Option(
            "--no-live",
            help="Plain rank-prefixed output instead of the live view (always plain when not on a terminal).",
        ),
    ] = False,
    ranks: Annotated[
        Optional[str],
        typer.Option(
            "--ranks",
            help="Show only these ranks' output on the console, e.g. 0,2 or 0-3 (logs keep everything).",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print the launch plan (commands, environment, devices, logs) and start nothing."
        ),
    ] = False,
    json_: JsonOption = False,
    save_config: Annotated[
        Optional[Path],
        typer.Option(
            "--save-config",
            metavar="FILE",
            help="Write the job as a config (YAML) that `rpcctl launch FILE` runs the same, then go on (with "
            "--dry-run: stop).",
            show_default=False,
        ),
    ] = None,
    hang_timeout: Annotated[
        Optional[float],
        typer.Option(
            "--hang-timeout",
            help="Seconds without progress (no call ended, no loss, no output) before rpcctl diagnoses a hang; 0: off "
            "(default: the config's hang_timeout, 300 if unset).",
            show_default=False,
        ),
    ] = None,
    keep_on_hang: Annotated[
        bool,
        typer.Option(
            "--keep-on-hang", help="On a hang, dump and diagnose but keep the job running (config: on_hang: keep)."
        ),
    ] = False,
    all_frames: Annotated[
        bool,
        typer.Option(
            "--all-frames", help="Keep rpcctl's own frames (its bootstrap, its call tracking) in the ranks' tracebacks."
        ),
    ] = False,
    web: Annotated[
        bool,
        typer.Option(
            "--web",
            help="Serve the run's live page on 127.0.0.1 while it runs (the URL is printed; needs rpcctl[report]).",
        ),
    ] = False,
    nnodes: TORCHRUN.nnodes = None,
    nproc_per_node: TORCHRUN.nproc_per_node = None,
    rdzv_backend: TORCHRUN.rdzv_backend = None,
    rdzv_endpoint: TORCHRUN.rdzv_endpoint = None,
    rdzv_id: TORCHRUN.rdzv_id = None,
    rdzv_conf: TORCHRUN.rdzv_conf = None,
    standalone: TORCHRUN.standalone = False,
    max_restarts: TORCHRUN.max_restarts = None,
    monitor_interval: TORCHRUN.monitor_interval = None,
    start_method: TORCHRUN.start_method = None,
    event_log_handler: TORCHRUN.event_log_handler = None,
    role: TORCHRUN.role = None,
    module: TORCHRUN.module = False,
    no_python: TORCHRUN.no_python = False,
    run_path: TORCHRUN.run_path = False,
    log_dir: TORCHRUN.log_dir = None,
    redirects: TORCHRUN.redirects = None,
    tee: TORCHRUN.tee = None,
    local_ranks_filter: TORCHRUN.local_ranks_filter = None,
    duplicate_stdout_filters: TORCHRUN.duplicate_stdout_filters = None,
    duplicate_stderr_filters: TORCHRUN.duplicate_stderr_filters = None,
    node_rank: TORCHRUN.node_rank = None,
    master_addr: TORCHRUN.master_addr = None,
    master_port: TORCHRUN.master_port = None,
    local_addr: TORCHRUN.local_addr = None,
    logs_specs: TORCHRUN.logs_specs = None,
    numa_binding: TORCHRUN.numa_binding = None,
    signals_to_handle: TORCHRUN.signals_to_handle = None,
    shutdown_timeout: TORCHRUN.shutdown_timeout = None,
    virtual_local_rank: TORCHRUN.virtual_local_rank = False,
) -> None:
    """Launch a job: spawn its ranks, stream their output, supervise them to the end.

    Two forms: `rpcctl launch CONFIG` (a YAML config), or a torchrun line with the word
    replaced, `rpcctl launch [OPTIONS] SCRIPT [ARGS]...` (or -m MODULE): every option of
    torchrun's means what it means there (docs/torchrun.md), every argument after SCRIPT is
    the script's.

    Multi-node values come from a flag, else the environment (a SLURM step's, a Kubernetes
    pod's), else the config; --dry-run says where each came from.

    Exit code: 0 when every rank succeeds; 1 when the job fails (the root-cause rank is
    named); 2 for a bad config or flag (nothing is started); 128 + N when stopped by signal N
    (130 SIGINT, 143 SIGTERM, 129 SIGHUP, 131 SIGQUIT).
    """
    console = get_console()
    arguments = dict(locals())
    raw = list(ctx.meta.get(RAW_ARGS, []))  # the words after `rpcctl launch`, as typed (LaunchCommand.parse_args)
    words = _spelled(raw, _takes_value(ctx.command), ctx.allow_interspersed_args)
    given = {
        option.dest: (arguments[option.dest], words.get(option.dest) or f"{option.shown} {arguments[option.dest]}")
        for option in OPTIONS
        if arguments[option.dest] not in (None, False)
    }
    script_args = script_args or []
    config, resolution, flags, line = _form(target, script_args, given, set_ or [], module=module, no_python=no_python)
    flags.update(
        _given(
            ("hang_timeout", "--hang-timeout", hang_timeout),
            ("on_hang", "--keep-on-hang", "keep" if keep_on_hang else None),
        )
    )
    if config is not None:
        job = job_from_config(config, set_ or [], flags=flags, resolution=resolution)
    else:
        job = job_from_line(target, script_args, module=module, no_python=no_python, flags=flags, resolution=resolution)
    if all_frames:  # in each rank's planned environment: the plan, --dry-run and config.yaml show it
        job = job.with_env(**{ALL_FRAMES_ENV: "1"})
    spec = job.spec
    first_rank = spec.node_rank * spec.nproc_per_node  # ranks are global: this node's come from here
    if ranks is not None and line.local_ranks is not None:
        raise UsageError("--ranks and --local-ranks-filter both pick the ranks shown: give one")
    shown = parse_ranks(ranks, first_rank + spec.nproc_per_node, first_rank) if ranks is not None else None
    if line.local_ranks is not None:
        shown = parse_ranks(
            ",".join(str(first_rank + r) for r in sorted(line.local_ranks)),
            first_rank + spec.nproc_per_node,
            first_rank,
        )
    if json_ and not dry_run:
        raise UsageError("--json goes with --dry-run (a running job streams its output; see `rpcctl runs --json`)")
    if save_config is not None:
        check_output(save_config, "--save-config")
        job.located(lambda: check_before_spawn(spec))  # named where its key was set
        write_output(save_config, dump_spec(spec), "--save-config")
        console.info(
            f"rpcctl: wrote {sanitize(str(save_config))}: `rpcctl launch {sanitize(str(save_config))}` runs this job"
        )
    for notice in line.notices:
        console.info(sanitize(notice))
    if dry_run:
        described = dry_run_job(job, runs_dir)
        if json_:
            console.json(described.to_dict())
        else:
            render_plan(console, described.plan, described.sources)
        return
    page = None
    if web:
        from rpcctl.web.server import LaunchPage

        page = LaunchPage(console)  # checks the extra is installed before anything starts
    try:
        record = launch_job(  # the job's errors before spawn name where their key was set
            job,
            runs_dir=runs_dir,
            console=console,
            live=not no_live and console.is_terminal,
            ranks_shown=shown,
            on_start=page.start if page else None,
            command_line=["rpcctl", "launch", *raw],
        )
    finally:
        if page is not None:
            page.stop()  # the page stops with the job
    _conclude(console, record)


def _form(
    target: str,
    script_args: list[str],
    given: dict[str, tuple[Any, str]],
    overrides: list[str],
    *,
    module: bool,
    no_python: bool,
) -> tuple[ConfigFile | None, Resolution, dict[str, tuple[Any, str]], LineValues]:
    """Which form the line is (a config, or a torchrun line's SCRIPT), what the scheduler gives
    (``rpcctl.launch.job``), and the config keys the line's options give: (the config or None, the
    resolution, key → (value, origin), the line's console filter and notices)."""
    if not module and target.endswith(CONFIG_SUFFIXES):
        if script_args:
            raise UsageError(
                f"a config and a script on one line ({target} and {script_args[0]}): the config names its script "
                f"(script:), a torchrun line names it instead: `rpcctl launch {target}` or "
                "`rpcctl launch [OPTIONS] SCRIPT [ARGS]`"
            )
        for dest in PROGRAM_DESTS:
            if dest in given:
                raise UsageError(
                    f"{given[dest][1]} goes with a script, not a config: the config says what runs (module:, "
                    "no_python:)"
                )
        config = ConfigFile(target)  # read once, at its first use
        resolution = config_resolution(config, overrides, given)
        line = line_flags(
            given_or_env(given, {}),
            cpus=_cpus(),
            gpus=len(visible_gpus()),
            node_rank_known="node_rank" in resolution.values,
        )
        return config, resolution, dict(line.flags), line
    if overrides:
        raise UsageError(
            f"--set {overrides[0]}: --set changes a config's keys; a torchrun line gives them as options (or write one "
            "with --save-config)"
        )
    if no_python and module:
        raise UsageError("--no-python and -m: a module runs with Python (torchrun refuses both too)")
    resolution = line_resolution(given)
    values = given_or_env(given, os.environ, skip=_POD_SOURCED)
    line = line_flags(values, cpus=_cpus(), gpus=len(visible_gpus()), node_rank_known="node_rank" in resolution.values)
    flags = dict(line.flags)
    localhost = one_node_master_addr(values, over(resolution, flags))
    if localhost:
        flags["master_addr"] = localhost
    return None, resolution, flags, line


_POD_SOURCED = ("nnodes", "node_rank", "master_addr", "master_port")  # pod_flags reads their PET_*


def _cpus() -> int:
    """The CPUs this process may use (torchrun's ``torch._utils.cpu_count``)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _spelled(args: list[str], takes: dict[str, bool], to_the_end: bool) -> dict[str, str]:
    """How each of torchrun's options was written on the line (``--nproc_per_node=2``), for
    the messages and --dry-run's sources. ``takes``: which options take a value; a torchrun
    line's options end at the script (``to_the_end``: a config's go on)."""
    names = {name: option for option in OPTIONS for name in (*option.names, *option.extra)}
    spelled: dict[str, str] = {}
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            break
        if not word.startswith("-") or len(word) == 1:
            if not to_the_end:
                break
            i += 1
            continue
        name, eq, _ = word.partition("=")
        value = None if eq or not takes.get(name, False) or i + 1 >= len(args) else args[i + 1]
        if name in names:
            spelled[names[name].dest] = word if value is None else f"{name} {value}"
        i += 1 if value is None else 2
    return spelled


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


# --dry-run's table of where the node's values came from (``Job.sources``).
SOURCE_COLUMNS = (
    Column("key", priority=KEY),
    Column("value", priority=KEY),
    Column("source", "FROM", wrap=True, priority=KEY),
)


RAW_ARGS = "rpcctl_launch_args"


class LaunchCommand(TyperCommand):
    """``rpcctl launch``'s click command: on a torchrun line (the first argument that is not an
    option is a script, not a .yaml/.yml config), options end at the script, as torchrun's
    argparse ends them: every word after it is the script's, untouched (``--lr 0.1``, ``-h``,
    ``--``). A config's line keeps options anywhere (``CONFIG --set K=V``). The words are kept
    for the run record (``RAW_ARGS``)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        ctx.meta[RAW_ARGS] = list(args)
        first = _first_positional(self, args)
        ctx.allow_interspersed_args = first is None or (
            first.endswith(CONFIG_SUFFIXES) and not _module_flag(self, args, first)
        )
        return super().parse_args(ctx, args)


def _takes_value(command) -> dict[str, bool]:
    return {
        name: not (p.is_flag or p.count)
        for p in command.params
        if p.param_type_name == "option"
        for name in (*p.opts, *p.secondary_opts)
    }


def _first_positional(command, args: list[str]) -> str | None:
    """The first word that is neither an option nor an option's value."""
    takes = _takes_value(command)
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return args[i + 1] if i + 1 < len(args) else None
        if word.startswith("-") and len(word) > 1:
            i += 2 if "=" not in word and takes.get(word, False) else 1
            continue
        return word
    return None


def _module_flag(command, args: list[str], first: str) -> bool:
    return any(word in ("-m", "--module") for word in args[: args.index(first)])


# How cli._load builds this command (its class, and what click's context takes).
launch.command_settings = {"cls": LaunchCommand}  # type: ignore[attr-defined]


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
        f"[bold]{sanitize(plan.name, markup=True)}[/bold]: {plan.world_size} rank(s), start method "
        f"{plan.start_method}{preload}, rendezvous {sanitize(plan.master_addr, markup=True)}:{plan.master_port}\n"
        f"run directory: {sanitize(plan.run_dir, markup=True)}\n"
    )
    shared = {k: v for k, v in plan.ranks[0].env.items() if all(r.env.get(k) == v for r in plan.ranks)}
    own = [dataclasses.replace(r, env={k: v for k, v in r.env.items() if k not in shared}) for r in plan.ranks]
    console.print(render_table(own, RankPlan.COLUMNS, title="Ranks"))
    console.print(f"\n[bold]Command[/bold] (every rank)\n  {sanitize(' '.join(plan.ranks[0].argv), markup=True)}\n")
    variables = [{"variable": k, "value": v} for k, v in shared.items()]
    console.print(render_table(variables, ENV_COLUMNS, title="Environment (every rank, on top of the launcher's)"))
    if sources:
        console.print()
        console.print(
            render_table(
                sources,
                SOURCE_COLUMNS,
                title="Where the node's values came from (flags, then the environment, then the config)",
            )
        )


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
            f"{len(unused)} RRef(s) were held unused until rpc.shutdown(): no holder had used them (to_here, a proxy "
            f"call, passing them on) for the last {human_seconds(unused[-1].unused_s)} or more, and each kept its "
            "value alive on its owner until then; `del` an RRef after its last use to free its value. Longest unused "
            f"first (`rpcctl inspect rrefs {record.run_id} --state held-unused` lists them all):"
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
            f"rpcctl: {held} RRef(s) were still referenced, and in use, when rpc.shutdown() began, which released "
            "them: normal for RRefs a program keeps to the end, nothing to do "
            f"(`rpcctl inspect rrefs {record.run_id} --state at-shutdown`)"
        )


def _leak_holder(leaks: list) -> str:
    """What likely held leaked values: distributed autograd contexts their owners still had open
    (they keep the tensors their calls sent), or the program's own structures."""
    contexts = sum(r.owner_autograd_contexts or 0 for r in leaks)
    if contexts:
        return (
            f": their owners still had {contexts} distributed autograd context(s) open, which keep the tensors their "
            "calls sent until released: the likely holder (every `with dist_autograd.context()` exited before "
            "rpc.shutdown() releases them), rather than a list or a cache of the program's"
        )
    return " (a list, a cache, a closure of the program's)"


def _list_rrefs(console: Console, records: list, more: Callable[[Any], str]) -> None:
    for r in records[:10]:
        size = f" ({human_bytes(r.nbytes)})" if r.nbytes else ""
        console.detail(
            f"  {r.rref_id} owned by {r.owner}: {r.type or '?'}{size}{more(r)}, created at {r.call_site or '?'}"
        )
    if len(records) > 10:
        console.detail(f"  ... and {len(records) - 10} more")


def render_outcome(console: Console, record: RunRecord) -> None:
    render_leaks(console, record)
    took = human_seconds(record.duration_s)
    where = f"run {record.run_id}"
    if record.status == RunStatus.SUCCEEDED:
        restarts = f" after {record.restarts} restart(s)" if record.restarts else ""
        console.info(
            f"rpcctl: job '{record.name}' succeeded in {took}{restarts} ({where}, logs in {record.run_dir}/logs)"
        )
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
        console.detail(
            f"log: on node {cause.node}{f' ({cause.host})' if cause.host else ''}, run {record.run_id}: "
            f"logs/rank-{cause.rank}.log"
        )
    elif cause.rank >= 0:
        console.detail(f"log: {record.run_dir}/logs/rank-{cause.rank}.log")
    if record.restarts:
        console.detail(f"restarts: {record.restarts} of {record.max_restarts}")
