"""RPC settings the launch core applies: ``rpc.tuning: auto`` and the ``RPCCTL_RPC_*`` variables.

``rpc.tuning: auto`` applies ``AUTO_SETTINGS``: the settings measured to be good on one machine
(see ``docs/bench.md`` and ``rpcctl bench --transport rpc,rpc-tuned``):

- ``THP_MEM_ALLOC_ENABLE=1``: c10 backs CPU tensors of 2 MiB and more with transparent huge
  pages, so large payloads fault in far fewer pages (64 MiB echo 1.5-1.7× here; no consistent
  gain from 1 to 16 MiB, see docs/bench.md). c10 reads it once, at the process's first CPU tensor allocation: set
  in a rank's environment it works for spawned ranks and for ranks forked by rpcctl (whose fork
  server imports torch but allocates no tensor); ``rpcctl bench`` checks that it took effect.
- the shared-memory transport first (``shm``, then ``uv`` so that other machines are still
  reachable): TensorPipe already prefers it where it is usable, this pins that choice.

As environment (``auto_rpc_env``), for a launch config:

=============================  ===============================================================
THP_MEM_ALLOC_ENABLE           read by c10 (torch) itself
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

AUTO_SETTINGS: dict[str, Any] = {
    "transports": ["shm", "uv"],
    "env": {"THP_MEM_ALLOC_ENABLE": "1"},
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


def silence_torch_internal_warnings() -> None:
    # init_rpc's TensorPipe handshake passes torch's own ProcessGroupGloo to
    # all_gather_object, and torch warns about that in every rank of every RPC job. The user
    # can do nothing about it, so it only buries their output. The filter is narrow (this
    # message, this module); a script that itself passes a raw Backend as a group loses the
    # warning too, which is the price of not printing it twice per rank for everyone else.
    warnings.filterwarnings(
        "ignore",
        message=r"You are using a Backend <class 'torch\.distributed\.distributed_c10d\.ProcessGroupGloo'> as a ProcessGroup",
        category=UserWarning,
        module=r"torch\.distributed\.distributed_c10d",
    )
