"""NCCL topology XML parser: vendor files from the fixtures, dump-style XML, bad input."""

from __future__ import annotations

import json
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.topology.model import LinkKind, NodeKind, Topology
from planner.topology.nvidia.nccl import NVSWITCH_NODE, nvlink_bytes_per_s, parse_nccl_topo
from planner.topology.pcie import pcie_bytes_per_s
from tests.conftest import (
    TOPOLOGY_FIXTURES,
    assert_parse_error,
    topology_fixture,
)
from tests.fuzz import mutated_text, parses_or_refuses

AWS = "aws-p4d-24xlarge-nccl"
AZURE = "azure-ndv4-a100-nccl"


@cache
def _text(machine: str) -> str:
    return topology_fixture(machine, "nccl-topo.xml").read_text()


@cache
def _topo(machine: str) -> Topology:
    return parse_nccl_topo(_text(machine), str(topology_fixture(machine, "nccl-topo.xml")))


def _children_kinds(topo: Topology, node_id: str) -> list[str]:
    return sorted(c.kind.value for c in topo.children(node_id))


@pytest.mark.parametrize("machine", [AWS, AZURE])
def test_counts_match_expected_json(machine: str) -> None:
    topo = _topo(machine)
    expected = json.loads((TOPOLOGY_FIXTURES / "expected.json").read_text())[machine]
    counts = topo.counts()
    for kind, n in expected.items():
        assert counts[kind] == n, (kind, counts)


# -- AWS p4d.24xlarge -------------------------------------------------------------------


def test_aws_p4d_switches_gpus_and_efa() -> None:
    topo = _topo(AWS)
    counts = topo.counts()
    assert (counts["gpu"], counts["nic"], counts["switch"], counts["socket"]) == (8, 4, 4, 2)
    expected = {
        "switch:ffff:ff:01.0": ("socket0", "10"),
        "switch:ffff:ff:02.0": ("socket0", "20"),
        "switch:ffff:ff:03.0": ("socket1", "90"),
        "switch:ffff:ff:04.0": ("socket1", "a0"),
    }
    for sw_id, (sock, bus) in expected.items():
        sw = topo.node(sw_id)
        assert sw.kind == NodeKind.SWITCH and sw.attrs["virtual"] is True
        assert sw.vendor_id == "ffff"
        assert topo.parent(sw_id).id == sock
        kids = {c.bus_address: c for c in topo.children(sw_id)}
        assert set(kids) == {f"0000:{bus}:1c.0", f"0000:{bus}:1d.0", f"0000:{bus}:1b.0"}
        assert _children_kinds(topo, sw_id) == ["gpu", "gpu", "nic"]
        nic = kids[f"0000:{bus}:1b.0"]
        assert (nic.vendor_id, nic.device_id) == ("1d0f", "efa0")
        for gpu_bus in ("1c", "1d"):
            gpu = kids[f"0000:{bus}:{gpu_bus}.0"]
            assert (gpu.kind, gpu.vendor_id, gpu.device_id) == (NodeKind.GPU, "10de", "20b0")
            assert gpu.attrs["nccl_class"] == "0x030200"
    # every link is declared 8 GT/s x16
    for lk in topo.links(LinkKind.PCIE):
        assert (lk.pcie_gen, lk.lanes) == (3, 16)
        assert lk.bytes_per_s == pytest.approx(pcie_bytes_per_s(3, 16))
    assert topo.node("socket0").attrs["cpu_vendor"] == "GenuineIntel"
    assert topo.node("socket0").attrs["model_id"] == "85"
    assert topo.links(LinkKind.NVLINK) == []


# -- Azure NDv4 ---------------------------------------------------------------------------


