"""The in-rank bootstrap: ``python -m rpcctl.rank.runtime SCRIPT [ARGS...]``.

It runs in every rank, before the user's script, and then runs the script as ``python SCRIPT
ARGS`` would: a real ``__main__`` module that stays in ``sys.modules`` (RPC unpickles
``__main__.fn`` references on its own threads, even after the script body returns),
``sys.argv = [SCRIPT, *ARGS]``, and the script's folder first on ``sys.path``.

Around the script it:

- keeps the c10d rendezvous store on the address it was given (torch's TCPStore otherwise
  listens on every interface, and RPC unpickles what it receives), binds it once per address and
  holds it for the process's life, as torchrun's agent holds its store: ``init_process_group``
  and ``init_rpc`` (any order, ``destroy_process_group`` between) share its server;
- keeps that store up until every rank's ``rpc.shutdown`` returned: rank 0 hosts it, and
  TensorPipe's shutdown ends on a barrier in it, so a rank 0 that exits the moment its own
  shutdown returns can cut a peer off inside that barrier (``DistNetworkError: Connection reset
  by peer`` from ``agent.join``, a failed rank of a job that did nothing wrong);
- silences one torch-internal deprecation warning that every ``init_rpc`` prints;
- enables faulthandler (fatal signals print the Python stack to the rank's log) and dumps all
  stacks to ``stacks/rank-N.txt`` on SIGUSR1 (``rpcctl stack``);
- starts the rank's telemetry (RRef tracking, probes, losses), and stops it at the end;
- applies glibc's ``MALLOC_*_THRESHOLD_`` variables (part of ``rpc.tuning: auto``) with
  ``mallopt``: glibc reads them only at process start, and a forked rank started before;
- calls ``init_rpc`` / ``shutdown`` when the config asks for it (``rpc.init: true``);
- writes an uncaught exception to the rank's error file (torchelastic's format, so torch's own
  ``@record`` decorator writes the same file), prints it, and exits 1.

Environment read here (set by ``rpcctl.planning.plan``):

=========================  ==================================================================
RPCCTL_RUN_DIR             the run directory
RPCCTL_ERROR_FILE          where an uncaught exception is written (also TORCHELASTIC_ERROR_FILE)
RPCCTL_STACK_FILE          where SIGUSR1 dumps the stacks
RPCCTL_STORE_BIND          "1": bind rank 0's rendezvous store to MASTER_ADDR only, and keep it
                           up until every rank's rpc.shutdown returned
RPCCTL_RPC                 JSON of the config's ``rpc:`` section when ``rpc.init`` is true
RPCCTL_ARGV0               the script's sys.argv[0] as typed on a torchrun line (``argv0``)
RPCCTL_ALL_FRAMES          "1": keep rpcctl's own frames in an uncaught exception's traceback
                           (``launch --all-frames``; see ``rpcctl.base.frames``)
=========================  ==================================================================
"""

from __future__ import annotations

import builtins
import faulthandler
import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rpcctl.base.frames import ALL_FRAMES_ENV, drop_own_frames
from rpcctl.base.lines import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, cap_text, write_whole_lines
from rpcctl.base.private import private_dir, private_open
from rpcctl.base import stacks
from rpcctl.base.python_cmd import working_dir_on_path
from rpcctl.rank import children
from rpcctl.base.rpc_settings import apply_malloc_env, silence_torch_internal_warnings

_stack_file = None  # kept open for faulthandler.register


