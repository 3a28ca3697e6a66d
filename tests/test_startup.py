"""Start-up: the light commands must not import torch or PyG (or, for --help and machines, numpy).

Each command runs in a fresh interpreter (a subprocess) so that nothing another test
imported hides an eager import; the child prints which heavy modules it ended up with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: run ``moment ARGS`` in-process, then print the heavy modules now loaded as JSON on the last line
WRAPPER = (
    "import sys, json\n"
    "from moment.cli import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    code = exc.code or 0\n"
    "heavy = ('torch', 'torch_geometric', 'numpy', 'networkx', 'scipy', 'matplotlib')\n"
    "print(json.dumps({'code': code, 'loaded': [m for m in heavy if m in sys.modules]}))\n"
)


def loaded_by(*argv: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
