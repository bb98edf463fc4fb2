"""Run directories and run records.

Layout of one run (``<runs-dir>/<run-id>/``)::

    run.json            the run record (RunRecord), rewritten atomically on every change (in place on a full disk)
    config.yaml         the resolved JobSpec
    logs/rank-N.log     everything rank N wrote to stdout and stderr, across restarts
    errors/rank-N.json  the uncaught exception of rank N (torchelastic's error-file format)
    stacks/rank-N.txt   Python stacks dumped on request (``rpcctl stack``)
    hang/, hang-2/...   the hang watchdog's evidence: diagnosis.txt, stacks.txt, calls.json
    launcher.log        the launcher's messages and verdict, timestamped; the rank server's own output

Run status is a small state machine (``RunStatus``, in ``rpcctl.base.states``): ``running`` →
``succeeded`` | ``failed`` | ``cancelled``. A record left ``running`` by a launcher that no
longer exists reads as ``lost``. Rank states are ``RankStatus``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import secrets
import socket
import stat
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

import psutil

from rpcctl.console import HIGH, KEY, LOW, Column, epoch_of, human_seconds, human_time, parse_iso
from rpcctl.base.errors import DamagedRunError, RunNotFoundError, UsageError
from rpcctl.base.lines import MAX_LOG_TAIL_LINE_CHARS, MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, cap_text
from rpcctl.base.private import write_private_atomic
from rpcctl.base.states import FailureReason, RankStatus, RunStatus


def epoch_or_none(stamp: Any) -> float | None:
    """An ISO-8601 stamp of a record as epoch seconds; None for none, another type or a malformed one."""
    try:
        return epoch_of(stamp) if isinstance(stamp, str) else None
    except ValueError:
        return None


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


@dataclass
class RankState:
    """What was observed of one rank (the latest attempt)."""

    rank: int
    local_rank: int
    pid: int | None = None
    # pending → running → succeeded | failed | killed (torn down by rpcctl)
    state: RankStatus = RankStatus.PENDING
    exit_code: int | None = None
    signal: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    device: str = "cpu"
    log: str | None = None


@dataclass
class Failure:
    """A rank's failure; the earliest one of an attempt is the job's root cause. Its text is
    capped when it is made or read (``cap_text``): a 20 MB exception message made a 126 MB
    run.json, and as much on the terminal, the report and every poll of the live page."""

    rank: int
    pid: int | None
    exit_code: int | None
    signal: str | None
    reason: FailureReason  # a plain word in run.json (``states.FailureReason`` lists them)
    message: str
    timestamp: str
    traceback: str | None = None
    error_type: str | None = None
    log_tail: list[str] = field(default_factory=list)
    node: int | None = None  # set when the failure happened on another node
    host: str | None = None

    def __post_init__(self) -> None:
        self.reason = FailureReason.read(self.reason)
        whole = f"; the whole is in logs/rank-{self.rank}.log" if isinstance(self.rank, int) and self.rank >= 0 else ""
        self.message = cap_text(self.message, MAX_MESSAGE_CHARS, whole)
        self.traceback = cap_text(self.traceback, MAX_TRACEBACK_CHARS, whole)
        if isinstance(self.log_tail, list):
            self.log_tail = [cap_text(line, MAX_LOG_TAIL_LINE_CHARS) for line in self.log_tail]


def describe_round(entry: dict[str, Any]) -> str:
    """An elastic round as every view says it: "round 1: 2 node(s), world size 4"."""
    return f"round {entry.get('round')}: {entry.get('nnodes')} node(s), world size {entry.get('world_size')}"


@dataclass
class RunRecord:
    run_id: str
    name: str
    status: RunStatus
    run_dir: str
    config_path: str | None
    script: str
    world_size: int
    nproc_per_node: int
    start_method: str
    host: str
    launcher_pid: int
    launcher_started: float  # the launcher's create_time, so a reused pid is never mistaken for it
    master_addr: str
    master_port: int
    started_at: str
    nnodes: int = 1
    node_rank: int = 0
    slurm_job_id: str | None = None
    ended_at: str | None = None
    restarts: int = 0
    max_restarts: int = 0
    # Elastic jobs (issue 43): each round of members, as supervise.elastic.round_entry writes it
    # (round, nnodes, world_size, group_rank, first_rank, members, why, at).
    rounds: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    exit_code: int | None = None
    ranks: list[RankState] = field(default_factory=list)
    root_cause: Failure | None = None
    # What went wrong around the job, not in it (a log truncated by a full disk, ...).
    warnings: list[str] = field(default_factory=list)
    # The launch's own command line, as typed (`rpcctl launch --nproc-per-node 2 train.py --lr 0.1`),
    # at most MAX_COMMAND_ARGS words of MAX_COMMAND_WORD characters each.
    command_line: list[str] | None = None

    @property
    def command(self) -> str | None:
        """The command line in one shell-quoted line, at most 200 characters (the COMMAND cell)."""
        if not self.command_line:
            return None
        import shlex

        return short(shlex.join(str(word) for word in self.command_line), 200)

    @property
    def duration_s(self) -> float:
        """From the start to the end, or to now while it runs."""
        start = parse_iso(self.started_at)
        end = parse_iso(self.ended_at) if self.ended_at else datetime.now(timezone.utc)
        return (end - start).total_seconds()

    @property
    def cause(self) -> str | None:
        """The root cause in one short line (the ROOT CAUSE cell of ``rpcctl runs``)."""
        cause = self.root_cause
        if cause is None:
            return None
        text = f"rank {cause.rank}: {cause.message}" if cause.rank >= 0 else cause.message
        return short(" ".join(text.split()))  # one line in a table cell, whatever the message holds

    def round_at(self, t: float | None) -> dict[str, Any] | None:
        """The elastic round going on at epoch time ``t`` (the last to begin at or before it; a
        process that started before the first: the first); None for a run with no rounds. By
        time, not by restart: another node's ranks count their own attempts."""
        rounds = [
            (at, r) for r in self.rounds if isinstance(r, dict) for at in [epoch_or_none(r.get("at"))] if at is not None
        ]
        if not rounds or t is None:
            return None
        begun = [r for at, r in rounds if at <= t]  # a round is stamped before its ranks start
        return begun[-1] if begun else rounds[0][1]

    @property
    def round(self) -> str | None:
        """An elastic job's latest round and its nodes (the ROUND cell of ``rpcctl runs``)."""
        if not self.rounds or not isinstance(self.rounds[-1], dict):
            return None
        last = self.rounds[-1]
        return f"{last.get('round')} ({last.get('nnodes')} node{'s' if last.get('nnodes') != 1 else ''})"

    # ``rpcctl runs``: the table and ``--filter`` come from these (keys: fields or properties).
    COLUMNS: ClassVar[tuple[Column, ...]] = (
        Column("run_id", "RUN", priority=KEY),
        Column("name", priority=LOW),  # the run id starts with it
        Column("status", priority=KEY),
        Column("world_size", "RANKS", justify="right", priority=LOW),
        Column("started_at", "STARTED", fmt=human_time),
        Column("duration_s", "DURATION", fmt=human_seconds),
        Column("restarts", justify="right", priority=LOW),
        Column("round", "ROUND", priority=LOW, sparse=True),  # elastic jobs only
        Column("cause", "ROOT CAUSE", wrap=True, priority=HIGH),
        Column("command", wrap=True, priority=LOW, detail=True),  # --wide (and --json: command_line)
    )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        data = dict(data)
        data["status"] = RunStatus(data["status"])
        data["ranks"] = [
            RankState(**{**r, "state": RankStatus(r.get("state", RankStatus.PENDING))}) for r in data.get("ranks", [])
        ]
        if data.get("root_cause"):
            data["root_cause"] = Failure(**data["root_cause"])
        data["reason"] = cap_text(data.get("reason"), MAX_MESSAGE_CHARS)  # a record written before the caps
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def effective_status(self) -> RunStatus:
        """``lost`` when the record says running but its launcher is gone."""
        if self.status == RunStatus.RUNNING and not launcher_alive(self):
            return RunStatus.LOST
        return RunStatus(self.status)


