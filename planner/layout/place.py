"""Devices put into their slots: the topology with a layout placed, and the slot map."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from planner.errors import PlannerError
from planner.inventory import DeviceModel, Inventory, device_attrs, with_virtual_slots
from planner.layout.fit import slot_fit
from planner.layout.types import Layout, SlotMapEntry
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import DEFAULT_EFFICIENCY, GT_PER_S, pcie_bytes_per_s

__all__ = ["device_link", "place", "slot_map", "usual_efficiency"]


def _tree_index(topo: Topology) -> dict[str, int]:
    """Position of every node in a depth-first walk from the roots, children in link order."""
    kids: dict[str, list[str]] = {}
    for lk in topo.links():
        if lk.kind in (LinkKind.PCIE, LinkKind.MEMORY):
            p = topo.parent(lk.dst)
            if p is not None and p.id == lk.src:
                kids.setdefault(lk.src, []).append(lk.dst)
    index: dict[str, int] = {}
    stack = [r.id for r in reversed(topo.roots())]
    while stack:
        nid = stack.pop()
        if nid in index:
            continue
        index[nid] = len(index)
        stack.extend(reversed(kids.get(nid, [])))
    for n in topo.nodes():
        index.setdefault(n.id, len(index))
    return index


def _device_ids(work: Topology, layout: Layout,
                kinds: Mapping[str, str]) -> list[tuple[str, str, str, str]]:
    """(device id, "GPU 0"/"SSD 0" label, slot, model) in tree order of the slots."""
    index = _tree_index(work)
    n: Counter[str] = Counter()
    out = []
    for slot, name in sorted(layout.assignment, key=lambda sm: index.get(sm[0], 1 << 30)):
        kind = kinds.get(name, "device")
        prefix, word = {"gpu": ("gpu", "GPU"), "nvme": ("ssd", "SSD")}.get(kind, ("dev", "Device"))
        i = n[prefix]
        n[prefix] += 1
        out.append((f"{prefix}{i}", f"{word} {i}", slot, name))
    return out


def _pcie_efficiency(lk: Link) -> float | None:
    """The protocol efficiency a gen × width link was computed with, if it was."""
    if lk.kind != LinkKind.PCIE or lk.bandwidth_source != "pcie" or not lk.pcie_gen \
            or not lk.lanes or not lk.bytes_per_s or lk.pcie_gen not in GT_PER_S:
        return None
    return lk.bytes_per_s / pcie_bytes_per_s(lk.pcie_gen, lk.lanes, 1.0)


def usual_efficiency(topo: Topology) -> float:
    """The protocol efficiency most of a topology's gen × width links were computed with."""
    seen = Counter(round(e, 6) for x in topo.links() if (e := _pcie_efficiency(x)) is not None)
    return seen.most_common(1)[0][0] if seen else DEFAULT_EFFICIENCY


def device_link(topo: Topology, slot_id: str, model: DeviceModel, dev_id: str,
                 usual_efficiency: float) -> Link:
    """The link slot → device a device of ``model`` gets in ``slot_id`` (see :func:`place`)."""
    slot = topo.node(slot_id)
    up = topo.parent(slot_id)
    up_link = topo.link_between(up.id, slot_id) if up is not None else None
    sgen = slot.attrs.get("pcie_gen") or (up_link.pcie_gen if up_link else None)
    swidth = slot.attrs.get("width_lanes") or (up_link.lanes if up_link else None)
    gen = min(sgen, model.pcie_gen) if sgen else model.pcie_gen
    lanes = min(swidth, model.lanes) if swidth else model.lanes
    eff = (_pcie_efficiency(up_link) if up_link is not None else None) or usual_efficiency
    link = Link.pcie(slot_id, dev_id, gen, lanes, eff)
    if up_link is not None and up_link.bytes_per_s is not None \
            and (not sgen or not swidth or up_link.bytes_per_s < (link.bytes_per_s or 0)):
        # an unknown slot, or a slot whose own figure is lower: the link above it decides
        link = Link(slot_id, dev_id, LinkKind.PCIE, up_link.bytes_per_s, gen, lanes,
                    up_link.bandwidth_source)
    return link


def _check_layout(work: Topology, layout: Layout, inventory: Inventory) -> None:
    """Raise :class:`PlannerError` unless ``layout`` places ``inventory`` into candidate slots."""
    moving = {d for d, _ in inventory.installed}
    for d in moving:
        if d not in work:
            raise PlannerError(f"inventory: installed device {d!r} is not in topology "
                               f"{work.name!r}")
    vacated = {p.id for d in moving if (p := work.parent(d)) is not None}
    models = {m.name: m for m in inventory.models}
    used: set[str] = set()
    got: Counter[str] = Counter()
    for slot_id, name in layout.assignment:
        if slot_id not in work:
            raise PlannerError(f"layout: no slot {slot_id!r} in topology {work.name!r}")
        slot = work.node(slot_id)
        held = [c for c in work.children(slot_id) if c.id not in moving]
        if slot.kind != NodeKind.SLOT or work.parent(slot_id) is None or held \
                or (slot.attrs.get("in_use") is True and slot_id not in vacated):
            raise PlannerError(f"layout: slot {slot_id!r} is not a candidate slot (it is in use "
                               "by a device that stays, or not in the PCIe tree)")
        if slot_id in used:
            raise PlannerError(f"layout: two devices in slot {slot_id!r}")
        used.add(slot_id)
        model = models.get(name)
        if model is None:
            raise PlannerError(f"layout: model {name!r} is not in the inventory ({inventory})")
        fit = slot_fit(slot, model)
        if not fit.ok:
            raise PlannerError(f"layout: {name} does not fit slot {slot_id!r}: {fit.reason}")
        got[name] += 1
    for model, want in inventory.items:
        if got[model.name] != want:
            raise PlannerError(f"layout places {got[model.name]} × {model.name}, the inventory "
                               f"has {want}")


