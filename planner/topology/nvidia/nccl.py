"""Build a topology from an NCCL topology XML file.

NCCL reads a machine description from ``NCCL_TOPO_FILE`` and writes the one
it detected to ``NCCL_TOPO_DUMP_FILE``. Cloud vendors ship hand-written ones
for their VMs. The format (NCCL ``src/graph/xml.cc``)::

    <system version="1">
      <cpu numaid="0" affinity="..." arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
        <pci busid="ffff:ff:01.0" class="0x060400" vendor="0xffff" device="0xffff"
             link_speed="8 GT/s" link_width="16">            <!-- a PCIe switch -->
          <pci busid="0000:10:1c.0" class="0x030200" vendor="0x10de" device="0x20b0"
               link_speed="8 GT/s" link_width="16">
            <gpu dev="0" sm="80" rank="0" gdr="1">
              <nvlink target="0000:10:1d.0" count="12" tclass="0x030200"/>
            </gpu>
          </pci>
          <pci busid="0000:10:1b.0" class="0x020000" ...>
            <nic><net name="mlx5_0" dev="0" speed="200000" port="1" gdr="1"/></nic>
          </pci>
        </pci>
      </cpu>
    </system>

A ``cpu`` is a NUMA node (NCCL's own words), so each becomes a socket
numbered by ``numaid``. A ``pci`` element with ``pci`` children is a PCIe
switch: NCCL keeps a switch's upstream port and drops its downstream ports
and the root ports, so the children hang straight below it. Vendor files
use fake switches (``ffff:ff:0N.0``, vendor ``0xffff``) that stand for a
real switch the VM cannot see; they become switch nodes with
``attrs["virtual"] = True``. Class ``0x03....`` (or a ``gpu`` child) is a
GPU, ``0x02....`` (or a ``nic`` child) a NIC, ``link_speed``/``link_width``
the link's generation and width.

**NVLink.** A ``<nvlink target= count= tclass=>`` below a GPU is ``count``
links to the target: another GPU (``tclass="0x03..."``), an NVSwitch
(``0x068000``; all NVSwitches become one node ``nvswitch``, as NCCL itself
models them, because the fabric joins every GPU to every other) or the CPU
(``0x068001``, IBM's NVLink bridge; see :func:`~planner.topology.hwloc.links.add_cpu_nvlink`).
Capacity per direction is ``count`` × NCCL's per-link figure for the GPU's
compute capability (``sm``), :data:`NVLINK_GB_PER_S` (NCCL ``topo.h``,
figures it uses for its own bandwidth model), flagged
``bandwidth_source="nccl-nvlink-table"``. A ``<c2c bw= count=>`` (Grace
Hopper) is an NVLink-C2C of ``bw`` MB/s per link to the CPU.

>>> xml = '''<system version="1">
...   <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
...     <pci busid="0000:01:00.0" class="0x030200" vendor="0x10de" device="0x20b0"
...          link_speed="16 GT/s" link_width="16">
...       <gpu dev="0" sm="80" rank="0" gdr="1">
...         <nvlink target="0000:02:00.0" count="12" tclass="0x030200"/>
...       </gpu>
...     </pci>
...     <pci busid="0000:02:00.0" class="0x030200" link_speed="16 GT/s" link_width="16">
...       <gpu dev="1" sm="80" rank="1" gdr="1"/>
...     </pci>
...   </cpu>
... </system>'''
>>> topo = parse_nccl_topo(xml, "toy.xml")
>>> topo.counts()["gpu"], topo.link_between("pci:0000:01:00.0", "socket0").pcie_gen
(2, 4)
>>> nv = topo.link_between("pci:0000:01:00.0", "pci:0000:02:00.0")
>>> nv.kind.value, nv.bytes_per_s / 1e9, nv.bandwidth_source
('nvlink', 240.0, 'nccl-nvlink-table')
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from momentbase.jsontypes import JsonObject
from planner.errors import ParseError
from planner.topology.hwloc.links import add_cpu_nvlink
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import GT_PER_S
from planner.topology.pcitree import (
    PciFunction,
    add_memory_and_interconnect,
    build_pci_topology,
    classify,
)
from planner.topology.xmlsafe import XmlDocument, build_from_xml

__all__ = ["NVLINK_GB_PER_S", "nvlink_bytes_per_s", "parse_nccl_topo"]

#: NCCL's NVLink bandwidth per link and direction in GB/s, keyed by the lowest
#: compute capability (``sm``) it applies to; ``86`` (Ampere GA10x, the
#: RTX A6000's NVLink bridge) is an exact match, the others hold up to the
#: next key. From NCCL ``src/graph/topo.h`` (``SM60_NVLINK_BW`` ...
#: ``SM100_NVLINK_BW``): the effective figures NCCL models with, about 0.8
#: of the signalling rate (NVLink 3 signals 25 GB/s per link and direction).
#: A GPU without ``sm`` gets 20 GB/s, as in NCCL.
NVLINK_GB_PER_S: dict[int, float] = {
    100: 40.1,  # Blackwell, NVLink 5
    90: 20.6,  # Hopper, NVLink 4
    86: 12.0,  # Ampere GA10x
    80: 20.0,  # A100, NVLink 3
    70: 20.0,  # V100, NVLink 2
    60: 18.0,  # P100, NVLink 1
}
_NVLINK_DEFAULT_GB_PER_S = 20.0

NVSWITCH_NODE = "nvswitch"

_DEVICE_KINDS = (NodeKind.GPU, NodeKind.NIC, NodeKind.OTHER, NodeKind.NVME)
_CLASS_NVSWITCH = "0x068000"
_CLASS_CPU_BRIDGE = "0x068001"  # IBM POWER NVLink bridge: the peer is the CPU

_BUSID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_HEX = re.compile(r"^(?:0[xX])?([0-9a-fA-F]{1,8})$")
_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s", re.I)
_INT = re.compile(r"^[+-]?(?:0[xX][0-9a-fA-F]{1,15}|\d{1,18})$")  # NCCL reads ints with strtol(s, 0)


def nvlink_bytes_per_s(sm: int | None) -> float:
    """NCCL's per-link, per-direction NVLink bandwidth for compute capability ``sm``, in bytes/s.

    >>> nvlink_bytes_per_s(80) / 1e9, nvlink_bytes_per_s(90) / 1e9, nvlink_bytes_per_s(None) / 1e9
    (20.0, 20.6, 20.0)
    """
    gb = _NVLINK_DEFAULT_GB_PER_S
    if sm is not None:
        if sm == 86:
            gb = NVLINK_GB_PER_S[86]
        else:
            gb = next((NVLINK_GB_PER_S[k] for k in sorted(NVLINK_GB_PER_S, reverse=True)
                       if k != 86 and sm >= k), _NVLINK_DEFAULT_GB_PER_S)
    return gb * 1e9


@dataclass
class _Pci:
    """One ``pci`` element."""

    address: str
    line: int | None
    elem: ET.Element
    numa: int | None
    parent: str | None
    nccl_class: str | None
    vendor_id: str | None
    device_id: str | None
    subsystem: str | None
    link: tuple[int, int] | None
    is_bridge: bool
    gpu: ET.Element | None = None
    nets: list[JsonObject] = field(default_factory=list)
    has_nic: bool = False
    pcilinks: list[str] = field(default_factory=list)


def parse_nccl_topo(text: str, source: str) -> Topology:
    """The topology an NCCL topology XML ``text`` (read from ``source``) describes.

    Raises :class:`ParseError` for anything that is not an NCCL ``<system>``
    file or that contradicts itself (a bus id twice, an unreadable number).
    """
    return build_from_xml(text, source, _parse, "a consistent NCCL topology")


def _parse(doc: XmlDocument, source: str) -> Topology:
    root = doc.root
    if root.tag != "system":
        raise ParseError(source, doc.line(root),
                         "an NCCL topology <system> root element (NCCL_TOPO_FILE format)",
                         f"<{root.tag}>")
    if root.get("version") is not None:
        _int(doc, root, "version", source)
    cpus = [c for c in root if c.tag == "cpu"]
    if not cpus:
        raise ParseError(source, doc.line(root), "a <cpu numaid=...> element inside <system>",
                         doc.line_text(doc.line(root)))

    pcis: dict[str, _Pci] = {}
    cpu_info: dict[int | None, JsonObject] = {}
    loose_nics: list[tuple[int | None, ET.Element]] = []
    for cpu in cpus:
        numa = _int(doc, cpu, "numaid", source, required=True)
        if numa is not None and numa < 0:  # sysfs says -1 on machines without NUMA
            numa = 0 if len(cpus) == 1 else None
        if numa in cpu_info and numa is not None:
            raise ParseError(source, doc.line(cpu), f"one <cpu> with numaid {numa}",
                             doc.line_text(doc.line(cpu)))
        cpu_info[numa] = {k: v for k, v in (
            ("cpu_vendor", cpu.get("vendor")), ("arch", cpu.get("arch")),
            ("family_id", cpu.get("familyid")), ("model_id", cpu.get("modelid")),
            ("affinity", cpu.get("affinity")),
        ) if v}
        for child in cpu:
            if child.tag == "pci":
                _walk_pci(doc, child, numa, pcis, source)
            elif child.tag == "nic":
                loose_nics.append((numa, child))

    name = (root.get("name") or "").strip()
    functions = [_pci_function(p) for p in pcis.values()]
    if functions:
        topo = build_pci_topology(functions, name=name, source=source)
    else:
        topo = Topology(name=name, sources=[source])
    _complete_sockets(topo, cpu_info)
    _fix_nodes(topo, pcis)
    unknown = sorted(p.address for p in pcis.values()
                     if not p.nccl_class and not p.is_bridge and p.gpu is None and not p.has_nic)
    if unknown:
        topo.notes.append(
            f"{len(unknown)} <pci> element(s) give no class and no <gpu>/<nic> child ({', '.join(unknown)}): "
            "kept as devices of unknown kind (NCCL reads the class from sysfs at run time; "
            'add class="0x030200" to a GPU\'s <pci> for the planner)')
    for numa, nic in loose_nics:
        _add_loose_nic(topo, doc, nic, numa, source)
    _add_nvlinks(topo, doc, pcis, source)
    return topo


def _walk_pci(doc: XmlDocument, top: ET.Element, numa: int | None, pcis: dict[str, _Pci],
              source: str) -> None:
    stack: list[tuple[ET.Element, str | None]] = [(top, None)]
    while stack:
        elem, parent = stack.pop()
        line = doc.line(elem)
        busid = elem.get("busid")
        if busid is None:
            raise ParseError(source, line, 'a <pci busid="0000:00:00.0"> attribute',
                             doc.line_text(line))
        address = _busid(busid, source, line)
        if address in pcis:
            raise ParseError(source, line, f"PCI device {address} only once", busid)
        nccl_class = elem.get("class")
        if nccl_class is not None and not _HEX.match(nccl_class.strip()):
            raise ParseError(source, line, 'class like "0x030200"', nccl_class)
        children = [c for c in elem if c.tag == "pci"]
        cls = (nccl_class or "").strip().lower()
        rec = _Pci(
            address, line, elem, numa, parent, cls or None,
            _hex4(doc, elem, "vendor", source), _hex4(doc, elem, "device", source), None,
            _link(doc, elem, source), bool(children) or cls.startswith("0x0604"),
        )
        sv, sd = _hex4(doc, elem, "subsystem_vendor", source), _hex4(doc, elem, "subsystem_device", source)
        if sv and sd:
            rec.subsystem = f"{sv}:{sd}"
        for child in elem:
            if child.tag == "gpu" and rec.gpu is None:
                rec.gpu = child
            elif child.tag == "nic":
                rec.has_nic = True
                rec.nets.extend(_net(doc, n, source) for n in child if n.tag == "net")
            elif child.tag == "pcilink" and child.get("target"):
                rec.pcilinks.append(_busid(child.get("target", ""), source, doc.line(child)))
        pcis[address] = rec
        stack.extend((c, address) for c in reversed(children))


def _pci_function(p: _Pci) -> PciFunction:
    digits = (p.nccl_class or "")[2:] if (p.nccl_class or "").startswith("0x") else (p.nccl_class or "")
    class_code = digits[:4] if len(digits) >= 4 else None
    attrs: JsonObject = {}
    if p.nccl_class:
        attrs["nccl_class"] = p.nccl_class
    elif not p.is_bridge:
        # NCCL reads a missing class from sysfs at run time, so files leave it
        # out; what the element holds says what NCCL will make of it.
        if p.gpu is not None:
            class_code = "0302"
        elif p.has_nic:
            class_code = "0200"
        attrs["class_given"] = False  # a device the file names, not a chipset function
    if p.subsystem:
        attrs["subsystem"] = p.subsystem
    if _is_virtual(p):
        attrs["virtual"] = True
    return PciFunction(
        p.address, class_code=class_code, vendor_id=p.vendor_id, device_id=p.device_id,
        name=_name(p), is_bridge=p.is_bridge, port_type="upstream" if p.is_bridge else None,
        link_cap=p.link, numa_node=p.numa, parent=p.parent, attrs=attrs,
    )


def _is_virtual(p: _Pci) -> bool:
    """A device a vendor file made up: vendor 0xffff, or the fake bus ``ffff:ff``."""
    return p.vendor_id == "ffff" or p.address.startswith("ffff:ff:")


def _name(p: _Pci) -> str:
    ids = f" {p.vendor_id}:{p.device_id}" if p.vendor_id and p.device_id else ""
    if p.is_bridge:
        return "virtual PCIe switch" if _is_virtual(p) else f"PCIe switch{ids}"
    kind = _kind(p)
    label = {NodeKind.GPU: "GPU", NodeKind.NIC: "NIC"}.get(kind, "PCI device")
    if p.nccl_class == _CLASS_NVSWITCH:
        label = "NVSwitch"
    elif not p.nccl_class and kind == NodeKind.OTHER:
        label = "PCI device (class not given)"
    return f"{label}{ids}"


def _kind(p: _Pci) -> NodeKind:
    """A device's kind the way NCCL reads it: a <gpu> or <nic> child, else the class prefix."""
    cls = p.nccl_class or ""
    if p.gpu is not None or cls.startswith("0x03"):
        return NodeKind.GPU
    if p.has_nic or cls.startswith("0x02"):
        return NodeKind.NIC
    digits = cls[2:] if cls.startswith("0x") else cls
    return classify(PciFunction(p.address, class_code=digits[:4] if len(digits) >= 4 else None,
                                vendor_id=p.vendor_id))


