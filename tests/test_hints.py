"""Every command a message or a doc quotes exists, with every option it quotes (issue 28 item 12).

A hint once sent users to ``moment bench emulate --record``, which never existed (the recorder is
``moment bench record``). Each `` `moment ...` `` quoted in the packages' code and in the README
is walked through the real parser: its (sub)command words must name commands, its options must
be options of that command.
"""

from __future__ import annotations

import argparse
import re

import pytest

from moment.cli import build_parser
from tests.conftest import REPO

PACKAGES = ("momentbase", "planner", "iostack", "hwprofile", "training", "moment")
#: a quoted command line: `moment WORDS --options ...` up to the closing backtick
QUOTED = re.compile(r"`moment ([^`]+)`")


def _quotes() -> list[tuple[str, str]]:
    found = []
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")] + [REPO / "README.md"]
    for path in files:
        for m in QUOTED.finditer(path.read_text()):
            if re.match(r"[a-z]", m.group(1)):  # not the package chain `moment → training → ...`
                # `moment bench io raw|gather`: each alternative
                first, *alts = m.group(1).split("|")
                found.append((f"{path.relative_to(REPO)}", first))
                stem = first.rsplit(" ", 1)[0]
                found += [(f"{path.relative_to(REPO)}", f"{stem} {a}") for a in alts]
    return found


def _subparsers(p: argparse.ArgumentParser):
    return next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)


def _unknown(line: str, parser: argparse.ArgumentParser) -> str | None:
    """What in ``line`` (the words after ``moment``) names no command or option; None when all exist."""
    words = line.split()
    p = parser
    i = 0
    while i < len(words) and (sub := _subparsers(p)) is not None and not words[i].startswith("-"):
        if words[i] not in sub.choices:
            return f"no command {' '.join(words[:i + 1])!r}"
        p = sub.choices[words[i]]
        i += 1
    options = {s for a in p._actions for s in a.option_strings}
    for w in words[i:]:
        opt = w.split("=", 1)[0].rstrip(",.;:)")
        if opt.startswith("--") and re.fullmatch(r"--[a-z][a-z0-9-]*", opt) and opt not in options:
            return f"{p.prog} has no option {opt}"
    return None


def test_the_walk_catches_the_hint_of_the_issue():
    parser = build_parser()
    assert _unknown("bench emulate --record", parser) == "moment bench emulate has no option --record"
    assert _unknown("bench replay", parser) == "no command 'bench replay'"
    assert _unknown("bench record stream.npz --dataset g", parser) is None


@pytest.mark.parametrize("where, line", _quotes())
def test_every_quoted_command_exists(where, line):
    assert _unknown(line, build_parser()) is None, f"{where}: `moment {line}`"
