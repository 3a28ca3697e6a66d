"""Joining dmidecode's slots to a PCI tree: which slot holds what, and the empty ones.

See :func:`apply_dmi_slots`; the slots come from
:func:`planner.topology.dmi.parse.parse_dmidecode`.
"""

from __future__ import annotations

from collections.abc import Iterable

from momentbase.jsontypes import JsonObject, JsonValue
from planner.errors import TopologyError
from planner.topology.dmi.records import DmiInfo, DmiSlot
from planner.topology.model import DEVICE_KINDS, Link, Node, NodeKind, Topology
from planner.topology.pcitree import PciFunction, is_sxm_module, normalize_address, split_address

__all__ = ["apply_dmi_slots"]


# ---------------------------------------------------------------------------
# joining slots to a PCI tree
# ---------------------------------------------------------------------------


def _slot_attrs(s: DmiSlot) -> JsonObject:
    return {
        "designation": s.designation,
        "width_lanes": s.width_lanes,
        "pcie_gen": s.pcie_gen,
        "form_factor": s.form_factor,
        "length": s.length,
        "in_use": s.in_use,
        "bus_address": s.bus_address,
        "slot_type": s.slot_type,
        "current_usage": s.current_usage,
        "physical_width_lanes": s.physical_width_lanes,
        "slot_id": s.slot_id,
        "dmi_handle": s.handle,
    }


def _slot_label(s: DmiSlot) -> str:
    return s.designation or (f"DMI slot {s.handle}" if s.handle else "DMI slot")


def _devices_by_address(topo: Topology) -> dict[str, Node]:
    """Every function address of a non-slot node (devices and switch upstream ports)."""
    out: dict[str, Node] = {}
    for n in topo.nodes():
        if n.kind in (NodeKind.SLOT, NodeKind.SOCKET, NodeKind.MEMORY):
            continue
        for a in (n.bus_address, *n.attrs.get("functions", ())):
            if isinstance(a, str):
                out.setdefault(a.lower(), n)
    return out


def _bus_of(addr: str) -> tuple[str, int]:
    domain, bus, _, _ = split_address(addr)
    return domain, bus


def apply_dmi_slots(
    topo: Topology,
    dmi: DmiInfo,
    *,
    functions: Iterable[PciFunction] = (),
) -> Topology:
    """A copy of ``topo`` with the DMI slots joined to its PCI tree by bus address.

    ``topo`` is not changed. A DMI slot's bus address is that of the device
    in the slot (or where it would be). For each slot, in order:

    - **a device (or switch) node has that address**: if its parent is a
      slot node (from ``lspci`` SltCap), that slot node is enriched;
      otherwise a new slot node is inserted between the device and its
      parent — the link above the slot keeps the parent link's generation
      with the slot's width, the link below is the original link;
    - **no device there** (an empty slot): the bridge whose secondary bus is
      the address's bus is looked up — in slot nodes'
      ``attrs["secondary_bus"]`` or in ``functions`` (the
      :class:`PciFunction` records the tree was built from) — and its slot
      node enriched; a BIOS that gives the port's own address is matched to
      that port's slot node. Without such a slot node the slot is added
      under the switch or socket that owns the bus, when something says
      which; otherwise it is left out and a note says "unplaced slot";
    - **no bus address**: a slot node without a parent,
      ``attrs["placement"] = "unknown"``, and a note — nothing says which
      socket it belongs to.

    Every slot node joined carries the attrs ``designation``,
    ``width_lanes``, ``pcie_gen``, ``form_factor``, ``length``, ``in_use``,
    ``bus_address`` and ``source`` (``"dmidecode"``, or
    ``"lspci+dmidecode"`` for an enriched SltCap slot), plus ``slot_type``,
    ``current_usage``, ``physical_width_lanes``, ``slot_id`` and
    ``dmi_handle``. Device nodes named by a type 41 record get
    ``attrs["onboard"] = True`` and ``attrs["onboard_designations"]``.

    >>> from planner.topology.pcitree import build_pci_topology
    >>> topo = build_pci_topology([
    ...     PciFunction("0000:00:01.0", class_code="0604", is_bridge=True, secondary_bus=1,
    ...                 subordinate_bus=1, numa_node=0, port_type="root", link_cap=(4, 16)),
    ...     PciFunction("0000:01:00.0", class_code="0302", vendor_id="10de", link_cap=(4, 16)),
    ... ])
    >>> dmi = DmiInfo(slots=(DmiSlot("SLOT1", "PCI Express 4", 16, 4, "cem",
    ...                              in_use=True, bus_address="0000:01:00.0"),))
    >>> merged = apply_dmi_slots(topo, dmi)
    >>> slot = merged.parent("pci:0000:01:00.0")
    >>> slot.kind.value, slot.attrs["designation"], merged.parent(slot.id).id
    ('slot', 'SLOT1', 'socket0')
    >>> topo.parent("pci:0000:01:00.0").id   # the input is unchanged
    'socket0'
    """
    j = _Join(topo.copy(), functions)
    for s in dmi.slots:
        j.add(s)
    return j.finish(dmi)