def _fix_nodes(topo: Topology, pcis: dict[str, _Pci]) -> None:
    """Kinds as NCCL sees them, GPU and NIC details, virtual switches."""
    for node in topo.nodes():
        if node.kind == NodeKind.SWITCH:
            p = pcis.get(node.bus_address or "")
            if p is not None:
                extra: JsonObject = {}
                if _is_virtual(p):
                    extra["virtual"] = True
                if p.pcilinks:
                    extra["pcilinks"] = p.pcilinks
                if extra:
                    topo.replace_node(node.with_attrs(**extra))
            continue
        p = pcis.get(node.bus_address or "")
        if p is None:
            continue
        attrs = dict(node.attrs)
        if p.gpu is not None:
            attrs.update(_gpu_attrs(p.gpu))
        if p.nets:
            attrs["nets"] = p.nets
            speeds = [n["speed_mbps"] for n in p.nets if isinstance(n.get("speed_mbps"), int)
                      and n["speed_mbps"] > 0]
            if speeds:
                attrs["net_bytes_per_s"] = sum(speeds) * 1e6 / 8
        kind = _kind(p) if node.kind in _DEVICE_KINDS else node.kind
        if kind != node.kind or attrs != dict(node.attrs):
            topo.replace_node(Node(node.id, kind, node.name, node.bus_address, node.numa_node,
                                   node.vendor_id, node.device_id, attrs))


