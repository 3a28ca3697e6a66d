"""NVML, through ``nvidia-ml-py`` (``import pynvml``): GPUs and NVLinks of the live machine.

NVML is an optional extra (``pip install 'moment-gnn[nvml]'``) and needs the
NVIDIA driver's ``libnvidia-ml.so``; ``pynvml`` is imported inside the
functions only, so this module imports everywhere. :func:`read_nvml`
collects what the planner needs into a plain :class:`NvmlInfo`, and
:func:`apply_nvml` adds it to a topology built from the PCI tree (sysfs,
lspci): GPU names, memory sizes and link widths, and NVLink links.

>>> info = NvmlInfo(
...     gpus=(NvmlGpu(0, "NVIDIA A100-SXM4-40GB", "0000:07:00.0", 40 * 2**30, 4, 16),
...           NvmlGpu(1, "NVIDIA A100-SXM4-40GB", "0000:0f:00.0", 40 * 2**30, 4, 16)),
...     nvlinks=(NvLinkPair(0, 1, 12, generation=3),),
... )
>>> info.gpu(1).bus_address, info.nvlinks[0].count
('0000:0f:00.0', 12)
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from planner.errors import PlannerError, TopologyError
from planner.topology.model import Link, LinkKind, NodeKind, Topology
from planner.topology.nvidia.nvlink import nvlink_link, nvlink_rate

_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")

#: What ``nvmlDeviceGetNvLinkVersion`` returns is an ``nvmlNvlinkVersion_t`` enum, not the
#: generation (NVML's reference says so since 2025; hwloc issue 658: an A100 returns 5):
#: 1 = 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0, 8 = 6.0 → NVLink generation.
_NVLINK_VERSION_GEN = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}

#: ``nvmlDeviceArchitecture_t`` → the NVLink generation of GPUs of that architecture (Pascal 4,
#: Volta 5, Turing 6, Ampere 7, Hopper 9, Blackwell 10). Drivers have reported H100 links as
#: 7 (5.0); where the architecture is known and disagrees, it decides (and a note says so).
_ARCH_NVLINK_GEN = {4: 1, 5: 2, 6: 2, 7: 3, 9: 4, 10: 5}
_ARCH_NAME = {4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere", 9: "Hopper", 10: "Blackwell"}

#: nvmlGpuP2PStatus_t → the abbreviations of ``nvidia-smi topo -p2p``
_P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}

# nvmlNvLinkDeviceType_t
_REMOTE_GPU, _REMOTE_IBMNPU, _REMOTE_SWITCH = 0, 1, 2


class NvmlError(PlannerError):
    """NVML is missing, cannot start, or failed a query the planner needs."""


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML sees it.

    ``bus_address`` is normalised (``0000:07:00.0``, NVML prints an 8-digit
    domain). Link generations and widths are the maximum the GPU and its
    slot support together and the state at query time (an idle GPU may
    train down). ``numa_node`` is the CPU NUMA node nearest the GPU;
    ``gpu_numa_id`` the NUMA node of the GPU's own memory on coherent
    systems (Grace Hopper), else ``None``.
    """

    index: int
    name: str
    bus_address: str
    memory_bytes: int | None = None
    max_link_gen: int | None = None
    max_link_width: int | None = None
    current_link_gen: int | None = None
    current_link_width: int | None = None
    numa_node: int | None = None
    gpu_numa_id: int | None = None
    vendor_id: str | None = None
    device_id: str | None = None
    nvlink_generation: int | None = None


@dataclass(frozen=True)
class NvLinkPair:
    """``count`` NVLinks between GPUs ``gpu_a`` and ``gpu_b`` (NVML indices).

    ``via`` is ``"direct"`` for links from GPU to GPU and ``"nvswitch"`` when
    both GPUs reach NVSwitches: then ``count`` is the smaller of their
    switch-link counts, as ``nvidia-smi topo -m`` shows it, and each GPU's
    links are shared by all its peers.
    """

    gpu_a: int
    gpu_b: int
    count: int
    via: str = "direct"
    generation: int | None = None


