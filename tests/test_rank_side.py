"""The rank side is one package, ``rpcctl.rank`` (docs/design.md, "Layers"): what runs inside a
rank and the processes it starts. Checked from the source, with the import graph of
tests/test_layers.py (module- and function-level imports alike):

- the launcher side never imports it: it names ``rpcctl.rank.runtime`` as a string (the rank's
  command line, the rank server's forked child). The one exception is ``rpcctl.report()``, the
  public call a user's script makes inside a rank (``rpcctl/__init__.py``, function-level);
- it imports nothing of the launcher side: only itself, the leaves, and the wire code both
  sides share.
"""

from __future__ import annotations

from test_layers import import_graph

RANK = "rpcctl.rank"
# What may import the rank package from outside it: the package root, for rpcctl.report().
MAY_IMPORT_RANK = {"rpcctl"}
# What the rank package may import besides itself: the leaves and the shared wire code.
RANK_MAY_IMPORT = ("rpcctl.base", "rpcctl.wire")  # folders: what every part may import, and what both sides speak


def _in_rank(name: str) -> bool:
    return name == RANK or name.startswith(RANK + ".")


def launcher_imports_of_rank(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{name} imports {imp}"
        for name, imps in graph.items()
        if not _in_rank(name) and name not in MAY_IMPORT_RANK
        for imp in imps
        if _in_rank(imp)
    )


def rank_imports_of_launcher(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{name} imports {imp}"
        for name, imps in graph.items()
        if _in_rank(name)
        for imp in imps
        if not _in_rank(imp) and not any(imp == f or imp.startswith(f + ".") for f in RANK_MAY_IMPORT)
    )


def test_the_rank_package_is_where_the_rank_side_is():
    graph = import_graph()
    assert "rpcctl.rank.reporter" in graph["rpcctl.rank.runtime"]  # function-level
    assert "rpcctl.wire.protocol" in graph["rpcctl.rank.reporter"]
    assert "rpcctl.rank.reporter" in graph["rpcctl"]  # rpcctl.report()


def test_the_launcher_side_never_imports_the_rank_package():
    offenders = launcher_imports_of_rank(import_graph())
    assert not offenders, "the launcher side must name the rank package, not import it:\n" + "\n".join(offenders)


def test_the_rank_package_imports_nothing_of_the_launcher_side():
    offenders = rank_imports_of_launcher(import_graph())
    assert not offenders, "the rank package may import only itself, the leaves and the shared wire code:\n" + "\n".join(
        offenders
    )


def test_a_planted_import_either_way_is_named():
    graph = {name: set(imps) for name, imps in import_graph().items()}
    graph["rpcctl.supervise.supervisor"].add("rpcctl.rank.calls")
    graph["rpcctl.rank.rrefs.sender"].add("rpcctl.telemetry.store")
    assert launcher_imports_of_rank(graph) == ["rpcctl.supervise.supervisor imports rpcctl.rank.calls"]
    assert rank_imports_of_launcher(graph) == ["rpcctl.rank.rrefs.sender imports rpcctl.telemetry.store"]
