"""``rpcctl report [RUN|BENCH.json] -o FILE`` and ``rpcctl web [RUN]``: a run as a web page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rpcctl.commands.common import RunArgument, RunsDirOption, check_output, output_option, write_output
from rpcctl.console import get_console
from rpcctl.base.errors import UsageError
from rpcctl.records.runs import resolve_run

TargetArgument = Annotated[
    Optional[str],
    typer.Argument(
        metavar="RUN|BENCH.json",
        help="Run id (or a unique prefix), run directory, or a bench result file (default: the latest run).",
        show_default=False,
    ),
]


def report(
    target: TargetArgument = None,
    output: Annotated[
        Path, output_option("The HTML file to write, self-contained: it opens with no network (default: report.html).")
    ] = Path("report.html"),
    all_: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Draw every metric's chart with every point (by default: the first 16 metrics, loss first, 100,000 "
            "points in all; the file can then be tens of MB).",
        ),
    ] = False,
    runs_dir: RunsDirOption = None,
) -> None:
    """Write one self-contained HTML page of a run (summary, losses, RRef graph, placement,
    workers, timeline) or of a bench result. Needs: pip install 'rpcctl[report]'."""
    from rpcctl.web import page

    page.require_plotly()
    check_output(output, "--output")  # before the work: /dev/null, a FIFO, a link or a full disk is refused at once
    if target is not None and Path(target).is_file():
        from rpcctl.web.bench import bench_view

        view, sections = bench_view(Path(target))
        html = page.render(view, sections)
    else:
        html = page.render(page.run_view(resolve_run(target, runs_dir), complete=all_))
    write_output(output, html, "--output")  # the run owner's alone (0600), as the run's files
    get_console().info(f"rpcctl: wrote {output}")


def web(
    run: RunArgument = None,
    port: Annotated[
        int,
        typer.Option(
            "--port", min=0, max=65535, help="Port on 127.0.0.1 (default: 0, a free one).", show_default=False
        ),
    ] = 0,
    runs_dir: RunsDirOption = None,
) -> None:
    """Serve a run's page live on 127.0.0.1 (it follows a running job) until Ctrl-C."""
    from rpcctl.web.server import LiveServer

    run_dir = resolve_run(run, runs_dir)
    try:
        server = LiveServer(run_dir, port=port)
    except OSError as exc:  # in use, or below 1024 without the right
        raise UsageError(
            f"--port {port}: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc} (another port, or 0 for a free "
            "one)"
        ) from None
    get_console().info(f"rpcctl: live page of {run_dir.name} at {server.url} (Ctrl-C to stop)")
    server.serve_forever()
