"""``nvidia-smi topo -m``: the connection matrix of GPUs and NICs.

The command prints one row and one column per device (``GPU0``…, ``NIC0``…,
or ``mlx5_0``… in older drivers), each cell naming what lies between two
devices, then the CPU and NUMA affinity of each GPU, a legend and a NIC
legend::

            GPU0    GPU1    NIC0    NIC1    CPU Affinity    NUMA Affinity   GPU NUMA ID
    GPU0     X      PHB     NODE    NODE    0-23    0               N/A
    ...

Cells, from nearest to farthest: ``X`` (self), ``NV#`` (a bonded set of #
NVLinks), ``PIX`` (at most one PCIe bridge), ``PXB`` (several bridges, no
host bridge), ``PHB`` (through a PCIe host bridge, i.e. the CPU's root
complex), ``NODE`` (between host bridges of one NUMA node) and ``SYS``
(across the inter-socket link; ``SOC`` in old drivers).

:func:`parse_nvidia_smi_topo` reads the text (tab-separated as printed, or
space-aligned as pasted into documents) into a :class:`TopoMatrix`;
:func:`topology_from_nvidia_smi` makes a coarse :class:`Topology` from the
matrix alone, and :func:`apply_nvidia_smi` adds the matrix's NVLink links to
a topology built from the PCI tree of the same machine.

>>> text = '''\\tGPU0\\tGPU1\\tCPU Affinity\\tNUMA Affinity
... GPU0\\t X \\tNV4\\t0-15\\t0
... GPU1\\tNV4\\t X \\t0-15\\t0
... '''
>>> from planner.topology.nvidia.smi_matrix import parse_nvidia_smi_topo
>>> m = parse_nvidia_smi_topo(text, "topo.txt")
>>> m.relation[("GPU0", "GPU1")], m.nvlink_count("GPU0", "GPU1"), m.numa_node("GPU1")
('NV4', 4, 0)
>>> topo = topology_from_nvidia_smi(m, name="pair", gpu_name="Tesla V100-SXM2-16GB")
>>> lk = topo.links("nvlink")[0]
>>> lk.attrs["nvlink_count"], lk.bytes_per_s / 1e9
(4, 100.0)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from momentbase.jsontypes import JsonObject
from planner.errors import TopologyError
from planner.topology.model import Link, Node, NodeKind, Topology
from planner.topology.nvidia.nvlink import (
    DEFAULT_NVLINK_BYTES_PER_S,
    NvLinkRate,
    nvlink_link,
    nvlink_rate,
)
from planner.topology.nvidia.smi_matrix import (
    TopoMatrix,
)
from planner.topology.pcitree import add_memory_and_interconnect, split_address

_TREE = ("PIX", "PXB")
_SAME_NUMA = ("PIX", "PXB", "PHB", "NODE")


def topology_from_nvidia_smi(
    matrix: TopoMatrix,
    *,
    name: str = "",
    source: str = "",
    gpu_name: str | None = None,
    nvlink_bytes_per_s: float | None = None,
    pcie_links: Mapping[str, tuple[int, int]] | None = None,
    numa_to_socket: Mapping[int, int] | None = None,
) -> Topology:
    """A coarse topology from the matrix when no PCI tree of the machine is known.

    - Sockets come from NUMA affinities, one per NUMA node: the matrix cannot
      tell that several NUMA nodes share a package (AMD NPS2/NPS4), so a
      note says so; ``numa_to_socket`` merges them when the caller knows.
    - Devices joined by ``PIX`` or ``PXB`` share a PCIe switch tree: one
      switch node per connected group (``attrs["inferred"]``; the real tree
      may have several levels). Inside a ``PXB`` group, ``PIX`` pairs get a
      switch of their own below it. ``PIX`` can also be two functions of one
      multi-port card (a dual-port NIC): either way the devices share one
      upstream link, which is what the switch node stands for.
    - ``PHB`` and ``NODE`` put devices directly under the same socket
      (``PHB`` pairs share ``attrs["host_bridge"]``); ``SYS`` separates them.
    - A device without affinity (NIC rows) takes the NUMA node of the
      devices it shares a switch, host bridge or NUMA node with; one that is
      ``SYS`` to everything hangs under ``socket?`` with a note.
    - ``NV#`` gives an NVLink link of ``#`` × the per-link bandwidth of the
      GPU generation (``gpu_name``), or ``nvlink_bytes_per_s`` per link, or
      the 25 GB/s default, with ``bandwidth_source="nvidia-smi-table"``.
    - PCIe links have no known capacity unless ``pcie_links`` gives
      ``(generation, lanes)`` for a device (``{"GPU0": (4, 16)}``).

    Node ids: ``gpu:GPU0``, ``nic:NIC0`` (``other:NAME`` for anything else),
    ``switch:nvsmi0``…, and ``socketN`` where N is the NUMA node (or the
    socket ``numa_to_socket`` maps it to).

    >>> from planner.topology.nvidia.smi_matrix import parse_nvidia_smi_topo
    >>> m = parse_nvidia_smi_topo("  GPU0  GPU1  CPU Affinity  NUMA Affinity\\n"
    ...                           "GPU0  X  PIX  0-7  0\\nGPU1  PIX  X  0-7  0\\n")
    >>> t = topology_from_nvidia_smi(m)
    >>> t.parent("gpu:GPU0").kind.value, t.socket_of("gpu:GPU1").id
    ('switch', 'socket0')
    """
    b = _SmiBuilder(matrix, Topology(name=name, sources=[source] if source else []),
                    pcie_links or {}, numa_to_socket)
    b.group_numa()
    b.sockets()
    add_memory_and_interconnect(b.topo)
    b.devices()
    _add_nvlinks(b.topo, matrix, {d: b.dev_id(d) for d in b.devs}, gpu_name, nvlink_bytes_per_s)
    return b.topo


class _SmiBuilder:
    """One coarse topology in the making from a matrix: groups, their NUMA nodes, sockets, devices."""

    def __init__(self, matrix: TopoMatrix, topo: Topology, pcie_links: Mapping[str, tuple[int, int]],
                 numa_to_socket: Mapping[int, int] | None) -> None:
        self.matrix, self.topo, self.pcie_links = matrix, topo, pcie_links
        self.numa_to_socket = numa_to_socket
        self.devs = list(matrix.devices)
        self.groups = _components(self.devs, lambda a, b: self.rel(a, b) in _TREE)
        self.group_of = {d: k for k, g in enumerate(self.groups) for d in g}
        self.numa_of: dict[int, int] = {}
        self.n_switch = 0

    def rel(self, a: str, b: str) -> str:
        r = self.matrix.relation.get((a, b), "SYS")
        return "SYS" if r == "SOC" else r

    def group_numa(self) -> None:
        """NUMA node of each group: its own devices' affinity, else what PHB/NODE/tree neighbours say."""
        matrix, groups, group_of, numa_of = self.matrix, self.groups, self.group_of, self.numa_of
        for k, g in enumerate(groups):
            known = [n for d in g if (n := matrix.numa_node(d)) is not None]
            if known:
                numa_of[k] = Counter(known).most_common(1)[0][0]
                if len(set(known)) > 1:
                    self.topo.notes.append(f"nvidia-smi: devices {', '.join(g)} share a PCIe tree but report "
                                           f"NUMA nodes {sorted(set(known))}; using {numa_of[k]}")
        changed = True
        while changed:
            changed = False
            for k, g in enumerate(groups):
                if k in numa_of:
                    continue
                votes = [numa_of[group_of[o]] for d in g for o in self.devs
                         if group_of[o] != k and group_of[o] in numa_of and self.rel(d, o) in _SAME_NUMA]
                if votes:
                    numa_of[k] = Counter(votes).most_common(1)[0][0]
                    changed = True

    def socket_id(self, numa: int | None) -> str:
        if numa is None:
            return "socket?"
        return f"socket{self.numa_to_socket.get(numa, numa) if self.numa_to_socket else numa}"

    def sockets(self) -> None:
        """One socket per NUMA node (or as ``numa_to_socket`` merges them), ``socket?`` for the rest."""
        matrix, topo, numa_of, group_of, devs = self.matrix, self.topo, self.numa_of, self.group_of, self.devs
        numa_nodes = sorted(set(numa_of.values()))
        sockets: dict[str, list[int]] = {}
        for n in numa_nodes:
            sockets.setdefault(self.socket_id(n), []).append(n)
        unplaced = [g for k, g in enumerate(self.groups) if k not in numa_of]
        for sid in sorted(sockets, key=lambda s: int(s[len("socket"):])):
            nodes = sockets[sid]
            cpus = sorted({c for d in devs if matrix.numa_node(d) in nodes
                           for c in [matrix.cpu_affinity.get(d)] if c})
            topo.add_node(Node(sid, NodeKind.SOCKET, f"socket {sid[len('socket'):]}",
                               numa_node=nodes[0] if len(nodes) == 1 else None,
                               attrs={"numa_nodes": nodes, "cpu_affinity": cpus, "inferred": True}))
        if unplaced or not sockets:
            topo.add_node(Node("socket?", NodeKind.SOCKET, "socket (unknown: no NUMA affinity)",
                               attrs={"inferred": True}))
        if len(numa_nodes) > 0 and not self.numa_to_socket:
            topo.notes.append(
                f"nvidia-smi: one socket per NUMA node ({', '.join(map(str, numa_nodes))}); the matrix "
                "cannot tell whether several NUMA nodes share a CPU package (AMD NPS2/NPS4)")
        for g in unplaced:
            far = sorted({numa_of[group_of[o]] for d in g for o in devs
                          if group_of[o] in numa_of and self.rel(d, o) == "SYS"})
            where = f"on a NUMA node other than {', '.join(map(str, far))}" if far else "on an unknown NUMA node"
            topo.notes.append(
                f"nvidia-smi: {', '.join(g)} have no NUMA affinity and are SYS to every placed device: "
                f"they sit {where}, which the matrix does not name; placed under 'socket?'")

    def dev_id(self, d: str) -> str:
        return f"{self.matrix.kind(d).value}:{d}"

    def pcie(self, up: str, d: str | None, node_id: str) -> Link:
        gen, lanes = self.pcie_links.get(d, (None, None)) if d else (None, None)
        return Link.pcie(up, node_id, gen, lanes, inferred=True)

    def add_switch(self, members: list[str], evidence: str, up: str, hb: str | None) -> str:
        sid = f"switch:nvsmi{self.n_switch}"
        self.n_switch += 1
        self.topo.add_node(Node(sid, NodeKind.SWITCH, f"switch (inferred from {evidence}: {', '.join(members)})",
                                attrs={"inferred": True, "evidence": evidence, "members": list(members),
                                       **({"host_bridge": hb} if hb else {})}))
        self.topo.add_link(self.pcie(up, None, sid))
        return sid

    def add_device(self, d: str, up: str, hb: str | None) -> None:
        matrix = self.matrix
        label = f"{d} ({matrix.nic_names[d]})" if d in matrix.nic_names else d
        attrs: JsonObject = {"nvidia_smi_name": d}
        for key, table in (("cpu_affinity", matrix.cpu_affinity), ("numa_affinity", matrix.numa_affinity),
                           ("gpu_numa_id", matrix.gpu_numa_id)):
            if table.get(d) is not None:
                attrs[key] = table[d]
        if d in matrix.nic_names:
            attrs["rdma_device"] = matrix.nic_names[d]
        if hb:
            attrs["host_bridge"] = hb
        self.topo.add_node(Node(self.dev_id(d), matrix.kind(d), label, numa_node=matrix.numa_node(d),
                                attrs=attrs))
        self.topo.add_link(self.pcie(up, d, self.dev_id(d)))

    def devices(self) -> None:
        """Devices and inferred switches: one per PIX or PXB group, PIX pairs below a PXB one."""
        groups, rel, topo = self.groups, self.rel, self.topo
        hb_groups = _components(list(range(len(groups))),
                                lambda a, b: any(rel(x, y) == "PHB" for x in groups[a] for y in groups[b]))
        host_bridge = {k: f"hb{h}" for h, ks in enumerate(g for g in hb_groups if len(g) > 1) for k in ks}
        pxb_groups = 0
        for k, g in enumerate(groups):
            up = self.socket_id(self.numa_of.get(k))
            hb = host_bridge.get(k)
            if len(g) == 1:
                self.add_device(g[0], up, hb)
                continue
            has_pxb = any(rel(a, b) == "PXB" for a in g for b in g if a != b)
            if not has_pxb:
                sw = self.add_switch(g, "PIX", up, hb)
                if all(self.matrix.kind(d) == NodeKind.NIC for d in g):
                    topo.notes.append(
                        f"nvidia-smi: {', '.join(g)} are PIX to each other: one switch, or the ports of "
                        f"one multi-port card; either way they share the upstream link of {sw}")
                for d in g:
                    self.add_device(d, sw, None)
                continue
            pxb_groups += 1
            top = self.add_switch(g, "PXB", up, hb)
            for sub in _components(g, lambda a, b: rel(a, b) == "PIX"):
                if len(sub) == 1:
                    self.add_device(sub[0], top, None)
                else:
                    sw = self.add_switch(sub, "PIX", top, None)
                    for d in sub:
                        self.add_device(d, sw, None)
        if pxb_groups:
            topo.notes.append(
                f"nvidia-smi: {pxb_groups} PXB group(s) drawn as one switch each; PXB means several "
                "bridges, so the real tree may have more switch levels")
        if any(self.pcie_links.get(d) is None for d in self.devs):
            topo.notes.append("nvidia-smi: PCIe link widths and speeds are not in the matrix; those links are unknown")


