"""The architecture contract in CI: import-linter's contracts (pyproject.toml, `[tool.importlinter]`)
hold, every module of the service has a place in its layers, and no module of the product imports
itself back through others. Imports inside functions and under TYPE_CHECKING count.

docs/design/layout.md ("Architecture contract") explains the layers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import tomllib

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("vocabulary", "connectors", "service")
TIMEOUT_S = 300
# The `lint-imports` command, run by this interpreter wherever its scripts were installed.
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _contracts() -> dict[str, dict]:
    """The import-linter contracts of pyproject.toml, by id."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def _graph() -> grimp.ImportGraph:
    """The product's import graph, built from the sources (no cache: several runs share the tree)."""
    return grimp.build_graph(*PRODUCT, cache_dir=None)


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Groups of modules that import each other in a circle (strongly connected components of two
    or more modules), each sorted; Tarjan's algorithm without recursion."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            step = next(imported, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        cycles.append(sorted(group))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                on_stack.add(step)
                work.append((step, iter(sorted(graph.find_modules_directly_imported_by(step)))))
            elif step in on_stack:
                low[module] = min(low[module], index[step])
    return cycles


def describe_cycle(graph: grimp.ImportGraph, group: list[str]) -> str:
    """One circle through `group`, each step with the import lines that make it."""
    first = group[0]
    inside = set(group)
    back = next(m for m in sorted(graph.find_modules_that_directly_import(first)) if m in inside)
    circle = [*(graph.find_shortest_chain(first, back) or (first, back)), first]
    lines = [f"a circle among {len(group)} modules ({', '.join(group)}), for one:"]
    for importer, imported in zip(circle, circle[1:]):
        details = graph.get_import_details(importer=importer, imported=imported)
        where = "; ".join(f"l.{d['line_number']}: {d['line_contents'].strip()}" for d in details)
        lines.append(f"  {importer} -> {imported}   ({where})")
    return "\n".join(lines)


def _unplaced(graph: grimp.ImportGraph, module: str, placed: set[str]) -> list[str]:
    """The modules under `module` that no layer names (a module is placed when it or a package
    above it is named; a package that is not named must have all its children placed)."""
    if module in placed:
        return []
    children = sorted(graph.find_children(module))
    if not children:
        return [module]
    return [missing for child in children for missing in _unplaced(graph, child, placed)]


def test_import_linter_contracts_hold():
    result = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo", str(REPO / "pyproject.toml")],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, (
        "an import breaks the architecture contract (pyproject.toml, [tool.importlinter]; "
        "docs/design/layout.md): move the imported name to a lower module rather than "
        f"bending the contract\n{result.stdout}{result.stderr}"
    )


def test_the_contract_keeps_connectors_independent_of_service():
    forbidden = _contracts()["connectors-independent"]
    assert forbidden["type"] == "forbidden"
    assert forbidden["source_modules"] == ["connectors"]
    assert forbidden["forbidden_modules"] == ["service"]
    assert _contracts()["product"]["layers"] == ["service", "connectors", "vocabulary"]


def test_every_service_module_has_a_layer():
    layers = _contracts()["service"]["layers"]
    placed = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
    graph = _graph()
    missing = [m for child in sorted(graph.find_children("service")) for m in _unplaced(graph, child, placed)]
    assert not missing, f"place these modules in a layer of the 'service' contract (pyproject.toml): {missing}"


def test_no_import_cycles():
    graph = _graph()
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (move the shared name to a lower module):\n" + "\n\n".join(
        describe_cycle(graph, group) for group in cycles
    )


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c", "d"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b", line_number=1, line_contents="import b")
    graph.add_import(importer="b", imported="c", line_number=2, line_contents="import c")
    graph.add_import(importer="c", imported="a", line_number=9, line_contents="    from a import f")
    graph.add_import(importer="c", imported="d", line_number=3, line_contents="import d")
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert describe_cycle(graph, ["a", "b", "c"]).splitlines() == [
        "a circle among 3 modules (a, b, c), for one:",
        "  a -> b   (l.1: import b)",
        "  b -> c   (l.2: import c)",
        "  c -> a   (l.9: from a import f)",
    ]
