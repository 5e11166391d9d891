"""The import graph of autotune/, engine/ and profiles/, read from the source (nothing is imported).

Every ``import X`` and absolute or relative ``from X import Y`` is an edge, wherever it sits: at
module level, inside a function (a lazy import is still a dependency: it only moves the failure
to run time) or under ``if TYPE_CHECKING:``. ``from pkg import name`` points at the submodule
``pkg.name`` when there is one, else at ``pkg`` (its ``__init__``). Importing ``a.b.c`` also runs
``a/__init__`` and ``a/b/__init__``; those implicit edges are not counted, or every package that
re-exports its submodules would be a circle with each of them.

Two rules (docs/architecture.md): no import circle among the modules of one package, and no
upward import: ``engine`` never imports ``autotune`` or ``profiles``; ``profiles`` never imports
``autotune``, ``engine``, torch or transformers. tests/engine/test_engine_imports.py and
tests/profiles/test_profiles_imports.py check the second rule at run time too (what importing
the package actually loads, third-party modules' own imports included).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autotune", "engine", "profiles")
FORBIDDEN = {  # package -> top-level names its modules may not import
    "engine": ("autotune", "profiles"),
    "profiles": ("autotune", "engine", "torch", "transformers"),
}


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line``; ``where`` says how (module level, lazy, typing)."""

    source: str
    target: str
    line: int
    where: str

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line}, {self.where})"


def module_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``packages`` (a package is its __init__)."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


class _Imports(ast.NodeVisitor):
    """Collects the import edges of one module, noting imports in functions and under TYPE_CHECKING."""

    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.module, self.known = module, known
        self.package = module if is_package else module.rpartition(".")[0]
        self.scopes: list[str] = []
        self.edges: list[Edge] = []

    def _add(self, target: str, line: int) -> None:
        where = self.scopes[-1] if self.scopes else "module level"
        self.edges.append(Edge(self.module, target, line, where))

    def _nested(self, node: ast.AST, where: str) -> None:
        self.scopes.append(where)
        self.generic_visit(node)
        self.scopes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._nested(node, f"inside {node.name}()")

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._nested(node, f"inside {node.name}()")

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        self.scopes.append("under TYPE_CHECKING")
        for child in node.body:
            self.visit(child)
        self.scopes.pop()
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:  # relative: from the module's package, one level up per extra dot
            anchor = self.package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            self._add(submodule if submodule in self.known else base, node.lineno)


def import_edges(files: dict[str, Path]) -> list[Edge]:
    """Every import edge of every module in ``files`` (targets outside ``files`` included)."""
    known = set(files)
    edges: list[Edge] = []
    for module, path in files.items():
        visitor = _Imports(module, path.name == "__init__.py", known)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        edges += visitor.edges
    return edges


def _strongly_connected(nodes: list[str], succ: dict[str, list[str]]) -> Iterator[list[str]]:
    """Tarjan's strongly connected components, iteratively (each as a list of nodes)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    yield component
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(succ[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])


def _cycle_through(start: str, component: set[str], first_edge: dict[tuple[str, str], Edge]) -> list[Edge]:
    """One shortest circle from ``start`` back to itself inside ``component`` (breadth-first)."""
    succ = {a: sorted(b for (x, b) in first_edge if x == a and b in component) for a in component}
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in succ[node]:
                if child == start:
                    back = [node]
                    while back[-1] != start:
                        back.append(parent[back[-1]])
                    nodes = [*reversed(back), start]
                    return [first_edge[(a, b)] for a, b in zip(nodes[:-1], nodes[1:], strict=True)]
                if child not in parent:
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"{start} is in a strongly connected component but on no circle")


@dataclass(frozen=True)
class Tangle:
    """Modules that all reach each other by imports, and one circle among them (its edges)."""

    modules: tuple[str, ...]
    circle: tuple[Edge, ...]

    def __str__(self) -> str:
        names = " -> ".join([self.circle[0].source, *(e.target for e in self.circle)])
        edges = "".join(f"\n    {e}" for e in self.circle)
        return f"circle: {names}{edges}\n  ({len(self.modules)} modules in it: {', '.join(self.modules)})"


def import_cycles(files: dict[str, Path], package: str) -> list[Tangle]:
    """Each group of ``package``'s modules that import each other in a circle, with one circle."""
    inside = sorted(m for m in files if m == package or m.startswith(package + "."))
    first_edge: dict[tuple[str, str], Edge] = {}
    for edge in import_edges({m: files[m] for m in inside}):
        if edge.target in inside:
            first_edge.setdefault((edge.source, edge.target), edge)
    succ = {m: sorted({b for (a, b) in first_edge if a == m}) for m in inside}
    tangles = []
    for component in _strongly_connected(inside, succ):
        if len(component) > 1 or (component[0], component[0]) in first_edge:
            circle = _cycle_through(min(component), set(component), first_edge)
            tangles.append(Tangle(tuple(sorted(component)), tuple(circle)))
    return sorted(tangles, key=lambda t: t.modules)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_within_a_package(package: str) -> None:
    tangles = import_cycles(module_files(ROOT), package)
    assert not tangles, f"import circles in {package}/:\n" + "\n".join(map(str, tangles))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_import(package: str) -> None:
    files = module_files(ROOT, (package,))
    bad = [e for e in import_edges(files) if e.target.split(".")[0] in FORBIDDEN[package]]
    assert not bad, f"{package}/ may not import {', '.join(FORBIDDEN[package])}:\n" + "\n".join(
        f"    {e}" for e in bad
    )


