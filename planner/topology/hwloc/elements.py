"""hwloc's XML read element by element: the patterns, the records a walk collects, the small readers.

Used by :mod:`planner.topology.hwloc.parse` (the tree walk) and
:mod:`planner.topology.hwloc.links` (link capacities and NVLinks).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from momentbase.jsontypes import JsonObject
from planner.errors import ParseError
from planner.topology.xmlsafe import XmlDocument

NVLINK_MATRIX = "NVLinkBandwidth"

#: no PCIe link comes near this (Gen7 x32 is 484 GB/s): larger figures are garbage
_MAX_GB_PER_S = 10_000.0

#: tolerance when matching a GB/s figure to generation × width (hwloc prints 6 decimals)
_GBPS_TOLERANCE = 0.002

_BUSID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_PCI_TYPE = re.compile(
    r"^\s*([0-9a-fA-F]{4})\s*\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]"
    r"(?:\s*\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\])?"
    r"(?:\s+([0-9a-fA-F]{2}))?(?:\s+([0-9a-fA-F]{2}))?\s*$"
)
_BRIDGE_PCI = re.compile(r"^([0-9a-fA-F]{1,8}):\[([0-9a-fA-F]{2})-([0-9a-fA-F]{2})\]$")
_BRIDGE_TYPE = re.compile(r"^(\d+)-(\d+)$")

_PACKAGE_TYPES = {"Package", "Socket"}  # "Socket" in XML written by hwloc < 1.11
_IO_TYPES = {"Bridge", "PCIDev", "OSDev", "Misc"}

# OS device names that prove a compute GPU is behind a function. DRM nodes
# (card0, renderD128) are left out: a BMC's VGA has them too.
_GPU_OSDEV = re.compile(r"^(nvml|cuda|opencl|rsmi|ze|levelzero|ve)\d", re.I)
_GPU_SUBTYPES = {"cuda", "nvml", "opencl", "rsmi", "levelzero", "ze"}
_NET_OSDEV = re.compile(r"^(ib\d|mlx\d+_\d|hfi\d+_\d|bxi\d|qib\d|eth\d|en[ops]|ib[ps]\d|bnxt_re\d|efa_?\d|irdma)",
                        re.I)
_GPU_NAME = re.compile(r"tesla|geforce|quadro|rtx|titan|instinct|radeon|firepro|\b[ahvp]100\b|h200", re.I)


@dataclass
class _Fn:
    """One PCI function as hwloc described it."""

    address: str
    line: int | None
    is_bridge: bool
    class_code: str | None = None
    vendor_id: str | None = None
    device_id: str | None = None
    subsystem: str | None = None
    revision: str | None = None
    secondary_bus: int | None = None
    subordinate_bus: int | None = None
    parent: str | None = None
    gb_per_s: float | None = None
    infos: dict[str, str] = field(default_factory=dict)
    subtype: str | None = None
    osdevs: list[_OsDev] = field(default_factory=list)
    locality: tuple[int, ...] = ()  # normal objects a root function hangs under, outermost first
    numa_node: int | None = None


@dataclass
class _OsDev:
    name: str
    subtype: str | None
    categories: frozenset[str]
    infos: dict[str, str]


@dataclass
class _Normal:
    """A non-I/O object (Machine, Package, Group, NUMANode, caches, ...)."""

    type: str
    os_index: int | None
    nodeset: frozenset[int] | None
    numas: set[int] = field(default_factory=set)


@dataclass
class _Walk:
    """Everything the tree walk collected."""

    major: int
    normals: list[_Normal] = field(default_factory=list)
    packages: dict[int, JsonObject] = field(default_factory=dict)
    numas: dict[int, JsonObject] = field(default_factory=dict)
    numa_pkg_candidates: dict[int, set[int]] = field(default_factory=dict)
    fns: dict[str, _Fn] = field(default_factory=dict)
    gp: dict[int, tuple[str, Any]] = field(default_factory=dict)
    machine_infos: dict[str, str] = field(default_factory=dict)
    elems: dict[str, ET.Element] = field(default_factory=dict)  # PCI address -> its element
    duplicates: list[str] = field(default_factory=list)  # "address (lines a, b)" of identical repeats
    repeats: list[str] = field(default_factory=list)  # "address (line a: 'x'; line b: 'y')" of different ones


@dataclass(frozen=True)
class _Ctx:
    chain: tuple[int, ...] = ()  # indexes of normal ancestors, outermost first
    package: int | None = None
    numa: int | None = None  # a NUMANode ancestor (XML v1)
    pci_parent: str | None = None  # the PCI bridge above
    pci_fn: str | None = None  # the PCI function an OS device belongs to
    in_io: bool = False


# -- small readers ---------------------------------------------------------------


def _version_major(doc: XmlDocument, root: ET.Element, source: str) -> int:
    version = root.get("version")
    if version is None:
        return 1
    head = version.split(".")[0]
    if not head.isdigit():
        raise ParseError(source, doc.line(root), 'a topology version like "2.0"', version)
    return int(head)


def _infos(elem: ET.Element) -> dict[str, str]:
    out: dict[str, str] = {}
    for info in elem.findall("info"):
        out.setdefault(info.get("name", ""), info.get("value", ""))
    return out


def _opt_int(doc: XmlDocument, elem: ET.Element, attr: str, source: str) -> int | None:
    value = elem.get(attr)
    if value is None:
        return None
    v = value.strip()
    if not v.isdigit() or len(v) > 20:
        raise ParseError(source, doc.line(elem), f"{attr} as a non-negative whole number", value)
    return int(v)


def _req_int(doc: XmlDocument, elem: ET.Element, attr: str, source: str) -> int:
    value = _opt_int(doc, elem, attr, source)
    if value is None:
        raise ParseError(source, doc.line(elem), f"a {attr} attribute", f"<{elem.tag}>")
    return value


def _busid(text: str, source: str, line: int | None) -> str:
    m = _BUSID.match(text.strip())
    if not m:
        raise ParseError(source, line, "a PCI address like 0000:85:02.0", text)
    domain = int(m.group(1), 16)
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def _bitmap(text: str | None) -> frozenset[int] | None:
    """The set bits of an hwloc bitmap string (``"0x00000303,0x03030000,,0x3"``).

    ``None`` for a missing, infinite (``0xf...f``) or unreadable bitmap.
    """
    if not text or "f...f" in text:
        return None
    words = text.split(",")
    bits: set[int] = set()
    for pos, word in enumerate(reversed(words)):
        w = word.strip()
        if not w:
            continue
        if w.startswith(("0x", "0X")):
            w = w[2:]
        try:
            value = int(w, 16)
        except ValueError:
            return None
        base = 32 * pos
        while value and base < 1 << 16:
            if value & 1:
                bits.add(base)
            value >>= 1
            base += 1
    return frozenset(bits)


# hwloc 1.x and 2.x number OS device types 0..5; 3.x makes them bits (the
# layout the fixtures' 3.0 exports show: nvml 12 = GPU|COPROC, eth 16,
# mlx4_0 48 = NETWORK|OPENFABRICS, sda 1).
_OSDEV_ENUM = {0: "storage", 1: "gpu", 2: "network", 3: "openfabrics", 4: "dma", 5: "coproc"}
_OSDEV_BITS = {1: "storage", 2: "memory", 4: "gpu", 8: "coproc", 16: "network",
               32: "openfabrics", 64: "dma"}


def _osdev_categories(doc: XmlDocument, elem: ET.Element, major: int, source: str) -> frozenset[str]:
    value = _opt_int(doc, elem, "osdev_type", source)
    if value is None:
        return frozenset()
    if major >= 3:
        return frozenset(name for bit, name in _OSDEV_BITS.items() if value & bit)
    return frozenset({_OSDEV_ENUM[value]} if value in _OSDEV_ENUM else ())
