"""Native stacks of live processes, read from outside (py-spy): no help from the process.

``rpcctl.base.stacks`` asks a process for its Python stacks (its own thread, or faulthandler): exactly
when it matters (the GIL held in a C call, a collective's C++ side, a deadlocked lock) that says
little. Here ``py-spy dump --native --json`` reads each process's memory through ptrace and gives,
for every Python thread, its Python frames with the native frames of the C calls they made
(innermost first, as faulthandler writes them), and whether it is idle or active, and holds the
GIL. Only on demand (``rpcctl stack --native``) or at a hang verdict: never on a rank's hot path.

- **Bounded**: every process is read by a py-spy of its own, all at once, each killed (it is ours)
  when the time bound passes; a process it cannot read says why in one line.
- **Refused, told**: where reading another process is not allowed (no CAP_SYS_PTRACE, Yama's
  ``ptrace_scope``, a container without ``SYS_PTRACE``), ``refused_hint`` is one line that says why
  and how to allow it; the callers fall back to faulthandler's Python stacks.
- **Which py-spy**: ``RPCCTL_PY_SPY`` (a path; empty: none), else the one beside this Python
  (a virtual environment's ``bin/``), else ``py-spy`` on ``PATH``.

``explaining_frame`` picks, of a thread's native frames, the innermost one that says what it
waits on (a backend's wait, a lock, a syscall): the hang verdict quotes it beside the Python line.

The standard library only (psutil where the processes of a tree are listed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

TIMEOUT_S = 10.0  # per process; symbols of libtorch take py-spy ~2 s to load

# Libraries a wait passes through on its way to the kernel: the frame that explains a wait is
# the one that called into them (c10d::Work::wait above std::condition_variable::wait above
# pthread_cond_wait), or their outermost frame when what called them is glue (libc's sleep
# under ctypes' libffi).
_PLUMBING = re.compile(r"^(libc|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libm|librt|libdl)([.-]|$)")
_GLUE_FILE = re.compile(r"^(libffi[.-]|callproc\.c$|_ctypes\.c$|cfield\.c$)")
_GLUE_NAME = re.compile(
    r"^(pybind11::|_?PyObject_|_?PyEval_|cfunction_|method_vectorcall|_PyFunction_Vectorcall|_Py_|PyCFunction|PyCFuncPtr)"
)
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")


@dataclass(frozen=True)
class NativeFrame:
    name: str
    file: str  # the short file name: train.py, libtorch_cpu.so, callproc.c
    line: int  # 0: none known
    native: bool  # False: a Python frame

    @property
    def label(self) -> str:
        """``c10d::Work::wait (libtorch_cpu.so)``; a C++ name's template and argument lists cut
        to ``<…>``/``(…)`` so that a pybind11 lambda stays one short line."""
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{short_symbol(self.name) if self.native else self.name} ({where})"


@dataclass
class NativeThread:
    ident: int  # pthread id: faulthandler's ``Thread 0x…``
    tid: int | None  # the kernel's thread id
    name: str | None
    active: bool  # py-spy's word: running (active) or waiting (idle)
    owns_gil: bool
    frames: list[NativeFrame]  # innermost first

    @property
    def state(self) -> str:
        return ("active" if self.active else "idle") + (", holds the GIL" if self.owns_gil else "")


@dataclass
class NativeDump:
    """One process as py-spy read it (``threads``), or why it could not (``error``)."""

    pid: int
    threads: list[NativeThread] = field(default_factory=list)
    error: str | None = None
    refused: bool = False  # not allowed to read it (ptrace): ``refused_hint`` says how to allow it
    note: str | None = None  # said above the threads (a stopped process: read unpaused, Python frames only)

    def text(self, all_frames: bool = True) -> str:
        """py-spy's own layout: a thread header, then its frames innermost first. Without
        ``all_frames``, a thread of rpcctl's own (``rpcctl-telemetry``) is one line."""
        if self.error is not None:
            return f"(no native stack: {self.error})\n"
        out = [f"({self.note})\n"] if self.note else []
        for thread in self.threads:
            name = f' "{thread.name}"' if thread.name else ""
            out.append(f"Thread 0x{thread.ident:x} (tid {thread.tid}, {thread.state}){name}:\n")
            if not all_frames and (thread.name or "").startswith("rpcctl-"):
                out[-1] = out[-1].replace(":\n", ": a thread of rpcctl's (hidden; --all-frames shows it)\n")
                continue
            frames = thread.frames if all_frames else _without_bootstrap(thread.frames)
            out.extend(f"    {f.label}\n" for f in frames)
            if len(frames) < len(thread.frames):
                out.append("    [rpcctl frames hidden]\n")
        return "".join(out) or "(no Python thread)\n"

    def thread(self, ident: int) -> NativeThread | None:
        return next((t for t in self.threads if t.ident == ident), None)


