"""The facade the CLI and ``rpcctl bench`` call: plan a job, make its run directory, supervise it.

    spec ──probe_node + plan_attempt──▶ LaunchPlan ──(dry run: return it; restarts and rounds:
                                          │           the supervisor, by the same)
        runs/<run-id>/ (config.yaml, run.json) ◀── Supervisor.run() ──▶ RunRecord
                                                        │ events
                    console echo and messages, live view, telemetry, watchdog, cluster relay

Here the listeners of a launch (``rpcctl.supervise.listeners``, ``rpcctl.supervise.live``) are subscribed to its
events, in the order they hear them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil

from rpcctl.supervise.cluster import NodeRendezvous, secret_from_env
from rpcctl.config import JobSpec, dump_spec
from rpcctl.console import Console, get_console
from rpcctl.base.errors import ConfigError, JobCancelledError, RpcctlError, UsageError
from rpcctl.records.events import Events
from rpcctl.launch.job import DEFAULT_MASTER_PORT, Job
from rpcctl.supervise import listeners
from rpcctl.planning.plan import LaunchPlan, NodeFacts, free_port, plan_attempt, probe_node, program
from rpcctl.planning.preflight import check_before_spawn
from rpcctl.base.private import private_dir, private_open
from rpcctl.records.runs import (
    RankState,
    RunRecord,
    bounded_command,
    check_runs_dir,
    default_runs_dir,
    hostname,
    new_run_id,
    now_iso,
    save_record,
)
from rpcctl.base.states import RunStatus
from rpcctl.supervise.supervisor import CANCEL_SIGNALS, Supervisor


def plan_job(
    spec: JobSpec, runs_dir: Path | None = None, cluster: NodeRendezvous | None = None, publish: dict | None = None
) -> tuple[LaunchPlan, NodeFacts]:
    """Plan the job on this node. With ``cluster``, first meet the other nodes: node 0 decides
    the run id and the ranks' rendezvous port for everyone."""
    facts = probe_node(spec, cluster.master_ip if cluster is not None else None)
    run_id = new_run_id(spec.name)
    if spec.elastic and cluster is not None:  # a dry run plans node 0 of MAX nodes
        return _plan_first_round(spec, facts, run_id, runs_dir, cluster, publish)
    if cluster is not None:
        shared = cluster.join(host=facts.hostname, run_id=run_id, pick_port=free_port, extra=publish)
        run_id = shared["run_id"]
        facts = replace(facts, master_port=shared["worker_port"])
    # Every node shares the run id; each writes its own directory, so nodes on a shared
    # filesystem (the usual SLURM setup) never collide: <id> on node 0, <id>.node<k> elsewhere.
    name = run_id if spec.node_rank == 0 else f"{run_id}.node{spec.node_rank}"
    run_dir = (runs_dir or default_runs_dir()).resolve() / name
    return plan_attempt(spec, facts, run_id=run_id, run_dir=run_dir), facts


def _plan_first_round(
    spec: JobSpec, facts: NodeFacts, run_id: str, runs_dir: Path | None, cluster, publish: dict | None
):
    """Elastic (issue 43): the host's run id, then the first round (once MIN nodes are there,
    after last_call for more); each node's directory is named by the order nodes first came."""
    from rpcctl.supervise.elastic import round_plan

    run_id = cluster.open(run_id=run_id, extra=publish)["run_id"]
    first = cluster.next_round(free_port)
    name = run_id if cluster.node_index == 0 else f"{run_id}.node{cluster.node_index}"
    run_dir = (runs_dir or default_runs_dir()).resolve() / name
    return round_plan(spec, facts, first, run_id=run_id, run_dir=run_dir, restart=0), facts


