"""torch.distributed.rpc over TensorPipe, with defaults and with tuned settings.

Settings (all optional; unset means TensorPipe's default):

=====================  ===================================================================
transports             ``_transports`` of TensorPipeRpcBackendOptions, preferred first:
                       ``shm`` (shared memory, one machine), ``uv`` (TCP), ``ibv``
channels               ``_channels``, preferred first: ``cma`` (process_vm_readv), ``mpt_uv``
                       (several TCP connections), ``basic`` (through the transport)
num_worker_threads     the agent's thread pool (torch's default: 16)
env                    extra environment, e.g. ``THP_MEM_ALLOC_ENABLE=1`` (transparent huge
                       pages for large CPU tensors; read by c10 at the process's first CPU
                       tensor allocation, which in a rank forked by rpcctl comes after its
                       environment is set: rpcctl's fork server imports torch but allocates no
                       tensor). ``observe()`` checks what a rank really got.
=====================  ===================================================================

Ops: ``rpc_sync`` (echo), ``rpc_async`` (echo, ``.wait()``), ``remote`` (``rpc.remote(echo)``
then ``.to_here()``), and ``train_step`` for the parameter-server suite.
"""

from __future__ import annotations

import threading
from typing import Any

from rpcctl.bench.transports import RankContext, Transport, TransportSpec, register
from rpcctl.base.rpc_settings import MALLOC_REUSE

DEFAULT_WORKER_THREADS = 16


def worker_name(rank: int) -> str:
    return f"bench{rank}"


# -- functions run on the callee (module level, so RPC can find them by name) ------------------


def _echo(x):
    return x


_released = threading.Event()


def _release() -> None:
    _released.set()


class RpcTransport(Transport):
    kind = "rpc"
    summary = "torch.distributed.rpc (TensorPipe)"
    ops = {
        "latency": ("rpc_sync", "rpc_async", "remote"),
        "payload": ("rpc_sync",),
        "throughput": ("rpc_async",),
        "train": ("train_step",),
    }
    modules = ("torch", "torch.distributed.rpc")

    @classmethod
    def env_for(cls, settings: dict[str, Any]) -> dict[str, str]:
        return {str(k): str(v) for k, v in (settings.get("env") or {}).items()}

    @classmethod
    def mismatches(cls, settings: dict[str, Any], observed: dict[str, Any]) -> list[str]:
        notes = []
        if cls.env_for(settings).get("THP_MEM_ALLOC_ENABLE") == "1" and observed.get("huge_pages") is False:
            notes.append(
                "THP_MEM_ALLOC_ENABLE=1 was set but tensors did not get huge pages (transparent huge pages "
                "off, or torch allocated a tensor before the rank's environment was applied)"
            )
        if settings.get("transports") and settings["transports"][0] == "shm" and observed.get("shm_transport") is False:
            notes.append("the shm transport was asked for but not used")
        return notes

    def setup(self, ctx: RankContext) -> None:
        import torch.distributed.rpc as rpc

        self.ctx = ctx
        rpc.init_rpc(
            worker_name(ctx.rank),
            rank=ctx.rank,
            world_size=ctx.world_size,
            rpc_backend_options=backend_options(self.settings),
        )
        self.peer = worker_name(1) if ctx.world_size > 1 else worker_name(0)

    def serve(self) -> None:
        _released.wait()

    def stop(self) -> None:
        import torch.distributed.rpc as rpc

        for rank in range(1, self.ctx.world_size):
            rpc.rpc_sync(worker_name(rank), _release)

    def teardown(self) -> None:
        import torch.distributed.rpc as rpc

        rpc.shutdown()

    def observe(self) -> dict[str, Any]:
        return {"shm_transport": uses_shm_transport(), "huge_pages": tensors_get_huge_pages()}

    def issue(self, op: str, payload: Any) -> Any:
        import torch.distributed.rpc as rpc

        if op == "rpc_sync":
            return rpc.rpc_sync(self.peer, _echo, args=(payload,))
        if op == "rpc_async":
            return rpc.rpc_async(self.peer, _echo, args=(payload,))
        if op == "remote":
            return rpc.remote(self.peer, _echo, args=(payload,))
        raise ValueError(f"rpc has no op {op!r}")

    def wait(self, op: str, handle: Any) -> Any:
        if op == "rpc_async":
            return handle.wait()
        if op == "remote":
            return handle.to_here()
        return handle

    def train(self, case: Any, timing: Any) -> dict | None:
        from rpcctl.bench.transports import _train

        return _train.run(self.ctx, timing, worker_name)


