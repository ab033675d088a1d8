"""The import graph of both packages (grimp, as import-linter reads it): no cycle, cores apart from their edges.

Every import counts: lazy ones inside functions (a cycle that closes only at
run time is still a cycle in the design) and those under TYPE_CHECKING (none
needs excluding today). The layers, the forbidden imports and the cycles
between sub-packages are also `lint-imports` contracts (pyproject.toml); this
file checks what import-linter cannot state (cycles between single modules, a
core against its own package, empty package `__init__` files) and the sibling
rule once more from the graph itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("istio_agent", "istiod_local")
# The sans-IO cores: each imports nothing of its package outside itself (the I/O edges are the package's top level).
CORES = ("istio_agent.security.core", "istio_agent.dns.core", "istio_agent.xds.core")
# Packages whose `__init__` imports nothing: importing one of their modules must load no sibling (footprint).
EMPTY_INITS = ("istio_agent.agent", "istio_agent.envoy", "istio_agent.envoy.bootstrap", "istio_agent.status",
               "istio_agent.status.probes", "istio_agent.status.merged_metrics", "istio_agent.security",
               *CORES)


@functools.cache
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def cycles(nodes: Iterable[str], successors: Callable[[str], Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(successors(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(successors(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
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
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The checks below pass by finding nothing; this one shows the finder is not blind."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges, edges.__getitem__) == [["a", "b", "c"]]
    edges["c"] = set()
    assert cycles(edges, edges.__getitem__) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_itself_back(package: str) -> None:
    g = graph()
    modules = sorted(m for m in g.modules if m == package or m.startswith(package + "."))

    def imported(module: str) -> list[str]:
        return [i for i in g.find_modules_directly_imported_by(module) if i.startswith(package)]

    assert cycles(modules, imported) == []


def sibling_cycles(parent: str) -> list[list[str]]:
    """Cycles between the children of `parent`, each child standing for itself and everything under it."""
    g = graph()
    children = sorted(g.find_children(parent))

    def owner(module: str) -> str | None:
        return next((c for c in children if module == c or module.startswith(c + ".")), None)

    edges: dict[str, set[str]] = {c: set() for c in children}
    for child in children:
        for module in (child, *g.find_descendants(child)):
            for imported in g.find_modules_directly_imported_by(module):
                target = owner(imported)
                if target is not None and target != child:
                    edges[child].add(target)
    return cycles(children, lambda c: edges[c])


@pytest.mark.parametrize("package", PACKAGES)
def test_no_two_sub_packages_import_each_other(package: str) -> None:
    """At every level: siblings (sub-packages with all they hold, and modules) form no cycle."""
    g = graph()
    parents = [package, *(m for m in g.find_descendants(package) if g.find_children(m))]
    assert {p: found for p in parents if (found := sibling_cycles(p))} == {}


@pytest.mark.parametrize("core", CORES)
def test_a_core_imports_nothing_of_its_package_outside_itself(core: str) -> None:
    g = graph()
    package = core.rsplit(".", 1)[0]
    out = sorted(f"{m} imports {i}" for m in (core, *g.find_descendants(core))
                 for i in g.find_modules_directly_imported_by(m)
                 if i.startswith(package + ".") and not (i == core or i.startswith(core + ".")))
    assert out == []


@pytest.mark.parametrize("package", EMPTY_INITS)
def test_the_package_init_imports_nothing(package: str) -> None:
    assert graph().find_modules_directly_imported_by(package) == set()


def test_the_import_contracts_hold() -> None:
    """`lint-imports` (make lint), here too, so that a test run alone also catches a broken layer."""
    from importlinter import configuration
    from importlinter.application.use_cases import lint_imports

    configuration.configure()
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True)