class _Join:
    """The state of one :func:`apply_dmi_slots` call."""

    def __init__(self, topo: Topology, functions: Iterable[PciFunction]) -> None:
        self.topo = topo
        self.fns: dict[str, PciFunction] = {}
        for f in functions:
            try:
                self.fns[normalize_address(f.address)] = f
            except TopologyError:
                continue  # the tree builder refuses such an address too
        self.devices = _devices_by_address(topo)
        self.parent: dict[str, str | None] = {}  # device id -> parent id, as re-linked
        self.drop: set[tuple[str, str]] = set()  # links replaced by parent→slot→device
        self.claimed: dict[str, DmiSlot] = {}  # slot node id -> DMI slot joined to it
        self.port_of_bus = self._secondary_buses()
        self.unknown: list[str] = []
        self.unplaced: list[str] = []

    # -- lookups ---------------------------------------------------------
    def _secondary_buses(self) -> dict[tuple[str, int], str]:
        """(domain, secondary bus) -> address of the bridge that leads to that bus."""
        out: dict[tuple[str, int], str] = {}
        for n in self.topo.nodes(NodeKind.SLOT):
            port, sec = n.attrs.get("port"), n.attrs.get("secondary_bus")
            if isinstance(port, str) and isinstance(sec, int):
                out.setdefault((port.split(":")[0], sec), port)
        for n in [*self.topo.nodes(NodeKind.SOCKET), *self.topo.nodes(NodeKind.SWITCH)]:
            for port, sec in n.attrs.get("port_buses", {}).items():
                out.setdefault((port.split(":")[0], int(sec)), port)
        for addr, f in self.fns.items():
            if f.is_bridge and f.secondary_bus is not None:
                out.setdefault((addr.split(":")[0], f.secondary_bus), addr)
        return out

    def _parent_of(self, node_id: str) -> str | None:
        if node_id in self.parent:
            return self.parent[node_id]
        p = self.topo.parent(node_id)
        return p.id if p is not None else None

    def _slot_of_port(self, port: str) -> str | None:
        for n in self.topo.nodes(NodeKind.SLOT):
            if n.attrs.get("port") == port:
                return n.id
        return None

    def _owner_of_bus(self, domain: str, bus: int) -> str | None:
        """The switch or socket a bus hangs under, when something says which."""
        port = self.port_of_bus.get((domain, bus))
        if port is None:
            # Devices on one bus share the bridge above them, hence its attachment.
            return self._attachment_of_bus(domain, bus)
        for sw in self.topo.nodes(NodeKind.SWITCH):
            if port in sw.attrs.get("ports", ()):
                return sw.id  # a switch downstream port
        for sock in self.topo.nodes(NodeKind.SOCKET):
            if port in sock.attrs.get("port_buses", {}):
                return sock.id  # a root port the tree builder recorded
        # A root port: the socket of whatever else sits on the root bus, else its NUMA node's.
        owner = self._attachment_of_bus(*_bus_of(port))
        if owner is not None:
            return owner
        f = self.fns.get(port)
        if f is not None and f.numa_node is not None and f.numa_node >= 0:
            for sock in self.topo.nodes(NodeKind.SOCKET):
                if f.numa_node in sock.attrs.get("numa_nodes", ()) or sock.numa_node == f.numa_node:
                    return sock.id
        return None

    def _attachment_of_bus(self, domain: str, bus: int) -> str | None:
        for addr, n in self.devices.items():
            if _bus_of(addr) != (domain, bus):
                continue
            p = self._parent_of(n.id)
            if p is not None and self.topo.node(p).kind in (NodeKind.SOCKET, NodeKind.SWITCH):
                return p
        return None

    def _conflict(self, s: DmiSlot, node_id: str) -> None:
        self.topo.notes.append(
            f"DMI slots '{_slot_label(self.claimed[node_id])}' and '{_slot_label(s)}' "
            f"({s.bus_address}) both name slot node {node_id}; kept the first")

    # -- the join --------------------------------------------------------
    def add(self, s: DmiSlot) -> None:
        if s.bus_address is None:
            node_id = self._new_slot(s, placement="unknown")
            self.unknown.append(_slot_label(s))
            return
        dev = self.devices.get(s.bus_address)
        if dev is not None:
            self._device_slot(s, dev)
            return
        # Some BIOSes give the port's own address rather than the device's.
        target = self._slot_of_port(s.bus_address)
        if target is None:
            port = self.port_of_bus.get(_bus_of(s.bus_address))
            target = self._slot_of_port(port) if port is not None else None
        if target is not None:
            if target in self.claimed:
                self._conflict(s, target)
            else:
                self._enrich(target, s)
            return
        owner = self._owner_of_bus(*_bus_of(s.bus_address))
        if owner is None:
            self.unplaced.append(f"'{_slot_label(s)}' ({s.bus_address})")
            return
        node_id = self._new_slot(s)
        port = self.port_of_bus.get(_bus_of(s.bus_address))
        pf = self.fns.get(port) if port else None
        gen = pf.link_cap[0] if pf is not None and pf.link_cap else s.pcie_gen
        self.topo.add_link(Link.pcie(owner, node_id, gen, s.width_lanes))

    def _device_slot(self, s: DmiSlot, dev: Node) -> None:
        parent = self._parent_of(dev.id)
        if parent is not None and self.topo.node(parent).kind == NodeKind.SLOT:
            if parent in self.claimed:
                self._conflict(s, parent)
            else:
                self._enrich(parent, s)
            return
        node_id = self._new_slot(s, in_use=True)
        self.parent[dev.id] = node_id
        if parent is None:
            self.topo.replace_node(self.topo.node(node_id).with_attrs(placement="unknown"))
            self.topo.add_link(Link.pcie(node_id, dev.id, s.pcie_gen, s.width_lanes))
            self.topo.notes.append(
                f"DMI slot '{_slot_label(s)}' holds {dev.id}, which no source placed in the tree")
            return
        old = self.topo.link_between(parent, dev.id)
        if old is None:  # cannot happen: the parent is found through this link
            raise TopologyError(f"no link between {parent!r} and {dev.id!r}")
        self.drop.add(old.key)
        self.topo.add_link(Link.pcie(parent, node_id, old.pcie_gen, s.width_lanes or old.lanes))
        self.topo.add_link(Link(node_id, dev.id, old.kind, old.bytes_per_s, old.pcie_gen,
                                old.lanes, old.bandwidth_source, dict(old.attrs)))

    def _new_slot(self, s: DmiSlot, **extra: JsonValue) -> str:
        base = f"slot:dmi:{s.handle}" if s.handle else f"slot:dmi:{s.designation or 'slot'}"
        node_id, k = base, 2
        while node_id in self.topo:
            node_id, k = f"{base}#{k}", k + 1
        self.topo.add_node(Node(node_id, NodeKind.SLOT, f"slot {_slot_label(s)}",
                                attrs={**_slot_attrs(s), "source": "dmidecode", **extra}))
        self.claimed[node_id] = s
        return node_id

    def _enrich(self, node_id: str, s: DmiSlot) -> None:
        """Merge a DMI slot into an existing slot node (one from lspci SltCap)."""
        node = self.topo.node(node_id)
        old = dict(node.attrs)
        attrs = {**old, **_slot_attrs(s)}
        for key in ("width_lanes", "pcie_gen"):
            if attrs[key] is None:
                attrs[key] = old.get(key)
            elif old.get(key) is not None and old[key] != attrs[key]:
                attrs[f"port_{key}"] = old[key]  # what the port's link capability said
        occupied = any(self._parent_of(c.id) == node_id for c in self.topo.children(node_id))
        if occupied:
            attrs["in_use"] = True  # lspci saw the device: that beats the BIOS's word
        elif s.in_use is None:
            attrs["in_use"] = old.get("in_use")
        if old.get("designation") not in (None, "", s.designation):
            attrs["pci_slot"] = old["designation"]  # the SltCap physical slot number
        source = old.get("source")
        attrs["source"] = "lspci+dmidecode" if source and source != "dmidecode" else "dmidecode"
        self.topo.replace_node(Node(node.id, node.kind, f"slot {_slot_label(s)}", node.bus_address,
                                    node.numa_node, node.vendor_id, node.device_id, attrs))
        self.claimed[node_id] = s

    def finish(self, dmi: DmiInfo) -> Topology:
        topo = self.topo
        if self.drop:
            topo = _without_links(topo, self.drop)
        if self.unknown:
            topo.notes.append(
                f"{len(self.unknown)} DMI slot(s) have no bus address, so nothing says which socket "
                "they belong to (placement unknown): " + ", ".join(self.unknown))
        for u in self.unplaced:
            topo.notes.append(f"unplaced slot {u}: no device, bridge or slot of the PCI tree is on its bus")
        topo.notes.extend(dmi.warnings)
        _mark_onboard(topo, dmi)
        _mark_sxm_positions(topo)
        _drop_board_switch_slots(topo)
        return topo


