"""What ``patch`` forwards to: one observer per family of telemetry (RRefs, calls, collectives,
children; ``families.FAMILIES`` declares each family, its observer among its parts).

An observer is a small object with these methods, each a no-op here; ``families.OBSERVERS`` lists
them, and ``patch`` and the reporter call them, never a family's module functions by name.

==========================  ==================================================================
method                      called
==========================  ==================================================================
``prepare(torch_rpc)``      once, by ``patch.install`` before it wraps anything: read what the
                            family's hooks need from torch (``TorchRpc``); patch nothing
``activate(queue)``         telemetry runs: the hooks append to ``queue`` (the reporter's)
``deactivate()``            the hooks only call through (telemetry stopped, or
                            ``reporter.set_hooks(False)`` for benchmarks)
``after_fork_in_child()``   in a forked child: nothing in flight, no queue
``dropped()``               what the family dropped rather than block (a full queue)
``rpc_starting()``          ``init_rpc`` was called (after this process joined telemetry)
``rpc_started(info)``       ``init_rpc`` returned; ``info``: the "rpc" event (name, rank, workers)
``shutdown_starting()``     ``rpc.shutdown`` was called
``shutdown_done()``         ``rpc.shutdown`` returned or raised
==========================  ==================================================================

The hot-path wrappers themselves are the families' (``calls.wrap_rpc_sync``,
``rrefs.hooks.wrap_remote``, ...): they read their module's state as globals, which costs less
per call than an attribute of an object. Only ``patch`` puts them on torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TorchRpc:
    """The torch modules the hooks need, imported once by ``patch.install``."""

    torch: Any
    rpc: Any
    api: Any
    internal: Any
    rref_proxy: Any


class Observer:
    name = ""

    def prepare(self, torch_rpc: TorchRpc) -> None:
        pass

    def activate(self, queue: Any) -> None:
        pass

    def deactivate(self) -> None:
        pass

    def after_fork_in_child(self) -> None:
        pass

    def dropped(self) -> int:
        return 0

    def rpc_starting(self) -> None:
        pass

    def rpc_started(self, info: dict[str, Any]) -> None:
        pass

    def shutdown_starting(self) -> None:
        pass

    def shutdown_done(self) -> None:
        pass
