"""Start-up: each command imports only the heavy modules its own code path needs.

Each command runs in a fresh interpreter (a subprocess) so that nothing another test
imported hides an eager import; the child prints which heavy modules it ended up with.
Modules are counted, not seconds (no wall-clock asserts): tools/bench_startup.py times them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: what costs a command start-up time when imported (tenths of a second each, cold or loaded)
HEAVY = ("torch", "torch_geometric", "numpy", "networkx", "scipy", "scipy.sparse", "scipy.optimize",
         "matplotlib", "numba", "h5py", "rich")
#: never on the planning commands' paths (topo, plan, machines, --help)
TRAINING_STACK = {"torch", "torch_geometric", "matplotlib", "numba", "h5py"}

#: run ``moment ARGS`` in-process, then print the heavy modules now loaded as JSON on the last line
WRAPPER = (
    "import sys, json\n"
    "from moment.cli import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    code = exc.code or 0\n"
    f"heavy = {HEAVY!r}\n"
    "print(json.dumps({'code': code, 'loaded': [m for m in heavy if m in sys.modules]}))\n"
)


def _child(code: str, *argv: str) -> str:
    """Run ``python -c code argv...`` in a fresh interpreter on this tree; its last stdout line."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def loaded_by(*argv: str) -> dict:
    return json.loads(_child(WRAPPER, *argv))


@pytest.mark.parametrize("argv", [
    ("topo", "--machine", "moment-b"),
    ("topo", "--machine", "moment-a", "--json"),
    ("plan", "--machine", "moment-b", "--top", "2"),
    ("plan", "--machine", "moment-b", "--json", "--top", "1"),
])
def test_topo_and_plan_never_import_torch_or_pyg(argv):
    res = loaded_by(*argv)
    assert res["code"] == 0
    assert "torch" not in res["loaded"] and "torch_geometric" not in res["loaded"], res
    assert "networkx" in res["loaded"]  # the check can fail: the wrapper does see what the command loaded


def test_plan_with_maxflow_solves_no_lp():
    """The table of the default model is the ranking's own: no LP and no scipy at all.

    The max-flows run on planner.flow.dinic (plain Python), not scipy.sparse.csgraph,
    whose import alone cost more than the whole ranking.
    """
    res = loaded_by("plan", "--machine", "moment-b")
    assert res["code"] == 0
    assert not {"scipy", "scipy.sparse", "scipy.optimize"} & set(res["loaded"]), res
    assert not TRAINING_STACK & set(res["loaded"]), res
    assert "numpy" in res["loaded"]  # the check sees what the command imported


@pytest.mark.parametrize("argv", [
    ("plan", "--machine", "moment-b", "--model", "concurrent", "--top", "2"),
    ("plan", "--machine", "moment-b", "--json", "--top", "1"),  # the best layout's tidy flows: an LP
])
def test_the_lp_paths_do_load_scipy_optimize(argv):
    """The other side of the lazy import: where an LP is solved, linprog is there."""
    res = loaded_by(*argv)
    assert res["code"] == 0
    assert "scipy.optimize" in res["loaded"], res
    assert not TRAINING_STACK & set(res["loaded"]), res


@pytest.mark.parametrize("argv", [("topo", "--machine", "moment-b"), ("topo", "--machine", "moment-a", "--json")])
def test_topo_needs_no_numpy_or_scipy(argv):
    res = loaded_by(*argv)
    assert res["code"] == 0
    assert res["loaded"] in (["networkx", "rich"], ["networkx"]), res
    assert ("rich" in res["loaded"]) == ("--json" not in argv), res  # the tree is drawn with rich, JSON is not


