"""Build a topology from hwloc's XML export (``lstopo --of xml``).

hwloc writes one object tree per machine: ``Package`` objects (CPU sockets),
``NUMANode`` objects (memory: children of a package in XML v1, *memory
children* of a package or group in v2/v3), and the I/O tree below them:

- a ``Bridge`` with ``bridge_type="0-1"`` is a **host bridge**; it has no PCI
  address and its children are functions on a root bus. It belongs to the
  package (and NUMA node) it hangs under.
- a ``Bridge`` with ``bridge_type="1-1"`` is a **PCI-to-PCI bridge** (root
  port, switch port, ...), with ``pci_busid``, ``bridge_pci="0000:[2c-3b]"``
  (secondary and subordinate bus) and ``pci_type``.
- a ``PCIDev`` is a function; ``pci_type="0302 [10de:1db8] [10de:131d] a1 00"``
  is class, ``[vendor:device]``, ``[subvendor:subdevice]``, revision, prog-if.
- an ``OSDev`` below a function is what the OS made of it (``nvml0``,
  ``cuda0``, ``ib0``, ``mlx5_0``, ``nvme0n1``); GPU OS devices carry the model
  name (``GPUModel``).

The XML nesting *is* the PCI tree, so every :class:`PciFunction` gets its
``parent`` from it and :func:`build_pci_topology` applies the shared rules
for root ports, switches and sockets. Then what only hwloc knows is added:

- **Link capacities.** ``pci_link_speed`` is hwloc's figure in GB/s,
  ``lanes × GT/s × encoding / 8`` of the *negotiated* link (NVML replaces it
  by the maximum for NVIDIA GPUs). Most figures fit several (generation,
  width) pairs (15.75 GB/s is Gen3 x16 as well as Gen4 x8), so the pair is
  kept only when it is unique; otherwise the link's ``bytes_per_s`` is the
  smaller figure of its two ends × the protocol efficiency (0.8), flagged
  ``bandwidth_source="hwloc"`` with the raw figure in
  ``attrs["hwloc_gb_per_s"]``.
- **NVLink.** The ``NVLinkBandwidth`` distances matrix holds, for each pair
  of objects (NVML OS devices, NVSwitch PCI devices, packages), the sum of
  the NVLink bandwidths that join them, in MB/s **per direction** (hwloc's
  NVML backend adds 20000 per NVLink 1.0 link and 25000 per NVLink 2.0–4.0
  link; the diagonal is an artificial 1000000). Each non-zero entry becomes
  one ``LinkKind.NVLINK`` link of ``value × 10⁶`` bytes/s per direction,
  ``bandwidth_source="hwloc"``.
- GPU ↔ CPU NVLink (IBM POWER8/9) cannot join the GPU to its socket
  directly when a PCIe link already does (a topology holds one link per
  pair of nodes), so it goes through a node ``nvlink:socketN`` of kind
  ``other`` standing for the CPU's NVLink port (:func:`add_cpu_nvlink`).
- The machine's name (``DMIProductName``, else ``PlatformModel``).

>>> xml = '''<topology version="2.0">
... <object type="Machine" os_index="0" gp_index="1">
...  <info name="DMIProductName" value="Toy"/>
...  <object type="Package" os_index="0" gp_index="2" nodeset="0x1">
...   <object type="NUMANode" os_index="0" gp_index="3" local_memory="1073741824"/>
...   <object type="Bridge" gp_index="4" bridge_type="0-1" bridge_pci="0000:[00-01]">
...    <object type="Bridge" gp_index="5" bridge_type="1-1" bridge_pci="0000:[01-01]"
...            pci_busid="0000:00:01.0" pci_type="0604 [8086:2030] [0000:0000] 04 00">
...     <object type="PCIDev" gp_index="6" pci_busid="0000:01:00.0"
...             pci_type="0302 [10de:20b0] [10de:134f] a1 00" pci_link_speed="31.507692">
...      <object type="OSDev" gp_index="7" name="nvml0" osdev_type="1">
...       <info name="GPUModel" value="A100-SXM4-40GB"/>
...      </object>
...     </object>
...    </object>
...   </object>
...  </object>
... </object>
... </topology>'''
>>> topo = parse_hwloc_xml(xml, "toy.xml")
>>> topo.name, [(n.id, n.name) for n in topo.nodes("gpu")]
('Toy', [('pci:0000:01:00.0', 'A100-SXM4-40GB')])
>>> lk = topo.link_between("socket0", "pci:0000:01:00.0")
>>> lk.bandwidth_source, lk.attrs["hwloc_gb_per_s"], round(lk.bytes_per_s / 1e9, 2)
('hwloc', 31.507692, 25.21)
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from momentbase.jsontypes import JsonObject
from planner.errors import ParseError
from planner.topology.hwloc.elements import (
    _BRIDGE_PCI,
    _BRIDGE_TYPE,
    _GPU_NAME,
    _GPU_OSDEV,
    _GPU_SUBTYPES,
    _IO_TYPES,
    _MAX_GB_PER_S,
    _NET_OSDEV,
    _PACKAGE_TYPES,
    _PCI_TYPE,
    NVLINK_MATRIX,
    _bitmap,
    _busid,
    _Ctx,
    _Fn,
    _infos,
    _Normal,
    _opt_int,
    _OsDev,
    _osdev_categories,
    _version_major,
    _Walk,
)
from planner.topology.hwloc.links import (
    _add_nvlinks,
    _set_pcie_capacities,
)
from planner.topology.model import Node, NodeKind, Topology
from planner.topology.pcitree import (
    REPEAT_MARK,
    PciFunction,
    add_memory_and_interconnect,
    build_pci_topology,
    classify,
)
from planner.topology.xmlsafe import XmlDocument, build_from_xml

__all__ = ["parse_hwloc_xml"]

def parse_hwloc_xml(text: str, source: str) -> Topology:
    """The topology described by hwloc XML ``text`` (read from ``source``).

    Handles XML written by hwloc 1.x (``<topology>``) and 2.x/3.x
    (``<topology version="2.0">``/``"3.0"``). Sockets are the ``Package``
    objects, numbered by ``os_index``; a package without I/O still gets its
    socket and memory node. Raises :class:`ParseError` on anything that is
    not hwloc XML or that contradicts itself.
    """
    return build_from_xml(text, source, _parse, "a consistent hwloc topology")


def _parse(doc: XmlDocument, source: str) -> Topology:
    root = doc.root
    if root.tag != "topology":
        raise ParseError(source, doc.line(root),
                         "an hwloc <topology> root element (lstopo --of xml)", f"<{root.tag}>")
    major = _version_major(doc, root, source)
    tops = [c for c in root if c.tag == "object"]
    if not tops:
        raise ParseError(source, doc.line(root), "an <object> (the Machine) inside <topology>")

    walk = _Walk(major)
    for top in tops:
        _walk_tree(doc, top, walk, source)
    for info in root.findall("info"):
        walk.machine_infos.setdefault(info.get("name", ""), info.get("value", ""))

    numa_to_socket = _numa_to_socket(walk)
    _assign_numa(walk, numa_to_socket)

    functions = [_pci_function(f) for f in walk.fns.values()]
    name = (walk.machine_infos.get("DMIProductName") or walk.machine_infos.get("PlatformModel")
            or "").strip()
    if functions:
        topo = build_pci_topology(functions, name=name, source=source,
                                  numa_to_socket=numa_to_socket or None)
    else:
        topo = Topology(name=name, sources=[source])
    if walk.duplicates:
        topo.notes.append(f"{len(walk.duplicates)} PCI function(s) appear twice, identically; "
                          "the copies were ignored: " + ", ".join(walk.duplicates))
    if walk.repeats:
        topo.notes.append(f"{len(walk.repeats)} PCI bus id(s) name two different objects (was the "
                          "file edited, or merged from two machines?); both are kept, as hwloc keeps "
                          f"them, the repeat as the bus id with {REPEAT_MARK}2: " + "; ".join(walk.repeats))
    _complete_sockets(topo, walk, numa_to_socket)
    _fix_kinds(topo, walk)
    _set_pcie_capacities(topo, walk)
    for dist in root:
        if dist.tag in ("distances2", "distances2hetero") and dist.get("name") == NVLINK_MATRIX:
            _add_nvlinks(topo, doc, dist, walk, numa_to_socket, source)
    return topo


# -- the tree walk -------------------------------------------------------------


def _walk_tree(doc: XmlDocument, top: ET.Element, walk: _Walk, source: str) -> None:
    stack: list[tuple[ET.Element, _Ctx]] = [(top, _Ctx())]
    while stack:
        elem, ctx = stack.pop()
        child_ctx = _visit(doc, elem, ctx, walk, source)
        if child_ctx is None:
            continue
        stack.extend((c, child_ctx) for c in reversed([c for c in elem if c.tag == "object"]))


def _visit(doc: XmlDocument, elem: ET.Element, ctx: _Ctx, walk: _Walk, source: str) -> _Ctx | None:
    line = doc.line(elem)
    otype = elem.get("type")
    if otype is None:
        raise ParseError(source, line, 'an <object type="...">', doc.line_text(line))
    infos = _infos(elem)
    gp = _opt_int(doc, elem, "gp_index", source)

    if otype in _IO_TYPES or ctx.in_io:
        return _visit_io(doc, elem, otype, ctx, walk, source, infos, gp)

    os_index = _opt_int(doc, elem, "os_index", source)
    normal = _Normal(otype, os_index, _bitmap(elem.get("nodeset")))
    walk.normals.append(normal)
    idx = len(walk.normals) - 1
    chain = (*ctx.chain, idx)
    package, numa = ctx.package, ctx.numa
    if otype == "Machine":
        for k, v in infos.items():
            walk.machine_infos.setdefault(k, v)
    elif otype in _PACKAGE_TYPES:
        if os_index is None:
            os_index = len(walk.packages)
            normal.os_index = os_index
        if os_index in walk.packages:
            raise ParseError(source, line, f"one Package with os_index {os_index}",
                             doc.line_text(line))
        walk.packages[os_index] = {"line": line, "model": infos.get("CPUModel"),
                                   "vendor": infos.get("CPUVendor")}
        package = os_index
        if gp is not None:
            walk.gp[gp] = ("package", os_index)
        if ctx.numa is not None:  # XML v1: the NUMA node contains the package
            walk.numa_pkg_candidates.setdefault(ctx.numa, set()).add(os_index)
    elif otype == "NUMANode":
        if os_index is None:
            raise ParseError(source, line, "a NUMANode with an os_index", doc.line_text(line))
        if os_index in walk.numas:
            raise ParseError(source, line, f"one NUMANode with os_index {os_index}",
                             doc.line_text(line))
        memory = _opt_int(doc, elem, "local_memory", source)
        walk.numas[os_index] = {"package": ctx.package, "memory": memory, "line": line}
        for anc in chain:
            walk.normals[anc].numas.add(os_index)
        numa = os_index
        if gp is not None:
            walk.gp[gp] = ("numa", os_index)
    return _Ctx(chain, package, numa, None, None, False)


def _visit_io(doc: XmlDocument, elem: ET.Element, otype: str, ctx: _Ctx, walk: _Walk,
              source: str, infos: dict[str, str], gp: int | None) -> _Ctx | None:
    line = doc.line(elem)
    io_ctx = _Ctx(ctx.chain, ctx.package, ctx.numa, ctx.pci_parent, ctx.pci_fn, True)
    if otype in ("Bridge", "PCIDev") and _repeated(doc, elem, walk, source):
        return None  # an identical copy of a function already read: skip it and what it holds
    if otype == "Bridge":
        btype = elem.get("bridge_type", "")
        m = _BRIDGE_TYPE.match(btype)
        if not m:
            raise ParseError(source, line, 'a bridge_type like "0-1" or "1-1"', btype or None)
        busid = elem.get("pci_busid")
        if m.group(1) != "1" and busid is None:
            # A host bridge: what is below it sits on a root bus.
            if gp is not None:
                walk.gp[gp] = ("host-bridge", None)
            return _Ctx(ctx.chain, ctx.package, ctx.numa, None, None, True)
        fn = _function(doc, elem, walk, ctx, source, infos, is_bridge=True)
        rng = elem.get("bridge_pci")
        if rng is not None:
            mr = _BRIDGE_PCI.match(rng)
            if not mr:
                raise ParseError(source, line, 'bridge_pci like "0000:[2c-3b]"', rng)
            fn.secondary_bus, fn.subordinate_bus = int(mr.group(2), 16), int(mr.group(3), 16)
        if gp is not None:
            walk.gp[gp] = ("pci", fn.address)
        return _Ctx(ctx.chain, ctx.package, ctx.numa, fn.address, fn.address, True)
    if otype == "PCIDev":
        fn = _function(doc, elem, walk, ctx, source, infos, is_bridge=False)
        if gp is not None:
            walk.gp[gp] = ("pci", fn.address)
        return _Ctx(ctx.chain, ctx.package, ctx.numa, ctx.pci_parent, fn.address, True)
    if otype == "OSDev":
        name = elem.get("name", "")
        osdev = _OsDev(name, elem.get("subtype"),
                       _osdev_categories(doc, elem, walk.major, source), infos)
        if ctx.pci_fn is not None:
            walk.fns[ctx.pci_fn].osdevs.append(osdev)
        if gp is not None:
            walk.gp[gp] = ("osdev", ctx.pci_fn)
        return io_ctx
    return io_ctx  # Misc and anything newer: look through it


_VOLATILE = {"gp_index", "id"}  # hwloc's object numbering, not part of what an object says


def _shape(elem: ET.Element) -> tuple[Any, ...]:
    """An element and its subtree without hwloc's object numbers, for comparing copies."""
    attrs = tuple(sorted((k, v) for k, v in elem.attrib.items() if k not in _VOLATILE))
    return (elem.tag, attrs, tuple(_shape(c) for c in elem))


