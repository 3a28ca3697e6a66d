"""Reading ``lspci -t`` / ``-tv``: the whole PCI hierarchy as a drawing (see :mod:`planner.topology.lspci.parse`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.errors import ParseError
from planner.topology.lspci.names import _named_function
from planner.topology.pcitree import PciFunction
from planner.topology.textio import guess_format, text_lines

__all__ = ["parse_lspci_tree"]

# ---------------------------------------------------------------------------
# lspci -t

_STRAY = re.compile(r"^\[sudo\] password for .*:\s*$")
_ROOT_BUS = re.compile(r"\[(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2})\]-")
_DEVFN = re.compile(r"([0-9a-fA-F]{2})\.([0-7])")
_RANGE = re.compile(r"-\[([0-9a-fA-F]{2})(?:-([0-9a-fA-F]{2}))?\]--")
_TREE_FIRST = re.compile(r"^ *(?:-[+\\]?-?|[+\\]-)\[(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}\]-")

_EXPECT_TREE = "lspci -t output: a first line like '-[0000:00]-+-00.0' or '-+-[0000:00]-+-00.0'"


@dataclass(frozen=True)
class _Bus:
    """A bus whose device list is being drawn: its functions hang under ``parent``."""

    domain: str
    number: int
    parent: str | None


_ROOTS = object()  # the list of root buses ("+-[0000:00]-" entries)


class _TreeParser:
    """State of one :func:`parse_lspci_tree` call.

    ``lspci -t`` draws a list's first entries with ``+-`` and its last with
    ``\\-``; later lines repeat the columns of still-open lists as ``|``.
    So a line continues whatever list was opened at the column where its
    own drawing starts; ``open`` maps those columns to their lists.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.open: dict[int, object] = {}
        self.fns: dict[str, PciFunction] = {}
        self.lineno = 0
        self.line = ""

    def fail(self, expected: str, at: int | None = None) -> ParseError:
        found = self.line if at is None else self.line[at:] or "the end of the line"
        return ParseError(self.source, self.lineno, expected, found)

    def first(self, lineno: int, line: str) -> None:
        self.lineno, self.line = lineno, line
        c = len(line) - len(line.lstrip(" "))
        if line.startswith("-[", c):  # one root bus: "-[0000:00]-+-00.0"
            m = _ROOT_BUS.match(line, c + 1)
            if m is None:
                raise self.fail("a root bus like '[0000:00]-'", c + 1)
            self.bus_list(m.end(), self.root_bus(m))
        elif line.startswith(("-+-[", "-\\-["), c):  # several: "-+-[0000:00]-+-00.0"
            self.root_entry(c + 1)
        elif line.startswith(("+-[", "\\-["), c):
            # A tree whose first line was cut off (the RC4ML capture was
            # pruned by a script): the entry continues the root-bus list.
            self.root_entry(c)
        else:
            raise self.fail(_EXPECT_TREE)

    def next(self, lineno: int, line: str) -> None:
        self.lineno, self.line = lineno, line
        c = len(line) - len(line.lstrip(" |"))
        for k in [k for k in self.open if k > c]:
            del self.open[k]  # lists drawn right of this line are finished
        if c == len(line):
            raise self.fail("a tree line with an entry after its '|' columns")
        where = self.open.get(c)
        if where is None or line[c] not in "+\\":
            raise self.fail(f"a tree line continuing an open '+-' branch (column {c + 1} has none)")
        if line[c] == "\\":
            del self.open[c]  # the last entry of its list
        if where is _ROOTS:
            self.root_entry(c)
        else:
            assert isinstance(where, _Bus)
            self.bus_list(c, where)

    def root_bus(self, m: re.Match[str]) -> _Bus:
        return _Bus((m.group(1) or "0000").lower().rjust(4, "0"), int(m.group(2), 16), None)

    def root_entry(self, p: int) -> None:
        """``+-[0000:00]-`` or ``\\-[0000:00]-`` at column ``p``, then the bus's devices."""
        line = self.line
        if line[p] == "+":
            self.open[p] = _ROOTS
        m = _ROOT_BUS.match(line, p + 2)
        if line[p + 1:p + 2] != "-" or m is None:
            raise self.fail("a root bus entry like '+-[0000:00]-'", p)
        self.bus_list(m.end(), self.root_bus(m))

    def bus_list(self, p: int, bus: _Bus) -> None:
        """Entries of ``bus`` from column ``p`` on: ``+-DD.F``, ``\\-DD.F``, ``--DD.F`` or nothing."""
        line = self.line
        while True:
            if p == len(line):
                return  # an empty bus: "-[e4]--"
            mark = line[p:p + 2]
            if mark == "+-":
                self.open[p] = bus
            elif mark not in ("--", "\\-"):
                raise self.fail("'+-', '\\-' or '--' before a device number", p)
            m = _DEVFN.match(line, p + 2)
            if m is None:
                raise self.fail("a device and function number like '00.0'", p + 2)
            addr = f"{bus.domain}:{bus.number:02x}:{m.group(1).lower()}.{m.group(2)}"
            if addr in self.fns:
                raise self.fail(f"each PCI function once, but {addr} appears again")
            q = m.end()
            r = _RANGE.match(line, q)
            if r is not None:  # a bridge, then the devices of its secondary bus
                secondary = int(r.group(1), 16)
                subordinate = int(r.group(2), 16) if r.group(2) else secondary
                if subordinate < secondary:
                    raise self.fail("a bus range like '[31-3d]' with the higher number last", q)
                self.fns[addr] = PciFunction(addr, is_bridge=True, secondary_bus=secondary,
                                             subordinate_bus=subordinate, parent=bus.parent)
                p, bus = r.end(), _Bus(bus.domain, secondary, addr)
                continue
            if q == len(line):
                name = ""  # lspci -t without -v
            elif line.startswith("  ", q) and line[q + 2:].strip():
                name = line[q + 2:].strip()
            else:
                raise self.fail("a bus range like '-[01]--', two spaces and a device name, "
                                "or the end of the line", q)
            self.fns[addr] = _named_function(addr, name, parent=bus.parent)
            return


