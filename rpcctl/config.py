"""YAML config → validated ``JobSpec``.

Every error names where it came from: ``FILE:LINE`` for the file (the line of the key whose
value is wrong), ``--set KEY=VALUE`` for an override, and the dotted key path. Loading reads the
config file and checks that the script exists; nothing else touches the system.

Order of application: file → ``${VAR}`` expansion (file values only) → ``--set`` overrides →
schema validation → path resolution (``script`` relative to the config file's folder).
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from rpcctl.errors import ConfigError

DEFAULT_PRELOAD = ["torch", "torch.distributed.rpc"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RpcSpec(_Spec):
    """``rpc:`` — have rpcctl call ``init_rpc`` before the script and ``shutdown`` after it."""

    init: bool = False
    name: str = "worker{rank}"  # worker name template: {rank}, {local_rank}
    rpc_timeout: float = Field(60.0, gt=0)
    num_worker_threads: int = Field(16, ge=1)
    # {remote worker name: {local device: remote device}}, as TensorPipeRpcBackendOptions takes.
    device_maps: dict[str, dict[str, str]] = Field(default_factory=dict)
    devices: list[str] = Field(default_factory=list)
    # auto: the single-node settings `rpcctl bench --tune` found good (shared-memory transport,
    # huge-page allocation); see docs/bench.md. Your own `env:` still wins.
    tuning: Literal["off", "auto"] = "off"

    @field_validator("name")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            value.format(rank=0, local_rank=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"bad name template {value!r}: only {{rank}} and {{local_rank}} may appear") from exc
        return value


class LossesSpec(_Spec):
    """``losses:`` — how losses are captured from each rank's printed output."""

    # A regex with a named group ``loss`` (and optionally ``step``, ``epoch``).
    pattern: str | None = None

    @field_validator("pattern")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regex: {exc}") from exc
        if "loss" not in compiled.groupindex:
            raise ValueError("the pattern needs a named group (?P<loss>...)")
        return value


Scalar = str | int | float | bool


class EntryError(ValueError):
    """A validator's error about one entry of a list or mapping: ``entry`` extends the key path."""

    def __init__(self, message: str, entry: str | int):
        super().__init__(message)
        self.entry = entry


def _no_bool(value: Any) -> Any:
    # YAML's `true` would otherwise pass as the integer 1.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    return value


