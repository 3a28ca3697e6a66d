"""hwloc XML parser: real exports from the fixtures, hand-written v1/v2 files, bad input."""

from __future__ import annotations

import json
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.topology.hwloc.links import pcie_links_for_gb_per_s
from planner.topology.hwloc.parse import parse_hwloc_xml
from planner.topology.model import LinkKind, NodeKind, Topology
from tests.conftest import (
    TOPOLOGY_FIXTURES,
    assert_parse_error,
    topology_fixture,
)
from tests.fuzz import mutated_text, parses_or_refuses

DGX2 = "nvidia-dgx2h-hwloc"
SL390S = "hp-proliant-sl390s-g7-hwloc"
MINSKY = "ibm-power8-minsky-hwloc"


@cache
def _text(machine: str) -> str:
    return topology_fixture(machine, "hwloc.xml").read_text()


@cache
def _topo(machine: str) -> Topology:
    path = topology_fixture(machine, "hwloc.xml")
    return parse_hwloc_xml(_text(machine), str(path))


def _switch_levels(topo: Topology, node_id: str) -> int:
    return sum(1 for a in topo.ancestors(node_id) if a.kind == NodeKind.SWITCH)


def _socket(topo: Topology, bus: str) -> str:
    node = topo.find(bus)
    assert node is not None, bus
    sock = topo.socket_of(node.id)
    assert sock is not None
    return sock.id


# -- counts from expected.json -------------------------------------------------------


@pytest.mark.parametrize("machine", [DGX2, SL390S, MINSKY])
def test_counts_match_expected_json(machine: str) -> None:
    topo = _topo(machine)
    expected = json.loads((TOPOLOGY_FIXTURES / "expected.json").read_text())[machine]
    counts = topo.counts()
    for kind, n in expected.items():
        assert counts[kind] == n, (kind, counts)


# -- NVIDIA DGX-2H --------------------------------------------------------------------


def test_dgx2_machine_and_sockets() -> None:
    topo = _topo(DGX2)
    assert topo.name == "NVIDIA DGX-2H"
    sockets = {s.id: s for s in topo.nodes(NodeKind.SOCKET)}
    assert set(sockets) == {"socket0", "socket1"}
    for s in sockets.values():
        assert s.attrs["model"] == "Intel(R) Xeon(R) Platinum 8174 CPU @ 3.10GHz"
    assert topo.node("mem0").attrs["capacity_bytes"] == 810234351616
    assert topo.link_between("socket0", "socket1").kind == LinkKind.INTER_SOCKET


def test_dgx2_gpus_by_package() -> None:
    topo = _topo(DGX2)
    gpus = topo.nodes(NodeKind.GPU)
    assert len(gpus) == 16
    assert {(g.vendor_id, g.device_id) for g in gpus} == {("10de", "1db8")}
    assert {g.name for g in gpus} == {"Tesla V100-SXM3-32GB-H"}
    pkg0 = ["34", "36", "39", "3b", "57", "59", "5c", "5e"]
    pkg1 = ["b7", "b9", "bc", "be", "e0", "e2", "e5", "e7"]
    for bus in pkg0:
        assert _socket(topo, f"0000:{bus}:00.0") == "socket0"
    for bus in pkg1:
        assert _socket(topo, f"0000:{bus}:00.0") == "socket1"
    assert all(g.attrs["os_devices"][0].startswith("nvml") for g in gpus)


def test_dgx2_every_gpu_two_switch_levels_below_its_root_port() -> None:
    topo = _topo(DGX2)
    for gpu in topo.nodes(NodeKind.GPU):
        assert _switch_levels(topo, gpu.id) == 2, gpu.id
    # 34:00.0 <- 33:00.0 <- 32:00.0 <- 2d:04.0 <- 2c:00.0 (all 10b5:9781) <- root port 2b:00.0
    chain = [a.id for a in topo.ancestors("pci:0000:34:00.0")]
    assert chain == ["switch:0000:32:00.0", "switch:0000:2c:00.0", "socket0"]
    assert topo.node("switch:0000:32:00.0").attrs["ports"] == [
        "0000:32:00.0", "0000:33:00.0", "0000:33:10.0"]
    assert topo.node("switch:0000:2c:00.0").vendor_id == "10b5"