MAX_COMMAND_ARGS, MAX_COMMAND_WORD = 256, 1024


def bounded_command(argv: list[str]) -> list[str]:
    """A command line as a run record keeps it: words and their count capped."""
    words = [cap_text(str(word), MAX_COMMAND_WORD) for word in argv[:MAX_COMMAND_ARGS]]
    if len(argv) > MAX_COMMAND_ARGS:
        words.append(f"... ({len(argv) - MAX_COMMAND_ARGS} more)")
    return words


def short(text: str, width: int = 60) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def launcher_alive(record: RunRecord) -> bool:
    try:
        proc = psutil.Process(record.launcher_pid)
        return abs(proc.create_time() - record.launcher_started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def process_in_run(pid: int, run_id: str) -> bool:
    """True when ``pid`` is this user's and carries the run's id in its environment (the
    rank server, a rank, or what a rank started)."""
    try:
        proc = psutil.Process(pid)
        return proc.uids().real == os.getuid() and proc.environ().get("RPCCTL_RUN_ID") == run_id
    except psutil.Error:
        return False


def launcher_of_run(record: RunRecord) -> psutil.Process | None:
    """The record's launcher, if it really is this run's: alive, this user's, and the parent of
    the run's rank server. A record is only a file: a stale or forged one may name any pid."""
    if not launcher_alive(record):
        return None
    try:
        launcher = psutil.Process(record.launcher_pid)
        if launcher.uids().real != os.getuid():
            return None
        children = launcher.children()
    except psutil.Error:
        return None
    return launcher if any(process_in_run(child.pid, record.run_id) for child in children) else None


# ---------------------------------------------------------------------------------------------


def default_runs_dir() -> Path:
    return Path(os.environ.get("RPCCTL_RUNS_DIR") or "runs")


def check_runs_dir(runs_dir: Path, flag: str) -> list[str]:
    """Refuse (``UsageError``, exit 2) a runs directory in which another user could swap a run
    directory for a link to somewhere of theirs, as ssh refuses such a path to its keys: it, or
    a directory above it, owned by a user other than you and root, or writable by others
    without the sticky bit (a sticky directory, as /tmp, lets no one rename another's entries).
    A directory writable by its group (without the sticky bit) costs a warning, returned: its
    members could do the same, and a group project directory is often meant so."""
    me = os.geteuid()
    warnings = []
    path = Path(os.path.abspath(runs_dir))
    for directory in [path, *path.parents]:
        try:
            st = os.stat(directory)
        except OSError:
            continue  # not there yet: rpcctl makes it, as yours
        if st.st_uid not in (me, 0):
            raise UsageError(
                f"{flag}: {directory} belongs to another user (uid {st.st_uid}): they could swap a run directory "
                "for a link to anywhere; use a runs directory of your own"
            )
        if st.st_mode & stat.S_ISVTX:
            continue
        if st.st_mode & stat.S_IWOTH:
            raise UsageError(
                f"{flag}: {directory} is writable by every user (mode {stat.S_IMODE(st.st_mode):o}): another user "
                f"could swap a run directory for a link to anywhere; chmod o-w (or +t, as /tmp) {directory},"
                " or use another"
            )
        if st.st_mode & stat.S_IWGRP and st.st_uid == me:
            warnings.append(
                f"{directory} is writable by its group (mode {stat.S_IMODE(st.st_mode):o}): its members could swap "
                "a run directory for a link; chmod g-w (or +t) if they are not to"
            )
    return warnings


def new_run_id(name: str) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def hostname() -> str:
    return socket.gethostname()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write-then-rename, so a reader (or a crash) never sees half a file."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write-then-rename, 0600, refusing a target that is not a regular file (``private``)."""
    write_private_atomic(path, text)


# run.json carries trailing spaces (valid JSON whitespace), as many as the record's own size and
# at least this many: the blocks its last write needs when the disk is full by then (``save_record``).
RECORD_RESERVE = 16 * 1024


def save_record(record: RunRecord) -> None:
    """Write run.json atomically (write, then rename). On a full disk, rewrite the existing
    file in place instead, in its own blocks (the record plus its reserve of spaces), so the
    run still ends on disk: not atomic, but the only write left that needs no new block."""
    path = Path(record.run_dir) / "run.json"
    text = json.dumps(record.to_dict(), indent=2) + "\n"
    try:
        write_text_atomic(path, text + " " * max(RECORD_RESERVE, len(text)))
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not _overwrite_in_place(path, text):
            raise


def _overwrite_in_place(path: Path, text: str) -> bool:
    """Write ``text`` over the file's own bytes, space-padded to its old size; False when it
    does not fit (or the file is gone)."""
    data = text.encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        if len(data) > size:
            data = json.dumps(json.loads(text), separators=(",", ":")).encode()  # compact: it may fit
            if len(data) > size:
                return False
        os.pwrite(fd, data + b" " * (size - len(data)), 0)
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def load_record(run_dir: Path) -> RunRecord:
    """Read and check a run record. A record that is not one (bad JSON, wrong types, a file
    we cannot read) raises ``DamagedRunError``, which names the file."""
    path = run_dir / "run.json"
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise RunNotFoundError(f"{run_dir} is not a run directory (no run.json)") from None
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON or bad UTF-8
        raise DamagedRunError(path, str(exc)) from None
    return _checked_record(path, data)


def _checked_record(path: Path, data: Any) -> RunRecord:
    from pydantic import TypeAdapter, ValidationError

    if not isinstance(data, dict):
        raise DamagedRunError(path, f"a JSON {type(data).__name__}, not an object")
    known = {f.name for f in dataclasses.fields(RunRecord)}
    try:
        record = TypeAdapter(RunRecord).validate_python({k: v for k, v in data.items() if k in known})
        for moment in (record.started_at, record.ended_at):
            if moment is not None:
                parse_iso(moment)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise DamagedRunError(path, f"key '{where}': {first['msg']}") from None
    except ValueError as exc:
        raise DamagedRunError(path, str(exc)) from None
    return record


@dataclass(frozen=True)
class DamagedRun:
    """A run directory whose record cannot be read: listed as damaged, never skipped silently."""

    run_dir: Path
    error: str

    @property
    def run_id(self) -> str:
        return self.run_dir.name


def scan_runs(runs_dir: Path) -> tuple[list[RunRecord], list[DamagedRun]]:
    """Every run under ``runs_dir``, newest first, and the damaged ones apart; each run once,
    by its real directory. A symbolic link in the runs directory (``ln -s RUN latest``) is
    another name for the run it points to, not a run: that run is listed once, from its own
    directory when it is in the runs directory too, else from the link's target (resolved);
    a link to nothing, or to no run, is not listed."""
    records: list[RunRecord] = []
    damaged: list[DamagedRun] = []
    try:
        children = sorted(runs_dir.iterdir(), key=lambda c: (c.is_symlink(), c.name)) if runs_dir.is_dir() else []
    except OSError:
        children = []
    seen: set[tuple[int, int]] = set()  # the real directories listed: (device, inode)
    for child in children:
        if not (child / "run.json").is_file():
            continue
        try:
            real = os.stat(child)  # through a link: its target's identity
        except OSError:  # removed meanwhile
            continue
        if (real.st_dev, real.st_ino) in seen:
            continue
        seen.add((real.st_dev, real.st_ino))
        if child.is_symlink():
            child = child.resolve()
        try:
            records.append(load_record(child))
        except DamagedRunError as exc:
            damaged.append(DamagedRun(child, exc.reason))
        except RunNotFoundError:  # removed meanwhile
            continue
    records.sort(key=lambda r: epoch_of(r.started_at), reverse=True)
    return records, damaged


def list_runs(runs_dir: Path) -> list[RunRecord]:
    """All readable runs under ``runs_dir``, newest first."""
    return scan_runs(runs_dir)[0]


def resolve_run(run: str | None, runs_dir: Path | None = None) -> Path:
    """A RUN argument (run id, path, or None for the latest) → that run's directory."""
    runs_dir = runs_dir or default_runs_dir()
    if run is None:
        runs, damaged = scan_runs(runs_dir)
        if not runs:
            also = f" ({len(damaged)} damaged: see `rpcctl runs`)" if damaged else ""
            raise RunNotFoundError(f"no runs in {runs_dir}{also} (use --runs-dir or RPCCTL_RUNS_DIR to look elsewhere)")
        return Path(runs[0].run_dir)
    as_path = Path(run)
    if (as_path / "run.json").is_file():
        return as_path
    candidate = runs_dir / run
    if (candidate / "run.json").is_file():
        return candidate
    matches = [r for r in list_runs(runs_dir) if r.run_id.startswith(run)]
    if len(matches) == 1:
        return Path(matches[0].run_dir)
    if len(matches) > 1:
        raise RunNotFoundError(f"run '{run}' is ambiguous in {runs_dir}: {', '.join(m.run_id for m in matches[:5])}")
    raise RunNotFoundError(f"no run '{run}' in {runs_dir} (see `rpcctl runs`)")


def rank_log(run_dir: Path, rank: int) -> Path:
    return run_dir / "logs" / f"rank-{rank}.log"


def rank_error_file(run_dir: Path, rank: int) -> Path:
    return run_dir / "errors" / f"rank-{rank}.json"


def rank_stack_file(run_dir: Path, rank: int) -> Path:
    return run_dir / "stacks" / f"rank-{rank}.txt"


def hang_diagnoses(run_dir: Path) -> list[str]:
    """The hang watchdog's diagnoses of this run (``hang/diagnosis.txt``, ``hang-2/``...), in order."""
    folders = [p for p in run_dir.glob("hang*") if p.name == "hang" or p.name.removeprefix("hang-").isdigit()]
    folders.sort(key=lambda p: 1 if p.name == "hang" else int(p.name.removeprefix("hang-")))
    texts = []
    for folder in folders:
        try:
            texts.append((folder / "diagnosis.txt").read_text(errors="replace"))
        except OSError:
            continue  # written as the job ends, or removed: there is nothing to show yet
    return texts
