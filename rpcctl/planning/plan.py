"""``JobSpec`` + node facts → ``LaunchPlan``: what each rank will run, with which environment,
on which device, logging where. ``build_plan`` is pure; ``probe_node`` gathers the facts.

The torchrun environment contract is built here and only here:

=============================  ===============================================================
RANK, LOCAL_RANK               global / node-local rank
WORLD_SIZE, LOCAL_WORLD_SIZE   number of ranks in the job / on this node
GROUP_RANK, GROUP_WORLD_SIZE   node rank (0 on one node), number of nodes
ROLE_NAME, ROLE_RANK, ...      torchelastic's role variables (``role``; one role: the global rank)
MASTER_ADDR, MASTER_PORT       rendezvous (loopback on one node)
TORCHELASTIC_*                 restart count, max restarts, run id (``rdzv_id``, else the run's
                               id), error file (torch's @record), signals to handle
TORCH_NCCL_ASYNC_ERROR_HANDLING 1 unless the launcher's environment sets it (as torchrun)
TP_SOCKET_IFNAME,              TensorPipe and Gloo pinned to the loopback interface on one
GLOO_SOCKET_IFNAME             node, so nothing listens beyond this machine
OMP_NUM_THREADS                1 when several ranks share the node and it is not set (as torchrun)
CUDA_VISIBLE_DEVICES           per the ``devices`` key (left alone with ``inherit``)
RPCCTL_*                       run id and directory, error and stack files, rpc init spec,
                               the script's argv[0] as typed (``argv0``)
=============================  ===============================================================
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rpcctl.console import KEY, Column
from rpcctl.base.devices import parse_visible_devices
from rpcctl.base.errors import ConfigError, UsageError
from rpcctl.base.python_cmd import RUNTIME, module_command
from rpcctl.records.runs import rank_error_file, rank_log, rank_stack_file

if TYPE_CHECKING:  # a type only: `rpcctl inspect` imports this module and need not load pydantic
    from rpcctl.config import JobSpec

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class NodeFacts:
    hostname: str
    socket_ifname: str  # TensorPipe/Gloo interface: loopback on one node, the route to the master on several
    gpus: tuple[str, ...]  # the GPU ids this node lets us use (CUDA_VISIBLE_DEVICES order)
    master_port: int
    launcher_pid: int
    master_addr: str = LOOPBACK
    omp_num_threads_set: bool = False  # the launcher's environment already sets OMP_NUM_THREADS
    nccl_async_set: bool = False  # ... and TORCH_NCCL_ASYNC_ERROR_HANDLING


@dataclass(frozen=True)
class RankPlan:
    rank: int
    local_rank: int
    argv: list[str]  # the command, as `python -P -m rpcctl.rank.runtime SCRIPT ARGS` (script_argv: from SCRIPT)
    env: dict[str, str]  # the contract: added on top of the launcher's environment
    device: str  # "cpu", "cuda:N" (physical index) or "inherit"
    log: str
    error_file: str

    # The --dry-run table of ranks (a RankPlan whose env is that rank's own variables: the
    # shared ones have ENV_COLUMNS' table). The rank ids and device are never cut; the env and
    # the log fold.
    COLUMNS: ClassVar[tuple[Column, ...]] = (
        Column("rank", justify="right", priority=KEY),
        Column("local_rank", "LOCAL", justify="right", priority=KEY),
        Column("device", priority=KEY),
        Column("env", "ENV (per rank)", fmt=lambda env: " ".join(f"{k}={v}" for k, v in env.items()), wrap=True),
        Column("log", wrap=True, priority=KEY),
    )

    @property
    def script_argv(self) -> list[str]:
        """SCRIPT ARGS: what the bootstrap runs, as the rank server is told it."""
        return self.argv[len(module_command(RUNTIME)) :]


# The --dry-run table of the variables every rank gets, over {"variable": ..., "value": ...}.
ENV_COLUMNS = (Column("variable", priority=KEY), Column("value", wrap=True, priority=KEY))


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    run_dir: str
    name: str
    script: str
    world_size: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    start_method: str
    preload: list[str]
    restart: int
    ranks: list[RankPlan] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Place:
    """Where this node's ranks sit in an elastic round: the round's node count, this node's rank
    among them, and where the ranks meet (group rank 0's address and port)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int


def plan_attempt(
    spec: JobSpec,
    facts: NodeFacts,
    *,
    run_id: str,
    run_dir: Path,
    restart: int = 0,
    master_port: int | None = None,
    place: Place | None = None,
) -> LaunchPlan:
    """This node's plan of one attempt, the only way one is made: the first (restart 0, on the
    facts probed), each restart (``master_port``: the port the nodes met on again) and each
    elastic round (``place``). The launcher plans the first, the supervisor every later one."""
    if place is not None:
        spec = spec.model_copy(update={"nnodes": place.nnodes, "node_rank": place.node_rank})
        facts = dataclasses.replace(facts, master_addr=place.master_addr, master_port=place.master_port)
    elif master_port is not None:
        facts = dataclasses.replace(facts, master_port=master_port)
    return build_plan(spec, facts, run_id=run_id, run_dir=run_dir, restart=restart)


def build_plan(spec: JobSpec, facts: NodeFacts, *, run_id: str, run_dir: Path, restart: int = 0) -> LaunchPlan:
    """The pure core of ``plan_attempt`` (which every caller goes through): the spec and facts as given."""
    nproc = spec.nproc_per_node
    world_size = nproc * spec.nnodes
    master_addr = facts.master_addr
    devices = _place(spec, facts)
    rpc = json.dumps(spec.rpc.model_dump(mode="json")) if spec.rpc.init else None
    tuned = {}
    if spec.rpc.tuning == "auto" and not spec.multi_node:
        from rpcctl.base.rpc_settings import auto_rpc_env  # standard library only: keeps the launcher light

        tuned = auto_rpc_env()
    ranks = []
    for local_rank in range(nproc):
        rank = spec.node_rank * nproc + local_rank
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": "0" if spec.virtual_local_rank else str(local_rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(spec.node_rank),
            "GROUP_WORLD_SIZE": str(spec.nnodes),
            "ROLE_NAME": spec.role,
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(facts.master_port),
            "TORCHELASTIC_RUN_ID": spec.rdzv_id or run_id,
            "TORCHELASTIC_RESTART_COUNT": str(restart),
            "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
            "TORCHELASTIC_ERROR_FILE": str(rank_error_file(run_dir, rank)),
            "TORCHELASTIC_SIGNALS_TO_HANDLE": spec.signals_to_handle,
            "TP_SOCKET_IFNAME": facts.socket_ifname,
            "GLOO_SOCKET_IFNAME": facts.socket_ifname,
            "RPCCTL_RUN_ID": run_id,
            "RPCCTL_RUN_DIR": str(run_dir),
            "RPCCTL_RESTART": str(restart),
            "RPCCTL_ERROR_FILE": str(rank_error_file(run_dir, rank)),
            "RPCCTL_STACK_FILE": str(rank_stack_file(run_dir, rank)),
            "RPCCTL_STORE_BIND": "1",
            "PYTHONUNBUFFERED": "1",
        }
        if nproc > 1 and "OMP_NUM_THREADS" not in spec.env and not facts.omp_num_threads_set:
            env["OMP_NUM_THREADS"] = "1"
        if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in spec.env and not facts.nccl_async_set:
            env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        device, visible = devices[local_rank]
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        if spec.virtual_local_rank:  # torchrun: each rank sees its one device as device 0
            env["CUDA_VISIBLE_DEVICES"] = visible if visible else str(local_rank)
        if spec.argv0 is not None:
            env["RPCCTL_ARGV0"] = spec.argv0
        if rpc:
            env["RPCCTL_RPC"] = rpc
        ranks.append(
            RankPlan(
                rank=rank,
                local_rank=local_rank,
                argv=[*module_command(RUNTIME), *program_argv(spec)],
                env={**tuned, **{k: str(v) for k, v in spec.env.items()}, **env},
                device=device,
                log=str(rank_log(run_dir, rank)),
                error_file=str(rank_error_file(run_dir, rank)),
            )
        )
    return LaunchPlan(
        run_id=run_id,
        run_dir=str(run_dir),
        name=spec.name,
        script=program(spec),
        world_size=world_size,
        nproc_per_node=nproc,
        master_addr=master_addr,
        master_port=facts.master_port,
        start_method=spec.start_method,
        preload=list(spec.preload) if spec.start_method == "fork" else [],
        restart=restart,
        ranks=ranks,
    )


