"""The texts of a topology picture: fonts, estimated widths, wrapping, box and link labels.

Text widths are estimated from the character count (no font metrics):
:data:`CHAR_EM` errs on the wide side.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from planner.topology.model import Link, LinkKind, Node, NodeKind

#: average advance of a character as a share of the font size; DejaVu Sans and
#: Verdana are wide faces, so the estimate errs on the wide side.
CHAR_EM = 0.62

NODE_FONT_PX = 12.0
SMALL_FONT_PX = 10.0  # OTHER nodes, which can be many, are drawn smaller
LINK_FONT_PX = 10.0
LINE_GAP_PX = 2.0

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
        first = f"Gen{link.pcie_gen or '?'} x{link.lanes or '?'}" if link.pcie_gen or link.lanes else "PCIe"
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
