"""The package's import graph, read from the source with ``ast`` (every import counts:
module level, inside functions, and under ``if TYPE_CHECKING``)."""

from __future__ import annotations

import ast
from pathlib import Path

import langgraph_deterministic

ROOT = Path(langgraph_deterministic.__file__).resolve().parent
PACKAGE = "langgraph_deterministic"


def modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module under ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from pkg import mod`` names ``mod``)."""
    mods = modules(root)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in mods.items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        targets = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    target = submodule if submodule in mods else source
                    if target in mods:
                        targets.add(target)
        targets.discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    saver = f"{PACKAGE}.checkpointer.saver"
    assert f"{PACKAGE}.errors" in graph[saver]  # absolute
    assert f"{PACKAGE}.runner._ordering" in graph[f"{PACKAGE}.runner._runner"]  # relative
    assert f"{PACKAGE}.ops.cli" in graph[f"{PACKAGE}.cli"]  # in a def only
    assert f"{PACKAGE}.ops.repair" in graph[f"{PACKAGE}.ops.cli"]  # under TYPE_CHECKING (too)
    assert f"{PACKAGE}._db.migrate" in graph[f"{PACKAGE}.checkpointer.saver"]  # import as


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle() -> None:
    """A cycle, even one broken at runtime by ``TYPE_CHECKING`` or a function-level import,
    means two modules that cannot be understood (or moved) apart."""
    assert cycles(import_graph()) == []


def private_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, module) for every import of a package's underscore module (or of a
    module inside an underscore package) from outside that package: ``a.b._c`` may be
    imported by ``a.b`` and what is below it, nothing else."""
    found = []
    for importer, targets in graph.items():
        for target in targets:
            parts = target.split(".")
            for i, part in enumerate(parts[1:], start=1):
                owner = ".".join(parts[:i])
                private = part.startswith("_") and not part.startswith("__")
                if private and not (importer == owner or importer.startswith(owner + ".")):
                    found.append((importer, target))
                    break
    return sorted(found)


def test_private_imports_finds_a_reach_into_another_package() -> None:
    graph = {
        "p.runner.journal": {"p.checkpointer._core", "p._db.batch", "p.runner._context"},
        "p.ops.audit": {"p._db._internal.x"},
        "p.checkpointer.saver": {"p.checkpointer._core", "p._db._internal.x"},
        "p._db.drivers": {"p._db._internal.x"},
    }
    assert private_imports(graph) == [
        ("p.checkpointer.saver", "p._db._internal.x"),
        ("p.ops.audit", "p._db._internal.x"),
        ("p.runner.journal", "p.checkpointer._core"),
    ]


def test_no_module_imports_another_packages_underscore_modules() -> None:
    """Each package keeps its underscore modules to itself; what others use goes through
    its public modules (``checkpointer.saver``, ``checkpointer.contract``, ``ops.cli``)
    or lives in a layer below both (``_db``, ``_compat``, ``_messages``: underscore
    names of the root package, for its subpackages only). See
    docs/explanation/architecture.md, "Who may import whom"."""
    assert private_imports(import_graph()) == []