def _without_bootstrap(frames: list[NativeFrame]) -> list[NativeFrame]:
    """A thread's frames up to the first of rpcctl's own bootstrap (``rpcctl/rank/runtime.py``,
    the rank server, runpy's and libc's under them): what runs the user's script, not the script."""
    for index, frame in enumerate(frames):
        if not frame.native and frame.file.startswith("rpcctl/") and index:
            return frames[:index]
    return frames


def short_symbol(name: str, limit: int = 120) -> str:
    """A C++ symbol without its template arguments and parameter lists: ``a::b<…>::c``."""
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            if depth == 0:
                out.append("<…>" if ch == "<" else "(…)")
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    short = "".join(out)
    return short if len(short) <= limit else short[: limit - 1] + "…"


def py_spy() -> str | None:
    """The py-spy binary to run, or None when there is none."""
    chosen = os.environ.get("RPCCTL_PY_SPY")
    if chosen is not None:
        return chosen or None
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


MISSING = "py-spy is not installed (pip install py-spy): no native stacks"


def read(pids: list[int], timeout: float = TIMEOUT_S) -> dict[int, NativeDump]:
    """Each process's native stacks, read at once by one py-spy each, every one within ``timeout``."""
    binary = py_spy()
    if binary is None:
        return {pid: NativeDump(pid, error=MISSING) for pid in pids}
    started: dict[int, subprocess.Popen] = {}
    dumps: dict[int, NativeDump] = {}
    stopped = {pid for pid in pids if _stopped(pid)}
    for pid in pids:
        # A stopped process cannot be paused again to unwind its C frames: its Python frames are
        # read as it stands (py-spy's --nonblocking), and it is said to be stopped.
        mode = ["--nonblocking"] if pid in stopped else ["--native"]
        try:
            started[pid] = subprocess.Popen(
                [binary, "dump", *mode, "--json", "--pid", str(pid)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, "RUST_BACKTRACE": "0"},
            )
        except OSError as exc:
            dumps[pid] = NativeDump(pid, error=f"{binary} could not be run: {exc.strerror or exc}")
    deadline = time.monotonic() + timeout
    for pid, proc in started.items():
        try:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            proc.kill()  # our own py-spy, by its Popen: the process it read is let go as it dies
            proc.communicate()
            dumps[pid] = NativeDump(pid, error=f"py-spy gave no stack within {timeout:g} s")
            continue
        dumps[pid] = _parsed(pid, proc.returncode, out, err)
        if pid in stopped and dumps[pid].error is None:
            dumps[
                pid
            ].note = f"stopped (SIGSTOP): its Python frames as it stands, no native ones; `kill -CONT {pid}` resumes it"
    return {pid: dumps[pid] for pid in pids}


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _parsed(pid: int, code: int, out: bytes, err: bytes) -> NativeDump:
    if code == 0:
        try:
            return NativeDump(pid, [_thread(t) for t in json.loads(out)])
        except (ValueError, KeyError, TypeError) as exc:
            return NativeDump(pid, error=f"py-spy's output could not be read ({exc})")
    said = err.decode(errors="replace")
    if "Permission denied" in said or "Operation not permitted" in said or "os error 1)" in said:
        return NativeDump(pid, error="not allowed to read it (ptrace)", refused=True)
    if not _alive(pid):
        return NativeDump(pid, error="it exited")
    if "Failed to find python version" in said:
        return NativeDump(pid, error="not a Python process (py-spy reads Python processes only)")
    first = next((line.strip() for line in said.splitlines() if line.strip()), f"py-spy exited {code}")
    return NativeDump(pid, error=first.removeprefix("Error: ")[:200])


