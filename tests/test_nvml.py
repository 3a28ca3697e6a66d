"""NVML: absent here, so a fake ``pynvml`` module drives :func:`read_nvml`'s real code path."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from planner.errors import PlannerError, TopologyError
from planner.topology.model import Link, LinkKind, NodeKind
from planner.topology.nvidia.nvml import (
    NvLinkPair,
    NvmlError,
    NvmlGpu,
    NvmlInfo,
    apply_nvml,
    normalize_bus_id,
    nvml_available,
    read_nvml,
)
from planner.topology.nvidia.smi import apply_nvidia_smi
from planner.topology.nvidia.smi_matrix import parse_nvidia_smi_topo
from planner.topology.pcitree import PciFunction, build_pci_topology

# -- NVML is absent on this machine ---------------------------------------------------


def test_nvml_is_not_available_here():
    assert nvml_available() is False


def test_read_nvml_says_clearly_that_nvml_is_absent():
    with pytest.raises(PlannerError, match="NVML is not available"):
        read_nvml()


def test_missing_module_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes "import pynvml" fail
    assert nvml_available() is False
    with pytest.raises(NvmlError, match="nvidia-ml-py"):
        read_nvml()


# -- a fake pynvml -------------------------------------------------------------------


class FakeNVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {3: "Not Supported", 12: "NVML Shared Library Not Found"}.get(self.value, "Unknown Error")


def fake_pynvml(gpus, links=None, remote_types=None, init_error=None, broken=()):
    """A module with pynvml's names and return shapes.

    ``gpus``: list of (bus id bytes, name, numa); ``links``: {(gpu, link): remote bus id bytes};
    ``remote_types``: {(gpu, link): nvmlNvLinkDeviceType}; ``broken``: names of calls that fail.
    """
    links = links or {}
    remote_types = remote_types or {}
    mod = types.ModuleType("pynvml")
    mod.NVMLError = FakeNVMLError
    mod.NVML_NVLINK_MAX_LINKS = 18
    mod.NVML_FEATURE_ENABLED = 1
    mod.NVML_AFFINITY_SCOPE_NODE = 0
    calls = {"init": 0, "shutdown": 0}
    mod.calls = calls

    def fn(name):
        def deco(f):
            def wrapped(*args):
                if name in broken:
                    raise FakeNVMLError(999)
                return f(*args)
            setattr(mod, name, wrapped)
            return wrapped
        return deco

    @fn("nvmlInit")
    def _init():
        calls["init"] += 1
        if init_error is not None:
            raise FakeNVMLError(init_error)

    @fn("nvmlShutdown")
    def _shutdown():
        calls["shutdown"] += 1

    @fn("nvmlDeviceGetCount")
    def _count():
        return len(gpus)

    @fn("nvmlDeviceGetHandleByIndex")
    def _handle(i):
        if not 0 <= i < len(gpus):
            raise FakeNVMLError(2)
        return SimpleNamespace(index=i)

    @fn("nvmlDeviceGetPciInfo")
    def _pci(h):
        bus = gpus[h.index][0]
        # nvmlPciInfo_t: busId is a char array, so ctypes gives bytes; pciDeviceId = device << 16 | vendor
        return SimpleNamespace(busId=bus, busIdLegacy=bus[4:], domain=0, bus=int(bus[9:11], 16),
                               device=0, pciDeviceId=0x20B010DE, pciSubSystemId=0x134F10DE)

    @fn("nvmlDeviceGetName")
    def _name(h):
        return gpus[h.index][1]  # convertStrBytes decodes it

    @fn("nvmlDeviceGetMemoryInfo")
    def _mem(h, version=None):
        return SimpleNamespace(total=42949672960, free=42000000000, used=949672960)

    @fn("nvmlDeviceGetMaxPcieLinkGeneration")
    def _maxgen(h):
        return 4

    @fn("nvmlDeviceGetMaxPcieLinkWidth")
    def _maxw(h):
        return 16

    @fn("nvmlDeviceGetCurrPcieLinkGeneration")
    def _curgen(h):
        return 1  # idle GPUs train down

    @fn("nvmlDeviceGetCurrPcieLinkWidth")
    def _curw(h):
        return 16

    @fn("nvmlDeviceGetMemoryAffinity")
    def _aff(h, size, scope):
        numa = gpus[h.index][2]
        words = [0] * size
        words[numa // 64] = 1 << (numa % 64)
        return words

    @fn("nvmlDeviceGetNumaNodeId")
    def _gpu_numa(h):
        raise FakeNVMLError(3)

    @fn("nvmlDeviceGetNvLinkState")
    def _state(h, link):
        if not any(g == h.index for g, _ in links):
            raise FakeNVMLError(3)  # not an NVLink GPU
        return 1 if (h.index, link) in links else 0

    @fn("nvmlDeviceGetNvLinkVersion")
    def _version(h, link):
        return 4  # NVML_NVLINK_VERSION_3_0

    @fn("nvmlDeviceGetNvLinkRemotePciInfo")
    def _remote(h, link):
        bus = links[(h.index, link)]
        return SimpleNamespace(busId=bus, pciDeviceId=0x1AF110DE)

    @fn("nvmlDeviceGetNvLinkRemoteDeviceType")
    def _rtype(h, link):
        return remote_types.get((h.index, link), 0)

    @fn("nvmlDeviceGetP2PStatus")
    def _p2p(h1, h2, index):
        assert index == 0
        return 0

    @fn("nvmlSystemGetDriverVersion")
    def _driver():
        return "535.104.05"

    return mod


A100 = "NVIDIA A100-SXM4-40GB"
BUSES = [b"00000000:07:00.0", b"00000000:0F:00.0", b"00000000:B7:00.0"]


def direct_fake(**kw):
    # GPU0 links 0-3 ↔ GPU1 links 0-3; GPU2 has no NVLink
    links = {}
    for link in range(4):
        links[(0, link)] = BUSES[1]
        links[(1, link)] = BUSES[0]
    return fake_pynvml([(BUSES[0], A100, 0), (BUSES[1], A100, 0), (BUSES[2], A100, 1)], links, **kw)


def test_fake_nvml_available(monkeypatch):
    fake = direct_fake()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml_available() is True
    assert fake.calls == {"init": 1, "shutdown": 1}


def test_fake_nvml_init_failure(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", direct_fake(init_error=12))
    assert nvml_available() is False
    with pytest.raises(NvmlError, match=r"nvmlInit failed .*Library Not Found"):
        read_nvml()


def test_read_nvml_direct_nvlinks(monkeypatch):
    fake = direct_fake()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = read_nvml()
    assert fake.calls["shutdown"] == 1
    assert [g.bus_address for g in info.gpus] == ["0000:07:00.0", "0000:0f:00.0", "0000:b7:00.0"]
    g0 = info.gpu(0)
    assert g0.name == A100 and g0.memory_bytes == 42949672960
    assert (g0.max_link_gen, g0.max_link_width, g0.current_link_gen, g0.current_link_width) == (4, 16, 1, 16)
    assert (g0.vendor_id, g0.device_id) == ("10de", "20b0")
    assert [g.numa_node for g in info.gpus] == [0, 0, 1]
    assert g0.gpu_numa_id is None and g0.nvlink_generation == 3
    assert info.gpu(2).nvlink_generation is None
    assert info.nvlinks == (NvLinkPair(0, 1, 4, "direct", 3),)
    assert info.p2p == {(0, 1): "OK", (0, 2): "OK", (1, 2): "OK"}
    assert info.driver_version == "535.104.05"


def test_read_nvml_nvswitch(monkeypatch):
    switch_bus = [b"00000000:C4:00.0", b"00000000:C5:00.0"]
    links, types_ = {}, {}
    for g in range(3):
        for link in range(12):
            links[(g, link)] = switch_bus[link % 2]
            types_[(g, link)] = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
    fake = fake_pynvml([(b, A100, 0) for b in BUSES], links, remote_types=types_)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = read_nvml()
    assert info.nvswitch_links == {0: 12, 1: 12, 2: 12}
    assert {(p.gpu_a, p.gpu_b, p.count, p.via) for p in info.nvlinks} == {
        (0, 1, 12, "nvswitch"), (0, 2, 12, "nvswitch"), (1, 2, 12, "nvswitch")}


def test_read_nvml_required_query_fails(monkeypatch):
    fake = direct_fake(broken=("nvmlDeviceGetPciInfo",))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(NvmlError, match="PCI info of GPU 0"):
        read_nvml()
    assert fake.calls["shutdown"] == 1  # NVML is shut down even on failure


def test_read_nvml_optional_queries_may_fail(monkeypatch):
    broken = ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryAffinity", "nvmlDeviceGetP2PStatus",
              "nvmlDeviceGetNvLinkVersion", "nvmlSystemGetDriverVersion")
    monkeypatch.setitem(sys.modules, "pynvml", direct_fake(broken=broken))
    info = read_nvml()
    assert info.gpu(0).memory_bytes is None and info.gpu(0).numa_node is None
    assert info.p2p == {} and info.driver_version is None
    assert info.nvlinks == (NvLinkPair(0, 1, 4, "direct", None),)


def test_normalize_bus_id():
    assert normalize_bus_id("00000000:b7:00.0") == "0000:b7:00.0"
    assert normalize_bus_id(b"0001:3B:00.0\x00") == "0001:3b:00.0"
    with pytest.raises(NvmlError):
        normalize_bus_id(b"garbage")


# -- apply_nvml ------------------------------------------------------------------------


def pci_tree():
    """Two root ports with a GPU each (link speeds unknown, as from lspci -t) and a third GPU."""
    fns = []
    for i, (port, gpu) in enumerate((("0000:00:01.0", "0000:07:00.0"), ("0000:00:02.0", "0000:0f:00.0"),
                                     ("0000:80:01.0", "0000:b7:00.0"))):
        bus = int(gpu[5:7], 16)
        fns.append(PciFunction(port, class_code="0604", is_bridge=True, secondary_bus=bus,
                               subordinate_bus=bus, numa_node=0 if i < 2 else 1))
        fns.append(PciFunction(gpu, class_code="0302", vendor_id="10de", device_id="20b0", name="10de:20b0"))
    return build_pci_topology(fns, name="tree")


INFO = NvmlInfo(
    gpus=tuple(NvmlGpu(i, A100, b.decode()[4:].lower(), 42949672960, 4, 16, 1, 16, numa_node=n)
               for i, (b, n) in enumerate(zip(BUSES, (0, 0, 1), strict=True))),
    nvlinks=(NvLinkPair(0, 1, 12, "direct", 3),),
    p2p={(0, 1): "OK", (0, 2): "CNS"},
)


def test_apply_nvml_refines_gpus_and_links():
    base = pci_tree()
    out = apply_nvml(base, INFO)
    g = out.node("pci:0000:07:00.0")
    assert g.name == A100 and g.attrs["pci_name"] == "10de:20b0"
    assert g.attrs["memory_bytes"] == 42949672960 and g.attrs["nvml_index"] == 0
    assert g.attrs["p2p_read"] == {"pci:0000:0f:00.0": "OK", "pci:0000:b7:00.0": "CNS"}
    up = out.link_between(out.parent(g.id).id, g.id)
    assert (up.pcie_gen, up.lanes, up.attrs["current_gen"]) == (4, 16, 1)
    assert up.bytes_per_s == pytest.approx(25.2e9, rel=1e-2)
    nv = out.links(LinkKind.NVLINK)
    assert len(nv) == 1
    assert {nv[0].src, nv[0].dst} == {"pci:0000:07:00.0", "pci:0000:0f:00.0"}
    assert nv[0].bytes_per_s == pytest.approx(12 * 25e9) and nv[0].bandwidth_source == "nvml-table"
    assert "nvml" in out.sources
    # the input topology is left alone
    assert base.node("pci:0000:07:00.0").name == "10de:20b0" and not base.links(LinkKind.NVLINK)


def test_apply_nvml_keeps_known_pcie_figures():
    fns = [PciFunction("0000:00:01.0", class_code="0604", is_bridge=True, secondary_bus=7,
                       subordinate_bus=7, numa_node=0, link_cap=(3, 16)),
           PciFunction("0000:07:00.0", class_code="0302", vendor_id="10de", link_cap=(3, 16))]
    info = NvmlInfo(gpus=(NvmlGpu(0, A100, "0000:07:00.0", max_link_gen=4, max_link_width=16),))
    out = apply_nvml(build_pci_topology(fns), info)
    assert out.link_between("socket0", "pci:0000:07:00.0").pcie_gen == 3


def test_apply_nvml_replaces_nvidia_smi_nvlinks():
    text = "  GPU0  GPU1  GPU2  CPU Affinity\nGPU0  X  NV8  SYS  0-1\nGPU1  NV8  X  SYS  0-1\nGPU2  SYS  SYS  X  2-3\n"
    smi = apply_nvidia_smi(pci_tree(), parse_nvidia_smi_topo(text, "smi.txt"))
    assert smi.links(LinkKind.NVLINK)[0].bandwidth_source == "nvidia-smi-table"
    out = apply_nvml(smi, INFO)
    (lk,) = out.links(LinkKind.NVLINK)
    assert lk.bandwidth_source == "nvml-table" and lk.attrs["nvlink_count"] == 12


def test_apply_nvml_nvswitch_note():
    info = NvmlInfo(gpus=INFO.gpus[:2], nvlinks=(NvLinkPair(0, 1, 12, "nvswitch", 3),))
    out = apply_nvml(pci_tree(), info)
    assert out.links(LinkKind.NVLINK)[0].attrs["via"] == "nvswitch"
    assert any("NVSwitch" in n for n in out.notes)


def test_apply_nvml_unknown_gpu_is_an_error():
    info = NvmlInfo(gpus=(NvmlGpu(0, A100, "0000:99:00.0"),))
    with pytest.raises(TopologyError, match="0000:99:00.0"):
        apply_nvml(pci_tree(), info)


def test_read_then_apply_end_to_end(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", direct_fake())
    out = apply_nvml(pci_tree(), read_nvml())
    assert out.counts()["gpu"] == 3
    (lk,) = out.links(LinkKind.NVLINK)
    assert lk.attrs["nvlink_count"] == 4 and lk.attrs["nvlink_generation"] == 3
    assert all(n.kind == NodeKind.GPU and n.name == A100 for n in out.nodes(NodeKind.GPU))
    assert isinstance(lk, Link)


@pytest.mark.parametrize("version,arch,gen,noted", [
    (5, 7, 3, False),     # what an A100 reports: NVML_NVLINK_VERSION_3_1, Ampere
    (4, None, 3, False),  # 3_0, no architecture call: the enum alone
    (6, 9, 4, False),     # 4_0 on Hopper
    (7, 9, 4, True),      # 5_0 on Hopper, as drivers have reported H100 links: the architecture decides
    (7, 10, 5, False),    # 5_0 on Blackwell
    (3, 5, 2, False),     # 2_2 on Volta
])
def test_nvlink_version_is_nvml_enum_checked_against_architecture(monkeypatch, version, arch, gen, noted):
    fake = direct_fake()
    fake.nvmlDeviceGetNvLinkVersion = lambda h, link: version
    if arch is not None:
        fake.nvmlDeviceGetArchitecture = lambda h: arch
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = read_nvml()
    assert info.gpu(0).nvlink_generation == gen and info.nvlinks[0].generation == gen
    assert bool(info.notes) == noted
    if noted:
        assert "taken as NVLink 4" in info.notes[0]
