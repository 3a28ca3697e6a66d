"""Draw a topology as a self-contained SVG picture.

The picture is a layered tree read top-down: sockets with their memory
beside them on the first row (inter-socket links drawn between them), then
switches, slots and devices below the part they hang from. Every tree link
is labelled with its PCIe generation × width and its capacity per direction,
and drawn thicker the faster it is (log scale). NVLink links are green arcs
between the GPUs they join. Parts that hang nowhere (no source could place
them) get a separate band labelled "unplaced". A legend explains colours and
line styles.

The layout is a tidy tree: every subtree owns a horizontal interval, sibling
intervals follow each other left to right without overlapping, and a parent
is centred over its children. An interval is as wide as the widest of the
node's box, the label of the link into it and its children's intervals, so
neither boxes nor link labels of one row can collide. A parent with many
leaves — chipset functions, empty slots, slots holding one device — hangs
them in columns from rails, a slot's device drawn to its right: side by side,
the slots of a switch and the bays of a backplane made Machine B's plan
3855 px wide (now about 1850).

Devices the planner placed carry their slot-map numbers ("GPU 3", "SSD 6",
:func:`device_number`); captured ones their bus address. Slots show their
designation as the BIOS or spec gives it (:func:`slot_title`). Names too long
for a box wrap onto a second (third) line; only minor "other" functions are
cut, their tooltip holding the whole name. A plan's bottleneck links are red
and thicker, devices that are themselves the bottleneck (an SSD at its read
limit) are outlined in red, and the legend says so whenever something is red.

Only the standard library builds the SVG (no graphviz, no matplotlib); all
text is XML-escaped. Coordinates are in SVG user units (px).

>>> from planner.topology.model import Link, Node, NodeKind, Topology
>>> topo = Topology(name="toy & co")
>>> _ = topo.add_node(Node("socket0", NodeKind.SOCKET, "socket 0", numa_node=0))
>>> _ = topo.add_node(Node("pci:0000:01:00.0", NodeKind.GPU, "H100", bus_address="0000:01:00.0"))
>>> _ = topo.add_link(Link.pcie("socket0", "pci:0000:01:00.0", gen=5, lanes=16))
>>> svg = topology_svg(topo, highlight_links=[("socket0", "pci:0000:01:00.0")])
>>> import xml.etree.ElementTree as ET
>>> root = ET.fromstring(svg)
>>> sorted(g.get("data-id") for g in root.iter("{http://www.w3.org/2000/svg}g")
...        if g.get("class") == "node")
['pci:0000:01:00.0', 'socket0']
>>> "Gen5 x16" in svg and "50.4 GB/s" in svg and "toy &amp; co" in svg
True
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import TopologyError
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology

__all__ = ["Box", "TopologyLayout", "device_number", "slot_title", "topology_layout", "topology_svg",
           "write_svg"]

SVG_NS = "http://www.w3.org/2000/svg"

FONT_FAMILY = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
#: average advance of a character as a share of the font size; DejaVu Sans and
#: Verdana are wide faces, so the estimate errs on the wide side.
CHAR_EM = 0.62

NODE_FONT_PX = 12.0
SMALL_FONT_PX = 10.0  # OTHER nodes, which can be many, are drawn smaller
LINK_FONT_PX = 10.0
LINE_GAP_PX = 2.0

BOX_H = 40.0
SMALL_BOX_H = 32.0
BOX_MIN_W, BOX_MAX_W = 104.0, 232.0
SMALL_MIN_W, SMALL_MAX_W = 84.0, 136.0
BOX_PAD_X = 8.0

SIBLING_GAP = 14.0  # between sibling subtrees
TREE_GAP = 48.0  # between top-level trees
ROW_GAP = 64.0  # from the bottom of a row's boxes to the top of the next row
BUS_DROP = 14.0  # where a parent's links turn sideways, below its box
LABEL_CLEAR = 4.0  # between a link label and the box it points into
MARGIN = 24.0

# (fill, stroke) per node kind
KIND_COLOURS: dict[NodeKind, tuple[str, str]] = {
    NodeKind.SOCKET: ("#d0e1f9", "#1f4e8c"),
    NodeKind.MEMORY: ("#efe3c8", "#8c6d31"),
    NodeKind.SWITCH: ("#e2d9f3", "#5e3c99"),
    NodeKind.SLOT: ("#f6f6f6", "#6b6b6b"),
    NodeKind.GPU: ("#ffe0b3", "#c25e00"),
    NodeKind.NVME: ("#d2f0f4", "#0e7c86"),
    NodeKind.NIC: ("#fbd5e0", "#b0285a"),
    NodeKind.OTHER: ("#efefef", "#9a9a9a"),
}

LINK_COLOURS: dict[LinkKind, str] = {
    LinkKind.PCIE: "#5a5a5a",
    LinkKind.INTER_SOCKET: "#1f4e8c",
    LinkKind.NVLINK: "#2ca02c",
    LinkKind.MEMORY: "#8c6d31",
}
HIGHLIGHT = "#d62728"
TEXT = "#1a1a1a"
MUTED = "#666666"

#: above this many NVLink arcs their individual labels would pile up; the
#: legend then gives the range of figures instead.
MAX_LABELLED_ARCS = 24


# -- text helpers ----------------------------------------------------------

_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _esc(text: object) -> str:
    """``text`` as XML character data or attribute value (quotes escaped too).

    Characters XML 1.0 cannot carry at all become U+FFFD.

    >>> _esc('a<b & "c"\\x00')
    'a&lt;b &amp; &quot;c&quot;\ufffd'
    """
    s = _XML_INVALID.sub("\ufffd", str(text))
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _text_w(text: str, font_px: float) -> float:
    """Estimated rendered width of ``text`` in px."""
    return len(text) * font_px * CHAR_EM


def _fit(text: str, width_px: float, font_px: float) -> str:
    """``text`` cut with an ellipsis so that it fits ``width_px``."""
    max_chars = max(1, int(width_px / (font_px * CHAR_EM)))
    if len(text) <= max_chars:
        return text
    return text[: max(0, max_chars - 1)].rstrip() + "…"


def _wrap(text: str, width_px: float, font_px: float, max_lines: int = 2) -> list[str]:
    """``text`` broken at spaces into at most ``max_lines`` lines that fit ``width_px``.

    Only what still does not fit (a single word longer than the line, or a
    third line's worth) is cut with an ellipsis.

    >>> _wrap("BCM57416 NetXtreme-E Dual-Media 10G RDMA Ethernet Controller", 140, 10)
    ['BCM57416 NetXtreme-E', 'Dual-Media 10G RDMA E…']
    >>> _wrap("BCM57416 NetXtreme-E Dual-Media 10G RDMA Ethernet Controller", 140, 10, 3)
    ['BCM57416 NetXtreme-E', 'Dual-Media 10G RDMA', 'Ethernet Controller']
    >>> _wrap("short", 120, 10)
    ['short']
    """
    max_chars = max(1, int(width_px / (font_px * CHAR_EM)))
    if len(text) <= max_chars:
        return [text]
    out: list[str] = []
    rest = text
    while len(rest) > max_chars and len(out) < max_lines - 1:
        cut = rest.rfind(" ", 0, max_chars + 1)
        if cut <= 0:
            break
        out.append(rest[:cut].rstrip())
        rest = rest[cut + 1:].lstrip()
    out.append(_fit(rest, width_px, font_px))
    return out


def _gbps(bytes_per_s: float | None) -> str:
    """``'25.2 GB/s'`` (per direction, decimal GB), ``'? GB/s'`` when unknown.

    >>> _gbps(25.21e9), _gbps(None), _gbps(450e9), _gbps(0.25e9)
    ('25.2 GB/s', '? GB/s', '450 GB/s', '0.25 GB/s')
    """
    if bytes_per_s is None:
        return "? GB/s"
    g = bytes_per_s / 1e9
    if g >= 100:
        return f"{g:.0f} GB/s"
    if g >= 1:
        return f"{g:.1f} GB/s"
    return f"{g:.2f} GB/s"


def _short_addr(addr: str | None) -> str:
    """``'04:00.0'`` for ``'0000:04:00.0'``; other domains are kept."""
    if not addr:
        return ""
    return addr[5:] if addr.startswith("0000:") else addr


_REV = re.compile(r"\s*\(rev [0-9a-f]+\)\s*$", re.I)
_IDS = re.compile(r"\s*\[[0-9a-f]{4}:[0-9a-f]{4}\]", re.I)
_CLASS_PREFIX = re.compile(r"^[A-Za-z /-]+ (?:controller|bridge|device)\s*(?:\[[0-9a-f]{4}\])?:\s*", re.I)
# vendor words that lead a product title ("NVIDIA A100 40GB PCIe", "Intel P5510 3.84 TB")
_BRAND = re.compile(r"^(?:NVIDIA|Intel|AMD|Samsung|Micron|KIOXIA|Kioxia|Solidigm|Western Digital|WD|"
                    r"Seagate|SK hynix|Kingston|Mellanox|Broadcom|Microchip|Marvell|Huawei|Memblaze|"
                    r"Toshiba|Sandisk)\s+(?=\S)")
_VENDOR = re.compile(
    r"^(?:[^\s\[]+\s+){0,3}?(?:(?:Corporation|Corp\.?|Inc\.?|Co\.?,?|Ltd\.?|Technologies|"
    r"Technology|Electronics|Semiconductor|Systems|Group|and subsidiaries)\s+)+",
)


def _short_name(name: str, *, brand: bool = False) -> str:
    """A device name without vendor, class prefix, ids and revision.

    >>> _short_name("NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)")
    'H100 SXM5 80GB'
    >>> _short_name("Samsung Electronics Co Ltd NVMe SSD Controller SM981/PM981/PM983")
    'NVMe SSD Controller SM981/PM981/PM983'
    >>> _short_name("Micron Technology Inc 7450 PRO NVMe SSD")
    '7450 PRO NVMe SSD'
    >>> _short_name("NVIDIA A100 40GB PCIe", brand=True), _short_name("Intel P5510 3.84 TB", brand=True)
    ('A100 40GB PCIe', 'P5510 3.84 TB')

    ``brand`` also drops a leading brand word (a device's product title).
    """
    s = _REV.sub("", name.strip())
    s = _IDS.sub("", s)
    s = _CLASS_PREFIX.sub("", s)
    brackets = re.findall(r"\[([^\[\]]*[A-Za-z][^\[\]]*)\]", s)
    if brackets:
        return brackets[-1].strip()
    stripped = _VENDOR.sub("", s, count=1)
    if stripped == s and brand:
        stripped = _BRAND.sub("", s, count=1)
    return (stripped or s).strip()


# -- what each node and link says -------------------------------------------


def _is_small(node: Node) -> bool:
    return node.kind == NodeKind.OTHER


def _is_empty_slot(node: Node, kids: Mapping[str, list[str]]) -> bool:
    return node.kind == NodeKind.SLOT and not kids.get(node.id) and node.attrs.get("in_use") is not True


def _node_lines(node: Node, empty_slot: bool) -> list[str]:
    """The (up to two) lines of text in a node's box."""
    kind = node.kind
    addr = _short_addr(node.bus_address)
    model = str(node.attrs.get("model") or "")
    if kind in (NodeKind.GPU, NodeKind.NVME, NodeKind.NIC):
        tag = {NodeKind.GPU: "GPU", NodeKind.NVME: "NVMe", NodeKind.NIC: "NIC"}[kind]
        title = str(node.attrs.get("title") or model or node.name or "")
        second = _short_name(title, brand=True) if title else ""
        number = device_number(node)
        if number is not None:  # a device the planner placed: "GPU 3", as in the slot map
            return [number, second] if second else [number]
        first = f"{tag} {addr}" if addr else tag
        if not addr and second:
            first, second = f"{tag} {second}", ""
        return [first, second] if second else [first]
    if kind == NodeKind.OTHER:
        name = _short_name(model or node.name)
        if addr:
            return [addr, name] if name else [addr]
        return [name or node.id]
    if kind == NodeKind.SWITCH:
        second = _short_name(model) if model else ""
        ports = node.attrs.get("ports")
        if not second and isinstance(ports, list | tuple) and ports:
            second = f"{len(ports)} port{'s' if len(ports) != 1 else ''}"
        return [node.label, second] if second else [node.label]
    if kind == NodeKind.SLOT:
        first = slot_title(node)
        bits = []
        ff = _FORM_FACTOR_WORDS.get(str(node.attrs.get("form_factor") or ""), "")
        if ff:
            bits.append(ff)
        lanes = node.attrs.get("width_lanes")
        if lanes:
            bits.append(f"x{lanes}")
        second = " ".join(bits)
        if empty_slot:
            second = f"{second} · empty" if second else "empty"
        return [first, second] if second else [first]
    if kind == NodeKind.SOCKET:
        numa = node.attrs.get("numa_nodes")
        m = re.match(r"^(.*?)\s*\((.+)\)$", node.label)
        if m and m.group(1):  # "socket (unknown: no NUMA node given)"
            return [m.group(1), m.group(2)]
        if model:
            second = _short_name(model)
        elif isinstance(numa, list | tuple) and numa:
            second = "NUMA " + ",".join(str(n) for n in numa)
        elif node.numa_node is not None:
            second = f"NUMA {node.numa_node}"
        else:
            second = ""
        return [node.label, second] if second else [node.label]
    if kind == NodeKind.MEMORY:
        size = node.attrs.get("size_bytes")
        label = node.label
        if label.startswith("memory of "):
            label = "memory"
        second = f"{size / 2**30:.0f} GiB" if isinstance(size, int | float) and size > 0 else ""
        if not second and node.numa_node is not None:
            second = f"NUMA {node.numa_node}"
        return [label, second] if second else [label]
    return [node.label]


_FORM_FACTOR_WORDS = {"cem": "card", "u.2": "U.2", "m.2": "M.2", "ocp": "OCP"}
_PLACED_ID = re.compile(r"^(?:placed:)?(gpu|ssd)(\d+)$")
_NAMES_ITSELF = re.compile(r"slot|bay|socket|riser|connector|m\.?2|pcie|ocp|sxm|oam|u\.2|mezz", re.I)


def device_number(node: Node) -> str | None:
    """``"GPU 3"``/``"SSD 6"`` for a device the planner placed, numbered as in the slot map.

    :func:`planner.layout.place` numbers placed devices ``gpu0``, ``ssd0``, …
    in tree order of their slots, and the slot map calls them "GPU 0",
    "SSD 0", …; a captured device has no such number (``None``).

    >>> device_number(Node("ssd6", NodeKind.NVME, attrs={"placed": True}))
    'SSD 6'
    >>> device_number(Node("pci:0000:01:00.0", NodeKind.GPU)) is None
    True
    """
    m = _PLACED_ID.match(node.id)
    if not node.attrs.get("placed") or m is None:
        return None
    return f"{m.group(1).upper()} {m.group(2)}"


def slot_title(node: Node) -> str:
    """A slot's designation as the BIOS or spec gives it; ``"slot 168"`` for a bare number.

    >>> slot_title(Node("s", NodeKind.SLOT, "slot Slot 0 (switch 1)", attrs={"designation": "Slot 0 (switch 1)"}))
    'Slot 0 (switch 1)'
    >>> slot_title(Node("s", NodeKind.SLOT, "slot 168", attrs={"designation": "168"}))
    'slot 168'
    """
    designation = str(node.attrs.get("designation") or "").strip()
    if not designation:
        return node.label
    return designation if _NAMES_ITSELF.search(designation) else f"slot {designation}"


def _node_tooltip(node: Node) -> str:
    parts = [f"{node.id} ({node.kind.value})"]
    if node.name:
        parts.append(node.name)
    if node.bus_address:
        parts.append(f"bus {node.bus_address}")
    if node.vendor_id or node.device_id:
        parts.append(f"id {node.vendor_id or '?'}:{node.device_id or '?'}")
    if node.numa_node is not None:
        parts.append(f"NUMA {node.numa_node}")
    for key, value in sorted(node.attrs.items()):
        if key == "functions" or value in (None, "", [], {}):
            continue
        parts.append(f"{key}: {value}")
    return "\n".join(parts)


def _link_label_lines(link: Link, extra: str | None) -> list[str]:
    """Two short lines for a tree link: what it is, then GB/s (and the extra text)."""
    if link.kind == LinkKind.PCIE:
        if link.pcie_gen or link.lanes:
            first = f"Gen{link.pcie_gen or '?'} x{link.lanes or '?'}"
        else:
            first = "PCIe"
    elif link.kind == LinkKind.MEMORY:
        first = "memory"
    elif link.kind == LinkKind.NVLINK:
        first = "NVLink"
    else:
        first = _interconnect_name(link)
    second = _bw_text(link)
    if extra:
        second = f"{second} · {extra}"
    return [first, second]


def _bw_text(link: Link) -> str:
    """GB/s, prefixed with ``~`` when the figure is a typical default, not the machine's."""
    text = _gbps(link.bytes_per_s)
    return f"~{text}" if link.bandwidth_source == "default" and link.bytes_per_s else text


def _interconnect_name(link: Link) -> str:
    for key in ("protocol", "name", "type"):
        value = link.attrs.get(key)
        if value:
            return str(value)
    return "inter-socket"


def _link_tooltip(link: Link, extra: str | None) -> str:
    parts = [f"{link.src} — {link.dst} ({link.kind.value})"]
    if link.pcie_gen or link.lanes:
        parts.append(f"PCIe Gen{link.pcie_gen or '?'} x{link.lanes or '?'}")
    parts.append(f"{_gbps(link.bytes_per_s)} per direction (source: {link.bandwidth_source})")
    cur_g, cur_w = link.attrs.get("current_gen"), link.attrs.get("current_lanes")
    if cur_g or cur_w:
        parts.append(f"running at Gen{cur_g or '?'} x{cur_w or '?'} at capture time")
    for key, value in sorted(link.attrs.items()):
        if key not in ("current_gen", "current_lanes") and value not in (None, "", [], {}):
            parts.append(f"{key}: {value}")
    if extra:
        parts.append(extra)
    return "\n".join(parts)


def _stroke_w(link: Link) -> float:
    """Line thickness in px, growing with the log of the capacity (1 px when unknown)."""
    if link.bytes_per_s is None:
        return 1.2
    return round(0.8 + 0.9 * math.log1p(link.bytes_per_s / 1e9), 2)


# -- layout ------------------------------------------------------------------

#: a parent with at least this many leaf children of kind OTHER shows them
#: stacked in columns hanging from a rail, not side by side: a chipset's
#: dozens of functions would otherwise stretch the picture over metres.
STACK_MIN = 4
STACK_RAIL_X = 4.0  # rail position inside a stack column
STACK_INDENT = 14.0  # from a column's rail to its boxes
STACK_PITCH = SMALL_BOX_H + LINK_FONT_PX + 10.0
STACK_COL_GAP = 12.0
STACK_CHAIN_ROWS = 8  # a stack of slot → device chains stays one column up to this many


@dataclass(frozen=True)
class Box:
    """An axis-aligned rectangle in px; ``x``, ``y`` is the top-left corner."""

    x: float
    y: float
    width: float
    height: float

    @property
    def right(self) -> float:
        return self.x + self.width

    @property
    def bottom(self) -> float:
        return self.y + self.height

    @property
    def cx(self) -> float:
        return self.x + self.width / 2

    @property
    def cy(self) -> float:
        return self.y + self.height / 2

    def overlaps(self, other: Box) -> bool:
        """True when the interiors intersect (touching edges do not count).

        >>> Box(0, 0, 10, 10).overlaps(Box(10, 0, 5, 5)), Box(0, 0, 10, 10).overlaps(Box(9, 9, 5, 5))
        (False, True)
        """
        return (
            self.x < other.right - 1e-6
            and other.x < self.right - 1e-6
            and self.y < other.bottom - 1e-6
            and other.y < self.bottom - 1e-6
        )


@dataclass(frozen=True)
class TopologyLayout:
    """Where :func:`topology_svg` draws things, in px.

    ``boxes`` maps every node id to its box. ``tree_links`` lists the links
    drawn as tree edges as ``(parent, child)``; ``link_label_boxes`` and
    ``link_label_lines`` give the rectangle and text of each one's label.
    ``rails`` maps a child stacked in a column to the x of the rail its link
    runs down; ``chained`` maps a device drawn to the right of its slot in
    such a column to that slot. ``beside`` maps a socket to the memory node drawn beside it
    and ``mem_side`` says on which side (``"left"``/``"right"``).
    ``socket_row`` lists the sockets left to right, ``unplaced`` the roots of
    the "unplaced" band whose caption sits at ``unplaced_top`` (``None``
    without such a band); ``top`` is where the drawing starts below the
    title and legend.
    """

    boxes: Mapping[str, Box]
    link_label_boxes: Mapping[tuple[str, str], Box]
    link_label_lines: Mapping[tuple[str, str], tuple[str, ...]]
    node_lines: Mapping[str, tuple[str, ...]]
    tree_links: tuple[tuple[str, str], ...]
    rails: Mapping[str, float]
    beside: Mapping[str, str]
    mem_side: Mapping[str, str]
    socket_row: tuple[str, ...]
    unplaced: tuple[str, ...]
    unplaced_top: float | None
    nvlink_drops: Mapping[tuple[str, str], float]
    top: float
    width: float
    height: float
    chained: Mapping[str, str] = field(default_factory=dict)


def _tree(topo: Topology) -> tuple[list[str], dict[str, str], list[str], dict[str, list[str]]]:
    """(sockets, memory beside each socket, unplaced roots, children of each node).

    Every node ends up in exactly one place: a second upstream link or a
    cycle (which a well-formed topology never has) is drawn as an extra link.
    """
    nodes = topo.nodes()
    parent_of: dict[str, str] = {}
    for n in nodes:
        p = topo.parent(n.id)
        if p is not None:
            parent_of[n.id] = p.id
    # a socket hanging under something (no real machine does) is an ordinary node
    sockets = [n.id for n in nodes if n.kind == NodeKind.SOCKET and n.id not in parent_of]
    socket_set = set(sockets)
    has_kids = set(parent_of.values())
    beside: dict[str, str] = {}
    for n in nodes:
        p = parent_of.get(n.id)
        if (n.kind == NodeKind.MEMORY and p in socket_set and p not in beside
                and n.id not in has_kids):
            beside[p] = n.id
    kids: dict[str, list[str]] = {}
    for n in nodes:
        p = parent_of.get(n.id)
        if p is not None and n.id not in beside.values():
            kids.setdefault(p, []).append(n.id)

    seen: set[str] = set(beside.values())

    def claim(root: str) -> None:
        # a node reached a second time (two parents, a cycle) keeps its first place
        stack = [root]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            kept = [c for c in kids.get(x, []) if c not in seen]
            kids[x] = kept
            stack.extend(reversed(kept))

    for s in sockets:
        claim(s)
    unplaced: list[str] = []
    for n in nodes:
        if n.id not in seen and n.id not in parent_of:
            unplaced.append(n.id)
            claim(n.id)
    for n in nodes:  # a cycle with no way in: start it anywhere
        if n.id not in seen:
            unplaced.append(n.id)
            claim(n.id)
    placed_under: dict[str, str] = {}
    for p, cs in kids.items():
        for c in cs:
            placed_under.setdefault(c, p)
    for p in list(kids):
        kids[p] = [c for c in kids[p] if placed_under[c] == p]
    return sockets, beside, unplaced, kids


_Key = Hashable  # a node id (str) or ("stack", parent id) for a column block


def topology_layout(
    topo: Topology,
    *,
    link_labels: Mapping[tuple[str, str], str] | None = None,
    title_height: float = 0.0,
) -> TopologyLayout:
    """Compute where every node box and tree-link label goes (px).

    ``link_labels`` matters because extra text widens a link's label, and
    the layout reserves room for it. ``title_height`` is the space kept free
    above the drawing for the title and legend.

    >>> from planner.topology.model import Link, Node, NodeKind, Topology
    >>> topo = Topology()
    >>> for i in range(3):
    ...     _ = topo.add_node(Node(f"n{i}", NodeKind.SOCKET if i == 0 else NodeKind.NVME))
    >>> _ = topo.add_link(Link.pcie("n0", "n1", 3, 4)); _ = topo.add_link(Link.pcie("n0", "n2", 3, 4))
    >>> lay = topology_layout(topo)
    >>> lay.boxes["n1"].overlaps(lay.boxes["n2"]), lay.boxes["n1"].y > lay.boxes["n0"].bottom
    (False, True)
    """
    extra = _normalise_pairs(topo, link_labels or {})
    sockets, beside, unplaced, kids = _tree(topo)
    node_of = {n.id: n for n in topo.nodes()}

    node_lines: dict[str, tuple[str, ...]] = {}
    size: dict[str, tuple[float, float]] = {}  # box width, height
    for n in node_of.values():
        lines = _node_lines(n, _is_empty_slot(n, kids))
        font = SMALL_FONT_PX if _is_small(n) else NODE_FONT_PX
        lo, hi = (SMALL_MIN_W, SMALL_MAX_W) if _is_small(n) else (BOX_MIN_W, BOX_MAX_W)
        w = min(hi, max(lo, max(_text_w(t, font) for t in lines) + 2 * BOX_PAD_X))
        # a name too long for the widest box wraps onto a second line rather than being cut
        most = 2 if _is_small(n) else 3  # OTHER functions keep two lines; the tooltip has the rest
        wrapped = [lines[0], *(part for t in lines[1:] for part in _wrap(t, w - 2 * BOX_PAD_X, font, most))]
        wrapped[0:1] = _wrap(lines[0], w - 2 * BOX_PAD_X, font)
        node_lines[n.id] = tuple(wrapped)
        base = SMALL_BOX_H if _is_small(n) else BOX_H
        size[n.id] = (w, base + (font + 3) * max(0, len(wrapped) - 2))

    # A busy parent's leaves — OTHER functions, empty slots, and slots holding one
    # leaf device (drawn as a chain: slot, then its device to the right) — go into
    # a stack of columns hanging from rails: side by side, the slots of a
    # switch or the bays of a backplane would stretch the picture over metres.
    nvlinked = {end for lk in topo.links(LinkKind.NVLINK) for end in lk.key}
    stacks: dict[str, list[str]] = {}
    chained: dict[str, str] = {}  # device -> the slot it is drawn beside
    layout_kids: dict[_Key, list[_Key]] = {}
    for p, cs in kids.items():
        # a node with NVLinks stays on the row, where its arcs can reach it
        items = [c for c in cs if c not in nvlinked and (
            (not kids.get(c) and (_is_small(node_of[c]) or _is_empty_slot(node_of[c], kids)))
            or _chain_device(node_of[c], kids, nvlinked) is not None)]
        if len(items) >= STACK_MIN:
            stacks[p] = items
            layout_kids[p] = [c for c in cs if c not in items] + [("stack", p)]
            for c in items:
                d = _chain_device(node_of[c], kids, nvlinked)
                if d is not None:
                    chained[d] = c
        else:
            layout_kids[p] = list(cs)
    stacked_in = {c: p for p, cs in stacks.items() for c in cs}

    label_lines: dict[tuple[str, str], tuple[str, ...]] = {}
    label_w: dict[str, float] = {}  # width of the label of the link into a node
    for p, cs in kids.items():
        for c in cs:
            link = topo.link_between(p, c)
            assert link is not None  # kids only holds linked pairs
            lines = _link_label_lines(link, extra.get(link.key))
            if c in stacked_in or c in chained:  # one line beside the rail or above the chain
                lines = [" · ".join(lines)]
            label_lines[(p, c)] = tuple(lines)
            label_w[c] = max(_text_w(t, LINK_FONT_PX) for t in lines) + 6

    def chain_gap(d: str) -> float:
        return max(label_w[d], 36.0) + 12.0

    def item_w(c: str) -> float:
        d = next((x for x, slot in chained.items() if slot == c), None)
        box = size[c][0] + (chain_gap(d) + size[d][0] if d is not None else 0.0)
        return max(STACK_RAIL_X + STACK_INDENT + box, STACK_RAIL_X + 6 + label_w[c])

    # Columns of each stack: about twice as tall as wide, in rows of boxes; a
    # stack of chains (wide items) goes in one column up to STACK_CHAIN_ROWS.
    stack_cols: dict[str, list[list[str]]] = {}
    stack_col_w: dict[str, list[float]] = {}
    for p, items in stacks.items():
        if any(c in chained.values() for c in items):
            rows = min(len(items), max(STACK_CHAIN_ROWS, math.ceil(len(items) / 2)))
        else:
            rows = min(len(items), max(STACK_MIN, math.ceil(math.sqrt(2 * len(items)))))
        cols = [items[i:i + rows] for i in range(0, len(items), rows)]
        stack_cols[p] = cols
        stack_col_w[p] = [max(item_w(c) for c in col) for col in cols]

    mem_texts = ["~100 GB/s"]
    for s, m in beside.items():
        lk = topo.link_between(s, m)
        if lk is not None:
            mem_texts.append(_bw_text(lk) + (f" · {extra[lk.key]}" if lk.key in extra else ""))
    mem_gap = max(_text_w(t, LINK_FONT_PX) for t in mem_texts) + 16
    linked = [s for s in sockets
              if any(lk.kind == LinkKind.INTER_SOCKET and s in lk.key for lk in topo.links())]
    last = linked[-1] if len(linked) >= 2 else None
    mem_side = {s: "right" if s == last else "left" for s in sockets}

    def extents(x: _Key) -> tuple[float, float]:
        """Room a node needs left and right of its centre on its own row."""
        if isinstance(x, tuple):
            half = (sum(stack_col_w[x[1]]) + STACK_COL_GAP * (len(stack_col_w[x[1]]) - 1)) / 2
            return half, half
        w = size[x][0]
        half = max(w, label_w.get(x, 0.0)) / 2
        left = right = half
        m = beside.get(x)
        if m is not None:
            side = size[m][0] + mem_gap
            if mem_side[x] == "left":
                left = max(left, w / 2 + side)
            else:
                right = max(right, w / 2 + side)
        return left, right

    width_memo: dict[_Key, float] = {}

    def block_w(x: _Key) -> float:
        cs = layout_kids.get(x, [])
        return sum(width_memo[c] for c in cs) + SIBLING_GAP * max(0, len(cs) - 1)

    def subtree_w(root: _Key) -> float:
        # iterative post-order: a chain of bridges may be deeper than the recursion limit
        stack: list[tuple[_Key, bool]] = [(root, False)]
        while stack:
            y, done = stack.pop()
            if y in width_memo:
                continue
            cs = layout_kids.get(y, [])
            if not done and cs:
                stack.append((y, True))
                stack.extend((c, False) for c in cs if c not in width_memo)
                continue
            lft, rgt = extents(y)
            width_memo[y] = max(lft + rgt, block_w(y))
        return width_memo[root]

    def place(root: _Key, left: float, centre: dict[_Key, float], depth: dict[_Key, int]) -> None:
        subtree_w(root)
        # pre-order hands out intervals; post-order centres parents over their children
        order: list[tuple[_Key, float]] = []
        stack: list[tuple[_Key, float, int]] = [(root, left, 0)]
        while stack:
            x, lft, d = stack.pop()
            order.append((x, lft))
            depth[x] = d
            cs = layout_kids.get(x, [])
            cl = lft + (width_memo[x] - block_w(x)) / 2
            starts = []
            for c in cs:
                starts.append((c, cl, d + 1))
                cl += width_memo[c] + SIBLING_GAP
            stack.extend(reversed(starts))
        for x, lft in reversed(order):
            cs = layout_kids.get(x, [])
            mid = (centre[cs[0]] + centre[cs[-1]]) / 2 if cs else lft + width_memo[x] / 2
            el, er = extents(x)
            centre[x] = min(max(mid, lft + el), lft + width_memo[x] - er)

    boxes: dict[str, Box] = {}
    label_boxes: dict[tuple[str, str], Box] = {}
    rails: dict[str, float] = {}
    row_h = max([BOX_H, *(h for _, h in size.values())]) + ROW_GAP

    def materialise(centre: Mapping[_Key, float], depth: Mapping[_Key, int], band_top: float) -> None:
        for key, c in centre.items():
            y = band_top + depth[key] * row_h
            if isinstance(key, tuple):
                p = key[1]
                x = c - extents(key)[0]
                for col, cw in zip(stack_cols[p], stack_col_w[p], strict=True):
                    rail = x + STACK_RAIL_X
                    yy = y
                    for item in col:
                        w, h = size[item]
                        d = next((x for x, slot in chained.items() if slot == item), None)
                        row_h_item = max(h, size[d][1]) if d is not None else h
                        b = Box(rail + STACK_INDENT, yy + (row_h_item - h) / 2, w, h)
                        boxes[item] = b
                        rails[item] = rail
                        lh = LINK_FONT_PX + 3
                        label_boxes[(p, item)] = Box(rail + 6, b.y - lh - 3, label_w[item], lh)
                        if d is not None:
                            dw, dh = size[d]
                            db = Box(b.right + chain_gap(d), b.cy - dh / 2, dw, dh)
                            boxes[d] = db
                            label_boxes[(item, d)] = Box((b.right + db.x) / 2 - label_w[d] / 2,
                                                         b.cy - lh - 3, label_w[d], lh)
                        yy += row_h_item + STACK_PITCH - SMALL_BOX_H
                    x += cw + STACK_COL_GAP
                continue
            w, h = size[key]
            boxes[key] = Box(c - w / 2, y, w, h)

    # Room between sockets for the inter-socket label.
    xs_label = max(
        (_text_w(" ".join(_link_label_lines(lk, extra.get(lk.key))), LINK_FONT_PX)
         for lk in topo.links(LinkKind.INTER_SOCKET)),
        default=0.0,
    )
    top_gap = max(TREE_GAP, xs_label + 32)
    arcs_above = _socket_arcs(topo, sockets, mem_side)
    arc_band = (28.0 + 16.0 * len(arcs_above)) if arcs_above else 0.0
    top = MARGIN + title_height + arc_band

    centre: dict[_Key, float] = {}
    depth: dict[_Key, int] = {}
    x = MARGIN
    prev_right: float | None = None  # right edge of the previous socket's box (and memory)
    for s in sockets:
        trial: dict[_Key, float] = {}
        place(s, 0.0, trial, {})
        left_edge = trial[s] - extents(s)[0]
        if prev_right is not None:
            # subtrees TREE_GAP apart, socket boxes far enough apart for the inter-socket label
            x = max(x, prev_right + top_gap - left_edge)
        place(s, x, centre, depth)
        prev_right = centre[s] + extents(s)[1]
        x += width_memo[s] + TREE_GAP
    right = x - TREE_GAP if sockets else MARGIN
    materialise(centre, depth, top)
    for s, m in beside.items():
        sb = boxes[s]
        w, h = size[m]
        mx = sb.x - mem_gap - w if mem_side[s] == "left" else sb.right + mem_gap
        boxes[m] = Box(mx, sb.y + (sb.height - h) / 2, w, h)

    unplaced_top: float | None = None
    if unplaced:
        main_bottom = max((b.bottom for b in boxes.values()), default=top)
        for (a, b), drop in _nvlink_drops(topo, boxes).items():  # keep clear of arcs
            main_bottom = max(main_bottom,
                              max(boxes[a].bottom, boxes[b].bottom) + drop + LINK_FONT_PX)
        unplaced_top = main_bottom + 36.0 if sockets else top
        centre, depth = {}, {}
        x = MARGIN
        for r in unplaced:
            place(r, x, centre, depth)
            x += width_memo[r] + TREE_GAP
        right = max(right, x - TREE_GAP)
        materialise(centre, depth, unplaced_top + 26.0)

    for (p, c), lines in label_lines.items():
        if c in stacked_in or c in chained:
            continue
        cb = boxes[c]
        h = (LINK_FONT_PX + LINE_GAP_PX) * len(lines) + 2
        label_boxes[(p, c)] = Box(cb.cx - label_w[c] / 2, cb.y - LABEL_CLEAR - h, label_w[c], h)

    drops = _nvlink_drops(topo, boxes)
    bottom = max((b.bottom for b in boxes.values()), default=top)
    for key, drop in drops.items():
        a, b = boxes[key[0]], boxes[key[1]]
        bottom = max(bottom, max(a.bottom, b.bottom) + drop + LINK_FONT_PX + 4)
    width = max((b.right for b in boxes.values()), default=MARGIN)
    return TopologyLayout(
        boxes=boxes,
        link_label_boxes=label_boxes,
        link_label_lines=label_lines,
        node_lines=node_lines,
        tree_links=tuple((p, c) for p, cs in kids.items() for c in cs),
        rails=rails,
        beside=dict(beside),
        mem_side=mem_side,
        socket_row=tuple(sockets),
        unplaced=tuple(unplaced),
        unplaced_top=unplaced_top,
        nvlink_drops=drops,
        top=top,
        width=max(width, right) + MARGIN,
        height=bottom + MARGIN,
        chained=chained,
    )


def _chain_device(node: Node, kids: Mapping[str, list[str]], nvlinked: set[str]) -> str | None:
    """The one leaf device of a slot, when the slot holds exactly that (else ``None``)."""
    if node.kind != NodeKind.SLOT:
        return None
    cs = kids.get(node.id, [])
    if len(cs) != 1 or kids.get(cs[0]) or cs[0] in nvlinked:
        return None
    return cs[0]


def _socket_arcs(topo: Topology, sockets: list[str], mem_side: Mapping[str, str]) -> list[Link]:
    """Links between sockets that cannot be a straight line between neighbours."""
    pos = {s: i for i, s in enumerate(sockets)}
    return [
        lk for lk in topo.links()
        if lk.kind not in (LinkKind.PCIE, LinkKind.MEMORY, LinkKind.NVLINK)
        and lk.src in pos and lk.dst in pos and not _straight(lk.src, lk.dst, pos, mem_side)
    ]


def _straight(a: str, b: str, pos: Mapping[str, int], mem_side: Mapping[str, str]) -> bool:
    """True when nothing sits between sockets ``a`` and ``b`` on the socket row."""
    left, right = sorted((a, b), key=pos.__getitem__)
    return (pos[right] - pos[left] == 1 and mem_side[left] == "left"
            and mem_side[right] == "right")


def _nvlink_drops(topo: Topology, boxes: Mapping[str, Box]) -> dict[tuple[str, str], float]:
    """How far below its ends each NVLink arc between boxes of one row dips (px).

    (An NVLink between rows is an S-curve and needs no room below.) Wider
    arcs dip deeper, and arcs over a shared stretch get depths at
    least 8 px apart so that parallel arcs stay distinguishable.
    """
    links = sorted((lk for lk in topo.links(LinkKind.NVLINK)
                    if lk.src in boxes and lk.dst in boxes
                    and abs(boxes[lk.src].y - boxes[lk.dst].y) < 1.0),
                   key=lambda lk: abs(boxes[lk.src].cx - boxes[lk.dst].cx))
    placed: list[tuple[float, float, float, float]] = []  # lo x, hi x, bottom y, drop
    out: dict[tuple[str, str], float] = {}
    for lk in links:
        a, b = boxes[lk.src], boxes[lk.dst]
        lo, hi = sorted((a.cx, b.cx))
        base_y = max(a.bottom, b.bottom)
        drop = 16.0 + min(0.12 * (hi - lo), ROW_GAP * 0.6)
        bumped = True
        while bumped:
            bumped = False
            for plo, phi, py, pdrop in placed:
                if plo < hi and lo < phi and abs((base_y + drop) - (py + pdrop)) < 8.0:
                    drop = py + pdrop + 8.0 - base_y
                    bumped = True
        placed.append((lo, hi, base_y, drop))
        out[lk.key] = drop
    return out


def _normalise_pairs(topo: Topology, pairs: Mapping[tuple[str, str], str]) -> dict[tuple[str, str], str]:
    """Key ``pairs`` by the stored orientation of each link."""
    out: dict[tuple[str, str], str] = {}
    for pair, text in pairs.items():
        out[_link_key(topo, pair)] = str(text)
    return out


def _link_key(topo: Topology, pair: object) -> tuple[str, str]:
    if not (isinstance(pair, tuple | list) and len(pair) == 2):
        raise TopologyError(f"{pair!r} is not a (src, dst) pair of node ids")
    a, b = pair
    link = topo.link_between(str(a), str(b)) if a in topo and b in topo else None
    if link is None:
        raise TopologyError(f"no link between {a!r} and {b!r} in topology {topo.name!r}")
    return link.key


# -- drawing -------------------------------------------------------------------


def _counts_text(topo: Topology) -> str:
    counts = topo.counts()
    words = [
        ("socket", "socket", "sockets"), ("gpu", "GPU", "GPUs"), ("nvme", "NVMe", "NVMe"),
        ("nic", "NIC", "NICs"), ("switch", "switch", "switches"), ("slot", "slot", "slots"),
        ("other", "other device", "other devices"),
    ]
    parts = [f"{counts[k]} {one if counts[k] == 1 else many}" for k, one, many in words if counts[k]]
    n_links = len(topo.links())
    parts.append(f"{n_links} link{'s' if n_links != 1 else ''}")
    return " · ".join(parts)


def _text(x: float, y: float, text: str, *, size: float, anchor: str = "middle",
          fill: str = TEXT, weight: str | None = None, style: str | None = None) -> str:
    attrs = [f'x="{x:.1f}"', f'y="{y:.1f}"', f'font-size="{size:g}"', f'fill="{fill}"']
    if anchor != "start":
        attrs.append(f'text-anchor="{anchor}"')
    if weight:
        attrs.append(f'font-weight="{weight}"')
    if style:
        attrs.append(f'font-style="{style}"')
    return f"<text {' '.join(attrs)}>{_esc(text)}</text>"


def _plate(box: Box, opacity: float = 0.88) -> str:
    """A soft white plate under a label so that lines beneath do not cross the text."""
    return (f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.width:.1f}" height="{box.height:.1f}" '
            f'rx="3" fill="#ffffff" fill-opacity="{opacity:g}"/>')


def _label_block(box: Box, lines: Iterable[str], colour: str = TEXT, *, align: str = "middle") -> list[str]:
    out = [_plate(box)]
    y = box.y + LINK_FONT_PX
    x = box.cx if align == "middle" else box.x + 3
    for t in lines:
        out.append(_text(x, y, t, size=LINK_FONT_PX, fill=colour, anchor=align))
        y += LINK_FONT_PX + LINE_GAP_PX
    return out


def _ortho(points: list[tuple[float, float]], radius: float = 6.0) -> str:
    """An SVG path through axis-parallel ``points`` with rounded corners.

    >>> _ortho([(0, 0), (0, 10), (20, 10)])
    'M0.0,0.0 L0.0,5.0 Q0.0,10.0 5.0,10.0 L20.0,10.0'
    """
    pts = [p for i, p in enumerate(points) if i == 0 or p != points[i - 1]]
    out = [f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"]
    for i in range(1, len(pts) - 1):
        (x0, y0), (x1, y1), (x2, y2) = pts[i - 1], pts[i], pts[i + 1]
        d_in, d_out = math.hypot(x1 - x0, y1 - y0), math.hypot(x2 - x1, y2 - y1)
        r = min(radius, d_in / 2, d_out / 2)
        if r <= 0.01:
            out.append(f"L{x1:.1f},{y1:.1f}")
            continue
        ax, ay = x1 - (x1 - x0) / d_in * r, y1 - (y1 - y0) / d_in * r
        bx, by = x1 + (x2 - x1) / d_out * r, y1 + (y2 - y1) / d_out * r
        out.append(f"L{ax:.1f},{ay:.1f} Q{x1:.1f},{y1:.1f} {bx:.1f},{by:.1f}")
    out.append(f"L{pts[-1][0]:.1f},{pts[-1][1]:.1f}")
    return " ".join(out)


def _link_group(link: Link, path: str, *, width: float, colour: str, dash: str | None,
                tooltip: str, extra_svg: Iterable[str] = (), opacity: float = 1.0) -> list[str]:
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    op = f' stroke-opacity="{opacity:g}"' if opacity < 1 else ""
    out = [f'<g class="link" data-src="{_esc(link.src)}" data-dst="{_esc(link.dst)}" '
           f'data-kind="{_esc(link.kind.value)}">',
           f"<title>{_esc(tooltip)}</title>",
           f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="{width:g}" '
           f'stroke-linecap="round" stroke-linejoin="round"{dash_attr}{op}/>']
    out.extend(extra_svg)
    out.append("</g>")
    return out


def _bezier(p0: float, p1: float, p2: float, p3: float, t: float) -> float:
    u = 1 - t
    return u * u * u * p0 + 3 * u * u * t * p1 + 3 * u * t * t * p2 + t * t * t * p3


def _place_on_curve(text: str, p0: tuple[float, float], p1: tuple[float, float],
                    p2: tuple[float, float], p3: tuple[float, float], taken: list[Box]) -> Box:
    """Where a label of a cubic curve goes: its middle, or slid along it until
    it is clear of the boxes in ``taken`` (the middle again if nowhere is)."""
    tw, th = _text_w(text, LINK_FONT_PX) + 8, LINK_FONT_PX + 4
    first = None
    for t in (0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8, 0.12, 0.88):
        px = _bezier(p0[0], p1[0], p2[0], p3[0], t)
        py = _bezier(p0[1], p1[1], p2[1], p3[1], t)
        cand = Box(px - tw / 2, py - th / 2, tw, th)
        first = first or cand
        if not any(cand.overlaps(o) for o in taken):
            return cand
    assert first is not None
    return first


def topology_svg(
    topo: Topology,
    *,
    title: str | None = None,
    highlight_links: Iterable[tuple[str, str]] | None = None,
    link_labels: Mapping[tuple[str, str], str] | None = None,
    highlight_nodes: Iterable[str] | None = None,
) -> str:
    """The device graph of ``topo`` as an SVG document (a string).

    ``title`` replaces the topology name in the heading (the node counts are
    always shown). ``highlight_links`` lists ``(src, dst)`` pairs — either
    orientation — to draw in red and thicker, e.g. a plan's bottlenecks;
    ``link_labels`` maps such pairs to extra text appended to the link's
    label (a flow's utilisation, say). ``highlight_nodes`` lists node ids
    to outline in red: devices that are themselves the bottleneck, such as
    SSDs reading at their limit. A pair that names no link, or an id that
    names no node, raises :class:`~planner.errors.TopologyError`. The
    legend explains the red only when something is red.

    Each node is a ``<g class="node" data-id="...">`` holding one ``<rect>``
    and a ``<title>`` tooltip with everything known about it; each link is a
    ``<g class="link" data-src="..." data-dst="...">`` with its own tooltip.
    """
    highlight = {_link_key(topo, p) for p in (highlight_links or ())}
    hot_nodes = set(highlight_nodes or ())
    for nid in hot_nodes:
        if nid not in topo:
            raise TopologyError(f"no node {nid!r} in topology {topo.name!r} to highlight")
    extra = _normalise_pairs(topo, link_labels or {})

    heading = title if title is not None else (topo.name or "topology")
    notes = [n for n in topo.notes if n][:4]
    legend_items = _legend_items(topo, highlight, hot_nodes)
    # The legend wraps at the canvas width, which the layout decides: lay out
    # with a guess of the heading's height, then again if the guess was wrong.
    title_h = 0.0
    lay = topology_layout(topo, link_labels=extra)
    for _ in range(3):
        canvas_w = max(lay.width, 720.0, _text_w(heading, 18.0) + 2 * MARGIN)
        rows = _legend_rows(legend_items, canvas_w - 2 * MARGIN)
        needed = 18.0 + 18.0 + 14.0 * len(notes) + 16.0 + 22.0 * len(rows) + 12.0
        if needed == title_h:
            break
        title_h = needed
        lay = topology_layout(topo, link_labels=extra, title_height=title_h)

    width = max(lay.width, 720.0, _text_w(heading, 18.0) + 2 * MARGIN)
    height = lay.height
    out: list[str] = [
        f'<svg xmlns="{SVG_NS}" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{_esc(FONT_FAMILY)}">',
        f"<title>{_esc(heading)}</title>",
        f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
    ]

    # Heading, counts, notes, legend.
    y = MARGIN + 18.0
    out.append(_text(MARGIN, y, _fit(heading, width - 2 * MARGIN, 18.0), size=18.0,
                     anchor="start", weight="bold"))
    y += 18.0
    out.append(_text(MARGIN, y, _counts_text(topo), size=12.0, anchor="start", fill=MUTED))
    for note in notes:
        y += 14.0
        out.append(_text(MARGIN, y, _fit("note: " + note, width - 2 * MARGIN, 11.0), size=11.0,
                         anchor="start", fill=MUTED, style="italic"))
    y += 16.0
    out.extend(_draw_legend(_legend_rows(legend_items, width - 2 * MARGIN), MARGIN, y))

    boxes = lay.boxes

    def style_of(link: Link) -> tuple[float, str, str | None, str]:
        w = _stroke_w(link)
        colour = LINK_COLOURS.get(link.kind, LINK_COLOURS[LinkKind.PCIE])
        dash = "2,3" if link.bytes_per_s is None else None
        text_colour = TEXT
        if link.key in highlight:
            w, colour, text_colour = w + 2.5, HIGHLIGHT, HIGHLIGHT
        return w, colour, dash, text_colour

    # Tree links, thin ones first so that thick and highlighted ones stay on
    # top where they share a stretch; labels after all lines.
    drawn: set[tuple[str, str]] = set()
    lines_svg: list[tuple[tuple[bool, float], list[str]]] = []
    labels_svg: list[str] = []
    for p, c in lay.tree_links:
        link = topo.link_between(p, c)
        assert link is not None
        pb, cb = boxes[p], boxes[c]
        bus = pb.bottom + BUS_DROP
        if c in lay.chained:
            path = f"M{pb.right:.1f},{cb.cy:.1f} L{cb.x:.1f},{cb.cy:.1f}"
        elif c in lay.rails:
            rail = lay.rails[c]
            path = _ortho([(pb.cx, pb.bottom), (pb.cx, bus), (rail, bus), (rail, cb.cy), (cb.x, cb.cy)])
        else:
            path = _ortho([(pb.cx, pb.bottom), (pb.cx, bus), (cb.cx, bus), (cb.cx, cb.y)])
        w, colour, dash, text_colour = style_of(link)
        lines_svg.append(((link.key in highlight, w), _link_group(
            link, path, width=w, colour=colour, dash=dash,
            tooltip=_link_tooltip(link, extra.get(link.key)))))
        labels_svg.extend(_label_block(lay.link_label_boxes[(p, c)], lay.link_label_lines[(p, c)],
                                       text_colour, align="start" if c in lay.rails else "middle"))
        drawn.add(link.key)
    for _, part in sorted(lines_svg, key=lambda item: item[0]):
        out.extend(part)
    out.append('<g class="link-labels">')
    out.extend(labels_svg)
    out.append("</g>")

    # Memory beside its socket: a short horizontal link.
    for s, m in lay.beside.items():
        link = topo.link_between(s, m)
        assert link is not None
        sb, mb = boxes[s], boxes[m]
        x1, x2 = (mb.right, sb.x) if mb.x < sb.x else (sb.right, mb.x)
        w, colour, dash, text_colour = style_of(link)
        text = _bw_text(link) + (f" · {extra[link.key]}" if link.key in extra else "")
        label = _text((x1 + x2) / 2, sb.cy - w / 2 - 4, text, size=LINK_FONT_PX, fill=text_colour)
        out.extend(_link_group(link, f"M{x1:.1f},{sb.cy:.1f} L{x2:.1f},{sb.cy:.1f}", width=w,
                               colour=colour, dash=dash,
                               tooltip=_link_tooltip(link, extra.get(link.key)), extra_svg=[label]))
        drawn.add(link.key)

    nodes_at = len(out)
    # Nodes.
    for n in topo.nodes():
        b = boxes[n.id]
        fill, stroke = KIND_COLOURS.get(n.kind, KIND_COLOURS[NodeKind.OTHER])
        lines = lay.node_lines[n.id]
        empty = n.kind == NodeKind.SLOT and lines[-1].endswith("empty")
        dash = ' stroke-dasharray="5,3"' if empty else ""
        if empty:
            fill = "#ffffff"
        small = _is_small(n)
        font = SMALL_FONT_PX if small else NODE_FONT_PX
        stroke_w = 1.0 if small else 1.6
        hot = ""
        if n.id in hot_nodes:
            stroke, stroke_w, hot = HIGHLIGHT, 3.5, ' data-highlight="bottleneck"'
        out.append(f'<g class="node" data-id="{_esc(n.id)}" data-kind="{_esc(n.kind.value)}"{hot}>')
        out.append(f"<title>{_esc(_node_tooltip(n))}</title>")
        out.append(f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.width:.1f}" height="{b.height:.1f}" '
                   f'rx="5" fill="{fill}" stroke="{stroke}" stroke-width="{stroke_w:g}"{dash}/>')
        line_h = font + 3
        y0 = b.cy - (len(lines) * line_h) / 2 + font * 0.85
        for i, t in enumerate(lines):
            out.append(_text(b.cx, y0 + i * line_h, t, size=font if i == 0 else font - 1,
                             weight="bold" if i == 0 and not small else None,
                             fill=TEXT if i == 0 else "#333333"))
        out.append("</g>")

    # Where labels already are, for the arcs' labels to keep clear of.
    taken: list[Box] = list(boxes.values()) + list(lay.link_label_boxes.values())

    # Links between sockets: straight between neighbours, arcs over the top otherwise.
    pos = {s: i for i, s in enumerate(lay.socket_row)}
    arc_i = 0
    for link in topo.links():
        if link.key in drawn or link.kind == LinkKind.NVLINK:
            continue
        a, b = boxes[link.src], boxes[link.dst]
        w, colour, dash, text_colour = style_of(link)
        text = " ".join(_link_label_lines(link, extra.get(link.key)))
        if link.src in pos and link.dst in pos and _straight(link.src, link.dst, pos, lay.mem_side):
            left, right = (a, b) if a.x < b.x else (b, a)
            path = f"M{left.right:.1f},{left.cy:.1f} L{right.x:.1f},{left.cy:.1f}"
            lx, ly = (left.right + right.x) / 2, left.cy - w / 2 - 5
        else:
            # higher for each further arc so that their labels do not stack
            arc_i += 1
            apex = min(a.y, b.y) - 24.0 - 16.0 * arc_i
            path = f"M{a.cx:.1f},{a.y:.1f} C{a.cx:.1f},{apex:.1f} {b.cx:.1f},{apex:.1f} {b.cx:.1f},{b.y:.1f}"
            lx, ly = (a.cx + b.cx) / 2, _bezier(a.y, apex, apex, b.y, 0.5) + 4
        tw = _text_w(text, LINK_FONT_PX) + 8
        plate = Box(lx - tw / 2, ly - LINK_FONT_PX, tw, LINK_FONT_PX + 4)
        taken.append(plate)
        out.extend(_link_group(link, path, width=w, colour=colour, dash=dash,
                               tooltip=_link_tooltip(link, extra.get(link.key)),
                               extra_svg=[_plate(plate), _text(lx, ly, text, size=LINK_FONT_PX,
                                                                fill=text_colour)]))
        drawn.add(link.key)

    # NVLink: green arcs dipping below the boxes they join. When there are
    # too many to label, they go faint under the boxes so that these stay
    # readable (only highlighted or annotated ones keep a label).
    nvlinks = [lk for lk in topo.links(LinkKind.NVLINK) if lk.key not in drawn]
    dense = len(nvlinks) > MAX_LABELLED_ARCS
    nv_lines: list[str] = []
    nv_labels: list[str] = []
    for link in nvlinks:
        a, b = boxes[link.src], boxes[link.dst]
        w, colour, dash, text_colour = style_of(link)
        if link.key in lay.nvlink_drops:  # one row: an arc dipping below it
            low = max(a.bottom, b.bottom) + lay.nvlink_drops[link.key]
            curve = ((a.cx, a.bottom), (a.cx, low), (b.cx, low), (b.cx, b.bottom))
        else:
            # between rows: an S-curve from the upper box's bottom to the
            # lower one's top, off-centre so that it runs beside a PCIe link
            up, down = (a, b) if a.y < b.y else (b, a)
            side = 1.0 if down.cx >= up.cx else -1.0
            x1, x2 = up.cx + side * up.width * 0.3, down.cx - side * down.width * 0.3
            mid = (up.bottom + down.y) / 2
            curve = ((x1, up.bottom), (x1, mid), (x2, mid), (x2, down.y))
        path = (f"M{curve[0][0]:.1f},{curve[0][1]:.1f} C{curve[1][0]:.1f},{curve[1][1]:.1f} "
                f"{curve[2][0]:.1f},{curve[2][1]:.1f} {curve[3][0]:.1f},{curve[3][1]:.1f}")
        marked = link.key in highlight or link.key in extra
        if link.key in highlight:
            line_w, opacity = w, 1.0
        elif dense:
            line_w, opacity = 1.0, 0.45
        else:
            line_w, opacity = max(1.2, w * 0.6), 0.85
        nv_lines.extend(_link_group(link, path, width=line_w, colour=colour, dash=dash,
                                    tooltip=_link_tooltip(link, extra.get(link.key)),
                                    opacity=opacity))
        if dense and not marked:
            continue
        text = _bw_text(link) + (f" · {extra[link.key]}" if link.key in extra else "")
        spot = _place_on_curve(text, *curve, taken)
        taken.append(spot)
        nv_labels.append(f'<g class="link-label" data-src="{_esc(link.src)}" '
                         f'data-dst="{_esc(link.dst)}">')
        nv_labels.append(_plate(spot, 0.9))
        nv_labels.append(_text(spot.cx, spot.bottom - 4, text, size=LINK_FONT_PX,
                               fill=text_colour if link.key in highlight else "#1d6b1d"))
        nv_labels.append("</g>")
    if dense:
        out[nodes_at:nodes_at] = nv_lines
    else:
        out.extend(nv_lines)
    out.extend(nv_labels)

    if lay.unplaced_top is not None:
        yb = lay.unplaced_top
        if lay.socket_row:
            out.append(f'<line x1="{MARGIN:.0f}" y1="{yb - 8:.1f}" x2="{width - MARGIN:.0f}" '
                       f'y2="{yb - 8:.1f}" stroke="#bbbbbb" stroke-dasharray="6,4"/>')
        out.append(_text(MARGIN, yb + 10, "unplaced — no source said where these hang",
                         size=12.0, anchor="start", fill=MUTED, style="italic"))

    out.append("</svg>")
    return "\n".join(out) + "\n"


# -- legend ----------------------------------------------------------------------


def _legend_items(topo: Topology, highlight: set[tuple[str, str]],
                  hot_nodes: set[str] = frozenset()) -> list[tuple[str, str, str]]:
    """(type, style key, text) for everything the picture uses."""
    items: list[tuple[str, str, str]] = []
    present = {n.kind for n in topo.nodes()}
    names = {NodeKind.SOCKET: "socket", NodeKind.MEMORY: "memory", NodeKind.SWITCH: "PCIe switch",
             NodeKind.SLOT: "slot", NodeKind.GPU: "GPU", NodeKind.NVME: "NVMe",
             NodeKind.NIC: "NIC", NodeKind.OTHER: "other device"}
    for kind in NodeKind:
        if kind in present:
            items.append(("box", kind.value, names[kind]))
    parents = {lk.src for lk in topo.links() if lk.kind in (LinkKind.PCIE, LinkKind.MEMORY)}
    if any(n.kind == NodeKind.SLOT and n.id not in parents and n.attrs.get("in_use") is not True
           for n in topo.nodes()):
        items.append(("box", "empty-slot", "empty slot"))
    links = topo.links()
    kinds = {lk.kind for lk in links}
    if LinkKind.PCIE in kinds:
        items.append(("line", "pcie", "PCIe (thicker = more GB/s)"))
    if LinkKind.MEMORY in kinds:
        items.append(("line", "memory", "memory"))
    if LinkKind.INTER_SOCKET in kinds:
        items.append(("line", "inter-socket", "inter-socket"))
    nv = [lk for lk in links if lk.kind == LinkKind.NVLINK]
    if nv:
        text = "NVLink"
        if len(nv) > MAX_LABELLED_ARCS:
            bws = sorted({_gbps(lk.bytes_per_s) for lk in nv})
            text = f"NVLink ({len(nv)} links, {', '.join(bws[:3])}{'…' if len(bws) > 3 else ''})"
        items.append(("line", "nvlink", text))
    if any(lk.bytes_per_s is None for lk in links):
        items.append(("line", "unknown", "unknown bandwidth"))
    if any(lk.bandwidth_source == "default" and lk.bytes_per_s for lk in links):
        items.append(("text", "~", "typical figure, not from this machine"))
    if highlight:
        items.append(("line", "highlight", "bottleneck link (saturated)"))
    if hot_nodes:
        items.append(("box", "hot", "bottleneck device (at its limit)"))
    items.append(("text", "GB/s", "GB/s per direction"))
    return items


def _legend_item_w(item: tuple[str, str, str]) -> float:
    return 34.0 + _text_w(item[2], 11.0) + 18.0


def _legend_rows(items: list[tuple[str, str, str]], width: float) -> list[list[tuple[str, str, str]]]:
    rows: list[list[tuple[str, str, str]]] = [[]]
    used = 0.0
    for it in items:
        w = _legend_item_w(it)
        if rows[-1] and used + w > width:
            rows.append([])
            used = 0.0
        rows[-1].append(it)
        used += w
    return rows if rows[0] else []


def _draw_legend(rows: list[list[tuple[str, str, str]]], x0: float, y0: float) -> list[str]:
    out = ['<g class="legend">']
    y = y0
    for row in rows:
        x = x0
        for kind, key, text in row:
            out.append(f'<g class="legend-item" data-key="{_esc(key)}">')
            if kind == "box":
                if key == "empty-slot":
                    fill, stroke, dash = "#ffffff", KIND_COLOURS[NodeKind.SLOT][1], ' stroke-dasharray="4,2"'
                elif key == "hot":
                    fill, stroke, dash = "#ffffff", HIGHLIGHT, ""
                else:
                    (fill, stroke), dash = KIND_COLOURS[NodeKind(key)], ""
                out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="26" height="14" rx="3" fill="{fill}" '
                           f'stroke="{stroke}" stroke-width="{3.0 if key == "hot" else 1.4:g}"{dash}/>')
            elif kind == "line":
                colour = {"pcie": LINK_COLOURS[LinkKind.PCIE], "memory": LINK_COLOURS[LinkKind.MEMORY],
                          "inter-socket": LINK_COLOURS[LinkKind.INTER_SOCKET],
                          "nvlink": LINK_COLOURS[LinkKind.NVLINK], "unknown": LINK_COLOURS[LinkKind.PCIE],
                          "highlight": HIGHLIGHT}[key]
                dash = ' stroke-dasharray="2,3"' if key == "unknown" else ""
                sw = {"unknown": 1.2, "highlight": 5.0}.get(key, 3.0)
                if key == "nvlink":
                    out.append(f'<path d="M{x:.1f},{y + 3:.1f} C{x + 4:.1f},{y + 16:.1f} {x + 22:.1f},'
                               f'{y + 16:.1f} {x + 26:.1f},{y + 3:.1f}" fill="none" stroke="{colour}" '
                               f'stroke-width="2.5"/>')
                else:
                    out.append(f'<line x1="{x:.1f}" y1="{y + 7:.1f}" x2="{x + 26:.1f}" y2="{y + 7:.1f}" '
                               f'stroke="{colour}" stroke-width="{sw:g}"{dash}/>')
            else:
                out.append(_text(x + 13, y + 11, key, size=11.0, weight="bold"))
            out.append(_text(x + 34, y + 11, text, size=11.0, anchor="start"))
            out.append("</g>")
            x += _legend_item_w((kind, key, text))
        y += 22.0
    out.append("</g>")
    return out


# -- files -------------------------------------------------------------------------


def write_svg(topo: Topology, path: str | os.PathLike[str], **kw: object) -> Path:
    """Write :func:`topology_svg` of ``topo`` to ``path`` atomically; returns the path.

    The picture goes to a temporary file in the same directory first and
    then replaces ``path`` in one step, so a reader (or a crash) never sees
    a half-written file. Keyword arguments go to :func:`topology_svg`. A
    directory that does not exist or cannot be written is a
    :class:`~planner.errors.TopologyError` naming the path.
    """
    target = Path(path)
    text = topology_svg(topo, **kw)  # type: ignore[arg-type]
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        why = "no such directory" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        raise TopologyError(f"{target}: cannot write the picture there ({directory}: {why})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            mode = target.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target
