"""Where the parts of a topology picture go: box sizes and texts, a tidy-tree layout (px).

:func:`topology_layout` is what :mod:`planner.topology.svg.draw` draws from; it is
kept apart from the drawing because a layout is checked (no overlaps, room
for every label) without any SVG.

The layout is a tidy tree: every subtree owns a horizontal interval, sibling
intervals follow each other left to right without overlapping, and a parent
is centred over its children. An interval is as wide as the widest of the
node's box, the label of the link into it and its children's intervals, so
neither boxes nor link labels of one row can collide. A parent with many
leaves — chipset functions, empty slots, slots holding one device — hangs
them in columns from rails, a slot's device drawn to its right. The tidy
tree, its stacks and the socket row share their state, so one layout in the
making is an object (``_Layouter``) whose methods are the steps. The texts and
their estimated widths are :mod:`planner.topology.svg.text`'s; which node
hangs under which is :mod:`planner.topology.svg.tree`'s.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from planner.errors import TopologyError
from planner.topology.model import Link, LinkKind, Topology
from planner.topology.svg.text import (
    LINE_GAP_PX,
    LINK_FONT_PX,
    NODE_FONT_PX,
    SMALL_FONT_PX,
    _bw_text,
    _is_empty_slot,
    _is_small,
    _link_label_lines,
    _node_lines,
    _text_w,
    _wrap,
)
from planner.topology.svg.tree import _chain_device, _tree

__all__ = ["Box", "TopologyLayout", "topology_layout"]

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
    return _Layouter(topo, _normalise_pairs(topo, link_labels or {})).layout(title_height)


class _Layouter:
    """One layout in the making: box sizes, stacks, labels, then the tidy tree's intervals."""

    def __init__(self, topo: Topology, extra: Mapping[tuple[str, str], str]) -> None:
        self.topo, self.extra = topo, extra
        self.sockets, self.beside, self.unplaced, self.kids = _tree(topo)
        self.node_of = {n.id: n for n in topo.nodes()}
        self._sizes()
        self._stacks()
        self._labels()
        self._stack_columns()
        self._memory_side()
        self.width_memo: dict[_Key, float] = {}
        self.boxes: dict[str, Box] = {}
        self.label_boxes: dict[tuple[str, str], Box] = {}
        self.rails: dict[str, float] = {}
        self.row_h = max([BOX_H, *(h for _, h in self.size.values())]) + ROW_GAP

    # -- what each thing needs -------------------------------------------------
    def _sizes(self) -> None:
        """Each node's text lines and box (width, height)."""
        self.node_lines: dict[str, tuple[str, ...]] = {}
        self.size: dict[str, tuple[float, float]] = {}  # box width, height
        for n in self.node_of.values():
            lines = _node_lines(n, _is_empty_slot(n, self.kids))
            font = SMALL_FONT_PX if _is_small(n) else NODE_FONT_PX
            lo, hi = (SMALL_MIN_W, SMALL_MAX_W) if _is_small(n) else (BOX_MIN_W, BOX_MAX_W)
            w = min(hi, max(lo, max(_text_w(t, font) for t in lines) + 2 * BOX_PAD_X))
            # a name too long for the widest box wraps onto a second line rather than being cut
            most = 2 if _is_small(n) else 3  # OTHER functions keep two lines; the tooltip has the rest
            wrapped = [lines[0], *(part for t in lines[1:] for part in _wrap(t, w - 2 * BOX_PAD_X, font, most))]
            wrapped[0:1] = _wrap(lines[0], w - 2 * BOX_PAD_X, font)
            self.node_lines[n.id] = tuple(wrapped)
            base = SMALL_BOX_H if _is_small(n) else BOX_H
            self.size[n.id] = (w, base + (font + 3) * max(0, len(wrapped) - 2))

    def _stacks(self) -> None:
        """Which leaves hang in columns from rails, and which devices are chained to their slot.

        A busy parent's leaves — OTHER functions, empty slots, and slots holding
        one leaf device (drawn as a chain: slot, then its device to the right) —
        go into a stack of columns hanging from rails: side by side, the slots of
        a switch or the bays of a backplane would stretch the picture over metres.
        """
        kids, node_of = self.kids, self.node_of
        nvlinked = {end for lk in self.topo.links(LinkKind.NVLINK) for end in lk.key}
        self.stacks: dict[str, list[str]] = {}
        self.chained: dict[str, str] = {}  # device -> the slot it is drawn beside
        self.layout_kids: dict[_Key, list[_Key]] = {}
        for p, cs in kids.items():
            # a node with NVLinks stays on the row, where its arcs can reach it
            items = [c for c in cs if c not in nvlinked and (
                (not kids.get(c) and (_is_small(node_of[c]) or _is_empty_slot(node_of[c], kids)))
                or _chain_device(node_of[c], kids, nvlinked) is not None)]
            if len(items) >= STACK_MIN:
                self.stacks[p] = items
                self.layout_kids[p] = [c for c in cs if c not in items] + [("stack", p)]
                for c in items:
                    d = _chain_device(node_of[c], kids, nvlinked)
                    if d is not None:
                        self.chained[d] = c
            else:
                self.layout_kids[p] = list(cs)
        self.stacked_in = {c: p for p, cs in self.stacks.items() for c in cs}
        self.chain_of = {slot: d for d, slot in self.chained.items()}  # slot -> its chained device

    def _labels(self) -> None:
        """The text of the label of each tree link, and its width (keyed by the child)."""
        self.label_lines: dict[tuple[str, str], tuple[str, ...]] = {}
        self.label_w: dict[str, float] = {}  # width of the label of the link into a node
        for p, cs in self.kids.items():
            for c in cs:
                link = self.topo.link_between(p, c)
                assert link is not None  # kids only holds linked pairs
                lines = _link_label_lines(link, self.extra.get(link.key))
                if c in self.stacked_in or c in self.chained:  # one line beside the rail or above the chain
                    lines = [" · ".join(lines)]
                self.label_lines[(p, c)] = tuple(lines)
                self.label_w[c] = max(_text_w(t, LINK_FONT_PX) for t in lines) + 6

    def chain_gap(self, d: str) -> float:
        return max(self.label_w[d], 36.0) + 12.0

    def item_w(self, c: str) -> float:
        d = self.chain_of.get(c)
        box = self.size[c][0] + (self.chain_gap(d) + self.size[d][0] if d is not None else 0.0)
        return max(STACK_RAIL_X + STACK_INDENT + box, STACK_RAIL_X + 6 + self.label_w[c])

    def _stack_columns(self) -> None:
        """Columns of each stack: about twice as tall as wide, in rows of boxes; a
        stack of chains (wide items) goes in one column up to STACK_CHAIN_ROWS."""
        self.stack_cols: dict[str, list[list[str]]] = {}
        self.stack_col_w: dict[str, list[float]] = {}
        for p, items in self.stacks.items():
            if any(c in self.chain_of for c in items):
                columns = math.ceil(len(items) / STACK_CHAIN_ROWS)
                rows = math.ceil(len(items) / columns)  # balanced: 9 items are 5 + 4, not 8 + 1
            else:
                rows = min(len(items), max(STACK_MIN, math.ceil(math.sqrt(2 * len(items)))))
            cols = [items[i:i + rows] for i in range(0, len(items), rows)]
            self.stack_cols[p] = cols
            self.stack_col_w[p] = [max(self.item_w(c) for c in col) for col in cols]

    def _memory_side(self) -> None:
        """The gap for a memory link's label, and on which side of its socket memory goes."""
        topo, extra = self.topo, self.extra
        mem_texts = ["~100 GB/s"]
        for s, m in self.beside.items():
            lk = topo.link_between(s, m)
            if lk is not None:
                mem_texts.append(_bw_text(lk) + (f" · {extra[lk.key]}" if lk.key in extra else ""))
        self.mem_gap = max(_text_w(t, LINK_FONT_PX) for t in mem_texts) + 16
        linked = [s for s in self.sockets
                  if any(lk.kind == LinkKind.INTER_SOCKET and s in lk.key for lk in topo.links())]
        last = linked[-1] if len(linked) >= 2 else None
        self.mem_side = {s: "right" if s == last else "left" for s in self.sockets}

    # -- the tidy tree ------------------------------------------------------------
    def extents(self, x: _Key) -> tuple[float, float]:
        """Room a node needs left and right of its centre on its own row."""
        if isinstance(x, tuple):
            col_w = self.stack_col_w[x[1]]
            half = (sum(col_w) + STACK_COL_GAP * (len(col_w) - 1)) / 2
            return half, half
        w = self.size[x][0]
        half = max(w, self.label_w.get(x, 0.0)) / 2
        left = right = half
        m = self.beside.get(x)
        if m is not None:
            side = self.size[m][0] + self.mem_gap
            if self.mem_side[x] == "left":
                left = max(left, w / 2 + side)
            else:
                right = max(right, w / 2 + side)
        return left, right

    def block_w(self, x: _Key) -> float:
        cs = self.layout_kids.get(x, [])
        return sum(self.width_memo[c] for c in cs) + SIBLING_GAP * max(0, len(cs) - 1)

    def subtree_w(self, root: _Key) -> float:
        # iterative post-order: a chain of bridges may be deeper than the recursion limit
        width_memo = self.width_memo
        stack: list[tuple[_Key, bool]] = [(root, False)]
        while stack:
            y, done = stack.pop()
            if y in width_memo:
                continue
            cs = self.layout_kids.get(y, [])
            if not done and cs:
                stack.append((y, True))
                stack.extend((c, False) for c in cs if c not in width_memo)
                continue
            lft, rgt = self.extents(y)
            width_memo[y] = max(lft + rgt, self.block_w(y))
        return width_memo[root]

    def place(self, root: _Key, left: float, centre: dict[_Key, float], depth: dict[_Key, int]) -> None:
        self.subtree_w(root)
        width_memo = self.width_memo
        # pre-order hands out intervals; post-order centres parents over their children
        order: list[tuple[_Key, float]] = []
        stack: list[tuple[_Key, float, int]] = [(root, left, 0)]
        while stack:
            x, lft, d = stack.pop()
            order.append((x, lft))
            depth[x] = d
            cs = self.layout_kids.get(x, [])
            cl = lft + (width_memo[x] - self.block_w(x)) / 2
            starts = []
            for c in cs:
                starts.append((c, cl, d + 1))
                cl += width_memo[c] + SIBLING_GAP
            stack.extend(reversed(starts))
        for x, lft in reversed(order):
            cs = self.layout_kids.get(x, [])
            mid = (centre[cs[0]] + centre[cs[-1]]) / 2 if cs else lft + width_memo[x] / 2
            el, er = self.extents(x)
            centre[x] = min(max(mid, lft + el), lft + width_memo[x] - er)

    # -- boxes ----------------------------------------------------------------------
    def materialise(self, centre: Mapping[_Key, float], depth: Mapping[_Key, int], band_top: float) -> None:
        for key, c in centre.items():
            y = band_top + depth[key] * self.row_h
            if isinstance(key, tuple):
                self._stack_boxes(key[1], c - self.extents(key)[0], y)
                continue
            w, h = self.size[key]
            self.boxes[key] = Box(c - w / 2, y, w, h)

    def _stack_boxes(self, p: str, x: float, y: float) -> None:
        """The boxes and labels of the stack of ``p``, its left edge at ``x``, top at ``y``."""
        size, label_w = self.size, self.label_w
        lh = LINK_FONT_PX + 3
        for col, cw in zip(self.stack_cols[p], self.stack_col_w[p], strict=True):
            rail = x + STACK_RAIL_X
            yy = y
            for item in col:
                w, h = size[item]
                d = self.chain_of.get(item)
                row_h_item = max(h, size[d][1]) if d is not None else h
                b = Box(rail + STACK_INDENT, yy + (row_h_item - h) / 2, w, h)
                self.boxes[item] = b
                self.rails[item] = rail
                self.label_boxes[(p, item)] = Box(rail + 6, b.y - lh - 3, label_w[item], lh)
                if d is not None:
                    dw, dh = size[d]
                    db = Box(b.right + self.chain_gap(d), b.cy - dh / 2, dw, dh)
                    self.boxes[d] = db
                    self.label_boxes[(item, d)] = Box((b.right + db.x) / 2 - label_w[d] / 2,
                                                      b.cy - lh - 3, label_w[d], lh)
                yy += row_h_item + STACK_PITCH - SMALL_BOX_H
            x += cw + STACK_COL_GAP

    def _socket_row(self, top: float) -> float:
        """The sockets' trees left to right, memory beside each socket; the right edge."""
        # Room between sockets for the inter-socket label.
        xs_label = max(
            (_text_w(" ".join(_link_label_lines(lk, self.extra.get(lk.key))), LINK_FONT_PX)
             for lk in self.topo.links(LinkKind.INTER_SOCKET)),
            default=0.0,
        )
        top_gap = max(TREE_GAP, xs_label + 32)
        centre: dict[_Key, float] = {}
        depth: dict[_Key, int] = {}
        x = MARGIN
        prev_right: float | None = None  # right edge of the previous socket's box (and memory)
        for s in self.sockets:
            trial: dict[_Key, float] = {}
            self.place(s, 0.0, trial, {})
            left_edge = trial[s] - self.extents(s)[0]
            if prev_right is not None:
                # subtrees TREE_GAP apart, socket boxes far enough apart for the inter-socket label
                x = max(x, prev_right + top_gap - left_edge)
            self.place(s, x, centre, depth)
            prev_right = centre[s] + self.extents(s)[1]
            x += self.width_memo[s] + TREE_GAP
        self.materialise(centre, depth, top)
        for s, m in self.beside.items():
            sb = self.boxes[s]
            w, h = self.size[m]
            mx = sb.x - self.mem_gap - w if self.mem_side[s] == "left" else sb.right + self.mem_gap
            self.boxes[m] = Box(mx, sb.y + (sb.height - h) / 2, w, h)
        return x - TREE_GAP if self.sockets else MARGIN

    def _unplaced_band(self, top: float, right: float) -> tuple[float | None, float]:
        """The roots no source placed, in a band below the sockets: (its top, the right edge)."""
        if not self.unplaced:
            return None, right
        boxes = self.boxes
        main_bottom = max((b.bottom for b in boxes.values()), default=top)
        for (a, b), drop in _nvlink_drops(self.topo, boxes).items():  # keep clear of arcs
            main_bottom = max(main_bottom, max(boxes[a].bottom, boxes[b].bottom) + drop + LINK_FONT_PX)
        unplaced_top = main_bottom + 36.0 if self.sockets else top
        centre: dict[_Key, float] = {}
        depth: dict[_Key, int] = {}
        x = MARGIN
        for r in self.unplaced:
            self.place(r, x, centre, depth)
            x += self.width_memo[r] + TREE_GAP
        self.materialise(centre, depth, unplaced_top + 26.0)
        return unplaced_top, max(right, x - TREE_GAP)

    def layout(self, title_height: float) -> TopologyLayout:
        """Every box and label placed below ``title_height`` px of title and legend."""
        arcs_above = _socket_arcs(self.topo, self.sockets, self.mem_side)
        arc_band = (28.0 + 16.0 * len(arcs_above)) if arcs_above else 0.0
        top = MARGIN + title_height + arc_band
        right = self._socket_row(top)
        unplaced_top, right = self._unplaced_band(top, right)
        boxes = self.boxes
        for (p, c), lines in self.label_lines.items():
            if c in self.stacked_in or c in self.chained:
                continue
            cb = boxes[c]
            h = (LINK_FONT_PX + LINE_GAP_PX) * len(lines) + 2
            self.label_boxes[(p, c)] = Box(cb.cx - self.label_w[c] / 2, cb.y - LABEL_CLEAR - h,
                                           self.label_w[c], h)
        drops = _nvlink_drops(self.topo, boxes)
        bottom = max((b.bottom for b in boxes.values()), default=top)
        for key, drop in drops.items():
            a, b = boxes[key[0]], boxes[key[1]]
            bottom = max(bottom, max(a.bottom, b.bottom) + drop + LINK_FONT_PX + 4)
        width = max((b.right for b in boxes.values()), default=MARGIN)
        return TopologyLayout(
            boxes=boxes,
            link_label_boxes=self.label_boxes,
            link_label_lines=self.label_lines,
            node_lines=self.node_lines,
            tree_links=tuple((p, c) for p, cs in self.kids.items() for c in cs),
            rails=self.rails,
            beside=dict(self.beside),
            mem_side=self.mem_side,
            socket_row=tuple(self.sockets),
            unplaced=tuple(self.unplaced),
            unplaced_top=unplaced_top,
            nvlink_drops=drops,
            top=top,
            width=max(width, right) + MARGIN,
            height=bottom + MARGIN,
            chained=self.chained,
        )


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
