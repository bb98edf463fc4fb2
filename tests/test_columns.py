"""Columns declared once, beside the record's fields: every view's column keys exist on its
record (a dataclass field or a property), found from the source so a new view is checked too;
and ``--filter KEY=VALUE`` parses against those columns, on real runs through the CLI."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from conftest import launch_job, record, rpcctl
from rpcctl.console import Column

PACKAGE = Path(__file__).resolve().parent.parent / "rpcctl"


def attributes(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} | {
        n for n in dir(cls) if isinstance(getattr(cls, n, None), property)
    }


def missing_keys(cls: type, columns) -> list[str]:
    return [c.key for c in columns if c.key not in attributes(cls)]


def declared_views() -> dict[str, tuple[type, list[Column]]]:
    """``module.Class`` → (the class, its columns): every class in rpcctl/ that declares
    ``COLUMNS``, and the bench's per-suite columns (over ``BenchResult``)."""
    views = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            for stmt in node.body:
                targets = (
                    stmt.targets
                    if isinstance(stmt, ast.Assign)
                    else [stmt.target]
                    if isinstance(stmt, ast.AnnAssign)
                    else []
                )
                if any(isinstance(t, ast.Name) and t.id == "COLUMNS" for t in targets):
                    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
                    cls = getattr(importlib.import_module(module), node.name)
                    views[f"{module}.{node.name}"] = (cls, list(cls.COLUMNS))
    from rpcctl.bench.results import SUITE_COLUMNS, BenchResult

    for suite, columns in SUITE_COLUMNS.items():
        views[f"bench suite {suite}"] = (BenchResult, list(columns))
    return views


VIEWS = declared_views()


def test_every_view_is_found():
    names = {name.rsplit(".", 1)[-1] for name in VIEWS}
    assert {
        "RunRecord",
        "WorkerRecord",
        "RRefRecord",
        "OwnerSummary",
        "LossSummary",
        "PendingCall",
        "Comparison",
    } <= names
    assert "bench suite latency" in VIEWS


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_every_column_key_exists_on_its_record(name):
    cls, columns = VIEWS[name]
    assert dataclasses.is_dataclass(cls), name
    assert columns, name
    assert missing_keys(cls, columns) == [], f"{name}: columns without a field or property"
    assert len({c.key for c in columns}) == len(columns), f"{name}: a key declared twice"


def test_a_wrong_key_is_caught():
    from rpcctl.records.runs import RunRecord

    assert missing_keys(RunRecord, [*RunRecord.COLUMNS, Column("duraton")]) == ["duraton"]


@pytest.mark.timeout(90)
def test_filters_parse_against_the_declared_columns(tmp_path, runs_dir):
    ok, ok_dir, _ = launch_job(tmp_path, runs_dir, nproc_per_node=1, name="good", args=["0=ok"])
    # a second job's run directory: launch_job wants one run per directory, so move the first aside
    failed, failed_dir, _ = launch_job(
        tmp_path, tmp_path / "other", nproc_per_node=2, name="bad", args=["1=exit:3", "0=hang"]
    )
    failed_dir = failed_dir.rename(runs_dir / failed_dir.name)
    assert (ok.returncode, failed.returncode) == (0, 1)
    where = ("--runs-dir", str(runs_dir))

    table = rpcctl("runs", *where, "--filter", "status=failed")
    assert table.returncode == 0, table.stderr
    assert [line.split()[:3] for line in table.stdout.splitlines()[1:]] == [[failed_dir.name, "bad", "failed"]]
    both = rpcctl("runs", *where, "--filter", "status=failed", "--filter", "name=good")
    assert (both.returncode, both.stdout) == (0, "no runs match status=failed, name=good\n")
    documents = json.loads(rpcctl("runs", *where, "--json", "--filter", "name=good").stdout)
    assert [(d["run_id"], d["status"]) for d in documents] == [(ok_dir.name, "succeeded")]
    assert json.loads(rpcctl("runs", *where, "--json", "--filter", "status=cancelled").stdout) == []

    empty = rpcctl("runs", *where, "--filter", "status=cancelled")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "no runs match status=cancelled\n", "")
    unknown = rpcctl("runs", *where, "--filter", "state=failed")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr.startswith(
        "error: --filter 'state=failed': unknown key 'state' (valid keys: run_id, name, status, "
        "world_size, started_at, duration_s, restarts, round, cause, "
    ), unknown.stderr
    # the record's keys too
    assert unknown.stderr.endswith(", max_restarts, reason, exit_code; or a column's header)\n"), unknown.stderr
    malformed = rpcctl("runs", *where, "--filter", "status")
    assert malformed.returncode == 2 and "expected KEY=VALUE, KEY!=VALUE or KEY>N" in malformed.stderr
    for spec in ("restarts>", "restarts>nan", "duration_s<=-inf"):
        nothing = rpcctl("runs", *where, "--filter", spec)
        assert nothing.returncode == 2 and "needs a number or a time to compare with" in nothing.stderr, (
            spec,
            nothing.stderr,
        )

    def names(*filters: str) -> list[str]:
        args = [arg for f in filters for arg in ("--filter", f)]
        return sorted(d["name"] for d in json.loads(rpcctl("runs", *where, "--json", *args).stdout))

    assert names("status!=failed") == ["good"] and names("status!=damaged") == ["bad", "good"]
    assert names("world_size>=2") == ["bad"] and names("world_size<2") == ["good"] and names("world_size>2") == []
    assert names("RANKS=2") == ["bad"] and names("ranks > 1") == ["bad"]  # a column's header, any case
    assert names("duration>0", "duration_s<3600") == ["bad", "good"]  # numbers in raw units
    assert names("nnodes=1") == ["bad", "good"]  # a key of the record that no column shows
    first, second = sorted([record(ok_dir)["started_at"], record(failed_dir)["started_at"]])
    assert names(f"started_at>{first}") == ["bad"] and names(f"started_at>={first}", f"started_at<={second}") == [
        "bad",
        "good",
    ]
    table = rpcctl("runs", *where, "--filter", "duration_s>1e9", "--filter", "status!=failed")
    assert (table.returncode, table.stdout) == (0, "no runs match duration_s>1e9, status!=failed\n")

    # inspect workers: the same grammar over WorkerRecord.COLUMNS
    workers = json.loads(rpcctl("inspect", "workers", str(failed_dir), "--json", "--filter", "state=failed").stdout)
    assert [(w["rank"], w["state"]) for w in workers] == [(1, "failed")]
    none = rpcctl("inspect", "workers", str(failed_dir), "--filter", "state=succeeded")
    assert (none.returncode, none.stdout.splitlines()[0]) == (0, "no workers match state=succeeded")
    bad = rpcctl("inspect", "workers", str(failed_dir), "--filter", "ranq=1")
    assert bad.returncode == 2 and "unknown key 'ranq' (valid keys: world, rank, name, kind," in bad.stderr
    # a key of --json
    ranks = json.loads(rpcctl("inspect", "workers", str(failed_dir), "--json", "--filter", "rank=1").stdout)
    assert [(w["rank"], w["state"]) for w in ranks] == [(1, "failed")]
    below = json.loads(
        rpcctl("inspect", "workers", str(failed_dir), "--json", "--filter", "exit_code!=3", "--filter", "pid>1").stdout
    )
    assert [w["rank"] for w in below] == [0]
    assert (
        len(json.loads(rpcctl("inspect", "workers", str(failed_dir), "--json", "--filter", "stale=false").stdout)) == 2
    )


