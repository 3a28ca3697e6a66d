"""The device graph: typed hardware nodes joined by links with a capacity.

A :class:`Topology` wraps a networkx ``DiGraph``. Every physical link is kept
once as a :class:`Link` (``src`` is the upstream end, towards the CPU, for
tree links) and appears in the graph as two directed edges, one per direction,
each with the link's per-direction capacity in ``bytes_per_s``. Flow models
work on :attr:`Topology.graph` directly.

>>> topo = Topology(name="toy")
>>> _ = topo.add_node(Node("socket0", NodeKind.SOCKET, "socket 0", numa_node=0))
>>> _ = topo.add_node(Node("pci:0000:01:00.0", NodeKind.GPU, "A100"))
>>> _ = topo.add_link(Link.pcie("socket0", "pci:0000:01:00.0", gen=4, lanes=16))
>>> topo.parent("pci:0000:01:00.0").id
'socket0'
>>> round(topo.graph.edges["pci:0000:01:00.0", "socket0"]["bytes_per_s"] / 1e9, 1)
25.2
>>> topo.counts()["gpu"]
1
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

import networkx as nx

from momentbase.jsontypes import JsonValue
from planner.errors import TopologyError
from planner.topology.pcie import DEFAULT_EFFICIENCY, pcie_bytes_per_s


class NodeKind(str, Enum):
    """What a node of the device graph is."""

    SOCKET = "socket"  # a CPU package with its root complex
    MEMORY = "memory"  # the DRAM of one NUMA node
    SWITCH = "switch"  # a PCIe switch; its upstream and downstream ports are one node
    SLOT = "slot"  # a physical slot, bay or socket a device plugs into
    GPU = "gpu"
    NVME = "nvme"
    NIC = "nic"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


class LinkKind(str, Enum):
    """What carries a link's traffic."""

    PCIE = "pcie"
    INTER_SOCKET = "inter-socket"  # UPI / QPI / xGMI / X-Bus
    NVLINK = "nvlink"
    MEMORY = "memory"  # socket ↔ its DRAM

    def __str__(self) -> str:
        return self.value


#: kinds whose nodes are devices that sit in slots
DEVICE_KINDS = frozenset({NodeKind.GPU, NodeKind.NVME, NodeKind.NIC, NodeKind.OTHER})


@dataclass(frozen=True)
class Node:
    """One hardware component.

    ``id`` is unique in a topology and stable across sources of the same
    machine: ``pci:DDDD:BB:DD.F`` for PCI devices (function 0's address),
    ``switch:DDDD:BB:DD.F`` for a switch (its upstream port), ``socketN``,
    ``memN``, ``slot:...`` for slots. ``attrs`` holds what a source knew
    beyond the common fields (slot width and form factor, device model,
    link status at capture time, ...), JSON-serialisable values only.
    """

    id: str
    kind: NodeKind
    name: str = ""
    bus_address: str | None = None
    numa_node: int | None = None
    vendor_id: str | None = None
    device_id: str | None = None
    attrs: Mapping[str, JsonValue] = field(default_factory=dict)

    def with_attrs(self, **extra: JsonValue) -> Node:
        """A copy with ``extra`` merged into ``attrs``."""
        return replace(self, attrs={**self.attrs, **extra})

    @property
    def label(self) -> str:
        return self.name or self.id


@dataclass(frozen=True)
class Link:
    """A physical link, with the capacity of each direction in bytes/s.

    ``bytes_per_s`` is ``None`` when no source said how fast the link is
    (``lspci -t`` alone, say); consumers must treat that as unknown, not as
    zero or infinite. ``bandwidth_source`` tells where the figure came from:
    ``"pcie"`` (generation × width table), ``"spec"`` (a machine spec),
    ``"measured"`` (a profile), ``"default"`` (a typical figure for the link
    kind, inferred) or ``"unknown"``.
    """

    src: str
    dst: str
    kind: LinkKind
    bytes_per_s: float | None
    pcie_gen: int | None = None
    lanes: int | None = None
    bandwidth_source: str = "unknown"
    attrs: Mapping[str, JsonValue] = field(default_factory=dict)

    @classmethod
    def pcie(
        cls,
        src: str,
        dst: str,
        gen: int | None,
        lanes: int | None,
        efficiency: float = DEFAULT_EFFICIENCY,
        **attrs: JsonValue,
    ) -> Link:
        """A PCIe link whose capacity follows from ``gen`` and ``lanes``."""
        if gen and lanes:
            bw: float | None = pcie_bytes_per_s(gen, lanes, efficiency)
            source = "pcie"
        else:
            bw, source = None, "unknown"
        return cls(src, dst, LinkKind.PCIE, bw, gen, lanes, source, dict(attrs))

    @property
    def key(self) -> tuple[str, str]:
        return (self.src, self.dst)


