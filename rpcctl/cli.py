"""The ``rpcctl`` command line: parse, call the library, render.

The single error boundary is ``_Boundary.invoke``: an ``RpcctlError`` raised anywhere below it
becomes one message on stderr and its exit code (``RPCCTL_DEBUG=1`` adds the traceback).

Help texts keep one style: a default is written in the option's help, "(default: X)", never by
typer as well (``show_default=False``); a switch shows no ``<bool>``; a required argument reads
``CONFIG`` in the usage line, not ``{CONFIG}``; every command ends with an "Example:" epilog
(tests/test_help.py checks all of it for every command).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable

import typer
from typer.core import TyperGroup

from rpcctl import __version__
from rpcctl.console import get_console
from rpcctl.base.errors import RpcctlError


def _plain_help() -> None:
    """typer (0.29) writes a required argument ``{CONFIG}`` in the usage line: ``CONFIG``, as
    click and the Arguments section spell it. (``<bool>`` after every switch comes from its
    Rich help; the apps here use the plain one: ``rich_markup_mode=None``.)"""
    from typer.core import TyperArgument

    usage_name = getattr(TyperArgument, "_usage_display_name", None)
    if usage_name is None or getattr(usage_name, "_rpcctl", False):
        return

    def _usage_display_name(self) -> str:
        name = usage_name(self)
        return name[1:-1] if name.startswith("{") and name.endswith("}") else name

    _usage_display_name._rpcctl = True
    TyperArgument._usage_display_name = _usage_display_name


_plain_help()


# Each command's module is imported only when that command runs (or the root's --help lists them
# all): `rpcctl inspect workers` need not load the launcher, pydantic or the bench (measured: the
# CLI's start-up was 0.62 s of CPU with every command imported).
# name: (module, attribute, the Example line; None for a sub-app, which has its own)
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "launch": (
        "rpcctl.commands.launch",
        "launch",
        "rpcctl launch configs/remote_call.yaml --set timeout=60 --ranks 0-1",
    ),
    "sbatch": (
        "rpcctl.commands.sbatch",
        "sbatch",
        "rpcctl sbatch configs/remote_call.yaml --nodes 2 --time 00:30:00 > job.sh",
    ),
    "k8s": (
        "rpcctl.commands.k8s",
        "k8s",
        "rpcctl k8s configs/parameter_server.yaml --nodes 2 --image registry.example.com/train:1.0 -o job.k8s.yaml",
    ),
    "runs": ("rpcctl.commands.runs", "runs", "rpcctl runs --limit 5 (or --json for every field)"),
    "logs": ("rpcctl.commands.runs", "logs", "rpcctl logs --merge --timestamps --follow"),
    "stop": ("rpcctl.commands.runs", "stop", "rpcctl stop remote-call-20261203 --wait 30"),
    "inspect": ("rpcctl.commands.inspect", "inspect_app", None),  # every view of its VIEWS table
    "stack": ("rpcctl.commands.inspect", "stack", "rpcctl stack --rank 0"),
    "trace": ("rpcctl.commands.trace", "trace", "rpcctl trace -o run.trace.json (then open it in ui.perfetto.dev)"),
    "profile": ("rpcctl.commands.profile", "profile", "rpcctl profile --rank 0 --seconds 10 -o rank0.speedscope.json"),
    "bench": ("rpcctl.commands.bench", "bench_app", None),
    "report": ("rpcctl.commands.report", "report", "rpcctl report -o report.html"),
    "web": ("rpcctl.commands.report", "web", "rpcctl web --port 8080"),
}


def _load(name: str):
    """The click command for ``name``, built by typer as ``app.command``/``add_typer`` would."""
    import importlib

    module, attribute, example = COMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    if example is None:
        command = typer.main.get_command(target)
    else:
        single = typer.Typer(rich_markup_mode=None, add_completion=False)
        single.command(name, epilog=f"Example: {example}", **getattr(target, "command_settings", {}))(target)
        command = typer.main.get_command(single)
    command.name = name
    _starts_the_command(command)
    return command


class _Boundary(TyperGroup):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name in COMMANDS and name not in self.commands:
            self.add_command(_load(name), name)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except RpcctlError as exc:
            if os.environ.get("RPCCTL_DEBUG"):
                traceback.print_exc()
            if not exc.reported:
                get_console().error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:  # while the command runs (before, the entry point has SIGINT: rpcctl.__main__)
            _hooks["cancelled"]()
            raise typer.Exit(130) from None  # typer's test runner, or a program calling the app


def _starts_the_command(command) -> None:
    """Wrap the callback of ``command`` (and of every subcommand) so that the entry point's
    early SIGINT handling ends where the command's own code begins (``__main__.command_starts``)."""
    import functools

    for sub in getattr(command, "commands", {}).values():
        _starts_the_command(sub)
    callback = command.callback
    if callback is None or getattr(callback, "_rpcctl_starts", False):
        return

    @functools.wraps(callback)
    def starts(*args, **kwargs):
        _hooks["command_starts"]()
        return callback(*args, **kwargs)

    starts._rpcctl_starts = True
    command.callback = starts


app = typer.Typer(
    cls=_Boundary,
    name="rpcctl",
    help="Launch, inspect and benchmark torch.distributed.rpc jobs.",
    rich_markup_mode=None,  # help text is plain: `rpcctl[report]` is not markup
    epilog="Example: rpcctl launch configs/remote_call.yaml, then rpcctl runs and rpcctl inspect workers",
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
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Launch, inspect and benchmark torch.distributed.rpc jobs."""


# What the command line's entry point (rpcctl.__main__, which hands them to main) does for a Ctrl-C
# while a command runs, and as the command's own code begins; nothing under typer's test runner.
_hooks: dict[str, Callable[[], None]] = {"cancelled": lambda: None, "command_starts": lambda: None}


def main(*, cancelled: Callable[[], None] | None = None, command_starts: Callable[[], None] | None = None) -> None:
    if cancelled is not None:
        _hooks["cancelled"] = cancelled
    if command_starts is not None:
        _hooks["command_starts"] = command_starts
    app()
