"""The policy loop of one job: start the ranks, watch them, decide, tear down, record.

Job states (``RunRecord.status``)::

    running ──all ranks exit 0──────────────────────────▶ succeeded
       │ ──a rank fails (exit ≠ 0, signal, spawn error)─▶ failed     (restart if restarts remain)
       │ ──a rank exits 0, a process it started raised──▶ failed     (``_raised_below``)
       │ ──the job deadline (`timeout`) passes──────────▶ failed     (reason: timeout)
       │ ──no progress for `hang_timeout` (watchdog)────▶ failed     (reason: hang; on_hang: keep → running)
       └ ──SIGINT/TERM/HUP/QUIT to the launcher─────────▶ cancelled  (exit 128 + signal)

Rank states (``RankState.state``): pending → running → succeeded | failed | killed (``rpcctl.base.states``).

The first rank to fail is the root cause; every other rank is torn down at once (SIGTERM to
its whole process tree, ``grace`` seconds, SIGKILL), so a rank that dies before rendezvous
never leaves the others waiting on it. A second Ctrl-C skips the grace period.

The supervisor decides and says what happened as events (``rpcctl.records.events``): the console, the
live view, telemetry, the watchdog and the other nodes listen. It prints nothing itself.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import signal
import time
from collections import deque
from pathlib import Path

from rpcctl.supervise.cluster import RendezvousError
from rpcctl.config import JobSpec
from rpcctl.records.events import (
    AttemptStarted,
    CancelRequested,
    Cancelled,
    Events,
    Failed,
    Notice,
    RankExited,
    RankOutput,
    RankStarted,
    Restarting,
    RoundMeeting,
    RunSaved,
)
from rpcctl.base.lines import MAX_MESSAGE_CHARS, Piece, cap_text
from rpcctl.wire import protocol
from rpcctl.planning.plan import LaunchPlan, NodeFacts, free_port, plan_attempt
from rpcctl.processes.procs import ExitStatus, LogPump, RankProcesses, RankServerLost
from rpcctl.base import backend_abort, stacks
from rpcctl.records.runs import Failure, RankState, RunRecord, describe_round, now_iso, rank_stack_file, save_record
from rpcctl.base.states import RankStatus, RunStatus

POLL_S = 0.1
STACKS_BEFORE_TEARDOWN_S = 2.0  # all ranks together, before a timeout's or a cancel's teardown
LOG_TAIL = 20
# What cancels a job cleanly: Ctrl-C, kill, a closed ssh session or terminal (SIGHUP), Ctrl-\\.
CANCEL_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
ROUND_ENDS = "round ends"  # an elastic attempt's outcome when the membership changes (issue 43)


class Supervisor:
    def __init__(
        self,
        spec: JobSpec,
        plan: LaunchPlan,
        facts: NodeFacts,
        record: RunRecord,
        events: Events,
        *,
        telemetry=None,
        watchdog=None,
        cluster=None,
    ):
        """``telemetry``: the store's server (or another node's forwarder), started and closed
        here, fed by a listener; ``watchdog``: a ``HangWatchdog`` over that store, asked for its
        verdict each round (it goes with telemetry)."""
        self.spec, self.plan, self.facts, self.record = spec, plan, facts, record
        self.events = events
        self.telemetry, self.watchdog = telemetry, watchdog
        self.cluster = cluster  # a NodeRendezvous on multi-node runs
        self.remote_cancel: str | None = None
        self._final_elsewhere = False  # another node failed in a way it will not restart from
        self._next_cluster_poll = 0.0
        self._next_round_poll, self._round_why = 0.0, ""  # elastic rounds (issue 43)
        self.run_dir = Path(record.run_dir)
        self.cancel_signal: int | None = None
        self._cancel_announced = False
        self.hurry = False
        self.tails: dict[int, deque[str]] = {r.rank: deque(maxlen=LOG_TAIL) for r in plan.ranks}
        self._record_error: str | None = None
        self._procs: RankProcesses | None = None

    # -- signals ------------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame) -> None:
        # Only flags: the loop says so and stops the job. Printing here could re-enter a
        # console print the main thread was in the middle of.
        if self.cancel_signal is None:
            self.cancel_signal = signum
        else:
            self.hurry = True

    def _announce_cancel(self) -> None:
        if self.cancel_signal is not None and not self._cancel_announced:
            self._cancel_announced = True
            self.events.publish(CancelRequested(signal.Signals(self.cancel_signal).name, self.spec.grace))

    # -- faults around the job ------------------------------------------------------------------

    def _save(self) -> None:
        """Write the run record; if that fails (a full disk, the run directory removed), warn
        once and go on: the job's outcome is its own, not the record's."""
        self.events.publish(RunSaved(copy.deepcopy(self.record)))
        try:
            save_record(self.record)
        except OSError as exc:
            if self._record_error is None:
                self._record_error = str(exc)
                self._warn(
                    f"could not write the run record {self.run_dir / 'run.json'}: {exc.strerror or exc};"
                    " the job goes on"
                )

    def _on_log_error(self, rank: int, path: Path, written: int, exc: OSError) -> None:
        what = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        message = f"{what}: rank {rank}'s log truncated after {written} bytes, path {path}"
        self.record.warnings.append(message)
        self._warn(f"{message} (its output still reaches the console)")

    def _warn(self, message: str) -> None:
        self.events.publish(Notice(message, warning=True))

    # -- output -------------------------------------------------------------------------------

    def _on_piece(self, rank: int, piece: Piece) -> None:
        """On the log pump's thread: every state a rank drew is told (the loss parser, the
        watchdog and the live view want it); finished lines (a progress bar's last state, not its
        ``\\r`` history) are kept in the tail a failure quotes."""
        if piece.final:
            self.tails[rank].append(piece.text)
        self.events.publish(RankOutput(rank, piece.text, piece.final, piece.new))

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> RunRecord:
        previous = {s: signal.signal(s, self._on_signal) for s in CANCEL_SIGNALS}
        telemetry_env = self._start_telemetry()
        # The run id in its environment marks the rank server as part of this run (leak checks).
        procs = self._procs = RankProcesses(self.run_dir, self.plan.preload, env={"RPCCTL_RUN_ID": self.record.run_id})
        pump = LogPump(self._on_piece, self._on_log_error)
        pump.start()
        deadline = time.monotonic() + self.spec.timeout if self.spec.timeout else None
        try:
            while True:
                outcome = self._attempt(procs, pump, telemetry_env, deadline)
                if outcome == ROUND_ENDS:  # elastic: not a failure, not a restart counted
                    procs.reset()
                    outcome = self._next_round(self._round_why)
                    if outcome is None:
                        continue
                elif outcome == RunStatus.FAILED and self._may_restart(deadline):
                    outcome = self._restart(procs)
                    if outcome is None:
                        continue
                self._finish(outcome)
                return self.record
        except BaseException as exc:
            if self.cluster is not None:  # do not leave the other nodes waiting on us
                failure = Failure(
                    -1,
                    os.getpid(),
                    None,
                    None,
                    "launcher",
                    f"the launcher on node {self.spec.node_rank} crashed: {exc!r}",
                    now_iso(),
                )
                self.events.publish(Failed(failure, final=True))
            raise
        finally:
            procs.close()
            stacks.remove_asks(self.run_dir / "stacks")  # every process of the run is gone now
            pump.drain(timeout=3)
            # It flushes the store: a live view, stopped after this, shows in its final frame the
            # losses and RRefs as they ended, not as of the last commit.
            if self.telemetry is not None:
                self.telemetry.close()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _may_restart(self, deadline: float | None) -> bool:
        return (
            self.record.restarts < self.spec.max_restarts
            and self.cancel_signal is None
            and not self._timed_out(deadline)
            and not self._final_elsewhere
            and (self._procs is None or self._procs.lost is None)  # no rank server to restart with
        )

    def _restart(self, procs: RankProcesses) -> RunStatus | None:
        """Plan the next attempt (on several nodes: after meeting every node again); None to run
        it, or the job's outcome when it cannot restart (cancelled, a node did not come back)."""
        cause = self.record.root_cause
        after = cause.message if cause else "failure"
        self.events.publish(
            Restarting(self.record.restarts + 1, self.spec.max_restarts, after, everywhere=self.cluster is not None)
        )
        procs.reset()
        if self.spec.elastic:  # issue 43: the nodes meet again on torch's rendezvous; a restart counted
            self.record.restarts += 1
            return self._next_round(f"restart {self.record.restarts} after: {after}")
        if self.cluster is None:
            port = self.spec.master_port or free_port()
        else:
            try:
                port = self.cluster.rejoin(free_port, stop=lambda: self.cancel_signal is not None)
            except RendezvousError as exc:
                self.record.root_cause = Failure(
                    -1,
                    None,
                    None,
                    None,
                    "rendezvous",
                    f"{exc} (restarting after: {after})",
                    now_iso(),
                    node=exc.node,
                    host=exc.host,
                )
                return RunStatus.FAILED
            if port is None:
                if self.cancel_signal is not None:
                    self._cancelled_here()
                else:
                    self.remote_cancel = self.remote_cancel or "while the nodes were restarting"
                return RunStatus.CANCELLED
        self.record.restarts += 1
        self.plan = plan_attempt(
            self.spec,
            self.facts,
            run_id=self.record.run_id,
            run_dir=self.run_dir,
            restart=self.record.restarts,
            master_port=port,
        )
        self.record.master_port = self.plan.master_port
        return None

    def _start_telemetry(self) -> dict[str, str]:
        if self.telemetry is None:
            return {}
        try:
            return self.telemetry.start()
        except Exception as exc:  # noqa: BLE001 - telemetry must never stop a job (a full disk, ...)
            self._warn(f"telemetry is off for this run: {exc}")
            self.telemetry.close()
            self.telemetry = self.watchdog = None  # the watchdog reads the store
            return {}

    @staticmethod
    def _timed_out(deadline: float | None) -> bool:
        return deadline is not None and time.monotonic() >= deadline

    def _attempt(self, procs: RankProcesses, pump: LogPump, telemetry_env: dict, deadline: float | None) -> RunStatus:
        """Run one attempt of the whole group; return its outcome (succeeded/failed/cancelled)."""
        header = f"--- rpcctl: restart {self.plan.restart} ---\n" if self.plan.restart else None
        self.record.root_cause = None
        self.record.ranks = [
            RankState(rank=r.rank, local_rank=r.local_rank, device=r.device, log=r.log) for r in self.plan.ranks
        ]
        states = {s.rank: s for s in self.record.ranks}
        base_env = {**os.environ, **telemetry_env}
        for rank in self.plan.ranks:
            write_fd = pump.add(rank.rank, Path(rank.log), header)
            try:
                procs.start(rank, {**base_env, **rank.env}, self.plan.start_method == "spawn", write_fd, os.getcwd())
            finally:
                os.close(write_fd)
        self._save()
        self.events.publish(AttemptStarted(self.plan.restart))

        failure: Failure | None = None
        while True:
            try:
                exits = procs.poll(POLL_S)
            except RankServerLost as exc:  # its ranks and their trees are dead already: say so
                exits = []
                failure = failure or Failure(-1, procs.server.pid, None, None, "launcher", str(exc), now_iso())
            self._announce_cancel()
            changed = self._note_spawned(procs, states)
            for rank, error in list(procs.spawn_errors.items()):
                if failure is None:
                    failure = Failure(
                        rank, None, None, None, "launch", f"rank {rank} could not be started: {error}", now_iso()
                    )
                states[rank].state = RankStatus.FAILED
            for status in exits:
                changed = True
                raised = self._raised_below(status) if status.ok else None
                failed = self._note_exit(status, states, tearing_down=False, raised=raised is not None)
                if failed and failure is None:
                    failure = raised or self._failure(status)
            if failure is None and self.cluster is not None:
                failure = self._cluster_news()
            if self.spec.elastic and self._round_ends(failure):  # issue 43: the membership changed
                self._teardown(procs, states)
                return ROUND_ENDS
            if failure is None and self.watchdog is not None:
                failure = self._watch()
            if failure is not None:
                self.record.root_cause = failure
                self.events.publish(Failed(failure, final=self.record.restarts >= self.spec.max_restarts))
                self._teardown(procs, states)
                return RunStatus.FAILED
            if all(s.state == RankStatus.SUCCEEDED for s in states.values()):
                return RunStatus.SUCCEEDED
            if self._timed_out(deadline):
                self.record.root_cause = Failure(
                    -1,
                    None,
                    None,
                    None,
                    "timeout",
                    f"the job exceeded its timeout of {self.spec.timeout:g}s",
                    now_iso(),
                )
                self.events.publish(Failed(self.record.root_cause, final=True))
                self._dump_stacks(procs, "at the timeout")
                self._teardown(procs, states)
                return RunStatus.FAILED
            if self.cancel_signal is not None or self.remote_cancel is not None:
                if self.remote_cancel is None:
                    self._cancelled_here()
                self._dump_stacks(procs, "when the job was cancelled")
                self._teardown(procs, states)
                return RunStatus.CANCELLED
            if changed:
                self._save()

    # -- elastic rounds (issue 43) ---------------------------------------------------------------

    def _round_ends(self, failure: Failure | None) -> bool:
        """Whether this round ends for a new one: a node waits to join, or a member was lost (a
        rank that failed in a round of several nodes may be that loss: it has ``lost_after`` to
        show). Another node's failure is a failure."""
        if failure is not None and failure.reason == "remote":
            return False
        if failure is None:
            now = time.monotonic()
            if now < self._next_round_poll:
                return False
            self._next_round_poll = now + 0.5
            why = self.cluster.membership_news()
        else:
            why = self.cluster.lost_soon(stop=lambda: self.cancel_signal is not None)
        if why is None:
            return False
        self._round_why = why
        self.events.publish(
            Notice(f"rpcctl: the membership changes ({why}): every rank stops and the nodes meet again")
        )
        return True

    def _next_round(self, why: str) -> RunStatus | None:
        """Meet the nodes again (at least MIN within the join timeout) and plan this node's ranks
        in the new round: None to run it, or FAILED with one reason."""
        from rpcctl.supervise.elastic import round_entry, round_plan

        self.events.publish(RoundMeeting(self.plan.restart + 1))  # before the others can start theirs in it
        try:
            rnd = self.cluster.next_round(free_port)
            plan = round_plan(
                self.spec,
                self.facts,
                rnd,
                run_id=self.record.run_id,
                run_dir=self.run_dir,
                restart=self.plan.restart + 1,
            )
        except RendezvousError as exc:
            self.record.root_cause = Failure(
                -1, None, None, None, "rendezvous", f"{exc} (the last round ended: {why})", now_iso()
            )
            return RunStatus.FAILED
        self.plan = plan
        for rank in plan.ranks:
            self.tails.setdefault(rank.rank, deque(maxlen=LOG_TAIL))
        entry = round_entry(rnd, why, now_iso())
        self.record.rounds.append(entry)
        self.record.world_size, self.record.nnodes, self.record.node_rank = plan.world_size, rnd.nnodes, rnd.group_rank
        self.record.master_addr, self.record.master_port = plan.master_addr, plan.master_port
        ranks = f"{rnd.first_rank}-{rnd.first_rank + len(plan.ranks) - 1}"
        self.events.publish(Notice(f"rpcctl: {describe_round(entry)}; ranks {ranks} here"))
        return None

    def _watch(self) -> Failure | None:
        """The watchdog's verdict. A fault of the watchdog's own never changes the job's outcome:
        it is said once, and the job goes on unwatched."""
        try:
            return self.watchdog.check(self.record)
        except Exception as exc:  # noqa: BLE001 - rpcctl's fault, not the job's
            self._warn(f"the hang watchdog failed ({exc!r}): the job goes on without it")
            self.watchdog = None
            return None

    def _cluster_news(self) -> Failure | None:
        """Poll the other nodes (twice a second): a failure there is this node's root cause too."""
        now = time.monotonic()
        if now < self._next_cluster_poll:
            return None
        self._next_cluster_poll = now + 0.5
        news = self.cluster.poll()
        if news is None:
            return None
        info = news.info
        self._final_elsewhere = bool(info.get("final"))
        if news.kind == RunStatus.CANCELLED:
            self.remote_cancel = info.get("reason", f"cancelled on node {news.node}")
            return None
        return Failure(
            rank=info.get("rank", -1),
            pid=info.get("pid"),
            exit_code=info.get("exit_code"),
            signal=info.get("signal"),
            reason="remote",
            message=info.get("message", "failed"),
            timestamp=now_iso(),
            traceback=info.get("traceback"),
            node=news.node,
            host=info.get("host"),
        )

    def _cancelled_here(self) -> None:
        self.events.publish(Cancelled(f"{signal.Signals(self.cancel_signal).name} on node {self.spec.node_rank}"))

    def _note_spawned(self, procs: RankProcesses, states: dict[int, RankState]) -> bool:
        changed = False
        for rank, pid in procs.pids.items():
            state = states[rank]
            if state.pid != pid:
                state.pid, state.state, state.started_at = pid, RankStatus.RUNNING, now_iso()
                changed = True
                self.events.publish(RankStarted(rank, pid, state.local_rank, state.device, self.plan.restart))
        return changed

    def _note_exit(
        self, status: ExitStatus, states: dict[int, RankState], *, tearing_down: bool, raised: bool = False
    ) -> bool:
        """Record a rank's exit; return True if it counts as a failure (``raised``: it exited 0,
        but a process it started raised)."""
        state = states[status.rank]
        state.exit_code, state.signal, state.ended_at = status.exit_code, status.signal, now_iso()
        if status.ok and not raised:
            state.state = RankStatus.SUCCEEDED
        elif tearing_down:
            state.state = RankStatus.KILLED if status.signal in ("SIGTERM", "SIGKILL") else RankStatus.FAILED
        else:
            state.state = RankStatus.FAILED
        self.events.publish(RankExited(status.rank, status.pid, state.state, status.exit_code))
        return state.state == RankStatus.FAILED

    def _dump_stacks(self, procs: RankProcesses, when: str) -> None:
        """Keep every live rank's Python stacks (and those of the processes it started) in
        ``stacks/`` before a teardown that is no rank's own doing (timeout, cancel): where the
        job was is the evidence. At most ``STACKS_BEFORE_TEARDOWN_S`` in all, skipped by a
        second Ctrl-C. (A hang's stacks are dumped by the watchdog, into ``hang/`` too.)"""
        live = {r: p for r, p in procs.pids.items() if r not in procs.exited}
        if not live or self.hurry:
            return
        targets = [(pid, rank_stack_file(self.run_dir, rank)) for rank, pid in sorted(live.items())]
        for pid in live.values():
            targets += [(child, path) for child, _, path in stacks.registered_descendants(self.run_dir, pid)]
        header = f"--- rpcctl: stacks {when} ({now_iso()}) ---\n"
        try:
            dumps = stacks.dump_many(targets, STACKS_BEFORE_TEARDOWN_S, header, stop=lambda: self.hurry)
        except OSError as exc:  # a full disk, the run directory removed: the teardown goes on
            self._warn(f"could not dump the ranks' stacks {when}: {exc}")
            return
        got = sorted(r for r, pid in live.items() if dumps.get(pid))
        if got:
            ranks = ", ".join(map(str, got))
            self.events.publish(
                Notice(f"rpcctl: stacks of rank{'s' if len(got) > 1 else ''} {ranks} {when}: {self.run_dir / 'stacks'}")
            )

    def _teardown(self, procs: RankProcesses, states: dict[int, RankState]) -> None:
        for status in procs.terminate(self.spec.grace, hurry=lambda: self.hurry):
            self._note_exit(status, states, tearing_down=True)
        for state in states.values():  # never started, or gone without a word from the server
            if not state.state.is_terminal:
                state.state = RankStatus.KILLED
        self._save()

    def _failure(self, status: ExitStatus) -> Failure:
        rank = status.rank
        plan = next(r for r in self.plan.ranks if r.rank == rank)
        error = _read_error_file(Path(plan.error_file))
        aborted = _backend_abort(Path(plan.log)) if not error and status.signal == "SIGABRT" else None
        if error and error.get("child"):
            message = self._spawned_message(rank, error["child"], error["message"])
        elif error:
            message = error["message"]
        elif aborted is not None:  # a backend's C++ exception aborted it: its own words, and where the rank was
            message = aborted.describe()
            error = {"traceback": aborted.traceback(), "type": aborted.error_type}
        else:
            message = f"rank {rank} (pid {status.pid}) {status.describe()}"
        return Failure(
            rank=rank,
            pid=status.pid,
            exit_code=status.exit_code,
            signal=status.signal,
            reason="signal" if status.signal else "exited",
            message=message,
            timestamp=now_iso(),
            traceback=error.get("traceback") if error else None,
            error_type=error.get("type") if error else None,
            log_tail=list(self.tails[rank]),
        )

    def _raised_below(self, status: ExitStatus) -> Failure | None:
        """A rank that exited 0 while a process it started with ``multiprocessing.Process``
        raised (``rank.children`` wrote each down before the process ended, so they are there by
        the time the rank has joined it and exited): the job failed, and the earliest of them is
        the root cause. multiprocessing passes no exception to the parent: a ``join`` returns, the
        child's ``exitcode`` is 1, and the program's own choice to ignore it is not the job's
        success."""
        found = []
        for path in self.run_dir.glob(protocol.RAISED_FILE.format(pid="*")):
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and doc.get("rank_pid") == str(status.pid) and type(doc.get("pid")) is int:
                found.append(doc)
        if not found:
            return None
        first = min(found, key=lambda d: d["t"] if isinstance(d.get("t"), (int, float)) else 0.0)
        rank, pid = status.rank, first["pid"]
        name = first.get("worker") if isinstance(first.get("worker"), str) else None
        if name is None:  # it left RPC before it raised, or never joined: the store may know
            from rpcctl.inspect import spawned_name

            try:
                name = spawned_name(self.run_dir, rank, pid)
            except Exception:  # noqa: BLE001 - a damaged or absent store: the pid names it
                name = None
        parent = f" › pid {first['ppid']}" if type(first.get("ppid")) is int and first["ppid"] != status.pid else ""
        more = f" (and {len(found) - 1} more of its processes raised)" if len(found) > 1 else ""
        message = (
            f"{name or 'a process'} (pid {pid}, {str(first.get('name'))[:200]},"
            f" rank {rank}{parent} › pid {pid}) raised "
            f"{cap_text(str(first.get('message')), MAX_MESSAGE_CHARS)}{more}; rank {rank} exited 0 all the same: "
            "multiprocessing does not pass a process's exception to its parent"
        )
        return Failure(
            rank=rank,
            pid=status.pid,
            exit_code=status.exit_code,
            signal=None,
            reason="exited",
            message=message,
            timestamp=now_iso(),
            traceback=first.get("traceback") if isinstance(first.get("traceback"), str) else None,
            error_type=first.get("type") if isinstance(first.get("type"), str) else None,
            log_tail=list(self.tails[rank]),
        )

    def _spawned_message(self, rank: int, child: dict, message: str) -> str:
        """A process the rank started with mp.spawn failed (or one that process mp.spawned, its
        ``chain`` the pids from the rank's child down to it): named by its RPC name too, if it
        joined RPC (the store has it: it reported long before its parent saw it end)."""
        from rpcctl.inspect import spawned_name

        try:
            name = spawned_name(self.run_dir, rank, int(child["pid"]))
        except Exception:  # a damaged or absent store: the error file's message stands
            name = None
        if not name:
            return message
        chain = child.get("chain")
        nested = isinstance(chain, list) and len(chain) > 1 and all(type(pid) is int for pid in chain)
        where = "".join([f", rank {rank}", *(f" › pid {pid}" for pid in chain)]) if nested else ""
        return f"{name} (mp.spawn process {child.get('index')}, pid {child['pid']}{where}) {child.get('how', 'failed')}"

    def _finish(self, outcome: RunStatus) -> None:
        self.record.status = outcome
        self.record.ended_at = now_iso()
        if outcome == RunStatus.CANCELLED and self.cancel_signal is None:
            self.record.reason = f"cancelled by another node ({self.remote_cancel})"
            self.record.exit_code = 130
        elif outcome == RunStatus.CANCELLED:
            name = signal.Signals(self.cancel_signal).name
            self.record.reason = f"cancelled by {name}"
            self.record.exit_code = 128 + self.cancel_signal
        elif outcome == RunStatus.FAILED:
            cause = self.record.root_cause
            self.record.reason = cause.message if cause else "failed"
            self.record.exit_code = 1
        else:
            self.record.exit_code = 0
        self._save()
        if self.cluster is not None:
            self.cluster.finish(outcome)


