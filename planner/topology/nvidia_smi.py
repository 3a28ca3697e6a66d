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
from dataclasses import dataclass, field, replace

from planner.errors import ParseError, TopologyError
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcitree import add_memory_and_interconnect, split_address

#: cell values besides ``NV#``; ``SOC`` is the pre-2017 spelling of ``SYS``
RELATIONS = ("X", "SYS", "SOC", "NODE", "PHB", "PXB", "PIX")

_NV = re.compile(r"^NV(\d{1,3})$")
_TRAILING_NAMES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_HEADER_TOKEN = re.compile("|".join(re.escape(n) for n in _TRAILING_NAMES) + r"|\S+")
_DEVICE_NAME = re.compile(r"^[A-Za-z][\w.\-]*$")
_CPU_LIST = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")
_LEGEND_LINE = re.compile(r"^\s*\S+\s*=\s*\S.*$")
_NIC_LEGEND_LINE = re.compile(r"^\s*(\S+)\s*:\s*(\S+)\s*$")
_GPU_NAME = re.compile(r"^GPU\d+$")
_NIC_NAME = re.compile(r"^(?:NIC\d+|mlx\d+_\d+|ib\w*|hfi\d+_\d+|bnxt_re\d+|efa_?\d+|irdma\d+)$")

_EXPECTED_HEADER = (
    "the header row of 'nvidia-smi topo -m': device names (GPU0, NIC0, ...) "
    "followed by 'CPU Affinity'"
)


