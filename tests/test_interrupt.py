"""Ctrl-C at any early moment of the command line (``python -m rpcctl`` and the ``rpcctl``
script): once rpcctl's own code runs, a SIGINT ends the command with one line and exit code
130, never a traceback, while typer, rich and the command's module load, while it parses, and
while it runs. Real processes, each sent one real SIGINT at a later moment than the one before.

A signal that comes before rpcctl's code runs (the interpreter's start, ``site``, the
script's own ``from rpcctl.__main__ import main``) is Python's: its traceback has no frame of
rpcctl's, and that try tells nothing."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_web_server import a_run  # noqa: F401 - the fixture: a finished run

pytestmark = pytest.mark.timeout(300)

LINE = "rpcctl: cancelled by SIGINT"
# A SIGINT while CPython, starting a script, checks whether argv[0] is an import path entry: it
# prints this and the traceback, and runs the script as if no signal came (CI, once in 20 tries
# of `rpcctl web`, which then served until the try's 30 s ran out).
SWALLOWED = "Failed checking if argv[0] is an import path entry"
FRAME = re.compile(r'File "([^"]+)", line \d+, in (\S+)')


def _our_frames(stderr: str) -> list[str]:
    """The traceback's frames in rpcctl's code: any module of the package but its light
    ``__init__`` and the top of ``__main__`` (both run before anything can catch a signal)."""
    ours = []
    for path, function in FRAME.findall(stderr):
        if "/rpcctl/" not in path or path.endswith("/rpcctl/__init__.py"):
            continue
        if path.endswith("/rpcctl/__main__.py") and function == "<module>":
            continue
        ours.append(f"{path} in {function}")
    return ours


def _interrupt_at(argv: list[str], delay: float) -> subprocess.CompletedProcess:
    """Start ``argv``, SIGINT it after ``delay``; a process still there 30 s later is killed and
    comes back with returncode None (it ignored the Ctrl-C) and what it printed."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        code = None
    return subprocess.CompletedProcess(argv, code, out, err)


def _took(argv: list[str]) -> float:
    """How long ``argv`` runs to its end, unsignalled (the shorter of two runs)."""
    times = []
    for _ in range(2):
        started = time.monotonic()
        subprocess.run(argv, capture_output=True, timeout=60, check=True)
        times.append(time.monotonic() - started)
    return min(times)


def _entry_points() -> dict[str, list[str]]:
    script = Path(sys.executable).parent / "rpcctl"
    entries = {"python -m rpcctl": [sys.executable, "-m", "rpcctl"]}
    if script.is_file():
        entries["rpcctl script"] = [str(script)]
    return entries


@pytest.mark.parametrize("entry", list(_entry_points()))
@pytest.mark.parametrize("command", ["--help", "web"])
def test_ctrl_c_at_any_early_moment_is_one_line_and_exit_130(a_run, entry, command):
    """20 tries, 0 to 0.8 s after the start (one each 40 ms; for `--help`, spread over the time it
    takes, if that is less): `--help` imports every command's module (0.4 s to a second here),
    `web` loads the page's modules and then serves until Ctrl-C. Each try ends in the one line
    and 130, or (for --help, late) in its own success, or before our code ran."""
    argv = _entry_points()[entry] + (["--help"] if command == "--help" else ["web", str(a_run)])
    # --help ends on its own: its tries are spread over how long it takes here and now (0.4 s on
    # an idle machine, where 40 ms apart left 9 of 20 inside it; under load it takes longer)
    step = 0.04 if command == "web" else min(0.04, _took(argv) / 20)
    ours, before, bad = 0, 0, []
    for i in range(20):
        delay = step * i
        result = _interrupt_at(argv, delay)
        frames = _our_frames(result.stderr)
        if (
            result.returncode == 130
            and result.stderr.strip().splitlines()[-1:] == [LINE]
            and "Traceback" not in result.stderr
        ):
            ours += 1
            if command == "--help":
                assert result.stderr.strip() == LINE, result.stderr
        elif command == "--help" and result.returncode == 0 and "Usage:" in result.stdout:
            continue  # it had finished
        elif result.returncode in (1, -signal.SIGINT) and not frames and LINE not in result.stderr:
            before += 1  # the interpreter's, before rpcctl's code ran
        elif SWALLOWED in result.stderr and not frames and LINE not in result.stderr:
            before += 1  # CPython's start printed it and ran the script on (the try's 30 s ran out)
        else:
            bad.append((delay, result.returncode, frames[-3:] or result.stderr[-300:]))
    assert not bad, bad
    assert ours >= 10, (ours, before)  # most tries came while our code ran