def run_rank(argv: list[str]) -> int:
    """Run ``argv = [SCRIPT, *ARGS]`` as this rank's main program; return its exit code."""
    if not argv:
        print(
            "usage: python -m rpcctl.rank.runtime SCRIPT [ARGS...] | -m MODULE [ARGS...]"
            " | --no-python PROGRAM [ARGS...]",
            file=sys.stderr,
        )
        return 2
    if argv[0] == "--no-python" and len(argv) > 1:  # torchrun --no-python: the program is the rank, by the path typed
        typed = os.environ.get("RPCCTL_ARGV0") or argv[1]  # (a script's $0 is the path it was run by)
        os.execv(typed if os.sep in typed and os.path.isfile(typed) else argv[1], [typed, *argv[2:]])
    write_whole_lines()
    _install_stack_dumps()
    apply_malloc_env()
    silence_torch_internal_warnings()
    if os.environ.get("RPCCTL_STORE_BIND") == "1":
        after_import("torch.distributed.rendezvous", bind_rendezvous_store_to_master_addr)
        after_import("torch.distributed.rpc", keep_store_until_peers_shut_down)

    from rpcctl.rank import reporter as telemetry

    telemetry.start()
    rpc_spec = json.loads(os.environ["RPCCTL_RPC"]) if os.environ.get("RPCCTL_RPC") else None
    code = 0
    try:
        if rpc_spec:
            _init_rpc(rpc_spec)
        code = _run_script(argv)
        if rpc_spec:
            import torch.distributed.rpc as rpc

            rpc.shutdown()
    except SystemExit as exc:
        code = _exit_code(exc)
        if rpc_spec:
            _shutdown_rpc_quietly()
    except BaseException as exc:  # noqa: BLE001 - this is the rank's top level
        if os.environ.get(ALL_FRAMES_ENV) != "1":
            drop_own_frames(exc)  # the user's traceback, as `python SCRIPT` would print it
        _write_error_file(exc)
        traceback.print_exception(exc)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        if rpc_spec:
            _shutdown_rpc_quietly()
    finally:
        telemetry.stop()
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _run_script(argv: list[str]) -> int:
    if argv[0] == "-m" and len(argv) > 1:  # as `python -m MODULE ARGS` (torchrun -m)
        import runpy

        sys.argv = ["-m", *argv[2:]]
        sys.path[0] = os.getcwd()
        try:
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            return _exit_code(exc)
        return 0
    script = os.path.abspath(argv[0])
    with open(script, "rb") as f:
        source = f.read()
    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__builtins__ = builtins
    main.__spec__ = None
    sys.modules["__main__"] = main
    sys.argv = [os.environ.get("RPCCTL_ARGV0") or argv[0], *argv[1:]]  # as typed on a torchrun line
    # As `python SCRIPT`: the script's folder replaces the bootstrap's own sys.path[0].
    sys.path[0] = os.path.dirname(script)
    code = compile(source, script, "exec", dont_inherit=True)
    try:
        exec(code, main.__dict__)
    except SystemExit as exc:
        return _exit_code(exc)
    return 0


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _install_stack_dumps() -> None:
    global _stack_file
    faulthandler.enable(file=sys.stderr, all_threads=True)
    path = os.environ.get("RPCCTL_STACK_FILE")
    if path:
        private_dir(Path(path).parent)
        _stack_file = private_open(path, "a")  # must stay open for faulthandler
        faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True, chain=False)
        stacks.serve_dumps(path, _stack_file)  # the safe way, asked first (rpcctl.base.stacks)


_RAISED_HEADER = " terminated with the following error:\n"  # torch's ProcessRaisedException text
_EXITED_LINE = "ProcessExitedException: process "


def spawned_failure(exc: BaseException) -> dict[str, Any] | None:
    """torch.multiprocessing's exception for a process that ``mp.spawn`` started and that failed
    (raised from ``join``): the process that failed (its index in its mp.spawn, its pid), how it
    ended in one line, its own traceback once, and ``chain``: the pids from this rank's child down
    to it. ``ProcessRaisedException`` carries the child's traceback after a header line (its
    ``str`` starts with blank lines: its first line says nothing); ``ProcessExitedException`` an
    exit code or a signal. A child that failed because its own mp.spawn did (a nested mp.spawn,
    its exception not caught) ends its traceback with that exception and the note
    ``children.note`` added there, naming the pid of its worker that failed: followed down to the
    process whose own failure it was. None for any other exception."""
    if not type(exc).__module__.startswith("torch.multiprocessing") or not hasattr(exc, "error_pid"):
        return None
    found: dict[str, Any] = {
        "index": getattr(exc, "error_index", None),
        "pid": exc.error_pid,
        "traceback": None,
        "type": None,
        "chain": [exc.error_pid],
    }
    if hasattr(exc, "exit_code"):
        signal_name = getattr(exc, "signal_name", None)
        found["how"] = f"was killed by {signal_name}" if signal_name else f"exited with code {exc.exit_code}"
        return found
    text = str(getattr(exc, "msg", None) or exc)
    trace = text.partition(_RAISED_HEADER)[2].strip("\n")
    while True:
        lines = trace.splitlines()
        last = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip()), None)
        inner = children.noted(lines[last]) if last is not None else None
        if inner is None:
            break
        found["index"], found["pid"] = inner
        found["chain"].append(inner[1])
        trace = "\n".join(lines[:last]).rstrip("\n")
        exited = _exited(trace.rsplit("\n", 1)[-1])
        if exited is not None:  # it did not raise: its exit code or signal, and no traceback of its own
            found["how"] = exited
            return found
        trace = trace.partition(_RAISED_HEADER)[2].strip("\n")
    last_line = next((line.strip() for line in reversed(trace.splitlines()) if line.strip()), "")
    found["how"] = f"raised {last_line}" if last_line else "raised an exception"
    found["traceback"] = f"{trace}\n" if trace else None
    found["type"] = last_line.split(":", 1)[0] if last_line else None
    return found


