"""Draw a topology as a self-contained SVG picture.

The picture is a layered tree read top-down: sockets with their memory
beside them on the first row (inter-socket links drawn between them), then
switches, slots and devices below the part they hang from. Every tree link
is labelled with its PCIe generation × width and its capacity per direction,
and drawn thicker the faster it is (log scale). NVLink links are green arcs
between the GPUs they join. Parts that hang nowhere (no source could place
them) get a separate band labelled "unplaced". A legend explains colours and
line styles.

Where everything goes is :mod:`planner.topology.svg.layout`'s: a tidy tree
whose busy parents hang their leaves in columns from rails (side by side, the
slots of a switch and the bays of a backplane made Machine B's plan 3855 px
wide; now about 1850). This module turns that layout into SVG; it is long
because :func:`topology_svg` draws in layers (tree links, labels, nodes,
socket links, NVLink arcs, the unplaced band) that share one layout.

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
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from planner.errors import TopologyError
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.svg.layout import (
    BUS_DROP,
    MARGIN,
    Box,
    TopologyLayout,
    _link_key,
    _normalise_pairs,
    _straight,
    topology_layout,
)
from planner.topology.svg.style import (
    FONT_FAMILY,
    HIGHLIGHT,
    KIND_COLOURS,
    LINK_COLOURS,
    MAX_LABELLED_ARCS,
    MUTED,
    TEXT,
    _draw_legend,
    _esc,
    _legend_items,
    _legend_rows,
    _text,
)
from planner.topology.svg.text import (
    LINE_GAP_PX,
    LINK_FONT_PX,
    NODE_FONT_PX,
    SMALL_FONT_PX,
    _bw_text,
    _fit,
    _gbps,
    _is_small,
    _link_label_lines,
    _text_w,
)

__all__ = ["topology_svg", "write_svg"]

SVG_NS = "http://www.w3.org/2000/svg"

# -- text helpers ----------------------------------------------------------

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
    lay = _layout_under_title(topo, extra, heading, notes, legend_items)
    width = max(lay.width, 720.0, _text_w(heading, 18.0) + 2 * MARGIN)
    height = lay.height
    out: list[str] = [
        f'<svg xmlns="{SVG_NS}" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{_esc(FONT_FAMILY)}">',
        f"<title>{_esc(heading)}</title>",
        f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
    ]
    out += _heading(topo, heading, notes, legend_items, width)
    drawn: set[tuple[str, str]] = set()
    out += _tree_links(topo, lay, highlight, extra, drawn)
    out += _memory_links(topo, lay, highlight, extra, drawn)
    nodes_at = len(out)
    out += _nodes(topo, lay, hot_nodes)
    # Where labels already are, for the arcs' labels to keep clear of.
    taken: list[Box] = list(lay.boxes.values()) + list(lay.link_label_boxes.values())
    out += _socket_links(topo, lay, highlight, extra, drawn, taken)
    nv_lines, nv_labels, dense = _nvlinks(topo, lay, highlight, extra, drawn, taken)
    if dense:  # faint arcs under the boxes
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


def _layout_under_title(topo: Topology, extra: dict[tuple[str, str], str], heading: str,
                        notes: list[str], legend_items: list[tuple[str, str, str]]) -> TopologyLayout:
    """The layout with room above for the heading, notes and legend.

    The legend wraps at the canvas width, which the layout decides: lay out
    with a guess of the heading's height, then again if the guess was wrong.
    """
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
    return lay


def _heading(topo: Topology, heading: str, notes: list[str], legend_items: list[tuple[str, str, str]],
             width: float) -> list[str]:
    """Heading, counts, notes, legend."""
    y = MARGIN + 18.0
    out = [_text(MARGIN, y, _fit(heading, width - 2 * MARGIN, 18.0), size=18.0,
                 anchor="start", weight="bold")]
    y += 18.0
    out.append(_text(MARGIN, y, _counts_text(topo), size=12.0, anchor="start", fill=MUTED))
    for note in notes:
        y += 14.0
        out.append(_text(MARGIN, y, _fit("note: " + note, width - 2 * MARGIN, 11.0), size=11.0,
                         anchor="start", fill=MUTED, style="italic"))
    y += 16.0
    out.extend(_draw_legend(_legend_rows(legend_items, width - 2 * MARGIN), MARGIN, y))
    return out


def _style(link: Link, highlight: set[tuple[str, str]]) -> tuple[float, str, str | None, str]:
    """(stroke width, colour, dash, label colour) of a link; red and thicker when highlighted."""
    w = _stroke_w(link)
    colour = LINK_COLOURS.get(link.kind, LINK_COLOURS[LinkKind.PCIE])
    dash = "2,3" if link.bytes_per_s is None else None
    text_colour = TEXT
    if link.key in highlight:
        w, colour, text_colour = w + 2.5, HIGHLIGHT, HIGHLIGHT
    return w, colour, dash, text_colour


def _tree_links(topo: Topology, lay: TopologyLayout, highlight: set[tuple[str, str]],
                extra: dict[tuple[str, str], str], drawn: set[tuple[str, str]]) -> list[str]:
    """Tree links, thin ones first so that thick and highlighted ones stay on
    top where they share a stretch; labels after all lines."""
    boxes = lay.boxes
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
        w, colour, dash, text_colour = _style(link, highlight)
        lines_svg.append(((link.key in highlight, w), _link_group(
            link, path, width=w, colour=colour, dash=dash,
            tooltip=_link_tooltip(link, extra.get(link.key)))))
        labels_svg.extend(_label_block(lay.link_label_boxes[(p, c)], lay.link_label_lines[(p, c)],
                                       text_colour, align="start" if c in lay.rails else "middle"))
        drawn.add(link.key)
    out: list[str] = []
    for _, part in sorted(lines_svg, key=lambda item: item[0]):
        out.extend(part)
    return [*out, '<g class="link-labels">', *labels_svg, "</g>"]


def _memory_links(topo: Topology, lay: TopologyLayout, highlight: set[tuple[str, str]],
                  extra: dict[tuple[str, str], str], drawn: set[tuple[str, str]]) -> list[str]:
    """Memory beside its socket: a short horizontal link."""
    out: list[str] = []
    for s, m in lay.beside.items():
        link = topo.link_between(s, m)
        assert link is not None
        sb, mb = lay.boxes[s], lay.boxes[m]
        x1, x2 = (mb.right, sb.x) if mb.x < sb.x else (sb.right, mb.x)
        w, colour, dash, text_colour = _style(link, highlight)
        text = _bw_text(link) + (f" · {extra[link.key]}" if link.key in extra else "")
        label = _text((x1 + x2) / 2, sb.cy - w / 2 - 4, text, size=LINK_FONT_PX, fill=text_colour)
        out.extend(_link_group(link, f"M{x1:.1f},{sb.cy:.1f} L{x2:.1f},{sb.cy:.1f}", width=w,
                               colour=colour, dash=dash,
                               tooltip=_link_tooltip(link, extra.get(link.key)), extra_svg=[label]))
        drawn.add(link.key)
    return out


def _nodes(topo: Topology, lay: TopologyLayout, hot_nodes: set[str]) -> list[str]:
    """One group per node: its box, tooltip and lines of text."""
    out: list[str] = []
    for n in topo.nodes():
        b = lay.boxes[n.id]
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
    return out


def _socket_links(topo: Topology, lay: TopologyLayout, highlight: set[tuple[str, str]],
                  extra: dict[tuple[str, str], str], drawn: set[tuple[str, str]],
                  taken: list[Box]) -> list[str]:
    """Links between sockets: straight between neighbours, arcs over the top otherwise."""
    out: list[str] = []
    boxes = lay.boxes
    pos = {s: i for i, s in enumerate(lay.socket_row)}
    arc_i = 0
    for link in topo.links():
        if link.key in drawn or link.kind == LinkKind.NVLINK:
            continue
        a, b = boxes[link.src], boxes[link.dst]
        w, colour, dash, text_colour = _style(link, highlight)
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
    return out


def _nvlinks(topo: Topology, lay: TopologyLayout, highlight: set[tuple[str, str]],
             extra: dict[tuple[str, str], str], drawn: set[tuple[str, str]],
             taken: list[Box]) -> tuple[list[str], list[str], bool]:
    """NVLink: green arcs dipping below the boxes they join; (lines, labels, dense).

    When there are too many to label (``dense``), they go faint under the
    boxes so that these stay readable (only highlighted or annotated ones keep
    a label).
    """
    nvlinks = [lk for lk in topo.links(LinkKind.NVLINK) if lk.key not in drawn]
    dense = len(nvlinks) > MAX_LABELLED_ARCS
    nv_lines: list[str] = []
    nv_labels: list[str] = []
    for link in nvlinks:
        curve = _nvlink_curve(lay, link)
        w, colour, dash, text_colour = _style(link, highlight)
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
    return nv_lines, nv_labels, dense


def _nvlink_curve(lay: TopologyLayout, link: Link) -> tuple[tuple[float, float], ...]:
    """The four points of an NVLink's cubic curve."""
    a, b = lay.boxes[link.src], lay.boxes[link.dst]
    if link.key in lay.nvlink_drops:  # one row: an arc dipping below it
        low = max(a.bottom, b.bottom) + lay.nvlink_drops[link.key]
        return (a.cx, a.bottom), (a.cx, low), (b.cx, low), (b.cx, b.bottom)
    # between rows: an S-curve from the upper box's bottom to the
    # lower one's top, off-centre so that it runs beside a PCIe link
    up, down = (a, b) if a.y < b.y else (b, a)
    side = 1.0 if down.cx >= up.cx else -1.0
    x1, x2 = up.cx + side * up.width * 0.3, down.cx - side * down.width * 0.3
    mid = (up.bottom + down.y) / 2
    return (x1, up.bottom), (x1, mid), (x2, mid), (x2, down.y)


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
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # a disk that fills while writing: the old picture, if any, is kept
            raise TopologyError(f"{target}: cannot write the picture there ({directory}: "
                                f"{exc.strerror or exc})") from None
        raise
    return target