def _components(items: list, joined) -> list[list]:
    """Connected components of ``items`` under the symmetric predicate ``joined``, in item order."""
    parent = {x: x for x in items}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, a in enumerate(items):
        for b in items[i + 1:]:
            if joined(a, b):
                ra, rb = find(a), find(b)
                if ra != rb:
                    parent[rb] = ra
    out: dict = {}
    for x in items:
        out.setdefault(find(x), []).append(x)
    return list(out.values())


def _add_nvlinks(
    topo: Topology,
    matrix: TopoMatrix,
    ids: Mapping[str, str],
    gpu_name: str | None,
    nvlink_bytes_per_s: float | None,
    names: Mapping[str, str] | None = None,
) -> int:
    """Add an NVLink link for every ``NV#`` pair whose devices are in ``ids``; return how many."""
    added = 0
    defaulted = False
    switched_all: set[str] = set()
    devs = [d for d in matrix.devices if d in ids]
    rates = {}
    for d in devs:
        rate = nvlink_rate(gpu_name or (names or {}).get(d))
        if nvlink_bytes_per_s:
            rate = NvLinkRate(nvlink_bytes_per_s, rate.generation, rate.max_links, "caller")
        rates[d] = rate
    # A GPU whose NV# cells add up to more links than one GPU has reaches its peers through NVSwitches.
    switched = {d for d in devs
                if sum(matrix.nvlink_count(d, o) for o in matrix.devices if o != d) > rates[d].max_links}
    for i, a in enumerate(devs):
        for b in devs[i + 1:]:
            count = matrix.nvlink_count(a, b)
            if not count:
                continue
            if topo.link_between(ids[a], ids[b]) is not None:
                continue  # a more direct source (NVML, hwloc) already gave this link
            rate = rates[a]
            defaulted |= rate.basis == "default"
            switched_all |= switched & {a, b}
            extra = {"via": "nvswitch"} if a in switched or b in switched else {}
            topo.add_link(nvlink_link(ids[a], ids[b], count, rate, "nvidia-smi-table", **extra))
            added += 1
    if defaulted:
        topo.notes.append(f"nvidia-smi: GPU model unknown; NVLinks taken at {DEFAULT_NVLINK_BYTES_PER_S / 1e9:g} GB/s "
                          "per link per direction (V100/A100/H100 rate)")
    if switched_all:
        topo.notes.append(
            f"nvidia-smi: {', '.join(sorted(switched_all, key=_natural))} have more NVLink peers than links: "
            "they connect through NVSwitches, and each GPU's NVLink bandwidth is shared by all its "
            "peer links (the per-pair links overstate the total)")
    return added


