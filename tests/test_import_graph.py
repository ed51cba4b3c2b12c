"""The project's import graph has no cycles.

Every ``import`` and ``from ... import`` in ppo/, ablations/, value_model/ and gae/ counts,
wherever it stands: at the top of a module, inside a function (a deferred import is still a
dependency a reader must follow) or under ``if TYPE_CHECKING:``. A cycle means two modules
that can only be understood together; the layers in docs/reading-guide.md depend on there
being none.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ppo", "ablations", "value_model", "gae")


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its file (packages' own ``__init__``
    files only when a statement names the package itself)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from package import module` depends on the module; `from module import name` on the module.
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def a_cycle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One concrete loop through a component's first module, for the error message."""
    start = component[0]
    members = set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for other in sorted(graph[node] & members):
            if other == start:
                return paths[node] + [start]
            if other not in paths:
                paths[other] = paths[node] + [other]
                frontier.append(other)
    return component


def test_import_graph_finds_imports_of_every_form(tmp_path):
    """The walker sees top-level, deferred, relative and TYPE_CHECKING imports, and a cycle."""
    modules = {"pkg": tmp_path / "pkg" / "__init__.py", "pkg.a": tmp_path / "pkg" / "a.py",
               "pkg.b": tmp_path / "pkg" / "b.py", "pkg.c": tmp_path / "pkg" / "c.py"}
    for path in modules.values():
        path.parent.mkdir(exist_ok=True)
    modules["pkg"].write_text("")
    modules["pkg.a"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    modules["pkg.b"].write_text("def f():\n    from pkg import c\n")
    modules["pkg.c"].write_text("import pkg.a\n")
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert a_cycle(["pkg.a", "pkg.b", "pkg.c"], graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 100  # the walk found the project
    found = cycles(graph)
    assert not found, "import cycles (each shown by one loop through it):\n" + "\n".join(
        " -> ".join(a_cycle(component, graph)) + f"   [{len(component)} modules]" for component in found)