def _repeated(doc: XmlDocument, elem: ET.Element, walk: _Walk, source: str) -> bool:
    """Whether ``elem`` repeats a PCI function already read, identically (then it is noted).

    Two different objects with one bus id cannot both be right (the export
    was edited or merged from two machines), but hwloc loads both, each where
    the XML puts it, and no rule says which to drop: both are kept apart, the
    repeat under its bus id with ``#2`` (:data:`REPEAT_MARK`), and a note
    names both lines.
    """
    busid = elem.get("pci_busid")
    if busid is None:
        return False
    line = doc.line(elem)
    address = _busid(busid, source, line)
    first = walk.elems.get(address)
    if first is None:
        return False
    first_line = doc.line(first)
    if _shape(first) == _shape(elem):
        walk.duplicates.append(f"{address} (lines {first_line} and {line})")
        return True
    walk.repeats.append(f"{address} (line {first_line}: {_describe(first)}; line {line}: {_describe(elem)})")
    return False


def _describe(elem: ET.Element) -> str:
    infos = _infos(elem)
    name = infos.get("PCIDevice") or elem.get("pci_type") or elem.get("type") or "an object"
    return f"'{name}'"


def _function(doc: XmlDocument, elem: ET.Element, walk: _Walk, ctx: _Ctx, source: str,
              infos: dict[str, str], *, is_bridge: bool) -> _Fn:
    line = doc.line(elem)
    busid = elem.get("pci_busid")
    if busid is None:
        raise ParseError(source, line, "a pci_busid attribute", doc.line_text(line))
    address = _busid(busid, source, line)
    if address in walk.fns:  # a different object on a bus id already read (see _repeated)
        address += f"{REPEAT_MARK}{sum(a.partition(REPEAT_MARK)[0] == address for a in walk.fns) + 1}"
    walk.elems.setdefault(address.partition(REPEAT_MARK)[0], elem)
    fn = _Fn(address, line, is_bridge, parent=ctx.pci_parent, infos=infos,
             subtype=elem.get("subtype"))
    ptype = elem.get("pci_type")
    if ptype is not None:
        m = _PCI_TYPE.match(ptype)
        if not m:
            raise ParseError(source, line,
                             'pci_type like "0604 [10b5:9781] [10b5:9781] b0 00"', ptype)
        fn.class_code, fn.vendor_id, fn.device_id = (g.lower() for g in m.group(1, 2, 3))
        if m.group(4) and (m.group(4), m.group(5)) != ("0000", "0000"):
            fn.subsystem = f"{m.group(4)}:{m.group(5)}".lower()
        fn.revision = m.group(6).lower() if m.group(6) else None
    speed = elem.get("pci_link_speed")
    if speed is not None:
        try:
            value = float(speed)
        except ValueError:
            raise ParseError(source, line, "pci_link_speed in GB/s like 15.753846", speed) from None
        if not math.isfinite(value) or not 0 <= value <= _MAX_GB_PER_S:
            raise ParseError(source, line, "pci_link_speed in GB/s like 15.753846", speed)
        fn.gb_per_s = value or None  # 0 means hwloc did not know
    if fn.parent is None:
        fn.locality = ctx.chain
    walk.fns[address] = fn
    return fn


