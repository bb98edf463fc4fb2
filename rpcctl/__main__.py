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
loop) or for the CLI's boundary (``cli._Boundary``), which says the same line; and where Python
drops the KeyboardInterrupt (a weakref callback while ``web`` imports the page's modules), the
signal is raised again in the main thread's own code (``_raise_dropped_signal_again``).
``rpcctl/__init__`` stays as light as it is and installs no handler: ranks import it.
"""

import _signal  # the signal module's core, loaded when the interpreter starts: importing it runs no import machinery
import _thread  # built in, as _signal
import sys  # loaded as well


def main() -> None:
    try:
        _signal.signal(_signal.SIGINT, _early_interrupt)
        sys.unraisablehook = _raise_dropped_signal_again
        from rpcctl.cli import main as cli_main

        cli_main(cancelled=cancelled, command_starts=command_starts)
    except KeyboardInterrupt:  # before the handler was in place
        cancelled()


def _early_interrupt(signum, frame) -> None:
    cancelled()


_early_interrupt.rpcctl_early = True  # how command_starts knows it


_MAIN_THREAD = _thread.get_ident()
_in_hook = [False]  # while _raise_dropped_signal_again runs: its signal must not land in it


def _raise_dropped_signal_again(unraisable) -> None:
    """``sys.unraisablehook``: Python drops an exception raised in a weakref callback or an
    object's ``__del__`` (it prints "Exception ignored in" and runs on). Where that exception is
    a signal's (KeyboardInterrupt, or launch's cancel with its ``signum``) the Ctrl-C was lost:
    the signal is delivered again to the main thread, once this hook has returned (a signal
    handled inside the hook is dropped as well, for good). Any other goes to Python's hook."""
    _in_hook[0] = True
    exc = unraisable.exc_value
    signum = _signal.SIGINT if isinstance(exc, KeyboardInterrupt) else getattr(exc, "signum", None)
    if (
        isinstance(exc, Exception)
        or not isinstance(signum, int)
        or signum not in _signal.valid_signals()  # a signum of some other meaning
        or _thread.get_ident() != _MAIN_THREAD
    ):
        _in_hook[0] = False
        sys.__unraisablehook__(unraisable)
        return
    _thread.start_new_thread(_deliver_when_hook_returned, (signum,))
    _in_hook[0] = False  # the last act: no signal is handled between this store and the return


def _deliver_when_hook_returned(signum: int) -> None:
    import time

    while _in_hook[0]:
        time.sleep(0.001)
    # The signal again, to the main thread itself: it ends a wait there (web's serving loop) as the
    # first did, where _thread.interrupt_main would leave the handler for the wait's end.
    try:
        _signal.pthread_kill(_MAIN_THREAD, signum)
    except OSError:  # the main thread is gone: the process is ending anyway
        pass


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