def join_cluster(spec: JobSpec, say=lambda message: None) -> NodeRendezvous | None:
    """The node rendezvous of a multi-node job, once its master resolves (and, on nodes other
    than 0, accepts connections): pods start before their DNS names exist; ``say`` hears what
    is awaited."""
    if spec.elastic:  # issue 43: MIN:MAX nodes, on torch's elastic rendezvous at master_addr:master_port
        from rpcctl.supervise.elastic import join_elastic

        if not spec.master_addr:
            raise ConfigError(
                "an elastic job (nnodes MIN:MAX) needs the rendezvous endpoint, torchrun's --rdzv-endpoint: "
                "master_addr (and master_port) of the node that hosts it",
                key="master_addr",
            )
        return join_elastic(spec, secret_from_env(), spec.master_port or DEFAULT_MASTER_PORT, say)
    if not spec.multi_node:
        return None
    if not spec.master_addr:
        raise ConfigError(
            "a multi-node job needs master_addr (the host of node 0): --master-addr HOST", key="master_addr"
        )
    cluster = NodeRendezvous(
        node_rank=spec.node_rank,
        nnodes=spec.nnodes,
        master_addr=spec.master_addr,
        master_port=spec.master_port or DEFAULT_MASTER_PORT,
        timeout=spec.rdzv_timeout,
        secret=secret_from_env(),
    )
    cluster.reach(say)
    return cluster


def launch(
    spec: JobSpec | Job,
    *,
    runs_dir: Path | None = None,
    console: Console | None = None,
    echo: bool = True,
    live: bool = False,
    ranks_shown: set[int] | None = None,
    config_path: Path | None = None,
    telemetry: bool = True,
    on_start: Callable[[RunRecord], None] | None = None,
    command_line: list[str] | None = None,
) -> RunRecord:
    """Run ``spec`` to the end (blocking) and return its run record. ``on_start`` is called
    once the run directory and record exist, before any rank starts (``launch --web``).
    ``command_line``: the words the launch was typed with, for the record (``rpcctl runs``).
    A ``Job`` (``job_from_config``: its SLURM step's or pod's values taken in) runs its spec, its
    config recorded, and an error found before spawn names the key's line or flag.

    The job's failure is not an exception: look at ``record.status`` (``succeeded``,
    ``failed`` or ``cancelled``) and ``record.root_cause``. Bad specs raise ``ConfigError``
    before anything is created or spawned.
    """
    if isinstance(spec, Job):
        job = spec
        return job.located(
            lambda: launch(
                job.spec,
                runs_dir=runs_dir,
                console=console,
                echo=echo,
                live=live,
                ranks_shown=ranks_shown,
                config_path=config_path or job.config_path,
                telemetry=telemetry,
                on_start=on_start,
                command_line=command_line,
            )
        )
    console = console or get_console()
    with _cancels_raise():
        try:
            return _launch(
                spec, runs_dir, console, echo, live, ranks_shown, config_path, telemetry, on_start, command_line
            )
        except _Cancel as cancel:  # before the run directory was made: nothing of the job exists
            said = f"cancelled by {signal.Signals(cancel.signum).name} before the job started"
            with contextlib.suppress(OSError):  # the terminal went away (SIGHUP): the exit code still says it
                console.info(f"rpcctl: {said}")  # a cancel, as the supervisor's: not an error
            raise JobCancelledError(said, 128 + cancel.signum, reported=True) from None