def test_dgx2_switch_ports_are_the_52_plx_bridges() -> None:
    # 60 Bridge objects = 4 host bridges + 4 root ports + 34 PEX9781 + 14 PEX8725 + 4 PEX9797
    topo = _topo(DGX2)
    ports = [p for s in topo.nodes(NodeKind.SWITCH) for p in s.attrs["ports"]]
    assert len(ports) == len(set(ports)) == 34 + 14 + 4
    root_ports = {"0000:2b:00.0", "0000:4e:00.0", "0000:ae:00.0", "0000:d7:00.0"}
    assert not root_ports & set(ports)


def test_dgx2_nvswitch_endpoints_are_other() -> None:
    topo = _topo(DGX2)
    others = topo.nodes(NodeKind.OTHER)
    nvswitches = [n for n in others if (n.vendor_id, n.device_id) == ("10de", "1ac2")]
    assert len(nvswitches) == 11
    assert {n.bus_address[5:7] for n in nvswitches} == {
        "61", "62", "63", "65", "67", "c1", "c2", "c3", "c5", "c6", "c7"}
    unknown = topo.find("0000:66:00.0")
    assert unknown is not None and unknown.kind == NodeKind.OTHER
    assert (unknown.vendor_id, unknown.device_id) == ("0000", "0000")
    assert unknown.attrs["unreadable"] is True
    assert len(others) == 12
    # 61:00.0 <- 60:02.0 <- 5f:00.0 (10b5:8725) <- 50:10.0 <- 4f:00.0 (10b5:9781) <- 4e:00.0
    chain = [a.id for a in topo.ancestors("pci:0000:61:00.0")]
    assert chain == ["switch:0000:5f:00.0", "switch:0000:4f:00.0", "socket0"]
    assert topo.node("switch:0000:5f:00.0").device_id == "8725"


def test_dgx2_nvlinks_join_each_gpu_to_six_nvswitches() -> None:
    topo = _topo(DGX2)
    nvlinks = topo.links(LinkKind.NVLINK)
    assert len(nvlinks) == 16 * 6
    for gpu in topo.nodes(NodeKind.GPU):
        mine = [lk for lk in nvlinks if gpu.id in lk.key]
        assert len(mine) == 6
        for lk in mine:
            peer = topo.node(lk.dst if lk.src == gpu.id else lk.src)
            assert peer.kind == NodeKind.OTHER
            assert lk.bytes_per_s == 25_000 * 1e6  # one NVLink 2.0 link per direction
            assert lk.bandwidth_source == "hwloc"
            # the GPU's baseboard is its package's: GPUs on socket0 talk to NVSwitches 6x:00.0
            assert topo.socket_of(peer.id).id == topo.socket_of(gpu.id).id
    assert any("NVSwitch" in note for note in topo.notes)


def test_dgx2_pcie_capacity_from_hwloc_figure() -> None:
    topo = _topo(DGX2)
    lk = topo.link_between("switch:0000:32:00.0", "pci:0000:34:00.0")
    # 15.753846 GB/s is Gen3 x16, Gen4 x8 and Gen5 x4 alike: kept as the figure
    assert lk.attrs["hwloc_gb_per_s"] == pytest.approx(15.753846)
    assert lk.pcie_gen is None and lk.lanes is None
    assert lk.bandwidth_source == "hwloc"
    assert lk.bytes_per_s == pytest.approx(15.753846e9 * 0.8)
    # the NVSwitch branch runs at 3.94 GB/s (x4) then 1 GB/s per NVSwitch
    assert topo.link_between("switch:0000:4f:00.0", "switch:0000:5f:00.0").attrs[
        "hwloc_gb_per_s"] == pytest.approx(3.938462)
    assert topo.link_between("switch:0000:5f:00.0", "pci:0000:61:00.0").attrs[
        "hwloc_gb_per_s"] == pytest.approx(1.0)


# -- HP ProLiant SL390s G7 ---------------------------------------------------------------