# -- NUMA nodes and sockets ----------------------------------------------------


def _numa_to_socket(walk: _Walk) -> dict[int, int]:
    """NUMA node → package os_index, for the NUMA nodes whose package is known."""
    out: dict[int, int] = {}
    if not walk.packages:
        return out
    for numa, rec in walk.numas.items():
        if rec["package"] is not None:
            out[numa] = rec["package"]
        else:
            cands = walk.numa_pkg_candidates.get(numa, set())
            if len(cands) == 1:
                out[numa] = next(iter(cands))
    if not walk.numas and len(walk.packages) == 1:
        # hwloc 1.x omits NUMANode on a machine with uniform memory: node 0.
        out[0] = next(iter(walk.packages))
    return out


def _assign_numa(walk: _Walk, numa_to_socket: Mapping[int, int]) -> None:
    """Give every function the NUMA node of the object its root function hangs under."""
    known = set(walk.numas)
    default: int | None = None
    if not known and len(walk.packages) <= 1:
        default = 0
    root_numa: dict[str, int | None] = {}
    for addr, fn in walk.fns.items():
        if fn.parent is not None:
            continue
        numa: int | None = default
        for idx in reversed(fn.locality):
            normal = walk.normals[idx]
            if normal.type == "NUMANode" and normal.os_index is not None:
                cands = {normal.os_index}
            else:
                cands = set(normal.nodeset or ()) & known if known else set(normal.nodeset or ())
                cands = cands or set(normal.numas)
            if cands:
                sockets = {numa_to_socket.get(n, n) for n in cands}
                numa = min(cands) if len(cands) == 1 or len(sockets) == 1 else None
                break
        root_numa[addr] = numa
    for fn in walk.fns.values():
        top = fn
        seen = 0
        while top.parent is not None and seen <= len(walk.fns):
            top = walk.fns[top.parent]
            seen += 1
        fn.numa_node = root_numa.get(top.address, default)