def program(spec: JobSpec) -> str:
    """What a rank runs, in words: the script's path, or ``-m MODULE``."""
    return f"-m {spec.module}" if spec.module else str(spec.script)


def program_argv(spec: JobSpec) -> list[str]:
    """What the bootstrap is given (``RankPlan.script_argv``): SCRIPT ARGS, ``-m MODULE ARGS``
    (run as ``python -m``), or ``--no-python PROGRAM ARGS`` (the rank execs the program)."""
    if spec.module:
        head = ["-m", spec.module]
    elif spec.no_python:
        head = ["--no-python", str(spec.script)]
    else:
        head = [str(spec.script)]
    return [*head, *map(str, spec.args)]


def _place(spec: JobSpec, facts: NodeFacts) -> list[tuple[str, str | None]]:
    """Per local rank: (device shown to people, CUDA_VISIBLE_DEVICES value or None to leave it)."""
    gpus = facts.gpus
    nproc = spec.nproc_per_node
    if spec.devices == "inherit":
        return [("inherit" if gpus else "cpu", None)] * nproc
    if spec.devices == "cpu" or (spec.devices == "auto" and not gpus):
        return [("cpu", "")] * nproc
    if spec.devices == "auto":
        return [(f"cuda:{gpus[i % len(gpus)]}", gpus[i % len(gpus)]) for i in range(nproc)]
    placed = []
    for i, entry in enumerate(spec.devices):
        if entry == "cpu":
            placed.append(("cpu", ""))
        elif isinstance(entry, int) and entry < len(gpus):
            placed.append((f"cuda:{gpus[entry]}", gpus[entry]))
        else:
            visible = ", ".join(gpus) if gpus else "none"
            raise ConfigError(f"GPU {entry} does not exist on this node (visible GPUs: {visible})", key=f"devices.{i}")
    return placed


