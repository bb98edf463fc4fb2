"""``--set KEY=VALUE`` overrides: a dotted key path and a YAML value, applied to the file's data.

A value is read by the same bounded YAML reader as the file, without ``${VAR}`` expansion (the
shell already expanded it); every error is located at the flag (``--set KEY=VALUE``).
"""

from __future__ import annotations

from typing import Any

from rpcctl.config.bounded_yaml import Builder, dotted
from rpcctl.base.errors import ConfigError


def parse_override(override: str) -> tuple[tuple[str, ...], Any]:
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
        value = Builder(raw, "", expand=False, where=f"--set {override}").build()
    except ConfigError as exc:
        message = exc.message.removeprefix("YAML syntax error: ")
        raise ConfigError(
            f"cannot parse value {raw!r} as YAML: {message}", where=f"--set {override}", key=key
        ) from None
    return parts, value


def apply_override(data: dict[str, Any], key: tuple[str, ...], value: Any, override: str) -> None:
    node = data
    for i, part in enumerate(key[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"'{dotted(key[: i + 1])}' is not a mapping, so it has no key '{key[i + 1]}'",
                where=f"--set {override}",
                key=dotted(key),
            )
        child = node[part] = dict(child)  # a copy: an alias may share this mapping with another key
        node = child
    node[key[-1]] = value