def _exited(line: str) -> str | None:
    """How a process ended, from the line of a ``ProcessExitedException`` its parent raised."""
    detail = line.partition(_EXITED_LINE)[2].partition(" terminated with ")[2].strip()
    if detail.startswith("signal "):
        return f"was killed by {detail[len('signal ') :]}"
    if detail.startswith("exit code "):
        return f"exited with code {detail[len('exit code ') :]}"
    return None


def lineage(rank: Any, chain: list[int]) -> str:
    """``rank 0 › pid A › pid B``: where a process sits under the rank that started it."""
    return " › ".join([f"rank {rank}", *(f"pid {pid}" for pid in chain)])


def _write_error_file(exc: BaseException) -> None:
    path = os.environ.get("RPCCTL_ERROR_FILE") or os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):  # torch's @record may already have written it
        return
    message, callstack, kind = (
        f"{type(exc).__name__}: {exc}",
        "".join(traceback.format_exception(exc)),
        type(exc).__name__,
    )
    ours: dict[str, Any] = {"rank": os.environ.get("RANK"), "pid": os.getpid()}
    whole = f"; the whole is in logs/rank-{os.environ.get('RANK')}.log"  # Python prints it there too
    child = spawned_failure(exc)
    if child is not None:  # the process that failed is the root cause, not this rank's mp.spawn
        where = f", {lineage(os.environ.get('RANK'), child['chain'])}" if len(child["chain"]) > 1 else ""
        message = f"mp.spawn process {child['index']} (pid {child['pid']}{where}) {child['how']}"
        callstack, kind = child["traceback"] or callstack, child["type"] or kind
        # Its text is a rank's too: capped as the message is (the whole is in the log).
        ours["child"] = {
            **child,
            "traceback": None,
            "how": cap_text(child["how"], MAX_MESSAGE_CHARS, whole),
            "type": cap_text(child["type"], MAX_MESSAGE_CHARS, whole) if child["type"] else None,
        }
    document = {
        "message": {
            "message": cap_text(message, MAX_MESSAGE_CHARS, whole),
            "extraInfo": {
                "py_callstack": cap_text(callstack, MAX_TRACEBACK_CHARS, whole),
                "timestamp": str(int(time.time())),
            },
        },
        "rpcctl": {"type": kind, **ours},
    }
    try:
        private_dir(Path(path).parent)
        tmp = f"{path}.{os.getpid()}.tmp"
        with private_open(tmp, "w") as f:
            json.dump(document, f)
        os.replace(tmp, path)
    except OSError as err:
        print(f"rpcctl: could not write error file {path}: {err}", file=sys.stderr)


