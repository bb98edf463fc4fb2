"""YAML config → validated ``JobSpec``.

Every error names where it came from: ``FILE:LINE`` for the file (the line of the key whose
value is wrong), ``--set KEY=VALUE`` for an override, and the dotted key path. Loading reads the
config file and checks that the script exists; nothing else touches the system.

Order of application: file → ``${VAR}`` expansion (file values only) → ``--set`` overrides →
schema validation → path resolution (``script`` relative to the config file's folder).

Whatever the file holds, loading is bounded (a config is a few kilobytes): only a regular file
of at most ``MAX_CONFIG_BYTES`` is read (never a FIFO or a device, which would block), it is
parsed once, as a stream of events, into plain data, nested at most ``MAX_DEPTH`` deep and with
at most ``MAX_VALUES`` values counting every alias's expansion (a "billion laughs" file is
refused, not expanded), and each string is ``${VAR}``-expanded once, however many aliases share
it. Types are strict: a quoted ``"4"`` is not an integer, ``010`` (octal 8 in YAML 1.1) is
refused as ambiguous; a value that ``${VAR}`` expansion produced is read as the field's type.

The package, one module per seam (callers import from ``rpcctl.config`` only)::

    schema        JobSpec and its parts: the keys, their types, their checks
    bounded_yaml  the file → plain data and the line of each key, within bounds
    variables     ${VAR} and ${VAR:-default}
    overrides     --set KEY=VALUE
    locations     where a value came from (flag, --set, FILE:LINE), pydantic's errors → one ConfigError
"""

from __future__ import annotations

import copy
import functools
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rpcctl.config.bounded_yaml import (
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    MAX_EXPANDED_CHARS,
    MAX_VALUES,
    parse_yaml,
    read_config_text,
)
from rpcctl.config.locations import locate, origin_of, validation_error
from rpcctl.config.overrides import apply_override, parse_override
from rpcctl.config.schema import DEFAULT_PRELOAD, JobSpec, LossesSpec, RpcSpec, host_problem
from rpcctl.config.variables import MAX_VAR_NESTING, expand_vars
from rpcctl.base.errors import ConfigError

__all__ = [
    "DEFAULT_PRELOAD",
    "MAX_CONFIG_BYTES",
    "ConfigFile",
    "MAX_DEPTH",
    "MAX_EXPANDED_CHARS",
    "MAX_VALUES",
    "MAX_VAR_NESTING",
    "JobSpec",
    "LossesSpec",
    "RpcSpec",
    "dump_spec",
    "expand_vars",
    "host_problem",
    "load_config",
    "locate",
    "read_config_text",
    "spec_from_line",
]


def load_config(
    path: str | os.PathLike[str],
    overrides: list[str] | None = None,
    *,
    nproc_per_node: int | None = None,
    flags: dict[str, tuple[Any, str]] | None = None,
) -> JobSpec:
    """Read, expand, override and validate a config file. Raises ``ConfigError`` with a location."""
    return ConfigFile(path).spec(overrides, nproc_per_node=nproc_per_node, flags=flags)


class ConfigFile:
    """A config file read and parsed once, at its first use (so that an error in it comes where it
    did): each ``spec`` validates a copy of what was read, and ``locate`` names a key's line from
    the same read. ``rpcctl launch`` asks the file for its nodes (in a SLURM step or a pod), its
    spec and, for ``--dry-run``, where five keys came from: one read, where it was up to eight."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._parsed: tuple[Any, dict[str, int]] | None = None

    def _read(self) -> tuple[Any, dict[str, int]]:
        if self._parsed is None:
            self._parsed = parse_yaml(read_config_text(self.path), str(self.path))
        return self._parsed

    def spec(
        self,
        overrides: list[str] | None = None,
        *,
        nproc_per_node: int | None = None,
        flags: dict[str, tuple[Any, str]] | None = None,
    ) -> JobSpec:
        """The file, expanded, overridden (``--set``) and validated, under ``flags`` (key → (value, origin))."""
        display = str(self.path)
        read, lines = self._read()
        data = copy.deepcopy(read)  # overrides and flags change the data: the next spec starts from the file's
        origins: dict[tuple[str, ...], str] = {}
        for override in overrides or []:
            key, value = parse_override(override)
            apply_override(data, key, value, override)
            origins[key] = f"--set {override}"
        flags = dict(flags or {})
        if nproc_per_node is not None:
            flags["nproc_per_node"] = (nproc_per_node, f"-n {nproc_per_node}")
        if isinstance(data, dict) and "script" not in data and "module" not in data and "script" not in flags:
            raise ConfigError("missing required key 'script'", where=display, key="script")
        return _validated(data, flags, origins, lines, display, self.path.stem, self.path.parent)

    def locate(self, key: str, *, overrides: list[str] = (), flags: dict[str, tuple[Any, str]] | None = None) -> str:
        """``locate`` on this file's one read."""
        try:
            lines = self._read()[1]
        except ConfigError:  # a file that cannot be read names no line
            lines = {}
        return locate(self.path, key, overrides=overrides, flags=flags, lines=lines)


