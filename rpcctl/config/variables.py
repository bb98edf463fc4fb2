"""``${VAR}`` expansion of a config file's strings.

``${VAR}`` and ``${VAR:-default}`` (a default may hold another reference, nested at most
``MAX_VAR_NESTING`` deep; it is expanded only when it is used), ``$$`` for a literal ``$``. Only
the file's values are expanded, never ``--set`` values (the shell already did that). A string
that expansion changed is an ``Expanded``: the schema reads it as its field's type, since the
environment only has strings. The YAML reader (``bounded_yaml``) calls ``expand_vars`` once per
string and bounds what all expansions may produce.
"""

from __future__ import annotations

import re
from typing import Any

MAX_VAR_NESTING = 8  # ${A:-${B:-${C}}}: defaults nested this deep


class Expanded(str):
    """A string that ``${VAR}`` expansion produced: it may stand for a number or a boolean."""


class VarError(ValueError):
    """A malformed ``${...}`` reference, or an unset variable without a default."""


_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR_SPECIAL = re.compile(r"[$}]")


def expand_vars(text: str, environ: Any) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}`` (the default may itself hold ``${...}``);
    ``$$`` is a literal ``$``, and a ``$`` not followed by ``{`` or ``$`` stays as it is.
    A default is only expanded when it is used. Raises ``VarError`` on a malformed reference
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
                raise VarError("unterminated ${...}: a '}' is missing")
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
                raise VarError(
                    f"bad reference {text[j : j + 12]!r}...: expected ${{NAME}} or ${{NAME:-default}} "
                    "(write $$ for a literal $)"
                )
            k = name.end()
            if k == len(text):
                raise VarError(f"unterminated ${{{name.group()}: a '}}' is missing")
            if text.startswith("}", k):
                default, i = None, k + 1
            elif text.startswith(":-", k):
                if depth >= MAX_VAR_NESTING:
                    raise VarError(f"${{...:-default}} nested more than {MAX_VAR_NESTING} deep")
                is_set = name.group() in environ
                default, i = _expand_part(text, k + 2, environ, depth=depth + 1, used=used and not is_set)
            else:
                raise VarError(
                    f"bad reference '${{{name.group()}{text[k : k + 1]}': "
                    "only ${NAME} and ${NAME:-default} are supported"
                )
            if not used:
                continue
            if name.group() in environ:
                out.append(environ[name.group()])
            elif default is not None:
                out.append(default)
            else:
                raise VarError(
                    f"environment variable {name.group()} is not set (use ${{{name.group()}:-default}} for a default)"
                )
        else:  # a lone '$'
            out.append("$")
            i = j + 1
