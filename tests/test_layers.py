"""The package's layering, checked from the source against the layer table of docs/design.md
("Layers"), read from the page itself so that the map and this test cannot disagree:

- every module of rpcctl/ has a row in the table, and imports only from its own layer or
  the layers above its row (the table lists them bottom-up: nothing imports upward);
- no module imports another module's private name (``_x``, or a private module) outside the
  package that name lives in;
- no SQL outside the store's three modules, and only the SDK opens a ``StoreReader``;
- no import cycle anywhere in rpcctl/, and the launch core never imports the bench.

To see the layering: ``python -m pytest tests/test_layers.py -q -rA -k print`` prints each
layer and its modules, and who imports from which layer.

The graph is built with ``ast`` from every module's imports, at module level and inside
functions alike: a function-level import only delays a cycle, it does not remove it.
Imports under ``if TYPE_CHECKING:`` never run, so they are not edges.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rpcctl"
DESIGN = PACKAGE.parent / "docs" / "design.md"

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


@functools.cache  # parsing every module takes seconds on a loaded machine: once per session
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
    assert "rpcctl.launch.launcher" in graph["rpcctl.bench.runner"]  # function-level
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


# -- layer order, from docs/design.md -----------------------------------------------------------


def layer_table(text: str) -> list[tuple[str, list[str]]]:
    """The rows of the "Layers" table, bottom layer first: (layer, its modules). A cell names
    modules in backticks: ``config``, a package ``telemetry/`` (all of it); what a cell says in
    parentheses (a package's modules, a note) is for the reader and does not count."""
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        named = re.sub(r"\([^)]*\)", "", cells[1])
        rows.append((cells[0], re.findall(r"`([^`]+)`", named)))
    return rows


def layer_of_modules(rows: list[tuple[str, list[str]]], modules: list[str]) -> dict[str, tuple[int, str]]:
    """Each module → (its layer's index, bottom 0; the layer's name): the row naming the module
    itself or the closest package holding it. ``rpcctl`` (the package) is ``__init__``."""
    named: dict[str, tuple[int, str]] = {}
    for index, (layer, names) in enumerate(rows):
        for name in names:
            dotted = "rpcctl" if name == "__init__" else "rpcctl." + name.rstrip("/").replace("/", ".")
            assert dotted not in named, f"docs/design.md names {name} in two layers ({named[dotted][1]}, {layer})"
            named[dotted] = (index, layer)
    found = {}
    for module in modules:
        holder = module
        while holder not in named and "." in holder:  # the package rpcctl (``__init__``) holds no module
            holder = holder.rpartition(".")[0]
        if holder in named and (holder != "rpcctl" or module == "rpcctl"):
            found[module] = named[holder]
    return found


def upward_imports(graph: dict[str, set[str]], layers: dict[str, tuple[int, str]]) -> list[str]:
    return sorted(
        f"{name} ({layers[name][1]}) imports {imp} ({layers[imp][1]})"
        for name, imports in graph.items()
        for imp in imports
        if name in layers and imp in layers and layers[imp][0] > layers[name][0]
    )


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(modules: dict[str, Path]) -> list[str]:
    """``from rpcctl.x import _y`` (a private name, or a private module), or ``x._y`` through an
    imported module, in a module outside the package that holds ``_y``: a name meant for its own
    package only."""
    found = []
    for name, path in modules.items():
        package = _package_of(name, path)
        tree = ast.parse(path.read_text(), str(path))
        imported = {
            alias.asname or alias.name: f"{node.module}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and not node.level
            for alias in node.names
            if f"{node.module}.{alias.name}" in modules
        }
        for node in _runtime_nodes(tree):
            targets: list[tuple[str, str]] = []  # (the module that holds it, the private name)
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in imported
                and _private(node.attr)
            ):
                targets.append((imported[node.value.id], node.attr))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
                targets += [
                    (f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base, a.name)
                    for a in node.names
                    if _private(a.name)
                ]
                targets += [(base.rpartition(".")[0], part) for part in base.split(".")[-1:] if _private(part)]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    targets += [(".".join(parts[:i]), part) for i, part in enumerate(parts) if _private(part)]
            for holder, private in targets:
                if not holder.startswith("rpcctl") or holder not in modules:
                    continue
                home = (
                    _package_of(holder, modules[holder])
                    if not holder.endswith("." + private)
                    else holder.rpartition(".")[0]
                )
                if not _within(name, home):
                    found.append(f"{name} imports {private} from {holder}")
    return sorted(set(found))


def test_the_design_page_table_is_read():
    rows = layer_table(DESIGN.read_text())
    assert rows[0][0] == "base" and "base/" in rows[0][1]
    assert rows[-1][0] == "cli" and "commands/" in rows[-1][1]
    layers = layer_of_modules(rows, list(all_modules()))
    assert layers["rpcctl.commands.inspect"][1] == "cli"  # through its package
    assert layers["rpcctl.base.errors"][0] == 0


def test_every_module_has_a_layer_in_docs_design():
    modules = all_modules()
    layers = layer_of_modules(layer_table(DESIGN.read_text()), list(modules))
    missing = sorted(set(modules) - set(layers))
    assert not missing, "modules with no row in docs/design.md's layer table: " + ", ".join(missing)


LOOSE = {"rpcctl", "rpcctl.cli", "rpcctl.console", "rpcctl.__main__"}  # the only modules that are not in a folder