def _gpu_attrs(gpu: ET.Element) -> JsonObject:
    out: JsonObject = {}
    for attr, key in (("dev", "cuda_dev"), ("sm", "sm"), ("rank", "rank"), ("gdr", "gdr")):
        value = gpu.get(attr)
        if value is not None and _INT.match(value.strip()):
            out[key] = _to_int(value, "", None, attr)
    return out


def _complete_sockets(topo: Topology, cpu_info: dict[int | None, JsonObject]) -> None:
    for numa in sorted(n for n in cpu_info if n is not None):
        sid = f"socket{numa}"
        if sid not in topo:
            topo.add_node(Node(sid, NodeKind.SOCKET, f"socket {numa}", numa_node=numa,
                               attrs={"numa_nodes": [numa]}))
    add_memory_and_interconnect(topo)
    for numa, info in cpu_info.items():
        sid = f"socket{numa}" if numa is not None else "socket?"
        if sid in topo and info:
            topo.replace_node(topo.node(sid).with_attrs(**info))


def _add_loose_nic(topo: Topology, doc: XmlDocument, nic: ET.Element, numa: int | None,
                   source: str) -> None:
    """A ``nic`` straight under a ``cpu``: a network device with no PCI path (virtual, or unseen)."""
    nets = [_net(doc, n, source) for n in nic if n.tag == "net"]
    sid = f"socket{numa}" if numa is not None else "socket?"
    if sid not in topo:
        topo.add_node(Node(sid, NodeKind.SOCKET, "socket (unknown: no NUMA node given)",
                           attrs={"inferred": True}))
    index = sum(1 for n in topo.nodes(NodeKind.NIC) if n.id.startswith(f"nic:{sid}:"))
    nid = f"nic:{sid}:{index}"
    attrs: JsonObject = {"nets": nets, "virtual": True}
    speeds = [n["speed_mbps"] for n in nets if isinstance(n.get("speed_mbps"), int)
              and n["speed_mbps"] > 0]
    if speeds:
        attrs["net_bytes_per_s"] = sum(speeds) * 1e6 / 8
    label = ", ".join(str(n.get("name")) for n in nets if n.get("name")) or "network device"
    topo.add_node(Node(nid, NodeKind.NIC, label, numa_node=numa, attrs=attrs))
    topo.add_link(Link(sid, nid, LinkKind.PCIE, None, attrs={"virtual": True}))


