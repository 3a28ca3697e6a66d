"""Build a device graph from a list of PCI functions.

Every source that sees the PCI hierarchy function by function (sysfs,
``lspci -tv``, ``lspci -vvv``, hwloc XML, NCCL XML) turns its input into
:class:`PciFunction` records and calls :func:`build_pci_topology`, so the
rules for what is a switch, a slot or a socket live in one place:

- A bridge on a root bus (no bridge above it) is a **root port**: it belongs
  to its socket's root complex and is not a node of its own.
- A bridge whose port type is "Upstream Port" — or, when the type is not
  known, a non-downstream bridge with bridges below it — is a **switch**;
  the bridges directly below it are its downstream ports. Upstream and
  downstream ports collapse into one switch node.
- Other bridges (PCIe-to-PCI bridges, bridges inside a device) are
  transparent: what is below them attaches to the nearest switch or socket.
- A port that implements a slot (``SltCap``) or names a physical slot gets a
  **slot** node between it and its device; an empty slot is a slot node
  without children.
- Functions of one device (``bb:dd.*``) are one node; a GPU's audio
  function does not make a second device.
- Sockets come from NUMA nodes (one socket per NUMA node unless the caller
  maps them); a root bus whose NUMA node no source gave hangs under a
  socket named ``socket?`` and a note says so. Nothing is inferred from bus
  numbers.

>>> fns = [
...     PciFunction("0000:00:01.0", class_code="0604", is_bridge=True, secondary_bus=1,
...                 subordinate_bus=3, numa_node=0, link_cap=(4, 16)),
...     PciFunction("0000:01:00.0", class_code="0604", is_bridge=True, port_type="upstream",
...                 secondary_bus=2, subordinate_bus=3, link_cap=(4, 16)),
...     PciFunction("0000:02:00.0", class_code="0604", is_bridge=True, port_type="downstream",
...                 secondary_bus=3, subordinate_bus=3, link_cap=(4, 16)),
...     PciFunction("0000:03:00.0", class_code="0302", vendor_id="10de", name="A100",
...                 link_cap=(4, 16)),
... ]
>>> topo = build_pci_topology(fns, name="toy")
>>> [(n.kind.value, n.id) for n in topo.nodes() if n.kind.value in ("switch", "gpu")]
[('switch', 'switch:0000:01:00.0'), ('gpu', 'pci:0000:03:00.0')]
>>> topo.parent("pci:0000:03:00.0").id
'switch:0000:01:00.0'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from momentbase.jsontypes import JsonObject, JsonValue
from planner.errors import TopologyError
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import DEFAULT_EFFICIENCY

_ADDR = re.compile(r"^(?:([0-9a-f]{4,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")

#: typical per-direction bandwidths used when no source gives a figure; each
#: use is flagged ``bandwidth_source="default"`` and noted in the topology.
DEFAULT_INTER_SOCKET_BYTES_PER_S = 41.6e9  # 2 UPI links × 10.4 GT/s × 2 B
DEFAULT_MEMORY_BYTES_PER_S = 100e9  # 8 DDR4-3200 channels × 25.6 GB/s × ~0.5 sustained


def normalize_address(addr: str) -> str:
    """``DDDD:BB:DD.F`` in lower case, domain ``0000`` when absent.

    >>> normalize_address("85:02.0")
    '0000:85:02.0'
    >>> normalize_address("0000:E1:00.0")
    '0000:e1:00.0'
    """
    m = _ADDR.match(addr.strip().lower())
    if not m:
        raise TopologyError(f"{addr!r} is not a PCI address like 0000:85:02.0")
    domain = (m.group(1) or "0000").rjust(4, "0")
    return f"{domain}:{m.group(2)}:{m.group(3)}.{m.group(4)}"


#: what joins a bus id to the number of its repeat: ``0000:04:00.0#2`` is the second object a
#: source describes at 0000:04:00.0 (hwloc loads an XML that names one bus id twice)
REPEAT_MARK = "#"


def _normalize_key(addr: str) -> str:
    """:func:`normalize_address`, keeping a repeat's ``#n`` (n ≥ 2) as it is."""
    base, mark, repeat = addr.partition(REPEAT_MARK)
    if mark and not (repeat.isdigit() and int(repeat) >= 2):
        raise TopologyError(f"{addr!r} is not a PCI address like 0000:85:02.0 (or its repeat, #2)")
    return normalize_address(base) + mark + repeat


