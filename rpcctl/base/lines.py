"""A rank's output as a terminal shows it: ``\\r`` returns to the start of the line, ``\\n`` ends it.

Progress bars (tqdm, Keras, Lightning) redraw one line with ``\\r`` hundreds of times before its
``\\n``. ``LineSplitter`` turns the byte stream into ``Piece`` records::

    b"\\rstep 1 loss=0.9\\rstep 2 loss=0.8\\n"
      -> Piece("step 1 loss=0.9", new=True,  final=False)   an update, overwritten later
         Piece("step 2 loss=0.8", new=True,  final=True)    the state the \\n leaves on screen

    b"epoch 1 loss=0.7\\r\\n"
      -> Piece("epoch 1 loss=0.7", new=True, final=False)   an update (nothing followed yet)
         Piece("epoch 1 loss=0.7", new=False, final=True)   the line it leaves, already parsed

Every state the terminal would have drawn is delivered once as ``new`` (the loss parser reads
those), when the next ``\\r`` or ``\\n`` shows it is whole (``preview()`` gives the state being
drawn, for display), and every finished line once as ``final`` (the console echo, the log tail and
``rpcctl logs`` print those). A line that never saw ``\\r`` is one piece, new and final.
Terminal control sequences (colours, cursor moves, ``\\b``) are removed from the text: they
are the rank's drawing, not its words, and never reach rpcctl's terminal.

Cost is linear in the bytes fed: a chunk is scanned once for ``\\r``/``\\n``, and one line keeps
at most ``max_bytes`` (the rest is counted, not stored), so a 50 MB line with no newline costs
one pass and a bounded buffer. The log file is written before splitting and keeps every byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LINE_BYTES = 8192  # of one line kept for the console and the parsers; the log file keeps all
_BREAK = re.compile(rb"[\r\n]")
# Terminal control sequences (colours, cursor moves: Keras draws its bar with them, and \b) and
# other C0 controls but the tab: a rank's text is data, never instructions to the terminal.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    new: bool  # not delivered before: parse it
    final: bool  # the line as the terminal leaves it (ended by \n or by the end of the stream)


class LineSplitter:
    def __init__(self, max_bytes: int = MAX_LINE_BYTES):
        self.max_bytes = max_bytes
        self._segment = bytearray()  # the state being written since the last \r or \n
        self._cut = 0  # bytes of the current segment beyond max_bytes, not kept
        self._shown: str | None = None  # last update delivered on this line (for a trailing \r)

    def feed(self, chunk: bytes) -> list[Piece]:
        pieces: list[Piece] = []
        start = 0
        for match in _BREAK.finditer(chunk):
            self._take(chunk, start, match.start())
            start = match.end()
            if chunk[match.start()] == 0x0D:  # \r: the terminal goes back to column 0
                text = self._text()
                if text.strip():  # a bar cleared with spaces (tqdm.write) shows nothing new
                    pieces.append(Piece(text, new=True, final=False))
                    self._shown = text
            else:
                pieces.append(self._end_line())
        self._take(chunk, start, len(chunk))
        return pieces

    def preview(self) -> Piece | None:
        """The state being drawn now (after the last \\r or \\n, possibly cut mid-write), for
        display only: it is delivered as ``new`` once the next \\r or \\n shows it is whole."""
        if not self._segment:
            return None
        text = _CONTROL.sub("", self._segment.decode(errors="replace"))
        return Piece(text, new=False, final=False) if text.strip() else None

    def close(self) -> list[Piece]:
        """The end of the stream finishes a last line that had no \\n (if it has any text)."""
        if self._segment or self._cut or self._shown is not None:
            return [self._end_line()]
        return []

    def _take(self, chunk: bytes, start: int, end: int) -> None:
        room = self.max_bytes - len(self._segment)
        if end - start <= room:
            self._segment += chunk[start:end]
        else:
            self._segment += chunk[start : start + max(room, 0)]
            self._cut += end - start - max(room, 0)

    def _text(self) -> str:
        text = _CONTROL.sub("", self._segment.decode(errors="replace"))
        if self._cut:
            text += f" … [{self._cut} more bytes in the log file]"
        self._segment.clear()
        self._cut = 0
        return text

    def _end_line(self) -> Piece:
        text = self._text()
        if text.strip() or self._shown is None:
            piece = Piece(text, new=True, final=True)
        else:  # "...\r\n": the line keeps the last update, already delivered
            piece = Piece(self._shown, new=False, final=True)
        self._shown = None
        return piece


def final_lines(data: bytes, max_bytes: int = MAX_LINE_BYTES) -> list[str]:
    """The finished lines of ``data`` as a terminal leaves them (for ``rpcctl logs``)."""
    splitter = LineSplitter(max_bytes)
    return [p.text for p in splitter.feed(data) + splitter.close() if p.final]


# A failure's text, as run.json keeps it and every view shows it (the terminal, the report, the
# live page), and as the rank's error file holds it: its head and its tail, and how much was cut.
# The whole stays in the rank's log.
MAX_MESSAGE_CHARS = 4_000
MAX_TRACEBACK_CHARS = 16_000
MAX_LOG_TAIL_LINE_CHARS = 1_000
_CUT_LINE_CHARS = 200  # the "[... N characters cut ...]" line, at most


def cap_text(text: str, limit: int, whole: str = "") -> str:
    """``text`` if it is at most ``limit`` characters; else its first and last ``limit / 2``
    around a line that says how many were cut (and ``whole``: where the rest is). Text capped
    once is not cut again (the rank caps its error file, the launcher what it reads)."""
    if not isinstance(text, str) or len(text) <= limit + _CUT_LINE_CHARS:
        return text
    keep = limit // 2
    return f"{text[:keep]}\n[... {len(text) - 2 * keep:,} characters cut{whole} ...]\n{text[-keep:]}"


def write_whole_lines() -> None:
    """Make this process write its stdout and stderr a whole line at a time.

    Ranks run with PYTHONUNBUFFERED=1, so nothing printed waits in a buffer; but unbuffered,
    ``print(x)`` is two writes, ``x`` and ``"\\n"``, and two processes sharing a rank's pipe (a
    program that mp.spawns, a Monarch mesh) interleave them: ``step 5 loss 0.1step 5 loss
    0.2\\n\\n``. Line buffering keeps unbuffered's promptness for every line ending in ``\\n``
    and for every ``flush()`` (tqdm and Keras flush their ``\\r`` redraws), and makes each line
    one write, which a pipe delivers whole up to 4 KiB. What a process killed by a signal can
    lose is the unfinished line it never flushed."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True, write_through=False)