# -- NVLink ----------------------------------------------------------------------


def _add_nvlinks(topo: Topology, doc: XmlDocument, pcis: dict[str, _Pci], source: str) -> None:
    missing = unknown = 0
    to_nvswitch: dict[str, tuple[int, float, list[str]]] = {}
    counts: dict[frozenset[str], int] = {}
    default_sm = False
    for p in pcis.values():
        if p.gpu is None:
            continue
        gpu_node = topo.find(p.address)
        if gpu_node is None:
            continue
        sm = _int(doc, p.gpu, "sm", source)
        default_sm = default_sm or sm is None
        per_link = nvlink_bytes_per_s(sm)
        for nv in p.gpu:
            line = doc.line(nv)
            if nv.tag == "c2c":
                bw = _int(doc, nv, "bw", source, required=True)
                count = _int(doc, nv, "count", source, required=True)
                if not bw or not count or bw < 0 or count < 0:
                    continue
                _cpu_link(topo, gpu_node.id, bw * count * 1e6, "nccl-xml",
                          {"c2c": True, "count": count, "mb_per_s_per_link": bw})
                continue
            if nv.tag != "nvlink":
                continue
            count = _int(doc, nv, "count", source, required=True)
            if count is None or count < 1:
                raise ParseError(source, line, "an NVLink count of at least 1", nv.get("count"))
            target = nv.get("target", "")
            tclass = (nv.get("tclass") or "").strip().lower()
            peer = None
            if _BUSID.match(target.strip()):
                peer = topo.find(_busid(target, source, line))
            if tclass.startswith("0x03") or (not tclass and peer is not None
                                            and peer.kind == NodeKind.GPU):
                if not _BUSID.match(target.strip()):
                    raise ParseError(source, line, "an NVLink target like 0000:07:00.0", target)
                if peer is None or peer.id == gpu_node.id:
                    missing += 1
                    continue
                key = frozenset((gpu_node.id, peer.id))
                if key in counts:
                    if counts[key] != count:
                        topo.notes.append(f"NVLink {gpu_node.id}–{peer.id}: the two GPUs report "
                                          f"{counts[key]} and {count} links; kept {counts[key]}")
                    continue
                existing = topo.link_between(gpu_node.id, peer.id)
                if existing is not None:
                    missing += 1
                    continue
                counts[key] = count
                topo.add_link(Link(gpu_node.id, peer.id, LinkKind.NVLINK, count * per_link,
                                   bandwidth_source="nccl-nvlink-table",
                                   attrs={"count": count, "per_link_bytes_per_s": per_link}))
            elif tclass == _CLASS_CPU_BRIDGE:
                _cpu_link(topo, gpu_node.id, count * per_link, "nccl-nvlink-table",
                          {"count": count, "per_link_bytes_per_s": per_link})
            elif tclass.startswith("0x0680") or not tclass:
                n, bw, targets = to_nvswitch.get(gpu_node.id, (0, 0.0, []))
                to_nvswitch[gpu_node.id] = (n + count, bw + count * per_link, [*targets, target])
            else:
                unknown += 1
    if to_nvswitch:
        targets = sorted({t for _, _, ts in to_nvswitch.values() for t in ts})
        topo.add_node(Node(NVSWITCH_NODE, NodeKind.OTHER, "NVSwitch fabric",
                           vendor_id="10de",
                           attrs={"role": "nvswitch-fabric", "targets": targets}))
        for gid, (n, bw, _) in to_nvswitch.items():
            topo.add_link(Link(NVSWITCH_NODE, gid, LinkKind.NVLINK, bw,
                               bandwidth_source="nccl-nvlink-table", attrs={"count": n}))
    if missing:
        topo.notes.append(f"{missing} NVLink(s) name a GPU that is not in the file; left out")
    if unknown:
        topo.notes.append(f"{unknown} NVLink(s) go to a device class the planner does not know; "
                          "left out")
    if default_sm and (counts or to_nvswitch):
        topo.notes.append("some GPUs have no sm attribute: their NVLinks are sized with NCCL's "
                          "default of 20 GB/s per link")