def test_sl390s_gpus_and_sockets() -> None:
    topo = _topo(SL390S)
    assert topo.name == "ProLiant SL390s G7"
    gpus = {g.bus_address for g in topo.nodes(NodeKind.GPU)}
    assert gpus == {"0000:06:00.0", "0000:14:00.0", "0000:11:00.0"}
    assert _socket(topo, "0000:06:00.0") == "socket0"
    assert _socket(topo, "0000:14:00.0") == "socket1"
    assert _socket(topo, "0000:11:00.0") == "socket1"
    assert all(topo.parent(f"pci:{a}").kind == NodeKind.SOCKET for a in gpus)
    assert topo.counts()["switch"] == 0


def test_sl390s_nics_and_bmc_vga() -> None:
    topo = _topo(SL390S)
    cx2 = topo.find("0000:05:00.0")  # class 0c06 InfiniBand: a NIC all the same
    assert cx2.kind == NodeKind.NIC and (cx2.vendor_id, cx2.device_id) == ("15b3", "6746")
    assert set(cx2.attrs["os_devices"]) == {"eth2", "ib0", "mlx4_0"}
    assert _socket(topo, "0000:05:00.0") == "socket0"
    e82576 = topo.find("0000:04:00.1")
    assert e82576.kind == NodeKind.NIC and e82576.attrs["functions"] == ["0000:04:00.0", "0000:04:00.1"]
    es1000 = topo.find("0000:01:03.0")  # ATI ES1000 management VGA, not a GPU
    assert es1000.kind == NodeKind.OTHER
    assert topo.counts()["nic"] == 2


# -- IBM POWER8 Minsky ---------------------------------------------------------------------


def test_minsky_gpus_in_separate_domains() -> None:
    topo = _topo(MINSKY)
    assert topo.name == "PowerNV 8335-GTB"
    for addr, sock in (("0002:01:00.0", "socket0"), ("0003:01:00.0", "socket0"),
                       ("000a:01:00.0", "socket1"), ("000b:01:00.0", "socket1")):
        gpu = topo.find(addr)
        assert gpu.kind == NodeKind.GPU and gpu.name == "Tesla P100-SXM2-16GB"
        assert gpu.device_id == "15f9"
        assert topo.parent(gpu.id).id == sock  # alone behind its PHB (a root port)
    assert topo.node("socket0").attrs["model"] == "POWER8NVL, altivec supported"


def test_minsky_nvlinks_follow_the_matrix() -> None:
    topo = _topo(MINSKY)
    nv = {lk.key: lk for lk in topo.links(LinkKind.NVLINK)}
    g = {i: f"pci:{d}:01:00.0" for i, d in enumerate(("0002", "0003", "000a", "000b"))}
    # nvml0–nvml1 and nvml2–nvml3: 40000 MB/s per direction (2 NVLink 1.0 links of 20 GB/s)
    for a, b in ((0, 1), (2, 3)):
        lk = topo.link_between(g[a], g[b])
        assert lk.kind == LinkKind.NVLINK and lk.bytes_per_s == 40e9
        assert lk.attrs["hwloc_mb_per_s"] == 40000
    # GPU–CPU NVLinks, through the socket's NVLink port
    for i, sock in ((0, "socket0"), (1, "socket0"), (2, "socket1"), (3, "socket1")):
        lk = topo.link_between(f"nvlink:{sock}", g[i])
        assert lk is not None and lk.bytes_per_s == 40e9
        assert topo.node(f"nvlink:{sock}").attrs["socket"] == sock
    assert topo.link_between("socket0", "nvlink:socket0").bytes_per_s == 80e9
    # the matrix says 0 elsewhere: no NVLink across sockets, none to the other socket's port
    for a, b in ((0, 2), (0, 3), (1, 2), (1, 3)):
        assert topo.link_between(g[a], g[b]) is None
    assert topo.link_between("nvlink:socket1", g[0]) is None
    assert topo.link_between("nvlink:socket0", g[2]) is None
    assert len(nv) == 2 + 4 + 2
    # the PCIe link is still there, below the GPU's root port
    assert topo.link_between("socket0", g[0]).kind == LinkKind.PCIE


# -- hand-written XML: hwloc 1.x and 2.x features ---------------------------------------


