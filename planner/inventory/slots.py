"""The devices a topology has in its slots, as an inventory; slots where a topology has none."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from planner.errors import PlannerError
from planner.inventory.core import Inventory
from planner.inventory.models import DEVICE_MODELS, DeviceModel, _slug, recognise_model
from planner.topology.model import DEVICE_KINDS, Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import GT_PER_S, VALID_WIDTHS
from planner.topology.pcitree import is_sxm_module

__all__ = ["inventory_from_topology", "slot_form_factor", "with_virtual_slots"]


def _has_slots(topo: Topology) -> bool:
    return any(True for _ in topo.nodes(NodeKind.SLOT))


def _placeable(n: Node) -> bool:
    return n.kind in (NodeKind.GPU, NodeKind.NVME)


def with_virtual_slots(topo: Topology) -> Topology:
    """``topo`` itself if it has slot nodes; otherwise a copy with virtual slots.

    A topology without slot nodes (``nvidia-smi topo -m``, hwloc or NCCL XML
    alone) says where devices are but not where they could go. Each GPU's
    and NVMe SSD's attachment point then becomes a *virtual slot*
    ``slot:virtual:<device id>`` between the device and its parent, as wide
    as the device's link and taking only a device of the same kind
    (``attrs["virtual_kind"]``); the link above it is the device's old link.

    >>> t = Topology("toy")
    >>> for n in (Node("socket0", NodeKind.SOCKET), Node("g", NodeKind.GPU, "GPU")):
    ...     _ = t.add_node(n)
    >>> _ = t.add_link(Link.pcie("socket0", "g", gen=4, lanes=16))
    >>> v = with_virtual_slots(t)
    >>> v.parent("g").id, v.node("slot:virtual:g").attrs["virtual_kind"]
    ('slot:virtual:g', 'gpu')
    """
    if _has_slots(topo):
        return topo
    out = topo.copy()
    added = 0
    for dev in topo.nodes():
        if not _placeable(dev):
            continue
        parent = topo.parent(dev.id)
        if parent is None:
            continue
        old = topo.link_between(parent.id, dev.id)
        assert old is not None  # the parent is found through this link
        sid = f"slot:virtual:{dev.id}"
        out.add_node(Node(sid, NodeKind.SLOT, f"slot (position of {dev.label})",
                          numa_node=dev.numa_node,
                          attrs={"designation": f"position of {dev.label}",
                                 "width_lanes": old.lanes, "pcie_gen": old.pcie_gen,
                                 "form_factor": None, "virtual": True,
                                 "virtual_kind": dev.kind.value, "in_use": True,
                                 "source": "virtual"}))
        out.remove_node(dev.id)
        out.add_node(dev)
        out.add_link(Link(parent.id, sid, old.kind, old.bytes_per_s, old.pcie_gen, old.lanes,
                          old.bandwidth_source, dict(old.attrs)))
        out.add_link(Link(sid, dev.id, old.kind, old.bytes_per_s, old.pcie_gen, old.lanes,
                          old.bandwidth_source, dict(old.attrs)))
        for lk in topo.links():
            if dev.id in lk.key and lk.key != old.key:
                out.add_link(lk)
        added += 1
    if not added:
        return topo
    out.notes.append(f"no slot nodes: the positions of the {added} GPU(s)/NVMe SSD(s) stand "
                     "for slots (a GPU position takes a GPU, an NVMe position an SSD)")
    return out


def slot_form_factor(slot: Node) -> str | None:
    """The form factor of a slot for the fit rules, ``None`` when unknown.

    ``attrs["form_factor"]`` as given, except that a PCI Express slot of
    length ``Other`` that dmidecode classed ``other`` is a GPU socket on a
    board (an SXM socket of an HGX baseboard): ``"sxm"``.

    >>> slot_form_factor(Node("s", NodeKind.SLOT, attrs={"form_factor": "other",
    ...     "length": "Other", "slot_type": "PCI Express 5 x16"}))
    'sxm'
    """
    ff = slot.attrs.get("form_factor")
    if not isinstance(ff, str) or not ff:
        return None
    if ff == "other" and str(slot.attrs.get("length") or "").lower() == "other" \
            and "pci express" in str(slot.attrs.get("slot_type") or "").lower():
        return "sxm"
    return ff


def _derived_model(dev: Node, slot: Node, link: Link | None) -> DeviceModel:
    """A model for a device the planner does not know, from what the topology says of it."""
    kind = dev.kind.value
    base = DEVICE_MODELS[f"generic-{kind}"]
    lanes = (link.lanes if link is not None else None) or slot.attrs.get("width_lanes") \
        or base.lanes
    gen = (link.pcie_gen if link is not None else None) or slot.attrs.get("pcie_gen") \
        or base.pcie_gen
    ff = slot_form_factor(slot)
    if kind == "gpu":
        # an SXM module's form factor is its own, whatever the slot it was found in says
        ffs: tuple[str, ...] = ("sxm",) if is_sxm_module(dev.name) else (ff,) if ff else ("cem",)
        double = ffs == ("cem",) and lanes >= 16
    else:
        ffs = tuple(dict.fromkeys((ff, "cem"))) if ff else base.form_factors
        double = False
    if slot.attrs.get("virtual"):
        ffs, double = base.form_factors, False  # a virtual slot takes any device of its kind
    title = str(dev.attrs.get("model") or dev.name or dev.id)
    read = dev.attrs.get("read_bytes_per_s") or base.read_bytes_per_s
    iops = dev.attrs.get("random_read_iops") or base.read_iops
    mem = (dev.attrs.get("memory_bytes") or dev.attrs.get("capacity_bytes")) if kind == "gpu" \
        else None
    return DeviceModel(
        name=_slug(title), kind=kind, lanes=lanes if lanes in VALID_WIDTHS else base.lanes,
        pcie_gen=gen if gen in GT_PER_S else base.pcie_gen, form_factors=ffs,
        double_width=double, read_bytes_per_s=read, read_iops=iops,
        memory_bytes=int(mem) if mem else None, title=title,
        source=f"derived from {dev.id} in the topology: link and slot as found"
               + ("" if dev.attrs.get("read_bytes_per_s") or kind == "gpu"
                  else f"; read figures {base.name}'s typical ones"),
    )


def _model_in_slot(work: Topology, dev: Node, slot: Node, notes: list[str]) -> DeviceModel:
    """The model of a device in a slot: a known one (allowed a narrower slot it sits in) or derived."""
    link = work.link_between(slot.id, dev.id)
    known = recognise_model(str(dev.attrs.get("model") or dev.name), dev.vendor_id,
                            dev.device_id)
    if known is not None and known.kind != dev.kind.value:
        known = None
    model = known or _derived_model(dev, slot, link)
    width = (link.lanes if link is not None else None) if slot.attrs.get("virtual") else slot.attrs.get("width_lanes")
    if known is not None and isinstance(width, int) and width < model.lanes \
            and width in VALID_WIDTHS:
        notes.append(f"{dev.id}: {model.name} sits in a x{width} slot; "
                     f"x{width} slots are allowed for it")
        model = replace(model, lanes=width)
    return model


def inventory_from_topology(
    topo: Topology,
    *,
    keep: Iterable[str] = (),
    move_nvlinked: bool = False,
) -> Inventory:
    """The GPUs and NVMe SSDs installed in the slots of ``topo``, to be moved around.

    A GPU or NVMe device whose parent is a slot node is movable and counted;
    every other device — onboard, a boot disk on a root port without a slot,
    NICs, anything not in a slot — is ``fixed``, and so are the devices
    named in ``keep`` and, unless ``move_nvlinked``, devices with NVLink
    links (moving one would break its bridge or baseboard links). A topology
    with no slot nodes at all uses the devices' positions as slots
    (:func:`with_virtual_slots`): all its GPUs and NVMe SSDs are movable.

    Devices are matched to a known model by PCI id or name
    (:func:`recognise_model`); others get a model derived from their link
    and slot, named after the device. A known model found in a slot
    narrower than its link is allowed that width (it works there, slower).

    >>> from planner.topology.spec.load import load_machine
    >>> inventory_from_topology(load_machine("moment-a"))
    Traceback (most recent call last):
    ...
    planner.errors.PlannerError: topology 'moment-a' has no GPU or NVMe SSD in a slot: nothing to move (give the devices to place as counts or a spec inventory)
    """  # noqa: E501 (a doctest's or a capture's line, as printed)
    keep = set(keep)
    for k in keep:
        if k not in topo:
            raise PlannerError(f"keep: no node {k!r} in topology {topo.name!r}")
    work = with_virtual_slots(topo)
    notes: list[str] = []
    models: dict[str, DeviceModel] = {}
    counts: dict[str, int] = {}
    installed: list[tuple[str, str]] = []
    fixed: list[str] = []
    for dev in work.nodes():
        if dev.kind not in DEVICE_KINDS:
            continue
        slot = work.parent(dev.id)
        in_slot = slot is not None and slot.kind == NodeKind.SLOT
        nvlinked = any(lk.kind == LinkKind.NVLINK and dev.id in lk.key for lk in work.links())
        if not (_placeable(dev) and in_slot) or dev.id in keep or dev.attrs.get("onboard"):
            fixed.append(dev.id)
            continue
        if nvlinked and not move_nvlinked:
            fixed.append(dev.id)
            notes.append(f"{dev.id} ({dev.label}) has NVLink links: kept where it is")
            continue
        assert slot is not None
        model = _model_in_slot(work, dev, slot, notes)
        old = models.get(model.name)
        if old is not None and old != model:
            # one name, different slots seen: the loosest needs that all of them satisfy
            model = replace(old, lanes=min(old.lanes, model.lanes),
                            form_factors=tuple(dict.fromkeys(old.form_factors
                                                             + model.form_factors)),
                            double_width=old.double_width and model.double_width)
        models[model.name] = model
        counts[model.name] = counts.get(model.name, 0) + 1
        installed.append((dev.id, model.name))
    if not installed:
        held = [d for d in fixed if work.node(d).kind in (NodeKind.GPU, NodeKind.NVME)
                and any(lk.kind == LinkKind.NVLINK and d in lk.key for lk in work.links())]
        why = (f"; {len(held)} GPU(s)/SSD(s) with NVLink links stay where they are "
               "(move_nvlinked=True moves them)") if held and not move_nvlinked else ""
        raise PlannerError(f"topology {topo.name!r} has no GPU or NVMe SSD in a slot: nothing to "
                           f"move (give the devices to place as counts or a spec inventory){why}")
    if work is not topo:
        notes.append(work.notes[-1])
    return Inventory(tuple((models[k], counts[k]) for k in models), fixed=tuple(fixed),
                     installed=tuple(installed), notes=tuple(dict.fromkeys(notes)))
