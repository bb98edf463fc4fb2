"""rpcctl: reach the processes a rank spawns itself (mp.spawn, subprocess), which skip rpcctl's
bootstrap. Only installs an import hook; telemetry starts if the process calls init_rpc().
Then runs the sitecustomize this one shadows, if any."""

import os
import sys


def _rpcctl_join():
    """Joins telemetry when the process calls init_rpc (imported only then: most helper
    interpreters never do)."""
    from rpcctl.rank import reporter

    return reporter.join_at_init_rpc()


def _rpcctl_mesh_join():
    """Joins telemetry in a Monarch mesh process (autohook: from a thread, touching no torch)."""
    from rpcctl.rank import reporter

    reporter.joining(hooks=False)


def _rpcctl_report(*args):
    """Sends a loss a training library's trainer reported (autohook, ``steps``); joins telemetry."""
    from rpcctl.rank import reporter

    reporter.report_loss(*args)


def _rpcctl_chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("RPCCTL_RUN_ID"):
        try:  # a rank's child shares the rank's pipe: its lines must not interleave
            from rpcctl.base.lines import write_whole_lines

            write_whole_lines()
        except Exception as exc:
            print(f"rpcctl: output left unbuffered: {exc!r}", file=sys.stderr)
    if os.environ.get("RPCCTL_TELEMETRY_SOCKET"):
        try:
            from rpcctl.rank import autohook

            autohook.install(join=_rpcctl_join, mesh_join=_rpcctl_mesh_join, report=_rpcctl_report)
        except Exception as exc:  # never break an unrelated interpreter
            print(f"rpcctl: telemetry hook not installed: {exc!r}", file=sys.stderr)
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.origin and os.path.dirname(os.path.abspath(spec.origin)) != here:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_rpcctl_chain()
del _rpcctl_chain
