"""Install the RRef hooks in a process rpcctl did not bootstrap, as soon as it imports torch.

``sitecustomize`` (on the ranks' PYTHONPATH) calls ``install()``: a one-shot meta-path finder
waits for ``import torch`` to finish, then patches torch.distributed (``patch.install``).
In a process a rank started, it also registers the process for ``rpcctl stack``
(``rpcctl.base.stacks``). Nothing else happens until the process calls ``init_rpc``,
``init_process_group`` or ``rpcctl.report``. A process that never imports torch pays, per
import, for one name comparison in each hook still waiting (torch, monarch and the trainer
modules below: five at most).

A Monarch mesh process (``python -m monarch._src.actor.bootstrap_main``, started by a rank
that spawns a proc mesh; see docs/monarch.md) joins telemetry as soon as it imports
``monarch``, and registers for ``rpcctl stack``: it never calls ``init_rpc``, and its actors
need not use torch, yet it is one of the rank's processes (``inspect workers``).

Every family's after-import hooks (``families.Family.imports``) wait here too: a Hugging Face
or Lightning trainer module, once imported, gets rpcctl's loss callback (``steps``): losses at
the library's own global step.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class _ImportHook:
    """One-shot: calls ``on_import()`` once module ``module`` has finished importing."""

    def __init__(self, module: str, on_import: Any) -> None:
        self.module, self.on_import = module, on_import
        self.busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.module or self.busy:
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
            self.on_import()

        loader.exec_module = exec_module
        return spec


def _uninstall(hook: _ImportHook) -> None:
    try:
        sys.meta_path.remove(hook)
    except ValueError:
        pass


# How the init_rpc hook joins telemetry (``patch.set_join``): given by whoever installs, since
# the reporter imports this module and so cannot be imported from here.
_join: Any = None
_mesh_join: Any = None


def _torch_imported() -> None:
    try:
        from rpcctl.rank import children, patch

        if _join is not None:
            patch.set_join(_join)
        patch.install()

        children.install(join=_join)  # mp.spawn's workers: exit codes, their place (torch has imported multiprocessing)
    except Exception as exc:
        print(f"rpcctl: RRef hooks not installed: {exc!r}", file=sys.stderr)
    from rpcctl.base.rpc_settings import silence_torch_internal_warnings

    silence_torch_internal_warnings()  # as in the ranks: spawned trainers call init_rpc too
    # A process a rank started (not the rank: its bootstrap registers its own file) that uses
    # torch answers `rpcctl stack`. Only torch users: a script's many small helper
    # interpreters should not each leave a file behind.
    _register_stacks()


def _spawned_by_a_rank() -> str | None:
    """The run directory, in a process a rank started (not the rank: its bootstrap registers
    its own stack file and joins telemetry itself); else None."""
    from rpcctl.wire import protocol

    rank_pid, run_dir = os.environ.get(protocol.ENV_RANK_PID), os.environ.get("RPCCTL_RUN_DIR")
    return run_dir if rank_pid and run_dir and rank_pid != str(os.getpid()) else None


def _register_stacks() -> None:
    run_dir = _spawned_by_a_rank()
    if run_dir:
        try:
            from rpcctl.base import stacks

            stacks.register_child(run_dir)
        except Exception as exc:
            print(f"rpcctl: stack dumps not registered: {exc!r}", file=sys.stderr)


def _monarch_imported() -> None:
    """A Monarch mesh process a rank spawned: one of the rank's processes from the start.

    On a thread of its own: run inside the import of ``monarch`` (its Rust extension has just
    been initialised), any call a few frames deep raised RecursionError (measured with
    torchmonarch 0.7.0: pathlib, socket). A fresh thread's stack is unaffected. That thread
    never touches torch (``mesh_join`` installs no hook): the main thread may be importing it,
    and a half-imported torch used from a second thread aborted the process (measured); the
    torch hook above installs the RPC hooks once that import is done."""
    if _spawned_by_a_rank():
        import threading

        threading.Thread(target=_join_as_mesh_process, name="rpcctl-monarch-join", daemon=True).start()


def _join_as_mesh_process() -> None:
    _register_stacks()
    if _mesh_join is not None:
        try:
            _mesh_join()
        except Exception as exc:
            print(f"rpcctl: telemetry not joined: {exc!r}", file=sys.stderr)


def install(join: Any = None, mesh_join: Any = None, report: Any = None) -> None:
    """Hook torch.distributed.rpc now, or when torch is imported. ``join``: what the init_rpc
    hook calls to join this process to telemetry (``reporter.join_at_init_rpc``); ``mesh_join``:
    how a Monarch mesh process joins (``reporter.joining(hooks=False)``); ``report``: how a
    library's trainer callback sends a loss (``reporter.report_loss``)."""
    global _join, _mesh_join
    if join is not None:
        _join = join
    if mesh_join is not None:
        _mesh_join = mesh_join
    from rpcctl.rank import families, steps  # here: a process that never imports torch loads them only now

    if report is not None:
        steps.set_report(report)

    watch((("torch", _torch_imported), ("monarch", _monarch_imported), *families.imports()))


def watch(hooks: Any) -> None:
    """Each (module, on_import): ``on_import()`` now if the module is imported, else once it is
    (a family's after-import hooks, ``families.Family.imports``; once each)."""
    for module, on_import in hooks:
        if module in sys.modules:
            on_import()
        elif not any(
            isinstance(f, _ImportHook) and f.module == module and f.on_import is on_import for f in sys.meta_path
        ):
            sys.meta_path.insert(0, _ImportHook(module, on_import))
