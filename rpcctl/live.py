"""The live view of ``rpcctl launch`` on a terminal: rank output scrolls above, a status panel
(ranks, plus telemetry panels when available) stays pinned below it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rpcctl.console import sanitize
from rpcctl.states import RankStatus

if TYPE_CHECKING:
    from rpcctl.supervisor import Supervisor

STATE_STYLE = {RankStatus.PENDING: "dim", RankStatus.RUNNING: "cyan", RankStatus.SUCCEEDED: "green", RankStatus.FAILED: "bold red",
               RankStatus.KILLED: "yellow"}


class LiveView:
    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.started = time.monotonic()
        # Raw writes to the launcher's stderr (a Python warning, a library's print) go through
        # the live console too, above the panel (rpcctl's own messages: see start()).
        self._live = Live(self, console=supervisor.console.out, refresh_per_second=4, transient=False, redirect_stdout=False, redirect_stderr=True)
        self.console = self._live.console

    def start(self) -> None:
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
            table.add_row(
                Text(str(state.rank)),
                Text(str(state.pid or "-")),
                Text(state.state, style=STATE_STYLE.get(state.state, "")),
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


