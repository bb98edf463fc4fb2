"""Checks run before anything is spawned, for mistakes that torch, the network or the interpreter
would otherwise report only once the ranks are up (exit 1, after a traceback per rank).

=====================  ========================================================================
key                    refused before spawn
=====================  ========================================================================
script                 not Python (it is compiled, not run: the SyntaxError's file and line)
preload                a module the fork server could not import (looked up, not imported)
rpc.name               a worker name torch rejects, or one that repeats across ranks
rpc.device_maps        a worker that is not in the job, a device that is not one, or a GPU a
rpc.devices            rank does not see
ifname                 an interface this host does not have; any interface but loopback on
                       one node (a single-node job listens on loopback only)
master_port            a port already in use (one node)
=====================  ========================================================================

Each check raises ``ConfigError`` with the dotted key; the CLI adds the config's file and line.
The checks read the file system and the network interfaces only: nothing is imported, bound
for longer than the check, or started.
"""

from __future__ import annotations

import errno
import importlib.machinery
import importlib.util
import os
import re
import socket
import stat
import sys

from rpcctl.config import JobSpec
from rpcctl.base.errors import ConfigError
from rpcctl.planning.plan import LOOPBACK, loopback_interface, visible_gpus

# torch's own rule (WorkerInfo, torch/csrc/distributed/rpc/rpc_agent.h: MAX_NAME_LEN = 128).
WORKER_NAME = re.compile(r"[A-Za-z0-9_:-]{1,127}")
MAX_NAMES_CHECKED = 1 << 16  # beyond this many ranks, the names of the first ones are checked
MAX_SCRIPT_BYTES = 16 << 20  # compiling is bounded too: a bigger script is left to the interpreter


def check_before_spawn(spec: JobSpec) -> None:
    """Raise ``ConfigError`` (exit 2) for what would otherwise fail after the ranks start."""
    check_script(spec)
    check_preload(spec)
    if spec.rpc.init:
        names = worker_names(spec)
        check_devices(spec, names)
    check_network(spec)


# -- script ------------------------------------------------------------------------------------


def check_script(spec: JobSpec) -> None:
    """Every rank runs ``python -m rpcctl.rank.runtime SCRIPT``: a script that does not compile would
    fail in every rank at once. A module (``-m``) is found by Python in the ranks, a program
    (``no_python``) is not Python."""
    script = spec.script
    if script is None or spec.no_python:
        return
    try:
        info = script.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read below
            raise ConfigError(f"the script {script} is not a regular file", key="script")
        if info.st_size > MAX_SCRIPT_BYTES:
            return
        source = script.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the script {script}: {exc.strerror or exc}", key="script") from None
    try:
        compile(source, str(script), "exec", dont_inherit=True)
    except SyntaxError as exc:
        at = f"{script}:{exc.lineno}" if exc.lineno else str(script)
        hint = ""
        if spec.argv0 is not None and script.suffix != ".py":  # a torchrun line's SCRIPT: perhaps a config, misnamed
            hint = " (a config is named .yaml or .yml; a program that is not Python takes --no-python)"
        raise ConfigError(
            f"{at}: not valid Python ({exc.msg}): rpcctl runs the script with {_python()}{hint}", key="script"
        ) from None
    except ValueError as exc:  # e.g. "source code string cannot contain null bytes": a binary
        raise ConfigError(
            f"{script}: not Python ({exc}): rpcctl runs the script with {_python()}", key="script"
        ) from None


def _python() -> str:
    return os.path.basename(sys.executable) or "python"


# -- preload -----------------------------------------------------------------------------------


def check_preload(spec: JobSpec) -> None:
    if spec.start_method != "fork":
        return  # only the fork server imports them
    for index, module in enumerate(spec.preload):
        if not module_exists(module):
            raise ConfigError(
                f"no module named {module!r} to preload (is it installed, and spelt so?)", key=f"preload.{index}"
            )


