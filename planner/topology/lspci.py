r"""Read ``lspci`` output: the tree (``-t``, ``-tv``) and the dumps (``-v`` … ``-vvv``, ``-nn``).

The two kinds of output complement each other. ``lspci -tv`` draws the whole
hierarchy — which bridge every function hangs under — but says nothing of
classes, links, NUMA nodes or slots. ``lspci -vvv`` lists all that per
function (``-s BB:DD.F`` for one device) and gives the hierarchy only through
each bridge's bus numbers. Both become :class:`PciFunction` records;
:func:`merge_lspci` joins them by address and :func:`topology_from_lspci`
builds the :class:`~planner.topology.model.Topology` with
:func:`~planner.topology.pcitree.build_pci_topology`.

Without a class code (``-t`` output), the device name decides the class
where it is unambiguous (:func:`class_from_name`): "NVMe SSD Controller" is
``0108``, but a HighPoint "NVMe RAID Controller" is a RAID controller
(``0104``), and AMD's unnamed internal functions ("Device 14ac") stay
unknown. Records whose class came from the name say so in
``attrs["class_from_name"]``.

>>> tree = r'''
... -[0000:00]-+-00.0  Intel Corporation Device 2020
...            \-01.0-[01-02]----00.0-[02]----00.0  NVIDIA Corporation GA100 [A100 PCIe 80GB]
... '''
>>> for f in parse_lspci_tree(tree, "lspci-tv.txt"):
...     print(f.address, f.parent, f.is_bridge, f.class_code, f.name or "-")
0000:00:00.0 None False None Intel Corporation Device 2020
0000:00:01.0 None True None -
0000:01:00.0 0000:00:01.0 True None -
0000:02:00.0 0000:01:00.0 False 0302 NVIDIA Corporation GA100 [A100 PCIe 80GB]
>>> topo = topology_from_lspci(tree, source="lspci-tv.txt")
>>> [n.id for n in topo.nodes("gpu")], topo.parent("pci:0000:02:00.0").id
(['pci:0000:02:00.0'], 'socket?')

This module is long because lspci has two output formats that describe the
same functions (the tree, the dumps), a table of pci.ids class and vendor
names to read them without ``-nn``, and the checks that refuse a dump cut
short; they share the address and naming rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from planner.errors import ParseError, TopologyError
from planner.topology.model import Topology
from planner.topology.pcie import gen_from_gts
from planner.topology.pcitree import PciFunction, build_pci_topology, normalize_address
from planner.topology.textio import guess_format, text_lines

__all__ = [
    "CLASS_NAMES",
    "class_from_name",
    "merge_lspci",
    "parse_lspci",
    "parse_lspci_tree",
    "parse_lspci_verbose",
    "topology_from_lspci",
    "vendor_from_name",
]

# ---------------------------------------------------------------------------
# Names → class codes and vendor ids

#: the class names ``lspci`` prints without ``-nn`` (pci.ids subclass names;
#: a class name stands for the class only where pci.ids gives the "other"
#: subclass 80 the same name), lower-cased, to the 4-digit class code
CLASS_NAMES: Mapping[str, str] = {
    "non-vga unclassified device": "0000",
    "vga compatible unclassified device": "0001",
    "image coprocessor": "0005",
    "scsi storage controller": "0100",
    "ide interface": "0101",
    "floppy disk controller": "0102",
    "ipi bus controller": "0103",
    "raid bus controller": "0104",
    "ata controller": "0105",
    "sata controller": "0106",
    "serial attached scsi controller": "0107",
    "non-volatile memory controller": "0108",
    "universal flash storage controller": "0109",
    "mass storage controller": "0180",
    "ethernet controller": "0200",
    "token ring network controller": "0201",
    "fddi network controller": "0202",
    "atm network controller": "0203",
    "isdn controller": "0204",
    "worldfip controller": "0205",
    "picmg controller": "0206",
    "infiniband controller": "0207",
    "fabric controller": "0208",
    "network controller": "0280",
    "vga compatible controller": "0300",
    "xga compatible controller": "0301",
    "3d controller": "0302",
    "display controller": "0380",
    "multimedia video controller": "0400",
    "multimedia audio controller": "0401",
    "computer telephony device": "0402",
    "audio device": "0403",
    "multimedia controller": "0480",
    "ram memory": "0500",
    "flash memory": "0501",
    "cxl": "0502",
    "memory controller": "0580",
    "host bridge": "0600",
    "isa bridge": "0601",
    "eisa bridge": "0602",
    "microchannel bridge": "0603",
    "pci bridge": "0604",
    "pcmcia bridge": "0605",
    "nubus bridge": "0606",
    "cardbus bridge": "0607",
    "raceway bridge": "0608",
    "semi-transparent pci-to-pci bridge": "0609",
    "infiniband to pci host bridge": "060a",
    "bridge": "0680",
    "serial controller": "0700",
    "parallel controller": "0701",
    "multiport serial controller": "0702",
    "modem": "0703",
    "gpib controller": "0704",
    "smard card controller": "0705",  # sic, as in pci.ids
    "communication controller": "0780",
    "pic": "0800",
    "dma controller": "0801",
    "timer": "0802",
    "rtc": "0803",
    "pci hot-plug controller": "0804",
    "sd host controller": "0805",
    "iommu": "0806",
    "system peripheral": "0880",
    "keyboard controller": "0900",
    "digitizer pen": "0901",
    "mouse controller": "0902",
    "scanner controller": "0903",
    "gameport controller": "0904",
    "input device controller": "0980",
    "generic docking station": "0a00",
    "docking station": "0a80",
    "firewire (ieee 1394)": "0c00",
    "access bus": "0c01",
    "ssa": "0c02",
    "usb controller": "0c03",
    "fibre channel": "0c04",
    "smbus": "0c05",
    "infiniband": "0c06",
    "ipmi interface": "0c07",
    "sercos interface": "0c08",
    "canbus": "0c09",
    "serial bus controller": "0c80",
    "irda controller": "0d00",
    "consumer ir controller": "0d01",
    "rf controller": "0d10",
    "bluetooth": "0d11",
    "broadband": "0d12",
    "wireless controller": "0d80",
    "network and computing encryption device": "1000",
    "entertainment encryption device": "1010",
    "encryption controller": "1080",
    "dpio module": "1100",
    "performance counters": "1101",
    "communication synchronizer": "1110",
    "signal processing management": "1120",
    "signal processing controller": "1180",
    "processing accelerators": "1200",
    "unassigned class": "ff00",
}

#: pci.ids vendor names as lspci prints them, to their vendor ids
_VENDORS: tuple[tuple[str, str], ...] = (
    ("NVIDIA Corporation", "10de"),
    ("Advanced Micro Devices, Inc. [AMD/ATI]", "1002"),
    ("Advanced Micro Devices, Inc. [AMD]", "1022"),
    ("Intel Corporation", "8086"),
    ("Mellanox Technologies", "15b3"),
    ("Samsung Electronics Co Ltd", "144d"),
    ("Broadcom / LSI", "1000"),
    ("Broadcom Inc. and subsidiaries", "14e4"),
    ("PLX Technology, Inc.", "10b5"),
    ("ASPEED Technology, Inc.", "1a03"),
    ("Matrox Electronics Systems Ltd.", "102b"),
    ("HighPoint Technologies, Inc.", "1103"),
    ("Kingston Technology Company, Inc.", "2646"),
    ("Micron Technology Inc", "1344"),
    ("Marvell Technology Group Ltd.", "1b4b"),
    ("ASMedia Technology Inc.", "1b21"),
    ("Sandisk Corp", "15b7"),
    ("SK hynix", "1c5c"),
    ("KIOXIA Corporation", "1e0f"),
    ("Toshiba Corporation", "1179"),
    ("Phison Electronics Corporation", "1987"),
    ("Silicon Motion, Inc.", "126f"),
    ("Xilinx Corporation", "10ee"),
    ("Amazon.com, Inc.", "1d0f"),
    ("PLDA", "1556"),
)


def vendor_from_name(name: str) -> str | None:
    """The PCI vendor id of a device name that starts with a known pci.ids vendor name.

    >>> vendor_from_name("NVIDIA Corporation AD102GL [RTX 6000 Ada Generation]")
    '10de'
    >>> vendor_from_name("Advanced Micro Devices, Inc. [AMD] Device 14ac")
    '1022'
    >>> vendor_from_name("Device 14ac") is None
    True
    """
    for vendor, vid in _VENDORS:
        if name == vendor or name.startswith(vendor + " "):
            return vid
    return None


_NVIDIA_CHIP = re.compile(r"\b(?:G[A-Z]{1,2}\d{2,3}|AD\d{3}|TU\d{3})[A-Z]*\b")
_NVIDIA_NOT_GPU = re.compile(r"Switch|Bridge|UCSI|\bUSB\b|Audio", re.I)
_NVIDIA_DISPLAY = re.compile(r"GeForce|Quadro|\bRTX\b|TITAN|\bNVS\b")
_AMD_GPU = re.compile(
    r"Radeon|Instinct|FirePro|\bMI\d{2,3}|Navi|Vega|Polaris|Aldebaran|Arcturus|Ellesmere|Fiji"
)
_AMD_ACCEL = re.compile(r"Instinct|\bMI\d{2,3}|Aldebaran|Arcturus")

# Ordered: storage controllers that merely *mention* NVMe or SATA (RAID cards
# such as the HighPoint SSD7540 "NVMe RAID Controller", Intel VMD) come
# before the SSD rule, and a GPU's HDMI audio before anything GPU-like.
_NAME_CLASS_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bRAID\b|MegaRAID"), "0104"),
    (re.compile(r"\bSAS\d*\b|\bSAS-\d|Serial Attached SCSI|Fusion-MPT"), "0107"),
    (re.compile(r"\bSATA\b|Serial ATA|\bAHCI\b"), "0106"),
    (re.compile(r"Non-Volatile memory controller|\bNVMe\b|NVM Express|\bSSD\b|Solid State",
                re.I), "0108"),
    (re.compile(r"\bAudio\b|\bHDMI\b", re.I), "0403"),
    (re.compile(r"\bUSB\d?\b|\bxHCI\b", re.I), "0c03"),
    (re.compile(r"\bSMBus\b"), "0c05"),
    (re.compile(r"\bInfiniBand\b", re.I), "0207"),
    (re.compile(r"\bEthernet\b|Network Connection|\bNetXtreme\b|\b\d+GbE\b"), "0200"),
    (re.compile(r"\bConnectX|\bBlueField|Network (?:controller|Adapter)|Wi-Fi|Wireless"
                r"|Elastic Fabric Adapter|Omni-Path"), "0280"),
)


def class_from_name(name: str) -> str | None:
    """The PCI class code a device name makes certain, or ``None``.

    For output that has no class codes (``lspci -tv``). Only names that
    leave no doubt get a class: an NVIDIA chip name is a GPU, a HighPoint
    "NVMe RAID Controller" is a RAID controller (not an SSD), an AMD
    internal "Device 14ac" is unknown.

    >>> class_from_name("Samsung Electronics Co Ltd NVMe SSD Controller S4LV008[Pascal]")
    '0108'
    >>> class_from_name("HighPoint Technologies, Inc. SSD7540 PCIe Gen4 x16 8-Port M.2 NVMe RAID Controller")
    '0104'
    >>> class_from_name("NVIDIA Corporation GH100 [H100 SXM5 80GB]")
    '0302'
    >>> class_from_name("NVIDIA Corporation AD102 High Definition Audio Controller")
    '0403'
    >>> class_from_name("Mellanox Technologies MT2910 Family [ConnectX-7]")
    '0280'
    >>> class_from_name("Advanced Micro Devices, Inc. [AMD] Device 14ac") is None
    True
    """
    if not name:
        return None
    for pattern, code in _NAME_CLASS_RULES:
        if pattern.search(name):
            return code
    if name.startswith("NVIDIA Corporation "):
        if "NVSwitch" in name:
            return "0680"
        if _NVIDIA_CHIP.search(name) and not _NVIDIA_NOT_GPU.search(name):
            return "0300" if _NVIDIA_DISPLAY.search(name) else "0302"
        return None
    if name.startswith("Advanced Micro Devices, Inc. [AMD/ATI] "):
        if _AMD_GPU.search(name) and not re.search(r"Switch|Bridge|USB", name):
            return "0380" if _AMD_ACCEL.search(name) else "0300"
        return None
    if re.search(r"\bVGA\b|Graphics", name):
        return "0300"  # a BMC's or an integrated display; the vendor says whether it is a GPU
    return None


def _ids_from_name(name: str) -> tuple[str, str | None, str | None]:
    """(name without ids, vendor id, device id) of a name that may end in ``[vvvv:dddd]``."""
    m = re.fullmatch(r"(?:(?:Unknown )?[Dd]evice )?([0-9a-fA-F]{4}):([0-9a-fA-F]{4})", name)
    if m:  # -n output, or a device pci.ids does not know
        return "", m.group(1).lower(), m.group(2).lower()
    m = re.fullmatch(r"(.*?)\s*\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]", name)
    if m:
        return m.group(1), m.group(2).lower(), m.group(3).lower()
    return name, None, None


def _named_function(address: str, name: str, **fields: Any) -> PciFunction:
    """A function whose class (unless given) and vendor come from its name."""
    name, vendor, device = _ids_from_name(name)
    attrs = dict(fields.pop("attrs", {}))
    class_code = fields.pop("class_code", None)
    if class_code is None and not fields.get("is_bridge"):
        class_code = class_from_name(name)
        if class_code is not None:
            attrs["class_from_name"] = True
    return PciFunction(
        address, class_code=class_code, vendor_id=vendor or vendor_from_name(name),
        device_id=device, name=name, attrs=attrs, **fields,
    )


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
    """
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


