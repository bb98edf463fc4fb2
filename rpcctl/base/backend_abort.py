"""What a rank that died of SIGABRT said as it died: the C++ exception a communication backend
threw, and where the rank's main thread was (issue 38).

A backend that fails on a thread of its own cannot raise into Python: the exception reaches
``std::terminate`` and the process aborts. So gloo on mismatched collectives (sizes, dtypes),
c10d's NCCL watchdog on a timeout or an asynchronous error, a peer gone mid-collective: the rank
is killed by SIGABRT, and all it leaves is what libstdc++'s terminate handler and c10's logging
printed, then the fatal-error dump faulthandler adds (every thread's stack). Shapes read (torch
2.13's sources: gloo's transport, ``ProcessGroupNCCL.cpp``, ``c10/util/Logging``; a line too long
for this page goes on, indented further, on the next)::

    terminate called after throwing an instance of 'gloo::EnforceNotMet'
      what():  [enforce fail at .../pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4. Received data
          size doesn't match expected size. Is there a distributed collective mismatch in your code?
    terminate called after throwing an instance of 'gloo::IoException'
      what():  [.../pair.cc:534] Connection closed by peer [127.0.0.1]:45210
    terminate called after throwing an instance of 'c10::DistBackendError'
      what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with
          exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, ...) ran for
          600021 milliseconds before timing out.
      Exception raised from checkTimeout at .../ProcessGroupNCCL.cpp:760 (most recent call first):
    [rank0]:[F1207 10:00:00.000 ProcessGroupNCCL.cpp:1530] [PG ID 0 ...] ProcessGroupNCCL's watchdog got
        stuck for 480 seconds ...
    terminate called without an active exception

``read(lines)`` gives the last of these (``Abort``): the backend (gloo, NCCL, c10d, or the C++
type), its message in one line without torch's prefixes (``gloo: Received data size doesn't match
expected size (8 vs 4): a collective mismatch?``), the text whole (bounded) and the main thread's
innermost frame of the user's code in the dump (``mm.py:5 in <module> (`dist.all_reduce(t)`)``).
The lines are a rank's output: data, bounded here, escaped where they are shown. Matched with
RE2 (``linear_re``), as every parser of rank text is.

A leaf: the standard library, ``frames`` and ``linear_re`` only.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass
from pathlib import Path

from rpcctl.base.frames import hide_own_frames, is_user_file, short_path
from rpcctl.base.linear_re import compile_linear

MAX_LINES = 2_000  # of a rank's last output read for it
MAX_LINE_CHARS = 8_192
MAX_MESSAGE_CHARS = 500  # of the one-line message
MAX_DETAIL_CHARS = 8_000  # of what was thrown, whole
MAX_STACK_LINES = 64  # of the main thread's stack kept

_TERMINATE = compile_linear(r"^terminate called after throwing an instance of '([^']{1,200})'\s*$")
_TERMINATE_BARE = compile_linear(r"^terminate called (without an active exception|recursively)\s*$")
_WHAT = compile_linear(r"^\s*what\(\):\s*(.*)$")
_FATAL_LOG = compile_linear(r"^(?:\[rank\d+\]:)?\[F\d{4} [^\]]*\] (.*)$|^F\d{4} [\d:.]+\s+\d+ [^\]]*\] (.*)$")
# Where the thrown text stops: the C++ stack torch adds, the Python dump, another abort.
_END = compile_linear(
    r"^(?:Exception raised from |frame #\d|Fatal Python error|Thread 0x|Current thread 0x|terminate called)"
)
_PREFIX = compile_linear(
    r"^(?:\[(?:PG ID [^\]]*|PG \d[^\]]*|Rank \d+|[^\] ]*\.(?:cc|cpp|h|hpp|cu):\d+)\]\s*|"
    r"(?:Process group|NCCL) watchdog thread terminated with exception:\s*)"
)
_ENFORCE = compile_linear(r"^\[enforce fail at [^\]]*\]\s*(.*?)\. (\S+ vs \S+)\. (.*)$")
_ENFORCE_PLAIN = compile_linear(r"^\[enforce fail at [^\]]*\]\s*(.*)$")
_THREAD = compile_linear(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")
_FRAME = compile_linear(r'^\s+File "(.*)", line (\d+) in (.*)$')
_MISMATCH = "Is there a distributed collective mismatch in your code?"


@dataclass(frozen=True)
class Abort:
    backend: str  # gloo, NCCL, c10d, or the C++ exception's type
    message: str  # one line, the backend's own words
    detail: str  # what was printed of it, whole (bounded): the terminate line and what()
    error_type: str | None  # the C++ exception's type (None: a fatal log, a terminate with none)
    where: str | None  # the main thread's innermost frame of the user's code
    stack: str | None  # the main thread's stack in the dump, rpcctl's frames hidden

    def describe(self) -> str:
        return f"{self.backend}: {self.message}" + (f" at {self.where}" if self.where else "")

    def traceback(self) -> str:
        """What the launcher shows under the root cause: the thrown text, then the main thread."""
        return self.detail + (f"\n\nthe main thread, when it aborted:\n{self.stack}" if self.stack else "") + "\n"


def tail_lines(path: Path, max_bytes: int = 256 * 1024) -> list[str]:
    """The last lines of a rank's log, of its latest attempt (after the last restart header)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()[-MAX_LINES:]
    restart = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("--- rpcctl: restart ")), None)
    return lines[restart + 1 :] if restart is not None else lines