class JobSpec(_Spec):
    """What the user asked for. Plain data, no I/O: ``plan`` turns it into a ``LaunchPlan``."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    script: Path
    args: list[Scalar] = Field(default_factory=list)
    nproc_per_node: int = Field(1, ge=1, le=1024)
    env: dict[str, Scalar] = Field(default_factory=dict)
    timeout: float | None = Field(None, gt=0)  # job deadline in seconds; none by default
    max_restarts: int = Field(0, ge=0)
    grace: float = Field(5.0, ge=0)  # seconds between SIGTERM and SIGKILL at teardown
    # cpu: hide GPUs; inherit: leave CUDA_VISIBLE_DEVICES alone (what torchrun does);
    # auto: one local GPU per rank, round-robin; a list: one entry per local rank (GPU index or "cpu").
    devices: str | list[int | str] = "inherit"
    rpc: RpcSpec = Field(default_factory=RpcSpec)
    losses: LossesSpec = Field(default_factory=LossesSpec)
    master_port: int | None = Field(None, ge=1, le=65535)  # one node: a free port when unset
    # Several nodes: one launcher per node. Node 0 hosts the rendezvous (torch's TCPStore) on
    # master_addr:master_port; the ranks' own rendezvous port is picked by node 0 and shared.
    nnodes: int = Field(1, ge=1, le=65536)
    node_rank: int = Field(0, ge=0)
    master_addr: str | None = None
    ifname: str | None = None  # network interface for TensorPipe/Gloo; default: the one routing to master_addr
    rdzv_timeout: float = Field(300.0, gt=0)  # seconds to wait for every node to arrive
    # fork: one process imports `preload` once and forks the ranks (fast); spawn: a fresh
    # interpreter per rank, for scripts that must set things up before torch is imported.
    start_method: Literal["fork", "spawn"] = "fork"
    preload: list[str] = Field(default_factory=lambda: list(DEFAULT_PRELOAD))

    _ints = field_validator("nproc_per_node", "max_restarts", "timeout", "grace", "master_port", "nnodes", "node_rank", mode="before")(
        classmethod(lambda cls, v: _no_bool(v))
    )

    @field_validator("args")
    @classmethod
    def _args_as_strings(cls, value: list[Scalar]) -> list[Scalar]:
        return [str(v) for v in value]

    @field_validator("env")
    @classmethod
    def _env_as_strings(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise EntryError(f"{key!r} is not a valid environment variable name", key)
        return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items()}

    @field_validator("node_rank")
    @classmethod
    def _node_rank_in_range(cls, value: int, info: ValidationInfo) -> int:
        nnodes = info.data.get("nnodes")
        if nnodes is not None and value >= nnodes:
            raise ValueError(f"node_rank {value} is out of range for nnodes {nnodes} (0-{nnodes - 1})")
        return value

    @field_validator("master_addr")
    @classmethod
    def _master_addr_needed(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("master_addr is empty")
        return value

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            if value not in ("cpu", "auto", "inherit"):
                raise ValueError(f"devices must be 'cpu', 'auto', 'inherit' or a list (one GPU index or 'cpu' per local rank), got {value!r}")
            return value
        if not isinstance(value, list):
            raise ValueError(f"devices must be 'cpu', 'auto', 'inherit' or a list, got {type(value).__name__}")
        nproc = info.data.get("nproc_per_node")
        if nproc is not None and len(value) != nproc:
            raise ValueError(f"devices lists {len(value)} entries but nproc_per_node is {nproc}: give one per local rank")
        parsed: list[int | str] = []
        for index, entry in enumerate(value):
            text = str(entry).strip()
            match = re.fullmatch(r"(?:cuda:)?(\d+)", text)
            if match and not isinstance(entry, bool):
                parsed.append(int(match.group(1)))
            elif text == "cpu":
                parsed.append("cpu")
            else:
                raise EntryError(f"device entry {entry!r} is neither a GPU index (0, 'cuda:1') nor 'cpu'", index)
        return parsed


# ---------------------------------------------------------------------------------------------
# Loading


def load_config(
    path: str | os.PathLike[str],
    overrides: list[str] | None = None,
    *,
    nproc_per_node: int | None = None,
    flags: dict[str, tuple[Any, str]] | None = None,
) -> JobSpec:
    """Read, expand, override and validate a config file. Raises ``ConfigError`` with a location."""
    path = Path(path)
    display = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {display}") from None
    except IsADirectoryError:
        raise ConfigError(f"config path is a directory, not a file: {display}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {display}: {exc}") from None

    data, lines = _parse_yaml(text, display)
    data = _expand_env(data, (), lines, display)
    origins: dict[tuple[str, ...], str] = {}
    for override in overrides or []:
        key, value = _parse_override(override)
        _apply_override(data, key, value, override)
        origins[key] = f"--set {override}"
    flags = dict(flags or {})
    if nproc_per_node is not None:
        flags["nproc_per_node"] = (nproc_per_node, f"-n {nproc_per_node}")
    for key, (value, origin) in flags.items():  # command-line flags beat the file and --set
        data[key] = value
        origins[(key,)] = origin
    data.setdefault("name", path.stem)
    if "name" not in lines and ("name",) not in origins:
        data["name"] = _sanitize_name(str(data["name"]))

    def where(loc: tuple[str, ...]) -> str:
        for n in range(len(loc), 0, -1):
            if loc[:n] in origins:
                return origins[loc[:n]]
        for key, origin in origins.items():  # an override below this key replaced its value
            if key[: len(loc)] == loc:
                return origin
        for n in range(len(loc), -1, -1):
            if _key(loc[:n]) in lines:
                return f"{display}:{lines[_key(loc[:n])]}"
        return display

    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, where) from None

    script = spec.script.expanduser()
    if not script.is_absolute():
        script = (path.parent / script).resolve()
    if not script.is_file():
        raise ConfigError(f"script not found: {script}", where=where(("script",)), key="script")
    return spec.model_copy(update={"script": script})


def _key(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _sanitize_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._") or "job"


def _parse_yaml(text: str, display: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Parse YAML into data plus a map of dotted key path → 1-based line of that key."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        where, problem = _yaml_problem(exc, display)
        raise ConfigError(f"YAML syntax error: {problem}", where=where) from None
    if root is None:
        raise ConfigError("config file is empty: expected a mapping with at least 'script'", where=display)
    if not isinstance(root, yaml.MappingNode):
        kind = {yaml.SequenceNode: "a list", yaml.ScalarNode: "a single value"}.get(type(root), "not a mapping")
        raise ConfigError(f"config must be a mapping of keys to values, got {kind}", where=f"{display}:{root.start_mark.line + 1}")

    lines: dict[str, int] = {}

    def walk(node: yaml.Node, loc: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value)
                if key in seen:
                    raise ConfigError(f"duplicate key '{key}'", where=f"{display}:{key_node.start_mark.line + 1}", key=_key(loc + (key,)))
                seen.add(key)
                lines[_key(loc + (key,))] = key_node.start_mark.line + 1
                walk(value_node, loc + (key,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[_key(loc + (str(i),))] = item.start_mark.line + 1
                walk(item, loc + (str(i),))

    walk(root, ())
    try:
        data = yaml.SafeLoader(text).get_single_data()
    except yaml.YAMLError as exc:  # e.g. an unhashable key: compose accepts it, construct does not
        where, problem = _yaml_problem(exc, display)
        raise ConfigError(f"YAML error: {problem}", where=where) from None
    return data, lines


def _yaml_problem(exc: yaml.YAMLError, display: str) -> tuple[str, str]:
    """(FILE:LINE:COL, one-line problem) from a PyYAML error, without its multi-line repr."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return display, str(exc).splitlines()[0]
    mark = exc.problem_mark or exc.context_mark
    where = f"{display}:{mark.line + 1}:{mark.column + 1}" if mark else display
    problem = exc.problem or "invalid YAML"
    if exc.context:
        opened = exc.context_mark
        at = f" (opened at line {opened.line + 1})" if opened and mark and opened.line != mark.line else ""
        problem = f"{problem}, {exc.context}{at}"
    return where, problem


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\$")


