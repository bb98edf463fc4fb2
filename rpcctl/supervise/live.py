"""The live view of ``rpcctl launch`` on a terminal: rank output scrolls above, a status panel
(ranks, plus telemetry panels when available) stays pinned below it.

A listener of the launch's events (``rpcctl.records.events``): it draws from the record snapshots
(``RunSaved``) and the ranks' lines (``RankOutput``) it is told, never from the supervisor.
"""

from __future__ import annotations

import contextlib
import os
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rich.console import Group
from rich.live import Live

from rpcctl.base import stacks
from rpcctl.console import HIGH, KEY, LOW, Column, Console, render_table
from rpcctl.records.events import Event, RankOutput, RunSaved
from rpcctl.records.runs import RunRecord
from rpcctl.base.states import RankStatus

STATE_STYLE = {
    RankStatus.PENDING: "dim",
    RankStatus.RUNNING: "cyan",
    RankStatus.SUCCEEDED: "green",
    RankStatus.FAILED: "bold red",
    RankStatus.KILLED: "yellow",
    RankStatus.STOPPED: "bold yellow",
}


@dataclass(frozen=True)
class LiveRank:
    """One rank's row in the panel. Its latest line is a glimpse (the log has it whole): cut
    to keep one line a rank, never folded."""

    rank: int
    pid: int | None
    state: str
    device: str
    exit: str
    last_line: str

    COLUMNS: ClassVar[tuple[Column, ...]] = (
        Column("rank", justify="right", priority=KEY),
        Column("pid", justify="right", priority=HIGH),
        Column("state", priority=KEY, style=lambda state: STATE_STYLE.get(state, "")),
        Column("device", priority=LOW),
        Column("exit", priority=HIGH),
        Column("last_line", clip=True),
    )


class LiveView:
    """``with LiveView(console, record):`` draws the panel until the block ends; subscribe it to
    the launch's events (it is callable) to keep it current."""

    def __init__(self, console: Console, record: RunRecord):
        self.record = record
        self.started = time.monotonic()
        self.progress: dict[int, str] = {}  # rank → latest \r state of a line not finished yet
        self.last: dict[int, str] = {}  # rank → its last finished line
        # Raw writes to the launcher's stderr (a Python warning, a library's print) go through
        # the live console too, above the panel (rpcctl's own messages: see __enter__).
        self._live = Live(
            self,
            console=console.out,
            refresh_per_second=4,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=True,
        )
        self.console = self._live.console
        self._owner = console
        self._stack = contextlib.ExitStack()

    def __call__(self, event: Event) -> None:
        if isinstance(event, RunSaved):
            self.record = event.record
        elif isinstance(event, RankOutput) and not event.final:
            self.progress[event.rank] = event.text
        elif isinstance(event, RankOutput):
            self.progress.pop(event.rank, None)
            self.last[event.rank] = event.text

    def latest_line(self, rank: int) -> str:
        """What the rank's terminal line shows now: a progress bar's latest state, else its last line."""
        progress = self.progress.get(rank)
        return progress if progress is not None else self.last.get(rank, "")

    def __enter__(self) -> LiveView:
        self._keep_output_on_ctrl_c()
        # The launcher's own messages (Ctrl-C, restarts, warnings) and the ranks' lines go
        # through the live console while the panel is drawn, so they print above it.
        self._stack.enter_context(self._owner.above(self.console, self._live._lock))  # Rich's: refresh() holds it
        self._live.start()
        self._stack.callback(self._live.stop)  # first out: the last frame, then the console as it was
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        if self._termios is not None:
            try:
                termios.tcsetattr(self._termios[0], termios.TCSANOW, self._termios[1])
            except (OSError, termios.error):
                pass

    def _keep_output_on_ctrl_c(self) -> None:
        """Ctrl-C makes the terminal driver drop the output not yet shown (unless NOFLSH):
        part of a panel frame would vanish and the next redraw, erasing the lines it thinks
        it drew, would erase the ranks' lines above it. NOFLSH while the panel is up."""
        self._termios = None
        try:
            fd = sys.stdin.fileno()
            if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
                return  # a background job changing the terminal would be stopped (SIGTTOU)
            attrs = termios.tcgetattr(fd)
            self._termios = (fd, list(attrs))
            attrs[3] |= termios.NOFLSH
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
        except (OSError, ValueError, termios.error):
            self._termios = None

    def __rich__(self):
        record = self.record
        elapsed = time.monotonic() - self.started
        restarts = f"  restarts {record.restarts}/{record.max_restarts}" if record.max_restarts else ""
        rows = []
        for state in record.ranks:
            exit_text = state.signal or ("" if state.exit_code is None else str(state.exit_code))
            shown = (
                RankStatus.STOPPED
                if state.state == RankStatus.RUNNING and state.pid and stacks.stopped(state.pid)
                else state.state
            )
            rows.append(
                LiveRank(state.rank, state.pid or None, shown, state.device, exit_text, self.latest_line(state.rank))
            )
        # Plain text cells (render_table never parses markup): a rank's output is arbitrary text
        # ("[epoch 1]"), and a print(markup=False) while the panel is up renders it without markup.
        table = render_table(
            rows,
            LiveRank.COLUMNS,
            title=f"{record.name}  {record.run_id}  {elapsed:.0f}s{restarts}",
            hint="rpcctl inspect workers and rpcctl logs show them",
        )
        parts = [table]
        parts.extend(_telemetry_panels(Path(record.run_dir)))
        return Group(*parts)


def _telemetry_panels(run_dir: Path) -> list:
    from rpcctl.views.dashboard import dashboard_panels

    try:
        return list(dashboard_panels(run_dir))
    except Exception:  # noqa: BLE001 - the view must never take the job down
        return []