def place(topo: Topology, layout: Layout, inventory: Inventory) -> Topology:
    """A new topology with the inventory's devices in the slots ``layout`` gives.

    The movable devices (``inventory.installed``) leave their slots; a
    device node is added under each slot of the layout — ids ``gpu0``,
    ``gpu1``, … and ``ssd0``, … in tree order (``placed:gpu0`` if the id is
    taken), kind ``gpu``/``nvme``, attrs ``model``, ``title``,
    ``read_bytes_per_s``, ``read_iops``, ``memory_bytes`` (when known),
    ``slot`` — linked slot → device at the lower generation and width of
    slot and model, computed with the topology's protocol efficiency and
    capped by the link above the slot. Those slots are marked in use. Fixed
    devices stay. ``topo`` is not changed.

    >>> from planner.inventory import inventory_from_counts
    >>> from planner.layout import classic_layouts
    >>> from planner.topology.spec.load import load_machine
    >>> topo, inv = load_machine("moment-b"), inventory_from_counts(4, 8)
    >>> placed = place(topo, classic_layouts(topo, inv)["c"], inv)
    >>> placed.counts()["gpu"], placed.counts()["nvme"], placed.parent("gpu0").id
    (4, 8, 'slot:b-sw0-slot0')
    """
    work = with_virtual_slots(topo)
    _check_layout(work, layout, inventory)
    out = work.copy()
    dropped = 0
    for dev, _ in inventory.installed:
        p = out.parent(dev)
        dropped += sum(1 for lk in out.links(LinkKind.NVLINK) if dev in lk.key)
        out.remove_node(dev)
        if p is not None and p.kind == NodeKind.SLOT:
            out.replace_node(p.with_attrs(in_use=False))
    if dropped:
        out.notes.append(f"{dropped} NVLink link(s) of the devices that moved are gone")
    kinds = dict(layout.kinds) or inventory.kinds()
    usual = usual_efficiency(out)
    for dev_id, _, slot_id, name in _device_ids(work, layout, kinds):
        model = inventory.model(name)
        nid = dev_id if dev_id not in out else f"placed:{dev_id}"
        slot = out.node(slot_id)
        link = device_link(out, slot_id, model, nid, usual)
        socket = out.socket_of(slot_id)
        numa = slot.numa_node if slot.numa_node is not None else (
            socket.numa_node if socket is not None else None)
        out.add_node(Node(nid, NodeKind(model.kind), model.title, numa_node=numa,
                          attrs={**device_attrs(model), "slot": slot_id, "placed": True}))
        out.add_link(link)
        out.replace_node(slot.with_attrs(in_use=True))
    label = f" ({layout.label})" if layout.label else ""
    out.notes.append(f"layout{label}: {inventory} placed by the planner")
    return out


def slot_map(topo: Topology, layout: Layout, inventory: Inventory | None = None
             ) -> list[SlotMapEntry]:
    """Where each device goes, as lines a technician can follow, in tree order.

    Devices are numbered as :func:`place` numbers them; each line gives the
    slot's designation, generation and width, the switches above it
    (nearest first) and its socket. The model is named when several models
    of one kind are placed (its title from ``inventory`` when given).

    >>> from planner.inventory import inventory_from_counts
    >>> from planner.layout import classic_layouts
    >>> from planner.topology.spec.load import load_machine
    >>> topo, inv = load_machine("moment-b"), inventory_from_counts(4, 8)
    >>> slot_map(topo, classic_layouts(topo, inv)["c"])[4].text
    'GPU 2 → Slot 0 (switch 1) (PCIe 4.0 x16), under PCIe switch 1, behind PCIe switch 0, on socket 0'
    """
    from planner.inventory import DEVICE_MODELS

    work = with_virtual_slots(topo)
    kinds = dict(layout.kinds) or (inventory.kinds() if inventory is not None else {})
    for name in {m for _, m in layout.assignment} - set(kinds):
        known = DEVICE_MODELS.get(name)
        kinds[name] = known.kind if known is not None else "device"
    out = []
    for dev_id, word, slot_id, name in _device_ids(work, layout, kinds):
        if slot_id not in work:
            raise PlannerError(f"layout: no slot {slot_id!r} in topology {topo.name!r}")
        slot = work.node(slot_id)
        gen, width = slot.attrs.get("pcie_gen"), slot.attrs.get("width_lanes")
        chain: list[str] = []
        socket = None
        for anc in work.ancestors(slot_id):
            if anc.kind == NodeKind.SWITCH:
                chain.append(anc.label)
            elif anc.kind == NodeKind.SOCKET:
                socket = anc.label
        designation = str(slot.attrs.get("designation") or slot.label)
        link = f"PCIe {gen}.0" if gen else "PCIe"
        link += f" x{width}" if width else ""
        if chain:
            where = f"under {chain[0]}" + "".join(f", behind {c}" for c in chain[1:])
            where += f", on {socket}" if socket else ""
        else:
            where = f"on the root complex of {socket}" if socket else "outside any socket"
        if inventory is not None and name in inventory.kinds():
            title = inventory.model(name).title
        else:
            title = DEVICE_MODELS[name].title if name in DEVICE_MODELS else name
        several = len({m for _, m in layout.assignment if kinds.get(m) == kinds.get(name)}) > 1
        head = f"{word} ({title})" if several else word
        out.append(SlotMapEntry(dev_id, word, name, slot_id, designation, gen, width,
                                tuple(chain), socket, f"{head} → {designation} ({link}), {where}"))
    return out
