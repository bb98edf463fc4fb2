"""``rpcctl runs``, ``rpcctl logs``, ``rpcctl stop``: the run records under the runs directory."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Annotated

import typer
from rich.text import Text

from rpcctl.launch import control
from rpcctl.commands.common import (
    FilterOption,
    JsonOption,
    RankOption,
    RunArgument,
    RunsDirOption,
    WideOption,
    filtered_empty,
    parse_filters,
    scalar_fields,
)
from rpcctl.console import get_console, render_table, sanitize, utc_stamp
from rpcctl.base.errors import UsageError
from rpcctl.base.log_times import FollowedFile, LogLine, RankLogReader, lines_of, merged
from rpcctl.records.runs import (
    DamagedRun,
    RunRecord,
    default_runs_dir,
    list_runs,
    load_record,
    rank_log,
    resolve_run,
    scan_runs,
    short,
)
from rpcctl.base.states import RunStatus


def runs(
    runs_dir: RunsDirOption = None,
    json_: JsonOption = False,
    limit: Annotated[
        int, typer.Option("--limit", help="Show at most this many runs (0: all; default: 20).", show_default=False)
    ] = 20,
    filter_: FilterOption = None,
    wide: WideOption = False,
) -> None:
    """List runs, newest first (damaged records last, with their path). Each run once, by its
    real directory: a symbolic link in the runs directory is another name for its run. --wide
    adds the command line each was launched with (COMMAND). A run of several nodes whose nodes
    share this runs directory is listed once, as its node 0."""
    console = get_console()
    filters = parse_filters(filter_, RunRecord.COLUMNS, scalar_fields(RunRecord))
    records, damaged = scan_runs(runs_dir or default_runs_dir())
    records, node_dirs = _one_per_run(records)
    lost = control.lost_runs(records)
    rows = {r.run_id: _row(r, lost) for r in records}
    records = [r for r in records if all(f.matches(rows[r.run_id]) for f in filters)]
    damaged = [d for d in damaged if all(f.matches(_damaged_row(d)) for f in filters)]
    if limit:
        records = records[:limit]
    if json_:
        documents = []
        for record in records:
            document = record.to_dict()
            document["status"] = record.effective_status
            document["orphaned_pids"] = [p.pid for p in lost[record.run_id].orphans] if record.run_id in lost else []
            document["node_dirs"] = node_dirs[record.run_id]  # each node's run directory under this runs directory
            documents.append(document)
        documents += [
            {"run_id": d.run_id, "status": RunStatus.DAMAGED, "run_dir": str(d.run_dir), "error": d.error}
            for d in damaged
        ]
        console.json(documents)
        return
    shown = [rows[r.run_id] for r in records] + [_damaged_row(d) for d in damaged]
    empty = filtered_empty("runs", filters) or f"no runs in {runs_dir or default_runs_dir()}"
    console.print(render_table(shown, RunRecord.COLUMNS, empty=empty, hint="--json shows them", detail=wide))
    for d in damaged:  # the whole path, which the table would cut
        console.print(Text(sanitize(f"damaged: {d.run_dir / 'run.json'}: {d.error}")))


def _one_per_run(records: list[RunRecord]) -> tuple[list[RunRecord], dict[str, list[str]]]:
    """A run of several nodes is one run: where its nodes share this host and runs directory
    (``RUN`` and ``RUN.node1``), it is listed once, by its lowest node's record (node 0's, which
    the job's outcome is told to); ``node_dirs``: each node's directory, by run id."""
    kept: dict[str, RunRecord] = {}
    node_dirs: dict[str, list[str]] = {}
    for record in records:
        node_dirs.setdefault(record.run_id, []).append(record.run_dir)
        if record.run_id not in kept or record.node_rank < kept[record.run_id].node_rank:
            kept[record.run_id] = record
    return [r for r in records if kept[r.run_id] is r], {k: sorted(v) for k, v in node_dirs.items()}


def _row(record: RunRecord, lost: dict) -> dict:
    """A run as ``runs`` shows it (and ``--filter`` reads it): its record's keys and columns, the status
    as it reads now, a lost run's story as its cause when it has none."""
    row = {**record.to_dict(), **{c.key: c.value(record) for c in RunRecord.COLUMNS}}
    row["status"] = record.effective_status
    if record.run_id in lost and not row["cause"]:
        row["cause"] = lost[record.run_id].short()
    return row


