"""The library's typing habits, read from the source: ``Any`` only where a comment says why.

An annotation of a function parameter, a return or an annotated assignment in
``planner``, ``iostack``, ``hwprofile``, ``training``, ``moment`` or
``momentbase`` that names ``Any`` needs a comment mentioning ``Any`` on one of
its lines (or on a comment line right above it) that says why a precise type
does not fit: a JSON record, an optional module without stubs, a numba-compiled
callable. ``ALLOWED_TODAY`` holds, per module, how many uncommented ones were
there when the rule came (issue 27). It only shrinks: a module over its number
fails by name, and so does one under it (lower the number, so the list cannot
go stale). Nothing is imported to check this.

The mypy allowlist (modules that failed the type checker when it came, the
``ignore_errors`` override in pyproject.toml) only shrinks too.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("planner", "iostack", "hwprofile", "training", "moment", "momentbase")
SAYS_WHY = re.compile(r"#.*\bAny\b")

#: uncommented ``Any`` annotations per module when the rule came (issue 27): lower a number
#: when you type one precisely or say why in a comment; remove the entry at zero.
ALLOWED_TODAY: dict[str, int] = {
    "hwprofile/cuda.py": 1,
    "iostack/codec.py": 1,
    "iostack/bench/emulate.py": 2,
    "iostack/bench/workload.py": 3,
    "iostack/pyg.py": 3,
    "iostack/store.py": 1,
    "planner/capacities/apply.py": 2,
    "planner/capacities/reader.py": 1,
    "planner/fio.py": 3,
    "planner/handoff.py": 1,
    "planner/hostinfo.py": 1,
    "planner/layout/machine.py": 1,
    "planner/topology/hwloc/parse.py": 1,
    "planner/topology/hwloc/links.py": 1,
    "planner/topology/hwloc/elements.py": 1,
    "planner/topology/lspci/names.py": 1,
    "planner/topology/sysfs.py": 1,
    "planner/topology/spec/yamlread.py": 3,
    "training/devices.py": 1,
    "training/distributed.py": 4,
    "training/features.py": 3,
    "training/importers/__init__.py": 1,
    "training/importers/_safepickle.py": 3,
    "training/importers/hdf5.py": 3,
    "training/importers/npz.py": 2,
    "training/memplan.py": 1,
    "training/metrics.py": 2,
    "training/place/run.py": 3,
    "training/sharded/features.py": 11,
    "training/sharded/remote_cache.py": 2,
    "training/place/nodes.py": 2,
    "training/writer.py": 1,
}

#: modules in pyproject.toml's mypy ``ignore_errors`` allowlist (63 when the checker came, issue 27)
MYPY_ALLOWLIST_TODAY = 52


def _annotations(tree: ast.Module) -> Iterator[ast.expr]:
    """Every parameter, return and variable annotation in ``tree``, and the value of each
    module-level alias (``Mark = Any``), which stands for an annotation."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
            yield from (p.annotation for p in params if p.annotation is not None)
            if node.returns is not None:
                yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Subscript, ast.BinOp)):
            yield node.value


def _names_any(ann: ast.expr) -> bool:
    """Whether ``ann`` names ``Any`` (``Any`` or ``typing.Any``), a string annotation's text too."""
    for n in ast.walk(ann):
        if isinstance(n, ast.Name) and n.id == "Any" or isinstance(n, ast.Attribute) and n.attr == "Any":
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.search(r"\bAny\b", n.value):
            return True
    return False


def uncommented_any(source: str) -> list[int]:
    """Lines of ``source`` holding an ``Any`` annotation that no comment justifies."""
    lines = source.splitlines()
    found = []
    for ann in _annotations(ast.parse(source)):
        if not _names_any(ann):
            continue
        first, last = ann.lineno, ann.end_lineno or ann.lineno
        said = any(SAYS_WHY.search(lines[i - 1]) for i in range(first, last + 1))
        above = lines[first - 2].strip() if first >= 2 else ""
        if not said and not (above.startswith("#") and SAYS_WHY.search(above)):
            found.append(first)
    return found


def counts(root: Path = REPO) -> dict[str, list[int]]:
    """``{path: [line, ...]}`` of the uncommented ``Any`` annotations in the packages."""
    out: dict[str, list[int]] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            lines = uncommented_any(path.read_text())
            if lines:
                out[path.relative_to(root).as_posix()] = lines
    return out


def test_rule_sees_an_uncommented_any_and_accepts_a_reason() -> None:
    src = ("from typing import Any\n"
           "def f(x: Any, y: int) -> dict[str, Any]:\n"
           "    z: list[Any] = []  # Any: items are whatever the caller stored\n"
           "    # Any: a pynvml handle (no stubs)\n"
           "    h: Any = None\n"
           "    w: 'Any' = None\n"
           "    return {}\n"
           "Alias = list[Any]\n"
           "Fine = list[Any]  # Any: whatever the caller stored\n"
           "NOT_AN_ALIAS = 'Any text'\n")
    assert uncommented_any(src) == [2, 2, 6, 8]


def test_no_new_uncommented_any() -> None:
    found = counts()
    over = {p: ln for p, ln in found.items() if len(ln) > ALLOWED_TODAY.get(p, 0)}
    under = {p: n for p, n in ALLOWED_TODAY.items() if len(found.get(p, [])) < n}
    assert not over, (
        "an `Any` annotation without a comment saying why (type it precisely, or add a comment "
        "naming Any and the reason on its line):\n"
        + "\n".join(f"{p}: lines {ln} (allowed {ALLOWED_TODAY.get(p, 0)})" for p, ln in sorted(over.items())))
    assert not under, (
        "fewer uncommented `Any` than ALLOWED_TODAY says: lower these numbers in tests/test_typing.py\n"
        + "\n".join(f"{p}: {len(found.get(p, []))} (listed {n})" for p, n in sorted(under.items())))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is in the standard library from 3.11")
def test_mypy_allowlist_only_shrinks() -> None:
    import tomllib

    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    allowed = [m for o in conf["overrides"] if o.get("ignore_errors") for m in o["module"]]
    assert len(allowed) <= MYPY_ALLOWLIST_TODAY, (
        f"{len(allowed)} modules skip the type checker's errors; MYPY_ALLOWLIST_TODAY says {MYPY_ALLOWLIST_TODAY}: "
        "fix the new module's errors instead of listing it")
    assert len(allowed) == MYPY_ALLOWLIST_TODAY, (
        f"the mypy allowlist is down to {len(allowed)}: lower MYPY_ALLOWLIST_TODAY to match")
    missing = [m for m in allowed
               if not (REPO / (m.replace(".", "/") + ".py")).exists()
               and not (REPO / m.replace(".", "/") / "__init__.py").exists()]
    assert not missing, f"allowlisted modules that no longer exist (remove them): {missing}"