# ---------------------------------------------------------------------------
# lspci -v / -vv / -vvv (with or without -nn), whole dumps and -s dumps

_HEADER = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])"
    r" (?P<cls>[^:\n]*?)(?: \[(?P<cc>[0-9a-fA-F]{4})\])?:(?: (?P<rest>.*))?$"
)
_REST = re.compile(
    r"^(?P<name>.*?)(?: \(rev (?P<rev>[0-9a-fA-F]{2})\))?"
    r"(?: \(prog-if (?P<progif>[0-9a-fA-F]{2})(?: \[[^\]]*\])?\))?$"
)
_EXPRESS = re.compile(
    r"^\[[0-9a-fA-F]+(?: v\d+)?\] Express (?:\(v(?P<ver>\d+)\) )?(?P<type>.*?)"
    r"(?:, (?:MSI|IntMsgNum) [0-9a-fA-F]+)?$"
)
_PORT_TYPES = {
    "endpoint": "endpoint",
    "legacy endpoint": "legacy-endpoint",
    "root port": "root",
    "upstream port": "upstream",
    "downstream port": "downstream",
    "pci-express to pci/pci-x bridge": "pci-bridge",
    "pci/pci-x to pci-express bridge": "pci-bridge",
    "root complex integrated endpoint": "rc-endpoint",
}
_BUS = re.compile(
    r"^primary=(?P<pri>[0-9a-fA-F]{2}), secondary=(?P<sec>[0-9a-fA-F]{2}), "
    r"subordinate=(?P<sub>[0-9a-fA-F]{2})\b"
)
# Digit runs are bounded: int() refuses strings over 4300 digits.
_LNKCAP = re.compile(r"^Port #\d+, Speed (?P<speed>[^,]*), Width x(?P<width>\d{1,3})\b")
_LNKSTA = re.compile(r"^Speed (?P<speed>[^,]*), Width x(?P<width>\d{1,3})\b")
_SPEED = re.compile(r"^(?P<rate>\d{1,3}(?:\.\d{1,3})?)\s*(?:GT/s|Gb/s)")
_SLOT_NUMBER = re.compile(r"\bSlot #(\d{1,9})\b")