V1_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc.dtd">
<topology>
  <object type="Machine" os_index="0" cpuset="0x3" nodeset="0x3">
    <info name="DMIProductName" value="Old Box"/>
    <object type="NUMANode" os_index="0" cpuset="0x1" nodeset="0x1" local_memory="1000">
      <object type="Socket" os_index="0" cpuset="0x1" nodeset="0x1">
        <object type="PU" os_index="0" cpuset="0x1"/>
      </object>
      <object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[00-04]">
        <object type="Bridge" bridge_type="1-1" depth="1" bridge_pci="0000:[04-04]"
                pci_busid="0000:00:03.0" pci_type="0604 [8086:3c08] [0000:0000] 07" pci_link_speed="0.250000">
          <object type="PCIDev" pci_busid="0000:04:00.0" pci_type="0200 [8086:1521] [8086:0001] 01"
                  pci_link_speed="0.250000">
            <object type="OSDev" name="eth0" osdev_type="2"/>
          </object>
        </object>
      </object>
    </object>
    <object type="NUMANode" os_index="1" cpuset="0x2" nodeset="0x2" local_memory="2000">
      <object type="Socket" os_index="1" cpuset="0x2" nodeset="0x2">
        <object type="PU" os_index="1" cpuset="0x2"/>
      </object>
      <object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[80-81]">
        <object type="Bridge" bridge_type="1-1" depth="1" bridge_pci="0000:[81-81]"
                pci_busid="0000:80:02.0" pci_type="0604 [8086:3c04] [0000:0000] 07" pci_link_speed="4.000000">
          <object type="PCIDev" pci_busid="0000:81:00.0" pci_type="0300 [10de:1024] [10de:0983] a1"
                  pci_link_speed="4.000000">
            <info name="PCIVendor" value="NVIDIA Corporation"/>
            <info name="PCIDevice" value="GK110BGL [Tesla K40c]"/>
            <object type="OSDev" name="cuda0" osdev_type="5"/>
          </object>
        </object>
      </object>
    </object>
  </object>
</topology>
"""


def test_v1_numa_nodes_above_sockets() -> None:
    topo = parse_hwloc_xml(V1_XML, "v1.xml")
    assert topo.name == "Old Box"
    assert topo.counts()["socket"] == 2
    nic, gpu = topo.find("0000:04:00.0"), topo.find("0000:81:00.0")
    assert nic.kind == NodeKind.NIC and topo.socket_of(nic.id).id == "socket0"
    assert gpu.kind == NodeKind.GPU and topo.socket_of(gpu.id).id == "socket1"
    assert gpu.name == "NVIDIA Corporation GK110BGL [Tesla K40c]"
    assert gpu.numa_node == 1
    assert topo.node("mem1").attrs["capacity_bytes"] == 2000
    # 0.25 GB/s fits Gen1 x1 only: the pair is recovered and the link sized by the PCIe table
    lk = topo.link_between("socket0", nic.id)
    assert (lk.pcie_gen, lk.lanes, lk.bandwidth_source) == (1, 1, "pcie")


V2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0xf" nodeset="0x3" gp_index="1">
    <info name="PlatformModel" value="Grid Node"/>
    <object type="Package" os_index="0" cpuset="0x3" nodeset="0x1" gp_index="2">
      <info name="CPUModel" value="Some CPU"/>
      <object type="NUMANode" os_index="0" cpuset="0x3" nodeset="0x1" gp_index="3" local_memory="4096"/>
      <object type="L3Cache" cpuset="0x3" nodeset="0x1" gp_index="4" cache_size="1" depth="3">
        <object type="Bridge" gp_index="10" bridge_type="0-1" depth="0" bridge_pci="0000:[00-02]">
          <object type="PCIDev" gp_index="11" pci_busid="0000:01:00.0" pci_type="0302 [10de:1db4] [10de:1212] a1 00">
            <object type="OSDev" gp_index="12" name="nvml0" osdev_type="1"/>
          </object>
          <object type="PCIDev" gp_index="13" pci_busid="0000:02:00.0" pci_type="0302 [10de:1db4] [10de:1212] a1 00">
            <object type="OSDev" gp_index="14" name="nvml1" osdev_type="1"/>
          </object>
        </object>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0xc" nodeset="0x2" gp_index="5">
      <object type="NUMANode" os_index="1" cpuset="0xc" nodeset="0x2" gp_index="6" local_memory="4096"/>
    </object>
  </object>
  <distances2 type="OSDev" nbobjs="2" kind="9" name="NVLinkBandwidth" indexing="gp">
    <indexes length="6">12 14 </indexes>
    <u64values length="24">1000000 150000 150000 1000000 </u64values>
  </distances2>
</topology>
"""


