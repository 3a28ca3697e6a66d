"""Measured figures put into a topology (and into device models), and what was replaced."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from momentbase.jsontypes import JsonObject
from planner.capacities.model import (
    Capacities,
    DeviceCapacity,
    LinkCapacity,
)
from planner.capacities.writer import _measurement_dict
from planner.errors import TopologyError
from planner.topology.model import DEVICE_KINDS, Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import pcie_bytes_per_s
from planner.topology.pcitree import normalize_address

__all__ = ["AppliedCapacities", "Replacement", "apply_capacities", "apply_capacities_report",
           "apply_to_inventory", "find_device", "measured_figures"]


@dataclass(frozen=True)
class Replacement:
    """One figure of a topology that a measurement replaced.

    ``element`` is a node id or ``"src→dst"``; ``field`` the attribute
    (``bytes_per_s`` of a link, ``read_bytes_per_s`` of a device); ``old``
    and ``old_source`` the figure before and where it came from (a link's
    ``bandwidth_source``, ``"spec"``/``"none"`` for a device); ``entry`` the
    capacities entry it came from (``devices[0000:01:00.0]``, ``memory[0]``,
    ``links[2]``, ``pcie_efficiency``).
    """

    element: str
    field: str
    old: float | None
    new: float
    old_source: str
    entry: str
    tool: str | None = None


class AppliedCapacities(NamedTuple):
    """What :func:`apply_capacities` returns: the new topology, what changed, what matched nothing."""

    topology: Topology
    replaced: tuple[Replacement, ...]
    unused: tuple[str, ...]


def _norm_model(s: str) -> str:
    return " ".join(s.split()).casefold()


def _resolve(topo: Topology, ref: str) -> Node | None:
    """A node from its id or a PCI bus address (``0000:3b:00.0``, ``3b:00.0``, ``pci:...``)."""
    if ref in topo:
        return topo.node(ref)
    addr = ref[4:] if ref.startswith("pci:") else ref
    try:
        addr = normalize_address(addr)
    except TopologyError:
        return None
    return topo.find(addr)


def _edge(lk: Link) -> str:
    return f"{lk.src}→{lk.dst}"


def apply_capacities(topo: Topology, caps: Capacities) -> Topology:
    """A copy of ``topo`` whose figures are the measured ones where ``caps`` has them.

    What is replaced and how is described under :func:`apply_capacities_report`,
    which also returns the list of replaced figures and of entries that
    matched nothing; here both are only summed up in the topology's
    ``notes``, and :func:`measured_figures` lists the measured figures of
    the result.

    >>> from planner.topology.spec.load import load_machine
    >>> from planner.capacities import Capacities, DeviceCapacity, MemoryCapacity, PcieEfficiency, ReadMeasurement
    >>> caps = Capacities(memory=(MemoryCapacity(None, 4e10),))
    >>> topo = apply_capacities(load_machine("moment-b"), caps)
    >>> measured_figures(topo)
    [('socket0→mem0', 'bytes_per_s', 'measured'), ('socket1→mem1', 'bytes_per_s', 'measured')]
    """
    return apply_capacities_report(topo, caps).topology


def apply_capacities_report(topo: Topology, caps: Capacities) -> AppliedCapacities:
    """:func:`apply_capacities`, also returning what it replaced and what matched nothing.

    - ``pcie_efficiency`` recomputes every PCIe link whose capacity came from
      the generation × width table (``bandwidth_source="pcie"``) with the
      measured efficiency (the link keeps ``"pcie"`` as its source and gets
      ``attrs["efficiency_source"] = "measured"``);
    - a ``links:`` entry between two adjacent nodes replaces that link's
      ``bytes_per_s``; a ``host-to-device`` / ``device-to-host`` entry
      replaces the GPU's own link (the link to its parent: a copy between
      host memory and one GPU is bounded by the slowest link on its path,
      and charging that to the GPU's own link is the conservative reading);
      without ``device:`` every GPU without a figure of its own gets it; a
      ``peer-to-peer`` entry replaces a direct NVLink link; ``inter-socket``
      every socket-to-socket link. The model has one capacity per link for
      both directions, so when both directions are measured the lower one
      is used (``attrs["measured_directions"]`` keeps both);
    - a ``memory:`` entry replaces the socket-to-DRAM link of its NUMA node;
    - a ``devices:`` entry gives the device node ``attrs`` ``read_bytes_per_s``,
      ``read_iops``, ``read_block_bytes`` and ``read_measurement`` (how it
      was measured). Its key is matched as a node id, then as a PCI bus
      address, then as a model name (case and spacing ignored) against the
      ``model`` attribute or name of every device node; an id or address
      entry wins over a model entry for the same node.

    Every replaced link gets ``bandwidth_source="measured"`` and
    ``attrs["table_bytes_per_s"]`` (the figure it had). The topology's
    ``notes`` say how many figures are measured and which entries matched
    nothing; the returned :class:`AppliedCapacities` lists both in full.

    >>> from planner.capacities import Capacities, DeviceCapacity, MemoryCapacity, PcieEfficiency, ReadMeasurement
    >>> from planner.topology.model import Link, Node, NodeKind, Topology
    >>> t = Topology("toy")
    >>> for n in (Node("socket0", NodeKind.SOCKET, numa_node=0), Node("mem0", NodeKind.MEMORY, numa_node=0),
    ...           Node("pci:0000:01:00.0", NodeKind.NVME, "P5510", bus_address="0000:01:00.0")):
    ...     _ = t.add_node(n)
    >>> _ = t.add_link(Link("socket0", "mem0", LinkKind.MEMORY, 1e11, bandwidth_source="default"))
    >>> _ = t.add_link(Link.pcie("socket0", "pci:0000:01:00.0", gen=4, lanes=4))
    >>> caps = Capacities(memory=(MemoryCapacity(0, 4e10),), pcie_efficiency=PcieEfficiency(0.9),
    ...     devices=(DeviceCapacity("0000:01:00.0", ReadMeasurement(3e9, 732421.875, 4096)),))
    >>> new, replaced, unused = apply_capacities_report(t, caps)
    >>> lk = new.link_between("socket0", "mem0")
    >>> lk.bytes_per_s, lk.bandwidth_source
    (40000000000.0, 'measured')
    >>> round(new.link_between("socket0", "pci:0000:01:00.0").bytes_per_s / 1e9, 2)
    7.09
    >>> new.node("pci:0000:01:00.0").attrs["read_bytes_per_s"]
    3000000000.0
    >>> [(r.element, r.field) for r in replaced]
    [('socket0→pci:0000:01:00.0', 'bytes_per_s'), ('socket0→mem0', 'bytes_per_s'), ('pci:0000:01:00.0', 'read_bytes_per_s')]
    """  # noqa: E501 (a doctest's or a capture's line, as printed)
    new = topo.copy()
    replaced: list[Replacement] = []
    unused: list[str] = []
    src_name = caps.source or "capacities"
    if caps.pcie_efficiency is not None:
        replaced += _apply_efficiency(new, caps.pcie_efficiency.value)
    replaced += _apply_link_figures(new, _link_figures(new, caps, unused))
    replaced += _apply_memory(new, caps, unused)
    replaced += _apply_devices(new, caps, unused)
    if replaced:
        n_links = sum(1 for r in replaced if r.field == "bytes_per_s")
        n_dev = len(replaced) - n_links
        new.notes.append(f"{src_name}: {n_links} link figure(s) and {n_dev} device figure(s) "
                         "are measured (bandwidth_source 'measured' / attrs 'read_source'); "
                         "the others are from tables or specs")
    for u in unused:
        new.notes.append(f"{src_name}: not applied: {u}")
    return AppliedCapacities(new, tuple(replaced), tuple(unused))




def _apply_efficiency(new: Topology, eff: float) -> list[Replacement]:
    """Every PCIe link from the gen × width table recomputed with the measured efficiency."""
    replaced: list[Replacement] = []
    for lk in new.links(LinkKind.PCIE):
        if lk.bandwidth_source != "pcie" or not lk.pcie_gen or not lk.lanes:
            continue
        try:
            bw = pcie_bytes_per_s(lk.pcie_gen, lk.lanes, eff)
        except TopologyError:
            continue
        new.replace_link(replace(lk, bytes_per_s=bw, attrs={
            **lk.attrs, "efficiency": eff, "efficiency_source": "measured"}))
        replaced.append(Replacement(_edge(lk), "bytes_per_s", lk.bytes_per_s, bw, "pcie",
                                    "pcie_efficiency"))
    return replaced


_Figures = dict[tuple[str, str], list[tuple[str, float, str, str | None]]]


def _link_figures(new: Topology, caps: Capacities, unused: list[str]) -> _Figures:
    """The ``links:`` entries per topology link: (direction "down"/"up"/"both", figure, entry, tool)."""
    found: dict[tuple[str, str], list[tuple[str, float, str, str | None]]] = {}
    class_wide: list[tuple[int, LinkCapacity]] = []

    def add(lk: Link, direction: str, value: float, label: str, tool: str | None) -> None:
        found.setdefault(lk.key, []).append((direction, value, label, tool))

    for i, lc in enumerate(caps.links):
        label = f"links[{i}]"
        if lc.link_class in ("host-to-device", "device-to-host"):
            if lc.device is None:
                class_wide.append((i, lc))
                continue
            dev = _resolve(new, lc.device)
            parent = new.parent(dev.id) if dev is not None else None
            if dev is None or parent is None:
                unused.append(f"{label} ({lc.label}): no device {lc.device!r} with a parent link "
                              "in the topology")
                continue
            lk = new.link_between(parent.id, dev.id)
            assert lk is not None
            down = lc.link_class == "host-to-device"
            add(lk, "down" if (lk.dst == dev.id) == down else "up", lc.bytes_per_s, label, lc.tool)
        elif lc.link_class == "inter-socket":
            links = new.links(LinkKind.INTER_SOCKET)
            if not links:
                unused.append(f"{label} ({lc.label}): the topology has no inter-socket link")
            for lk in links:
                add(lk, "both", lc.bytes_per_s, label, lc.tool)
        else:
            assert lc.src is not None and lc.dst is not None
            a, b = _resolve(new, lc.src), _resolve(new, lc.dst)
            lk = new.link_between(a.id, b.id) if a is not None and b is not None else None
            if lk is None or (lc.link_class == "peer-to-peer" and lk.kind != LinkKind.NVLINK):
                why = ("no such node" if a is None or b is None else
                       "no direct NVLink link joins them (PCIe peer traffic crosses several links)"
                       if lc.link_class == "peer-to-peer" else "no link joins them")
                unused.append(f"{label} ({lc.label}): {why}")
                continue
            add(lk, "down" if (a.id, b.id) == lk.key else "up", lc.bytes_per_s, label, lc.tool)
    for i, lc in class_wide:
        gpus = [g for g in new.nodes(NodeKind.GPU) if new.parent(g.id) is not None]
        hit = 0
        for g in gpus:
            parent = new.parent(g.id)
            assert parent is not None
            lk = new.link_between(parent.id, g.id)
            assert lk is not None
            direction = "down" if lc.link_class == "host-to-device" else "up"
            if any(d == direction and not lab.startswith("class:") for d, _, lab, _ in found.get(lk.key, [])):
                continue  # this GPU has its own figure
            add(lk, direction, lc.bytes_per_s, f"class:links[{i}]", lc.tool)
            hit += 1
        if not hit:
            unused.append(f"links[{i}] ({lc.label}): no GPU in the topology without its own figure")
    return found


def _apply_link_figures(new: Topology, found: _Figures) -> list[Replacement]:
    """Each link with figures gets the lowest of them (one capacity for both directions)."""
    replaced: list[Replacement] = []
    for key, figures in found.items():
        lk = new.link_between(*key)
        assert lk is not None
        per_dir: dict[str, float] = {}
        for direction, value, _, _ in figures:
            for d in (("down", "up") if direction == "both" else (direction,)):
                per_dir[d] = min(value, per_dir.get(d, math.inf))
        value = min(per_dir.values())
        labels = sorted({lab.removeprefix("class:") for _, _, lab, _ in figures})
        tools = sorted({t for _, _, _, t in figures if t})
        attrs: JsonObject = {**lk.attrs, "table_bytes_per_s": lk.bytes_per_s,
                                 "table_source": lk.bandwidth_source}
        if len(per_dir) == 2 and per_dir["down"] != per_dir["up"]:
            attrs["measured_directions"] = {f"{lk.src}→{lk.dst}": per_dir["down"],
                                            f"{lk.dst}→{lk.src}": per_dir["up"]}
        new.replace_link(replace(lk, bytes_per_s=value, bandwidth_source="measured", attrs=attrs))
        replaced.append(Replacement(_edge(lk), "bytes_per_s", lk.bytes_per_s, value,
                                    lk.bandwidth_source, ", ".join(labels),
                                    ", ".join(tools) or None))
    return replaced


def _apply_memory(new: Topology, caps: Capacities, unused: list[str]) -> list[Replacement]:
    """Each ``memory:`` entry replaces the socket-to-DRAM link of its NUMA node."""
    replaced: list[Replacement] = []
    by_node = {m.numa_node: m for m in caps.memory}
    used_mem: set[int | None] = set()
    for mem in new.nodes(NodeKind.MEMORY):
        numa = mem.numa_node
        if numa is None and mem.id.startswith("mem") and mem.id[3:].isdigit():
            numa = int(mem.id[3:])
        mc = by_node.get(numa) if numa is not None else None
        mc = mc or by_node.get(None)
        parent = new.parent(mem.id)
        lk = new.link_between(parent.id, mem.id) if parent is not None else None
        if mc is None or lk is None:
            continue
        used_mem.add(mc.numa_node)
        new.replace_link(replace(lk, bytes_per_s=mc.bytes_per_s, bandwidth_source="measured",
                                 attrs={**lk.attrs, "table_bytes_per_s": lk.bytes_per_s,
                                        "table_source": lk.bandwidth_source,
                                        "measured_convention": mc.convention or "stream-copy"}))
        entry = "memory[all]" if mc.numa_node is None else f"memory[{mc.numa_node}]"
        replaced.append(Replacement(_edge(lk), "bytes_per_s", lk.bytes_per_s, mc.bytes_per_s,
                                    lk.bandwidth_source, entry, mc.method))
    for mc in caps.memory:
        if mc.numa_node not in used_mem:
            where = "all" if mc.numa_node is None else str(mc.numa_node)
            unused.append(f"memory[{where}]: no memory node of NUMA node {where} in the topology")
    return replaced


def _apply_devices(new: Topology, caps: Capacities, unused: list[str]) -> list[Replacement]:
    """Read figures onto device nodes: model entries first, ids and addresses override."""
    replaced: list[Replacement] = []
    targets: dict[str, DeviceCapacity] = {}
    specific: set[str] = set()
    device_nodes = [n for n in new.nodes() if n.kind in DEVICE_KINDS]
    for dc in caps.devices:
        node = _resolve(new, dc.key)
        if node is not None:
            targets[node.id] = dc
            specific.add(node.id)
            continue
        want = _norm_model(dc.key)
        hits = [n for n in device_nodes
                if want in (_norm_model(str(n.attrs.get("model", ""))), _norm_model(n.name))]
        if not hits:
            unused.append(f"devices[{dc.key}]: no node with that id, bus address or model")
        for n in hits:
            if n.id not in specific:
                targets[n.id] = dc
    for node_id, dc in targets.items():
        node = new.node(node_id)
        rd = dc.read
        how = {k: v for k, v in _measurement_dict(rd).items()
               if k not in ("read_bytes_per_s", "read_iops", "block_bytes")}
        how["entry"] = dc.key
        extra: JsonObject = {"read_bytes_per_s": rd.read_bytes_per_s, "read_source": "measured",
                                 "read_measurement": how}
        if rd.read_iops is not None:
            extra["read_iops"] = rd.read_iops
        if rd.block_bytes is not None:
            extra["read_block_bytes"] = rd.block_bytes
        old = node.attrs.get("read_bytes_per_s")
        new.replace_node(node.with_attrs(**extra))
        replaced.append(Replacement(node_id, "read_bytes_per_s",
                                    float(old) if isinstance(old, (int, float)) else None,
                                    rd.read_bytes_per_s, "spec" if old is not None else "none",
                                    f"devices[{dc.key}]", rd.tool))
    return replaced


def find_device(caps: Capacities, key_or_model: str) -> DeviceCapacity | None:
    """The entry for a node id, bus address or model name (model compared ignoring case and spacing).

    >>> from planner.capacities import Capacities, DeviceCapacity, MemoryCapacity, PcieEfficiency, ReadMeasurement
    >>> caps = Capacities(devices=(DeviceCapacity("Intel P5510 3.84 TB", ReadMeasurement(3e9)),))
    >>> find_device(caps, "intel  p5510 3.84 tb").read_bytes_per_s
    3000000000.0
    """
    exact = caps.device(key_or_model)
    if exact is not None:
        return exact
    want = _norm_model(key_or_model)
    for d in caps.devices:
        if _norm_model(d.key) == want or (d.model and _norm_model(d.model) == want):
            return d
    return None


def apply_to_inventory(items: Sequence[Any], caps: Capacities) -> list[Any]:
    """Device models or inventory items with the measured figures of ``caps``.

    Works on anything with a model name: a ``devices:`` entry is looked up
    (:func:`find_device`) by the item's ``model``, ``title`` or ``name``.
    An item with ``read_bytes_per_s`` / ``read_iops`` fields (a
    ``planner.inventory.DeviceModel``) gets them replaced (``read_iops`` only
    for a measurement at 4 KiB) and ``source`` set to say so; an item
    keeping figures in ``attrs`` (a spec's ``InventoryItem``) gets
    ``attrs["read_bytes_per_s"]`` and ``attrs["random_read_iops"]``, listed
    in ``attrs["measured_fields"]`` and dropped from ``attrs["inferred_fields"]``.
    Items without an entry are returned as they are.

    >>> from planner.capacities import Capacities, DeviceCapacity, MemoryCapacity, PcieEfficiency, ReadMeasurement
    >>> from planner.inventory import device_model
    >>> caps = Capacities(devices=(DeviceCapacity("P5510", ReadMeasurement(2.5e9, 610351.5625, 4096)),))
    >>> m = apply_to_inventory([device_model("p5510")], caps)[0]
    >>> m.read_bytes_per_s, m.read_iops, m.source
    (2500000000.0, 610351.5625, 'measured (capacities)')
    """
    out = []
    for item in items:
        dc = None
        for attr in ("model", "title", "name"):
            name = getattr(item, attr, None)
            if isinstance(name, str) and name and (dc := find_device(caps, name)) is not None:
                break
        if dc is None:
            out.append(item)
            continue
        rd = dc.read
        at_4k = rd.read_iops is not None and rd.block_bytes == 4096
        fields = getattr(item, "__dataclass_fields__", {})
        if "read_bytes_per_s" in fields:
            changes: JsonObject = {"read_bytes_per_s": rd.read_bytes_per_s}
            if at_4k and "read_iops" in fields:
                changes["read_iops"] = rd.read_iops
            if "source" in fields:
                changes["source"] = f"measured ({rd.tool or caps.source or 'capacities'})"
            out.append(replace(item, **changes))
            continue
        attrs = dict(item.attrs)
        measured = ["read_bytes_per_s"]
        attrs["read_bytes_per_s"] = rd.read_bytes_per_s
        if at_4k:
            attrs["random_read_iops"] = rd.read_iops
            measured.append("random_read_iops")
        attrs["measured_fields"] = measured
        if "inferred_fields" in attrs:
            attrs["inferred_fields"] = [f for f in attrs["inferred_fields"] if f not in measured]
        out.append(replace(item, attrs=attrs))
    return out


def measured_figures(topo: Topology) -> list[tuple[str, str, str]]:
    """Every figure of ``topo`` that a measurement set: ``(element, field, how)`` triples.

    ``element`` is a node id or ``"src→dst"``; ``how`` is ``"measured"``, or
    ``"measured efficiency"`` for a PCIe link recomputed with a measured
    protocol efficiency. The counterpart of
    :func:`planner.topology.spec.schema.inferred_figures`, for a plan report.
    """
    out: list[tuple[str, str, str]] = []
    for lk in topo.links():
        if lk.bandwidth_source == "measured":
            out.append((_edge(lk), "bytes_per_s", "measured"))
        elif lk.attrs.get("efficiency_source") == "measured":
            out.append((_edge(lk), "bytes_per_s", "measured efficiency"))
    for n in topo.nodes():
        if n.attrs.get("read_source") == "measured":
            out.append((n.id, "read_bytes_per_s", "measured"))
    return out