def _complete_sockets(topo: Topology, walk: _Walk, numa_to_socket: Mapping[int, int]) -> None:
    """Add packages without I/O, and record CPU models and memory sizes."""
    socket_numas: dict[str, list[int]] = {}
    for numa in sorted(walk.numas):
        socket_numas.setdefault(f"socket{numa_to_socket.get(numa, numa)}", []).append(numa)
    wanted = [f"socket{p}" for p in sorted(walk.packages)] or [f"socket{n}" for n in sorted(walk.numas)]
    for sid in wanted:
        if sid not in topo:
            numas = socket_numas.get(sid, [])
            topo.add_node(Node(sid, NodeKind.SOCKET, f"socket {sid[len('socket'):]}",
                               numa_node=numas[0] if len(numas) == 1 else None,
                               attrs={"numa_nodes": numas}))
    add_memory_and_interconnect(topo)
    for sock in topo.nodes(NodeKind.SOCKET):
        if sock.id == "socket?":
            continue
        idx = int(sock.id[len("socket"):])
        pkg = walk.packages.get(idx)
        if pkg and pkg.get("model"):
            topo.replace_node(sock.with_attrs(model=pkg["model"]))
        mem = sum(walk.numas[n]["memory"] or 0 for n in socket_numas.get(sock.id, []))
        mem_id = f"mem{idx}"
        if mem and mem_id in topo:
            topo.replace_node(topo.node(mem_id).with_attrs(capacity_bytes=mem))