def read(lines: list[str]) -> Abort | None:
    """The last abort a backend printed in ``lines`` (a rank's output), or None."""
    lines = [line[:MAX_LINE_CHARS] for line in lines[-MAX_LINES:]]
    found = None
    for index in range(len(lines) - 1, -1, -1):
        found = _thrown(lines, index)
        if found is not None:
            break
    if found is None:
        return None
    backend, message, detail, error_type = found
    stack = _main_thread(lines)
    where = _where(stack) if stack else None
    shown = hide_own_frames("\n".join(stack[:MAX_STACK_LINES])) if stack else None
    return Abort(backend, _one_line(message), detail[:MAX_DETAIL_CHARS], error_type, where, shown)


def _thrown(lines: list[str], index: int) -> tuple[str, str, str, str | None] | None:
    """(backend, message, detail, type) if ``lines[index]`` begins an abort's text."""
    line = lines[index]
    terminate = _TERMINATE.search(line)
    if terminate is not None:
        error_type = terminate.group(1)
        what: list[str] = []
        body = lines[index + 1 : index + 1 + MAX_LINES]
        if body and _WHAT.search(body[0]):
            what.append(_WHAT.search(body[0]).group(1))
            for more in body[1:]:
                if not more.strip() or _END.search(more):
                    break
                what.append(more)
        text = "\n".join(what)
        first = what[0] if what else ""
        return (
            _backend(error_type, text),
            first,
            "\n".join([line, *(["  what():  " + text] if what else [])]),
            error_type,
        )
    bare = _TERMINATE_BARE.search(line)
    if bare is not None:
        return "C++", f"terminate called {bare.group(1)}", line, None
    fatal = _FATAL_LOG.search(line)
    if fatal is not None:
        text = fatal.group(1) or fatal.group(2) or ""
        return _backend("", text), text, line, None
    return None


def _backend(error_type: str, text: str) -> str:
    if error_type.startswith("gloo::") or text.startswith("[enforce fail at ") and "gloo" in text:
        return "gloo"
    if "NCCL" in text or "NCCL" in error_type:
        return "NCCL"
    if error_type.startswith("c10::Dist") or not error_type:
        return "c10d"
    return error_type


def _one_line(text: str) -> str:
    """The thrown message in one line: torch's prefixes (the process group, the rank, a source
    location) off, gloo's enforce as ``what (a vs b)``."""
    text = text.strip()
    for _ in range(8):
        prefix = _PREFIX.search(text)
        if prefix is None or prefix.end() == 0:
            break
        text = text[prefix.end() :]
    enforce = _ENFORCE.search(text)
    if enforce is not None:
        cause, sides, rest = enforce.group(1), enforce.group(2), enforce.group(3).strip()
        question = rest.endswith(_MISMATCH)
        rest = rest[: -len(_MISMATCH)].strip() if question else rest
        text = f"{rest.rstrip('.') or cause} ({sides})" + (": a collective mismatch?" if question else "")
    else:
        plain = _ENFORCE_PLAIN.search(text)
        if plain is not None:
            text = plain.group(1)
    text = " ".join(text.split()).removesuffix(".")
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def _main_thread(lines: list[str]) -> list[str] | None:
    """The main thread's block of the last fatal-error dump: the one that runs the script (rpcctl's
    bootstrap, or a ``<module>`` frame), not a thread ``threading`` started."""
    starts = [i for i, line in enumerate(lines) if _THREAD.search(line)]
    blocks = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        block = [start]
        for i in range(start + 1, end):
            if not _FRAME.search(lines[i]):
                break
            block.append(i)
        blocks.append([lines[i] for i in block])
    for block in reversed(blocks):
        files = [_FRAME.search(line) for line in block[1:]]
        if any(m.group(3) == "_run_script" and m.group(1).endswith("rpcctl/rank/runtime.py") for m in files):
            return block
    for block in reversed(blocks):
        frames = [_FRAME.search(line) for line in block[1:]]
        if any(m.group(3) == "<module>" for m in frames) and not any(m.group(3) == "_bootstrap" for m in frames):
            return block
    return None


def _where(block: list[str]) -> str | None:
    for line in block[1:]:
        frame = _FRAME.search(line)
        if frame is not None and is_user_file(frame.group(1)):
            file, number, func = frame.group(1), int(frame.group(2)), frame.group(3)
            source = linecache.getline(file, number).strip()[:200]
            site = f"{short_path(file)}:{number} in {func}"
            return f"{site} (`{source}`)" if source else site
    return None