def test_azure_ndv4_one_switch_per_numa_node() -> None:
    topo = _topo(AZURE)
    counts = topo.counts()
    assert (counts["gpu"], counts["nic"], counts["switch"], counts["socket"]) == (8, 8, 4, 4)
    layout = {
        0: (("0003", "0004"), ("0103", "0104")),
        1: (("0001", "0002"), ("0101", "0102")),
        2: (("000d", "000e"), ("0107", "0108")),
        3: (("000b", "000c"), ("0105", "0106")),
    }
    for numa, (gpus, nics) in layout.items():
        sw_id = f"switch:ffff:ff:{numa + 1:02x}.0"
        assert topo.parent(sw_id).id == f"socket{numa}"
        assert topo.node(sw_id).attrs["virtual"] is True  # fake bus ffff:ff, no vendor given
        assert _children_kinds(topo, sw_id) == ["gpu", "gpu", "nic", "nic"]
        for dom in gpus:
            gpu = topo.find(f"{dom}:00:00.0")
            assert gpu.kind == NodeKind.GPU and topo.parent(gpu.id).id == sw_id
            assert gpu.numa_node == numa
        for dom in nics:
            nic = topo.find(f"{dom}:00:00.0")
            assert nic.kind == NodeKind.NIC and topo.parent(nic.id).id == sw_id
            assert nic.attrs["nccl_class"] == "0x020700"  # InfiniBand
    for lk in topo.links(LinkKind.PCIE):
        assert (lk.pcie_gen, lk.lanes) == (4, 16)
    assert topo.node("socket3").attrs["cpu_vendor"] == "AuthenticAMD"


# -- dump-style XML: real switches, NVLink, NVSwitch, C2C ------------------------------------

DUMP = """<system version="1">
  <cpu host_hash="0x1234" numaid="0x0" affinity="0000ffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:16:00.0" class="0x060400" vendor="0x1000" device="0xc030" subsystem_vendor="0x1000" subsystem_device="0x100b" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0000:18:00.0" class="0x030200" vendor="0x10de" device="0x2330" link_speed="32.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="90" rank="0" gdr="1">
          <nvlink target="0000:c7:00.0" count="5" tclass="0x068000"/>
          <nvlink target="0000:c8:00.0" count="5" tclass="0x068000"/>
          <nvlink target="0000:c9:00.0" count="4" tclass="0x068000"/>
          <nvlink target="0000:ca:00.0" count="4" tclass="0x068000"/>
        </gpu>
      </pci>
      <pci busid="0000:19:00.0" class="0x020000" vendor="0x15b3" device="0x1021" link_speed="32.0 GT/s PCIe" link_width="0">
        <nic>
          <net name="mlx5_0" dev="0" speed="400000" port="1" latency="0.000000" guid="0x1" maxconn="131072" gdr="1"/>
        </nic>
      </pci>
      <pcilink target="0000:27:00.0"/>
    </pci>
    <pci busid="0000:27:00.0" class="0x060400" vendor="0x1000" device="0xc030" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0000:2a:00.0" class="0x03" vendor="0x10de" device="0x2330" link_speed="32.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="90" rank="1" gdr="1">
          <nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/>
        </gpu>
      </pci>
    </pci>
    <nic>
      <net name="eth0" dev="1" speed="25000" port="1" gdr="0"/>
    </nic>
  </cpu>
  <cpu host_hash="0x1234" numaid="1" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:9a:00.0" class="0x030200" vendor="0x10de" device="0x20b0" link_speed="16 GT/s" link_width="16">
      <gpu dev="2" sm="80" rank="2" gdr="1">
        <nvlink target="0000:9b:00.0" count="12" tclass="0x030200"/>
        <nvlink target="0000:00:00.0" count="2" tclass="0x068001"/>
      </gpu>
    </pci>
    <pci busid="0000:9b:00.0" class="0x030200" vendor="0x10de" device="0x20b0" link_speed="16 GT/s" link_width="16">
      <gpu dev="3" sm="80" rank="3" gdr="1">
        <nvlink target="0000:9a:00.0" count="12" tclass="0x030200"/>
        <c2c bw="32000" count="4"/>
      </gpu>
    </pci>
  </cpu>
</system>
"""  # noqa: E501 (a doctest's or a capture's line, as printed)


@pytest.fixture(scope="module")
def dump() -> Topology:
    return parse_nccl_topo(DUMP, "dump.xml")