@pytest.mark.parametrize(
    "argv",
    [["runs", "--limit", "1"], ["inspect", "workers"], ["bench", "compare", "no-old.json", "no-new.json"]],
    ids=["runs", "inspect-workers", "bench-compare"],
)
def test_the_early_handling_ends_where_the_commands_own_code_begins(tmp_path, argv):
    """From the command's first line, SIGINT is Python's KeyboardInterrupt again (``launch``,
    ``--watch`` and ``web`` handle it as their own), in a command, a view of a sub-app and a
    subcommand of a group with its own callback alike."""
    import _signal

    from typer.testing import CliRunner

    import rpcctl.__main__ as entry
    from rpcctl import cli

    hooks = dict(cli._hooks)
    cli._hooks["command_starts"] = entry.command_starts  # as rpcctl.__main__.main hands it on
    previous = _signal.signal(_signal.SIGINT, entry._early_interrupt)  # and leaves SIGINT
    try:
        CliRunner().invoke(cli.app, [*argv, "--runs-dir", str(tmp_path)] if argv[0] != "bench" else argv)
        assert _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
    finally:
        _signal.signal(_signal.SIGINT, previous)
        cli._hooks.update(hooks)


DROPPED = """
import os, select, signal, sys, time, weakref
import rpcctl.__main__ as entry
from rpcctl.launch import launcher

sys.unraisablehook = entry._raise_dropped_signal_again  # as rpcctl.__main__.main installs it
signum = signal.{signal}


class Held:
    pass


def signalled_inside(ref):  # the signal's handler runs in this callback: Python drops what it raises
    os.kill(os.getpid(), signum)
    time.sleep(0.2)


with launcher._cancels_raise() if signum != signal.SIGINT else open(os.devnull):
    held = Held()
    ref = weakref.ref(held, signalled_inside)
    try:
        del held
        select.select([], [], [])  # a wait only a signal ends, as web's serving loop
    except (KeyboardInterrupt, launcher._Cancel) as exc:
        print("landed", type(exc).__name__)
"""


@pytest.mark.parametrize("name,landed", [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "_Cancel")])
def test_a_signal_python_drops_in_a_weakref_callback_is_raised_again_in_the_main_threads_code(name, landed):
    """A real signal handled inside a weakref callback (as one landed in the import machinery's
    while `rpcctl web` loaded its page: CI, then it served for ever): Python prints "Exception
    ignored in" and runs on; the entry point's hook raises it again where the program can take
    it, as KeyboardInterrupt or as launch's cancel, and prints nothing of it. A process that
    waits on (Python dropped the signal) is killed at the timeout."""
    result = subprocess.run(
        [sys.executable, "-c", DROPPED.format(signal=name)], capture_output=True, text=True, timeout=30
    )
    assert result.stdout.strip() == f"landed {landed}", (result.stdout, result.stderr)
    assert "Exception ignored" not in result.stderr, result.stderr


def test_an_exception_with_a_signum_of_another_meaning_is_pythons_to_print():
    """Only a signal's exception is raised again: one whose ``signum`` is no signal (99999) is
    printed by Python's own hook, and the program runs on."""
    code = (
        "import sys, time\n"
        "import rpcctl.__main__ as entry\n"
        "sys.unraisablehook = entry._raise_dropped_signal_again\n"
        "class Odd(BaseException):\n    signum = 99999\n"
        "class Held:\n    def __del__(self):\n        raise Odd()\n"
        "Held()\n"
        "time.sleep(0.2)\n"
        "print('ran on')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ran on", (result.stdout, result.stderr)
    assert "Exception ignored in" in result.stderr and "Odd" in result.stderr and "Unhandled" not in result.stderr
