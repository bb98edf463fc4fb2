"""The command line's entry point: ``python -m rpcctl`` and the ``rpcctl`` script
(pyproject's ``[project.scripts]``).

It imports nothing heavy itself, so that it runs before typer, rich and a command's module
load (a tenth of a second and more), and its first act is to take SIGINT: from there until
the command's own code begins (``command_starts``, called by the CLI), a Ctrl-C ends the
process at once with one line, ``rpcctl: cancelled by SIGINT``, and exit code 130. No
KeyboardInterrupt is raised in that time: one raised inside the import machinery's weakref
callbacks or an object's ``__del__`` is printed and swallowed, and the command ran on (a try
in 20 of ``rpcctl web`` then served for ever). From the command's start, SIGINT is Python's
KeyboardInterrupt again, for the command to handle (``launch``, ``--watch``, ``web``'s serving
loop) or for the CLI's boundary (``cli._Boundary``), which says the same line.
``rpcctl/__init__`` stays as light as it is and installs no handler: ranks import it.
"""

import _signal  # the signal module's core, loaded when the interpreter starts: importing it runs no import machinery
import sys  # loaded as well


def main() -> None:
    try:
        _signal.signal(_signal.SIGINT, _early_interrupt)
        from rpcctl.cli import main as cli_main

        cli_main(cancelled=cancelled, command_starts=command_starts)
    except KeyboardInterrupt:  # before the handler was in place
        cancelled()


def _early_interrupt(signum, frame) -> None:
    cancelled()


_early_interrupt.rpcctl_early = True  # how command_starts knows it


def command_starts() -> None:
    """The command's own code begins (the CLI calls it, handed it by ``main``): SIGINT raises
    KeyboardInterrupt again, where the entry point took it."""
    if getattr(_signal.getsignal(_signal.SIGINT), "rpcctl_early", False):
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)


def cancelled() -> None:
    """End the command-line process for a Ctrl-C: one line on stderr, exit code 130, at once
    (``exit_now``); a second Ctrl-C while it ends is ignored. The CLI's boundary calls it too,
    handed it by ``main`` (typer's test runner, or a program calling the app, has its own)."""
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    try:
        sys.stderr.write("rpcctl: cancelled by SIGINT\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # the terminal went away, or stderr is closed
        pass
    exit_now(130)


def exit_now(code: int) -> None:
    """Exit with ``code`` after the exit handlers (``atexit``) and a flush of stdout and stderr,
    without the interpreter's own finalization. CPython 3.11 remembers a KeyboardInterrupt that
    came inside ``eval`` of a string (``collections.namedtuple`` does one per class) even once
    it was handled, and then ends the process by SIGINT (-2) whatever its exit code."""
    import atexit
    import os

    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - the process ends now, whatever a handler raised
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