def backend_options(settings: dict[str, Any]):
    """TensorPipeRpcBackendOptions for ``settings`` (TensorPipe's defaults where unset)."""
    import torch.distributed.rpc as rpc

    kwargs: dict[str, Any] = {
        "num_worker_threads": int(settings.get("num_worker_threads") or DEFAULT_WORKER_THREADS),
        "rpc_timeout": float(settings.get("rpc_timeout", 120.0)),
    }
    if settings.get("transports"):
        kwargs["_transports"] = list(settings["transports"])
    if settings.get("channels"):
        kwargs["_channels"] = list(settings["channels"])
    return rpc.TensorPipeRpcBackendOptions(**kwargs)


def describe(settings: dict[str, Any]) -> str:
    """Settings in a few words, for tables and notes."""
    parts = []
    if settings.get("transports"):
        parts.append("transports=" + ",".join(settings["transports"]))
    if settings.get("channels"):
        parts.append("channels=" + ",".join(settings["channels"]))
    if settings.get("num_worker_threads"):
        parts.append(f"threads={settings['num_worker_threads']}")
    parts.extend(f"{k}={v}" for k, v in (settings.get("env") or {}).items())
    return " ".join(parts) or "TensorPipe defaults"


def variant(name: str, summary: str, **settings: Any) -> TransportSpec:
    return TransportSpec(name=name, kind="rpc", summary=summary, settings=settings)


def _tuned() -> TransportSpec:
    from rpcctl.base.rpc_settings import AUTO_SETTINGS

    return variant("rpc-tuned", "rpc.tuning: auto: " + describe(AUTO_SETTINGS), **AUTO_SETTINGS)


register(
    RpcTransport,
    variant("rpc", "TensorPipe defaults"),
    variant("rpc-uv", "TCP only (uv transport), as across machines", transports=["uv"]),
    variant("rpc-basic", "tensors through the transport (basic channel)", channels=["basic"]),
    variant("rpc-cma", "tensors by cross-memory attach (cma channel)", channels=["cma", "basic"]),
    variant("rpc-threads", "4 agent threads instead of 16", num_worker_threads=4),
    variant("rpc-thp", "huge pages for tensors (THP_MEM_ALLOC_ENABLE)", env={"THP_MEM_ALLOC_ENABLE": "1"}),
    variant("rpc-malloc", "glibc reuses freed blocks below 32 MiB (MALLOC_*_THRESHOLD_)", env=dict(MALLOC_REUSE)),
    _tuned(),
)


# -- probes: what a rank really got, whatever the settings say ----------------------------------


def uses_shm_transport() -> bool:
    """Whether TensorPipe's shared-memory transport holds segments in this process."""
    import os

    for fd in os.listdir("/proc/self/fd"):
        try:
            if "tensorpipe_shm" in os.readlink(f"/proc/self/fd/{fd}"):
                return True
        except OSError:
            continue
    return False


def tensors_get_huge_pages(nbytes: int = 8 << 20) -> bool | None:
    """Whether a fresh large CPU tensor lands on transparent huge pages (None: cannot tell)."""
    import torch

    def anon_huge_kb() -> int | None:
        try:
            with open("/proc/self/smaps_rollup") as f:
                for line in f:
                    if line.startswith("AnonHugePages:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    before = anon_huge_kb()
    if before is None:
        return None
    tensor = torch.ones(nbytes, dtype=torch.uint8)  # touched, so the pages are really there
    after = anon_huge_kb()
    del tensor
    return after is not None and after > before