def after_import(name: str, callback: Callable[[types.ModuleType], None]) -> None:
    """Call ``callback(module)`` once module ``name`` is imported: now if it already is, else
    right after its first import. Ranks that never import torch never pay for torch."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[types.ModuleType], None]):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_call(module: types.ModuleType) -> None:
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_call  # type: ignore[method-assign]
        return spec


def bind_rendezvous_store_to_master_addr(rendezvous: types.ModuleType) -> None:
    """Make rank 0's TCPStore listen on MASTER_ADDR only, not on every interface.

    torch's env:// rendezvous creates the store through ``rendezvous._create_c10d_store``; its
    server binds the wildcard address whatever host it is given. TCPStore accepts an already
    listening socket (``master_listen_fd``), so the wrapper binds one to the given host.
    """
    import socket

    from torch.distributed import TCPStore

    original = rendezvous._create_c10d_store
    if getattr(original, "_rpcctl", False):
        return

    def create_store(hostname: str, port: int, rank: int, world_size: int, timeout: Any, use_libuv: bool = True):
        if rank != 0 or rendezvous._torchelastic_use_agent_store():
            store = original(hostname, port, rank, world_size, timeout, use_libuv)
            if not rendezvous._torchelastic_use_agent_store():  # an agent's store outlives the ranks
                _remember_store(store, rank, world_size)
            return store
        if (hostname, port) in _served:
            # A second env:// rendezvous in this process (init_process_group, then init_rpc, or
            # again after destroy_process_group): a multi-tenant TCPStore on the same port shares
            # the server the first one started, as torch's own does; binding again would fail
            # with EADDRINUSE.
            store = TCPStore(
                host_name=hostname,
                port=port,
                world_size=world_size,
                is_master=True,
                timeout=timeout,
                multi_tenant=True,
                use_libuv=use_libuv,
            )
        else:
            listener = socket.socket(socket.AF_INET6 if ":" in hostname else socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((hostname, port))
            listener.listen(2048)
            store = TCPStore(
                host_name=hostname,
                port=port,
                world_size=world_size,
                is_master=True,
                timeout=timeout,
                multi_tenant=True,
                master_listen_fd=listener.detach(),
                use_libuv=use_libuv,
            )
            # Held for the process's life, as torchrun's agent holds its store for the ranks':
            # a process group destroyed before init_rpc must not take the server with it.
            _served[(hostname, port)] = store
        _remember_store(store, rank, world_size)
        return store

    create_store._rpcctl = True  # type: ignore[attr-defined]
    rendezvous._create_c10d_store = create_store


_served: dict[tuple[str, int], Any] = {}  # rank 0: the first store served on each (host, port)
_rendezvous: tuple[Any, int, int] | None = None  # this rank's c10d store (rank 0: its host), rank, world size
SHUT_DOWN_KEY = "rpcctl/rpc_shut_down"  # how many ranks other than 0 are past rpc.shutdown
HOLD_STORE_S = 10.0  # rank 0 waits at most this long (a peer that crashed never says so)


def _remember_store(store: Any, rank: int, world_size: int) -> None:
    global _rendezvous
    _rendezvous = (store, rank, world_size)


def keep_store_until_peers_shut_down(rpc: types.ModuleType) -> None:
    """Wrap ``rpc.shutdown``: on a rank other than 0, say so in the store once it returned; on
    rank 0 (the store's host), return only once every other rank said so, or after
    ``HOLD_STORE_S``. torchrun's agent hosts the store and outlives every rank; here rank 0
    does, so it must outlive their use of it."""
    from torch.distributed.rpc import api

    original = api.shutdown
    if getattr(original, "_rpcctl_keeps_store", False):
        return

    def shutdown(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if kwargs.get("graceful", args[0] if args else True):  # only a graceful one ends on the barrier
            _after_shutdown()
        return result

    shutdown.__wrapped__ = original  # type: ignore[attr-defined]
    shutdown.__doc__ = original.__doc__
    shutdown._rpcctl_keeps_store = True  # type: ignore[attr-defined]
    api.shutdown = rpc.shutdown = shutdown


def _after_shutdown() -> None:
    global _rendezvous
    held, _rendezvous = _rendezvous, None
    if held is None:
        return
    store, rank, world_size = held
    try:
        if rank != 0:
            store.add(SHUT_DOWN_KEY, 1)
            return
        deadline = time.monotonic() + HOLD_STORE_S
        while store.add(SHUT_DOWN_KEY, 0) < world_size - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    except Exception:  # noqa: BLE001 - the store is gone (a peer's teardown): nothing to keep
        pass


def _init_rpc(spec: dict[str, Any]) -> None:
    import torch.distributed.rpc as rpc

    from rpcctl.base.rpc_settings import backend_options_kwargs

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    name = spec["name"].format(rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    tuned = backend_options_kwargs()  # rpc.tuning: transports, channels (RPCCTL_RPC_*)
    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=tuned.pop("num_worker_threads", spec["num_worker_threads"]),
        rpc_timeout=spec["rpc_timeout"],
        init_method="env://",
        devices=spec.get("devices") or None,
        **tuned,
    )
    for worker, mapping in (spec.get("device_maps") or {}).items():
        options.set_device_map(worker, mapping)
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)


def _shutdown_rpc_quietly() -> None:
    try:
        import torch.distributed.rpc as rpc

        if rpc.api._is_current_rpc_agent_set():
            rpc.shutdown(graceful=False)
    except Exception:  # noqa: BLE001 - already failing; the original error is what matters
        pass


def main() -> None:
    working_dir_on_path()  # started with -P (rpcctl.base.python_cmd); the script's folder replaces it
    sys.exit(run_rank(sys.argv[1:]))


if __name__ == "__main__":
    main()