@dataclass(frozen=True)
class TopoMatrix:
    """What ``nvidia-smi topo -m`` says, verbatim.

    ``devices`` are the header's names in order. ``relation[(a, b)]`` is the
    cell in row ``a``, column ``b`` (``"NV12"``, ``"PXB"``, ...) for every
    ordered pair of distinct devices. ``cpu_affinity`` and ``numa_affinity``
    hold the row's text (``"48-63,176-191"``, ``"3"``) or ``None`` when the
    row leaves it empty or says ``N/A``; ``gpu_numa_id`` is the NUMA node of
    a GPU's own memory (coherent GPUs only), usually ``None``. ``nic_names``
    maps ``NIC0`` to its RDMA device (``mlx5_0``) from the NIC legend.
    """

    devices: tuple[str, ...]
    relation: Mapping[tuple[str, str], str]
    cpu_affinity: Mapping[str, str | None] = field(default_factory=dict)
    numa_affinity: Mapping[str, str | None] = field(default_factory=dict)
    gpu_numa_id: Mapping[str, int | None] = field(default_factory=dict)
    nic_names: Mapping[str, str] = field(default_factory=dict)

    def kind(self, device: str) -> NodeKind:
        """``gpu`` for ``GPU#``, ``nic`` for ``NIC#`` and RDMA names, else ``other``."""
        if _GPU_NAME.match(device):
            return NodeKind.GPU
        if _NIC_NAME.match(device):
            return NodeKind.NIC
        return NodeKind.OTHER

    @property
    def gpus(self) -> tuple[str, ...]:
        """GPU names in nvidia-smi's order (``GPU0``, ``GPU1``, ...)."""
        return tuple(sorted((d for d in self.devices if self.kind(d) == NodeKind.GPU),
                            key=lambda d: int(d[3:])))

    def numa_node(self, device: str) -> int | None:
        """The one NUMA node in a device's NUMA affinity, ``None`` if none or several.

        >>> TopoMatrix(("GPU0",), {}, numa_affinity={"GPU0": "3"}).numa_node("GPU0")
        3
        """
        nodes = parse_cpu_list(self.numa_affinity.get(device) or "")
        return nodes[0] if len(nodes) == 1 else None

    def nvlink_count(self, a: str, b: str) -> int:
        """Number of NVLinks bonded between ``a`` and ``b`` (0 when the cell is not ``NV#``)."""
        m = _NV.match(self.relation.get((a, b), ""))
        return int(m.group(1)) if m else 0


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The numbers of a Linux CPU/NUMA list such as ``"48-63,176-191"``.

    Empty, ``N/A`` and malformed lists give ``()``; the parser validates
    lists before they get here.

    >>> parse_cpu_list("0-2,8")
    (0, 1, 2, 8)
    """
    text = text.strip()
    if not _CPU_LIST.match(text):
        return ()
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a or b - a > 1_000_000:
            return ()
        out.extend(range(a, b + 1))
    return tuple(out)


def parse_nvidia_smi_topo(text: str, source: str = "<nvidia-smi topo -m>") -> TopoMatrix:
    """Parse the output of ``nvidia-smi topo -m``.

    Tab-separated output and space-aligned copies are both read: cells never
    contain spaces, and the affinity values are taken in order after the
    relation cells (tab output puts an empty field before ``GPU NUMA ID``,
    and NIC rows leave the affinities empty). Raises :class:`ParseError`
    naming ``source`` and the line for anything else.

    >>> m = parse_nvidia_smi_topo("  GPU0  NIC0  CPU Affinity\\nGPU0  X  PIX  0-7\\nNIC0  PIX  X\\n")
    >>> m.devices, m.cpu_affinity["NIC0"]
    (('GPU0', 'NIC0'), None)
    """
    lines = text.split("\n")
    for no, line in enumerate(lines, 1):
        if "\x00" in line:
            raise ParseError(source, no, "the text output of 'nvidia-smi topo -m'", "binary data (NUL bytes)")
    lines = [ln.rstrip("\r") for ln in lines]

    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i == len(lines):
        raise ParseError(source, 1, _EXPECTED_HEADER, "empty input")
    header_no = i + 1
    devices, trailing = _parse_header(lines[i], source, header_no)
    n = len(devices)

    relation: dict[tuple[str, str], str] = {}
    cpu: dict[str, str | None] = {}
    numa: dict[str, str | None] = {}
    gpu_numa: dict[str, int | None] = {}
    row_line: dict[str, int] = {}
    i += 1
    while i < len(lines):
        line = lines[i]
        no = i + 1
        if not line.strip() or line.strip() in ("Legend:", "NIC Legend:"):
            break
        tokens = line.split()
        name = tokens[0]
        if name not in devices:
            raise ParseError(source, no, f"a matrix row starting with one of the header's devices ({', '.join(devices)})", line)
        if name in row_line:
            raise ParseError(source, no, f"one row per device, but {name} already has a row on line {row_line[name]}", line)
        if len(tokens) < n + 1:
            raise ParseError(source, no, f"{n} relation cells after {name}", line)
        for col, cell in zip(devices, tokens[1:n + 1], strict=True):
            if not (cell in RELATIONS or _NV.match(cell)):
                raise ParseError(source, no, f"a relation (X, SYS, SOC, NODE, PHB, PXB, PIX or NV#) in column {col}", cell)
            if (cell == "X") != (col == name):
                want = "X on the diagonal" if col == name else f"a relation other than X between {name} and {col}"
                raise ParseError(source, no, want, cell)
            if col != name:
                relation[(name, col)] = cell
        values = tokens[n + 1:]
        if len(values) > len(trailing):
            raise ParseError(source, no, f"at most {len(trailing)} value(s) ({', '.join(trailing)}) after the relation cells", line)
        row = dict(zip(trailing, values, strict=False))
        cpu[name] = _affinity(row.get("CPU Affinity"), "a CPU list like '0-23' or '48-63,176-191'", source, no)
        numa[name] = _affinity(row.get("NUMA Affinity"), "a NUMA node list like '3'", source, no)
        gid = row.get("GPU NUMA ID")
        if gid is None or gid == "N/A":
            gpu_numa[name] = None
        elif gid.isdigit():
            gpu_numa[name] = int(gid)
        else:
            raise ParseError(source, no, "a GPU NUMA ID (a number or N/A)", gid)
        row_line[name] = no
        i += 1

    missing = [d for d in devices if d not in row_line]
    if missing:
        raise ParseError(source, i + 1 if i < len(lines) else len(lines),
                         f"a matrix row for {missing[0]} (every header device has a row)",
                         lines[i] if i < len(lines) else "end of input")
    for (a, b), cell in relation.items():
        if relation[(b, a)] != cell:
            later = a if row_line[a] > row_line[b] else b
            other = b if later == a else a
            raise ParseError(source, row_line[later],
                             f"{later}'s relation to {other} to mirror {other}'s ({relation[(other, later)]})",
                             relation[(later, other)])

    nic_names = _parse_legends(lines, i, devices, source)
    return TopoMatrix(tuple(devices), relation, cpu, numa, gpu_numa, nic_names)


def _parse_header(line: str, source: str, no: int) -> tuple[list[str], list[str]]:
    tokens = _HEADER_TOKEN.findall(line)
    if "CPU Affinity" not in tokens:
        raise ParseError(source, no, _EXPECTED_HEADER, line)
    cut = tokens.index("CPU Affinity")
    devices, trailing = tokens[:cut], tokens[cut:]
    if not devices:
        raise ParseError(source, no, _EXPECTED_HEADER, line)
    for d in devices:
        if not _DEVICE_NAME.match(d) or d in RELATIONS or _NV.match(d) or d in _TRAILING_NAMES:
            raise ParseError(source, no, "device names such as GPU0 or NIC0 in the header", d)
    dup = [d for d, c in Counter(devices).items() if c > 1]
    if dup:
        raise ParseError(source, no, "each device once in the header", dup[0])
    if len(set(trailing)) != len(trailing):
        raise ParseError(source, no, "each affinity column once in the header", line)
    return devices, trailing


def _affinity(value: str | None, expected: str, source: str, no: int) -> str | None:
    if value is None or value == "N/A":
        return None
    if not parse_cpu_list(value):
        raise ParseError(source, no, expected, value)
    return value


def _parse_legends(lines: list[str], i: int, devices: list[str], source: str) -> dict[str, str]:
    nic_names: dict[str, str] = {}
    section = None  # None until "Legend:" or "NIC Legend:"
    for j in range(i, len(lines)):
        line, no = lines[j], j + 1
        s = line.strip()
        if not s:
            continue
        if s == "Legend:":
            section = "legend"
        elif s == "NIC Legend:":
            section = "nic"
        elif section == "legend" and _LEGEND_LINE.match(line):
            continue
        elif section == "nic" and (m := _NIC_LEGEND_LINE.match(line)):
            dev, rdma = m.group(1), m.group(2)
            if dev not in devices:
                raise ParseError(source, no, f"a NIC legend entry for a device of the matrix ({', '.join(devices)})", line)
            if dev in nic_names:
                raise ParseError(source, no, f"one NIC legend entry per device, {dev} is listed twice", line)
            nic_names[dev] = rdma
        else:
            expected = {
                None: "a blank line, 'Legend:' or 'NIC Legend:' after the matrix",
                "legend": "a legend line like '  PIX  = Connection traversing ...'",
                "nic": "a NIC legend line like '  NIC0: mlx5_0'",
            }[section]
            raise ParseError(source, no, expected, line)
    return nic_names


# -- NVLink rates -----------------------------------------------------------

@dataclass(frozen=True)
class NvLinkRate:
    """Per-direction bandwidth of one NVLink, in bytes/s, and how it was chosen.

    ``basis`` is ``"generation"`` (a known NVLink version), ``"gpu-name"``
    (the GPU model implies it) or ``"default"`` (nothing known).
    ``max_links`` is how many NVLinks one GPU of that generation has.
    """

    per_link_bytes_per_s: float
    generation: int | None
    max_links: int
    basis: str


#: NVLink generation → (bytes/s per link per direction, links per GPU):
#: P100 4 × 20 GB/s; V100 6 × 25; A100 12 × 25; H100 18 × 25; B200 18 × 50.
NVLINK_GENERATIONS = {1: (20e9, 4), 2: (25e9, 6), 3: (25e9, 12), 4: (25e9, 18), 5: (50e9, 18)}

#: used when neither the generation nor the GPU model is known: V100, A100
#: and H100 all move 25 GB/s per link per direction
DEFAULT_NVLINK_BYTES_PER_S = 25e9
_MAX_NVLINKS = 18  # no GPU has more (NVML_NVLINK_MAX_LINKS)

_NVLINK_BY_NAME = (
    (re.compile(r"\bP100\b", re.I), 1, None),
    (re.compile(r"\bV100", re.I), 2, None),
    # GA102 boards bridge 4 links at 14.06 GB/s per direction (112.5 GB/s both ways in total)
    (re.compile(r"RTX A6000|\bA40\b|RTX 3090|\bGA102", re.I), 3, 14.0625e9),
    (re.compile(r"\bA100\b|\bA800\b|\bA30\b|\bGA100\b", re.I), 3, None),
    (re.compile(r"\bH100\b|\bH200\b|\bH800\b|\bH20\b|\bGH100\b|\bGH200\b", re.I), 4, None),
    (re.compile(r"\bB100\b|\bB200\b|\bGB200\b|\bB300\b|\bGB300\b", re.I), 5, None),
)


def nvlink_rate(gpu_name: str | None = None, generation: int | None = None) -> NvLinkRate:
    """The bandwidth of one NVLink, from its generation or the GPU's model name.

    >>> nvlink_rate(generation=5).per_link_bytes_per_s / 1e9
    50.0
    >>> r = nvlink_rate("NVIDIA A100-SXM4-40GB")
    >>> r.generation, r.per_link_bytes_per_s / 1e9, r.basis
    (3, 25.0, 'gpu-name')
    >>> nvlink_rate().basis
    'default'
    """
    for pattern, gen, bw in _NVLINK_BY_NAME:
        # the model decides unless it contradicts a known generation (GA102 bridges are NVLink 3
        # at a lower rate than A100's, which the generation alone would not tell)
        if gpu_name and pattern.search(gpu_name) and generation in (None, gen):
            base_bw, links = NVLINK_GENERATIONS[gen]
            return NvLinkRate(bw or base_bw, gen, links if bw is None else 4, "gpu-name")
    if generation in NVLINK_GENERATIONS:
        bw, links = NVLINK_GENERATIONS[generation]
        return NvLinkRate(bw, generation, links, "generation")
    return NvLinkRate(DEFAULT_NVLINK_BYTES_PER_S, None, _MAX_NVLINKS, "default")


def nvlink_link(a: str, b: str, count: int, rate: NvLinkRate, bandwidth_source: str, **attrs) -> Link:
    """An NVLink :class:`Link` of ``count`` bonded links at ``rate``."""
    return Link(a, b, LinkKind.NVLINK, count * rate.per_link_bytes_per_s,
                bandwidth_source=bandwidth_source,
                attrs={"nvlink_count": count, "per_link_bytes_per_s": rate.per_link_bytes_per_s,
                       "nvlink_generation": rate.generation, "rate_basis": rate.basis, **attrs})


# -- topology from the matrix alone ----------------------------------------------

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

    >>> m = parse_nvidia_smi_topo("  GPU0  GPU1  CPU Affinity  NUMA Affinity\\n"
    ...                           "GPU0  X  PIX  0-7  0\\nGPU1  PIX  X  0-7  0\\n")
    >>> t = topology_from_nvidia_smi(m)
    >>> t.parent("gpu:GPU0").kind.value, t.socket_of("gpu:GPU1").id
    ('switch', 'socket0')
    """
    topo = Topology(name=name, sources=[source] if source else [])
    pcie_links = pcie_links or {}
    devs = list(matrix.devices)

    def rel(a: str, b: str) -> str:
        r = matrix.relation.get((a, b), "SYS")
        return "SYS" if r == "SOC" else r

    groups = _components(devs, lambda a, b: rel(a, b) in _TREE)
    group_of = {d: k for k, g in enumerate(groups) for d in g}

    # NUMA node of each group: its own devices' affinity, else what PHB/NODE/tree neighbours say.
    numa_of: dict[int, int] = {}
    for k, g in enumerate(groups):
        known = [n for d in g if (n := matrix.numa_node(d)) is not None]
        if known:
            numa_of[k] = Counter(known).most_common(1)[0][0]
            if len(set(known)) > 1:
                topo.notes.append(f"nvidia-smi: devices {', '.join(g)} share a PCIe tree but report "
                                  f"NUMA nodes {sorted(set(known))}; using {numa_of[k]}")
    changed = True
    while changed:
        changed = False
        for k, g in enumerate(groups):
            if k in numa_of:
                continue
            votes = [numa_of[group_of[o]] for d in g for o in devs
                     if group_of[o] != k and group_of[o] in numa_of and rel(d, o) in _SAME_NUMA]
            if votes:
                numa_of[k] = Counter(votes).most_common(1)[0][0]
                changed = True

    # Sockets.
    def socket_id(numa: int | None) -> str:
        if numa is None:
            return "socket?"
        return f"socket{numa_to_socket.get(numa, numa) if numa_to_socket else numa}"

    numa_nodes = sorted(set(numa_of.values()))
    sockets: dict[str, list[int]] = {}
    for n in numa_nodes:
        sockets.setdefault(socket_id(n), []).append(n)
    unplaced = [g for k, g in enumerate(groups) if k not in numa_of]
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
    if len(numa_nodes) > 0 and not numa_to_socket:
        topo.notes.append(
            f"nvidia-smi: one socket per NUMA node ({', '.join(map(str, numa_nodes))}); the matrix "
            "cannot tell whether several NUMA nodes share a CPU package (AMD NPS2/NPS4)")
    for g in unplaced:
        far = sorted({numa_of[group_of[o]] for d in g for o in devs
                      if group_of[o] in numa_of and rel(d, o) == "SYS"})
        where = f"on a NUMA node other than {', '.join(map(str, far))}" if far else "on an unknown NUMA node"
        topo.notes.append(
            f"nvidia-smi: {', '.join(g)} have no NUMA affinity and are SYS to every placed device: "
            f"they sit {where}, which the matrix does not name; placed under 'socket?'")
    add_memory_and_interconnect(topo)

    # Devices and inferred switches.
    def dev_id(d: str) -> str:
        return f"{matrix.kind(d).value}:{d}"

    def pcie(up: str, d: str | None, node_id: str) -> Link:
        gen, lanes = pcie_links.get(d, (None, None)) if d else (None, None)
        return Link.pcie(up, node_id, gen, lanes, inferred=True)

    hb_groups = _components(list(range(len(groups))),
                            lambda a, b: any(rel(x, y) == "PHB" for x in groups[a] for y in groups[b]))
    host_bridge = {k: f"hb{h}" for h, ks in enumerate(g for g in hb_groups if len(g) > 1) for k in ks}

    n_switch = 0

    def add_switch(members: list[str], evidence: str, up: str, hb: str | None) -> str:
        nonlocal n_switch
        sid = f"switch:nvsmi{n_switch}"
        n_switch += 1
        topo.add_node(Node(sid, NodeKind.SWITCH, f"switch (inferred from {evidence}: {', '.join(members)})",
                           attrs={"inferred": True, "evidence": evidence, "members": list(members),
                                  **({"host_bridge": hb} if hb else {})}))
        topo.add_link(pcie(up, None, sid))
        return sid

    def add_device(d: str, up: str, hb: str | None) -> None:
        label = f"{d} ({matrix.nic_names[d]})" if d in matrix.nic_names else d
        attrs = {"nvidia_smi_name": d}
        for key, table in (("cpu_affinity", matrix.cpu_affinity), ("numa_affinity", matrix.numa_affinity),
                           ("gpu_numa_id", matrix.gpu_numa_id)):
            if table.get(d) is not None:
                attrs[key] = table[d]
        if d in matrix.nic_names:
            attrs["rdma_device"] = matrix.nic_names[d]
        if hb:
            attrs["host_bridge"] = hb
        topo.add_node(Node(dev_id(d), matrix.kind(d), label, numa_node=matrix.numa_node(d), attrs=attrs))
        topo.add_link(pcie(up, d, dev_id(d)))

    pxb_groups = 0
    for k, g in enumerate(groups):
        up = socket_id(numa_of.get(k))
        hb = host_bridge.get(k)
        if len(g) == 1:
            add_device(g[0], up, hb)
            continue
        has_pxb = any(rel(a, b) == "PXB" for a in g for b in g if a != b)
        if not has_pxb:
            sw = add_switch(g, "PIX", up, hb)
            if all(matrix.kind(d) == NodeKind.NIC for d in g):
                topo.notes.append(
                    f"nvidia-smi: {', '.join(g)} are PIX to each other: one switch, or the ports of "
                    f"one multi-port card; either way they share the upstream link of {sw}")
            for d in g:
                add_device(d, sw, None)
            continue
        pxb_groups += 1
        top = add_switch(g, "PXB", up, hb)
        for sub in _components(g, lambda a, b: rel(a, b) == "PIX"):
            if len(sub) == 1:
                add_device(sub[0], top, None)
            else:
                sw = add_switch(sub, "PIX", top, None)
                for d in sub:
                    add_device(d, sw, None)
    if pxb_groups:
        topo.notes.append(
            f"nvidia-smi: {pxb_groups} PXB group(s) drawn as one switch each; PXB means several "
            "bridges, so the real tree may have more switch levels")
    if any(pcie_links.get(d) is None for d in devs):
        topo.notes.append("nvidia-smi: PCIe link widths and speeds are not in the matrix; those links are unknown")

    # NVLink.
    _add_nvlinks(topo, matrix, {d: dev_id(d) for d in devs}, gpu_name, nvlink_bytes_per_s)
    return topo


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
        attrs = {"nvidia_smi_name": d}
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