# -- device kinds ----------------------------------------------------------------


def _pci_function(fn: _Fn) -> PciFunction:
    attrs: JsonObject = {}
    if fn.subsystem:
        attrs["subsystem"] = fn.subsystem
    if fn.revision:
        attrs["revision"] = fn.revision
    if fn.osdevs:
        attrs["os_devices"] = [d.name for d in fn.osdevs]
    if fn.subtype:
        attrs["hwloc_subtype"] = fn.subtype
    if fn.gb_per_s is not None:
        attrs["hwloc_gb_per_s"] = fn.gb_per_s
    if fn.vendor_id == "0000" and fn.device_id == "0000":
        attrs["unreadable"] = True  # config space read as zeros: kept, kind unknown
    return PciFunction(
        fn.address, class_code=fn.class_code, vendor_id=fn.vendor_id, device_id=fn.device_id,
        name=_function_name(fn), is_bridge=fn.is_bridge, secondary_bus=fn.secondary_bus,
        subordinate_bus=fn.subordinate_bus, numa_node=fn.numa_node,
        slot=fn.infos.get("PCISlot"), parent=fn.parent, attrs=attrs,
    )


def _function_name(fn: _Fn) -> str:
    for dev in fn.osdevs:
        model = dev.infos.get("GPUModel")
        if model:
            return model.strip()
    vendor, device = fn.infos.get("PCIVendor", "").strip(), fn.infos.get("PCIDevice", "").strip()
    if vendor and not device and fn.device_id:
        device = f"device {fn.device_id}"
    if vendor or device:
        return f"{vendor} {device}".strip()
    return fn.subtype or ""