def _damaged_row(damaged: DamagedRun) -> dict:
    return {"run_id": damaged.run_id, "status": RunStatus.DAMAGED, "cause": short(damaged.error)}


def logs(
    run: RunArgument = None,
    rank: RankOption = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output until the run ends.")
    ] = False,
    merge: Annotated[
        bool,
        typer.Option("--merge", help="Interleave the ranks' lines in the order they arrived (default: rank by rank)."),
    ] = False,
    timestamps: Annotated[
        bool, typer.Option("--timestamps", help="Put before each line the UTC time the launcher read it (to 10 ms).")
    ] = False,
    raw: Annotated[
        bool,
        typer.Option("--raw", help="The log bytes exactly as written: no rank prefix, escape sequences untouched."),
    ] = False,
    runs_dir: RunsDirOption = None,
) -> None:
    """Print a run's rank logs, each line prefixed with its rank (other terminal escape
    sequences shown as text; --raw for the bytes as written). --merge interleaves the ranks
    in the order their lines arrived."""
    if raw and (merge or timestamps):
        raise UsageError("--raw prints the log bytes as written: it takes neither --merge nor --timestamps")
    run_dir = resolve_run(run, runs_dir)
    record = load_record(run_dir)
    ranks = [s.rank for s in record.ranks]
    for asked in rank or ():
        if asked not in ranks:
            raise UsageError(f"--rank {asked}: run {record.run_id} has ranks 0-{len(ranks) - 1}")
    if rank:
        ranks = [r for r in ranks if r in rank]

    def replaced(r: int) -> Callable[[str], None]:
        return lambda what: get_console().info(f"rpcctl: rank {r}'s log {rank_log(run_dir, r)} {what}")

    if raw:
        files = [FollowedFile(rank_log(run_dir, r), replaced(r)) for r in ranks]

        def print_round(ended: bool) -> None:
            for f in files:
                for block in f.blocks():
                    get_console().raw_bytes(block)
                if ended:
                    f.close()
    else:
        readers = [RankLogReader(r, rank_log(run_dir, r), on_replaced=replaced(r)) for r in ranks]

        def print_round(ended: bool) -> None:
            streams = [lines_of(reader, final=ended) for reader in readers]  # a run that ended has no line half-written
            _print_lines(merged(streams) if merge else itertools.chain(*streams), timestamps)

    for ended in control.follow(run_dir, every=0.2):
        print_round(ended)
        if not follow:
            return


def _print_lines(lines: Iterable[LogLine], timestamps: bool) -> None:
    console = get_console()
    batch: list[str] = []
    for line in lines:
        stamp = f"{_stamp(line.time)} " if timestamps else ""
        batch.append(f"{stamp}[rank{line.rank}]: {sanitize(line.text, sgr=True)}\n")
        if len(batch) >= 512:  # a long log streams out in bounded memory
            console.raw("".join(batch))
            batch.clear()
    if batch:
        console.raw("".join(batch))


def _stamp(moment: float | None) -> str:
    if moment is None:  # a run from before the time index, or one whose index was lost
        return "-".ljust(24)
    return utc_stamp(moment)


def stop(
    run: RunArgument = None,
    runs_dir: RunsDirOption = None,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for the run to end (default: 60).", show_default=False)
    ] = 60.0,
) -> None:
    """Cancel a live run cleanly (SIGTERM to its launcher, which tears the ranks down)."""
    console = get_console()
    if run is None:
        live = [r for r in list_runs(runs_dir or default_runs_dir()) if r.effective_status == RunStatus.RUNNING]
        if len(live) > 1:
            raise UsageError(
                f"{len(live)} runs are live; name the one to stop: `rpcctl stop RUN` with RUN one of "
                + ", ".join(r.run_id for r in live)
            )
    stopped = control.stop(resolve_run(run, runs_dir), wait)
    record, lost = stopped.record, stopped.lost
    if lost is None:
        console.info(f"rpcctl: run {record.run_id} {record.status}")
        return
    # A run left ``running`` by a launcher that died: what it left alive (the run's own
    # processes only: this user's, carrying its id) was killed, its record closed.
    killed = len(lost.orphans)
    did = (
        f"killed {killed} orphaned process{'es' if killed != 1 else ''} (pid "
        f"{', '.join(str(p.pid) for p in lost.orphans)})"
        if killed
        else "nothing was left to kill"
    )
    console.info(
        f"rpcctl: run {record.run_id} was lost: its launcher (pid {record.launcher_pid}) is gone; {did}; record closed "
        "(status lost)"
    )
