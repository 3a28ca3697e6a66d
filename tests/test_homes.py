"""A name is imported from the module that defines it: no module serves as another's shim.

A package's ``__init__`` may name its public API (``planner.layout``, ``planner.capacities``);
a plain module re-exports nothing, so ``from planner.ddak import hash_placement`` (defined in
``planner.baselines``) fails here, naming the importer, the name and its home.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("momentbase", "planner", "iostack", "hwprofile", "training", "moment", "tools", "tests")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _bound(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """Names a module defines at its top level, and those it imports there (name -> source module)."""
    defined: set[str] = set()
    imported: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.If, ast.Try)):
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    defined.add(n.id)
                elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
                    defined.add(n.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                imported[a.asname or a.name] = node.module
    return defined, imported


def test_every_name_is_imported_from_its_home():
    modules = _modules()
    trees = {m: ast.parse(p.read_text()) for m, p in modules.items()}
    bound = {m: _bound(t) for m, t in trees.items()}
    wrong = []
    for importer, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules):
                continue
            src = node.module
            if modules[src].name == "__init__.py":  # a package's public API
                continue
            defined, imported = bound[src]
            for a in node.names:
                if a.name in imported and a.name not in defined and f"{src}.{a.name}" not in modules:
                    wrong.append(f"{modules[importer].relative_to(ROOT)}:{node.lineno}: {a.name} from {src}, "
                                 f"which imports it from {imported[a.name]}")
    assert not wrong, "\n".join(wrong)