def folder_of(module: str) -> str:
    """``rpcctl.supervise.watchdog`` → ``rpcctl.supervise``; a loose module is its own."""
    parts = module.split(".")
    return ".".join(parts[:2])


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between rpcctl's folders (and its loose modules): an edge for every import
    that crosses from one to another."""
    folders: dict[str, set[str]] = {}
    for name, imports in graph.items():
        folders.setdefault(folder_of(name), set()).update(
            folder_of(i) for i in imports if folder_of(i) != folder_of(name)
        )
    return folders


def test_every_folder_is_a_row_and_nothing_else_is_loose():
    """``ls rpcctl`` shows the layers: each folder is a row of the table, named after it, and only
    LOOSE modules sit beside them."""
    modules = all_modules()
    loose = sorted(m for m in modules if m.count(".") == 1 and not (PACKAGE / (m.split(".")[1])).is_dir())
    assert sorted(set(loose) | {"rpcctl"}) == sorted(LOOSE), f"modules outside a folder: {sorted(set(loose) - LOOSE)}"
    rows = layer_table(DESIGN.read_text())
    named = {
        name.rstrip("/") for _, names in rows for name in names if name.endswith("/") and "/" not in name.rstrip("/")
    }
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert folders <= named, f"folders with no row in docs/design.md's layer table: {sorted(folders - named)}"
    misnamed = [
        (layer, names[0]) for layer, names in rows if names and names[0].endswith("/") and names[0].rstrip("/") != layer
    ]
    assert not misnamed, f"a layer is named after its folder (row, first folder): {misnamed}"


def test_folders_import_each_other_without_a_cycle():
    cycle = find_cycle(folder_graph(import_graph()))
    assert cycle is None, "folders that import each other: " + " → ".join(cycle)


def test_a_cycle_between_folders_is_found():
    graph = {"rpcctl.a.x": {"rpcctl.b.y"}, "rpcctl.b.y": set(), "rpcctl.b.z": {"rpcctl.a.w"}, "rpcctl.a.w": set()}
    assert find_cycle(folder_graph(graph)) == ["rpcctl.a", "rpcctl.b", "rpcctl.a"]


def test_nothing_imports_upward():
    layers = layer_of_modules(layer_table(DESIGN.read_text()), list(all_modules()))
    offenders = upward_imports(import_graph(), layers)
    assert not offenders, "imports upward (docs/design.md, Layers: bottom row first):\n" + "\n".join(offenders)


def test_an_upward_import_is_found():
    rows = [("low", ["a"]), ("high", ["b/"])]
    layers = layer_of_modules(rows, ["rpcctl.a", "rpcctl.b", "rpcctl.b.c"])
    assert upward_imports({"rpcctl.a": {"rpcctl.b.c"}, "rpcctl.b.c": {"rpcctl.a"}}, layers) == [
        "rpcctl.a (low) imports rpcctl.b.c (high)"
    ]


def test_no_private_name_is_imported_from_another_package():
    offenders = private_imports(all_modules())
    assert not offenders, (
        "private names used outside their package (make them public, in the lower layer):\n" + "\n".join(offenders)
    )


def test_print_the_layers():
    """The layering as a reader wants it: each layer, bottom first, with its modules and the
    layers it imports from (run with -rA, or -s, to see it)."""
    modules = all_modules()
    rows = layer_table(DESIGN.read_text())
    layers = layer_of_modules(rows, list(modules))
    graph = import_graph()
    lines = []
    for index, (layer, _names) in enumerate(rows):
        members = sorted(m for m, (i, _) in layers.items() if i == index)
        uses = sorted(
            {rows[layers[imp][0]][0] for m in members for imp in graph[m] if imp in layers and layers[imp][0] != index},
            key=lambda name: [r[0] for r in rows].index(name),
        )
        lines.append(f"{index:2d} {layer:<10} imports from: {', '.join(uses) or '-'}")
        lines.extend(f"     {m.removeprefix('rpcctl.') or 'rpcctl'}" for m in members)
    print("\n".join(lines))
    assert lines


# -- the store owns its SQL ---------------------------------------------------------------------

# the DDL; the writer; every read
SQL_HOMES = ("rpcctl.telemetry.schema", "rpcctl.telemetry.store", "rpcctl.telemetry.reader")
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|PRAGMA|WITH)\b|\b(FROM|WHERE|VALUES)\b.*\?")


def sql_outside_the_store(modules: dict[str, Path]) -> list[str]:
    """String constants that read as SQL, in modules other than the store's two."""
    found = []
    for name, path in modules.items():
        if name in SQL_HOMES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value):
                found.append(f"{name}:{node.lineno}: {node.value[:60]!r}")
    return found


def test_all_sql_lives_beside_the_store():
    offenders = sql_outside_the_store(all_modules())
    assert not offenders, (
        "SQL outside telemetry/schema.py, store.py and reader.py (add a StoreReader method):\n" + "\n".join(offenders)
    )


def test_sql_is_recognised():
    assert SQL.search("SELECT * FROM procs WHERE restart = ?") and SQL.search(
        " AND ended_at IS NULL FROM x WHERE a = ?"
    )
    assert not SQL.search("Select a transport") and not SQL.search("from the store, where it lands")


def test_only_the_sdk_reads_the_store():
    """Above the SDK, the store's rows come from ``rpcctl.inspect`` (a row's helpers, ``column``
    and ``loads``, may be used with them); only the SDK opens a ``StoreReader``."""
    readers = sorted(
        name
        for name, path in all_modules().items()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom)
        and node.module == "rpcctl.telemetry.reader"
        and any(alias.name == "StoreReader" for alias in node.names)
    )
    assert readers and all(_within(name, "rpcctl.inspect") for name in readers), (
        f"read the store through rpcctl.inspect: {readers}"
    )