@dataclass(frozen=True)
class NvmlInfo:
    """What :func:`read_nvml` found.

    ``nvswitch_links`` and ``cpu_nvlinks`` count, per GPU index, the active
    NVLinks that end at an NVSwitch or at a CPU (IBM POWER NPU). ``p2p``
    holds the peer-to-peer read status of GPU pairs (``"OK"``, ``"CNS"``,
    ... as ``nvidia-smi topo -p2p r`` abbreviates them).
    """

    gpus: tuple[NvmlGpu, ...]
    nvlinks: tuple[NvLinkPair, ...] = ()
    nvswitch_links: Mapping[int, int] = field(default_factory=dict)
    cpu_nvlinks: Mapping[int, int] = field(default_factory=dict)
    p2p: Mapping[tuple[int, int], str] = field(default_factory=dict)
    driver_version: str | None = None
    notes: tuple[str, ...] = ()

    def gpu(self, index: int) -> NvmlGpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise NvmlError(f"NVML info has no GPU {index} (GPUs: {[g.index for g in self.gpus]})")


def normalize_bus_id(bus_id: str | bytes) -> str:
    """NVML's ``00000000:07:00.0`` as the planner's ``0000:07:00.0``.

    >>> normalize_bus_id(b"00000000:B7:00.0")
    '0000:b7:00.0'
    """
    text = bus_id.decode("ascii", "replace") if isinstance(bus_id, bytes) else str(bus_id)
    m = _BUS_ID.match(text.strip().rstrip("\x00"))
    if not m:
        raise NvmlError(f"NVML gave a PCI bus id {text!r} that is not like 00000000:07:00.0")
    domain = int(m.group(1), 16)
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def _import_pynvml() -> ModuleType | None:
    try:
        import pynvml  # optional dependency, imported lazily
    except ImportError:
        return None
    return pynvml


def nvml_available() -> bool:
    """Whether NVML can be used here: ``pynvml`` imports and ``nvmlInit`` succeeds.

    >>> isinstance(nvml_available(), bool)
    True
    """
    pynvml = _import_pynvml()
    if pynvml is None:
        return False
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError, or OSError from a broken driver install
        return False
    with contextlib.suppress(Exception):  # shutting down is best effort
        pynvml.nvmlShutdown()
    return True


def read_nvml() -> NvmlInfo:
    """Query NVML for every GPU, its PCIe link and its NVLinks.

    Raises :class:`NvmlError` (a :class:`PlannerError`) when ``pynvml`` is
    not installed, when ``nvmlInit`` fails (no NVIDIA driver), or when a
    query every GPU must answer (count, handle, PCI info) fails. Queries a
    GPU may not support (NUMA affinity, NVLink, P2P status) are skipped.
    """
    pynvml = _import_pynvml()
    if pynvml is None:
        raise NvmlError("NVML is not available: the Python package nvidia-ml-py (module pynvml) "
                        "is not installed; pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise NvmlError(f"NVML is not available: nvmlInit failed ({_describe(exc)}); "
                        "is the NVIDIA driver installed and loaded?") from None
    try:
        return _read(pynvml)
    finally:
        with contextlib.suppress(Exception):  # best effort; the data is already read
            pynvml.nvmlShutdown()


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # pynvml's __str__ calls into the library, which may be absent
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _read(pynvml: ModuleType) -> NvmlInfo:
    nv = _Calls(pynvml)
    gpus, handles = _gpus(nv)
    notes: list[str] = []
    links = _nvlinks(nv, gpus, handles, notes)
    gpus = [replace(g, nvlink_generation=links.generation.get(g.index)) for g in gpus]
    p2p = {}
    for a_i, a in enumerate(gpus):
        for b_i in range(a_i + 1, len(gpus)):
            # NVML_P2P_CAPS_INDEX_READ is 0 (pynvml spells the constant as a 1-tuple by mistake)
            status = nv.may("nvmlDeviceGetP2PStatus", handles[a_i], handles[b_i], 0)
            if status is not None:
                p2p[(a.index, gpus[b_i].index)] = _P2P_STATUS.get(int(status), "U")
    driver = nv.may("nvmlSystemGetDriverVersion")
    if isinstance(driver, bytes):
        driver = driver.decode("ascii", "replace")
    return NvmlInfo(tuple(gpus), tuple(links.pairs(gpus)), links.to_switch, links.to_cpu, p2p, driver,
                    tuple(dict.fromkeys(notes)))