# ---------------------------------------------------------------------------------------------
# Node facts (the only I/O here)


def probe_node(spec: JobSpec, master_ip: str | None = None) -> NodeFacts:
    """This node's facts. Several nodes: the interface that routes to the master (or
    ``spec.ifname``); the master port is a placeholder until the rendezvous sets it.
    ``master_ip``: the address the rendezvous already resolved ``master_addr`` to, so that
    the ranks use the very address the rendezvous met on (a name may resolve differently
    twice)."""
    if spec.multi_node:
        master_ip = master_ip or resolve_ipv4(spec.master_addr or "")
        ifname = spec.ifname or route_interface(master_ip)[0]
        return NodeFacts(
            hostname=socket.gethostname(),
            socket_ifname=ifname,
            gpus=tuple(visible_gpus()),
            master_port=0,
            launcher_pid=os.getpid(),
            master_addr=master_ip,
            omp_num_threads_set="OMP_NUM_THREADS" in os.environ,
            nccl_async_set="TORCH_NCCL_ASYNC_ERROR_HANDLING" in os.environ,
        )
    return NodeFacts(
        hostname=socket.gethostname(),
        # torchrun's word on one node (it binds 127.0.0.1)
        master_addr="localhost" if spec.master_addr == "localhost" else LOOPBACK,
        socket_ifname=spec.ifname or loopback_interface(),
        gpus=tuple(visible_gpus()),
        master_port=spec.master_port or free_port(),
        launcher_pid=os.getpid(),
        omp_num_threads_set="OMP_NUM_THREADS" in os.environ,
        nccl_async_set="TORCH_NCCL_ASYNC_ERROR_HANDLING" in os.environ,
    )


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def resolve_ipv4(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise UsageError(f"cannot resolve master_addr '{host}': {exc}") from None


def route_interface(master_ip: str) -> tuple[str, str]:
    """(interface, local address) this node uses to reach ``master_ip``; no packet is sent."""
    import psutil

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((master_ip, 9))  # UDP connect only picks the route
        except OSError as exc:
            raise UsageError(f"no route to master_addr {master_ip}: {exc}") from None
        local_ip = probe.getsockname()[0]
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local_ip for a in addrs):
            return name, local_ip
    raise UsageError(f"no network interface holds {local_ip}, the address that routes to {master_ip}")


def loopback_interface() -> str:
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == LOOPBACK for a in addrs):
            return name
    return "lo"


def visible_gpus() -> list[str]:
    """GPU ids usable here, without importing torch or initialising CUDA."""
    visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        return visible
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return [str(i) for i in range(len(list(proc.iterdir())))]
    return []