def _expand_env(value: Any, loc: tuple[str, ...], lines: dict[str, int], display: str) -> Any:
    """Expand ``${VAR}`` and ``${VAR:-default}`` in string values; ``$$`` is a literal ``$``."""
    if isinstance(value, dict):
        return {k: _expand_env(v, loc + (str(k),), lines, display) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, loc + (str(i),), lines, display) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        line = lines.get(_key(loc))
        raise ConfigError(
            f"environment variable {name} is not set (use ${{{name}:-default}} for a default)",
            where=f"{display}:{line}" if line else display,
            key=_key(loc),
        )

    return _VAR.sub(substitute, value)


def _parse_override(override: str) -> tuple[tuple[str, ...], Any]:
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError("expected KEY=VALUE, e.g. --set rpc.init=true", where=f"--set {override}")
    parts = tuple(key.split("."))
    if any(not p for p in parts):
        raise ConfigError(f"bad key path '{key}'", where=f"--set {override}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        _, problem = _yaml_problem(exc, "")
        raise ConfigError(f"cannot parse value {raw!r} as YAML: {problem}", where=f"--set {override}", key=key) from None
    return parts, value


def _apply_override(data: dict[str, Any], key: tuple[str, ...], value: Any, override: str) -> None:
    node = data
    for i, part in enumerate(key[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"'{_key(key[: i + 1])}' is not a mapping, so it has no key '{key[i + 1]}'", where=f"--set {override}", key=_key(key))
        node = child
    node[key[-1]] = value


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = JobSpec
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


_UNION_TAGS = frozenset({"str", "int", "float", "bool"})


def _validation_error(exc: ValidationError, where) -> ConfigError:
    messages = []
    seen: set[tuple[str, ...]] = set()
    for error in exc.errors():
        # Drop pydantic's union-branch names ('str', 'list[...]', ...) from the location.
        loc = tuple(str(p) for p in error["loc"] if not (isinstance(p, str) and (p in _UNION_TAGS or "[" in p or p.startswith("literal"))))
        original = (error.get("ctx") or {}).get("error")
        if isinstance(original, EntryError):
            loc += (str(original.entry),)
        if loc in seen:  # one message per key: a union reports each branch's failure
            continue
        seen.add(loc)
        key = _key(loc)
        kind = error["type"]
        if kind == "extra_forbidden":
            parent, name = loc[:-1], loc[-1]
            known = _known_keys(parent)
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else (f" (known keys: {', '.join(known)})" if known else "")
            message = f"unknown key '{name}'{hint}"
        elif kind == "missing":
            message = f"missing required key '{key}'"
        else:
            message = error["msg"].removeprefix("Value error, ")
            if "input" in error and kind not in ("model_type", "dict_type") and not isinstance(error["input"], dict) and "got" not in message and not isinstance(original, EntryError):
                message += f" (got {error['input']!r})"
        messages.append((where(loc), key, message))
    messages.sort(key=lambda m: int(m[0].rsplit(":", 1)[1]) if m[0].rsplit(":", 1)[-1].isdigit() else 0)
    where_first, key_first, first = messages[0]
    text = first
    if len(messages) > 1:
        text += "".join(f"\n  also {w}: key '{k}': {m}" for w, k, m in messages[1:])
    return ConfigError(text, where=where_first, key=key_first or None)


def locate(path: str | os.PathLike[str], key: str) -> str:
    """``FILE:LINE`` of a key (or of its nearest parent present in the file)."""
    display = str(path)
    try:
        _, lines = _parse_yaml(Path(path).read_text(), display)
    except (OSError, ConfigError):
        return display
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        line = lines.get(".".join(parts[:n]))
        if line:
            return f"{display}:{line}"
    return display


def dump_spec(spec: JobSpec) -> str:
    """The resolved spec as YAML (what the run directory keeps as config.yaml)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
