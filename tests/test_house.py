"""The house's size rules, read from the source: short modules and short functions.

Every module of ``planner``, ``iostack``, ``hwprofile``, ``training``,
``moment`` and ``momentbase`` holds at most ``MODULE_LINES`` lines, unless one
of its first 30 lines starts with ``# Long module:`` and gives the reason;
every function and method in them holds at most ``FUNCTION_LINES`` lines
(decorators and docstring included: the span a reader scrolls through).
``tools/`` (benchmarks) and ``tests/`` are exempt.

``ALLOWED_TODAY`` names the offenders that were there when the rule came
(issue 13). It only shrinks: when you split one of them, remove its entry (the
test fails on an entry that no longer offends, so the list cannot go stale),
and a new offender fails the test by name. Nothing is imported to check this.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("planner", "iostack", "hwprofile", "training", "moment", "momentbase")
MODULE_LINES = 600
FUNCTION_LINES = 80
REASON = "# Long module:"

#: today's offenders outside planner/ (issue 13): remove an entry when you fix it.
#: A module is named by its path, a function by ``path::Class.method``.
ALLOWED_TODAY: frozenset[str] = frozenset()


def _long_functions(tree: ast.AST, where: str) -> dict[str, int]:
    """``{"path::Class.function": lines}`` for each function over the limit, nested ones too."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                lines = child.end_lineno - first + 1
                if lines > FUNCTION_LINES:
                    found[f"{where}::{name}"] = lines
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def offenders(root: Path = REPO) -> dict[str, int]:
    """Every module and function of the packages over its limit, with its length in lines."""
    found: dict[str, int] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            text = path.read_text()
            lines = text.splitlines()
            if len(lines) > MODULE_LINES and not any(x.startswith(REASON) for x in lines[:30]):
                found[where] = len(lines)
            found.update(_long_functions(ast.parse(text, where), where))
    return found


def test_no_new_long_modules_or_functions():
    new = {k: n for k, n in offenders().items() if k not in ALLOWED_TODAY}
    assert not new, (
        f"over the house's limits ({MODULE_LINES} lines a module unless a line in its first 30 "
        f"starts {REASON!r} with the reason; {FUNCTION_LINES} lines a function): split by job\n"
        + "\n".join(f"{k}: {n} lines" for k, n in sorted(new.items())))


def test_the_allowlist_only_shrinks():
    """An entry that no longer offends (fixed, renamed or gone) must leave ALLOWED_TODAY."""
    stale = sorted(ALLOWED_TODAY - set(offenders()))
    assert not stale, "fixed: remove from ALLOWED_TODAY in tests/test_house.py:\n" + "\n".join(stale)


def test_planner_has_no_exceptions():
    """planner/ was cleared in issue 13: it keeps to the limits without an allowlist."""
    assert not [k for k in ALLOWED_TODAY if k.startswith("planner/")]
    assert not [k for k in offenders() if k.startswith("planner/")]


def test_the_reader_measures_what_it_should(tmp_path):
    """The checker's own reader, so the tests above can fail: a long module, a reason, a long method."""
    pkg = tmp_path / "planner"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (pkg / "long.py").write_text("class A:\n    @staticmethod\n    def f():\n" + body.replace("    ", "        ")
                                 + "\n" + "\n" * MODULE_LINES)
    (pkg / "reasoned.py").write_text('"""Doc."""\n' + REASON + " one table, read whole\n" + "\n" * MODULE_LINES)
    (pkg / "short.py").write_text("def g():\n" + "\n".join(body.splitlines()[:FUNCTION_LINES - 1]) + "\n")
    found = offenders(tmp_path)
    assert found == {"planner/long.py": MODULE_LINES + FUNCTION_LINES + 3,
                     "planner/long.py::A.f": FUNCTION_LINES + 2}