def _thread(raw: dict) -> NativeThread:
    frames = [
        NativeFrame(
            str(f.get("name") or "?"),
            str(f.get("short_filename") or f.get("filename") or "?"),
            int(f.get("line") or 0),
            f.get("module") is not None,
        )
        for f in raw.get("frames", [])
    ]
    return NativeThread(
        int(raw["thread_id"]),
        raw.get("os_thread_id"),
        raw.get("thread_name"),
        bool(raw.get("active")),
        bool(raw.get("owns_gil")),
        frames,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def explaining_frame(thread: NativeThread | None) -> NativeFrame | None:
    """Of the native frames under a thread's innermost Python frame, the one that says what it
    waits on: the first named frame above the C and C++ runtimes' (a backend's wait, a lock's
    acquire), or the runtimes' outermost when glue called them (a syscall under ctypes)."""
    if thread is None:
        return None
    below = []
    for frame in thread.frames:
        if not frame.native:
            break
        below.append(frame)
    outermost_runtime = None
    for frame in below:
        named = not _ADDRESS.match(frame.name)
        if _PLUMBING.match(frame.file):
            outermost_runtime = frame if named else outermost_runtime
            continue
        if not named:
            continue
        if _GLUE_FILE.match(frame.file) or _GLUE_NAME.match(frame.name):
            break
        return frame
    return outermost_runtime


def refused_hint() -> str:
    """One line: why this machine does not let rpcctl read another process, and how to allow it."""
    why = []
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        scope = None
    if scope not in (None, "0"):
        why.append(f"Yama's kernel.yama.ptrace_scope is {scope}")
    if not _has_ptrace_cap():
        why.append("this process lacks CAP_SYS_PTRACE (a container without --cap-add SYS_PTRACE?)")
    if _status_field("Seccomp") == "2":
        why.append(
            "a seccomp filter forbids ptrace here (a container's profile: docker run --security-opt seccomp=unconfined,"
            " or a profile that allows ptrace and process_vm_readv)"
        )
    reason = "; ".join(why) or "ptrace was refused"
    return (
        f"native stacks: not allowed to read the rank's processes ({reason}): allow it with "
        "`sysctl kernel.yama.ptrace_scope=0`, or give rpcctl CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE; "
        "Kubernetes: securityContext.capabilities.add [SYS_PTRACE]); the Python stacks below are faulthandler's"
    )


def _status_field(name: str) -> str | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == name:
                    return value.strip()
    except OSError:
        pass
    return None


def _has_ptrace_cap() -> bool:
    try:
        return bool(int(_status_field("CapEff") or "0", 16) & (1 << 19))  # CAP_SYS_PTRACE
    except ValueError:
        return False


def tree(pid: int) -> list[tuple[int, list[str]]]:
    """(pid, command line) of ``pid`` and every live process under it, the process first."""
    import psutil

    try:
        root = psutil.Process(pid)
        found = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    out = []
    for proc in found:
        try:
            out.append((proc.pid, proc.cmdline()))
        except psutil.Error:
            continue
    return out


# ---------------------------------------------------------------------------------------------
# A sampling profile of a live process and the processes under it (``rpcctl profile``)

PROFILE_FORMATS = {"speedscope": "speedscope", "chrome": "chrometrace"}  # rpcctl's word → py-spy's


def record_profile(
    pid: int, seconds: float, fmt: str, out: Path, rate: int = 100, native: bool = False
) -> tuple[int | None, str | None]:
    """``py-spy record`` of ``pid`` and its subprocesses for ``seconds`` into ``out`` (``fmt``:
    speedscope or chrome): (the samples taken, None) or (None, why not). Bounded: ``seconds``
    plus 30 s to attach and write; ``refused`` errors start with ``REFUSED``."""
    binary = py_spy()
    if binary is None:
        return None, MISSING.replace("no native stacks", "no profile")
    argv = [
        binary,
        "record",
        "--pid",
        str(pid),
        "--subprocesses",
        "--duration",
        str(max(1, round(seconds))),
        "--rate",
        str(rate),
        "--format",
        PROFILE_FORMATS[fmt],
        "--output",
        str(out),
        "--nonblocking",
    ]
    if native:
        argv.remove("--nonblocking")  # native frames need the process paused while they are read
        argv.append("--native")
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=seconds + 30,
            env={**os.environ, "RUST_BACKTRACE": "0"},
        )
    except subprocess.TimeoutExpired:
        return None, f"py-spy did not finish within {seconds + 30:g} s"
    except OSError as exc:
        return None, f"{binary} could not be run: {exc.strerror or exc}"
    said = done.stderr.decode(errors="replace") + done.stdout.decode(errors="replace")
    samples = re.search(r"Samples: (\d+)", said)
    if done.returncode == 0 and out.is_file():
        return (int(samples.group(1)) if samples else None), None
    if not _alive(pid):
        return None, "the rank exited while it was profiled"
    # "No python processes found": why?
    if "Permission denied" in said or "Operation not permitted" in said or read([pid])[pid].refused:
        return None, REFUSED
    first = next(
        (line.strip() for line in said.splitlines() if line.strip() and not line.startswith("py-spy>")),
        f"py-spy exited {done.returncode}",
    )
    return None, first.removeprefix("Error: ")[:200]


REFUSED = "REFUSED"
