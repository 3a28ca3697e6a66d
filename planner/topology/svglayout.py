"""Where the parts of a topology picture go: box sizes and texts, a tidy-tree layout (px).

:func:`topology_layout` is what :mod:`planner.topology.svg` draws from; it is
kept apart from the drawing because a layout is checked (no overlaps, room
for every label) without any SVG.

The layout is a tidy tree: every subtree owns a horizontal interval, sibling
intervals follow each other left to right without overlapping, and a parent
is centred over its children. An interval is as wide as the widest of the
node's box, the label of the link into it and its children's intervals, so
neither boxes nor link labels of one row can collide. A parent with many
leaves — chipset functions, empty slots, slots holding one device — hangs
them in columns from rails, a slot's device drawn to its right. Text widths
are estimated from the character count (no font metrics): :data:`CHAR_EM`
errs on the wide side. ``topology_layout`` is long because the tidy tree,
its stacks and the socket row share their state; its parts are steps of one
computation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from planner.errors import TopologyError
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology

__all__ = ["Box", "TopologyLayout", "device_number", "slot_title", "topology_layout"]
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
ARC_SPACING = 8.0  # least vertical distance between NVLink arcs over a shared stretch


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


# -- layout ------------------------------------------------------------------

#: a parent with at least this many leaf children of kind OTHER shows them
#: stacked in columns hanging from a rail, not side by side: a chipset's
#: dozens of functions would otherwise stretch the picture over metres.
STACK_MIN = 4
STACK_RAIL_X = 4.0  # rail position inside a stack column
STACK_INDENT = 14.0  # from a column's rail to its boxes
STACK_PITCH = SMALL_BOX_H + LINK_FONT_PX + 10.0
STACK_COL_GAP = 12.0
STACK_CHAIN_ROWS = 8  # a stack with slot → device chains stays one column up to this many


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
            columns = math.ceil(len(items) / STACK_CHAIN_ROWS)
            rows = math.ceil(len(items) / columns)  # balanced: 9 items are 5 + 4, not 8 + 1
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
    # Compare the arcs' lowest points (y), not base + drop: re-adding base_y
    # can land a bumped arc an ulp short of 8 px again, and the loop never
    # ended (issue 13: a random tree ran for minutes). Each bump moves the arc
    # strictly lower, to 8 px under an arc it clashes with, so at most
    # len(placed) bumps happen.
    placed: list[tuple[float, float, float]] = []  # lo x, hi x, lowest y
    out: dict[tuple[str, str], float] = {}
    for lk in links:
        a, b = boxes[lk.src], boxes[lk.dst]
        lo, hi = sorted((a.cx, b.cx))
        base_y = max(a.bottom, b.bottom)
        low = base_y + 16.0 + min(0.12 * (hi - lo), ROW_GAP * 0.6)
        while True:
            clash = [py for plo, phi, py in placed
                     if plo < hi and lo < phi and abs(low - py) < ARC_SPACING - 1e-6]
            if not clash:
                break
            low = max(low, max(clash) + ARC_SPACING)
        placed.append((lo, hi, low))
        out[lk.key] = low - base_y
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