def test_v2_homogeneous_nvlink_matrix_and_empty_package() -> None:
    topo = parse_hwloc_xml(V2_XML, "v2.xml")
    assert topo.name == "Grid Node"
    a, b = "pci:0000:01:00.0", "pci:0000:02:00.0"
    lk = topo.link_between(a, b)
    assert lk.kind == LinkKind.NVLINK and lk.bytes_per_s == 150e9
    # the second package has no I/O but is a socket with its memory all the same
    assert "socket1" in topo and "mem1" in topo
    assert topo.link_between("socket0", "socket1") is not None
    assert topo.node("socket0").attrs["model"] == "Some CPU"
    assert topo.socket_of(a).id == "socket0"


def test_pcie_links_for_gb_per_s() -> None:
    assert pcie_links_for_gb_per_s(15.753846) == [(3, 16), (4, 8), (5, 4)]
    assert pcie_links_for_gb_per_s(4.0) == [(1, 16), (2, 8)]
    assert pcie_links_for_gb_per_s(0.25) == [(1, 1)]
    assert pcie_links_for_gb_per_s(0.4) == []


# -- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("", 1, "an XML document"),
        ("lspci -tv output\n-[0000:00]-+-00.0", 1, "well-formed XML"),
        ('<system version="1"><cpu numaid="0"/></system>', 1, "hwloc <topology>"),
        ("<topology>\n</topology>", 1, "<object>"),
        ('<topology>\n<object type="Machine">\n<object type="PCIDev" pci_busid="zz"/>'
         "</object></topology>", 3, "PCI address"),
        ('<topology>\n<object type="Machine">\n<object type="PCIDev" pci_busid="0000:01:00.0"'
         ' pci_type="vga"/></object></topology>', 3, "pci_type"),
        ('<topology><object type="Machine">\n<object type="Bridge" bridge_type="x"/>'
         "</object></topology>", 2, "bridge_type"),
        ('<topology><object type="Machine">\n<object type="PCIDev" pci_busid="0000:01:00.0"'
         ' pci_link_speed="fast"/></object></topology>', 2, "pci_link_speed"),
        ('<topology><object type="Machine"/>\n<distances2hetero nbobjs="2" name="NVLinkBandwidth">'
         "<indexes>OSDev:1 OSDev:2</indexes><u64values>1 2 3</u64values></distances2hetero>"
         "</topology>", 2, "u64values"),
        ('<!DOCTYPE t [<!ENTITY a "aaaa">]>\n<topology/>', 1, "entity"),
        ("<topology>\n<object type=\"Machine\">\n</topology>", 3, "well-formed XML"),
        ("<topology>\x00</topology>", 1, "binary"),
    ],
)
def test_bad_input_names_source_and_line(text: str, line: int, expected: str) -> None:
    assert_parse_error(parse_hwloc_xml, text, line, expected)


# -- properties: only ParseError or a topology ---------------------------------------------


def _parse_or_parse_error(text: str) -> None:
    parses_or_refuses(parse_hwloc_xml, text, "fuzz.xml")


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=400))
def test_random_text(text: str) -> None:
    _parse_or_parse_error(text)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    _parse_or_parse_error(data.decode("latin-1"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machine=st.sampled_from([SL390S, MINSKY, DGX2]), data=st.data())
def test_mutated_real_input(machine: str, data: st.DataObject) -> None:
    ops = ("delete", "duplicate", "cut", "flip", "swap")
    _parse_or_parse_error(data.draw(mutated_text([_text(machine)], '<>/"=x0f-: \n', ops, keepends=True)))
