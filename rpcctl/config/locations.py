"""Where a value came from, for every error: the flag, the ``--set`` or ``FILE:LINE`` and the key.

Flags beat ``--set``, which beats the file. ``origin_of`` answers for one key path while loading;
``validation_error`` turns pydantic's errors into one ``ConfigError`` (the first by line, the
others as "also" lines, unknown keys with a "did you mean"); ``locate`` answers for a key of a
spec already loaded (for the checks ``preflight`` makes after loading).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from rpcctl.config.bounded_yaml import dotted, parse_yaml, read_config_text
from rpcctl.config.schema import EntryError, JobSpec
from rpcctl.base.errors import ConfigError


def origin_of(loc: tuple[str, ...], *, origins: dict[tuple[str, ...], str], lines: dict[str, int], display: str) -> str:
    """Where the value at ``loc`` came from: the flag or ``--set`` that set it or a key above it
    (``origins``), else ``FILE:LINE`` of the key or of its nearest parent in the file."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in origins:
            return origins[loc[:n]]
    for key, where in origins.items():  # an override below this key replaced its value
        if key[: len(loc)] == loc:
            return where
    for n in range(len(loc), -1, -1):
        if dotted(loc[:n]) in lines:
            return f"{display}:{lines[dotted(loc[:n])]}"
    return display


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
        elif (
            isinstance(node, dict)
            and isinstance(part, str)
            and not (part in _UNION_TAGS or "[" in part or part.startswith(("literal", "function")))
        ):
            node = None  # a key that is not in the input: a missing or an unknown one
        else:
            continue
        path.append(str(part))
    return tuple(path)


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none"})


def validation_error(exc: ValidationError, where: Callable[[tuple[str, ...]], str], data: Any) -> ConfigError:
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
        key = dotted(loc)
        kind = error["type"]
        if kind == "extra_forbidden":
            parent, name = loc[:-1], loc[-1]
            known = _known_keys(parent)
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = (
                f" (did you mean '{dotted(parent + (close[0],))}'?)"
                if close
                else (f" (known keys: {', '.join(known)})" if known else "")
            )
            message = f"unknown key '{key}'{hint}"
        elif kind == "missing":
            message = f"missing required key '{key}'"
        else:
            message = error["msg"].removeprefix("Value error, ")
            if (
                "input" in error
                and kind not in ("model_type", "dict_type")
                and not isinstance(error["input"], dict)
                and "got" not in message
                and not isinstance(original, EntryError)
            ):
                message += f" (got {error['input']!r})"
        messages.append((where(loc), key, message))
    messages.sort(key=lambda m: int(m[0].rsplit(":", 1)[1]) if m[0].rsplit(":", 1)[-1].isdigit() else 0)
    where_first, key_first, first = messages[0]
    text = first
    if len(messages) > 1:
        text += "".join(f"\n  also {w}: key '{k}': {m}" for w, k, m in messages[1:])
    return ConfigError(text, where=where_first, key=key_first or None)


def locate(
    path: str | os.PathLike[str],
    key: str,
    *,
    overrides: list[str] = (),
    flags: dict[str, tuple[Any, str]] | None = None,
    lines: dict[str, int] | None = None,
) -> str:
    """Where a key's value came from: the flag or ``--set`` that set it (they beat the file), else
    ``FILE:LINE`` of the key (or of its nearest parent present in the file). ``lines``: the
    file's key lines, read already (``ConfigFile``); else the file is read here."""
    for flag_key, (_, origin) in (flags or {}).items():
        if key == flag_key or key.startswith(flag_key + "."):
            return origin
    for override in reversed(overrides):
        set_key = override.partition("=")[0].strip()
        if key == set_key or key.startswith(set_key + ".") or set_key.startswith(key + "."):
            return f"--set {override}"
    display = str(path)
    try:
        lines = parse_yaml(read_config_text(Path(path)), display)[1] if lines is None else lines
    except ConfigError:
        return display
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        line = lines.get(".".join(parts[:n]))
        if line:
            return f"{display}:{line}"
    return display