def _natural(name: str) -> tuple:
    m = re.match(r"^(\D*)(\d*)", name)
    return (m.group(1), int(m.group(2)) if m.group(2) else -1, name) if m else (name, -1, name)


# -- adding the matrix to a PCI tree ------------------------------------------------

def apply_nvidia_smi(
    topo: Topology,
    matrix: TopoMatrix,
    *,
    nvlink_bytes_per_s: float | None = None,
) -> Topology:
    """A copy of ``topo`` with the matrix's NVLink links and GPU affinities.

    ``topo`` comes from the PCI tree of the same machine (lspci, sysfs, ...).
    nvidia-smi numbers GPUs in PCI bus order, so ``GPU0`` is the GPU with the
    lowest bus address (GPUs of other vendors are left out). Different GPU
    counts raise :class:`TopologyError`;
    a relation that contradicts the tree (``SYS`` between GPUs of one socket,
    or the reverse) only adds a note.

    >>> t = Topology("box")
    >>> _ = t.add_node(Node("socket0", NodeKind.SOCKET, "socket 0", numa_node=0))
    >>> for addr in ("0000:41:00.0", "0000:01:00.0"):
    ...     _ = t.add_node(Node("pci:" + addr, NodeKind.GPU, "GA100 [A100 SXM4 40GB]", bus_address=addr))
    ...     _ = t.add_link(Link.pcie("socket0", "pci:" + addr, 4, 16))
    >>> from planner.topology.nvidia.smi_matrix import parse_nvidia_smi_topo
    >>> m = parse_nvidia_smi_topo("  GPU0  GPU1  CPU Affinity\\nGPU0  X  NV12  0-7\\nGPU1  NV12  X  0-7\\n")
    >>> out = apply_nvidia_smi(t, m)
    >>> out.node("pci:0000:01:00.0").attrs["nvidia_smi_name"]
    'GPU0'
    >>> out.links("nvlink")[0].bytes_per_s / 1e9
    300.0
    """
    out = topo.copy()
    # nvidia-smi lists NVIDIA GPUs only
    gpus = [g for g in out.nodes(NodeKind.GPU) if g.vendor_id in (None, "10de")]
    no_addr = [g.id for g in gpus if not g.bus_address]
    if no_addr:
        raise TopologyError(f"cannot match nvidia-smi GPUs by bus order: GPU node(s) {', '.join(no_addr)} "
                            "have no bus address")
    gpus.sort(key=lambda g: _bus_key(g.bus_address or ""))
    names = matrix.gpus
    if len(names) != len(gpus):
        raise TopologyError(
            f"nvidia-smi shows {len(names)} GPU(s) ({', '.join(names) or 'none'}) but the topology "
            f"{topo.name!r} has {len(gpus)} ({', '.join(g.bus_address or g.id for g in gpus) or 'none'}); "
            "are they captures of the same machine?")
    ids = {d: g.id for d, g in zip(names, gpus, strict=True)}
    for d, g in zip(names, gpus, strict=True):
        attrs: JsonObject = {"nvidia_smi_name": d}
        for key, table in (("cpu_affinity", matrix.cpu_affinity), ("numa_affinity", matrix.numa_affinity),
                           ("gpu_numa_id", matrix.gpu_numa_id)):
            if table.get(d) is not None:
                attrs[key] = table[d]
        numa = g.numa_node if g.numa_node is not None else matrix.numa_node(d)
        out.replace_node(replace(g.with_attrs(**attrs), numa_node=numa))

    contradictions = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            r = matrix.relation[(a, b)]
            sa, sb = out.socket_of(ids[a]), out.socket_of(ids[b])
            if sa is None or sb is None or "?" in sa.id or "?" in sb.id:
                continue
            if (r in ("SYS", "SOC")) == (sa.id == sb.id):
                contradictions.append(f"{a}-{b} {r} but {'same' if sa.id == sb.id else 'different'} sockets")
    if contradictions:
        out.notes.append("nvidia-smi disagrees with the PCI tree: " + "; ".join(contradictions))

    node_names = {d: out.node(ids[d]).name for d in names}
    _add_nvlinks(out, matrix, ids, None, nvlink_bytes_per_s, names=node_names)
    return out


def _bus_key(addr: str) -> tuple[int, int, int, int]:
    """Sort key of a normalised PCI address: (domain, bus, device, function)."""
    try:
        domain, bus, dev, fn = split_address(addr)
        return int(domain, 16), bus, dev, fn
    except ValueError:
        return (1 << 32, 0, 0, 0)
