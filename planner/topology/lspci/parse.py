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

The tree is read in :mod:`planner.topology.lspci.tree`, the names in
:mod:`planner.topology.lspci.names`; this module reads the dumps and joins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from momentbase.jsontypes import JsonObject
from planner.errors import ParseError, TopologyError
from planner.topology.lspci.names import (
    CLASS_NAMES,
    _ids_from_name,
    class_from_name,
    vendor_from_name,
)
from planner.topology.lspci.tree import _STRAY, _TREE_FIRST, _hint, parse_lspci_tree
from planner.topology.model import Topology
from planner.topology.pcie import gen_from_gts
from planner.topology.pcitree import PciFunction, build_pci_topology, normalize_address
from planner.topology.textio import text_lines

__all__ = ["merge_lspci", "parse_lspci", "parse_lspci_verbose", "topology_from_lspci"]

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
    name, vendor, device, class_code, attrs = _header_fields(lineno, m, source)
    d = _details(details, source, attrs)
    is_bridge = d.bus is not None or (class_code or "") in ("0604", "0609")
    secondary = subordinate = None
    if d.bus is not None:
        own = int(m.group("bus"), 16)
        sec, sub = int(d.bus.group("sec"), 16), int(d.bus.group("sub"), 16)
        if own < sec <= sub:
            secondary, subordinate = sec, sub
        else:
            # "secondary=00, subordinate=00": the firmware never numbered
            # this bridge's buses (a disabled port); nothing can be below it.
            attrs["bus_numbers_unassigned"] = True

    slot: str | None
    if is_bridge:
        if d.physical_slot is not None:
            attrs["physical_slot"] = d.physical_slot  # the slot the bridge sits in, not the one it drives
        if d.slot_flag is not None:
            attrs["slot_implemented"] = d.slot_flag
        if d.slot_number is not None:
            attrs["slot_number"] = d.slot_number
        # PCIe base spec, Slot Capabilities: the physical slot number "must
        # be initialized to zero for ports connected to devices that are
        # integrated on the system board". Slot+ ports numbered 0 (AMD root
        # ports, Intel PCH ports to on-board NICs) are not real slots.
        slot = str(d.slot_number) if d.slot_flag and d.slot_number else None
    else:
        slot = d.physical_slot
    return PciFunction(
        addr, class_code=class_code, vendor_id=vendor or vendor_from_name(name), device_id=device,
        name=name, is_bridge=is_bridge, secondary_bus=secondary, subordinate_bus=subordinate,
        port_type=d.port_type, link_cap=d.link_cap, link_sta=d.link_sta, numa_node=d.numa, slot=slot,
        attrs=attrs,
    )


def _header_fields(lineno: int, m: re.Match[str], source: str
                   ) -> tuple[str, str | None, str | None, str | None, JsonObject]:
    """(name, vendor id, device id, class code, attrs) from a device block's header line."""
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
    attrs: JsonObject = {}
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
    return name, vendor, device, class_code, attrs


class _Details:
    """What a device block's indented lines say that the tree needs."""

    numa: int | None = None
    physical_slot: str | None = None
    bus: re.Match[str] | None = None
    port_type: str | None = None
    slot_flag: bool | None = None
    slot_number: int | None = None
    link_cap: tuple[int, int] | None = None
    link_sta: tuple[int, int] | None = None


def _details(details: list[tuple[int, str]], source: str, attrs: JsonObject) -> _Details:
    """Read a device block's indented lines (other fields go into ``attrs``)."""
    d = _Details()
    sltcap_indent: int | None = None
    for lineno, line in details:
        s = line.strip()
        ind = _indent(line)
        if sltcap_indent is not None:
            if ind > sltcap_indent:  # SltCap's second line holds "Slot #168, PowerLimit ..."
                n = _SLOT_NUMBER.search(s)
                if n:
                    d.slot_number = int(n.group(1))
                continue
            sltcap_indent = None
        key, sep, value = s.partition(":")
        if not sep:
            continue  # a continuation line of a field we do not read
        value = value.strip()
        if key == "NUMA node":
            if not re.fullmatch(r"-?\d{1,4}", value):
                raise ParseError(source, lineno, "a NUMA node number like 'NUMA node: 0'", s)
            d.numa = int(value) if int(value) >= 0 else None
        elif key == "Physical Slot" and value:
            d.physical_slot = value
        elif key == "Bus":
            d.bus = _BUS.match(value)
            if d.bus is None:
                raise ParseError(source, lineno,
                                 "'Bus: primary=BB, secondary=BB, subordinate=BB'", s)
        elif key == "Capabilities":
            x = _EXPRESS.match(value)
            if x is not None:
                t = re.fullmatch(r"(.*?)(?: \(Slot([+-])\))?", x.group("type").strip())
                assert t is not None  # the pattern matches any string
                d.port_type = _PORT_TYPES.get(t.group(1).lower())
                attrs["express_type"] = t.group(1)
                if t.group(2):
                    d.slot_flag = t.group(2) == "+"
        elif key == "LnkCap":
            d.link_cap = _link(value, _LNKCAP, "LnkCap", source, lineno, line)
        elif key == "LnkSta":
            d.link_sta = _link(value, _LNKSTA, "LnkSta", source, lineno, line)
        elif key == "SltCap":
            sltcap_indent = ind
            n = _SLOT_NUMBER.search(value)  # older lspci prints it on the same line
            if n:
                d.slot_number = int(n.group(1))
        elif key in _PLAIN_FIELDS and value:
            attrs[_PLAIN_FIELDS[key]] = value
    return d


#: device block fields kept as they are: lspci's key -> attribute
_PLAIN_FIELDS = {"Subsystem": "subsystem", "DeviceName": "device_name", "Kernel driver in use": "driver"}


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
    """  # noqa: E501 (a doctest's or a capture's line, as printed)
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
