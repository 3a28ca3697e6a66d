"""Parsers for command-line values shared by several commands."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TypeVar

from moment.errors import CommandError
from momentbase.errors import MomentError

T = TypeVar("T")


def parse_fanouts(text: str, flag: str = "--fanouts") -> tuple[int, ...]:
    """``"25,10"`` -> ``(25, 10)``; ``-1`` means all neighbours. :class:`~moment.errors.CommandError` naming
    ``flag`` otherwise.

    >>> parse_fanouts("25,10"), parse_fanouts("-1, 5")
    ((25, 10), (-1, 5))
    """
    try:
        out = tuple(int(p) for p in text.split(","))
    except ValueError:
        out = ()
    if not out or any(f < -1 or f == 0 for f in out):
        raise CommandError(f"{flag} {text!r}: expected comma-separated positive integers or -1 (all), e.g. 25,10")
    return out


def parse_gpu_counts(text: str) -> tuple[int, ...]:
    """``"4"`` -> ``(4,)``, ``"1,2,4"`` -> ``(1, 2, 4)``: distinct counts, each at least 1 (a single
    ``0`` stays allowed: SSDs alone, which the planner judges); a :class:`~moment.errors.CommandError`
    naming ``--gpus`` otherwise.

    >>> parse_gpu_counts("4"), parse_gpu_counts("1, 2,4")
    ((4,), (1, 2, 4))
    """
    try:
        out = tuple(int(p) for p in text.split(","))
    except ValueError:
        out = ()
    if out == (0,):
        return out
    if not out or any(n < 1 for n in out) or len(set(out)) != len(out):
        raise CommandError(f"--gpus {text!r}: expected a GPU count or distinct comma-separated counts, e.g. 1,2,4")
    return out


def size_arg(text: str, flag: str) -> int:
    """A size like ``8GiB`` in bytes (``0``, ``0B``, ``none``: 0); :class:`~moment.errors.CommandError` naming
    ``flag`` otherwise.

    >>> size_arg("2KiB", "--remote-cache"), size_arg("none", "--cpu-cache")
    (2048, 0)
    """
    from momentbase.units import parse_size

    if text.strip() in ("0", "0B", "none"):
        return 0
    try:
        return parse_size(text)
    except MomentError as exc:
        raise CommandError(f"{flag} {text!r}: {exc}") from None


def argtype(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse ``type=``: its MomentError becomes argparse's usage error."""

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


# --- one machine loader for every command (topo, plan, place, profile, demo) ---------------

def add_source_args(parser: argparse.ArgumentParser, *, planning: bool = False) -> None:
    """The options that name a machine: captured files, a machine spec, or this machine (none given).

    ``planning`` adds what changes its figures for a plan: ``--capacities``,
    ``--unknown-link-gbps`` and ``--nvlink`` (what-if bridges).
    """
    from planner.topology.sources import CAPTURE_SOURCES

    src = parser.add_argument_group("sources (captured on the machine; combine those of one machine)")
    for source in CAPTURE_SOURCES:  # one option per file a capture source reads
        for f in CAPTURE_SOURCES.caps(source)["files"]:
            many = {"action": "extend", "nargs": "+"} if f.many else {}
            src.add_argument(f.flag, metavar="FILE", help=f.help, **many)
    src.add_argument("--machine", metavar="NAME|FILE",
                     help="a bundled machine spec (moment-a, moment-b) or a YAML spec file")
    src.add_argument("--name", help="name to give the machine")
    src.add_argument("--sys-root", metavar="DIR", default="/sys", help=argparse.SUPPRESS)
    if planning:
        fig = parser.add_argument_group("figures")
        fig.add_argument("--capacities", metavar="FILE",
                         help="measured figures from `moment profile` (links, memory, and the SSD and GPU models)")
        fig.add_argument("--unknown-link-gbps", type=positive_number("--unknown-link-gbps"), metavar="GB/S",
                         help="assume this many GB/s per direction for links no source sized")
        fig.add_argument("--nvlink", action="append", metavar="I-J",
                         help="what-if: an NVLink bridge between placed GPUs I and J (repeatable)")


def machine_named(args: argparse.Namespace) -> bool:
    """Whether any source option names a machine (else: this machine)."""
    return getattr(args, "machine", None) is not None or any(getattr(args, k, None) for k in file_options())


def file_options() -> tuple[str, ...]:
    """The ``args`` attributes of the captured-file options (one per file of each capture source)."""
    from planner.topology.sources import file_keywords

    return file_keywords()


def load_topology(args: argparse.Namespace):
    """The topology the source options name, with ``--capacities`` applied where given.

    Every command that needs a machine takes it from here (``topo``, ``plan``, ``place``,
    ``profile``, ``demo``); options a command lacks count as not given.

    Returns ``(topology, capacities or None)``: the capacities are kept for the
    device models a plan places (:func:`planner.plan.measured_inventory`).
    """
    from planner.topology.discover import live_topology, topology_from_files

    files = {k: getattr(args, k, None) for k in file_options()}
    name = getattr(args, "name", None)
    if machine_named(args):
        topo = topology_from_files(machine=getattr(args, "machine", None), name=name, **files)
    else:
        topo = live_topology(getattr(args, "sys_root", "/sys"))
        if name:
            topo.name = name
    caps = None
    if getattr(args, "capacities", None):
        from planner.capacities import apply_capacities, load_capacities

        caps = load_capacities(args.capacities)
        topo = apply_capacities(topo, caps)
    return topo, caps


def parse_nvlink(pairs: list[str] | None) -> list[tuple[int, int]]:
    """``["0-1", "2:3"]`` -> ``[(0, 1), (2, 3)]`` (the ``--nvlink`` what-if pairs).

    >>> parse_nvlink(["0-1", "2:3"])
    [(0, 1), (2, 3)]
    """
    out = []
    for text in pairs or ():
        try:
            a, b = (int(x) for x in text.replace(":", "-").split("-"))
        except ValueError:
            raise CommandError(f"--nvlink {text!r}: expected two GPU numbers like 0-1") from None
        out.append((a, b))
    return out


def unknown_link_bytes_per_s(args: argparse.Namespace) -> float | None:
    gbps = getattr(args, "unknown_link_gbps", None)
    return gbps * 1e9 if gbps else None


class _ExamplesFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that text with line breaks (the examples) is kept as written:
    RawDescriptionHelpFormatter would also stop the one-paragraph descriptions from wrapping."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def examples(*lines: str) -> dict:
    """``add_parser`` keywords that end a command's ``--help`` with ``lines`` as examples.

    A line ``"CMD  # why"`` keeps its comment; the commands are aligned as typed.

    >>> examples("moment machines")["epilog"]
    'examples:\\n  moment machines'
    """
    return {"formatter_class": _ExamplesFormatter, "epilog": "examples:\n" + "\n".join(f"  {x}" for x in lines)}