#: import each moment/*.py module in a fresh interpreter; print the heavy modules each pulled in
MODULE_WRAPPER = (
    "import importlib, json, pkgutil, sys\n"
    "import moment\n"
    f"heavy = {HEAVY!r}\n"
    "out = {}\n"
    "for info in pkgutil.iter_modules(moment.__path__):\n"
    "    if info.name == '__main__':\n"
    "        continue\n"
    "    before = {m for m in heavy if m in sys.modules}\n"
    "    importlib.import_module('moment.' + info.name)\n"
    "    out[info.name] = [m for m in heavy if m in sys.modules and m not in before]\n"
    "print(json.dumps(out))\n"
)


def test_command_modules_import_nothing_heavy_but_the_planner_stack():
    """Each command module alone (imported in name order, each charged with what it added).

    ``plan_cmd`` needs the planner (networkx, numpy and scipy.sparse for the max-flow) at
    import; every other command module defers its heavy imports to the code that runs.
    """
    pulled = json.loads(_child(MODULE_WRAPPER))
    assert len(pulled) >= 15 and "train_cmd" in pulled and "place_cmd" in pulled, pulled
    for name, mods in pulled.items():
        allowed = {"numpy", "networkx", "scipy", "scipy.sparse"} if name == "plan_cmd" else set()
        assert set(mods) <= allowed, (name, mods)


#: ``moment PATH --help`` for every (sub)command, one after another in one interpreter; after
#: each, the heavy modules loaded so far (a failure names the first command that pulled one in)
HELP_WRAPPER = (
    "import json, sys\n"
    "from moment.cli import build_parser, main\n"
    f"heavy = {HEAVY!r}\n"
    "def paths(parser, path=()):\n"
    "    yield path\n"
    "    for action in parser._actions:\n"
    "        if type(action).__name__ == '_SubParsersAction':\n"
    "            for name, sub in action.choices.items():\n"
    "                yield from paths(sub, (*path, name))\n"
    "out = []\n"
    "for path in list(paths(build_parser())):\n"
    "    try:\n"
    "        main([*path, '--help'])\n"
    "    except SystemExit:\n"
    "        pass\n"
    "    out.append([' '.join(path), [m for m in heavy if m in sys.modules]])\n"
    "print(json.dumps(out))\n"
)


def test_every_help_imports_nothing_heavy():
    seen = json.loads(_child(HELP_WRAPPER))
    assert len(seen) >= 18 and ["train", []] in seen and ["place", []] in seen, seen
    for path, mods in seen:
        assert mods == [], f"moment {path} --help imported {mods}"


@pytest.mark.parametrize("argv", [("--help",), ("machines",), ("data", "--help"), ("train", "--help"),
                                  ("place", "--help"), ("bench", "--help")])
def test_help_and_machines_import_nothing_heavy(argv):
    """What keeps `moment --help` and `moment machines` near a bare interpreter's start-up."""
    res = loaded_by(*argv)
    assert res["code"] == 0
    assert res["loaded"] == [], res


def _all_parsers(parser, path=("moment",)):
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_parsers(sub, (*path, name))


def test_every_help_ends_with_examples_of_itself():
    from moment.cli import build_parser

    seen = 0
    for path, parser in _all_parsers(build_parser()):
        text = parser.format_help()
        tail = text.rstrip().rsplit("examples:", 1)
        assert len(tail) == 2, f"{' '.join(path)} --help has no examples"
        lines = [ln.strip() for ln in tail[1].strip().splitlines()]
        assert lines and all(ln.startswith(("moment", "torchrun", "--", "...")) or ln.startswith("F=") for ln in lines)
        # an example of a subcommand runs that subcommand (the top level may show any)
        if len(path) > 1:
            assert any(ln.startswith(" ".join(path)) or ln.startswith("torchrun") for ln in lines), path
        seen += 1
    assert seen >= 18


def test_plan_table_columns_all_have_headers(capsys):
    from moment.cli import main

    assert main(["plan", "--machine", "moment-b", "--top", "2"]) == 0
    header = next(ln for ln in capsys.readouterr().out.splitlines() if "per-GPU GB/s" in ln)
    cells = [c.strip() for c in header.strip().strip("┃").split("┃")]
    assert cells and all(cells), header