class Topology:
    """A machine's device graph.

    Nodes are :class:`Node` objects stored under ``graph.nodes[id]["node"]``;
    each :class:`Link` gives two directed edges carrying ``bytes_per_s``,
    ``kind`` and ``link`` (the :class:`Link`). ``sources`` lists what the
    topology was built from; ``notes`` collects warnings a reader should see
    (inferred figures, parts no source could place).
    """

    def __init__(self, name: str = "", sources: Iterable[str] = ()) -> None:
        self.name = name
        self.sources: list[str] = list(sources)
        self.notes: list[str] = []
        self.graph = nx.DiGraph()
        self._links: dict[tuple[str, str], Link] = {}

    # -- building -------------------------------------------------------
    def add_node(self, node: Node) -> Node:
        if node.id in self.graph:
            raise TopologyError(f"node {node.id!r} is already in topology {self.name!r}")
        self.graph.add_node(node.id, node=node)
        return node

    def replace_node(self, node: Node) -> Node:
        """Replace the node with the same id (a merge refining what is known)."""
        if node.id not in self.graph:
            raise TopologyError(f"no node {node.id!r} to replace in topology {self.name!r}")
        self.graph.nodes[node.id]["node"] = node
        return node

    def remove_node(self, node_id: str) -> None:
        """Remove a node and every link touching it."""
        self._require(node_id)
        for key in [k for k in self._links if node_id in k]:
            del self._links[key]
        self.graph.remove_node(node_id)

    def add_link(self, link: Link) -> Link:
        self._require(link.src)
        self._require(link.dst)
        if link.src == link.dst:
            raise TopologyError(f"a link cannot join {link.src!r} to itself")
        if link.key in self._links or (link.dst, link.src) in self._links:
            raise TopologyError(f"{link.src!r} and {link.dst!r} are already linked")
        if link.bytes_per_s is not None and link.bytes_per_s <= 0:
            raise TopologyError(f"link {link.src}→{link.dst} has capacity {link.bytes_per_s} ≤ 0")
        self._links[link.key] = link
        for a, b in ((link.src, link.dst), (link.dst, link.src)):
            self.graph.add_edge(a, b, bytes_per_s=link.bytes_per_s, kind=link.kind, link=link)
        return link

    def replace_link(self, link: Link) -> Link:
        """Replace the link between the same two nodes (either orientation)."""
        old = self.link_between(link.src, link.dst)
        if old is None:
            raise TopologyError(f"no link between {link.src!r} and {link.dst!r} to replace")
        del self._links[old.key]
        self.graph.remove_edge(old.src, old.dst)
        self.graph.remove_edge(old.dst, old.src)
        return self.add_link(link)

    # -- reading --------------------------------------------------------
    def __contains__(self, node_id: object) -> bool:
        return node_id in self.graph

    def __len__(self) -> int:
        return self.graph.number_of_nodes()

    def node(self, node_id: str) -> Node:
        self._require(node_id)
        return self.graph.nodes[node_id]["node"]

    def nodes(self, kind: NodeKind | str | None = None) -> list[Node]:
        """Nodes in insertion order, optionally of one kind."""
        want = NodeKind(kind) if kind is not None else None
        return [
            data["node"]
            for _, data in self.graph.nodes(data=True)
            if want is None or data["node"].kind == want
        ]

    def links(self, kind: LinkKind | str | None = None) -> list[Link]:
        want = LinkKind(kind) if kind is not None else None
        return [lk for lk in self._links.values() if want is None or lk.kind == want]

    def link_between(self, a: str, b: str) -> Link | None:
        return self._links.get((a, b)) or self._links.get((b, a))

    def parent(self, node_id: str) -> Node | None:
        """The upstream neighbour over a PCIe or memory link (towards the CPU)."""
        self._require(node_id)
        for pred in self.graph.predecessors(node_id):
            lk = self._links.get((pred, node_id))
            if lk is not None and lk.kind in (LinkKind.PCIE, LinkKind.MEMORY):
                return self.node(pred)
        return None

    def children(self, node_id: str) -> list[Node]:
        """Downstream neighbours over PCIe or memory links, in insertion order."""
        self._require(node_id)
        return [
            self.node(lk.dst)
            for lk in self._links.values()
            if lk.src == node_id and lk.kind in (LinkKind.PCIE, LinkKind.MEMORY)
        ]

    def ancestors(self, node_id: str) -> Iterator[Node]:
        """Upstream nodes from the parent to the root."""
        seen = {node_id}
        cur = self.parent(node_id)
        while cur is not None and cur.id not in seen:
            yield cur
            seen.add(cur.id)
            cur = self.parent(cur.id)

    def socket_of(self, node_id: str) -> Node | None:
        """The socket a node hangs under (itself for a socket)."""
        node = self.node(node_id)
        if node.kind == NodeKind.SOCKET:
            return node
        for anc in self.ancestors(node_id):
            if anc.kind == NodeKind.SOCKET:
                return anc
        return None

    def roots(self) -> list[Node]:
        """Tree roots: sockets, and anything no source could place.

        Memory nodes and fabric nodes reached only by NVLink (an NVSwitch, a
        CPU's NVLink port) are not roots: they hang off the tree sideways.
        """
        out = []
        for n in self.nodes():
            if n.kind == NodeKind.MEMORY or self.parent(n.id) is not None:
                continue
            kinds = {lk.kind for lk in self._links.values() if n.id in lk.key}
            if n.kind != NodeKind.SOCKET and kinds and kinds <= {LinkKind.NVLINK}:
                continue
            out.append(n)
        return out

    def counts(self) -> dict[str, int]:
        """Number of nodes of every kind (all kinds present, zero included)."""
        out = {k.value: 0 for k in NodeKind}
        for n in self.nodes():
            out[n.kind.value] += 1
        return out

    def find(self, bus_address: str) -> Node | None:
        """The node whose ``bus_address`` (or one of its functions) is ``bus_address``."""
        addr = bus_address.lower()
        for n in self.nodes():
            if n.bus_address == addr or addr in n.attrs.get("functions", ()):
                return n
        return None

    def _require(self, node_id: str) -> None:
        if node_id not in self.graph:
            raise TopologyError(f"no node {node_id!r} in topology {self.name!r}")

    def copy(self) -> Topology:
        other = Topology(self.name, self.sources)
        other.notes = list(self.notes)
        for n in self.nodes():
            other.add_node(n)
        for lk in self.links():
            other.add_link(lk)
        return other

    def __repr__(self) -> str:
        c = {k: v for k, v in self.counts().items() if v}
        return f"Topology({self.name!r}, {c})"