def _cpu_link(topo: Topology, gpu_id: str, bytes_per_s: float, bandwidth_source: str,
              attrs: JsonObject) -> None:
    sock = topo.socket_of(gpu_id)
    if sock is None or sock.id == "socket?":
        topo.notes.append(f"NVLink of {gpu_id} to its CPU left out: its socket is unknown")
        return
    if topo.link_between(f"nvlink:{sock.id}", gpu_id) is not None:
        topo.notes.append(f"a second NVLink of {gpu_id} to its CPU was left out")
        return
    add_cpu_nvlink(topo, gpu_id, sock.id, bytes_per_s, bandwidth_source, **attrs)


# -- small readers ---------------------------------------------------------------


def _net(doc: XmlDocument, net: ET.Element, source: str) -> JsonObject:
    out: JsonObject = {}
    if net.get("name") is not None:
        out["name"] = net.get("name")
    for attr, key in (("dev", "dev"), ("speed", "speed_mbps"), ("port", "port"), ("gdr", "gdr")):
        value = _int(doc, net, attr, source)
        if value is not None:
            out[key] = value
    return out


def _int(doc: XmlDocument, elem: ET.Element, attr: str, source: str,
         required: bool = False) -> int | None:
    value = elem.get(attr)
    if value is None:
        if required:
            raise ParseError(source, doc.line(elem), f"a {attr} attribute on <{elem.tag}>",
                             doc.line_text(doc.line(elem)))
        return None
    return _to_int(value, source, doc.line(elem), attr)