def module_exists(name: str) -> bool:
    """Whether ``import name`` can find a module, without importing it (the launcher stays light:
    no torch). The fork server runs ``python -m``, so its working directory is on its path."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    if name in sys.modules:
        return True
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    spec = spec or importlib.machinery.PathFinder.find_spec(parts[0], [os.getcwd()])
    for depth in range(1, len(parts)):
        if spec is None:
            return False
        full = ".".join(parts[: depth + 1])
        if full in sys.modules:
            spec = sys.modules[full].__spec__
            continue
        locations = spec.submodule_search_locations
        if locations is None:
            return True  # a module, not a package: only importing it would tell (os.path)
        spec = importlib.machinery.PathFinder.find_spec(full, list(locations))
    return spec is not None


# -- rpc: names and devices --------------------------------------------------------------------


def worker_names(spec: JobSpec) -> list[str]:
    """Every rank's worker name, as ``rpcctl.rank.runtime`` renders ``rpc.name``; refuse one torch
    would reject and one that two ranks share."""
    nproc = spec.nproc_per_node
    world = min(nproc * spec.nnodes, MAX_NAMES_CHECKED)
    names: list[str] = []
    first_rank: dict[str, int] = {}
    for rank in range(world):
        name = spec.rpc.name.format(rank=rank, local_rank=rank % nproc)
        if not WORKER_NAME.fullmatch(name):
            raise ConfigError(
                f"worker name {name!r} (rank {rank}) is not one torch accepts: "
                "1 to 127 characters out of A-Z a-z 0-9 _ - :",
                key="rpc.name",
            )
        if name in first_rank:
            hint = (
                "use {rank}: {local_rank} repeats on every node"
                if "{local_rank}" in spec.rpc.name
                else "use {rank} in it"
            )
            raise ConfigError(
                f"ranks {first_rank[name]} and {rank} would both be worker {name!r}: names must be unique ({hint})",
                key="rpc.name",
            )
        first_rank[name] = rank
        names.append(name)
    return names


_DEVICE = re.compile(r"cuda:(\d+)|cpu")


def gpus_seen(spec: JobSpec) -> list[int]:
    """How many GPUs each local rank sees once ``devices`` is applied (CUDA_VISIBLE_DEVICES)."""
    nproc = spec.nproc_per_node
    visible = len(visible_gpus())
    if spec.devices == "inherit":
        return [visible] * nproc
    if spec.devices == "cpu":
        return [0] * nproc
    if spec.devices == "auto":
        return [min(visible, 1)] * nproc
    return [0 if entry == "cpu" else 1 for entry in spec.devices]


def check_devices(spec: JobSpec, names: list[str]) -> None:
    """``rpc.device_maps`` and ``rpc.devices`` as torch's TensorPipe agent checks them
    (torch/distributed/rpc/backend_registry.py), but here, before the ranks gather them.
    Ranks on other nodes are assumed to see what the same local rank sees here."""
    seen = gpus_seen(spec)
    nproc = spec.nproc_per_node
    known = set(names)

    def index_of(device: str, key: str) -> int | None:
        match = _DEVICE.fullmatch(device.strip())
        if match is None:
            raise ConfigError(f"{device!r} is not a device TensorPipe takes: write cuda:N or cpu", key=key)
        return int(match.group(1)) if match.group(1) is not None else None

    def must_see(index: int | None, local_ranks: range | list[int], key: str) -> None:
        if index is None:
            return
        for local_rank in local_ranks:
            if index >= seen[local_rank]:
                rank = spec.node_rank * nproc + local_rank
                raise ConfigError(
                    f"GPU cuda:{index} does not exist for rank {rank}: it sees {seen[local_rank]} GPU(s)"
                    f" (devices: {_devices_text(spec)})",
                    key=key,
                )

    for i, device in enumerate(spec.rpc.devices):
        must_see(index_of(device, f"rpc.devices.{i}"), range(nproc), f"rpc.devices.{i}")
    for worker, mapping in spec.rpc.device_maps.items():
        if worker not in known:
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            raise ConfigError(
                f"no worker {worker!r} in this job (its workers: {shown})", key=f"rpc.device_maps.{worker}"
            )
        target = names.index(worker) % nproc
        for local, remote in mapping.items():
            key = f"rpc.device_maps.{worker}.{local}"
            must_see(index_of(local, key), range(nproc), key)  # every rank of this node uses the map
            must_see(index_of(remote, key), [target], key)


def _devices_text(spec: JobSpec) -> str:
    return spec.devices if isinstance(spec.devices, str) else "[" + ", ".join(map(str, spec.devices)) + "]"


# -- network -----------------------------------------------------------------------------------


def check_network(spec: JobSpec) -> None:
    if spec.ifname is not None:
        check_ifname(spec)
    if not spec.multi_node and spec.master_port is not None:
        check_port_free(spec.master_port)


def check_ifname(spec: JobSpec) -> None:
    import psutil

    interfaces = psutil.net_if_addrs()
    name = spec.ifname
    if name not in interfaces:
        raise ConfigError(
            f"no network interface {name!r} on this host (it has: {', '.join(sorted(interfaces))})", key="ifname"
        )
    if not spec.multi_node and name != loopback_interface():
        raise ConfigError(
            f"ifname {name!r} would make TensorPipe and Gloo listen beyond this machine, and a single-node job "
            "listens on loopback only (RPC unpickles what it receives). Remove ifname here; it is for jobs on "
            "several nodes (nnodes / --nnodes, master_addr), where it picks the interface the ranks use",
            key="ifname",
        )
    if spec.multi_node and not any(address.family == socket.AF_INET for address in interfaces[name]):
        raise ConfigError(
            f"network interface {name!r} has no IPv4 address for TensorPipe and Gloo to use", key="ifname"
        )


def check_port_free(port: int, host: str = LOOPBACK) -> None:
    """The rendezvous store binds ``host:port`` (with SO_REUSEADDR, so TIME_WAIT is no conflict)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"port {port} is already in use on {host}: pick another, or leave master_port unset for a free one",
                    key="master_port",
                ) from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", key="master_port") from None
