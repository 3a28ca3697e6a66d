"""Text pictures of a topology: a rich ``Tree`` and plain summary lines.

Nothing here prints; the command line decides where the output goes.

>>> from planner.topology.model import Link, Node, NodeKind, Topology
>>> t = Topology("toy")
>>> _ = t.add_node(Node("socket0", NodeKind.SOCKET, "socket 0"))
>>> _ = t.add_node(Node("pci:0000:01:00.0", NodeKind.GPU, "A100", bus_address="0000:01:00.0"))
>>> _ = t.add_link(Link.pcie("socket0", "pci:0000:01:00.0", 4, 16))
>>> print(tree_text(t, width=80))
toy
└── socket 0
    └── GPU 0000:01:00.0 A100  ← Gen4 x16 · 25.2 GB/s
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import format_link
from planner.topology.svg.text import slot_title

_KIND_STYLE = {
    NodeKind.SOCKET: "bold cyan",
    NodeKind.MEMORY: "cyan",
    NodeKind.SWITCH: "bold magenta",
    NodeKind.SLOT: "yellow",
    NodeKind.GPU: "bold green",
    NodeKind.NVME: "bold blue",
    NodeKind.NIC: "white",
    NodeKind.OTHER: "dim",
}

_KIND_WORD = {
    NodeKind.GPU: "GPU",
    NodeKind.NVME: "NVMe",
    NodeKind.NIC: "NIC",
    NodeKind.OTHER: "device",
}


def gbps(bytes_per_s: float | None) -> str:
    """``25.2 GB/s`` (decimal gigabytes), ``? GB/s`` when unknown."""
    return "? GB/s" if bytes_per_s is None else f"{bytes_per_s / 1e9:.1f} GB/s"


def link_text(lk: Link) -> str:
    """Short description of a link: generation × width and bandwidth, with its source if not measured or tabled."""
    if lk.kind == LinkKind.PCIE:
        text = f"{format_link(lk.pcie_gen, lk.lanes)} · {gbps(lk.bytes_per_s)}"
        cur = (lk.attrs.get("current_gen"), lk.attrs.get("current_lanes"))
        if all(cur) and (cur[0], cur[1]) != (lk.pcie_gen, lk.lanes):
            text += f" (running {format_link(*cur)})"
    else:
        text = f"{lk.kind.value} · {gbps(lk.bytes_per_s)}"
    if lk.bandwidth_source in ("default", "unknown") and lk.bytes_per_s is not None:
        text += " (default)"
    return text


def node_text(node: Node) -> str:
    """One-line description of a node."""
    if node.kind in _KIND_WORD:
        parts = [_KIND_WORD[node.kind]]
        if node.bus_address:
            parts.append(node.bus_address)
        if node.name:
            parts.append(node.name)
        return " ".join(parts)
    if node.kind == NodeKind.SLOT:
        a = node.attrs
        details = [str(a[k]).upper() if k == "form_factor" else str(a[k])
                   for k in ("form_factor",) if a.get(k)]
        if a.get("width_lanes"):
            details.append(f"x{a['width_lanes']}")
        details.append("in use" if a.get("in_use") else "empty")
        # "Slot 0 (switch 1)", "Front NVMe bay 0", "slot 168": never "slot Slot 0"
        return f"{slot_title(node) if a.get('designation') else 'slot ' + node.id} ({', '.join(details)})"
    if node.kind == NodeKind.SWITCH:
        model = node.attrs.get("model")
        ids = f" [{node.vendor_id}:{node.device_id}]" if node.vendor_id and node.device_id else ""
        return f"{node.label}{ids}" + (f" {model}" if model else "")
    if node.kind == NodeKind.SOCKET:
        numa = node.attrs.get("numa_nodes")
        extra = f" (NUMA {', '.join(map(str, numa))})" if numa else ""
        cpu = node.attrs.get("cpu_model")
        return node.label + extra + (f" {cpu}" if cpu else "")
    return node.label


def short_name(node: Node) -> str:
    """``GPU 0000:04:00.0`` for devices with an address, else the node's label."""
    if node.kind in _KIND_WORD and node.bus_address:
        return f"{_KIND_WORD[node.kind]} {node.bus_address}"
    return node.label


def topology_tree(topo: Topology, *, show_other: bool = False) -> Tree:
    """A rich ``Tree``: sockets, their memory, and the PCIe tree below each.

    Devices of kind ``other`` (chipset functions, BMC, USB) are folded into one
    line per parent unless ``show_other``.
    """
    counts = {k: v for k, v in topo.counts().items() if v}
    root = Tree(f"[bold]{escape(topo.name or 'topology')}[/bold]")
    seen: set[str] = set()

    def add(branch: Tree, node: Node, via: Link | None) -> None:
        seen.add(node.id)
        label = f"[{_KIND_STYLE[node.kind]}]{escape(node_text(node))}[/]"
        if via is not None:
            label += f"  [dim]← {escape(link_text(via))}[/dim]"
        sub = branch.add(label)
        kids = topo.children(node.id)
        hidden = 0
        for child in kids:
            if child.id in seen:
                continue
            if child.kind == NodeKind.OTHER and not show_other and not topo.children(child.id):
                hidden += 1
                seen.add(child.id)
                continue
            add(sub, child, topo.link_between(node.id, child.id))
        if hidden:
            sub.add(f"[dim]… {hidden} other device{'s' if hidden > 1 else ''} (--all shows them)[/dim]")

    for node in topo.roots():
        if node.id not in seen:
            add(root, node, None)
    extra = [lk for lk in topo.links() if lk.kind in (LinkKind.INTER_SOCKET, LinkKind.NVLINK)]
    if extra:
        br = root.add("[bold]other links[/bold]")
        for lk in extra:
            a, b = topo.node(lk.src), topo.node(lk.dst)
            br.add(escape(f"{short_name(a)} ↔ {short_name(b)}: {link_text(lk)}"))
    if topo.notes:
        br = root.add("[bold yellow]notes[/bold yellow]")
        for note in topo.notes:
            br.add(f"[yellow]{escape(note)}[/yellow]")
    root.label = f"{root.label}  [dim]{escape(_counts_text(counts))}[/dim]" if counts else root.label
    return root


def _counts_text(counts: dict[str, int]) -> str:
    order = ["socket", "switch", "slot", "gpu", "nvme", "nic", "other"]
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))


def tree_text(topo: Topology, *, width: int = 120, show_other: bool = False) -> str:
    """The tree as plain text (no colour), for logs and tests."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, highlight=False, emoji=False)
    tree = topology_tree(topo, show_other=show_other)
    tree.label = topo.name or "topology"
    console.print(tree)
    return buf.getvalue().rstrip("\n")
