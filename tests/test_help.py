"""``--help`` for every command and subcommand, in one style: no ``<bool>`` after a switch, no
``{CONFIG}`` in a usage line, an "Example" line, each default written once, "(default: X)".

The commands are found by walking the click tree that typer builds, so a new command is
checked without being listed here; one real subprocess shows the same at COLUMNS=100."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from conftest import rpcctl
from rpcctl.cli import app


def _commands() -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []

    def walk(command, path: tuple[str, ...]) -> None:
        found.append(path)
        # a group (typer vendors click: no `import click`); the root loads its commands lazily
        if hasattr(command, "list_commands"):
            for name in command.list_commands(None):
                walk(command.get_command(None, name), (*path, name))

    walk(typer.main.get_command(app), ())
    return found


COMMANDS = _commands()


def _help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "100", "NO_COLOR": "1"}, terminal_width=100)
    assert result.exit_code == 0, (path, result.output)
    return result.output


def _option_entries(text: str) -> list[str]:
    """Each option's (or argument's) help, its continuation lines joined."""
    entries: list[str] = []
    for line in text.splitlines():
        if re.match(r"^  {0,2}(-|[A-Z]+\b)", line) and not line.startswith("  Example"):
            entries.append(line)
        elif entries and line.startswith("      ") and line.strip():
            entries[-1] += " " + line.strip()
        elif not line.strip():
            entries.append("")
    return [e for e in entries if e]


def test_every_command_is_found():
    names = {" ".join(p) for p in COMMANDS}
    assert {
        "",
        "launch",
        "runs",
        "inspect",
        "inspect rrefs",
        "inspect calls",
        "bench",
        "bench compare",
        "stack",
    } <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "rpcctl")
def test_help_is_one_style(path):
    text = _help(path)
    assert "<bool>" not in text, text
    assert "{" not in text and "}" not in text, text
    assert re.search(r"^\s*Examples?: rpcctl", text, re.M), f"no Example line:\n{text}"
    assert "[default:" not in text, f"typer's default next to ours:\n{text}"
    for entry in _option_entries(text):
        assert len(re.findall(r"\bdefault\b", entry)) <= 1, f"a default written twice: {entry}"
    assert "\\[" not in text, text  # markup escaped twice


def test_switches_show_no_type_but_values_do():
    text = _help(("launch",))
    assert re.search(r"--dry-run\s+Print the launch plan", text), text
    assert re.search(r"--nproc-per-node, --nproc_per_node N\|auto\|cpu\|gpu", text), text
    assert "Usage: rpcctl launch [OPTIONS] CONFIG | SCRIPT [ARGS]...\n" in text


def test_help_through_a_real_process():
    import os

    result = rpcctl("bench", "compare", "--help", env={**os.environ, "COLUMNS": "100"})
    assert result.returncode == 0, result.stderr
    assert "bench compare [OPTIONS] OLD NEW\n" in result.stdout
    assert "<bool>" not in result.stdout and "Example: rpcctl bench compare" in result.stdout
    result = rpcctl("bench", "--help", env={**os.environ, "COLUMNS": "100"})
    words = " ".join(result.stdout.split())
    assert "--tune Search for the fastest RPC settings on this machine and print them (takes minutes" in words
    assert "about a minute" not in words and "about 4 minutes" in words


def test_inspect_names_every_view_on_its_first_lines():
    """The line is built from the views themselves (collectives was once left off a hand-kept list)."""
    views = sorted(" ".join(p[1:]) for p in COMMANDS if len(p) == 2 and p[0] == "inspect" and p[1] != "stack")
    first = " ".join(_help(("inspect",)).split("Options:")[0].split())
    assert all(re.search(rf"\b{view}\b", first) for view in views), (views, first)


def test_a_command_loads_only_what_it_needs(tmp_path):
    """Each command's module is imported when it runs: `rpcctl runs` or `inspect` never loads the
    launcher's config models or the bench (with them, the CLI's start-up was 0.62 s of CPU, now 0.40)."""
    probe = (
        "import sys\nfrom rpcctl.cli import main\nsys.argv = ['rpcctl', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('rpcctl.config', 'rpcctl.commands.launch', 'rpcctl.commands.bench')"
        " if m in sys.modules))\n"
    )
    import subprocess
    import sys

    for args in (["runs", "--runs-dir", str(tmp_path)], ["inspect", "workers", str(tmp_path / "none")]):
        shown = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=60)
        assert shown.stdout.strip().splitlines()[-1] == "[]", (args, shown.stdout, shown.stderr)