_EXPECT_HEADER = "a device line like '00:01.0 PCI bridge [0604]: ...'"


def _indent(line: str) -> int:
    expanded = line.expandtabs(8)
    return len(expanded) - len(expanded.lstrip())


def _link(value: str, pattern: re.Pattern[str], what: str, source: str, lineno: int,
          line: str) -> tuple[int, int] | None:
    """(generation, lanes) of a LnkCap/LnkSta value; ``None`` when unknown or down (x0)."""
    m = pattern.match(value)
    if m is None:
        raise ParseError(source, lineno, f"a {what} like 'Speed 8GT/s, Width x4'", line.strip())
    width = int(m.group("width"))
    speed = m.group("speed").strip()
    if speed.startswith("unknown") or width == 0:
        return None
    s = _SPEED.match(speed)
    if s is None or not 1 <= width <= 32:
        raise ParseError(source, lineno, f"a {what} with a speed in GT/s and a width x1..x32",
                         line.strip())
    try:
        return gen_from_gts(float(s.group("rate"))), width
    except TopologyError:
        raise ParseError(source, lineno, f"a PCIe lane rate in the {what} (2.5, 5, 8, 16, 32, 64 GT/s)",
                         line.strip()) from None


def _verbose_function(lineno: int, m: re.Match[str], details: list[tuple[int, str]],
                      source: str) -> PciFunction:
    """One device block: its header line number and match, and its indented lines."""
    addr = normalize_address(
        f"{m.group('domain') or '0000'}:{m.group('bus')}:{m.group('dev')}.{m.group('fn')}")
    cls = m.group("cls").strip()
    text = (m.group("rest") or "").strip()
    if text.count("[") != text.count("]") or text.count("(") != text.count(")"):
        raise ParseError(source, lineno, "a complete device line (a bracket is not closed: "
                         "is the text cut off?)", m.group(0))
    rest = _REST.match(text)
    assert rest is not None  # the pattern matches any string
    name, vendor, device = _ids_from_name(rest.group("name").strip())
    if m.group("cc") and vendor is None:
        # -nn prints "[vvvv:dddd]" whenever it prints "[cccc]"
        raise ParseError(source, lineno, "vendor and device ids '[vvvv:dddd]' after the name, "
                         "as lspci -nn prints them", m.group(0))
    attrs: dict[str, Any] = {}
    class_code = (m.group("cc") or "").lower() or None
    if class_code is None:
        numeric = re.fullmatch(r"(?:Class )?([0-9a-fA-F]{4})", cls)
        class_code = numeric.group(1).lower() if numeric else CLASS_NAMES.get(cls.lower())
    if class_code is None:
        class_code = class_from_name(name)
        if class_code is not None:
            attrs["class_from_name"] = True
    if cls and not re.fullmatch(r"[0-9a-fA-F]{4}", cls):
        attrs["class_name"] = cls
    if rest.group("rev"):
        attrs["revision"] = rest.group("rev").lower()

    numa: int | None = None
    physical_slot: str | None = None
    bus: re.Match[str] | None = None
    port_type: str | None = None
    slot_flag: bool | None = None
    slot_number: int | None = None
    link_cap: tuple[int, int] | None = None
    link_sta: tuple[int, int] | None = None
    sltcap_indent: int | None = None
    for lineno, line in details:
        s = line.strip()
        ind = _indent(line)
        if sltcap_indent is not None:
            if ind > sltcap_indent:  # SltCap's second line holds "Slot #168, PowerLimit ..."
                n = _SLOT_NUMBER.search(s)
                if n:
                    slot_number = int(n.group(1))
                continue
            sltcap_indent = None
        key, sep, value = s.partition(":")
        if not sep:
            continue  # a continuation line of a field we do not read
        value = value.strip()
        if key == "NUMA node":
            if not re.fullmatch(r"-?\d{1,4}", value):
                raise ParseError(source, lineno, "a NUMA node number like 'NUMA node: 0'", s)
            numa = int(value) if int(value) >= 0 else None
        elif key == "Physical Slot" and value:
            physical_slot = value
        elif key == "Bus":
            bus = _BUS.match(value)
            if bus is None:
                raise ParseError(source, lineno,
                                 "'Bus: primary=BB, secondary=BB, subordinate=BB'", s)
        elif key == "Capabilities":
            x = _EXPRESS.match(value)
            if x is not None:
                t = re.fullmatch(r"(.*?)(?: \(Slot([+-])\))?", x.group("type").strip())
                assert t is not None  # the pattern matches any string
                port_type = _PORT_TYPES.get(t.group(1).lower())
                attrs["express_type"] = t.group(1)
                if t.group(2):
                    slot_flag = t.group(2) == "+"
        elif key == "LnkCap":
            link_cap = _link(value, _LNKCAP, "LnkCap", source, lineno, line)
        elif key == "LnkSta":
            link_sta = _link(value, _LNKSTA, "LnkSta", source, lineno, line)
        elif key == "SltCap":
            sltcap_indent = ind
            n = _SLOT_NUMBER.search(value)  # older lspci prints it on the same line
            if n:
                slot_number = int(n.group(1))
        elif key == "Subsystem" and value:
            attrs["subsystem"] = value
        elif key == "DeviceName" and value:
            attrs["device_name"] = value
        elif key == "Kernel driver in use" and value:
            attrs["driver"] = value

    is_bridge = bus is not None or (class_code or "") in ("0604", "0609")
    secondary = subordinate = None
    if bus is not None:
        own = int(m.group("bus"), 16)
        sec, sub = int(bus.group("sec"), 16), int(bus.group("sub"), 16)
        if own < sec <= sub:
            secondary, subordinate = sec, sub
        else:
            # "secondary=00, subordinate=00": the firmware never numbered
            # this bridge's buses (a disabled port); nothing can be below it.
            attrs["bus_numbers_unassigned"] = True

    slot: str | None
    if is_bridge:
        if physical_slot is not None:
            attrs["physical_slot"] = physical_slot  # the slot the bridge sits in, not the one it drives
        if slot_flag is not None:
            attrs["slot_implemented"] = slot_flag
        if slot_number is not None:
            attrs["slot_number"] = slot_number
        # PCIe base spec, Slot Capabilities: the physical slot number "must
        # be initialized to zero for ports connected to devices that are
        # integrated on the system board". Slot+ ports numbered 0 (AMD root
        # ports, Intel PCH ports to on-board NICs) are not real slots.
        slot = str(slot_number) if slot_flag and slot_number else None
    else:
        slot = physical_slot
    return PciFunction(
        addr, class_code=class_code, vendor_id=vendor or vendor_from_name(name), device_id=device,
        name=name, is_bridge=is_bridge, secondary_bus=secondary, subordinate_bus=subordinate,
        port_type=port_type, link_cap=link_cap, link_sta=link_sta, numa_node=numa, slot=slot,
        attrs=attrs,
    )