def test_a_long_filter_without_an_operator_is_refused_at_once():
    # The first parser, a regex with a lazy KEY, backtracked for minutes on 40,000 spaces.
    from rpcctl.commands.common import parse_filters
    from rpcctl.base.errors import UsageError
    from rpcctl.records.runs import RunRecord

    for spec in (" " * 100_000 + "x", "k" * 100_000, "!" * 100_000):
        with pytest.raises(UsageError, match="expected KEY=VALUE"):
            parse_filters([spec], RunRecord.COLUMNS)
    assert [str(f) for f in parse_filters([" " * 100_000 + "status = failed"], RunRecord.COLUMNS)] == ["status=failed"]


def test_display_fields_are_not_filter_keys():
    """RANK shows ``rank_shown`` (``└`` for a child): a filter on RANK, or on ``rank``, compares the
    rank itself, and ``rank_shown`` / ``name_shown`` are no filter keys."""
    from rpcctl.commands.common import keep, parse_filters, scalar_fields
    from rpcctl.base.errors import UsageError
    from rpcctl.inspect import WorkerRecord

    fields = scalar_fields(WorkerRecord)
    for spec in ("rank_shown=1", "name_shown=worker1"):
        with pytest.raises(UsageError, match=r"valid keys: world, rank, name, kind,") as refused:
            parse_filters([spec], WorkerRecord.COLUMNS, fields)
        assert "_shown" not in str(refused.value).split("valid keys:")[1]
    by_header, by_key = (
        parse_filters(["RANK=1"], WorkerRecord.COLUMNS, fields),
        parse_filters(["rank=1"], WorkerRecord.COLUMNS, fields),
    )
    assert [f.column.key for f in by_header + by_key] == ["rank", "rank"]
    blank = {f.name: None for f in dataclasses.fields(WorkerRecord) if f.default is dataclasses.MISSING}
    rank1, child = (
        WorkerRecord(**{**blank, "rank": 1, "kind": "rank", "name": "w1"}),
        WorkerRecord(**{**blank, "rank": 1, "kind": "child"}),
    )
    other = WorkerRecord(**{**blank, "rank": 2, "kind": "rank", "name": "w2"})
    assert keep([rank1, child, other], by_header) == [rank1, child]  # a child is its rank's, though RANK shows └
    assert keep([rank1, child, other], parse_filters(["NAME=w2"], WorkerRecord.COLUMNS, fields)) == [other]


def test_a_display_column_names_a_field_of_its_record():
    for name, (cls, columns) in VIEWS.items():
        assert all(c.shows in attributes(cls) for c in columns if c.shows), name
