"""The ``rpcctl`` command line: parse, call the library, render.

The single error boundary is ``_Boundary.invoke``: an ``RpcctlError`` raised anywhere below it
becomes one message on stderr and its exit code (``RPCCTL_DEBUG=1`` adds the traceback).
"""

from __future__ import annotations

import os
import traceback

import typer
from typer.core import TyperGroup

from rpcctl import __version__
from rpcctl.console import get_console
from rpcctl.errors import RpcctlError


class _Boundary(TyperGroup):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except RpcctlError as exc:
            if os.environ.get("RPCCTL_DEBUG"):
                traceback.print_exc()
            if not exc.reported:
                get_console().error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


app = typer.Typer(
    cls=_Boundary,
    name="rpcctl",
    help="Launch, inspect and benchmark torch.distributed.rpc jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rpcctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Launch, inspect and benchmark torch.distributed.rpc jobs."""


def _register() -> None:
    from rpcctl.commands import calls, launch, report, runs, sbatch, trace
    from rpcctl.commands.bench import bench_app
    from rpcctl.commands.inspect import inspect_app, stack

    app.command("launch")(launch.launch)
    app.command("sbatch")(sbatch.sbatch)
    app.command("runs")(runs.runs)
    app.command("logs")(runs.logs)
    app.command("stop")(runs.stop)
    inspect_app.command("calls")(calls.calls)
    app.add_typer(inspect_app, name="inspect")
    app.command("stack")(stack)
    app.command("trace")(trace.trace)
    app.add_typer(bench_app, name="bench")
    app.command("report")(report.report)
    app.command("web")(report.web)


_register()


def main() -> None:
    app()
