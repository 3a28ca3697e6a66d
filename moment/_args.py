"""Parsers for command-line values shared by several commands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from planner.errors import PlannerError

T = TypeVar("T")


def parse_fanouts(text: str, flag: str = "--fanouts") -> tuple[int, ...]:
    """``"25,10"`` -> ``(25, 10)``; ``-1`` means all neighbours. :class:`PlannerError` naming ``flag`` otherwise.

    >>> parse_fanouts("25,10"), parse_fanouts("-1, 5")
    ((25, 10), (-1, 5))
    """
    try:
        out = tuple(int(p) for p in text.split(","))
    except ValueError:
        out = ()
    if not out or any(f < -1 or f == 0 for f in out):
        raise PlannerError(f"{flag} {text!r}: expected comma-separated positive integers or -1 (all), e.g. 25,10")
    return out


def argtype(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse ``type=``: its PlannerError becomes argparse's usage error."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except PlannerError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert
