"""Links hwloc's XML gives beyond the tree: PCIe capacities from link speeds, NVLinks from distances."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from planner.errors import ParseError
from planner.topology.hwloc.elements import (
    _GBPS_TOLERANCE,
    _PACKAGE_TYPES,
    NVLINK_MATRIX,
    _req_int,
    _Walk,
)
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import DEFAULT_EFFICIENCY, ENCODING, GT_PER_S, VALID_WIDTHS
from planner.topology.xmlsafe import XmlDocument

__all__ = ["add_cpu_nvlink", "pcie_links_for_gb_per_s"]


# -- PCIe capacities -------------------------------------------------------------


def pcie_links_for_gb_per_s(gb_per_s: float) -> list[tuple[int, int]]:
    """The (generation, lanes) pairs whose raw rate is ``gb_per_s`` GB/s (hwloc's figure).

    >>> pcie_links_for_gb_per_s(15.753846)
    [(3, 16), (4, 8), (5, 4)]
    >>> pcie_links_for_gb_per_s(0.25)
    [(1, 1)]
    """
    out = []
    for gen, rate in GT_PER_S.items():
        for lanes in VALID_WIDTHS:
            raw = lanes * rate * ENCODING[gen] / 8
            if abs(raw - gb_per_s) <= _GBPS_TOLERANCE * max(gb_per_s, 1e-9):
                out.append((gen, lanes))
    return out


def _set_pcie_capacities(topo: Topology, walk: _Walk) -> None:
    ambiguous = 0
    for lk in topo.links(LinkKind.PCIE):
        dst = topo.node(lk.dst)
        addr = dst.bus_address
        if addr is None or addr not in walk.fns:
            continue
        fn = walk.fns[addr]
        figures = [fn.gb_per_s]
        if fn.parent is not None:
            figures.append(walk.fns[fn.parent].gb_per_s)
        known = [f for f in figures if f]
        if not known:
            continue
        raw = min(known)
        pairs = pcie_links_for_gb_per_s(raw)
        attrs = {**lk.attrs, "hwloc_gb_per_s": raw}
        if len(pairs) == 1:
            new = Link.pcie(lk.src, lk.dst, pairs[0][0], pairs[0][1], **attrs)
        else:
            ambiguous += 1
            new = Link(lk.src, lk.dst, LinkKind.PCIE, raw * 1e9 * DEFAULT_EFFICIENCY,
                       bandwidth_source="hwloc", attrs=attrs)
        topo.replace_link(new)
    if ambiguous:
        topo.notes.append(
            f"{ambiguous} PCIe link(s) sized from hwloc's pci_link_speed (GB/s of the link as "
            f"negotiated at capture time) × {DEFAULT_EFFICIENCY} protocol efficiency; their "
            "generation and width are not recoverable from the figure"
        )


# -- NVLink ----------------------------------------------------------------------


def add_cpu_nvlink(topo: Topology, device_id: str, socket_id: str, bytes_per_s: float,
                   bandwidth_source: str, **attrs: Any) -> Link:
    """Join ``device_id`` to the NVLink port of socket ``socket_id`` (created on first use).

    The port node ``nvlink:<socket>`` (kind ``other``) stands for the CPU's
    NVLink unit (IBM's NPU, NVLink-C2C on Grace): the device usually also
    has a PCIe link to the same socket and a topology keeps one link per
    pair of nodes. The port's own link to the socket is kept at the sum of
    the NVLinks behind it, so that it never limits a flow.

    >>> t = Topology("t")
    >>> for n in (Node("socket0", NodeKind.SOCKET), Node("g", NodeKind.GPU)):
    ...     _ = t.add_node(n)
    >>> _ = add_cpu_nvlink(t, "g", "socket0", 40e9, "hwloc")
    >>> t.link_between("nvlink:socket0", "socket0").bytes_per_s
    40000000000.0
    """
    port = f"nvlink:{socket_id}"
    if port not in topo:
        sock = topo.node(socket_id)
        topo.add_node(Node(port, NodeKind.OTHER, f"NVLink port of {sock.label}",
                           numa_node=sock.numa_node,
                           attrs={"role": "cpu-nvlink-port", "socket": socket_id}))
    link = topo.add_link(Link(port, device_id, LinkKind.NVLINK, bytes_per_s,
                              bandwidth_source=bandwidth_source, attrs=dict(attrs)))
    total = sum(lk.bytes_per_s or 0.0 for lk in topo.links(LinkKind.NVLINK)
                if port in lk.key and socket_id not in lk.key)
    up = Link(socket_id, port, LinkKind.NVLINK, total, bandwidth_source=bandwidth_source,
              attrs={"internal": True})
    if topo.link_between(socket_id, port) is None:
        topo.add_link(up)
    else:
        topo.replace_link(up)
    return link


def _add_nvlinks(topo: Topology, doc: XmlDocument, dist: ET.Element, walk: _Walk,
                 numa_to_socket: Mapping[int, int], source: str) -> None:
    line = doc.line(dist)
    nb = _req_int(doc, dist, "nbobjs", source)
    if not 1 <= nb <= 4096:
        raise ParseError(source, line, "nbobjs between 1 and 4096", dist.get("nbobjs"))
    tokens = " ".join(i.text or "" for i in dist.findall("indexes")).split()
    values_text = " ".join(v.text or "" for v in dist.findall("u64values")).split()
    if len(tokens) != nb or len(values_text) != nb * nb:
        raise ParseError(source, line,
                         f"{nb} indexes and {nb * nb} u64values in the {NVLINK_MATRIX} matrix",
                         f"{len(tokens)} indexes, {len(values_text)} values")
    values = []
    for v in values_text:
        if not v.isdigit():
            raise ParseError(source, line, "non-negative whole numbers (MB/s) in u64values", v)
        values.append(int(v))

    ends: list[str | None] = []
    for tok in tokens:
        if dist.tag == "distances2hetero":
            otype, _, num = tok.partition(":")
            indexing = "gp"
        else:
            otype, num, indexing = dist.get("type", ""), tok, dist.get("indexing", "os")
        if not num.isdigit():
            raise ParseError(source, line, "object indexes like 'OSDev:332'", tok)
        ends.append(_resolve(topo, walk, otype, int(num), indexing, numa_to_socket))

    unresolved = sum(e is None for e in ends)
    added = 0
    via_switch = False
    for i in range(nb):
        for j in range(i + 1, nb):
            a, b = ends[i], ends[j]
            vij, vji = values[i * nb + j], values[j * nb + i]
            mbps = min(vij, vji) if vij and vji else max(vij, vji)
            if not mbps or a is None or b is None or a == b:
                continue
            na, nb_ = topo.node(a), topo.node(b)
            attrs = {"hwloc_mb_per_s": mbps}
            if na.kind == NodeKind.SOCKET and nb_.kind == NodeKind.SOCKET:
                continue  # not an NVLink hwloc reports; ignore
            if NodeKind.SOCKET in (na.kind, nb_.kind):
                sock, dev = (a, b) if na.kind == NodeKind.SOCKET else (b, a)
                if topo.link_between(f"nvlink:{sock}", dev) is None:
                    add_cpu_nvlink(topo, dev, sock, mbps * 1e6, "hwloc", **attrs)
                    added += 1
                continue
            existing = topo.link_between(a, b)
            if existing is not None:
                if existing.kind != LinkKind.NVLINK:
                    topo.notes.append(f"hwloc NVLink {a}–{b} not added: they are already "
                                      f"joined by a {existing.kind} link")
                continue
            topo.add_link(Link(a, b, LinkKind.NVLINK, mbps * 1e6, bandwidth_source="hwloc",
                               attrs=attrs))
            added += 1
            via_switch = via_switch or na.kind != nb_.kind
    if unresolved:
        topo.notes.append(f"{unresolved} object(s) of hwloc's {NVLINK_MATRIX} matrix match no "
                          "node; their NVLinks are left out")
    if via_switch:
        topo.notes.append("hwloc reports GPU–NVSwitch NVLinks only: links between NVSwitches "
                          "(e.g. between two baseboards) are not in the matrix")


def _resolve(topo: Topology, walk: _Walk, otype: str, num: int, indexing: str,
             numa_to_socket: Mapping[int, int]) -> str | None:
    """The node id an object of a distances matrix stands for."""
    if indexing == "gp":
        kind, value = walk.gp.get(num, (None, None))
    elif otype in _PACKAGE_TYPES:
        kind, value = "package", num
    elif otype == "NUMANode":
        kind, value = "numa", num
    else:
        return None
    if kind == "package":
        sid = f"socket{value}"
    elif kind == "numa":
        sid = f"socket{numa_to_socket.get(value, value)}"
    elif kind in ("pci", "osdev") and value is not None:
        node = topo.find(value)
        return node.id if node is not None else None
    else:
        return None
    return sid if sid in topo else None
