"""Fuzzing the config loader with ``hypothesis`` (issue 15: "nothing it is fed breaks it").

The property, for any text in the config file and any ``--set`` values: ``load_config`` either
returns a valid ``JobSpec`` or raises ``ConfigError`` (exit 2, a located message); never another
exception, and each example stays within a memory budget (tracemalloc's peak) and a generous
time bound (the machine is shared: the bound catches blow-ups, not slowness; speed is measured
by benchmarks/config_bombs.py).

Four sources of input: arbitrary text; YAML-ish text assembled from the pieces that broke
loaders before (anchors, aliases, merge keys, tags, octal-looking and base-60 numbers, ${VAR}
forms, deep brackets, tabs); the known hazards themselves at random sizes (nesting depth,
alias fan-out and depth, recursive aliases, nested defaults) after a valid start; and
structured documents (mappings of the spec's own keys with values of every type) dumped by
PyYAML. Everything is in-process and file-only.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpcctl.config import JobSpec, load_config
from rpcctl.base.errors import ConfigError

MEMORY_BUDGET = 200 << 20  # bytes of Python allocations at the peak of one load
TIME_BOUND_S = 20.0  # per example, on a loaded 2-core machine; a bomb takes minutes

FUZZ = settings(
    max_examples=150,
    deadline=None,  # timing jitters on a shared machine: the bound is checked below instead
    database=None,  # no .hypothesis directory left in the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SPEC_KEYS = list(JobSpec.model_fields) + ["rpc.init", "rpc.name", "rpc.int", "nprocs_per_node", "<<", "env.A"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz")
    (path / "train.py").write_text("print('hi')\n")
    return path


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("RPCCTL_FUZZ_SET", "3")
    monkeypatch.delenv("RPCCTL_FUZZ_UNSET", raising=False)


def check_loads_or_refuses(folder: Path, text: str, overrides: list[str] = ()) -> None:
    path = folder / "job.yaml"
    path.write_text(text, encoding="utf-8")
    tracemalloc.start()
    started = time.monotonic()
    try:
        spec = load_config(path, list(overrides))
    except ConfigError as exc:
        assert exc.exit_code == 2
        assert exc.message and str(exc).strip(), repr(exc)
        first = str(exc).splitlines()[0]
        assert first.startswith((str(path), "--set ", "config ", "script ")) or exc.where is None, first
    else:
        assert isinstance(spec, JobSpec)
        assert spec.script.is_file()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MEMORY_BUDGET, peak
    assert time.monotonic() - started < TIME_BOUND_S


def _utf8(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates cannot be written as UTF-8


@FUZZ
@given(st.text(max_size=400).map(_utf8))
def test_any_text(folder, text):
    check_loads_or_refuses(folder, text)


@FUZZ
@given(st.text(max_size=200).map(_utf8))
def test_any_text_after_a_valid_start(folder, text):
    check_loads_or_refuses(folder, "script: train.py\n" + text)


TRICKY_VALUES = [
    "1",
    "010",
    "0755",
    "09",
    "1:30",
    "1_000",
    "0x1F",
    "0b11",
    ".inf",
    "-.inf",
    ".nan",
    "-1",
    "1e3",
    "1.0e+3",
    "2.5",
    '"4"',
    "'true'",
    "true",
    "yes",
    "off",
    "null",
    "~",
    "",
    "[]",
    "{}",
    "[0, cpu]",
    "{a: 1}",
    "train.py",
    "nope.py",
    "${RPCCTL_FUZZ_SET}",
    "${RPCCTL_FUZZ_UNSET}",
    "${RPCCTL_FUZZ_UNSET:-${RPCCTL_FUZZ_SET}}",
    "${RPCCTL_FUZZ_UNSET:-${X",
    "${}",
    "$$",
    "${A-x}",
    "&a [x, *a]",
    "&b {k: v}",
    "*b",
    "*a",
    "*missing",
    "!!python/object:os.system x",
    "!!set {a}",
    "!!binary aGk=",
    "!custom x",
    "!!int '3'",
    "!!float x",
    "[[[[[[[[",
    "]]]]",
    "{{{{",
    "'unterminated",
    '"\\x"',
    "|\n  block\n  text",
    ">-\n  folded",
    "worker{rank}",
    "w {rank}",
    "{rank",
    "cuda:0",
    "2024-01-01",
    "\t",
    "? [a]\n: 1",
    "<<: *b",
]
KEY_PIECES = SPEC_KEYS + [
    "rpc",
    "losses",
    "pattern",
    "device_maps",
    "devices",
    "worker1",
    "0",
    "? x",
    "- x",
    "&k key",
    "*k",
]


@st.composite
def yamlish(draw) -> str:
    """Lines of `key: value` at random indents, from the pieces above, sometimes nested."""
    lines = [] if draw(st.booleans()) else ["script: train.py"]
    for _ in range(draw(st.integers(0, 12))):
        indent = " " * draw(st.sampled_from([0, 0, 0, 2, 2, 4, 1, 3]))
        key = draw(st.sampled_from(KEY_PIECES))
        value = draw(st.sampled_from(TRICKY_VALUES))
        sep = draw(st.sampled_from([": ", ":", ": ", " : ", ":\n  - "]))
        lines.append(f"{indent}{key}{sep}{value}")
    if draw(st.booleans()):
        depth = draw(st.integers(1, 3000))
        lines.append("args: " + "[" * depth + "]" * draw(st.integers(0, depth)))
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n---\n", "\n...\n"]))


@FUZZ
@given(yamlish())
def test_yamlish_text(folder, text):
    check_loads_or_refuses(folder, text)


@st.composite
def hazards(draw) -> str:
    """A valid start, then one construct that blew up loaders: deep nesting, an alias chain
    (billion laughs, any fan-out and depth), a recursive alias, or a long ${...} nest."""
    kind = draw(st.sampled_from(["deep", "laughs", "recursive", "vars"]))
    if kind == "deep":
        depth = draw(st.integers(1, 5000))
        opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}"), ("[{a: ", "}]")]))
        return "script: train.py\nargs: " + opener * depth + closer * depth + "\n"
    if kind == "laughs":
        fanout, levels = draw(st.integers(1, 12)), draw(st.integers(1, 10))
        lines = ["script: train.py", "env: {A: &l0 lol}"]
        lines += [f"x{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fanout) + "]" for i in range(1, levels)]
        lines.append(f"args: *l{levels - 1}")
        return "\n".join(lines) + "\n"
    if kind == "recursive":
        return (
            "script: train.py\n"
            + draw(
                st.sampled_from(
                    ["args: &a [x, *a]", "env: &e {A: *e}", "rpc: &r {device_maps: {w: *r}}", "args: &a [[[*a]]]"]
                )
            )
            + "\n"
        )
    depth = draw(st.integers(1, 40))
    return (
        "script: train.py\nenv:\n  A: "
        + "${RPCCTL_FUZZ_UNSET:-" * depth
        + "x"
        + "}" * draw(st.integers(0, depth))
        + "\n"
    )


@FUZZ
@given(hazards())
def test_known_hazards(folder, text):
    check_loads_or_refuses(folder, text)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20).map(_utf8),
    st.sampled_from(TRICKY_VALUES),
)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8).map(_utf8), inner, max_size=4),
    max_leaves=20,
)
spec_like = st.dictionaries(st.sampled_from(list(JobSpec.model_fields)), documents, max_size=8).map(
    lambda d: {"script": "train.py", **d}
)


@FUZZ
@given(st.one_of(documents, spec_like))
def test_structured_documents(folder, document):
    check_loads_or_refuses(folder, yaml.safe_dump(document, allow_unicode=True))


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(SPEC_KEYS + ["rpc.device_maps.w1.cuda:0", "a..b", ""]), st.sampled_from(TRICKY_VALUES)
        ),
        max_size=4,
    )
)
def test_set_overrides(folder, pairs):
    check_loads_or_refuses(folder, "script: train.py\n", [f"{key}={value}" for key, value in pairs])
