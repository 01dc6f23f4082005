"""No runtime import cycles inside ``rtserve/`` (docs/design.md#conventions).

The graph is read from the source with ``ast``, so a cycle hidden by a function-level
import still counts (it only moves the failure to the first call); imports under
``if TYPE_CHECKING:`` do not run and are left out. An import of a module's own ancestor
package is not an edge (Python has already started that package); ``import a.b.c`` is an
edge to ``a``, ``a.b`` and ``a.b.c`` (all three run), and ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import rtserve

ROOT = Path(rtserve.__file__).parent
PACKAGE = ROOT.name


def _module_names(root: Path) -> dict[str, Path]:
    modules = {}
    for path in root.rglob("*.py"):
        parts = (PACKAGE, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth (functions included)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for branch in child.orelse:
                yield from _runtime_imports(ast.Module(body=[branch], type_ignores=[]))
        else:
            yield from _runtime_imports(child)


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: set[str]) -> set[str]:
    """The ``rtserve`` modules one import statement loads."""
    if isinstance(node, ast.Import):
        targets = {alias.name for alias in node.names}
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            anchor = ".".join(package[: len(package) - node.level + 1])
            base = f"{anchor}.{base}" if base else anchor
        targets = {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules}
        targets.add(base)
    found = set()
    for target in targets:
        while target:  # ``a.b.c`` loads ``a`` and ``a.b`` first
            if target in modules and target != module and not module.startswith(target + "."):  # not an ancestor
                found.add(target)
            target = target.rpartition(".")[0]
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    paths = _module_names(root)
    names = set(paths)
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[module] = set()
        for node in _runtime_imports(tree):
            graph[module] |= _imported(module, is_package, node, names)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the graph is deep enough for Python's recursion limit
    to matter); components of one module without a self-import are left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        components.append(sorted(component))
    return components


def test_strongly_connected_finds_each_cycle_once():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"f"}, "g": set()}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["d", "e"], ["f"]]


def test_edges_follow_python_import_rules(tmp_path):
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from rtserve.sub.leaf import X\n")
    (package / "sub" / "leaf.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import rtserve.sub\n"  # its own ancestor: not an edge
        "from rtserve import other\n"  # a module named in a from-import: an edge to it
        "if TYPE_CHECKING:\n"
        "    from rtserve.typed import T\n"
        "def later():\n"
        "    from . import sibling\n"
    )
    (package / "other.py").write_text("")
    (package / "typed.py").write_text("")
    (package / "sub" / "sibling.py").write_text("")
    assert import_graph(package) == {
        "rtserve": set(),
        "rtserve.sub": {"rtserve.sub.leaf"},
        "rtserve.sub.leaf": {"rtserve.other", "rtserve.sub.sibling"},
        "rtserve.other": set(),
        "rtserve.typed": set(),
        "rtserve.sub.sibling": set(),
    }


def test_rtserve_has_no_import_cycles():
    cycles = strongly_connected(import_graph(ROOT))
    assert not cycles, "import cycles in rtserve/:\n" + "\n".join(" <-> ".join(c) for c in cycles)