class _Calls:
    """NVML calls that must answer (``need``: else :class:`NvmlError`) or may not (``may``: else None)."""

    def __init__(self, pynvml: ModuleType) -> None:
        self.pynvml = pynvml
        self.error = getattr(pynvml, "NVMLError", Exception)

    # Any: pynvml has no stubs; its handles and values are opaque
    def need(self, what: str, fn_name: str, *args: Any) -> Any:
        try:
            return getattr(self.pynvml, fn_name)(*args)
        except (self.error, AttributeError) as exc:
            raise NvmlError(f"NVML failed to give {what}: {fn_name} raised {_describe(exc)}") from None

    # Any: pynvml has no stubs; its handles and values are opaque
    def may(self, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.pynvml, fn_name, None)
        if fn is None:
            return None  # older pynvml without this call
        try:
            return fn(*args)
        except self.error:
            return None


# Any: pynvml has no stubs; its handles and values are opaque
def _gpus(nv: _Calls) -> tuple[list[NvmlGpu], list[Any]]:
    """Every GPU NVML sees, and its handle."""
    need, may = nv.need, nv.may
    count = need("the number of GPUs", "nvmlDeviceGetCount")
    handles = []
    gpus = []
    for i in range(int(count)):
        h = need(f"a handle for GPU {i}", "nvmlDeviceGetHandleByIndex", i)
        pci = need(f"the PCI info of GPU {i}", "nvmlDeviceGetPciInfo", h)
        bus = normalize_bus_id(getattr(pci, "busId", b"") or getattr(pci, "busIdLegacy", b""))
        name = may("nvmlDeviceGetName", h)
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        mem = may("nvmlDeviceGetMemoryInfo", h)
        pci_id = getattr(pci, "pciDeviceId", None)
        numa = None
        # NVML_AFFINITY_SCOPE_NODE = 0; 4 × 64 bits cover 256 NUMA nodes
        affinity = may("nvmlDeviceGetMemoryAffinity", h, 4, getattr(nv.pynvml, "NVML_AFFINITY_SCOPE_NODE", 0))
        if affinity is not None:
            nodes = [w * 64 + b for w, word in enumerate(affinity) for b in range(64) if int(word) >> b & 1]
            numa = nodes[0] if len(nodes) == 1 else None
        gpu_numa = may("nvmlDeviceGetNumaNodeId", h)
        gpus.append(NvmlGpu(
            index=i,
            name=name or "",
            bus_address=bus,
            memory_bytes=int(mem.total) if mem is not None else None,
            max_link_gen=_positive(may("nvmlDeviceGetMaxPcieLinkGeneration", h)),
            max_link_width=_positive(may("nvmlDeviceGetMaxPcieLinkWidth", h)),
            current_link_gen=_positive(may("nvmlDeviceGetCurrPcieLinkGeneration", h)),
            current_link_width=_positive(may("nvmlDeviceGetCurrPcieLinkWidth", h)),
            numa_node=numa,
            gpu_numa_id=gpu_numa if isinstance(gpu_numa, int) and gpu_numa >= 0 else None,
            vendor_id=f"{int(pci_id) & 0xFFFF:04x}" if pci_id is not None else None,
            device_id=f"{int(pci_id) >> 16 & 0xFFFF:04x}" if pci_id is not None else None,
        ))
        handles.append(h)
    return gpus, handles


class _Links:
    """NVLinks counted link by link from each GPU's side: to peers, to NVSwitches, to CPUs."""

    def __init__(self) -> None:
        self.direct: dict[int, dict[int, int]] = {}
        self.to_switch: dict[int, int] = {}
        self.to_cpu: dict[int, int] = {}
        self.generation: dict[int, int] = {}

    def pairs(self, gpus: list[NvmlGpu]) -> list[NvLinkPair]:
        """GPU pairs joined directly or through NVSwitches."""
        direct, to_switch, generation = self.direct, self.to_switch, self.generation
        pairs = []
        for a_i, a in enumerate(gpus):
            for b in gpus[a_i + 1:]:
                # each link is seen from both ends; an end whose query failed sees fewer
                n = max(direct.get(a.index, {}).get(b.index, 0), direct.get(b.index, {}).get(a.index, 0))
                gen = generation.get(a.index) or generation.get(b.index)
                if n:
                    pairs.append(NvLinkPair(a.index, b.index, n, "direct", gen))
                elif to_switch.get(a.index) and to_switch.get(b.index):
                    pairs.append(NvLinkPair(a.index, b.index, min(to_switch[a.index], to_switch[b.index]),
                                            "nvswitch", gen))
        return pairs