def test_dump_real_switches(dump: Topology) -> None:
    sw = dump.node("switch:0000:16:00.0")
    assert sw.kind == NodeKind.SWITCH and "virtual" not in sw.attrs
    assert (sw.vendor_id, sw.device_id) == ("1000", "c030")
    assert sw.attrs["pcilinks"] == ["0000:27:00.0"]
    assert dump.parent(sw.id).id == "socket0"
    assert _children_kinds(dump, sw.id) == ["gpu", "nic"]
    lk = dump.link_between(sw.id, "pci:0000:18:00.0")
    assert (lk.pcie_gen, lk.lanes) == (5, 16)
    # link_width="0" (sysfs did not say): the NIC's own end is unknown, the switch port's holds
    nic = dump.find("0000:19:00.0")
    assert nic.kind == NodeKind.NIC and nic.attrs["nets"][0]["name"] == "mlx5_0"
    assert nic.attrs["net_bytes_per_s"] == 400000 * 1e6 / 8
    # class "0x03" (NCCL writes it when it set the class itself) is a GPU
    assert dump.find("0000:2a:00.0").kind == NodeKind.GPU
    assert dump.node("pci:0000:2a:00.0").attrs["sm"] == 90


def test_dump_nvswitch_fabric(dump: Topology) -> None:
    fabric = dump.node(NVSWITCH_NODE)
    assert fabric.kind == NodeKind.OTHER
    assert "0000:c7:00.0" in fabric.attrs["targets"]
    for gpu in ("pci:0000:18:00.0", "pci:0000:2a:00.0"):
        lk = dump.link_between(NVSWITCH_NODE, gpu)
        assert lk.kind == LinkKind.NVLINK and lk.attrs["count"] == 18
        assert lk.bytes_per_s == pytest.approx(18 * 20.6e9)  # NCCL's SM90 figure
        assert lk.bandwidth_source == "nccl-nvlink-table"


def test_dump_gpu_pair_nvlink_counted_once(dump: Topology) -> None:
    a, b = "pci:0000:9a:00.0", "pci:0000:9b:00.0"
    gpu_pairs = [lk for lk in dump.links(LinkKind.NVLINK)
                 if {dump.node(lk.src).kind, dump.node(lk.dst).kind} == {NodeKind.GPU}]
    assert len(gpu_pairs) == 1
    lk = dump.link_between(a, b)
    assert lk.bytes_per_s == pytest.approx(12 * 20e9) and lk.attrs["count"] == 12


def test_dump_cpu_nvlink_and_c2c(dump: Topology) -> None:
    npu = dump.link_between("nvlink:socket1", "pci:0000:9a:00.0")
    assert npu.kind == LinkKind.NVLINK and npu.bytes_per_s == pytest.approx(2 * 20e9)
    c2c = dump.link_between("nvlink:socket1", "pci:0000:9b:00.0")
    assert c2c.attrs["c2c"] is True and c2c.bytes_per_s == 4 * 32000 * 1e6
    assert c2c.bandwidth_source == "nccl-xml"
    up = dump.link_between("socket1", "nvlink:socket1")
    assert up.bytes_per_s == pytest.approx(2 * 20e9 + 4 * 32e9)


def test_dump_loose_nic_and_sockets(dump: Topology) -> None:
    nic = dump.node("nic:socket0:0")
    assert nic.kind == NodeKind.NIC and nic.name == "eth0" and nic.attrs["virtual"] is True
    assert dump.parent(nic.id).id == "socket0"
    assert dump.counts()["socket"] == 2  # numaid="0x0" read as NCCL does (strtol base 0)
    assert dump.node("socket1").attrs["model_id"] == "143"


def test_numaid_minus_one_on_a_single_cpu() -> None:
    xml = ('<system version="1"><cpu numaid="-1" arch="x86_64">'
           '<pci busid="0000:05:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">'
           '<gpu dev="0" sm="90" rank="0" gdr="1"/></pci></cpu></system>')
    topo = parse_nccl_topo(xml, "vm.xml")
    assert topo.parent("pci:0000:05:00.0").id == "socket0"


