"""rpcctl's own frames, kept out of the tracebacks and stacks users read.

rpcctl runs inside every rank: its bootstrap (``runtime.py``) calls the script, and its call
tracking wraps ``rpc_sync``/``rpc_async``/``remote``. So a user's traceback would go
``train.py -> rpcctl/rank/calls.py -> torch``, and a stack dump shows rpcctl's threads
beside the user's. As importlib does for its own frames, rpcctl takes them out of what it
prints: the rank's uncaught exceptions (``drop_own_frames``, so its log, error file and the
launcher's verdict agree) and ``rpcctl stack`` (``hide_own_frames``). The evidence on disk
(``stacks/``, ``hang/``) keeps every frame, and ``launch --all-frames`` / ``stack
--all-frames`` show them. A traceback with no frame of the user's (a fault in rpcctl itself, or
in what it called on its own) is shown whole: hiding would hide the culprit.

Imported in ranks: the standard library only.
"""

from __future__ import annotations

import os
import re
import sysconfig
import types

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # rpcctl/, not base/
ALL_FRAMES_ENV = "RPCCTL_ALL_FRAMES"  # "1" in a rank: keep rpcctl's frames in its tracebacks

_LIBRARIES = tuple(
    p
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    if p
)
_ANY_LIBRARY = re.compile(r"[/\\]lib[/\\]python\d+\.\d+[/\\]")  # any interpreter's stdlib or site-packages
_INSTALLED_RPCCTL = re.compile(r"[/\\]site-packages[/\\]rpcctl[/\\]")  # another node's install of it
# Longest first: a system Python's site-packages lies inside its stdlib folder.
_LIBRARY_PREFIXES = tuple(sorted({os.path.join(p, "") for p in _LIBRARIES}, key=len, reverse=True))


def short_path(path: str) -> str:
    """A source file as people name it in a call site: installed code by its import path
    (``torch/distributed/optim/optimizer.py``, not where the venv lies), a file under the working
    directory relative to it, any other file whole."""
    for prefix in _LIBRARY_PREFIXES:
        if path.startswith(prefix):
            return path[len(prefix) :]
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return relative if not relative.startswith("..") else path


def is_own(filename: str) -> bool:
    return filename.startswith(PACKAGE_DIR) or _INSTALLED_RPCCTL.search(filename) is not None


def is_user_file(filename: str) -> bool:
    """The user's code: neither rpcctl nor a library (any interpreter's) nor ``<frozen ...>``."""
    return not (
        filename.startswith("<") or is_own(filename) or filename.startswith(_LIBRARIES) or _ANY_LIBRARY.search(filename)
    )


def drop_own_frames(exc: BaseException) -> None:
    """Unlink rpcctl's frames from ``exc``'s traceback and those of its causes and contexts."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = _without_own_frames(exc.__traceback__)
        if exc.__cause__ is not None:
            drop_own_frames(exc.__cause__)
        exc = exc.__context__


def _without_own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    chain = []
    while tb is not None:
        chain.append(tb)
        tb = tb.tb_next
    files = [t.tb_frame.f_code.co_filename for t in chain]
    if not chain or is_own(files[-1]) or not any(is_user_file(f) for f in files):
        return chain[0] if chain else None  # raised by rpcctl, or no user frame: keep the whole story
    kept = [t for t, f in zip(chain, files) if not is_own(f)]
    for earlier, later in zip(kept, kept[1:]):
        earlier.tb_next = later
    kept[-1].tb_next = None
    return kept[0]


_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line \d+ in (.*)$')
# Threads rpcctl starts in a rank, by the module their loop runs in.
_THREAD_ROLES = {
    "rank/reporter.py": "rpcctl's telemetry sender",
    "telemetry/forward.py": "rpcctl's telemetry relay",
    "base/stacks.py": "rpcctl's stack dumper",
}


def hide_own_frames(dump: str) -> str:
    """A faulthandler dump (``Thread 0x… (most recent call first):`` blocks) without rpcctl's
    frames: each run of them becomes one ``[rpcctl frames hidden]`` line, and a thread of
    rpcctl's own (nothing of the user's on it) one line that names it."""
    out: list[str] = []
    block: list[str] = []

    def flush() -> None:
        if block:
            out.extend(_hide_in_thread(block))
            block.clear()

    for line in dump.splitlines():
        if _THREAD.match(line):
            flush()
        block.append(line)
    flush()
    return "\n".join(out) + ("\n" if dump.endswith("\n") else "")


def _hide_in_thread(block: list[str]) -> list[str]:
    frames = {i: m.group(1) for i, m in enumerate(map(_FRAME.match, block)) if m}  # line index -> file
    if not frames or not _THREAD.match(block[0]):
        return block
    users = [i for i, f in frames.items() if is_user_file(f)]
    hidden = {i for i, f in frames.items() if is_own(f)}
    if hidden and not users:
        files = [frames[i] for i in hidden]
        role = next(
            (r for suffix, r in _THREAD_ROLES.items() if any(f.endswith(suffix) for f in files)), "a thread of rpcctl's"
        )
        blank = [line for line in block[1:] if not line.strip()]  # the blank line between threads
        return [f"{block[0].split(' (most recent')[0]}: {role} (hidden; --all-frames shows it)", *blank]
    # Below the outermost user frame, rpcctl's bootstrap started the script (through runpy).
    outer = {i: f for i, f in frames.items() if users and i > users[-1]}
    if hidden & outer.keys() and all(i in hidden or f.startswith("<frozen runpy>") for i, f in outer.items()):
        hidden |= outer.keys()
    out: list[str] = []
    for i, line in enumerate(block):
        if i not in hidden:
            out.append(line)
        elif i - 1 not in hidden:  # one line for each run of hidden frames
            out.append(line[: len(line) - len(line.lstrip())] + "[rpcctl frames hidden]")
    return out
