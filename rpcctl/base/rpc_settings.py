"""RPC settings the launch core applies: ``rpc.tuning: auto`` and the ``RPCCTL_RPC_*`` variables.

``rpc.tuning: auto`` applies ``AUTO_SETTINGS``: settings that change how a rank allocates the
memory of large tensors, and nothing else (``benchmarks/rpc_allocation.py`` and docs/bench.md
show the measurements):

- ``THP_MEM_ALLOC_ENABLE=1``: c10 puts CPU tensors of 2 MiB and more on 2 MiB-aligned memory
  advised for transparent huge pages, so a fresh 64 MiB payload faults in ~1,100 pages instead
  of ~33,000. c10 reads it once, at the process's first CPU tensor allocation: set in a rank's
  environment it works for spawned ranks and for ranks forked by rpcctl (whose fork server
  imports torch but allocates no tensor); ``rpcctl bench`` checks that it took effect.
- glibc's ``MALLOC_MMAP_THRESHOLD_=32 MiB`` and ``MALLOC_TRIM_THRESHOLD_=64 MiB``
  (``MALLOC_REUSE``): blocks below 32 MiB come from the heap and are reused after a free
  instead of being mapped and unmapped per call. Without them, THP alone made 4 MiB echoes
  slower (2-3× the page faults of the defaults: c10's 2 MiB-aligned blocks defeat glibc's
  own adaptive threshold), which is why ``auto`` measured 0.36× there. The cost: each malloc
  arena keeps up to 64 MiB of freed memory mapped. glibc reads them at process start, so a
  forked rank applies them with ``mallopt`` (``apply_malloc_env``, called by the rank bootstrap).

The transport is not among them: TensorPipe already picks ``shm`` on one machine (``rpcctl
bench`` observes it for the defaults too), so pinning it changed nothing; the 0.85× measured at
64 calls in flight was launch-to-launch noise (an 8-byte call allocates nothing these settings
touch: page faults per call are the same, 5.0, with and without them).

As environment (``auto_rpc_env``), for a launch config:

=============================  ===============================================================
THP_MEM_ALLOC_ENABLE           read by c10 (torch) itself
MALLOC_MMAP_THRESHOLD_,        read by glibc at process start; ``apply_malloc_env`` in a
MALLOC_TRIM_THRESHOLD_         forked rank
RPCCTL_RPC_TRANSPORTS          comma list → TensorPipeRpcBackendOptions(_transports=...)
RPCCTL_RPC_CHANNELS            comma list → TensorPipeRpcBackendOptions(_channels=...)
RPCCTL_RPC_WORKER_THREADS      → TensorPipeRpcBackendOptions(num_worker_threads=...)
=============================  ===============================================================

The ``RPCCTL_RPC_*`` variables take effect where rpcctl builds the backend options (``rpc.init:
true``, through ``backend_options_kwargs``); a script that calls ``init_rpc`` itself can pass
``**backend_options_kwargs()`` to its ``TensorPipeRpcBackendOptions``.

Also here: ``silence_torch_internal_warnings``, the warnings filter every process that calls
``init_rpc`` under rpcctl gets (ranks, and the processes they spawn).

Standard library only: the launcher and every rank import it. The search that finds such
settings (``rpcctl bench --tune``) is in ``rpcctl.bench.tuning``, which builds on this module.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

MALLOC_REUSE = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}
AUTO_SETTINGS: dict[str, Any] = {
    "env": {"THP_MEM_ALLOC_ENABLE": "1", **MALLOC_REUSE},
}

ENV_TRANSPORTS = "RPCCTL_RPC_TRANSPORTS"
ENV_CHANNELS = "RPCCTL_RPC_CHANNELS"
ENV_WORKER_THREADS = "RPCCTL_RPC_WORKER_THREADS"


def settings_to_env(settings: Mapping[str, Any]) -> dict[str, str]:
    """rpc adapter settings → the environment a launch config carries."""
    env = {str(k): str(v) for k, v in (settings.get("env") or {}).items()}
    if settings.get("transports"):
        env[ENV_TRANSPORTS] = ",".join(settings["transports"])
    if settings.get("channels"):
        env[ENV_CHANNELS] = ",".join(settings["channels"])
    if settings.get("num_worker_threads"):
        env[ENV_WORKER_THREADS] = str(int(settings["num_worker_threads"]))
    return env


def auto_rpc_env() -> dict[str, str]:
    """The environment ``rpc.tuning: auto`` adds to every rank of a single-node job."""
    return settings_to_env(AUTO_SETTINGS)


def backend_options_kwargs(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``TensorPipeRpcBackendOptions`` from ``RPCCTL_RPC_*`` (``{}`` if unset)."""
    env = os.environ if env is None else env
    kwargs: dict[str, Any] = {}
    if env.get(ENV_TRANSPORTS):
        kwargs["_transports"] = [t.strip() for t in env[ENV_TRANSPORTS].split(",") if t.strip()]
    if env.get(ENV_CHANNELS):
        kwargs["_channels"] = [c.strip() for c in env[ENV_CHANNELS].split(",") if c.strip()]
    if env.get(ENV_WORKER_THREADS):
        kwargs["num_worker_threads"] = int(env[ENV_WORKER_THREADS])
    return kwargs


_MALLOPT = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3}  # glibc's M_TRIM_THRESHOLD, M_MMAP_THRESHOLD


def apply_malloc_env() -> None:
    """Apply glibc's ``MALLOC_*_THRESHOLD_`` variables in this process, as glibc does at the start
    of one: a rank forked from rpcctl's fork server started before they were set."""
    wanted = {name: int(os.environ[name]) for name in _MALLOPT if os.environ.get(name, "").isdigit()}
    if not wanted:
        return
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        for name, value in wanted.items():
            libc.mallopt(_MALLOPT[name], value)
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): its defaults stay
        pass


def silence_torch_internal_warnings() -> None:
    # init_rpc's TensorPipe handshake passes torch's own ProcessGroupGloo to
    # all_gather_object, and torch warns about that in every rank of every RPC job. The user
    # can do nothing about it, so it only buries their output. The filter is narrow (this
    # message, this module); a script that itself passes a raw Backend as a group loses the
    # warning too, which is the price of not printing it twice per rank for everyone else.
    warnings.filterwarnings(
        "ignore",
        message=(
            r"You are using a Backend <class 'torch\.distributed\.distributed_c10d\.ProcessGroupGloo'>"
            r" as a ProcessGroup"
        ),
        category=UserWarning,
        module=r"torch\.distributed\.distributed_c10d",
    )
