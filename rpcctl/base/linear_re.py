"""Regexes that run in time linear in their text, for everything a rank prints (issue 28).

Python's ``re`` backtracks: a loss rule with adjacent optional whitespace classes took 26 s on one
line of 'loss' and 2,000 spaces, holding the GIL, so the console, supervision, the job's
``timeout``, ``rpcctl stop`` and Ctrl-C all waited. RE2 (google-re2) matches in linear time and lets
go of the GIL while it matches. It has no lookaround: a ``Rule`` names the characters that must not
come just before (``not_after``) or just after (``not_before``) it, matches that one character of
context, and keeps it out of the ``Hit``. ``finditer`` then finds what Python's ``finditer`` with
the lookarounds finds (same leftmost-first, greedy semantics; tests/test_losses.py holds the corpus).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import re2

__all__ = ["MAX_SEARCHES", "Hit", "Rule", "compile_linear", "re2"]

MAX_SEARCHES = 32  # of one rule in one line: the 33rd metric of a line is not read


def _quiet() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 logs a bad pattern raw to stderr: a config's text, escape codes and all
    return options


def compile_linear(pattern: str) -> Any:
    """``pattern`` compiled by RE2, or ``ValueError`` saying why it cannot be."""
    try:
        return re2.compile(pattern, _quiet())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else b""
        detail = (
            reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        ) or "RE2 cannot compile it"
        raise ValueError(
            f"not a valid regex for RE2 ({detail}): rpcctl matches every printed line in linear time "
            "with RE2, which has no lookarounds or backreferences"
        ) from exc


class _Encoded:
    """A line as RE2 reads it (UTF-8, encoded once per search), and its byte offsets as characters."""

    def __init__(self, line: str):
        self.line = line
        self.data = line.encode("utf-8", "replace")  # a lone surrogate (JSON can carry one) is one '?'
        self._chars: dict[int, int] | None = None if len(self.data) != len(line) else {}

    def char(self, offset: int) -> int:
        if self._chars == {}:  # ASCII: bytes are characters
            return offset
        if self._chars is None:
            self._chars, at = {}, 0
            for index, ch in enumerate(self.line):
                self._chars[at] = index
                at += len(ch.encode("utf-8", "replace"))
            self._chars[at] = len(self.line)
        return self._chars[offset]

    def byte(self, char: int) -> int:
        if self._chars == {}:
            return char
        return len(self.line[:char].encode("utf-8", "replace"))


@functools.lru_cache(maxsize=4)
def _encoded(line: str) -> _Encoded:
    """A line's encoding, shared by the rules that read it (the loss parser runs up to six)."""
    return _Encoded(line)


@dataclass(frozen=True)
class Hit:
    """A rule's match without the characters it only looked at: ``hit[0]``, ``start()`` and ``end()``
    are the rule's own text and its character offsets in the line."""

    match: Any  # re2's match object, on the line's bytes
    offset: int  # the group index of the rule's own text
    text: _Encoded

    def __getitem__(self, group: int | str) -> str | None:
        found = self.match.group(self.offset if group == 0 else group)
        return None if found is None else found.decode("utf-8", "replace")

    def start(self, group: int | str = 0) -> int:
        return self.text.char(self.match.start(self.offset if group == 0 else self._index(group)))

    def end(self, group: int | str = 0) -> int:
        return self.text.char(self.match.end(self.offset if group == 0 else self._index(group)))

    def _index(self, group: int | str) -> int:
        return self.match.re.groupindex[group] if isinstance(group, str) else group

    def _end_byte(self) -> int:
        return self.match.end(self.offset)


class Rule:
    """A case-insensitive RE2 pattern with one character of context on either side."""

    def __init__(self, body: str, *, not_after: str = "", not_before: str = "", anchored: bool = False):
        tail = f"(?:$|[^{not_before}])" if not_before else ""
        if not_after:
            # At the line's start nothing comes before; further on, the character before is matched.
            self._at_start = re2.compile(f"(?i)(?:^|[^{not_after}])(?P<rule>{body}){tail}")
            self._further = re2.compile(f"(?i)[^{not_after}](?P<rule>{body}){tail}")
        else:
            self._at_start = self._further = re2.compile(f"(?i){'^' if anchored else ''}(?P<rule>{body}){tail}")
        self._offset = self._at_start.groupindex["rule"]
        self._looks_back = bool(not_after)

    def search(self, line: str, pos: int = 0, keep: Callable[[Hit], bool] | None = None) -> Hit | None:
        return next(self.finditer(line, pos, keep), None)

    def match(self, line: str) -> Hit | None:
        hit = self.search(line)
        return hit if hit is not None and hit.start() == 0 else None

    def finditer(self, line: str, pos: int = 0, keep: Callable[[Hit], bool] | None = None) -> Iterator[Hit]:
        """Hits starting at character ``pos`` or later, left to right, not overlapping, as Python's
        ``finditer`` finds them. A hit ``keep`` refuses is skipped and the search goes on from its
        second character. At most ``MAX_SEARCHES`` searches: each one reads the rest of the line
        (RE2's unanchored search runs to the end to settle a leftmost-first match), so a walk costs
        at most that many times the line's length."""
        text = _encoded(line)
        floor = text.byte(pos)  # the byte where the next hit may start
        for _ in range(MAX_SEARCHES):
            if floor > len(text.data):
                return
            if floor == 0:
                found = self._at_start.search(text.data, 0)
            else:  # the character before floor is context (a lookbehind's)
                found = self._further.search(text.data, _previous(text.data, floor) if self._looks_back else floor)
            if found is None:
                return
            hit = Hit(found, self._offset, text)
            if keep is None or keep(hit):
                yield hit
                floor = max(hit._end_byte(), floor + 1)
            else:
                floor = _next(text.data, found.start(self._offset))


def _previous(data: bytes, offset: int) -> int:
    """The byte where the character before ``offset`` starts."""
    offset -= 1
    while offset > 0 and 0x80 <= data[offset] < 0xC0:  # a UTF-8 continuation byte
        offset -= 1
    return offset


def _next(data: bytes, offset: int) -> int:
    """The byte where the character after the one at ``offset`` starts."""
    offset += 1
    while offset < len(data) and 0x80 <= data[offset] < 0xC0:
        offset += 1
    return offset