def _hwloc_kind(fn: _Fn) -> NodeKind:
    """A function's kind, using what hwloc's OS devices add to the class code."""
    cc = (fn.class_code or "").lower()
    gpu_os = any(_GPU_OSDEV.match(d.name) or (d.subtype or "").lower() in _GPU_SUBTYPES
                 for d in fn.osdevs)
    net_os = any("network" in d.categories or "openfabrics" in d.categories
                 or _NET_OSDEV.match(d.name) for d in fn.osdevs)
    if cc.startswith("03"):
        # A VGA function is a GPU if a compute API saw it, or it is NVIDIA's, or
        # its name says so; a server's management VGA (ATI ES1000, Matrox, ASPEED) is not.
        if cc == "0302" or gpu_os or fn.vendor_id == "10de" or _GPU_NAME.search(_function_name(fn)):
            return NodeKind.GPU
        return NodeKind.OTHER
    if gpu_os and (cc.startswith("12") or not cc):
        return NodeKind.GPU
    if cc.startswith("02") or cc == "0c06" or (net_os and not cc.startswith("01")):
        return NodeKind.NIC  # 0c06: InfiniBand controller (ConnectX-2 VPI and older)
    return classify(PciFunction(fn.address, class_code=fn.class_code, vendor_id=fn.vendor_id,
                                name=_function_name(fn)))


_RANK = {NodeKind.GPU: 0, NodeKind.NVME: 1, NodeKind.NIC: 2, NodeKind.OTHER: 3}


def _fix_kinds(topo: Topology, walk: _Walk) -> None:
    for node in topo.nodes():
        addrs = node.attrs.get("functions")
        if node.kind not in _RANK or not addrs:
            continue
        kinds = [_hwloc_kind(walk.fns[a]) for a in addrs if a in walk.fns]
        if not kinds:
            continue
        kind = min(kinds, key=lambda k: _RANK.get(k, 9))
        if kind != node.kind:
            topo.replace_node(Node(node.id, kind, node.name, node.bus_address, node.numa_node,
                                   node.vendor_id, node.device_id, node.attrs))