def _backend_abort(log: Path) -> backend_abort.Abort | None:
    """What a backend threw as the rank aborted, from its log's last lines (the log pump writes
    them there before it hands them on: a moment after the rank's death, so it is given 0.5 s to
    bring the fatal-error dump in)."""
    deadline = time.monotonic() + 0.5
    while not any(line.startswith("Fatal Python error") for line in backend_abort.tail_lines(log)[-200:]):
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    time.sleep(0.05)  # the rest of the dump, in the pipe with its first line
    try:
        return backend_abort.read(backend_abort.tail_lines(log))
    except Exception:  # noqa: BLE001 - a fault of rpcctl's reading: the plain "killed by SIGABRT" stands
        return None


def _read_error_file(path: Path) -> dict | None:
    """Read torchelastic's error-file format: {"message": {"message", "extraInfo": {"py_callstack"}}}."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    message = data.get("message")
    if isinstance(message, str):  # torch's @record can also write a plain string
        return {"message": message, "traceback": None, "type": None}
    if not isinstance(message, dict):
        return None
    extra = message.get("extraInfo") or {}
    ours = data.get("rpcctl") if isinstance(data.get("rpcctl"), dict) else {}
    return {
        "message": str(message.get("message", "")).strip(),
        "traceback": extra.get("py_callstack"),
        "type": ours.get("type"),
        "child": ours.get("child")
        if isinstance(ours.get("child"), dict) and isinstance(ours["child"].get("pid"), int)
        else None,
    }