def spec_from_line(
    target: str,
    args: list[str],
    *,
    module: bool = False,
    no_python: bool = False,
    flags: dict[str, tuple[Any, str]] | None = None,
) -> JobSpec:
    """The job of a torchrun line, ``[OPTIONS] SCRIPT ARGS`` or ``-m MODULE ARGS``: ``flags``
    are its options as config keys (``rpcctl.config.torchrun``). The script is found from the
    working directory, as torchrun's ranks find it; the ranks see it as typed (``argv0``)."""
    import shutil

    data: dict[str, Any] = {"args": list(args)}
    if module:
        data["module"] = target
        name = target.rpartition(".")[2]
    elif no_python and os.sep not in target:  # a program on PATH, as torchrun's exec finds it
        found = shutil.which(target)
        if found is None:
            raise ConfigError(
                f"program not found: {target} (--no-python runs it as a program: not a file here nor on PATH)"
            )
        data.update(script=found, argv0=target, no_python=True)
        name = Path(target).stem
    else:
        if not Path(target).expanduser().is_file():  # one message naming it as typed
            raise ConfigError(f"script not found: {target} (from {Path.cwd()}: torchrun's ranks look for it there too)")
        if not no_python and Path(target).suffix != ".py" and _looks_like_a_config(Path(target)):
            raise ConfigError(
                f"{target} looks like a config (a mapping with script: or module:), not a script: "
                "rpcctl reads a config named .yaml or .yml (rename it), and runs any other file "
                "as a torchrun line's SCRIPT"
            )
        data.update(script=target, argv0=target, no_python=no_python)
        name = Path(target).stem
    return _validated(data, dict(flags or {}), {}, {}, "the command line", name, Path.cwd())


def _looks_like_a_config(path: Path) -> bool:
    """A YAML mapping with a ``script`` or ``module`` key (read within the config's bounds)."""
    try:
        data, _ = parse_yaml(read_config_text(path), str(path))
    except (ConfigError, OSError, UnicodeError):
        return False
    return isinstance(data, dict) and bool({"script", "module"} & set(data))


def _validated(
    data: Any,
    flags: dict[str, tuple[Any, str]],
    origins: dict[tuple[str, ...], str],
    lines: dict,
    display: str,
    stem: str,
    base: Path,
) -> JobSpec:
    for key, (value, origin) in flags.items():  # command-line flags beat the file and --set
        data[key] = value
        origins[(key,)] = origin
    data.setdefault("name", stem)
    if "name" not in lines and ("name",) not in origins:
        data["name"] = _sanitize_name(str(data["name"]))

    where = functools.partial(origin_of, origins=origins, lines=lines, display=display)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, where, data) from None
    if spec.script is None:  # a module: Python finds it in the ranks, from the working directory
        return spec
    script = spec.script.expanduser()
    if not script.is_absolute():
        script = (base / script).resolve()
    if not script.is_file():
        raise ConfigError(f"script not found: {script}", where=where(("script",)), key="script")
    if spec.no_python and not os.access(script, os.X_OK):
        raise ConfigError(
            f"{script} is not executable: --no-python (no_python: true) runs the script as a program",
            where=where(("script",)),
            key="script",
        )
    return spec.model_copy(update={"script": script})


def _sanitize_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._") or "job"


def dump_spec(spec: JobSpec) -> str:
    """The resolved spec as YAML (what the run directory keeps as config.yaml)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