def parse_lspci_verbose(text: str, source: str = "<lspci -vvv>", *,
                        notes: list[str] | None = None) -> list[PciFunction]:
    r"""The PCI functions of ``lspci -v``/``-vv``/``-vvv`` output, with or without ``-nn``.

    Reads a whole dump or a single-device ``-s`` dump, TAB-indented (as
    printed) or space-indented (as pasted into a document). Each function
    gets its class code (from ``[cccc]`` or, without ``-nn``, from the class
    name), ids, name, NUMA node, bus numbers (bridges), PCIe port type,
    link capability and status as (generation, lanes) — a link that is down
    (``Width x0``) has ``link_sta`` ``None`` — and slot: for a port with
    ``(Slot+)`` the ``SltCap`` slot number (``attrs["slot_implemented"]``
    is set; slot number 0 means an on-board device, no slot), for an
    endpoint its ``Physical Slot``. Lines before the first device line
    (a ``sudo`` prompt) are skipped.

    >>> fns = parse_lspci_verbose('''\
    ... 85:02.0 PCI bridge [0604]: Intel Corporation Sky Lake-E PCI Express Root Port C [8086:2032]
    ... \tNUMA node: 1
    ... \tBus: primary=85, secondary=88, subordinate=88, sec-latency=0
    ... \tCapabilities: [90] Express (v2) Root Port (Slot+), MSI 00
    ... \t\tLnkCap:\tPort #3, Speed 8GT/s, Width x4, ASPM L1, Exit Latency L1 <16us
    ... \t\tLnkSta:\tSpeed 8GT/s, Width x4
    ... \t\tSltCap:\tAttnBtn- PwrCtrl- MRL- AttnInd- PwrInd- HotPlug+ Surprise+
    ... \t\t\tSlot #168, PowerLimit 0W; Interlock- NoCompl-
    ...
    ... 88:00.0 Non-Volatile memory controller: Intel Corporation NVMe Datacenter SSD (prog-if 02 [NVM Express])
    ... \tPhysical Slot: 168
    ... \tNUMA node: 1
    ... ''', "dump.txt")
    >>> port, ssd = fns
    >>> port.port_type, port.secondary_bus, port.slot, port.link_cap, port.attrs["slot_implemented"]
    ('root', 136, '168', (3, 4), True)
    >>> ssd.class_code, ssd.vendor_id, ssd.slot, ssd.numa_node
    ('0108', '8086', '168', 1)
    """
    blocks: list[tuple[int, re.Match[str], list[tuple[int, str]]]] = []
    first_line: tuple[int, str] | None = None
    seen: set[str] = set()
    for lineno, line in enumerate(text_lines(text), 1):
        if not line.strip():
            continue
        if first_line is None:
            first_line = (lineno, line)
        if line[0] in " \t":
            if blocks:
                blocks[-1][2].append((lineno, line))
            continue  # detail lines with no device line above them: see below
        m = _HEADER.match(line.rstrip())
        if m is None:
            if blocks and not _STRAY.match(line):
                raise ParseError(source, lineno, _EXPECT_HEADER + " or an indented detail line", line)
            continue  # a stray line before the first device, or a sudo prompt
        key = normalize_address(
            f"{m.group('domain') or '0000'}:{m.group('bus')}:{m.group('dev')}.{m.group('fn')}")
        if key in seen:
            raise ParseError(source, lineno, f"each PCI function once, but {key} appears again", line)
        seen.add(key)
        blocks.append((lineno, m, []))
    if not blocks:
        if first_line is None:
            raise ParseError(source, None, "lspci output with " + _EXPECT_HEADER, "an empty text")
        raise ParseError(source, first_line[0],
                         "lspci output with " + _EXPECT_HEADER + _hint(text, "lspci -v"), first_line[1])
    very_verbose = any(_top_fields(details).get("Status") for _, _, details in blocks)
    for lineno, m, details in blocks:
        _check_block(lineno, m, details, very_verbose, source)
    lines = text_lines(text)
    if len(blocks) > 1 and notes is not None and (len(lines) < 2 or lines[-1] or lines[-2].strip()):
        # lspci ends every device with a blank line; a one-device paste often drops it
        last = blocks[-1]
        notes.append(f"{source}: the text ends without the blank line lspci prints after every device: "
                     f"{last[1].group('bus')}:{last[1].group('dev')}.{last[1].group('fn')} "
                     f"(line {last[0]}) may be cut short")
    return [_verbose_function(lineno, m, details, source) for lineno, m, details in blocks]


_CUT = "the capture is cut short (or was edited)"


def _top_fields(details: list[tuple[int, str]]) -> dict[str, list[tuple[int, str]]]:
    """A device block's first-level fields: key -> [(line number, value), ...]."""
    if not details:
        return {}
    base = min(_indent(line) for _, line in details)
    out: dict[str, list[tuple[int, str]]] = {}
    for no, line in details:
        if _indent(line) == base:
            key, _, value = line.strip().partition(":")
            out.setdefault(key, []).append((no, value.strip()))
    return out


def _check_block(lineno: int, m: re.Match[str], details: list[tuple[int, str]], very_verbose: bool,
                 source: str) -> None:
    """Refuse a device block that a cut (or an edit) left without what lspci always prints.

    At ``-vv`` and above lspci prints ``Control:`` and ``Status:`` for every
    function; when the status says ``Cap+`` it lists the capabilities (or
    prints ``Capabilities: <access denied>`` when not run as root); an
    Express capability of a port or endpoint always ends with its link
    lines (``LnkCap`` … ``LnkSta``).
    """
    addr = f"{m.group('bus')}:{m.group('dev')}.{m.group('fn')}"
    top = _top_fields(details)
    if not very_verbose or any("Unknown header type" in line for _, line in details):
        return
    status = top.get("Status")
    if status is None:
        raise ParseError(source, lineno, f"the 'Control:' and 'Status:' lines lspci -vv prints for {addr}",
                         f"a block without them: {_CUT}")
    caps = top.get("Capabilities", [])
    if status[0][1].startswith("Cap+") and not caps:
        raise ParseError(source, lineno,
                         f"the capability list that 'Status: Cap+' announces for {addr} "
                         "(or 'Capabilities: <access denied>' from a run without root)",
                         f"a block without it: {_CUT}")
    for no, value in caps:
        x = _EXPRESS.match(value)
        if x is None:
            continue
        kind = re.sub(r" \(Slot[+-]\)$", "", x.group("type").strip()).lower()
        if kind not in _PORT_TYPES or _PORT_TYPES[kind] == "rc-endpoint":
            continue  # an integrated endpoint or event collector has no link
        below = _express_keys(details, no)
        if "LnkSta" not in below:
            raise ParseError(source, no, f"the link lines (LnkCap … LnkSta) of {addr}'s Express capability",
                             f"{'the end of the block' if below else 'nothing'} after "
                             f"{', '.join(below) or 'the capability line'}: {_CUT}")


def _express_keys(details: list[tuple[int, str]], cap_line: int) -> list[str]:
    """The keys of the lines inside the capability that starts at line ``cap_line``."""
    keys: list[str] = []
    cap_indent: int | None = None
    for no, line in details:
        if no == cap_line:
            cap_indent = _indent(line)
            continue
        if cap_indent is None or no < cap_line:
            continue
        if _indent(line) <= cap_indent:
            break
        key, sep, _ = line.strip().partition(":")
        if sep and " " not in key:
            keys.append(key)
    return keys


def parse_lspci(text: str, source: str = "<lspci>", *, notes: list[str] | None = None) -> list[PciFunction]:
    """The PCI functions of ``lspci -t``/``-tv`` or ``lspci -v``… output, whichever ``text`` is.

    >>> [f.address for f in parse_lspci("-[0000:00]---00.0  Intel Corporation Device 2020")]
    ['0000:00:00.0']
    >>> parse_lspci('{"nodes": []}', "topo.json")
    Traceback (most recent call last):
      ...
    planner.errors.ParseError: topo.json:1: expected lspci -t or lspci -v output (this looks like a JSON document, not lspci), found '{"nodes": []}'
    """
    for lineno, raw in enumerate(text_lines(text), 1):
        line = raw.rstrip()
        if not line.strip() or _STRAY.match(line):
            continue
        if _TREE_FIRST.match(line):
            return parse_lspci_tree(text, source)
        if any(_HEADER.match(ln.rstrip()) for ln in text_lines(text)):
            return parse_lspci_verbose(text, source, notes=notes)
        raise ParseError(source, lineno, "lspci -t or lspci -v output"
                         + _hint(text, "lspci -t or lspci -v"), line)
    raise ParseError(source, None, "lspci -t or lspci -v output", "an empty text")


