"""When each part of a rank's log arrived, for ``rpcctl logs --merge`` and ``--timestamps``.

``logs/rank-N.log`` keeps every byte a rank wrote and nothing else; beside it,
``logs/rank-N.times`` says when those bytes came, one text line per entry::

    OFFSET TIME        e.g. "10432 1796340000.125": the chunk starting at byte 10432 was read then

OFFSET is a byte offset in the log, TIME the UNIX time (ms) at which the launcher's pump read the
chunk that starts there, and entries only go forward. The pump writes an entry before the chunk's
bytes, and at most one per rank every ``RESOLUTION`` seconds: so a line's time is when the
launcher read it, to within 10 ms, and the index grows by at most ~2 KB per second of output
however fast a rank prints (a rank printing that fast writes far more log than that).

Readers stream both files (``RankLogReader``), so a merge of many long logs costs a bounded
amount of memory: one block and one line (``MAX_LINE_BYTES``) per rank. A missing, damaged or
truncated index costs only the times: a line with none takes the last time known for its rank.

A log followed (``rpcctl logs -f``) is followed by name, as ``tail -F`` does (``FollowedFile``):
renamed or replaced (logrotate's ``create``), the old file is read to its end, then the new
one from its start; truncated in place (``copytruncate``), it is read again from its start.
Either is said on stderr (``on_replaced``).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rpcctl.base.lines import LineSplitter
from rpcctl.base.private import private_open

RESOLUTION = 0.01  # seconds between two entries of one rank's index, at most
_BLOCK = 64 * 1024
_ENTRY_MAX = 64  # bytes of one index line; anything longer is damage, skipped
_LATEST = 1e11  # a UNIX time past any real run (year 5138): beyond it an entry is damage


def times_path(log_path: Path) -> Path:
    return log_path.with_suffix(".times")


class TimeIndexWriter:
    """The index of one rank's log, written by the pump beside ``RankLog``. A write that fails
    (a full disk) gives the index up quietly: the log, not its times, is what must not be lost."""

    def __init__(self, log_path: Path, opener: Callable[..., Any] = private_open):
        self._last = float("-inf")
        try:
            self._file: Any = opener(times_path(log_path), "ab", buffering=0)
        except OSError:
            self._file = None

    def note(self, offset: int, now: float) -> None:
        """The chunk starting at ``offset`` of the log arrived at ``now`` (call before writing it)."""
        if self._file is None or now - self._last < RESOLUTION:
            return
        self._last = now
        try:
            self._file.write(f"{offset} {now:.3f}\n".encode())
        except OSError:
            self.close()

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass


class _TimeIndexReader:
    """Reads an index forward: ``time_at(offset)`` for offsets that never decrease."""

    def __init__(self, path: Path):
        try:
            self._file: Any = open(path, "rb")
        except OSError:
            self._file = None
        self._partial = b""
        self._time: float | None = None  # of the last entry at or before the offsets asked
        self._next: tuple[int, float] | None = None  # the first entry after them, if read
        self._offset = -1

    def time_at(self, offset: int) -> float | None:
        while True:
            if self._next is None:
                self._next = self._read_entry()
                if self._next is None:
                    return self._time  # the index ends here (for now: a live log grows)
            if self._next[0] > offset:
                return self._time
            self._time, self._next = self._next[1], None

    def _read_entry(self) -> tuple[int, float] | None:
        while self._file is not None:
            line = self._file.readline(_ENTRY_MAX)
            if not line:
                return None
            if not line.endswith(b"\n"):
                if len(self._partial) + len(line) < _ENTRY_MAX:
                    self._partial += line  # being written: the rest comes later
                    return None
                self._partial = b""  # too long to be an entry: damage, skip to its end
                continue
            line, self._partial = self._partial + line, b""
            try:
                offset_text, time_text = line.split()
                offset, moment = int(offset_text), float(time_text)
            except ValueError:
                continue
            if offset > self._offset and 0.0 < moment < _LATEST:  # forward only; NaN, inf, year 5000: damage
                self._offset = offset
                return offset, moment
        return None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass(frozen=True, slots=True)
class LogLine:
    time: float | None  # when the launcher read the line's end (None: no index says)
    rank: int
    text: str  # as a terminal leaves it (lines.LineSplitter), control sequences removed


class FollowedFile:
    """A file read forward by its name, as ``tail -F`` reads it. The file stays open between
    calls, so one renamed away is still read to its end before the new one at the same path;
    ``on_replaced(what)`` is told when that happens, or when the file was truncated."""

    def __init__(self, path: Path, on_replaced: Callable[[str], None] | None = None):
        self.path = path
        self.on_replaced = on_replaced
        self.offset = 0  # in the file open now
        self._file: Any = None

    def blocks(self) -> Iterator[bytes]:
        """The bytes written since the last call, in blocks (``offset`` is past each one)."""
        while True:
            if self._file is None:
                try:
                    self._file = open(self.path, "rb")
                except FileNotFoundError:
                    return
                self.offset = 0
            while block := self._file.read(_BLOCK):
                self.offset += len(block)
                yield block
            change = self._changed()
            if change is None:
                return
            if self.on_replaced is not None:
                self.on_replaced(change)

    def _changed(self) -> str | None:
        """What happened to the path since it was opened (the open file read to its end), after
        getting ready to read what is there now; None when nothing did."""
        try:
            now = os.stat(self.path)
        except OSError:
            return None  # renamed, the new one not made yet: the old one may still grow
        mine = os.fstat(self._file.fileno())
        if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
            self.close()
            return "was replaced (renamed or rotated): following the new file"
        if now.st_size < self.offset:
            self._file.seek(0)
            self.offset = 0
            return "was truncated: reading it again from its start"
        return None

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()


class RankLogReader:
    """One rank's finished lines, read from where the last call stopped (``--follow`` calls
    ``new_lines`` again as the log grows; ``finish`` gives a last line that had no newline).
    A log renamed or truncated meanwhile is followed as ``FollowedFile`` says."""

    def __init__(
        self, rank: int, log_path: Path, since: float | None = None, on_replaced: Callable[[str], None] | None = None
    ):
        self.rank, self.path = rank, log_path
        self._log = FollowedFile(log_path, self._replaced)
        self._on_replaced = on_replaced
        self._splitter = LineSplitter()
        self._times = _TimeIndexReader(times_path(log_path))
        self._last = since  # the time given to a line no index entry covers

    def new_lines(self) -> Iterator[LogLine]:
        for block in self._log.blocks():
            base = self._log.offset - len(block)
            start = 0
            while (end := block.find(b"\n", start)) >= 0:
                moment = self._time_at(base + end)
                for piece in self._splitter.feed(block[start : end + 1]):
                    if piece.final:
                        yield LogLine(moment, self.rank, piece.text)
                start = end + 1
            self._splitter.feed(block[start:])  # a line still being written: kept, bounded

    def _replaced(self, what: str) -> None:
        self._splitter = LineSplitter()  # the old file's unfinished line is not the new file's start
        self._times.close()
        self._times = _TimeIndexReader(times_path(self.path))  # the index goes with its log
        if self._on_replaced is not None:
            self._on_replaced(what)

    def finish(self) -> Iterator[LogLine]:
        for piece in self._splitter.close():
            yield LogLine(self._last, self.rank, piece.text)
        self._times.close()
        self._log.close()

    def _time_at(self, offset: int) -> float | None:
        moment = self._times.time_at(offset)
        if moment is not None:
            self._last = moment
        return self._last


def merged(streams: Iterable[Iterator[LogLine]]) -> Iterator[LogLine]:
    """Lines of several ranks in the order they arrived; a tie goes to the lower rank. Each
    stream is already in time order (a rank's index only goes forward)."""
    return heapq.merge(*streams, key=lambda line: (line.time if line.time is not None else float("-inf"), line.rank))


def lines_of(reader: RankLogReader, final: bool) -> Iterator[LogLine]:
    yield from reader.new_lines()
    if final:
        yield from reader.finish()
