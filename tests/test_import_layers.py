"""The house's import rules (docs/design.md, "Packages and layers"), read from the source.

Each package has a rank; a module may import only packages of a lower rank, or modules of its
own package. Every import counts, the ones inside functions too: a lazy import hides a
dependency from the reader but not from the packaging. Nor may modules import each other in a
circle inside a package, lazily or not (Python tolerates some circles; a reader should not
have to).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("eviction", "predictor", "training", "lpc")

# Lower ranks first; the same list, with what each package holds, is in docs/design.md.
RANKS: dict[str, int] = {
    "eviction": 0,
    "predictor": 0,
    "training": 1,
    "lpc.blocks": 1,
    "lpc.integrations": 2,
    "lpc": 2,  # the root modules: lpc/__init__.py, errors.py, workload.py
    "lpc.traces": 3,
    "lpc.chat": 3,
    "lpc.replay": 4,
    "lpc.difftest": 5,
    "lpc.fleet": 5,
    "lpc.access": 6,
    "lpc.drivers": 6,
    "lpc.benchmarks": 6,
    "lpc.cli": 7,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules() -> dict[str, Path]:
    found = {}
    for top in TOP_PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            found[module_name(path)] = path
    return found


MODULES = product_modules()


def group_of(module: str) -> str:
    """The ranked package a module belongs to: the longest name in RANKS that prefixes it."""
    best = ""
    for name in RANKS:
        if (module == name or module.startswith(name + ".")) and len(name) > len(best):
            best = name
    assert best, f"{module} belongs to no package of RANKS: add it there and to docs/design.md"
    return best


def imported_modules(node: ast.AST) -> list[str]:
    """The project modules one import statement names (`from pkg import mod` names pkg.mod)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [
            f"{node.module}.{alias.name}"
            if f"{node.module}.{alias.name}" in MODULES
            else node.module
            for alias in node.names
        ]
    else:
        return []
    return [name for name in names if name.split(".")[0] in TOP_PACKAGES]


def statements(nodes: list[ast.stmt]):
    """Every statement, nested ones included (function, class, if, loop, with, try and match
    bodies): an import is a statement, so the expressions, which `ast.walk` would visit as
    well (nine nodes in ten), cannot hold one."""
    for node in nodes:
        yield node
        for field in ("body", "orelse", "finalbody"):
            yield from statements(getattr(node, field, ()))
        for handler in getattr(node, "handlers", ()):
            yield from statements(handler.body)
        for case in getattr(node, "cases", ()):
            yield from statements(case.body)


@functools.cache
def imports(path: Path) -> frozenset[str]:
    """The project modules `path` imports, parsed once per process (two tests walk them all)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return frozenset(name for node in statements(tree.body) for name in imported_modules(node))


def layer_violations() -> list[str]:
    found = []
    for module, path in MODULES.items():
        group = group_of(module)
        for target in sorted(imports(path)):
            target_group = group_of(target)
            if target_group != group and RANKS[target_group] >= RANKS[group]:
                found.append(
                    f"{path.relative_to(ROOT)}: {group} (rank {RANKS[group]}) imports {target} "
                    f"({target_group}, rank {RANKS[target_group]})"
                )
    return found


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graph is a few hundred nodes
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_every_package_imports_only_lower_layers() -> None:
    assert layer_violations() == []


def test_no_import_circle() -> None:
    graph = {
        module: {target for target in imports(path) if target in MODULES}
        for module, path in MODULES.items()
    }
    assert import_circles(graph) == []


def test_statements_reach_every_nested_import() -> None:
    source = (
        "import PKG.a\n"
        "def f():\n    import PKG.b\n    class C:\n        import PKG.c\n"
        "if x:\n    import PKG.d\nelse:\n    import PKG.e\n"
        "for _ in y:\n    pass\nelse:\n    import PKG.f\n"
        "while x:\n    import PKG.g\n"
        "with x:\n    import PKG.h\n"
        "try:\n    import PKG.i\nexcept E:\n    import PKG.j\nelse:\n    import PKG.k\n"
        "finally:\n    import PKG.l\n"
        "match x:\n    case 1:\n        import PKG.m\n"
        "async def g():\n    async with x:\n        async for _ in y:\n            import PKG.n\n"
    )
    tree = ast.parse(source.replace("PKG", TOP_PACKAGES[-1]))  # a project package: lpc
    found = {name for node in statements(tree.body) for name in imported_modules(node)}
    walked = {name for node in ast.walk(tree) for name in imported_modules(node)}
    assert found == walked == {f"{TOP_PACKAGES[-1]}.{x}" for x in "abcdefghijklmn"}


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(import_circles(graph)) == [["a", "b", "c"], ["e"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", ["lpc.replay.simulator", "lpc.cli.main", "lpc.errors"])
def test_every_module_has_a_ranked_package(module: str) -> None:
    assert module in MODULES
    assert group_of(module) in RANKS


def test_ranks_cover_every_lpc_subpackage() -> None:
    subpackages = {
        f"lpc.{path.parent.name}"
        for path in (ROOT / "lpc").glob("*/__init__.py")
        if path.parent.name != "data"
    }
    assert subpackages <= set(RANKS), subpackages - set(RANKS)
