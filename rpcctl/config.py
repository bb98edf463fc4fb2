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
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from rpcctl.errors import ConfigError
from rpcctl.linear_re import compile_linear

DEFAULT_PRELOAD = ["torch", "torch.distributed.rpc"]

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: a config is kilobytes; anything bigger is a mistake or an attack
MAX_DEPTH = 32  # the spec itself nests four deep (rpc.device_maps.WORKER.DEVICE)
MAX_VALUES = 10_000  # values (not keys) in the document, each alias counted as the values it stands for
MAX_EXPANDED_CHARS = 4 << 20  # characters that ${VAR} expansion may produce, in all
MAX_VAR_NESTING = 8  # ${A:-${B:-${C}}}: defaults nested this deep


class Expanded(str):
    """A string that ``${VAR}`` expansion produced: it may stand for a number or a boolean."""


_NUMBER = re.compile(r"[-+]?(?:\d[\d_]*)?\.?\d[\d_]*(?:[eE][-+]?\d+)?")


def _strict_number(value: Any, kind: type) -> Any:
    """Before pydantic's own check: refuse what lax coercion would silently accept."""
    if isinstance(value, bool):  # YAML's `true` would otherwise pass as the integer 1
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, Expanded):  # `${N}`: the environment only has strings
        text = value.strip()
        if re.fullmatch(r"[-+]?\d+", text) or kind is float and _NUMBER.fullmatch(text):
            value = kind(text)  # a fraction for an int is left to pydantic's own message
    elif isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        text = value.strip()
        if "e" in text.lower() and "." not in text:  # YAML 1.1 reads a float only with a dot
            raise ValueError(f"expected a number, got the string {value!r}: YAML 1.1 needs a dot in a float, e.g. 1.0e+3")
        raise ValueError(f"expected a number, got the string {value!r}: write {text} without quotes")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return value


def _strict_bool(value: Any) -> Any:
    if isinstance(value, bool) or isinstance(value, Expanded):  # `${FLAG}`: pydantic reads true/false/1/0
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        raise ValueError(f"expected true or false, got the string {value!r}: write {value.strip().lower()} without quotes")
    if isinstance(value, (int, float)):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