def _to_int(value: str, source: str, line: int | None, attr: str) -> int:
    v = value.strip()
    if not _INT.match(v):
        raise ParseError(source, line, f"{attr} as a whole number", value)
    sign = -1 if v.startswith("-") else 1
    digits = v.lstrip("+-")
    return sign * (int(digits[2:], 16) if digits[:2].lower() == "0x" else int(digits))


def _hex4(doc: XmlDocument, elem: ET.Element, attr: str, source: str) -> str | None:
    value = elem.get(attr)
    if value is None:
        return None
    m = _HEX.match(value.strip())
    if not m or int(m.group(1), 16) > 0xFFFF:
        raise ParseError(source, doc.line(elem), f'{attr} like "0x10de"', value)
    return f"{int(m.group(1), 16):04x}"


def _link(doc: XmlDocument, elem: ET.Element, source: str) -> tuple[int, int] | None:
    speed, width = elem.get("link_speed"), elem.get("link_width")
    gen = None
    if speed is not None and speed.strip() and not speed.strip().lower().startswith("unknown"):
        m = _SPEED.match(speed)
        rate = float(m.group(1)) if m else None
        gen = next((g for g, r in GT_PER_S.items() if rate is not None and abs(r - rate) < 1e-6), None)
        if gen is None:
            raise ParseError(source, doc.line(elem), 'link_speed like "16 GT/s"', speed)
    lanes = None
    if width is not None:
        if not width.strip().isdigit() or len(width.strip()) > 3:
            raise ParseError(source, doc.line(elem), "link_width as a number of lanes", width)
        lanes = int(width) or None  # 0: sysfs did not say
    return (gen, lanes) if gen and lanes else None


def _busid(text: str, source: str, line: int | None) -> str:
    m = _BUSID.match(text.strip())
    if not m:
        raise ParseError(source, line, "a PCI bus id like 0000:85:02.0", text)
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"