# ---------------------------------------------------------------------------
# Joining the tree with the dumps, and building the topology


def _combine(base: PciFunction, extra: PciFunction) -> PciFunction:
    """``base`` (its place in the hierarchy kept) with what ``extra`` knows about the function."""
    attrs = {**base.attrs, **extra.attrs}
    if extra.class_code and not extra.attrs.get("class_from_name"):
        attrs.pop("class_from_name", None)  # a real class code replaces a guessed one
    return replace(
        base,
        class_code=extra.class_code or base.class_code,
        vendor_id=extra.vendor_id or base.vendor_id,
        device_id=extra.device_id or base.device_id,
        name=extra.name or base.name,
        is_bridge=base.is_bridge or (base.secondary_bus is None and extra.is_bridge),
        secondary_bus=base.secondary_bus if base.secondary_bus is not None else extra.secondary_bus,
        subordinate_bus=(base.subordinate_bus if base.secondary_bus is not None
                         else extra.subordinate_bus),
        port_type=extra.port_type or base.port_type,
        link_cap=extra.link_cap or base.link_cap,
        link_sta=extra.link_sta if (extra.link_cap or extra.link_sta) else base.link_sta,
        numa_node=extra.numa_node if extra.numa_node is not None else base.numa_node,
        slot=extra.slot if extra.slot is not None else base.slot,
        attrs=attrs,
    )


def merge_lspci(tree: Iterable[PciFunction], verbose: Iterable[PciFunction]) -> list[PciFunction]:
    """The functions of an ``lspci -tv`` tree, with what ``lspci -vvv`` dumps add.

    The tree decides the hierarchy (parents, bridges, bus ranges); a dump
    of the same address adds class code, ids, port type, links, NUMA node
    and slot. Functions only the dumps know are appended (their parent is
    then found from the bridges' bus ranges). Several dumps of one function
    combine, later ones winning.

    >>> tree = parse_lspci_tree("-[0000:00]-+-00.0\\n           \\\\-01.1-[01]----00.0")
    >>> dump = parse_lspci_verbose("01:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB]\\n"
    ...                            "\\tNUMA node: 1\\n")
    >>> gpu = merge_lspci(tree, dump)[-1]
    >>> gpu.address, gpu.parent, gpu.class_code, gpu.vendor_id, gpu.numa_node
    ('0000:01:00.0', '0000:00:01.1', '0302', '10de', 1)
    """
    out: dict[str, PciFunction] = {}
    for f in tree:
        addr = normalize_address(f.address)
        out[addr] = replace(f, address=addr) if addr != f.address else f
    for f in verbose:
        addr = normalize_address(f.address)
        g = replace(f, address=addr) if addr != f.address else f
        out[addr] = _combine(out[addr], g) if addr in out else g
    return list(out.values())


def topology_from_lspci(
    tree_text: str | None = None,
    verbose_texts: Iterable[str | tuple[str, str]] = (),
    *,
    source: str = "lspci",
    name: str = "",
    numa_to_socket: Mapping[int, int] | None = None,
) -> Topology:
    """A :class:`Topology` from ``lspci -tv`` text and/or ``lspci -vvv`` texts.

    ``tree_text`` is read with :func:`parse_lspci` (so a whole ``-vvv`` dump
    works there too); each of ``verbose_texts`` is a text or a
    ``(text, source)`` pair and is read with :func:`parse_lspci_verbose`.
    ``source`` names ``tree_text`` in messages. Inconsistent input (a
    function listed twice with different hierarchies, say) raises
    :class:`ParseError` too.

    >>> topo = topology_from_lspci(verbose_texts=[(
    ...     "00:01.1 PCI bridge [0604]: Advanced Micro Devices, Inc. [AMD] Device [1022:14ab]\\n"
    ...     "\\tNUMA node: 0\\n\\tBus: primary=00, secondary=01, subordinate=01, sec-latency=0\\n"
    ...     "\\n01:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330]\\n"
    ...     "\\tNUMA node: 0\\n", "vvnn.txt")])
    >>> topo.counts()["gpu"], topo.socket_of("pci:0000:01:00.0").id, topo.sources
    (1, 'socket0', ['vvnn.txt'])
    """
    tree: list[PciFunction] = []
    verbose: list[PciFunction] = []
    sources: list[str] = []
    notes: list[str] = []
    if tree_text is not None:
        tree = parse_lspci(tree_text, source, notes=notes)
        sources.append(source)
    for i, item in enumerate(verbose_texts):
        if isinstance(item, str):
            text, src = item, f"{source} (dump {i + 1})"
        else:
            text, src = item
        verbose.extend(parse_lspci_verbose(text, src, notes=notes))
        sources.append(src)
    if not sources:
        raise ParseError(source, None, "lspci -t or lspci -vvv output", "nothing")
    functions = merge_lspci(tree, verbose)
    try:
        topo = build_pci_topology(functions, name=name, source=sources[0],
                                  numa_to_socket=numa_to_socket)
    except TopologyError as exc:
        raise ParseError(", ".join(sources), None, "a consistent PCI hierarchy", str(exc)) from None
    topo.sources = sources
    topo.notes.extend(notes)
    return topo
