"""The package's layering, checked from the source: no import cycle anywhere in rpcctl/, and
the launch core never imports the bench (docs/design.md, "Layers").

The graph is built with ``ast`` from every module's imports, at module level and inside
functions alike: a function-level import only delays a cycle, it does not remove it.
Imports under ``if TYPE_CHECKING:`` never run, so they are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rpcctl"

# Who may import rpcctl.bench: the bench itself, the CLI that offers it, and the bench's own
# page (rpcctl.web.bench, which only the report command loads).
MAY_IMPORT_BENCH = ("rpcctl.bench", "rpcctl.commands", "rpcctl.cli", "rpcctl.__main__", "rpcctl.web.bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The rpcctl modules that ``name`` imports (``from pkg import sub`` counts as ``pkg.sub``
    when ``sub`` is a module, else as ``pkg``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {imp for imp in found if imp in modules and imp != name}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as its modules in order (first repeated at the end), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    trail: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        trail.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == GREY:
                return trail[trail.index(nxt) :] + [nxt]
            if colour[nxt] == WHITE and (cycle := visit(nxt)):
                return cycle
        trail.pop()
        colour[node] = BLACK
        return None

    for start in sorted(graph):
        if colour[start] == WHITE and (cycle := visit(start)):
            return cycle
    return None


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_graph_sees_module_and_function_level_imports():
    graph = import_graph()
    assert "rpcctl.launcher" in graph["rpcctl.bench.runner"]  # function-level
    assert "rpcctl.bench.suites" in graph["rpcctl.bench.runner"]  # module-level
    assert "rpcctl.rank.reporter" in graph["rpcctl"]  # function-level, in a package __init__


def test_find_cycle_names_the_modules_of_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_rpcctl():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_only_the_bench_and_the_cli_import_the_bench():
    # Transitively: the launch core must not reach the bench through a module that may.
    graph = import_graph()
    offenders = sorted(
        f"{name} reaches {imp}"
        for name in graph
        if not any(_within(name, allowed) for allowed in MAY_IMPORT_BENCH)
        for imp in reachable(graph, name)
        if _within(imp, "rpcctl.bench")
    )
    assert not offenders, "the launch core must not import the bench:\n" + "\n".join(offenders)