def parse_lspci_tree(text: str, source: str = "<lspci -t>") -> list[PciFunction]:
    r"""The PCI functions of ``lspci -t`` / ``-tv`` (also ``-tn``, ``-tvnn``) output.

    Every function gets its full address and the address of the bridge
    above it (``parent``, ``None`` on a root bus); bridges get their
    secondary and subordinate bus. Names (``-v``) give a class code where
    :func:`class_from_name` is sure, and a vendor id. A tree whose first
    line is missing (a pruned capture) is read from its first root-bus
    entry. A ``[sudo] password for ...:`` line before the tree is skipped.

    >>> fns = parse_lspci_tree('''-+-[0000:00]-+-00.0
    ...  \\-[0000:30]-+-00.0
    ...              \\-02.0-[31-32]----00.0-[32]--''', "t.txt")
    >>> [(f.address, f.parent, f.secondary_bus, f.subordinate_bus) for f in fns]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('0000:00:00.0', None, None, None), ('0000:30:00.0', None, None, None),
     ('0000:30:02.0', None, 49, 50), ('0000:31:00.0', '0000:30:02.0', 50, 50)]
    >>> parse_lspci_tree("Handle 0x0900, DMI type 9, 17 bytes", "x.txt")
    Traceback (most recent call last):
      ...
    planner.errors.ParseError: x.txt:1: expected lspci -t output: a first line like '-[0000:00]-+-00.0' or '-+-[0000:00]-+-00.0' (this looks like the output of dmidecode, not lspci), found 'Handle 0x0900, DMI type 9, 17 bytes'
    """  # noqa: E501 (a doctest's or a capture's line, as printed)
    parser = _TreeParser(source)
    started = False
    for lineno, raw in enumerate(text_lines(text), 1):
        line = raw.rstrip()
        if not line.strip():
            continue
        if not started:
            if _STRAY.match(line):
                continue
            if not _TREE_FIRST.match(line):
                raise ParseError(source, lineno, _EXPECT_TREE + _hint(text, "lspci -t"), line)
            parser.first(lineno, line)
            started = True
        else:
            parser.next(lineno, line)
    if not started:
        raise ParseError(source, None, _EXPECT_TREE, "an empty text" if not text.strip() else None)
    return list(parser.fns.values())


def _hint(text: str, wanted: str) -> str:
    """`` (this looks like …, not lspci)`` when ``text`` is recognisably something else."""
    what = guess_format(text)
    if what is None:
        return ""
    if what == "the output of lspci":
        what = "the output of lspci -v"
    if what.endswith(wanted):
        return ""
    return f" (this looks like {what}, not {wanted if 'lspci' in what else 'lspci'})"