def test_the_graph_sees_lazy_relative_and_submodule_imports(tmp_path: Path) -> None:
    """A circle closed only by a lazy import is found; ``from pkg import mod`` points at the submodule."""
    pkg = tmp_path / "profiles"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from profiles.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    import profiles.a\n")
    files = module_files(tmp_path, ("profiles",))
    (tangle,) = import_cycles(files, "profiles")
    assert tangle.modules == ("profiles.a", "profiles.sub.b", "profiles.sub.c")
    cycle = tangle.circle
    assert [(e.source, e.target) for e in cycle] == [
        ("profiles.a", "profiles.sub.b"),
        ("profiles.sub.b", "profiles.sub.c"),
        ("profiles.sub.c", "profiles.a"),
    ]
    assert cycle[-1].where == "inside f()"
    (pkg / "sub" / "c.py").write_text("import torch\n")
    assert import_cycles(module_files(tmp_path, ("profiles",)), "profiles") == []
    assert [e.target for e in import_edges(module_files(tmp_path, ("profiles",)))] == [
        "profiles.sub.b",
        "profiles.sub.c",
        "torch",
    ]


def test_autotune_packages_import_only_lower_floors() -> None:
    """The floor order of tools/structure.py: no unit of autotune/ imports one on its floor or above."""
    from tools import structure

    bad = structure.violations()
    assert not bad, "autotune/ floor order (tools/structure.py FLOORS):\n" + "\n".join(
        f"    {b}" for b in bad
    )


def test_the_floor_check_sees_an_upward_import(tmp_path: Path) -> None:
    """A cost module importing the search package is caught, and so is a unit missing from FLOORS."""
    from tools import structure

    (tmp_path / "autotune" / "cost").mkdir(parents=True)
    (tmp_path / "autotune" / "search").mkdir()
    (tmp_path / "autotune" / "nowhere").mkdir()
    for d in ("", "cost", "search", "nowhere"):
        (tmp_path / "autotune" / d / "__init__.py").write_text("")
    (tmp_path / "autotune" / "search" / "study.py").write_text("from autotune.cost import costmodel\n")
    (tmp_path / "autotune" / "cost" / "costmodel.py").write_text(
        "def f():\n    from autotune.search import study\n"
    )
    bad = structure.violations(structure.modules(tmp_path))
    assert bad == [
        "autotune.nowhere: not in tools/structure.py FLOORS",
        "autotune.cost.costmodel (floor 4, cost) imports autotune.search.study (floor 9, search) at line 2",
    ]


def test_autotune_top_level_holds_at_most_six_modules() -> None:
    top = [p.stem for p in (ROOT / "autotune").glob("*.py") if p.stem != "__init__"]
    assert len(top) <= 6, f"autotune/ top level: {sorted(top)} (move modules into the packages)"