def _without_links(topo: Topology, drop: set[tuple[str, str]]) -> Topology:
    """A copy of ``topo`` without the links whose (src, dst) is in ``drop``."""
    out = Topology(topo.name, topo.sources)
    out.notes = list(topo.notes)
    for n in topo.nodes():
        out.add_node(n)
    for lk in topo.links():
        if lk.key not in drop:
            out.add_link(lk)
    return out


def _below(topo: Topology, node_id: str) -> list[Node]:
    """Every node under ``node_id`` in the tree."""
    out, stack = [], [node_id]
    while stack:
        kids = topo.children(stack.pop())
        out += kids
        stack += [k.id for k in kids]
    return out


def _drop_board_switch_slots(topo: Topology) -> None:
    """Take out of ``topo`` the slot capabilities of ports that lead to a switch on the board.

    A root port may announce a slot (``SltCap``) although what it holds is a switch on the
    board: Supermicro's SYS-4028GR-TR2 has two PLX switches behind root ports 00:02.0 and
    00:03.0, each announcing a slot, while DMI names the GPU slots on the switches' ports.
    When DMI names a slot below the switch, the switch is the board's and the port's slot
    is no slot a card goes in: it is left out (the switch then hangs from the port's owner by
    the link the two had), and a note names it. A slot only ``lspci`` knows of, holding a
    switch with no DMI slot below it (a switch card), stays a slot.
    """
    gone = [s for s in topo.nodes(NodeKind.SLOT)
            if "dmi_handle" not in s.attrs and topo.parent(s.id) is not None
            and any(c.kind == NodeKind.SWITCH and any(n.kind == NodeKind.SLOT and "dmi_handle" in n.attrs
                                                      for n in _below(topo, c.id))
                    for c in topo.children(s.id))]
    for s in gone:
        parent = topo.parent(s.id)
        assert parent is not None  # the slots left out are in the tree
        moved = [lk for lk in topo.links() if lk.src == s.id]  # the slot's link to the switch
        topo.remove_node(s.id)
        for lk in moved:  # now starts at the slot's parent (the port's owner)
            topo.add_link(Link(parent.id, lk.dst, lk.kind, lk.bytes_per_s, lk.pcie_gen, lk.lanes,
                               lk.bandwidth_source, dict(lk.attrs)))
    if gone:
        topo.notes.append(f"{len(gone)} port(s) announce a slot that holds a switch whose ports DMI names "
                          "as slots: the switch is on the board, not in a slot, and the port's slot is "
                          "left out: " + ", ".join(f"{s.attrs.get('port')} (slot {s.attrs.get('designation')})"
                                                   for s in gone))


