"""What the supervisor tells the rest of the launcher: small typed events, and the bus that carries them.

The supervisor (``rpcctl.supervise.supervisor``) decides: which rank failed first, whether to restart,
when to tear down. It says what happened as events and knows nothing of who listens::

    supervisor ──publish──▶ Events ──▶ console echo and messages   (rpcctl.supervise.listeners)
                                  ├──▶ the live view               (rpcctl.supervise.live: RunSaved snapshots)
                                  ├──▶ telemetry                   (started, exited, lines → the store)
                                  ├──▶ the hang watchdog           (lines are progress; attempts)
                                  └──▶ the cluster relay           (failures, cancels → the other nodes)

``publish`` calls each listener in turn on the publishing thread. A rank's output comes from the
log pump's thread (``procs.LogPump``), never the policy loop's: a slow terminal stalls the echo
(and, through the pipes, the ranks' output), never supervision; the log files get every byte
first. Listeners must not block otherwise; one that raises is reported on stderr and the others
still hear the event. Events are frozen: a ``RunSaved`` carries a copy of the record, so the live
view draws from snapshots, never from the supervisor's own fields.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rpcctl.records.runs import Failure, RunRecord
from rpcctl.base.states import RankStatus


@dataclass(frozen=True)
class RankStarted:
    rank: int
    pid: int
    local_rank: int
    device: str
    restart: int


@dataclass(frozen=True)
class RankExited:
    rank: int
    pid: int
    state: RankStatus
    exit_code: int | None


@dataclass(frozen=True)
class RankOutput:
    """A state of a rank's line (``lines.Piece``): ``final`` once the line is finished (echoed,
    kept in the tail), ``new`` when the rank drew it (a progress bar's ``\\r`` states too)."""

    rank: int
    text: str
    final: bool
    new: bool


@dataclass(frozen=True)
class AttemptStarted:
    """Every rank of an attempt was asked to start (``restart``: 0 for the first attempt)."""

    restart: int


@dataclass(frozen=True)
class RoundMeeting:
    """Elastic: this node goes to meet the others for its attempt ``restart``. The node that hosts
    the run's store takes part in every round, so its count is the job's: another node's ranks
    that start from now on run in this attempt (their launchers count only the rounds they were in)."""

    restart: int


@dataclass(frozen=True)
class Failed:
    """A failure the supervisor acts on: a rank's, a hang (``reason`` hang), a timeout, another
    node's (``remote``), the launcher's own. ``final``: this node will not restart after it."""

    failure: Failure
    final: bool


@dataclass(frozen=True)
class Restarting:
    """The ranks are stopped and started again: ``restart`` is the count they start with next
    (1 for the first restart; ``TORCHELASTIC_RESTART_COUNT``), ``of`` the job's ``max_restarts``."""

    restart: int
    of: int
    after: str
    everywhere: bool  # on every node


@dataclass(frozen=True)
class CancelRequested:
    """A cancel signal reached the launcher (the job is torn down within ``grace`` seconds)."""

    signal: str
    grace: float


@dataclass(frozen=True)
class Cancelled:
    """This node cancels the job (its own signal, not another node's): ``reason`` for the others."""

    reason: str


@dataclass(frozen=True)
class RunSaved:
    """The run record as it stands (a copy, taken when the supervisor saves it)."""

    record: RunRecord


@dataclass(frozen=True)
class Notice:
    """Something for the person at the terminal (and ``launcher.log``)."""

    message: str
    warning: bool = False


Event = (
    RankStarted
    | RankExited
    | RankOutput
    | AttemptStarted
    | RoundMeeting
    | Failed
    | Restarting
    | CancelRequested
    | Cancelled
    | RunSaved
    | Notice
)
Listener = Callable[[Event], None]


class Events:
    """The bus: listeners subscribe before the run starts; ``publish`` never raises."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()

    def subscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = [*self._listeners, listener]  # a publish in progress keeps its list

    def publish(self, event: Event) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception as exc:  # noqa: BLE001 - one listener's fault must not stop the job or the others
                try:
                    print(f"rpcctl: a listener failed on {type(event).__name__}: {exc!r}", file=sys.stderr)
                except OSError:
                    pass