class _Cancel(BaseException):
    """A cancel signal before the supervisor's own handling took over (a BaseException, as
    KeyboardInterrupt is: no ``except Exception`` on the way swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _cancels_raise():
    """Until ``Supervisor.run`` installs its handlers (and after it restores these), a cancel
    signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) raises ``_Cancel`` wherever the launch is: in the
    checks, the node rendezvous, the planning or the making of the run directory. Without it,
    SIGINT there was a bare KeyboardInterrupt, and SIGTERM left a record saying running."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return

    def cancel(signum: int, frame) -> None:
        raise _Cancel(signum)

    previous = {s: signal.signal(s, cancel) for s in CANCEL_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _launch(
    spec: JobSpec,
    runs_dir: Path | None,
    console: Console,
    echo: bool,
    live: bool,
    ranks_shown: set[int] | None,
    config_path: Path | None,
    telemetry: bool,
    on_start: Callable[[RunRecord], None] | None,
    command_line: list[str] | None = None,
) -> RunRecord:
    check_before_spawn(spec)  # before meeting other nodes: a mistake here is the same on every node
    cluster = join_cluster(spec, console.info)
    if cluster is not None and spec.elastic:  # the host holds the run's store and watchdog, as node 0 does
        spec = spec.model_copy(update={"node_rank": cluster.node_rank})
        console.info(
            f"rpcctl: elastic job of {spec.min_nodes} to {spec.nnodes} nodes: "
            f"{'hosting' if cluster.is_host else 'joining'} the rendezvous at {cluster.where}"
        )
    elif cluster is not None:
        console.info(
            f"rpcctl: node {spec.node_rank} of {spec.nnodes}: joining the rendezvous at"
            f" {spec.master_addr}:{cluster.master_port}"
        )
    telemetry_listener = _telemetry_listener(cluster) if telemetry else None
    publish = {"telemetry_port": telemetry_listener.getsockname()[1]} if telemetry_listener else None
    try:
        plan, facts = plan_job(spec, runs_dir, cluster, publish)  # may raise: nothing exists yet
        run_dir = make_run_dir(Path(plan.run_dir), runs_dir, spec, console)
    except BaseException:
        if telemetry_listener is not None:
            telemetry_listener.close()
        raise
    try:
        with private_open(run_dir / "config.yaml", "w") as f:
            f.write(dump_spec(spec))
        me = psutil.Process()
        record = RunRecord(
            run_id=plan.run_id,
            name=spec.name,
            status=RunStatus.RUNNING,
            run_dir=str(run_dir),
            config_path=str(config_path.resolve()) if config_path else None,
            script=program(spec),
            command_line=bounded_command(command_line) if command_line else None,
            world_size=plan.world_size,
            nproc_per_node=plan.nproc_per_node,
            start_method=plan.start_method,
            host=hostname(),
            nnodes=spec.nnodes,
            node_rank=spec.node_rank,
            slurm_job_id=os.environ.get("SLURM_JOB_ID"),
            launcher_pid=os.getpid(),
            launcher_started=me.create_time(),
            master_addr=plan.master_addr,
            master_port=plan.master_port,
            started_at=now_iso(),
            max_restarts=spec.max_restarts,
            ranks=[RankState(rank=r.rank, local_rank=r.local_rank, device=r.device, log=r.log) for r in plan.ranks],
        )
        if spec.elastic:  # issue 43: this node's place in the first round, and the round
            from rpcctl.supervise.elastic import round_entry

            record.nnodes, record.node_rank = cluster.round.nnodes, cluster.round.group_rank
            record.rounds = [round_entry(cluster.round, "start", now_iso())]
        save_record(record)
        if on_start is not None:
            on_start(record)
    except BaseException as exc:
        shutil.rmtree(run_dir, ignore_errors=True)  # never leave a half-made run directory
        if isinstance(exc, OSError):  # a full disk: say so, nothing was started
            raise RpcctlError(f"cannot set up the run directory {run_dir}: {exc.strerror or exc}") from None
        raise
    with console.logging_to(run_dir / "launcher.log"):  # the launcher's own story, beside the rank server's output
        server = None
        try:
            world = spec.nnodes * plan.nproc_per_node if spec.elastic else plan.world_size  # elastic: the largest world
            server = (
                _telemetry_server(run_dir, spec, world, cluster, telemetry_listener, console) if telemetry else None
            )
            return _supervise(spec, plan, facts, record, console, server, cluster, live, ranks_shown if echo else set())
        except _Cancel as cancel:  # before the supervisor's handlers: no rank started
            if server is not None:
                server.close()
            elif telemetry_listener is not None:
                telemetry_listener.close()
            return _cancelled_before_start(record, cancel.signum, cluster)


def _cancelled_before_start(record: RunRecord, signum: int, cluster: NodeRendezvous | None) -> RunRecord:
    """The run ends cancelled, as the supervisor ends one, and the other nodes hear of it."""
    name = signal.Signals(signum).name
    record.status, record.ended_at = RunStatus.CANCELLED, now_iso()
    record.reason, record.exit_code = f"cancelled by {name} before any rank started", 128 + signum
    save_record(record)
    if cluster is not None:
        with contextlib.suppress(Exception):  # a node that cannot tell the others still ends its own run
            cluster.report_cancelled(f"{name} on node {record.node_rank}")
            cluster.finish(RunStatus.CANCELLED, wait=10)
    return record


def _supervise(
    spec: JobSpec,
    plan: LaunchPlan,
    facts: NodeFacts,
    record: RunRecord,
    console: Console,
    server,
    cluster: NodeRendezvous | None,
    live: bool,
    ranks_shown: set[int] | None,
) -> RunRecord:
    """Run the supervisor with its listeners (``ranks_shown``: whose lines are echoed; None: every rank's)."""
    # On node 0 (a single node's too), whose store has every node's telemetry; it signals this node's ranks only.
    watchdog = None
    if server is not None and spec.hang_timeout and spec.node_rank == 0:
        from rpcctl.supervise.watchdog import HangWatchdog

        # It asks the server whether the store can be trusted before it reads a silence as a stall.
        watchdog = HangWatchdog(
            Path(record.run_dir), spec.hang_timeout, spec.on_hang == "keep", console, health=server.health
        )
    view = None
    if live:
        from rpcctl.supervise.live import LiveView

        view = LiveView(console, record)
    events = _listened(console, record, server, watchdog, view, cluster, ranks_shown)
    supervisor = Supervisor(spec, plan, facts, record, events, telemetry=server, watchdog=watchdog, cluster=cluster)
    with view or contextlib.nullcontext():
        return supervisor.run()


def _listened(console: Console, record: RunRecord, server, watchdog, view, cluster, ranks_shown) -> Events:
    """The events of a launch, with their listeners: what the supervisor says reaches the
    watchdog and telemetry first (a line is progress, and a loss), then the screen."""
    events = Events()
    if watchdog is not None:
        events.subscribe(listeners.watchdog_relay(watchdog))
    if server is not None:
        events.subscribe(listeners.telemetry_relay(server))
    if view is not None:
        events.subscribe(view)
    if ranks_shown is None or ranks_shown:  # None: every rank's lines; none when the echo is off
        events.subscribe(listeners.ConsoleEcho(console, ranks_shown))
    events.subscribe(listeners.console_messages(console))
    if cluster is not None:
        events.subscribe(listeners.cluster_relay(cluster, record.host, console))
    return events


def make_run_dir(run_dir: Path, runs_dir: Path | None, spec: JobSpec, console: Console) -> Path:
    """The run's own directory (0700), or one clear message (exit 2) naming what is wrong."""
    flag = f"--runs-dir {runs_dir}" if runs_dir is not None else f"the runs directory {run_dir.parent}"
    if run_dir.parent.exists() and not run_dir.parent.is_dir():
        raise UsageError(f"{flag}: {run_dir.parent} is a file, not a directory")
    for warning in check_runs_dir(run_dir.parent, flag):
        console.warn(warning)
    try:
        return private_dir(run_dir, exist_ok=False)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise ConfigError(
                f"job name '{spec.name}' is too long for a run directory ({len(os.fsencode(run_dir.name))} bytes "
                f"with the run id's date and suffix; this file system allows {_name_max(run_dir.parent)})",
                key="name",
            ) from None
        raise UsageError(f"{flag}: cannot create the run directory {run_dir}: {exc.strerror}") from None


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _telemetry_listener(cluster: NodeRendezvous | None) -> socket.socket | None:
    """Node 0 of a multi-node run takes the other nodes' telemetry on the master address."""
    if cluster is None or cluster.node_rank != 0:
        return None
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((cluster.master_ip, 0))
    listener.listen(128)
    return listener


def _telemetry_server(
    run_dir: Path, spec: JobSpec, world_size: int, cluster: NodeRendezvous | None, listener, console: Console
):
    """One store per run, on node 0: other nodes forward their ranks' telemetry to it."""
    if cluster is not None and cluster.node_rank != 0:
        from rpcctl.telemetry.forward import TelemetryForwarder

        address = (cluster.master_ip, cluster.shared["telemetry_port"])
        return TelemetryForwarder(run_dir, address, cluster.secret, spec.losses.pattern)
    from rpcctl.telemetry.server import TelemetryServer

    server = TelemetryServer(run_dir, spec, world_size, warn=console.warn)
    if listener is not None:
        server.listen_tcp(listener, cluster.secret)
    return server
