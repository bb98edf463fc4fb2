"""Install the RRef hooks in a process rpcctl did not bootstrap, as soon as it imports torch.

``sitecustomize`` (on the ranks' PYTHONPATH) calls ``install()``: a one-shot meta-path finder
waits for ``import torch`` to finish, then wraps torch.distributed.rpc (``rrefs.install``).
In a process a rank started, it also registers the process for ``rpcctl stack``
(``rpcctl.stacks``). Nothing else happens until the process calls ``init_rpc`` or
``rpcctl.report``. A process that
never imports torch pays for one finder lookup per import.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class _TorchImportHook:
    def __init__(self) -> None:
        self.busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch" or self.busy:
            return None
        self.busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.busy = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            _uninstall(self)
            _torch_imported()

        loader.exec_module = exec_module
        return spec


def _uninstall(hook: _TorchImportHook) -> None:
    try:
        sys.meta_path.remove(hook)
    except ValueError:
        pass


# How the init_rpc hook joins telemetry (``rrefs.set_join``): given by whoever installs, since
# the worker imports this module and so cannot be imported from here.
_join: Any = None


def _torch_imported() -> None:
    try:
        from rpcctl.telemetry import calls, collectives, rrefs

        collectives.install()
        calls.install()  # first: rrefs' init_rpc hook goes around this one's (it joins telemetry, which this one then posts to)
        if _join is not None:
            rrefs.set_join(_join)
        rrefs.install()
    except Exception as exc:
        print(f"rpcctl: RRef hooks not installed: {exc!r}", file=sys.stderr)
    from rpcctl.rpc_settings import silence_torch_internal_warnings

    silence_torch_internal_warnings()  # as in the ranks: spawned trainers call init_rpc too
    # A process a rank started (not the rank: its bootstrap registers its own file) that uses
    # torch answers `rpcctl stack`. Only torch users: a script's many small helper
    # interpreters should not each leave a file behind.
    from rpcctl.telemetry import protocol

    rank_pid, run_dir = os.environ.get(protocol.ENV_RANK_PID), os.environ.get("RPCCTL_RUN_DIR")
    if rank_pid and run_dir and rank_pid != str(os.getpid()):
        try:
            from rpcctl import stacks

            stacks.register_child(run_dir)
        except Exception as exc:
            print(f"rpcctl: stack dumps not registered: {exc!r}", file=sys.stderr)


def install(join: Any = None) -> None:
    """Hook torch.distributed.rpc now, or when torch is imported. ``join``: what the init_rpc
    hook calls to join this process to telemetry (``worker.join_at_init_rpc``)."""
    global _join
    if join is not None:
        _join = join
    if "torch" in sys.modules:
        _torch_imported()
        return
    if not any(isinstance(f, _TorchImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchImportHook())
