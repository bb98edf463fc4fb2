"""The live view of ``rpcctl launch`` on a terminal: rank output scrolls above, a status panel
(ranks, plus telemetry panels when available) stays pinned below it."""

from __future__ import annotations

import os
import sys
import termios
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rpcctl import stacks
from rpcctl.console import sanitize
from rpcctl.states import RankStatus

if TYPE_CHECKING:
    from rpcctl.supervisor import Supervisor

STATE_STYLE = {RankStatus.PENDING: "dim", RankStatus.RUNNING: "cyan", RankStatus.SUCCEEDED: "green", RankStatus.FAILED: "bold red",
               RankStatus.KILLED: "yellow", RankStatus.STOPPED: "bold yellow"}


class LiveView:
    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.started = time.monotonic()
        # Raw writes to the launcher's stderr (a Python warning, a library's print) go through
        # the live console too, above the panel (rpcctl's own messages: see start()).
        self._live = Live(self, console=supervisor.console.out, refresh_per_second=4, transient=False, redirect_stdout=False, redirect_stderr=True)
        self.console = self._live.console

    def start(self) -> None:
        self._keep_output_on_ctrl_c()
        self._live.start()
        # The launcher's own messages (Ctrl-C, restarts, warnings) go through the live console
        # while the panel is drawn, so they print above it; written straight to the terminal
        # they would land inside the panel and leave a stale copy of it behind.
        console = self.supervisor.console
        self._messages_console = console.err
        if console.err.is_terminal:
            console.err = self.console

    def stop(self) -> None:
        self._live.stop()
        self.supervisor.console.err = self._messages_console
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
        sup = self.supervisor
        record = sup.record
        elapsed = time.monotonic() - self.started
        restarts = f"  restarts {record.restarts}/{record.max_restarts}" if record.max_restarts else ""
        table = Table(
            title=Text(f"{record.name}  {record.run_id}  {elapsed:.0f}s{restarts}", style="italic"),
            title_justify="left",
            box=None,
            header_style="bold",
            pad_edge=False,
        )
        for column in ("RANK", "PID", "STATE", "DEVICE", "EXIT", "LAST LINE"):
            table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=60 if column == "LAST LINE" else None)
        # Text cells, never markup strings: a rank's output is arbitrary text ("[epoch 1]"),
        # and a print(markup=False) while the panel is up renders the panel without markup.
        for state in record.ranks:
            exit_text = state.signal or ("" if state.exit_code is None else str(state.exit_code))
            shown = RankStatus.STOPPED if state.state == RankStatus.RUNNING and state.pid and stacks.stopped(state.pid) else state.state
            table.add_row(
                Text(str(state.rank)),
                Text(str(state.pid or "-")),
                Text(shown, style=STATE_STYLE.get(shown, "")),
                Text(state.device),
                Text(exit_text),
                Text(sanitize(sup.latest_line(state.rank))),
            )
        parts = [table]
        parts.extend(_telemetry_panels(Path(record.run_dir)))
        return Group(*parts)


def _telemetry_panels(run_dir: Path) -> list:
    from rpcctl.telemetry.dashboard import dashboard_panels

    try:
        return list(dashboard_panels(run_dir))
    except Exception:  # noqa: BLE001 - the view must never take the job down
        return []