def test_nvlink_table() -> None:
    assert nvlink_bytes_per_s(60) == 18e9
    assert nvlink_bytes_per_s(70) == 20e9
    assert nvlink_bytes_per_s(86) == 12e9
    assert nvlink_bytes_per_s(89) == 20e9
    assert nvlink_bytes_per_s(90) == pytest.approx(20.6e9)
    assert nvlink_bytes_per_s(100) == pytest.approx(40.1e9)


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("", 1, "an XML document"),
        ("GPU0\tX\tNV12\n", 1, "well-formed XML"),
        ('<topology version="2.0">\n</topology>', 1, "<system>"),
        ('<system version="1">\n</system>', 1, "<cpu"),
        ('<system version="1">\n<cpu arch="x86_64"/>\n</system>', 2, "numaid"),
        ('<system version="1">\n<cpu numaid="0"/>\n<cpu numaid="0"/></system>', 3, "one <cpu>"),
        ('<system><cpu numaid="0">\n<pci busid="10:1c.0"/></cpu></system>', 2, "bus id"),
        ('<system><cpu numaid="0">\n<pci busid="0000:10:1c.0"/>\n<pci busid="0000:10:1c.0"/>'
         "</cpu></system>", 3, "only once"),
        ('<system><cpu numaid="0">\n<pci busid="0000:10:1c.0" link_speed="fast"/></cpu></system>',
         2, "link_speed"),
        ('<system><cpu numaid="0">\n<pci busid="0000:10:1c.0" link_width="x16"/></cpu></system>',
         2, "link_width"),
        ('<system><cpu numaid="0">\n<pci busid="0000:10:1c.0" vendor="nvidia"/></cpu></system>',
         2, "vendor"),
        ('<system><cpu numaid="0"><pci busid="0000:10:1c.0" class="0x030200"><gpu sm="80">\n'
         '<nvlink target="0000:10:1d.0" tclass="0x030200"/></gpu></pci></cpu></system>', 2, "count"),
        ('<system><cpu numaid="0"><pci busid="0000:10:1c.0" class="0x030200"><gpu sm="80">\n'
         '<nvlink target="gpu1" count="2" tclass="0x030200"/></gpu></pci></cpu></system>', 2,
         "target"),
        ('<system version="one">\n<cpu numaid="0"/></system>', 1, "version"),
        ('<!DOCTYPE system [<!ENTITY x "y">]>\n<system/>', 1, "entity"),
    ],
)
def test_bad_input_names_source_and_line(text: str, line: int, expected: str) -> None:
    assert_parse_error(parse_nccl_topo, text, line, expected)


# -- properties: only ParseError or a topology ---------------------------------------------


def _parse_or_parse_error(text: str) -> None:
    parses_or_refuses(parse_nccl_topo, text, "fuzz.xml")


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=400))
def test_random_text(text: str) -> None:
    _parse_or_parse_error(text)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    _parse_or_parse_error(data.decode("latin-1"))


_VALUES = st.sampled_from(["", "-1", "0", "0x", "0x068001", "0x068000", "0x03", "0x060400",
                           "ffff:ff:01.0", "0000:10:1c.0", "0000:9a:00.0", "16 GT/s", "99", "abc",
                           "99999999999999999999"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=st.sampled_from(["aws", "azure", "dump"]),
       op=st.sampled_from(["delete", "duplicate", "cut", "flip", "swap", "value"]),
       data=st.data())
def test_mutated_real_input(source: str, op: str, data: st.DataObject) -> None:
    text = {"aws": lambda: _text(AWS), "azure": lambda: _text(AZURE), "dump": lambda: DUMP}[source]()
    if op != "value":
        _parse_or_parse_error(data.draw(mutated_text([text], '<>/"=x0f-: \n', (op,), keepends=True)))
        return
    lines = text.splitlines(keepends=True)  # an attribute value replaced by a plausible wrong one
    i = data.draw(st.integers(0, len(lines) - 1), label="line")
    parts = lines[i].split('"')
    if len(parts) > 2:
        k = data.draw(st.integers(0, (len(parts) - 2) // 2), label="attr") * 2 + 1
        parts[k] = data.draw(_VALUES, label="value")
        lines[i] = '"'.join(parts)
    _parse_or_parse_error("".join(lines))