def _mark_sxm_positions(topo: Topology) -> None:
    """Make a DMI card slot that holds an SXM module an ``sxm`` position, naming them in one note.

    Firmware may describe an SXM socket's PCIe link as a card slot (Dell's C4140 calls
    its four P100 SXM2 positions "x16 PCI Express 3", length Short, which reads as
    ``cem``); the module is not a card, so the position's form factor is the device's.
    DMI's stays in ``attrs["dmi_form_factor"]``. (A position DMI gives length Other is
    read as a socket already: :func:`planner.inventory.slot_form_factor`.)
    """
    named = []
    for slot in list(topo.nodes(NodeKind.SLOT)):
        if slot.attrs.get("form_factor") != "cem" or "dmi_handle" not in slot.attrs:
            continue
        if any(c.kind == NodeKind.GPU and is_sxm_module(c.name) for c in topo.children(slot.id)):
            topo.replace_node(slot.with_attrs(form_factor="sxm",
                                              dmi_form_factor=slot.attrs.get("form_factor")))
            named.append(str(slot.attrs.get("designation") or slot.id))
    if named:
        topo.notes.append(f"{len(named)} DMI slot(s) hold an SXM module (a GPU on a board socket, not "
                          "a card): their form factor is the module's, sxm: " + ", ".join(named))


def _mark_onboard(topo: Topology, dmi: DmiInfo) -> None:
    devices = _devices_by_address(topo)
    for ob in dmi.onboard:
        n = devices.get(ob.bus_address) if ob.bus_address else None
        if n is None or n.kind not in DEVICE_KINDS:
            continue
        cur = topo.node(n.id)
        names = [*cur.attrs.get("onboard_designations", ()), ob.reference_designation]
        topo.replace_node(cur.with_attrs(onboard=True, onboard_designations=names))
