"""The look of a topology picture: colours per kind, XML-safe text, and the legend that explains them."""

from __future__ import annotations

import re
from collections.abc import Set as AbstractSet

from planner.topology.model import LinkKind, NodeKind, Topology
from planner.topology.svg.text import _gbps, _text_w

FONT_FAMILY = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"

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


_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _esc(text: object) -> str:
    """``text`` as XML character data or attribute value (quotes escaped too).

    Characters XML 1.0 cannot carry at all become U+FFFD.

    >>> _esc('a<b & "c"\\x00')
    'a&lt;b &amp; &quot;c&quot;\ufffd'
    """
    s = _XML_INVALID.sub("\ufffd", str(text))
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


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


# -- legend ----------------------------------------------------------------------


def _legend_items(topo: Topology, highlight: set[tuple[str, str]],
                  hot_nodes: AbstractSet[str] = frozenset()) -> list[tuple[str, str, str]]:
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
