"""numpydoc's ``Raises`` section on every public function that raises, read from the source.

A function or method of ``planner``, ``iostack``, ``hwprofile``, ``training``, ``moment`` or
``momentbase`` whose name, class and module are public (no leading underscore) and whose own body
has a ``raise SomeError(...)`` (not a bare re-raise, not ``NotImplementedError``) carries a numpydoc
``Raises`` section (``Raises`` underlined with dashes) in its docstring, naming what a caller may
catch, as networkx, KvikIO and zarr do. ``tests/raises_allowlist.txt`` lists, one
``path::Class.function`` a line, the ones that lacked it when the rule came (issue 27). It only
shrinks: a new one fails by name, and so does a listed one that has its section now or is gone
(remove its line). Nothing is imported to check this.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("planner", "iostack", "hwprofile", "training", "moment", "momentbase")
ALLOWLIST = REPO / "tests" / "raises_allowlist.txt"
RAISES_SECTION = re.compile(r"^\s*Raises\s*\n\s*-{6,}\s*$", re.M)


def _own_raises(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``fn``'s own body (not a nested function's or class's) raises a named exception."""
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if not (isinstance(target, ast.Name) and target.id == "NotImplementedError"):
                return True
        todo.extend(ast.iter_child_nodes(node))
    return False


def _public_functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """``(qualified name, node)`` of the module's public functions and public classes' public methods."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                    yield f"{node.name}.{item.name}", item


def missing_raises(root: Path = REPO) -> set[str]:
    """``path::name`` of every public function that raises without a ``Raises`` section."""
    found = set()
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root)
            if any(part.startswith("_") and part != "__init__.py" for part in rel.parts):
                continue
            for name, fn in _public_functions(ast.parse(path.read_text())):
                doc = ast.get_docstring(fn) or ""
                if _own_raises(fn) and not RAISES_SECTION.search(doc):
                    found.add(f"{rel.as_posix()}::{name}")
    return found


def allowed() -> set[str]:
    lines = ALLOWLIST.read_text().splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


def test_rule_sees_a_missing_raises_section(tmp_path: Path) -> None:
    pkg = tmp_path / "planner"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "def told(x):\n"
        '    """Half of x.\n\n    Raises\n    ------\n    ValueError\n        x is odd.\n    """\n'
        "    if x % 2:\n        raise ValueError(x)\n"
        "def untold(x):\n    '''Half of x.'''\n    raise ValueError(x)\n"
        "def reraises():\n    try:\n        pass\n    except OSError:\n        raise\n"
        "def _private():\n    raise ValueError\n"
        "class Base:\n    def abstract(self):\n        raise NotImplementedError\n"
        "    def nested(self):\n        def inner():\n            raise KeyError\n        return inner\n")
    assert missing_raises(tmp_path) == {"planner/m.py::untold"}


def test_public_functions_that_raise_say_so() -> None:
    found, listed = missing_raises(), allowed()
    new, done = sorted(found - listed), sorted(listed - found)
    assert not new, (
        "public functions that raise without a numpydoc Raises section (add one: 'Raises', a line "
        "of dashes, then each exception and when):\n" + "\n".join(new))
    assert not done, (
        f"listed in {ALLOWLIST.name} but no longer missing a Raises section (or gone): remove them\n"
        + "\n".join(done))