# Strict scalar types for the spec: a string is never silently a number, nor a number a boolean.
Int = Annotated[int, BeforeValidator(lambda v: _strict_number(v, int))]
Float = Annotated[float, BeforeValidator(lambda v: _strict_number(v, float)), Field(allow_inf_nan=False)]
Bool = Annotated[bool, BeforeValidator(_strict_bool)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RpcSpec(_Spec):
    """``rpc:`` — have rpcctl call ``init_rpc`` before the script and ``shutdown`` after it."""

    init: Bool = False
    name: str = "worker{rank}"  # worker name template: {rank}, {local_rank}
    rpc_timeout: Float = Field(60.0, gt=0)
    num_worker_threads: Int = Field(16, ge=1)
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
        if "loss" not in compile_linear(value).groupindex:  # RE2, the loss parser's engine
            raise ValueError("the pattern needs a named group (?P<loss>...)")
        return value


Scalar = str | int | float | bool


class EntryError(ValueError):
    """A validator's error about one entry of a list or mapping: ``entry`` extends the key path."""

    def __init__(self, message: str, entry: str | int):
        super().__init__(message)
        self.entry = entry


class JobSpec(_Spec):
    """What the user asked for. Plain data, no I/O: ``plan`` turns it into a ``LaunchPlan``."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    script: Path
    args: list[Scalar] = Field(default_factory=list)
    nproc_per_node: Int = Field(1, ge=1, le=1024)
    env: dict[str, Scalar] = Field(default_factory=dict)
    timeout: Float | None = Field(None, gt=0)  # job deadline in seconds; none by default
    max_restarts: Int = Field(0, ge=0)
    grace: Float = Field(5.0, ge=0)  # seconds between SIGTERM and SIGKILL at teardown
    # No progress (no call ended, no loss, no output line) for this long in a job that uses
    # RPC: dump stacks and calls, name the suspect, then stop the job or keep it. 0: off.
    hang_timeout: Float = Field(300.0, ge=0)
    on_hang: Literal["stop", "keep"] = "stop"
    # cpu: hide GPUs; inherit: leave CUDA_VISIBLE_DEVICES alone (what torchrun does);
    # auto: one local GPU per rank, round-robin; a list: one entry per local rank (GPU index or "cpu").
    devices: str | list[int | str] = "inherit"
    rpc: RpcSpec = Field(default_factory=RpcSpec)
    losses: LossesSpec = Field(default_factory=LossesSpec)
    master_port: Int | None = Field(None, ge=1, le=65535)  # one node: a free port when unset
    # Several nodes: one launcher per node. Node 0 hosts the rendezvous (torch's TCPStore) on
    # master_addr:master_port; the ranks' own rendezvous port is picked by node 0 and shared.
    nnodes: Int = Field(1, ge=1, le=65536)
    node_rank: Int = Field(0, ge=0)
    master_addr: str | None = None
    ifname: str | None = None  # network interface for TensorPipe/Gloo; default: the one routing to master_addr
    rdzv_timeout: Float = Field(300.0, gt=0)  # seconds to wait for every node to arrive
    # fork: one process imports `preload` once and forks the ranks (fast); spawn: a fresh
    # interpreter per rank, for scripts that must set things up before torch is imported.
    start_method: Literal["fork", "spawn"] = "fork"
    preload: list[str] = Field(default_factory=lambda: list(DEFAULT_PRELOAD))

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
    data, lines = _parse_yaml(read_config_text(path), display)
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
        raise _validation_error(exc, where, data) from None

    script = spec.script.expanduser()
    if not script.is_absolute():
        script = (path.parent / script).resolve()
    if not script.is_file():
        raise ConfigError(f"script not found: {script}", where=where(("script",)), key="script")
    return spec.model_copy(update={"script": script})


def read_config_text(path: Path) -> str:
    """The text of a config file: a regular file of at most ``MAX_CONFIG_BYTES``, UTF-8.

    ``stat`` first, so that a FIFO or a device is refused without opening it (opening a FIFO
    blocks until a writer comes); then open without blocking and check again on the open file,
    in case the path was swapped in between."""
    display = str(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {display}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {display}: {exc.strerror or exc}") from None
    _check_regular(info, display)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {display}: {exc.strerror or exc}") from None
    try:
        _check_regular(os.fstat(fd), display)
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {display}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > MAX_CONFIG_BYTES:
        raise _too_big(display)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"not UTF-8 text (byte {raw[exc.start]:#04x})", where=f"{display}:{line}") from None


def _check_regular(info: os.stat_result, display: str) -> None:
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        raise ConfigError(f"config path is a directory, not a file: {display}")
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        )
        raise ConfigError(f"config path is {kind}, not a regular file: {display}")
    if info.st_size > MAX_CONFIG_BYTES:
        raise _too_big(display, info.st_size)


def _too_big(display: str, size: int | None = None) -> ConfigError:
    got = f"{size:,} bytes" if size is not None else "more than that"
    return ConfigError(f"config file is too big ({got}): the limit is 1 MiB, and a config is a few kilobytes", where=display)


def _key(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _sanitize_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._") or "job"


def _parse_yaml(text: str, display: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Parse YAML into data plus a map of dotted key path → 1-based line of that key."""
    builder = _Builder(text, display, expand=True)
    root = builder.build()
    if root is None:
        raise ConfigError("config file is empty: expected a mapping with at least 'script'", where=display)
    if not isinstance(root, dict):
        kind = "a list" if isinstance(root, list) else "a single value"
        raise ConfigError(f"config must be a mapping of keys to values, got {kind}", where=f"{display}:{builder.root_line}")
    return root, builder.lines


# libyaml when PyYAML has it: the pure-Python parser takes seconds for a 1 MiB file.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_TAG + t for t in ("null", "bool", "int", "float", "str", "timestamp"))
_COLLECTION_TAGS = frozenset({_TAG + "map", _TAG + "seq"})
_MERGE = _TAG + "merge"
_NO_KEY = object()


class _Frame:
    """A mapping or sequence being built: what it holds so far, and where it is."""

    __slots__ = ("value", "path", "anchor", "values_before", "key", "merges", "merge_line")

    def __init__(self, value: dict | list, path: tuple[str, ...], anchor: str | None, values_before: int):
        self.value, self.path, self.anchor, self.values_before = value, path, anchor, values_before
        self.key: Any = _NO_KEY
        self.merges: list[dict] = []
        self.merge_line = 0


class _Builder:
    """YAML events → plain data, in one pass with an explicit stack (no recursion).

    Bounded whatever the input: nesting (``MAX_DEPTH``), values counting what each alias
    stands for (``MAX_VALUES``), and characters produced by ``${VAR}`` expansion. An alias
    shares the object its anchor built, so a string is expanded once however often it is used;
    an alias to a node that is still open (a recursive alias) is refused."""

    def __init__(self, text: str, display: str, *, expand: bool, where: str | None = None):
        self.text, self.display, self.expand = text, display, expand
        self.fixed_where = where  # --set values: every error is located at the flag
        self.lines: dict[str, int] = {}
        self.root_line = 1
        self.values = 0
        self.expanded_chars = 0
        self.anchors: dict[str, tuple[Any, int]] = {}  # anchor → (value, values it stands for)
        self.open_anchors: set[str] = set()

    # -- errors

    def _where(self, mark: Any, column: bool = False) -> str:
        if self.fixed_where is not None:
            return self.fixed_where
        if mark is None:
            return self.display
        return f"{self.display}:{mark.line + 1}" + (f":{mark.column + 1}" if column else "")

    def _error(self, message: str, mark: Any, path: tuple[str, ...] = (), column: bool = False) -> ConfigError:
        return ConfigError(message, where=self._where(mark, column), key=_key(path) or None)

    # -- the event loop

    def build(self) -> Any:
        loader = _Loader(self.text)
        try:
            return self._build(loader)
        except yaml.YAMLError as exc:
            where, problem = _yaml_problem(exc, self.display)
            raise ConfigError(f"YAML syntax error: {problem}", where=self.fixed_where or where) from None
        finally:
            loader.dispose()

    def _build(self, loader: Any) -> Any:
        stack: list[_Frame] = []
        root: Any = None
        documents = 0
        while True:
            event = loader.get_event()
            if isinstance(event, yaml.StreamEndEvent):
                return root
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise self._error("expected one YAML document, found a second one ('---')", event.start_mark)
                continue
            if isinstance(event, (yaml.StreamStartEvent, yaml.DocumentEndEvent)):
                continue
            parent = stack[-1] if stack else None
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                frame = stack.pop()
                value = frame.value
                if frame.merges:  # `<<: *base`: the mapping's own keys win, then earlier merges
                    for merged in frame.merges:
                        for k, v in merged.items():
                            if k not in value:
                                value[k] = v
                                self.lines.setdefault(_key(frame.path + (str(k),)), frame.merge_line)
                size = self.values - frame.values_before
                if frame.anchor is not None:
                    self.open_anchors.discard(frame.anchor)
                    self.anchors[frame.anchor] = (value, size)
                root = self._attach(stack, value, event.start_mark, root)
                continue
            if parent is not None and isinstance(parent.value, dict) and parent.key is _NO_KEY:
                self._take_key(parent, event, loader)
                continue
            path, mark = self._child_path(parent, event), event.start_mark
            if parent is None:
                self.root_line = mark.line + 1
            if isinstance(event, yaml.AliasEvent):
                value = self._alias(event, path)
            elif isinstance(event, yaml.ScalarEvent):
                self._count(1, mark, path)
                value = self._scalar(event, path, loader)
            else:  # a mapping or a sequence starts
                if len(stack) >= MAX_DEPTH:
                    raise self._error(f"nested more than {MAX_DEPTH} levels deep: a config is a few levels of keys", mark, path)
                tag = self._collection_tag(event, loader, path)
                self._count(1, mark, path)
                frame = _Frame({} if tag == _TAG + "map" else [], path, event.anchor, self.values)
                if event.anchor is not None:
                    self.open_anchors.add(event.anchor)
                stack.append(frame)
                continue
            if isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
                self.anchors[event.anchor] = (value, 1)
            root = self._attach(stack, value, mark, root)

    def _child_path(self, parent: _Frame | None, event: Any) -> tuple[str, ...]:
        if parent is None:
            return ()
        if isinstance(parent.value, list):
            path = parent.path + (str(len(parent.value)),)
            self.lines[_key(path)] = event.start_mark.line + 1
            return path
        if parent.key is _MERGE:
            return parent.path
        return parent.path + (str(parent.key),)

    def _attach(self, stack: list[_Frame], value: Any, mark: Any, root: Any) -> Any:
        if not stack:
            return value
        parent = stack[-1]
        if isinstance(parent.value, list):
            parent.value.append(value)
        elif parent.key is _MERGE:
            sources = value if isinstance(value, list) else [value]
            if not all(isinstance(source, dict) for source in sources):
                raise self._error("'<<' merges a mapping or a list of mappings", mark, parent.path)
            parent.merges.extend(sources)
            parent.key = _NO_KEY
        else:
            parent.value[parent.key] = value
            parent.key = _NO_KEY
        return root

    def _take_key(self, parent: _Frame, event: Any, loader: Any) -> None:
        mark = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            key = self._alias(event, parent.path)
        elif isinstance(event, yaml.ScalarEvent):  # a scalar key is not counted: its value is
            if event.tag in (None, "!") and event.implicit[0] and loader.resolve(yaml.ScalarNode, event.value, event.implicit) == _MERGE:
                parent.key, parent.merge_line = _MERGE, mark.line + 1
                return
            key = self._scalar(event, parent.path, loader, expand=False)
            if event.anchor is not None:
                self.anchors[event.anchor] = (key, 1)
        else:
            key = None
        if isinstance(key, (dict, list)) or key is None and not isinstance(event, yaml.ScalarEvent):
            raise ConfigError("found unhashable key: a key must be a plain value", where=self._where(mark, column=True))
        path = parent.path + (str(key),)
        if key in parent.value:
            raise self._error(f"duplicate key '{key}'", mark, path)
        self.lines[_key(path)] = mark.line + 1
        parent.key = key

    # -- nodes

    def _count(self, n: int, mark: Any, path: tuple[str, ...]) -> None:
        self.values += n
        if self.values > MAX_VALUES:
            raise self._error(
                f"more than {MAX_VALUES:,} values (aliases count as the values they stand for): a config is a few dozen keys",
                mark,
                path,
            )

    def _alias(self, event: Any, path: tuple[str, ...]) -> Any:
        name = event.anchor
        if name in self.open_anchors:
            raise self._error(f"recursive alias *{name}: the anchor &{name} contains itself", event.start_mark, path)
        if name not in self.anchors:
            raise self._error(f"alias *{name} has no anchor &{name} before it", event.start_mark, path)
        value, size = self.anchors[name]
        self._count(size, event.start_mark, path)
        return value

    def _collection_tag(self, event: Any, loader: Any, path: tuple[str, ...]) -> str:
        kind = yaml.MappingNode if isinstance(event, yaml.MappingStartEvent) else yaml.SequenceNode
        tag = event.tag if event.tag not in (None, "!") else loader.resolve(kind, None, event.implicit)
        expected = _TAG + ("map" if kind is yaml.MappingNode else "seq")
        if tag != expected:
            raise self._error(f"unsupported YAML tag {tag!r} here: a config holds plain mappings, lists and values", event.start_mark, path)
        return tag

    def _scalar(self, event: Any, path: tuple[str, ...], loader: Any, *, expand: bool = True) -> Any:
        text, mark = event.value, event.start_mark
        tag = event.tag if event.tag not in (None, "!") else loader.resolve(yaml.ScalarNode, text, event.implicit)
        if tag not in _SCALAR_TAGS:
            raise self._error(f"unsupported YAML tag {tag!r}: a config holds plain values (strings, numbers, true/false, null)", mark, path)
        if tag in (_TAG + "int", _TAG + "float") or event.implicit[0] and tag == _TAG + "str":
            _refuse_ambiguous_number(text, lambda message: self._error(message, mark, path), tag == _TAG + "str")
        node = yaml.ScalarNode(tag, text, mark, event.end_mark, event.style)
        try:
            value = loader.yaml_constructors[tag](loader, node)
        except (ValueError, TypeError, yaml.YAMLError):
            raise self._error(f"{text!r} is not a valid {tag.removeprefix(_TAG)}", mark, path) from None
        if expand and self.expand and isinstance(value, str) and "$" in value:
            value = self._expand(value, mark, path)
        return value

    def _expand(self, text: str, mark: Any, path: tuple[str, ...]) -> str:
        try:
            value = expand_vars(text, os.environ)
        except _VarError as exc:
            raise self._error(str(exc), mark, path) from None
        self.expanded_chars += len(value)
        if self.expanded_chars > MAX_EXPANDED_CHARS:
            raise self._error(f"${{VAR}} expansion produced more than {MAX_EXPANDED_CHARS:,} characters", mark, path)
        return Expanded(value) if value != text else value


_OCTAL_LOOKING = re.compile(r"[-+]?0[0-9_]+")


def _refuse_ambiguous_number(text: str, error, plain_text: bool = False) -> None:
    """YAML 1.1 (PyYAML) reads ``010`` as octal 8, ``09`` as text and ``1:30`` as base-60 90;
    YAML 1.2 and most readers do not. Refuse all three (unquoted) rather than guess."""
    if _OCTAL_LOOKING.fullmatch(text):
        digits = text.lstrip("+-").replace("_", "")
        value = int(digits, 8) if set(digits) <= set("01234567") else None
        read = f"YAML 1.1 reads it as octal {value}" if value is not None else "a number cannot start with 0"
        raise error(f"ambiguous number {text}: {read}; write {int(digits, 10)} for decimal, or quote it ('{text}') for text")
    if ":" in text and not plain_text:
        raise error(f"ambiguous number {text}: YAML 1.1 reads it in base 60; quote it ('{text}') for text")


class _VarError(ValueError):
    pass


_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR_SPECIAL = re.compile(r"[$}]")


def expand_vars(text: str, environ: Any) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}`` (the default may itself hold ``${...}``);
    ``$$`` is a literal ``$``, and a ``$`` not followed by ``{`` or ``$`` stays as it is.
    A default is only expanded when it is used. Raises ``_VarError`` on a malformed reference
    or an unset variable without a default."""
    value, _ = _expand_part(text, 0, environ, depth=0, used=True)
    return value


def _expand_part(text: str, i: int, environ: Any, *, depth: int, used: bool) -> tuple[str, int]:
    """Expand from ``i`` to the end, or (inside a default, ``depth`` > 0) to its closing ``}``."""
    out: list[str] = []
    while True:
        match = _VAR_SPECIAL.search(text, i)
        if match is None:
            if depth:
                raise _VarError("unterminated ${...}: a '}' is missing")
            out.append(text[i:])
            return "".join(out), len(text)
        j = match.start()
        out.append(text[i:j])
        if text[j] == "}":
            if depth:
                return "".join(out), j + 1
            out.append("}")
            i = j + 1
        elif text.startswith("$$", j):
            out.append("$")
            i = j + 2
        elif text.startswith("${", j):
            name = _VAR_NAME.match(text, j + 2)
            if name is None:
                raise _VarError(f"bad reference {text[j:j + 12]!r}...: expected ${{NAME}} or ${{NAME:-default}} (write $$ for a literal $)")
            k = name.end()
            if k == len(text):
                raise _VarError(f"unterminated ${{{name.group()}: a '}}' is missing")
            if text.startswith("}", k):
                default, i = None, k + 1
            elif text.startswith(":-", k):
                if depth >= MAX_VAR_NESTING:
                    raise _VarError(f"${{...:-default}} nested more than {MAX_VAR_NESTING} deep")
                is_set = name.group() in environ
                default, i = _expand_part(text, k + 2, environ, depth=depth + 1, used=used and not is_set)
            else:
                raise _VarError(f"bad reference '${{{name.group()}{text[k:k + 1]}': only ${{NAME}} and ${{NAME:-default}} are supported")
            if not used:
                continue
            if name.group() in environ:
                out.append(environ[name.group()])
            elif default is not None:
                out.append(default)
            else:
                raise _VarError(f"environment variable {name.group()} is not set (use ${{{name.group()}:-default}} for a default)")
        else:  # a lone '$'
            out.append("$")
            i = j + 1


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


def _parse_override(override: str) -> tuple[tuple[str, ...], Any]:
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError("expected KEY=VALUE, e.g. --set rpc.init=true", where=f"--set {override}")
    parts = tuple(key.split("."))
    if any(not p for p in parts):
        raise ConfigError(f"bad key path '{key}'", where=f"--set {override}")
    if not raw.strip():
        return parts, ""
    # The same bounded reader as the file (no ${VAR} expansion: the shell already did that).
    try:
        value = _Builder(raw, "", expand=False, where=f"--set {override}").build()
    except ConfigError as exc:
        message = exc.message.removeprefix("YAML syntax error: ")
        raise ConfigError(f"cannot parse value {raw!r} as YAML: {message}", where=f"--set {override}", key=key) from None
    return parts, value


def _apply_override(data: dict[str, Any], key: tuple[str, ...], value: Any, override: str) -> None:
    node = data
    for i, part in enumerate(key[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"'{_key(key[: i + 1])}' is not a mapping, so it has no key '{key[i + 1]}'", where=f"--set {override}", key=_key(key))
        child = node[part] = dict(child)  # a copy: an alias may share this mapping with another key
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


def _data_path(loc: tuple[Any, ...], data: Any) -> tuple[str, ...]:
    """The part of pydantic's error location that names keys and indices of the input: what is
    left are the names of union branches ('str', 'int', 'list[...]'), which are dropped. Keys
    are followed in the data itself, so a key named like a branch ('rpc.int') is kept."""
    path: list[str] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and not (part in _UNION_TAGS or "[" in part or part.startswith(("literal", "function"))):
            node = None  # a key that is not in the input: a missing or an unknown one
        else:
            continue
        path.append(str(part))
    return tuple(path)


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none"})


def _validation_error(exc: ValidationError, where, data: Any) -> ConfigError:
    messages = []
    seen: set[tuple[str, ...]] = set()
    for error in exc.errors():
        loc = _data_path(tuple(error["loc"]), data)
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
            hint = f" (did you mean '{_key(parent + (close[0],))}'?)" if close else (f" (known keys: {', '.join(known)})" if known else "")
            message = f"unknown key '{key}'{hint}"
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


def locate(
    path: str | os.PathLike[str], key: str, *, overrides: list[str] = (), flags: dict[str, tuple[Any, str]] | None = None
) -> str:
    """Where a key's value came from: the flag or ``--set`` that set it (they beat the file), else
    ``FILE:LINE`` of the key (or of its nearest parent present in the file)."""
    for flag_key, (_, origin) in (flags or {}).items():
        if key == flag_key or key.startswith(flag_key + "."):
            return origin
    for override in reversed(overrides):
        set_key = override.partition("=")[0].strip()
        if key == set_key or key.startswith(set_key + ".") or set_key.startswith(key + "."):
            return f"--set {override}"
    display = str(path)
    try:
        _, lines = _parse_yaml(read_config_text(Path(path)), display)
    except ConfigError:
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
