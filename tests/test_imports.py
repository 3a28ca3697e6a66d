"""The one-way import rule and no import cycles, read from the source (``docs/architecture.md``).

Every ``import`` of every module of the project's packages is read from its
syntax tree, including the lazy ones inside functions, and checked against
the order ``momentbase → planner → iostack → hwprofile | training → moment →
tools``: a package imports only packages below it (``hwprofile`` and
``training`` stand side by side and import neither each other). The imports
a module runs when it is loaded (those outside functions) must form no cycle
between modules. Nothing is imported to check this.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

from tests.conftest import REPO

#: package -> the project packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "momentbase": set(),
    "planner": {"momentbase"},
    "iostack": {"momentbase", "planner"},
    "hwprofile": {"momentbase", "planner", "iostack"},
    "training": {"momentbase", "planner", "iostack"},
    "moment": {"momentbase", "planner", "iostack", "hwprofile", "training"},
    "tools": {"momentbase", "planner", "iostack", "hwprofile", "training", "moment"},
}
PROJECT = set(ALLOWED) | {"tests"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ALLOWED:
        root = REPO / pkg
        for path in sorted(root.rglob("*.py")) if root.is_dir() else ():
            out[_module_name(path)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """``(imported module, line, at load time)`` for each project import in ``path``.

    ``from a import b`` counts as an import of ``a.b`` when that is a module,
    else of ``a``; relative imports are resolved against ``name``'s package.
    "At load time" means outside any function body (a class body runs at load).
    """
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if sub in MODULES else base, child.lineno, top))
            visit(child, top)

    visit(tree, True)
    return [(m, line, top) for m, line, top in found if m.split(".")[0] in PROJECT]


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _where(name: str, line: int) -> str:
    return f"{MODULES[name].relative_to(REPO)}:{line}"


def test_the_packages_are_found():
    assert {m.split(".")[0] for m in MODULES} >= {"momentbase", "planner", "iostack", "training", "moment"}
    assert sum(len(v) for v in IMPORTS.values()) > 100  # the reader sees the project's imports


def test_imports_run_one_way():
    wrong = []
    for name, imports in IMPORTS.items():
        pkg = name.split(".")[0]
        for target, line, _ in imports:
            other = target.split(".")[0]
            if other != pkg and other not in ALLOWED[pkg]:
                wrong.append(f"{_where(name, line)}: {name} imports {target} "
                             f"({pkg} may import only {', '.join(sorted(ALLOWED[pkg])) or 'no other package'})")
    assert not wrong, "imports against the one-way order:\n" + "\n".join(wrong)


def test_no_import_cycles():
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for name, imports in IMPORTS.items():
        graph.add_edges_from((name, t) for t, _, top in imports if top and t in MODULES and t != name)
    cycles = sorted(" -> ".join([*c, c[0]]) for c in nx.simple_cycles(graph))
    assert not cycles, "import cycles between modules:\n" + "\n".join(cycles)


@pytest.mark.parametrize(("source", "expected"), [
    ("import planner.flow\n", [("planner.flow", 1, True)]),
    ("def f():\n    from training import sampler\n", [("training.sampler", 2, False)]),
    ("from . import errors\n", [("planner.errors", 1, True)]),
    ("from ..errors import PlannerError\n", [("planner.errors", 1, True)]),
    ("import numpy\nfrom collections import abc\n", []),
])
def test_the_reader_sees_every_kind_of_import(tmp_path, monkeypatch, source, expected):
    """The checker's own reader: lazy, relative and plain imports (so the two tests above can fail)."""
    path = tmp_path / "m.py"
    path.write_text(source)
    name = "planner.topology.m" if source.startswith("from ..") else "planner.m"
    assert _imports(name, path) == expected


def test_a_wrong_arrow_would_be_reported():
    """planner importing training is against the order: the rule table says so."""
    assert "training" not in ALLOWED["planner"] and "moment" not in ALLOWED["training"]
    assert "training" not in ALLOWED["hwprofile"] and "hwprofile" not in ALLOWED["training"]
