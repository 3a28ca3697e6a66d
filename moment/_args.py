"""Parsers for command-line values shared by several commands."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TypeVar

from momentbase.errors import MomentError
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


def size_arg(text: str, flag: str) -> int:
    """A size like ``8GiB`` in bytes (``0``, ``0B``, ``none``: 0); :class:`PlannerError` naming ``flag`` otherwise.

    >>> size_arg("2KiB", "--remote-cache"), size_arg("none", "--cpu-cache")
    (2048, 0)
    """
    from planner.capacities import parse_size

    if text.strip() in ("0", "0B", "none"):
        return 0
    try:
        return parse_size(text)
    except MomentError as exc:
        raise PlannerError(f"{flag} {text!r}: {exc}") from None


def argtype(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse ``type=``: its PlannerError becomes argparse's usage error."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except MomentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def positive_number(flag: str, *, upper: float = math.inf) -> Callable[[str], float]:
    """An argparse ``type=`` for a finite number in ``(0, upper]`` (``flag`` names it in ``--help``).

    >>> positive_number("--unknown-link-gbps")("16")
    16.0
    >>> positive_number("--unknown-link-gbps")("-3")
    Traceback (most recent call last):
      ...
    argparse.ArgumentTypeError: -3: expected a positive number
    """
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (0 < value <= upper) or not math.isfinite(value):
            bound = "" if upper == math.inf else f" up to {upper:g}"
            # argparse puts "argument FLAG: " in front of the message
            raise argparse.ArgumentTypeError(f"{text}: expected a positive number{bound}")
        return value

    parse.__name__ = flag.lstrip("-").replace("-", " ")  # what argparse's own messages call it
    return parse


def port(text: str) -> int:
    """An argparse ``type=`` for a TCP port: 0 (any free one) to 65535.

    >>> port("29600"), port("0")
    (29600, 0)
    """
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text}: expected a port from 1 to 65535 (0: any free one)")
    return value


# argparse before Python 3.13 takes "-1KiB" or "-4e3" for an unknown option and answers
# "expected one argument"; 3.13 lets any "-<digit>" through as a value, and so does this.
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")


def accept_negative_values(parser: argparse.ArgumentParser) -> None:
    """Let values that start with ``-`` and a digit (``--gpu-cache -1KiB``) reach their option's
    ``type`` or the command, which then says what is wrong with them, in ``parser`` and every
    subparser below it. No option of Moment's looks like a negative number."""
    stack = [parser]
    while stack:
        p = stack.pop()
        p._negative_number_matcher = _NEGATIVE_VALUE
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