# Any: pynvml has no stubs; its handles and values are opaque
def _nvlinks(nv: _Calls, gpus: list[NvmlGpu], handles: list[Any], notes: list[str]) -> _Links:
    """NVLinks, link by link from each GPU's side."""
    may = nv.may
    out = _Links()
    by_bus = {g.bus_address: g.index for g in gpus}
    max_links = int(getattr(nv.pynvml, "NVML_NVLINK_MAX_LINKS", 18))
    enabled = getattr(nv.pynvml, "NVML_FEATURE_ENABLED", 1)
    for g, h in zip(gpus, handles, strict=True):
        arch = may("nvmlDeviceGetArchitecture", h)
        for link in range(max_links):
            if may("nvmlDeviceGetNvLinkState", h, link) != enabled:
                continue  # inactive, not an NVLink GPU (NotSupported), or past its links (InvalidArgument)
            version = may("nvmlDeviceGetNvLinkVersion", h, link)
            gen = _nvlink_generation(version, arch, g.index, notes)
            if gen is not None:
                out.generation[g.index] = max(out.generation.get(g.index, 0), gen)
            remote = may("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            try:
                peer = by_bus.get(normalize_bus_id(remote.busId)) if remote is not None else None
            except (NvmlError, AttributeError):
                peer = None
            rtype = may("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            if peer is not None and peer != g.index:
                out.direct.setdefault(g.index, {})[peer] = out.direct.get(g.index, {}).get(peer, 0) + 1
            elif rtype == _REMOTE_SWITCH or (rtype is None and remote is not None and peer is None
                                             and f"{int(getattr(remote, 'pciDeviceId', 0)) & 0xFFFF:04x}" == "10de"):
                out.to_switch[g.index] = out.to_switch.get(g.index, 0) + 1
            elif rtype == _REMOTE_IBMNPU:
                out.to_cpu[g.index] = out.to_cpu.get(g.index, 0) + 1
    return out


# Any: pynvml has no stubs; its handles and values are opaque
def _nvlink_generation(version: Any, arch: Any, index: int, notes: list[str]) -> int | None:
    """The NVLink generation of a link from NVML's version enum, checked against the GPU's architecture."""
    gen = _NVLINK_VERSION_GEN.get(version) if isinstance(version, int) else None
    want = _ARCH_NVLINK_GEN.get(arch) if isinstance(arch, int) else None
    if want is not None and gen is not None and gen != want:
        notes.append(f"NVML: GPU {index} reports NVLink version value {version} (NVLink {gen}), but its "
                     f"{_ARCH_NAME[arch]} architecture has NVLink {want}: taken as NVLink {want}")
        return want
    return gen


# Any: pynvml has no stubs; its handles and values are opaque
def _positive(value: Any) -> int | None:
    try:
        v = int(value)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def apply_nvml(topo: Topology, info: NvmlInfo) -> Topology:
    """A copy of ``topo`` refined with NVML: GPU names, memory, PCIe links and NVLinks.

    GPUs are matched by bus address; an NVML GPU the topology lacks raises
    :class:`TopologyError` (the two describe different machines). A GPU's
    PCIe link whose speed no source gave takes NVML's maximum generation and
    width. NVLink links get ``count`` × the per-link rate of the GPU's
    NVLink generation, ``bandwidth_source="nvml-table"``; they replace
    NVLink links from less direct sources (``nvidia-smi``).

    >>> from planner.topology.model import Node
    >>> t = Topology("box")
    >>> _ = t.add_node(Node("socket0", NodeKind.SOCKET, "socket 0", numa_node=0))
    >>> for a in ("0000:07:00.0", "0000:0f:00.0"):
    ...     _ = t.add_node(Node("pci:" + a, NodeKind.GPU, "10de:20b0", bus_address=a))
    ...     _ = t.add_link(Link.pcie("socket0", "pci:" + a, None, None))
    >>> out = apply_nvml(t, NvmlInfo(
    ...     gpus=(NvmlGpu(0, "NVIDIA A100-SXM4-40GB", "0000:07:00.0", 42949672960, 4, 16),
    ...           NvmlGpu(1, "NVIDIA A100-SXM4-40GB", "0000:0f:00.0", 42949672960, 4, 16)),
    ...     nvlinks=(NvLinkPair(0, 1, 12, generation=3),)))
    >>> out.node("pci:0000:07:00.0").name, out.link_between("socket0", "pci:0000:07:00.0").lanes
    ('NVIDIA A100-SXM4-40GB', 16)
    >>> out.links("nvlink")[0].bytes_per_s / 1e9
    300.0
    """
    out = topo.copy()
    ids: dict[int, str] = {}
    missing = []
    for g in info.gpus:
        node = out.find(g.bus_address)
        if node is None:
            missing.append(f"GPU {g.index} at {g.bus_address}")
        else:
            ids[g.index] = node.id
    if missing:
        raise TopologyError(f"NVML lists {', '.join(missing)}, which topology {topo.name!r} does not have; "
                            "is it the topology of this machine?")

    for g in info.gpus:
        _refine_gpu(out, g, ids, info.p2p)

    switched = False
    for p in info.nvlinks:
        if p.gpu_a not in ids or p.gpu_b not in ids or p.gpu_a == p.gpu_b or p.count <= 0:
            continue
        a, b = ids[p.gpu_a], ids[p.gpu_b]
        ga = info.gpu(p.gpu_a)
        rate = nvlink_rate(ga.name, p.generation or ga.nvlink_generation)
        extra = {"via": "nvswitch"} if p.via == "nvswitch" else {}
        switched |= p.via == "nvswitch"
        link = nvlink_link(a, b, p.count, rate, "nvml-table", **extra)
        existing = out.link_between(a, b)
        if existing is None:
            out.add_link(link)
        elif existing.kind == LinkKind.NVLINK:
            out.replace_link(link)
    if switched:
        out.notes.append("NVML: GPUs reach each other through NVSwitches; each GPU's NVLink bandwidth "
                         "is shared by all its peer links (the per-pair links overstate the total)")
    out.notes.extend(info.notes)
    if info.cpu_nvlinks:
        out.notes.append("NVML: GPU(s) " + ", ".join(f"{i} ({n} links)" for i, n in sorted(info.cpu_nvlinks.items()))
                         + " have NVLinks to the CPU, which the topology does not model")
    out.sources.append("nvml")
    return out


def _refine_gpu(out: Topology, g: NvmlGpu, ids: dict[int, str], p2p: Mapping[tuple[int, int], str]) -> None:
    """One GPU's node (name, memory, NUMA, peers) and, where unknown, its PCIe link, from NVML."""
    node = out.node(ids[g.index])
    # Any: pynvml has no stubs; its handles and values are opaque
    attrs: dict[str, Any] = {"nvml_index": g.index}
    if node.name and node.name != g.name:
        attrs["pci_name"] = node.name
    if g.memory_bytes is not None:
        attrs["memory_bytes"] = g.memory_bytes
    if g.gpu_numa_id is not None:
        attrs["gpu_numa_id"] = g.gpu_numa_id
    if g.current_link_gen and g.current_link_width:
        attrs["current_link"] = [g.current_link_gen, g.current_link_width]
    peers = {ids[b]: s for (a, b), s in p2p.items() if a == g.index and b in ids}
    peers.update({ids[a]: s for (a, b), s in p2p.items() if b == g.index and a in ids})
    if peers:
        attrs["p2p_read"] = peers
    out.replace_node(replace(
        node.with_attrs(**attrs),
        kind=NodeKind.GPU,
        name=g.name or node.name,
        numa_node=node.numa_node if node.numa_node is not None else g.numa_node,
        vendor_id=node.vendor_id or g.vendor_id,
        device_id=node.device_id or g.device_id,
    ))
    parent = out.parent(node.id)
    up = out.link_between(parent.id, node.id) if parent is not None else None
    if (up is not None and parent is not None and up.kind == LinkKind.PCIE and up.bytes_per_s is None
            and g.max_link_gen and g.max_link_width and up.src == parent.id):
        extra = dict(up.attrs)
        if g.current_link_gen and g.current_link_width:
            extra.update(current_gen=g.current_link_gen, current_lanes=g.current_link_width)
        try:
            out.replace_link(Link.pcie(up.src, up.dst, g.max_link_gen, g.max_link_width,
                                       link_source="nvml", **extra))
        except TopologyError:
            out.notes.append(f"NVML: GPU {g.index} reports an impossible PCIe link "
                             f"Gen{g.max_link_gen} x{g.max_link_width}; left unknown")