def split_address(addr: str) -> tuple[str, int, int, int]:
    """(domain, bus, device, function) of a normalised address (a repeat's ``#n`` left aside)."""
    domain, bus, rest = addr.partition(REPEAT_MARK)[0].split(":")
    dev, fn = rest.split(".")
    return domain, int(bus, 16), int(dev, 16), int(fn)


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as a source saw it.

    ``link_cap`` / ``link_sta`` are ``(generation, lanes)`` (capability and
    status at capture time). ``parent`` is the address of the bridge above,
    when the source gives the tree directly; otherwise the builder finds it
    from the bridges' bus ranges. ``port_type`` is one of ``"root"``,
    ``"upstream"``, ``"downstream"``, ``"endpoint"``, ``"legacy-endpoint"``,
    ``"rc-endpoint"``, ``"pci-bridge"`` or ``None`` when unknown.
    ``slot`` is the physical slot number or name the port implements (for a
    bridge) or the device sits in (for an endpoint).
    """

    address: str
    class_code: str | None = None  # 4 hex digits, e.g. "0108"
    vendor_id: str | None = None
    device_id: str | None = None
    name: str = ""
    is_bridge: bool = False
    secondary_bus: int | None = None
    subordinate_bus: int | None = None
    port_type: str | None = None
    link_cap: tuple[int, int] | None = None
    link_sta: tuple[int, int] | None = None
    numa_node: int | None = None
    slot: str | None = None
    parent: str | None = None
    attrs: Mapping[str, JsonValue] = field(default_factory=dict)


_NAME_KINDS = (
    (re.compile(r"non-volatile memory|\bnvme\b|nvm express", re.I), NodeKind.NVME),
    (re.compile(r"ethernet|infiniband|network|connectx|\bnic\b|efa\b", re.I), NodeKind.NIC),
    (re.compile(r"3d controller|\btesla\b|\b[ahv]100\b|geforce|quadro|\brtx\b|\binstinct\b|radeon", re.I),
     NodeKind.GPU),
)

_GPU_VENDORS = {"10de", "1002"}  # NVIDIA, AMD; a BMC's VGA (Matrox, ASPEED) is not a GPU
#: display-only VGA chips of those vendors found on server boards (ATI ES1000/RN50)
_MANAGEMENT_VGA = {("1002", "515e"), ("1002", "5159"), ("1002", "515f")}


def classify(fn: PciFunction) -> NodeKind:
    """The node kind of a non-bridge function, from its class code or, failing that, its name.

    >>> classify(PciFunction("0000:01:00.0", class_code="0108"))
    <NodeKind.NVME: 'nvme'>
    >>> classify(PciFunction("0000:03:00.0", class_code="0300", vendor_id="102b"))
    <NodeKind.OTHER: 'other'>
    """
    cc = (fn.class_code or "").lower()
    if cc:
        if cc == "0108":
            return NodeKind.NVME
        if cc.startswith("02") or cc == "0c06":  # 0c06: InfiniBand on the serial-bus class
            return NodeKind.NIC
        if cc == "0302" or cc.startswith("12"):
            return NodeKind.GPU
        if cc.startswith("03"):
            vendor = (fn.vendor_id or "").lower()
            if (vendor, (fn.device_id or "").lower()) in _MANAGEMENT_VGA:
                return NodeKind.OTHER
            if vendor in _GPU_VENDORS or (not vendor and _name_kind(fn.name) == NodeKind.GPU):
                return NodeKind.GPU
            return NodeKind.OTHER
        return NodeKind.OTHER
    return _name_kind(fn.name)


#: an SXM module's name: NVIDIA writes "SXM2", "SXM4-40GB", "SXM5 80GB" in its devices' names
_SXM_NAME = re.compile(r"(?<![a-z0-9])sxm[1-9]?(?![a-z])", re.I)


def is_sxm_module(name: str | None) -> bool:
    """Whether a device's name says it is an SXM module: a GPU on a board socket, not a PCIe card.

    >>> is_sxm_module("NVIDIA Corporation GP100GL [Tesla P100 SXM2 16GB]"), is_sxm_module("A100-SXM4-40GB")
    (True, True)
    >>> is_sxm_module("NVIDIA Corporation GA100 [A100 PCIe 40GB]")
    False
    """
    return bool(_SXM_NAME.search(name or ""))


def _name_kind(name: str) -> NodeKind:
    for pattern, kind in _NAME_KINDS:
        if pattern.search(name or ""):
            return kind
    return NodeKind.OTHER


#: classes of root-bus functions that are part of the chipset, not devices
#: anyone places: host/ISA bridges, system peripherals, memory controllers,
#: SMBus, signal processing, encryption, and unclassified functions.
_PLATFORM_CLASS_PREFIXES = ("06", "08", "05", "0c05", "11", "10", "ff", "13")

_KIND_RANK = {NodeKind.GPU: 0, NodeKind.NVME: 1, NodeKind.NIC: 2, NodeKind.OTHER: 3}


def _is_platform(fn0: PciFunction, group: list[PciFunction]) -> bool:
    """Whether a root-bus device (its functions ``group``, ``fn0`` first) is chipset, not a device.

    A device of kind "other" whose class is a platform class — or unknown —
    is part of the chipset; anything a user places (GPU, NVMe, NIC) is not,
    nor is a device whose source names it without a class
    (``attrs["class_given"] is False``: NCCL files leave the class to sysfs).
    """
    if min((classify(f) for f in group), key=lambda k: _KIND_RANK[k]) != NodeKind.OTHER:
        return False
    if fn0.attrs.get("class_given") is False:
        return False
    return not fn0.class_code or fn0.class_code.lower().startswith(_PLATFORM_CLASS_PREFIXES)


def _min_link(*links: tuple[int, int] | None) -> tuple[int | None, int | None]:
    known = [lk for lk in links if lk]
    if not known:
        return None, None
    return min(g for g, _ in known), min(w for _, w in known)


def build_pci_topology(
    functions: Iterable[PciFunction],
    *,
    name: str = "",
    source: str = "",
    numa_to_socket: Mapping[int, int] | None = None,
    efficiency: float = DEFAULT_EFFICIENCY,
    keep_root_bus_platform: bool = False,
) -> Topology:
    """Build a :class:`Topology` from PCI functions (see the module doc for the rules).

    ``numa_to_socket`` maps NUMA nodes to socket indices when a source knows
    that several NUMA nodes share a package (AMD NPS2/NPS4); by default each
    NUMA node is its own socket.
    """
    fns: dict[str, PciFunction] = {}
    for fn in functions:
        addr = _normalize_key(fn.address)
        if addr in fns:
            raise TopologyError(f"PCI function {addr} appears twice in {source or 'the input'}")
        fns[addr] = fn if fn.address == addr else _with_address(fn, addr)
    b = _PciBuilder(fns, Topology(name=name, sources=[source] if source else []), efficiency)
    b.roles()
    b.device_groups(keep_root_bus_platform)
    b.sockets(numa_to_socket)
    add_memory_and_interconnect(b.topo)
    for a in b.children.get(None, []):
        b.bridges(a)
    b.devices()
    _name_switches(b.topo)
    return b.topo


class _PciBuilder:
    """One topology in the making from PCI functions: the bus tree, bridge roles, sockets, devices."""

    def __init__(self, fns: dict[str, PciFunction], topo: Topology, efficiency: float) -> None:
        self.fns, self.topo, self.efficiency = fns, topo, efficiency
        self.parent = {a: _find_parent(a, f, fns) for a, f in fns.items()}
        self.children: dict[str | None, list[str]] = {}
        for a in sorted(fns):
            self.children.setdefault(self.parent[a], []).append(a)
        self.role: dict[str, str] = {}  # root | usp | dsp | transparent
        # where the traffic of a bridge's secondary side attaches: a node id and the port's link
        self.attach: dict[str, tuple[str, PciFunction]] = {}

    def roles(self) -> None:
        """Roles of bridges, top-down so that "below a switch" is known first."""
        fns, parent, role, children = self.fns, self.parent, self.role, self.children

        def has_bridge_child(a: str) -> bool:
            return any(fns[c].is_bridge for c in children.get(a, []))

        stack = list(reversed(children.get(None, [])))
        while stack:
            a = stack.pop()
            f = fns[a]
            if f.is_bridge:
                p = parent[a]
                pt = f.port_type
                if pt == "root" or (p is None and pt in (None, "pci-bridge")):
                    role[a] = "root"
                elif pt == "downstream" or (pt is None and p is not None and role.get(p) == "usp"):
                    role[a] = "dsp" if p is not None and role.get(p) == "usp" else "transparent"
                elif pt == "upstream" or (pt is None and has_bridge_child(a)):
                    role[a] = "usp"
                else:
                    role[a] = "transparent"
            stack.extend(reversed(children.get(a, [])))

    def subtree_numa(self, a: str) -> int | None:
        """The NUMA node of a function, or of the first function below it that has one."""
        stack = [a]
        while stack:
            x = stack.pop()
            if self.fns[x].numa_node is not None and self.fns[x].numa_node >= 0:
                return self.fns[x].numa_node
            stack.extend(self.children.get(x, []))
        return None

    def device_groups(self, keep_root_bus_platform: bool) -> None:
        """Node ids for devices: one per (domain, bus, device); and the platform functions left out.

        Chipset and uncore functions on a root bus are left out; so is the socket of
        a root bus that holds nothing else (Intel's uncore buses 7f/ff have no NUMA
        node: they must not become a socket of their own).
        """
        fns = self.fns
        self.dev_groups: dict[str, list[str]] = {}
        for a, f in fns.items():
            if not f.is_bridge:
                self.dev_groups.setdefault(_device_key(a), []).append(a)
        for addrs in self.dev_groups.values():
            addrs.sort()
        self.platform = set() if keep_root_bus_platform else {
            k for k, addrs in self.dev_groups.items()
            if self.parent[addrs[0]] is None and _is_platform(fns[addrs[0]], [fns[x] for x in addrs])}

    def sockets(self, numa_to_socket: Mapping[int, int] | None) -> None:
        """Sockets: the NUMA node of each root-bus function, or of anything below it."""
        fns, children, topo = self.fns, self.children, self.topo
        self.socket_id: dict[str, str] = {}  # root-bus function -> socket node id
        numas_seen: set[int] = set()
        unplaced_platform: set[str] = set()  # root buses of left-out functions with no NUMA node
        for a in children.get(None, []):
            if not fns[a].is_bridge and _device_key(a) in self.platform:
                if self.subtree_numa(a) is None:
                    unplaced_platform.add(a.rsplit(":", 1)[0])
                continue
            numa = self.subtree_numa(a)
            if numa is None:
                # Functions of one root bus share a root complex: borrow a sibling's NUMA node.
                dom_bus = a.rsplit(":", 1)[0]
                numa = next(
                    (self.subtree_numa(b) for b in children.get(None, [])
                     if b.rsplit(":", 1)[0] == dom_bus and self.subtree_numa(b) is not None),
                    None,
                )
            if numa is None:
                self.socket_id[a] = "socket?"
            else:
                numas_seen.add(numa)
                sock = numa_to_socket.get(numa, numa) if numa_to_socket else numa
                self.socket_id[a] = f"socket{sock}"
        self.socket_ids = sorted(set(self.socket_id.values()), key=lambda s: (s == "socket?", s)) \
            or ["socket?"]
        buses = sorted(unplaced_platform - {a.rsplit(":", 1)[0] for a in self.socket_id})
        if buses:
            topo.notes.append(
                f"root bus(es) {', '.join(buses)} hold only chipset/uncore functions and no NUMA node; "
                "left out (they are not a socket)")
        for s in self.socket_ids:
            if s == "socket?":
                topo.add_node(Node(s, NodeKind.SOCKET, "socket (unknown: no NUMA node given)",
                                   attrs={"inferred": True}))
                topo.notes.append("some root buses have no NUMA node in the input; they hang under 'socket?'")
            else:
                idx = int(s[len("socket"):])
                numa_nodes = sorted(n for n in numas_seen
                                    if (numa_to_socket.get(n, n) if numa_to_socket else n) == idx)
                topo.add_node(Node(s, NodeKind.SOCKET, f"socket {idx}",
                                   numa_node=numa_nodes[0] if len(numa_nodes) == 1 else None,
                                   attrs={"numa_nodes": numa_nodes}))

    def upstream_of(self, a: str) -> tuple[str, PciFunction | None] | None:
        """(node id, port function) that a function below ``parent[a]`` attaches to."""
        p = self.parent[a]
        if p is None:
            return self.socket_id.get(a, self.socket_ids[0]), None
        return self.attach.get(p)

    def add_slot(self, port_addr: str, port: PciFunction, up_id: str) -> str:
        slot_id = f"slot:{port_addr}"
        designation = port.slot or port_addr
        self.topo.add_node(Node(
            slot_id, NodeKind.SLOT, f"slot {designation}", bus_address=None,
            numa_node=port.numa_node,
            attrs={"designation": str(designation), "port": port_addr,
                   **({"secondary_bus": port.secondary_bus} if port.secondary_bus is not None else {}),
                   "width_lanes": port.link_cap[1] if port.link_cap else None,
                   "pcie_gen": port.link_cap[0] if port.link_cap else None,
                   "in_use": False, "source": str(port.attrs.get("slot_source", "pcie-sltcap"))},
        ))
        g, w = _min_link(port.link_cap)
        self.topo.add_link(Link.pcie(up_id, slot_id, g, w, self.efficiency))
        return slot_id

    def note_port(self, owner_id: str, addr: str, port: PciFunction) -> None:
        """Record a port's secondary bus on the socket or switch it belongs to.

        Later joins (dmidecode's empty slots) find a bus's owner from it.
        """
        if port.secondary_bus is None:
            return
        owner = self.topo.node(owner_id)
        buses = {**owner.attrs.get("port_buses", {}), addr: port.secondary_bus}
        self.topo.replace_node(owner.with_attrs(port_buses=buses))

    def bridges(self, root: str) -> None:
        """Root ports, switches and their slots, top-down from the root-bus function ``root``."""
        topo, fns = self.topo, self.fns
        stack = [root]
        while stack:
            a = stack.pop()
            f = fns[a]
            r = self.role.get(a)
            up = self.upstream_of(a)
            if f.is_bridge and up is not None:
                up_id, up_port = up
                if r == "root":
                    target = self.socket_id.get(a, self.socket_ids[0])
                    self.note_port(target, a, f)
                    self.attach[a] = (target, f)
                    if f.slot and f.attrs.get("slot_implemented", True):
                        self.attach[a] = (self.add_slot(a, f, target), f)
                elif r == "usp":
                    sw_id = f"switch:{a}"
                    topo.add_node(Node(
                        sw_id, NodeKind.SWITCH, _switch_name(f), bus_address=a,
                        numa_node=f.numa_node, vendor_id=f.vendor_id, device_id=f.device_id,
                        attrs={"ports": [a], **({"model": f.name} if f.name else {})},
                    ))
                    g, w = _min_link(up_port.link_cap if up_port else None, f.link_cap)
                    topo.add_link(Link.pcie(up_id, sw_id, g, w, self.efficiency, **_status(f.link_sta)))
                    self.attach[a] = (sw_id, f)
                    if topo.node(up_id).kind == NodeKind.SLOT:  # a switch (card) is in that slot
                        topo.replace_node(topo.node(up_id).with_attrs(in_use=True))
                elif r == "dsp":
                    sw = topo.node(up_id)
                    topo.replace_node(sw.with_attrs(ports=[*sw.attrs.get("ports", []), a]))
                    self.note_port(up_id, a, f)
                    self.attach[a] = (up_id, f)
                    if f.slot and f.attrs.get("slot_implemented", True):
                        self.attach[a] = (self.add_slot(a, f, up_id), f)
                else:
                    self.attach[a] = up  # transparent: inherit the nearest real attachment
            stack.extend(reversed(self.children.get(a, [])))

    def devices(self) -> None:
        """One node per (domain, bus, device), under what its bus attaches to."""
        topo, fns = self.topo, self.fns
        for key, addrs in self.dev_groups.items():
            if key in self.platform:
                continue
            fn0 = fns[addrs[0]]
            kinds = [classify(fns[x]) for x in addrs]
            kind = min(kinds, key=lambda k: _KIND_RANK[k])
            up = self.upstream_of(addrs[0])
            if up is None:
                continue
            up_id, up_port = up
            main = next(fns[x] for x, k in zip(addrs, kinds, strict=True) if k == kind)
            node_id = f"pci:{addrs[0]}"
            topo.add_node(Node(
                node_id, kind, main.name or fn0.name, bus_address=addrs[0],
                numa_node=main.numa_node if main.numa_node is not None and main.numa_node >= 0 else None,
                vendor_id=main.vendor_id, device_id=main.device_id,
                attrs={"functions": addrs, **({"class_code": main.class_code} if main.class_code else {}),
                       **({"slot": main.slot} if main.slot else {}), **dict(main.attrs)},
            ))
            g, w = _min_link(up_port.link_cap if up_port else None, main.link_cap)
            if up_port is None and main.link_cap is None:
                g = w = None
            if topo.node(up_id).kind == NodeKind.SLOT:
                slot = topo.node(up_id)
                topo.replace_node(slot.with_attrs(in_use=True))
            topo.add_link(Link.pcie(up_id, node_id, g, w, self.efficiency, **_status(main.link_sta)))


def _device_key(a: str) -> str:
    """A device's node key: its function's address without the function number (a repeat apart)."""
    base, mark, repeat = a.partition(REPEAT_MARK)
    return base.rsplit(".", 1)[0] + mark + repeat


def add_memory_and_interconnect(
    topo: Topology,
    memory_bytes_per_s: float | None = None,
    inter_socket_bytes_per_s: float | None = None,
) -> None:
    """Give each socket a memory node and join every pair of sockets.

    Without figures from a source, the defaults above are used and flagged
    ``bandwidth_source="default"`` so that a report can say they are inferred.
    """
    sockets = [s for s in topo.nodes(NodeKind.SOCKET)]
    mem_bw = memory_bytes_per_s or DEFAULT_MEMORY_BYTES_PER_S
    mem_src = "spec" if memory_bytes_per_s else "default"
    for s in sockets:
        mem_id = "mem" + s.id[len("socket"):]
        if mem_id in topo:
            continue
        topo.add_node(Node(mem_id, NodeKind.MEMORY, f"memory of {s.label}", numa_node=s.numa_node))
        topo.add_link(Link(s.id, mem_id, LinkKind.MEMORY, mem_bw, bandwidth_source=mem_src))
    xs_bw = inter_socket_bytes_per_s or DEFAULT_INTER_SOCKET_BYTES_PER_S
    xs_src = "spec" if inter_socket_bytes_per_s else "default"
    real = [s for s in sockets if s.id != "socket?"]
    for i, a in enumerate(real):
        for b in real[i + 1:]:
            if topo.link_between(a.id, b.id) is None:
                topo.add_link(Link(a.id, b.id, LinkKind.INTER_SOCKET, xs_bw, bandwidth_source=xs_src))


def _name_switches(topo: Topology) -> None:
    """Number switches in tree order (``switch 0``, ``switch 1``, ...) keeping the model name."""
    order: list[str] = []
    for s in topo.nodes(NodeKind.SOCKET):
        stack = [s.id]
        while stack:
            x = stack.pop()
            if topo.node(x).kind == NodeKind.SWITCH:
                order.append(x)
            stack.extend(reversed([c.id for c in topo.children(x)]))
    for i, sid in enumerate(order):
        sw = topo.node(sid)
        topo.replace_node(Node(sw.id, sw.kind, f"switch {i}", sw.bus_address, sw.numa_node,
                               sw.vendor_id, sw.device_id, sw.attrs))


def _switch_name(f: PciFunction) -> str:
    return f"switch {f.name}" if f.name else "switch"


def _status(link_sta: tuple[int, int] | None) -> JsonObject:
    if not link_sta:
        return {}
    return {"current_gen": link_sta[0], "current_lanes": link_sta[1]}


def _with_address(fn: PciFunction, addr: str) -> PciFunction:
    from dataclasses import replace

    return replace(fn, address=addr, parent=_normalize_key(fn.parent) if fn.parent else None)


def _find_parent(addr: str, fn: PciFunction, fns: Mapping[str, PciFunction]) -> str | None:
    """The bridge directly above ``addr``: the one whose secondary bus is ``addr``'s bus.

    Falls back to the narrowest bus range that contains the bus, for sources
    that give ranges but not the secondary bus exactly.
    """
    if fn.parent:
        p = _normalize_key(fn.parent)
        if p not in fns:
            raise TopologyError(f"PCI function {addr} names parent {p}, which is not in the input")
        return p
    domain, bus, _, _ = split_address(addr)
    best: tuple[int, str] | None = None
    for b, bf in fns.items():
        if not bf.is_bridge or bf.secondary_bus is None or b == addr:
            continue
        if b.split(":")[0] != domain:
            continue
        if bf.secondary_bus <= split_address(b)[1]:
            # "secondary=00": firmware never numbered this bridge's buses (a
            # disabled port; sysfs reports 0); nothing can be below it.
            continue
        if bf.secondary_bus == bus:
            return b
        lo = bf.secondary_bus
        hi = bf.subordinate_bus if bf.subordinate_bus is not None else lo
        if lo <= bus <= hi and (best is None or hi - lo < best[0]):
            best = (hi - lo, b)
    return best[1] if best else None
