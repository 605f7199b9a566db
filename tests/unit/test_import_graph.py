"""The ``cortex`` package's import structure: no circles, and no module reaching for another
module's private names (issue 25, item 1).

The graph is built statically: every ``.py`` module under ``cortex/`` is parsed with ``ast``
(nothing is imported), and each ``import cortex.x``, ``from cortex.x import y`` and relative
import is resolved to the cortex module it names (``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``).

Rules of the graph:

* Every import counts, wherever it stands: at module level, under ``if TYPE_CHECKING:``, and
  deferred inside a function. A ``TYPE_CHECKING`` import never runs, and a deferred one runs
  late enough not to trip the loader, but both still tie the two modules together for a
  reader and for any refactoring; the issue asks for the structure, not only the load order,
  to be free of circles. (Counting them was practical: none is left that needs a circle.)
* A submodule's implicit import of its parent packages (``cortex.a.b`` runs
  ``cortex/a/__init__.py`` first) is not an edge: a package's ``__init__`` re-exporting its
  own submodules is not a circle. An explicit ``from cortex.a import x`` inside ``cortex.a.b``
  is an edge like any other.
* Compiled modules (``cortex._fast``'s ``.pyx``) are leaves: they import no cortex module.

Each strongly connected component with more than one module (Tarjan's algorithm), and each
module importing itself, is reported with the imports that tie it.

Packages (issue 38): the same edges, each module counted as the package it belongs to
(``cortex.<name>`` for a package's modules, the module itself for a top-level one), form no
circle either, and every import goes to a package of the same or a lower layer of ``LAYERS``
(bottom first). A package imports its own layer's packages only where that makes no circle.

Private names: no module imports another cortex module's ``_name`` (``from cortex.x import
_name``) or reads it as an attribute of a cortex module bound by an import (``x._name`` after
``import cortex.x as x`` or ``from cortex import x``). Dunders are public. Modules are free to
import private *modules* (``cortex._fast.ledger``); the rule is about names inside a module.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import cortex

ROOT = Path(cortex.__file__).resolve().parent

# The layers of the package graph, bottom first: a package imports only its own layer's and
# lower layers' packages. Each layer says what it holds.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("foundation: errors, compiled cores, process helpers", frozenset({
        "cortex", "cortex._fast", "cortex.errors", "cortex.host_literal",
        "cortex.wait_deadlines", "cortex.memory_trim", "cortex.systemd"})),
    ("pure cores and byte movers: the ledger and the event types it applies, prompts, "
     "tokens, both HTTP legs", frozenset({
        "cortex.ledger", "cortex.prompt", "cortex.tokenize", "cortex.front",
        "cortex.upstream"})),
    ("what feeds and reads the ledger; the model's profile; logging", frozenset({
        "cortex.events", "cortex.scheduling", "cortex.profile", "cortex.logs"})),
    ("workers and replicas", frozenset({"cortex.workers", "cortex.replicas"})),
    ("serving a request on workers", frozenset({"cortex.dispatch"})),
    ("strategies and observers over it", frozenset({"cortex.pd", "cortex.metrics"})),
    ("the control plane", frozenset({"cortex.control"})),
    ("the data plane's front door", frozenset({"cortex.gateway"})),
    ("configuration (every component's settings) and the simulated engine", frozenset({
        "cortex.config", "cortex.sim"})),
    ("running services", frozenset({
        "cortex.worker_lifecycle", "cortex.processes", "cortex.serve_summary"})),
    ("the application", frozenset({"cortex.app", "cortex.demo"})),
    ("the command line", frozenset({"cortex.cli", "cortex.__main__"})),
)

# (importing module, imported module, private name): reached for on purpose, each with why.
PRIVATE_ALLOWED: frozenset[tuple[str, str, str]] = frozenset()


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    line: int
    where: str  # "module", "type_checking" or "function"


@dataclass(frozen=True, slots=True)
class PrivateUse:
    source: str
    target: str
    name: str
    line: int


def _module_names() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _module_names()
# compiled modules, known by their stubs or sources: leaves of the graph
KNOWN = set(MODULES) | {
    ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
    for ext in ("*.pyi", "*.pyx") for p in ROOT.rglob(ext)}


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _resolve_from(module: str, level: int, name: str | None) -> str | None:
    """The absolute module a ``from`` statement names (``None`` when outside cortex)."""
    if level == 0:
        base = name or ""
    else:
        package = module.split(".") if _is_package(module) else module.split(".")[:-1]
        package = package[: len(package) - (level - 1)]
        base = ".".join(package + ([name] if name else []))
    return base if base == "cortex" or base.startswith("cortex.") else None


def _known_or_parent(dotted: str) -> str | None:
    """The longest prefix of ``dotted`` that is a cortex module."""
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in KNOWN:
            return candidate
        parts.pop()
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Scanner(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module = module
        self.edges: list[Edge] = []
        self.private: list[PrivateUse] = []
        self.bound: dict[str, str] = {}  # local name -> cortex module it is bound to
        self._where = ["module"]

    # scopes
    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._where.append("type_checking")
            for child in node.body:
                self.visit(child)
            self._where.pop()
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def _visit_function(self, node: ast.AST) -> None:
        self._where.append("function")
        self.generic_visit(node)
        self._where.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    # imports
    def _edge(self, target: str | None, line: int) -> None:
        if target is not None:
            self.edges.append(Edge(self.module, target, line, self._where[-1]))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name != "cortex" and not alias.name.startswith("cortex."):
                continue
            target = _known_or_parent(alias.name)
            self._edge(target, node.lineno)
            if alias.asname is None:
                self.bound["cortex"] = "cortex"  # ``import cortex.a.b`` binds ``cortex``
            elif target == alias.name:
                self.bound[alias.asname] = target

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve_from(self.module, node.level, node.module)
        if base is None:
            return
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in KNOWN:
                self._edge(submodule, node.lineno)
                self.bound[alias.asname or alias.name] = submodule
                continue
            target = _known_or_parent(base)
            self._edge(target, node.lineno)
            if (alias.name.startswith("_") and not alias.name.startswith("__")
                    and target is not None and target != self.module):
                self.private.append(PrivateUse(self.module, target, alias.name, node.lineno))

    def _module_of(self, node: ast.expr) -> str | None:
        """The cortex module an expression names (``x`` bound by an import, ``cortex.a.b``)."""
        if isinstance(node, ast.Name):
            return self.bound.get(node.id)
        if isinstance(node, ast.Attribute):
            parent = self._module_of(node.value)
            if parent is not None and f"{parent}.{node.attr}" in KNOWN:
                return f"{parent}.{node.attr}"
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_") and not node.attr.startswith("__"):
            target = self._module_of(node.value)
            if target is not None and target != self.module:
                self.private.append(PrivateUse(self.module, target, node.attr, node.lineno))
        self.generic_visit(node)


@functools.cache
def _scan() -> tuple[list[Edge], list[PrivateUse]]:
    edges: list[Edge] = []
    private: list[PrivateUse] = []
    for module, path in MODULES.items():
        scanner = _Scanner(module)
        scanner.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        edges += scanner.edges
        private += scanner.private
    return edges, private


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): every component, each sorted, in no special order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
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
                components.append(sorted(component))
    return components


def import_cycles(edges: list[Edge]) -> list[str]:
    """One line per circle: its modules, then the imports that tie them."""
    graph: dict[str, set[str]] = {module: set() for module in KNOWN}
    for edge in edges:
        graph[edge.source].add(edge.target)
    reports = []
    for component in strongly_connected(graph):
        members = set(component)
        if len(component) == 1 and component[0] not in graph[component[0]]:
            continue
        ties = sorted({f"{e.source}:{e.line} -> {e.target} ({e.where})"
                       for e in edges if e.source in members and e.target in members})
        reports.append(f"{component}:\n    " + "\n    ".join(ties))
    return sorted(reports)


def test_tarjan_finds_components():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"f"},
             "g": set()}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["d", "e"], ["f"], ["g"]]


def test_scanner_resolves_imports_and_private_names():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import cortex.front.server as srv\n"
        "from . import limits\n"
        "from ..gateway.proxy import Proxy, _attempt\n"
        "if TYPE_CHECKING:\n"
        "    from cortex.pd import orchestrate\n"
        "import cortex.front.messages\n"
        "def f():\n"
        "    from cortex.errors import BadRequest\n"
        "    return srv._shared, limits._x, srv.__name__, cortex.front.messages._y\n")
    scanner = _Scanner("cortex.front.connection")
    scanner.visit(ast.parse(source))
    assert [(e.target, e.where) for e in scanner.edges] == [
        ("cortex.front.server", "module"), ("cortex.front.limits", "module"),
        ("cortex.gateway.proxy", "module"), ("cortex.gateway.proxy", "module"),
        ("cortex.pd.orchestrate", "type_checking"), ("cortex.front.messages", "module"),
        ("cortex.errors", "function")]
    assert [(p.target, p.name) for p in scanner.private] == [
        ("cortex.gateway.proxy", "_attempt"), ("cortex.front.server", "_shared"),
        ("cortex.front.limits", "_x"), ("cortex.front.messages", "_y")]


def test_the_package_has_no_import_cycles():
    edges, _ = _scan()
    assert {e.source for e in edges} >= {"cortex.cli", "cortex.gateway.proxy"}  # it scanned
    cycles = import_cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_module_reaches_for_another_modules_private_names():
    _, private = _scan()
    found = sorted(f"{p.source}:{p.line} uses {p.target}.{p.name}" for p in private
                   if (p.source, p.target, p.name) not in PRIVATE_ALLOWED)
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_private_allow_list_has_no_stale_entries():
    _, private = _scan()
    used = {(p.source, p.target, p.name) for p in private}
    assert PRIVATE_ALLOWED <= used, sorted(PRIVATE_ALLOWED - used)


def package_of(module: str) -> str:
    """``cortex.<name>`` for a module of package ``<name>``, a top-level module itself."""
    return ".".join(module.split(".")[:2])


def package_edges(edges: list[Edge]) -> list[Edge]:
    """The edges between different packages, each end named by its package."""
    return [Edge(package_of(e.source), package_of(e.target), e.line, f"{e.source} -> {e.target}")
            for e in edges if package_of(e.source) != package_of(e.target)]


def package_cycles(edges: list[Edge]) -> list[str]:
    graph: dict[str, set[str]] = {}
    for edge in package_edges(edges):
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    reports = []
    for component in strongly_connected(graph):
        if len(component) > 1:
            members = set(component)
            ties = sorted({f"{e.where}:{e.line}" for e in package_edges(edges)
                           if e.source in members and e.target in members})
            reports.append(f"{component}:\n    " + "\n    ".join(ties))
    return sorted(reports)


def upward_imports(edges: list[Edge]) -> list[str]:
    layer = {package: depth for depth, (_, packages) in enumerate(LAYERS)
             for package in packages}
    return sorted(f"{e.where}:{e.line} ({e.source}, layer {layer[e.source]} -> "
                  f"{e.target}, layer {layer[e.target]})"
                  for e in package_edges(edges) if layer[e.target] > layer[e.source])


def test_every_package_has_one_layer():
    packages = {package_of(module) for module in KNOWN}
    placed = [package for _, members in LAYERS for package in members]
    assert len(placed) == len(set(placed)), "a package in two layers"
    assert packages == set(placed), (sorted(packages - set(placed)),
                                     sorted(set(placed) - packages))


def test_packages_have_no_import_cycles():
    edges, _ = _scan()
    cycles = package_cycles(edges)
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


def test_no_package_imports_a_higher_layer():
    edges, _ = _scan()
    upward = upward_imports(edges)
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_package_rules_catch_a_circle_and_an_upward_import():
    made_up = [Edge("cortex.gateway.proxy", "cortex.pd.orchestrate", 1, "module"),
               Edge("cortex.pd.orchestrate", "cortex.gateway.legs", 2, "module"),
               Edge("cortex.ledger.book", "cortex.events.model", 3, "module")]
    assert package_cycles(made_up) == [
        "['cortex.gateway', 'cortex.pd']:\n"
        "    cortex.gateway.proxy -> cortex.pd.orchestrate:1\n"
        "    cortex.pd.orchestrate -> cortex.gateway.legs:2"]
    assert upward_imports(made_up) == [
        "cortex.ledger.book -> cortex.events.model:3 (cortex.ledger, layer 1 -> "
        "cortex.events, layer 2)",
        "cortex.pd.orchestrate -> cortex.gateway.legs:2 (cortex.pd, layer 5 -> "
        "cortex.gateway, layer 7)"]
