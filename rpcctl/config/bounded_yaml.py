"""Bounded YAML loading: a config file → plain data, and the line of every key.

Whatever the file holds, loading is bounded (a config is a few kilobytes): only a regular file
of at most ``MAX_CONFIG_BYTES`` is read (never a FIFO or a device, which would block), it is
parsed once, as a stream of events, into plain data, nested at most ``MAX_DEPTH`` deep and with
at most ``MAX_VALUES`` values counting every alias's expansion (a "billion laughs" file is
refused, not expanded), and each string is ``${VAR}``-expanded once (``variables``), however
many aliases share it, producing at most ``MAX_EXPANDED_CHARS`` in all. Only plain mappings,
lists and scalars are accepted; ``010`` (octal 8 in YAML 1.1) and ``1:30`` (base 60) are
refused as ambiguous. Every error is a ``ConfigError`` located at ``FILE:LINE`` and the key.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from rpcctl.config.variables import Expanded, VarError, expand_vars
from rpcctl.base.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: a config is kilobytes; anything bigger is a mistake or an attack
MAX_DEPTH = 32  # the spec itself nests four deep (rpc.device_maps.WORKER.DEVICE)
MAX_VALUES = 10_000  # values (not keys) in the document, each alias counted as the values it stands for
MAX_EXPANDED_CHARS = 4 << 20  # characters that ${VAR} expansion may produce, in all


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
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a character device"
            if stat.S_ISCHR(mode)
            else "a block device"
            if stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "not a regular file"
        )
        raise ConfigError(f"config path is {kind}, not a regular file: {display}")
    if info.st_size > MAX_CONFIG_BYTES:
        raise _too_big(display, info.st_size)


def _too_big(display: str, size: int | None = None) -> ConfigError:
    got = f"{size:,} bytes" if size is not None else "more than that"
    return ConfigError(
        f"config file is too big ({got}): the limit is 1 MiB, and a config is a few kilobytes", where=display
    )


def dotted(loc: tuple[Any, ...]) -> str:
    """A key path as the user writes it: ``rpc.device_maps.worker1``."""
    return ".".join(str(p) for p in loc)


def parse_yaml(text: str, display: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Parse YAML into data plus a map of dotted key path → 1-based line of that key."""
    builder = Builder(text, display, expand=True)
    root = builder.build()
    if root is None:
        raise ConfigError("config file is empty: expected a mapping with at least 'script'", where=display)
    if not isinstance(root, dict):
        kind = "a list" if isinstance(root, list) else "a single value"
        raise ConfigError(
            f"config must be a mapping of keys to values, got {kind}", where=f"{display}:{builder.root_line}"
        )
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


class Builder:
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
        return ConfigError(message, where=self._where(mark, column), key=dotted(path) or None)

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
                                self.lines.setdefault(dotted(frame.path + (str(k),)), frame.merge_line)
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
                    raise self._error(
                        f"nested more than {MAX_DEPTH} levels deep: a config is a few levels of keys", mark, path
                    )
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
            self.lines[dotted(path)] = event.start_mark.line + 1
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
            if (
                event.tag in (None, "!")
                and event.implicit[0]
                and loader.resolve(yaml.ScalarNode, event.value, event.implicit) == _MERGE
            ):
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
        self.lines[dotted(path)] = mark.line + 1
        parent.key = key

    # -- nodes

    def _count(self, n: int, mark: Any, path: tuple[str, ...]) -> None:
        self.values += n
        if self.values > MAX_VALUES:
            raise self._error(
                (
                    f"more than {MAX_VALUES:,} values (aliases count as the values they stand for): "
                    "a config is a few dozen keys"
                ),
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
            raise self._error(
                f"unsupported YAML tag {tag!r} here: a config holds plain mappings, lists and values",
                event.start_mark,
                path,
            )
        return tag

    def _scalar(self, event: Any, path: tuple[str, ...], loader: Any, *, expand: bool = True) -> Any:
        text, mark = event.value, event.start_mark
        tag = event.tag if event.tag not in (None, "!") else loader.resolve(yaml.ScalarNode, text, event.implicit)
        if tag not in _SCALAR_TAGS:
            raise self._error(
                f"unsupported YAML tag {tag!r}: a config holds plain values (strings, numbers, true/false, null)",
                mark,
                path,
            )
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
        except VarError as exc:
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
        raise error(
            f"ambiguous number {text}: {read}; write {int(digits, 10)} for decimal, or quote it ('{text}') for text"
        )
    if ":" in text and not plain_text:
        raise error(f"ambiguous number {text}: YAML 1.1 reads it in base 60; quote it ('{text}') for text")


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
