"""lspci parsers (``-tv``, ``-vvv``/``-vvnn``) on the real captures, and their failure modes.

The facts asserted here are those of ``shared/fixtures/topology/INDEX.md``
and ``expected.json``; topologies are built through ``build_pci_topology``
(via ``topology_from_lspci``).
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import ParseError
from planner.topology.lspci.names import class_from_name, vendor_from_name
from planner.topology.lspci.parse import (
    merge_lspci,
    parse_lspci,
    parse_lspci_verbose,
    topology_from_lspci,
)
from planner.topology.lspci.tree import parse_lspci_tree
from planner.topology.model import NodeKind, Topology
from planner.topology.pcitree import PciFunction
from planner.topology.textio import guess_format, read_text
from tests.conftest import TOPOLOGY_FIXTURES, expected_counts, topology_fixture
from tests.fuzz import mutated_text, parses_or_refuses

DELL = "dell-poweredge-r640-2x-xeon-gold6230-nvme"
HPE = "hpe-cray-xd665-2x-epyc9354-h100"
ASUS = "asus-esc8000a-e12-epyc9374f-stelline"
PUGET = "puget-rackstation-wrx90-trpro-stelline"
RC4ML = "rc4ml-moment-2s-xeon-gold-5320"

ASUS_VVV = ("01", "21", "41", "71", "81", "b1", "c1", "e1")
PUGET_VVV = ("11", "21", "c1", "c2")


def text_of(machine: str, filename: str) -> str:
    return read_text(topology_fixture(machine, filename))


def by_address(fns: list[PciFunction]) -> dict[str, PciFunction]:
    return {f.address: f for f in fns}


def vvv_texts(machine: str, buses: tuple[str, ...]) -> list[tuple[str, str]]:
    out = []
    for b in buses:
        path = topology_fixture(machine, f"lspci-vvv-s-{b}_00.0.txt")
        out.append((read_text(path), str(path)))
    return out


def machine_topology(machine: str) -> Topology:
    """The topology the lspci captures of ``machine`` give."""
    if machine in (DELL, HPE):
        path = topology_fixture(machine, "lspci-vvnn.txt")
        return topology_from_lspci(verbose_texts=[(read_text(path), str(path))], name=machine)
    if machine == RC4ML:
        path = topology_fixture(machine, "lspci-t-pruned.txt")
        return topology_from_lspci(read_text(path), source=str(path), name=machine)
    buses = ASUS_VVV if machine == ASUS else PUGET_VVV
    path = topology_fixture(machine, "lspci-tv.txt")
    return topology_from_lspci(read_text(path), vvv_texts(machine, buses), source=str(path),
                               name=machine)


@pytest.fixture(scope="module")
def dell() -> Topology:
    return machine_topology(DELL)


@pytest.fixture(scope="module")
def hpe() -> Topology:
    return machine_topology(HPE)


@pytest.fixture(scope="module")
def asus() -> Topology:
    return machine_topology(ASUS)


@pytest.fixture(scope="module")
def puget() -> Topology:
    return machine_topology(PUGET)


@pytest.fixture(scope="module")
def rc4ml() -> Topology:
    return machine_topology(RC4ML)


def switches_above(topo: Topology, node_id: str) -> list[str]:
    return [a.id for a in topo.ancestors(node_id) if a.kind == NodeKind.SWITCH]


def link_gen_lanes(topo: Topology, node_id: str) -> tuple[int | None, int | None]:
    parent = topo.parent(node_id)
    assert parent is not None
    lk = topo.link_between(parent.id, node_id)
    assert lk is not None
    return lk.pcie_gen, lk.lanes


# ---------------------------------------------------------------------------
# lspci -tv / -t


class TestTree:
    def test_asus_root_buses_and_highpoint_chain(self):
        fns = parse_lspci_tree(text_of(ASUS, "lspci-tv.txt"), "asus")
        f = by_address(fns)
        roots = sorted({a[:7] for a, fn in f.items() if fn.parent is None})
        assert roots == [f"0000:{b}" for b in ("00", "20", "40", "60", "80", "a0", "c0", "e0")]
        # 65:00.0 <- 64:10.0 <- 63:00.0 <- 62:00.0 <- 61:00.0 <- 60:01.1 (4 bridges, 2 switch levels)
        chain, cur = [], "0000:65:00.0"
        while f[cur].parent is not None:
            cur = f[cur].parent
            chain.append(cur)
        assert chain == ["0000:64:10.0", "0000:63:00.0", "0000:62:00.0", "0000:61:00.0",
                         "0000:60:01.1"]
        port = f["0000:60:01.1"]
        assert port.is_bridge and (port.secondary_bus, port.subordinate_bus) == (0x61, 0x73)
        assert (f["0000:62:00.0"].secondary_bus, f["0000:62:00.0"].subordinate_bus) == (0x63, 0x68)
        # empty buses: 70:15.0 -> [72], 62:1c.0 -> [73]
        for empty in ("0000:70:15.0", "0000:62:1c.0"):
            assert f[empty].is_bridge
            assert not [a for a, fn in f.items() if fn.parent == empty]
        gpu = f["0000:01:00.0"]
        assert gpu.parent == "0000:00:01.1" and not gpu.is_bridge
        assert gpu.name == "NVIDIA Corporation AD102GL [RTX 6000 Ada Generation]"
        assert f["0000:01:00.1"].name == "NVIDIA Corporation AD102 High Definition Audio Controller"

    def test_asus_classes_from_names(self):
        f = by_address(parse_lspci_tree(text_of(ASUS, "lspci-tv.txt"), "asus"))
        nvme = sorted(a for a, fn in f.items() if fn.class_code == "0108")
        assert len(nvme) == 17  # 16 S4LV008 behind the HighPoint cards + the SM981
        assert "0000:02:00.0" in nvme
        for hp in ("0000:71:00.0", "0000:b1:00.0", "0000:e2:00.0"):  # HighPoint: RAID, not NVMe
            assert f[hp].class_code == "0104" and f[hp].vendor_id == "1103"
        assert [a for a, fn in f.items() if fn.class_code in ("0300", "0302")] == [
            "0000:01:00.0", "0000:41:00.0", "0000:75:00.0", "0000:c1:00.0", "0000:e1:00.0"]
        assert f["0000:75:00.0"].vendor_id == "1a03"  # the BMC's ASPEED VGA: a display, not a GPU
        assert f["0000:01:00.1"].class_code == "0403"
        assert f["0000:01:00.0"].vendor_id == "10de"
        assert f["0000:01:00.0"].attrs["class_from_name"] is True
        # AMD internal functions stay unknown
        for amd in ("0000:03:00.0", "0000:03:00.1", "0000:00:01.0", "0000:e3:00.4"):
            assert f[amd].class_code is None and f[amd].vendor_id == "1022", amd
        assert f["0000:21:00.0"].class_code[:2] == "02"
        assert f["0000:82:00.0"].class_code == "0200"

    def test_puget_asmedia_and_highpoint(self):
        f = by_address(parse_lspci_tree(text_of(PUGET, "lspci-tv.txt"), "puget"))
        assert sorted({a[:7] for a, fn in f.items() if fn.parent is None}) == [
            "0000:00", "0000:20", "0000:c0", "0000:e0"]
        usb4 = f["0000:20:03.1"]
        assert (usb4.secondary_bus, usb4.subordinate_bus) == (0x22, 0x89)
        assert f["0000:88:00.0"].parent == "0000:23:02.0"
        assert f["0000:89:00.0"].parent == "0000:23:03.0"
        assert f["0000:8a:00.0"].parent == "0000:20:03.2" and f["0000:8a:00.0"].class_code == "0108"
        nvme = [a for a, fn in f.items() if fn.class_code == "0108"]
        assert len(nvme) == 9
        assert f["0000:11:00.0"].class_code == "0104"

    def test_rc4ml_pruned_tree_without_names(self):
        text = text_of(RC4ML, "lspci-t-pruned.txt")
        assert not text.endswith("\n") and text.startswith(" +-[0000:e2]")
        f = by_address(parse_lspci_tree(text, "rc4ml"))
        assert [a[:7] for a, fn in f.items() if fn.parent is None and a.endswith(":00.0")] == [
            "0000:e2", "0000:c9", "0000:b0", "0000:30", "0000:16"]
        assert all(fn.name == "" and fn.class_code is None for fn in f.values())
        endpoints = [a for a, fn in f.items() if not fn.is_bridge and fn.parent is not None]
        assert len(endpoints) == 17
        assert len({a[:7] for a in endpoints}) == 16
        assert {"0000:36:00.0", "0000:36:00.1"} <= set(endpoints)
        assert f["0000:31:00.0"].parent == "0000:30:02.0"
        assert f["0000:32:00.0"].parent == "0000:31:00.0"
        assert f["0000:33:00.0"].parent == "0000:32:00.0"
        assert [a for a, fn in f.items() if fn.parent == "0000:33:00.0"] == [
            f"0000:34:0{d}.0" for d in range(5)]
        assert [a for a, fn in f.items() if fn.parent == "0000:31:00.0"] == [
            f"0000:32:0{d}.0" for d in range(5)]
        for empty in ("0000:32:03.0", "0000:e2:03.0", "0000:c9:05.0"):  # buses 3c, e4, cd
            assert not [a for a, fn in f.items() if fn.parent == empty]
        assert (f["0000:30:02.0"].secondary_bus, f["0000:30:02.0"].subordinate_bus) == (0x31, 0x3d)

    def test_single_root_bus_and_numeric_names(self):
        text = ("-[0000:00]-+-00.0  8086:2020\n"
                "           +-01.0-[01]----00.0  NVIDIA Corporation GA100 [A100 PCIe 80GB] [10de:20b5]\n"
                "           \\-02.0-[02]--\n")
        f = by_address(parse_lspci_tree(text, "tn"))
        assert (f["0000:00:00.0"].vendor_id, f["0000:00:00.0"].device_id) == ("8086", "2020")
        gpu = f["0000:01:00.0"]
        assert (gpu.vendor_id, gpu.device_id, gpu.class_code) == ("10de", "20b5", "0302")
        assert gpu.name == "NVIDIA Corporation GA100 [A100 PCIe 80GB]"

    def test_domains_other_than_zero(self):
        text = "-+-[0000:00]-+-00.0\n \\-[10000:e0]-+-00.0\n              \\-02.0-[e1]----00.0\n"
        f = by_address(parse_lspci_tree(text, "vmd"))
        assert f["10000:e1:00.0"].parent == "10000:e0:02.0"

    def test_sudo_prompt_before_the_tree_is_skipped(self):
        fns = parse_lspci_tree("[sudo] password for sonata:\n-[0000:00]---00.0  Intel Corporation Device 2020\n")
        assert [f.address for f in fns] == ["0000:00:00.0"]

    @pytest.mark.parametrize("text, line, expected", [
        ("", None, "lspci -t output"),
        ("hello world\n", 1, "lspci -t output"),
        ("-[0000:00]-+-00.0\n          +-01.0\n", 2, "continuing an open '+-' branch"),
        ("-+-[0000:00]-+-00.0\n |\n", 2, "a tree line"),
        ("-[0000:00]-+-00.0\n           +-zz.0\n", 2, "device and function number"),
        ("-[0000:00]-+-00.0 Intel\n", 1, "two spaces and a device name"),
        ("-[0000:00]-+-00.0\n           \\-00.0\n", 2, "each PCI function once"),
        ("-[0000:00]-+-00.0\n           \\-01.0-[05-02]--\n", 2, "higher number last"),
    ])
    def test_errors_name_line_and_expectation(self, text, line, expected):
        with pytest.raises(ParseError) as err:
            parse_lspci_tree(text, "bad.txt")
        assert err.value.source == "bad.txt"
        assert err.value.line == line
        assert expected in err.value.expected

    def test_verbose_output_given_as_tree(self):
        with pytest.raises(ParseError, match="looks like the output of lspci -v, not lspci -t"):
            parse_lspci_tree(text_of(DELL, "lspci-vvnn.txt"), "dell")


# ---------------------------------------------------------------------------
# lspci -vvnn / -vvv


class TestVerbose:
    def test_dell_functions_numa_and_bridges(self):
        fns = parse_lspci_verbose(text_of(DELL, "lspci-vvnn.txt"), "dell")
        assert len(fns) == 288
        assert sum(f.class_code == "0604" for f in fns) == 13
        assert sum(f.is_bridge for f in fns) == 13
        numa = {}
        for f in fns:
            numa.setdefault(f.address[5:7], set()).add(f.numa_node)
        for bus in ("00", "17", "3a", "5d"):
            assert numa[bus] == {0}, bus
        for bus in ("80", "85", "ae", "d7"):
            assert numa[bus] == {1}, bus
        host = by_address(fns)["0000:00:00.0"]
        assert host.class_code == "0600" and not host.is_bridge  # a Root Port capability, no bus

    def test_dell_nvme_and_their_ports(self):
        f = by_address(parse_lspci_verbose(text_of(DELL, "lspci-vvnn.txt"), "dell"))
        for ssd, port, slot, bay in (("88", "85:02.0", "168", 8), ("89", "85:03.0", "169", 9)):
            d = f[f"0000:{ssd}:00.0"]
            assert (d.class_code, d.vendor_id, d.device_id) == ("0108", "8086", "0a54")
            assert d.numa_node == 1 and d.slot == slot
            assert d.link_cap == (3, 4) and d.link_sta == (3, 4)
            assert d.attrs["device_name"] == f"PCIe SSD in Slot {bay} Bay 1"
            p = f[f"0000:{port}"]
            assert p.port_type == "root" and p.slot == slot and p.attrs["slot_implemented"] is True
            assert p.secondary_bus == int(ssd, 16) and p.link_cap == (3, 4)
        assert f["0000:85:02.0"].device_id == "2032" and f["0000:85:03.0"].device_id == "2033"
        # "Physical Slot: 0-4" is the slot the port itself sits in (ACPI), not the #168 it drives
        assert f["0000:85:02.0"].attrs["physical_slot"] == "0-4"

    def test_dell_empty_hotplug_ports_are_link_down(self):
        f = by_address(parse_lspci_verbose(text_of(DELL, "lspci-vvnn.txt"), "dell"))
        empty = {"85:00.0": ("166", 0x86), "85:01.0": ("167", 0x87), "ae:00.0": ("164", 0xaf),
                 "ae:01.0": ("165", 0xb0), "ae:02.0": ("162", 0xb1), "ae:03.0": ("163", 0xb2)}
        for port, (slot, bus) in empty.items():
            p = f[f"0000:{port}"]
            assert p.slot == slot and p.secondary_bus == bus
            assert p.link_cap == (3, 4) and p.link_sta is None  # "Speed 2.5GT/s, Width x0"

    def test_dell_slot_zero_is_on_board(self):
        f = by_address(parse_lspci_verbose(text_of(DELL, "lspci-vvnn.txt"), "dell"))
        pch = f["0000:00:1c.0"]  # Root Port (Slot+) with "Slot #0": the on-board I350
        assert pch.attrs["slot_implemented"] is True and pch.attrs["slot_number"] == 0
        assert pch.slot is None
        nic = f["0000:01:00.0"]
        assert nic.parent is None and nic.link_cap == (2, 4) and nic.link_sta == (2, 2)
        assert f["0000:17:00.0"].slot is None  # no Slot+, only a "Physical Slot: 0"

    def test_hpe_switches_gpus_and_links(self):
        f = by_address(parse_lspci_verbose(text_of(HPE, "lspci-vvnn.txt"), "hpe"))
        assert len(f) == 172
        switch_fns = [a for a, fn in f.items() if (fn.vendor_id, fn.device_id) == ("1000", "c030")]
        assert len(switch_fns) == 18
        for usp in ("01", "61", "81", "e1"):
            u = f[f"0000:{usp}:00.0"]
            assert u.port_type == "upstream" and u.link_cap == (5, 16) and u.link_sta == (5, 16)
        dsp = f["0000:02:01.0"]
        assert dsp.port_type == "downstream" and dsp.slot == "7"
        assert f["0000:02:1f.0"].slot is None  # the management port has no Slot+
        for gpu, slot, numa in (("04", "7", 0), ("64", "8", 0), ("84", "5", 1), ("e4", "6", 1)):
            g = f[f"0000:{gpu}:00.0"]
            assert (g.class_code, g.vendor_id, g.device_id) == ("0302", "10de", "2330")
            assert g.slot == slot and g.numa_node == numa
            assert g.link_cap == (5, 16) and g.link_sta == (5, 16)
        assert f["0000:05:00.0"].link_sta == (4, 4) and f["0000:05:00.0"].slot == "100"
        assert f["0000:c1:00.0"].link_sta == (3, 4) and f["0000:c0:01.1"].slot == "11"
        for amd_port in ("0000:00:01.1", "0000:60:05.3"):  # Slot+ but "Slot #0"
            assert f[amd_port].slot is None
        assert f["0000:66:00.0"].port_type == "pci-bridge"
        assert f["0000:00:00.3"].port_type is None  # Root Complex Event Collector

    def test_asus_per_device_space_indented(self):
        texts = vvv_texts(ASUS, ASUS_VVV)
        f = {}
        for text, src in texts:
            assert "\t" not in text  # pasted into markdown: spaces only
            fns = parse_lspci_verbose(text, src)
            assert len(fns) == 1
            f[fns[0].address] = fns[0]
        gpu = f["0000:01:00.0"]
        assert gpu.class_code == "0300" and gpu.vendor_id == "10de" and gpu.device_id is None
        assert gpu.numa_node == 0 and gpu.slot == "3" and gpu.port_type == "legacy-endpoint"
        assert gpu.link_cap == (4, 16) and gpu.link_sta == (1, 16)  # "2.5GT/s (downgraded), x16"
        assert [f[f"0000:{b}:00.0"].numa_node for b in ("41", "c1", "e1")] == [0, 1, 1]
        assert f["0000:21:00.0"].class_code == "0200" and f["0000:21:00.0"].link_cap == (5, 16)
        hp = f["0000:71:00.0"]
        assert hp.class_code == "0104" and hp.link_sta == (2, 1)

    def test_puget_sudo_prompt_is_skipped(self):
        text = text_of(PUGET, "lspci-vvv-s-c1_00.0.txt")
        assert text.startswith("[sudo] password for sonata:")
        (gpu,) = parse_lspci_verbose(text, "c1")
        assert gpu.address == "0000:c1:00.0" and gpu.numa_node is None
        assert gpu.link_cap == (4, 16)

    def test_names_without_nn_and_numeric_output(self):
        text = ("00:1f.2 SATA controller: Intel Corporation C620 Series Chipset (rev 09)\n"
                "\n0000:01:00.0 0108: 144d:a80a\n"
                "05:00.0 Class 0880: Device 1234:5678\n"
                "06:00.0 Some new class: Foo Corp Bar NVMe SSD\n")
        f = by_address(parse_lspci_verbose(text, "mixed"))
        assert f["0000:00:1f.2"].class_code == "0106"
        assert f["0000:00:1f.2"].attrs["revision"] == "09"
        assert (f["0000:01:00.0"].class_code, f["0000:01:00.0"].vendor_id) == ("0108", "144d")
        assert (f["0000:05:00.0"].class_code, f["0000:05:00.0"].device_id) == ("0880", "5678")
        assert f["0000:06:00.0"].class_code == "0108"
        assert f["0000:06:00.0"].attrs["class_from_name"] is True

    def test_unnumbered_bridge(self):
        text = ("00:03.0 PCI bridge [0604]: X [1022:1483]\n"
                "\tBus: primary=00, secondary=00, subordinate=00, sec-latency=0\n")
        (br,) = parse_lspci_verbose(text, "x")
        assert br.is_bridge and br.secondary_bus is None
        assert br.attrs["bus_numbers_unassigned"] is True

    @pytest.mark.parametrize("text, line, expected", [
        ("", None, "device line"),
        ("\t\tLnkSta:\tSpeed 8GT/s, Width x4\n", 1, "device line"),
        ("00:01.0 PCI bridge: X\n\tLnkSta:\tSpeed 9GT/s, Width x4\n", 2, "lane rate"),
        ("00:01.0 PCI bridge: X\n\tLnkCap:\tPort #0, Speed 8GT/s\n", 2, "LnkCap"),
        ("00:01.0 PCI bridge: X\n\tNUMA node: zero\n", 2, "NUMA node"),
        ("00:01.0 PCI bridge: X\n\tBus: primary=00\n", 2, "Bus: primary"),
        ("00:01.0 PCI bridge: X\ngarbage\n", 2, "device line"),
        ("00:01.0 PCI bridge: X\n\n00:01.0 PCI bridge: X\n", 3, "each PCI function once"),
        ("85:02.0 PCI bridge [0604]: Intel Corporation Root Port C [8086:2032", 1, "not closed"),
        ("00:00.0 Host [0600]: ok [8086:2020]\n85:02.0 PCI bridge [0604]: Intel\n", 2, "[vvvv:dddd]"),
    ])
    def test_errors_name_line_and_expectation(self, text, line, expected):
        with pytest.raises(ParseError) as err:
            parse_lspci_verbose(text, "bad.txt")
        assert err.value.source == "bad.txt"
        assert err.value.line == line
        assert expected in err.value.expected

    def test_grep_output_is_recognised(self):
        with pytest.raises(ParseError, match="detail lines of lspci -vvv without their device lines"):
            parse_lspci_verbose(text_of(ASUS, "lspci-vvv-grep-ACSCtl.txt"), "acs")

    def test_tree_given_as_verbose(self):
        with pytest.raises(ParseError, match="looks like the output of lspci -t, not lspci -v"):
            parse_lspci_verbose(text_of(ASUS, "lspci-tv.txt"), "asus")


# ---------------------------------------------------------------------------
# format detection, merging


class TestDetectAndMerge:
    @pytest.mark.parametrize("machine, filename, kind", [
        (DELL, "lspci-vvnn.txt", "verbose"),
        (ASUS, "lspci-tv.txt", "tree"),
        (RC4ML, "lspci-t-pruned.txt", "tree"),
        (PUGET, "lspci-vvv-s-c1_00.0.txt", "verbose"),
    ])
    def test_parse_lspci_detects_the_format(self, machine, filename, kind):
        fns = parse_lspci(text_of(machine, filename), filename)
        has_parents = any(f.parent for f in fns)
        assert has_parents == (kind == "tree")

    @pytest.mark.parametrize("machine, filename, what", [
        (DELL, "dmidecode.txt", "the output of dmidecode"),
        (ASUS, "nvidia-smi-topo.txt", "the output of nvidia-smi topo -m"),
        (ASUS, "numactl-hardware.txt", "the output of numactl --hardware"),
        (ASUS, "lscpu.txt", "the output of lscpu"),
        ("nvidia-dgx2h-hwloc", "hwloc.xml", "hwloc XML"),
        ("aws-p4d-24xlarge-nccl", "nccl-topo.xml", "NCCL topology XML"),
        (RC4ML, "pcie_subset.json", "a JSON document"),
    ])
    def test_other_captures_are_named(self, machine, filename, what):
        text = text_of(machine, filename)
        assert guess_format(text) is not None and what in guess_format(text)
        with pytest.raises(ParseError) as err:
            parse_lspci(text, filename)
        assert "this looks like" in str(err.value) and what in str(err.value)
        assert "not lspci" in str(err.value)
        assert err.value.source == filename and err.value.line is not None

    def test_empty_input(self):
        with pytest.raises(ParseError, match="empty"):
            parse_lspci("\n\n", "e.txt")
        with pytest.raises(ParseError):
            topology_from_lspci(source="nothing")

    def test_merge_keeps_tree_hierarchy_and_takes_dump_properties(self):
        tree = parse_lspci_tree(text_of(ASUS, "lspci-tv.txt"), "asus")
        dumps = [f for text, src in vvv_texts(ASUS, ASUS_VVV) for f in parse_lspci_verbose(text, src)]
        merged = by_address(merge_lspci(tree, dumps))
        assert len(merged) == len(tree)  # every dumped device is in the tree
        hp = merged["0000:71:00.0"]
        assert hp.parent == "0000:70:14.0" and hp.class_code == "0104"
        assert "class_from_name" not in hp.attrs  # the dump's class code replaced the guess
        assert hp.numa_node == 0 and hp.link_cap == (2, 2)
        gpu = merged["0000:c1:00.0"]
        assert gpu.numa_node == 1 and gpu.class_code == "0300" and gpu.parent == "0000:c0:01.1"

    def test_merge_appends_and_combines_dumps(self):
        tree = [PciFunction("0000:00:01.0", is_bridge=True, secondary_bus=1, subordinate_bus=1)]
        a = PciFunction("0000:01:00.0", class_code="0108", numa_node=None, link_cap=(4, 4))
        b = PciFunction("01:00.0", numa_node=1)
        merged = merge_lspci(tree, [a, b])
        assert [f.address for f in merged] == ["0000:00:01.0", "0000:01:00.0"]
        assert (merged[1].class_code, merged[1].numa_node, merged[1].link_cap) == ("0108", 1, (4, 4))


# ---------------------------------------------------------------------------
# topologies of the real machines


def test_expected_counts():
    expected = expected_counts()
    for machine in (DELL, HPE, ASUS, PUGET, RC4ML):
        counts = machine_topology(machine).counts()
        want = dict(expected[machine])
        if machine == DELL:
            # 11 slots are with dmidecode; lspci alone sees the 8 U.2 bays' SltCap
            # (the 3 x16 "PCIe Slot 1..3" have no port with Slot+ and a number).
            assert want.pop("slot") == 11 and counts["slot"] == 8
        assert {k: counts[k] for k in want} == want, machine


class TestDell:
    def test_counts(self, dell):
        c = dell.counts()
        assert (c["gpu"], c["nvme"], c["switch"], c["socket"]) == (0, 2, 0, 2)

    def test_nvme_in_slots_of_cpu2_root_ports(self, dell):
        for ssd, slot, port in (("88", "168", "85:02.0"), ("89", "169", "85:03.0")):
            node_id = f"pci:0000:{ssd}:00.0"
            parent = dell.parent(node_id)
            assert parent.kind == NodeKind.SLOT and parent.attrs["designation"] == slot
            assert parent.attrs["port"] == f"0000:{port}" and parent.attrs["in_use"] is True
            socket = dell.parent(parent.id)
            assert socket.kind == NodeKind.SOCKET and socket.attrs["numa_nodes"] == [1]
            assert dell.socket_of(node_id).id == socket.id
            assert link_gen_lanes(dell, node_id) == (3, 4)
            assert dell.node(node_id).numa_node == 1

    def test_six_empty_u2_slots(self, dell):
        empty = [s for s in dell.nodes(NodeKind.SLOT) if not dell.children(s.id)]
        assert sorted(s.attrs["designation"] for s in empty) == ["162", "163", "164", "165", "166", "167"]
        assert all(s.attrs["in_use"] is False and s.attrs["width_lanes"] == 4 for s in empty)
        assert {dell.parent(s.id).id for s in empty} == {"socket1"}

    def test_nics(self, dell):
        assert {n.bus_address for n in dell.nodes(NodeKind.NIC)} == {"0000:01:00.0", "0000:19:00.0"}
        assert link_gen_lanes(dell, "pci:0000:19:00.0") == (2, 8)
        assert dell.parent("pci:0000:01:00.0").id == "socket0"  # PCH port "Slot #0": no slot node


class TestHpe:
    def test_counts(self, hpe):
        c = hpe.counts()
        assert (c["gpu"], c["nvme"], c["switch"], c["socket"]) == (4, 3, 4, 2)

    def test_switches_collapse_and_uplinks(self, hpe):
        switches = {s.bus_address: s for s in hpe.nodes(NodeKind.SWITCH)}
        assert sorted(switches) == ["0000:01:00.0", "0000:61:00.0", "0000:81:00.0", "0000:e1:00.0"]
        assert switches["0000:01:00.0"].attrs["ports"] == [
            "0000:01:00.0", "0000:02:00.0", "0000:02:01.0", "0000:02:02.0", "0000:02:1f.0"]
        assert switches["0000:61:00.0"].attrs["ports"] == [
            "0000:61:00.0", "0000:62:00.0", "0000:62:01.0", "0000:62:02.0"]
        assert sum(len(s.attrs["ports"]) for s in switches.values()) == 18
        for s in switches.values():
            assert (s.vendor_id, s.device_id) == ("1000", "c030")
            assert hpe.parent(s.id).kind == NodeKind.SOCKET  # directly on an AMD root port
            assert link_gen_lanes(hpe, s.id) == (5, 16)
        assert {a: hpe.socket_of(s.id).attrs["numa_nodes"] for a, s in switches.items()} == {
            "0000:01:00.0": [0], "0000:61:00.0": [0], "0000:81:00.0": [1], "0000:e1:00.0": [1]}

    def test_one_gpu_per_switch(self, hpe):
        where = {}
        for gpu in hpe.nodes(NodeKind.GPU):
            assert (gpu.vendor_id, gpu.device_id) == ("10de", "2330")
            assert link_gen_lanes(hpe, gpu.id) == (5, 16)
            (sw,) = switches_above(hpe, gpu.id)
            where[gpu.bus_address] = (sw, hpe.parent(gpu.id).attrs["designation"],
                                      hpe.socket_of(gpu.id).attrs["numa_nodes"])
        assert where == {
            "0000:04:00.0": ("switch:0000:01:00.0", "7", [0]),
            "0000:64:00.0": ("switch:0000:61:00.0", "8", [0]),
            "0000:84:00.0": ("switch:0000:81:00.0", "5", [1]),
            "0000:e4:00.0": ("switch:0000:e1:00.0", "6", [1]),
        }

    def test_nvme(self, hpe):
        nvme = {n.bus_address: n for n in hpe.nodes(NodeKind.NVME)}
        assert sorted(nvme) == ["0000:05:00.0", "0000:65:00.0", "0000:c1:00.0"]
        assert switches_above(hpe, "pci:0000:05:00.0") == ["switch:0000:01:00.0"]
        assert switches_above(hpe, "pci:0000:65:00.0") == ["switch:0000:61:00.0"]
        marvell = nvme["0000:c1:00.0"]
        assert (marvell.vendor_id, marvell.device_id) == ("1b4b", "2241")
        slot = hpe.parent(marvell.id)
        assert slot.attrs["designation"] == "11" and slot.attrs["port"] == "0000:c0:01.1"
        assert hpe.parent(slot.id).kind == NodeKind.SOCKET
        assert hpe.socket_of(marvell.id).attrs["numa_nodes"] == [1]
        assert switches_above(hpe, marvell.id) == []
        assert link_gen_lanes(hpe, "pci:0000:05:00.0") == (4, 4)


class TestAsus:
    def test_counts_and_sockets(self, asus):
        c = asus.counts()
        assert (c["gpu"], c["nvme"], c["socket"]) == (4, 17, 2)
        assert "socket?" not in asus  # every root bus got a NUMA node from a -vvv file

    def test_gpus_numa_from_vvv_files(self, asus):
        numa = {g.bus_address: (g.numa_node, asus.socket_of(g.id).id, asus.parent(g.id).id)
                for g in asus.nodes(NodeKind.GPU)}
        assert numa == {
            "0000:01:00.0": (0, "socket0", "socket0"),
            "0000:41:00.0": (0, "socket0", "socket0"),
            "0000:c1:00.0": (1, "socket1", "socket1"),
            "0000:e1:00.0": (1, "socket1", "socket1"),
        }
        assert asus.node("pci:0000:01:00.0").attrs["functions"] == ["0000:01:00.0", "0000:01:00.1"]
        assert link_gen_lanes(asus, "pci:0000:01:00.0") == (4, 16)

    def test_highpoint_nvme_behind_two_switch_levels(self, asus):
        behind = [n for n in asus.nodes(NodeKind.NVME) if n.bus_address != "0000:02:00.0"]
        assert len(behind) == 16
        for n in behind:
            assert len(switches_above(asus, n.id)) == 2, n.id
            assert "S4LV008" in n.name
        assert switches_above(asus, "pci:0000:65:00.0") == ["switch:0000:63:00.0", "switch:0000:61:00.0"]
        assert asus.socket_of("pci:0000:65:00.0").id == "socket0"
        assert asus.socket_of("pci:0000:a5:00.0").id == "socket1"
        for hp in ("0000:71:00.0", "0000:b1:00.0", "0000:e2:00.0"):
            assert asus.find(hp).kind == NodeKind.OTHER

    def test_nics(self, asus):
        assert asus.socket_of("pci:0000:21:00.0").id == "socket0"
        assert asus.socket_of("pci:0000:81:00.0").id == "socket1"
        assert link_gen_lanes(asus, "pci:0000:21:00.0") == (5, 16)

    def test_tree_alone(self):
        path = topology_fixture(ASUS, "lspci-tv.txt")
        topo = topology_from_lspci(read_text(path), source=str(path))
        c = topo.counts()
        assert (c["gpu"], c["nvme"], c["socket"]) == (4, 17, 1)
        assert "socket?" in topo and topo.notes  # no NUMA node anywhere: said, not guessed


class TestPuget:
    def test_counts(self, puget):
        c = puget.counts()
        assert (c["gpu"], c["nvme"], c["socket"]) == (2, 9, 1)
        # the -vvv files of this 1-NUMA-node machine print no "NUMA node:" line
        assert "socket?" in puget

    def test_devices(self, puget):
        assert puget.parent("pci:0000:c1:00.0").id == puget.parent("pci:0000:c2:00.0").id
        assert puget.find("0000:11:00.0").kind == NodeKind.OTHER  # the HighPoint controller
        assert puget.find("0000:8a:00.0").kind == NodeKind.NVME  # KC3000
        for n in puget.nodes(NodeKind.NVME):
            if "S4LV008" in n.name:
                assert len(switches_above(puget, n.id)) == 2
        asmedia = puget.find("0000:22:00.0")
        assert asmedia.kind == NodeKind.SWITCH
        assert puget.parent("pci:0000:88:00.0").id == asmedia.id


class TestRc4ml:
    def test_two_cascaded_switches(self, rc4ml):
        sw = {s.name: s for s in rc4ml.nodes(NodeKind.SWITCH)}
        assert sorted(sw) == ["switch 0", "switch 1"]
        assert sw["switch 0"].bus_address == "0000:31:00.0"
        assert sw["switch 1"].bus_address == "0000:33:00.0"
        assert rc4ml.parent(sw["switch 1"].id).id == sw["switch 0"].id
        assert rc4ml.parent(sw["switch 0"].id).kind == NodeKind.SOCKET

    def test_endpoints(self, rc4ml):
        devices = [n for n in rc4ml.nodes() if n.kind not in (NodeKind.SOCKET, NodeKind.MEMORY,
                                                               NodeKind.SWITCH, NodeKind.SLOT)]
        assert len(devices) == 16
        assert sum(len(n.attrs["functions"]) for n in devices) == 17
        assert len(switches_above(rc4ml, "pci:0000:35:00.0")) == 2
        assert switches_above(rc4ml, "pci:0000:3a:00.0") == ["switch:0000:31:00.0"]
        assert rc4ml.counts()["switch"] == 2


# ---------------------------------------------------------------------------
# names


@pytest.mark.parametrize("name, code", [
    ("Samsung Electronics Co Ltd NVMe SSD Controller SM981/PM981/PM983", "0108"),
    ("Kingston Technology Company, Inc. KC3000/FURY Renegade NVMe SSD E18", "0108"),
    ("Marvell Technology Group Ltd. 88NR2241 Non-Volatile memory controller", "0108"),
    ("HighPoint Technologies, Inc. SSD7540 PCIe Gen4 x16 8-Port M.2 NVMe RAID Controller", "0104"),
    ("Intel Corporation Volume Management Device NVMe RAID Controller", "0104"),
    ("Broadcom / LSI SAS3008 PCI-Express Fusion-MPT SAS-3", "0107"),
    ("Advanced Micro Devices, Inc. [AMD] 600 Series Chipset SATA Controller", "0106"),
    ("Mellanox Technologies MT2910 Family [ConnectX-7]", "0280"),
    ("Mellanox Technologies MT28908 Family [ConnectX-6] InfiniBand", "0207"),
    ("Intel Corporation Ethernet Controller X710 for 10GBASE-T", "0200"),
    ("Intel Corporation I350 Gigabit Network Connection", "0200"),
    ("NVIDIA Corporation AD102GL [RTX 6000 Ada Generation]", "0300"),
    ("NVIDIA Corporation GA100 [A100 SXM4 80GB]", "0302"),
    ("NVIDIA Corporation AD102 High Definition Audio Controller", "0403"),
    ("NVIDIA Corporation Device 2330", None),
    ("Advanced Micro Devices, Inc. [AMD/ATI] Aldebaran/MI200 [Instinct MI250X]", "0380"),
    ("Advanced Micro Devices, Inc. [AMD/ATI] Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]", "0300"),
    ("Advanced Micro Devices, Inc. [AMD/ATI] Navi 21/23 HDMI/DP Audio Controller", "0403"),
    ("Advanced Micro Devices, Inc. [AMD] Device 14ac", None),
    ("Advanced Micro Devices, Inc. [AMD] Genoa CCP/PSP 4.0 Device", None),
    ("Advanced Micro Devices, Inc. [AMD] Device 149f", None),
    ("ASPEED Technology, Inc. ASPEED Graphics Family", "0300"),
    ("ASMedia Technology Inc. Device 2426", None),
    ("", None),
])
def test_class_from_name(name, code):
    assert class_from_name(name) == code


def test_vendor_from_name():
    assert vendor_from_name("Advanced Micro Devices, Inc. [AMD/ATI] Navi 21") == "1002"
    assert vendor_from_name("Broadcom / LSI PEX890xx PCIe Gen 5 Switch") == "1000"
    assert vendor_from_name("Intel Corporationx") is None


# ---------------------------------------------------------------------------
# read_text


class TestReadText:
    @staticmethod
    def write(tmp_path, data: bytes) -> str:
        path = tmp_path / "capture.txt"
        path.write_bytes(data)
        return str(path)

    def test_missing_and_directory(self, tmp_path):
        with pytest.raises(ParseError) as err:
            read_text(tmp_path / "nope.txt")
        assert err.value.line is None and err.value.expected == "a text file"
        assert err.value.source.endswith("nope.txt")
        with pytest.raises(ParseError, match="a directory"):
            read_text(tmp_path)

    def test_binary(self, tmp_path):
        with pytest.raises(ParseError) as err:
            read_text(self.write(tmp_path, b"line one\nline two \x00\x01\x02"))
        assert err.value.line == 2 and "NUL" in err.value.found
        with pytest.raises(ParseError, match="control bytes"):
            read_text(self.write(tmp_path, b"\xff\xd8\xff\xe0\x10JFIF\x01\x02"))

    def test_encodings(self, tmp_path):
        assert read_text(self.write(tmp_path, "Gerät".encode("latin-1"))) == "Gerät"
        assert read_text(self.write(tmp_path, "\ufeff00:00.0 Host".encode())) == "00:00.0 Host"
        assert read_text(self.write(tmp_path, "00:00.0 Host\n".encode("utf-16"))) == "00:00.0 Host\n"

    def test_real_fixture(self):
        assert read_text(topology_fixture(RC4ML, "lspci-t-pruned.txt")).startswith(" +-[0000:e2]")


# ---------------------------------------------------------------------------
# properties: only ParseError (or a valid result) on any input


def _fixture_texts() -> list[str]:
    names = [(DELL, "lspci-vvnn.txt"), (HPE, "lspci-vvnn.txt"), (ASUS, "lspci-tv.txt"),
             (PUGET, "lspci-tv.txt"), (RC4ML, "lspci-t-pruned.txt"),
             (ASUS, "lspci-vvv-s-01_00.0.txt"), (PUGET, "lspci-vvv-s-c1_00.0.txt")]
    out = []
    for machine, filename in names:
        path = TOPOLOGY_FIXTURES / machine / filename
        if path.exists():
            lines = read_text(path).split("\n")
            out.append("\n".join(lines[:400]))  # the big dumps: a prefix keeps examples fast
    return out


FIXTURE_TEXTS = _fixture_texts()
PROPERTY = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _each_parser(text: str) -> None:
    for parse in (parse_lspci_tree, parse_lspci_verbose, parse_lspci):
        fns = parses_or_refuses(parse, text, "fuzz.txt")
        assert fns is None or all(isinstance(f, PciFunction) for f in fns)
    try:
        topo = topology_from_lspci(text, source="fuzz.txt")
    except ParseError:
        return
    assert isinstance(topo, Topology)


@PROPERTY
@given(st.text(max_size=400))
def test_random_text(text):
    _each_parser(text)


@PROPERTY
@given(st.text(alphabet=" -+\\|[]:.0123456789abcdefx\n", max_size=300))
def test_random_tree_like_text(text):
    _each_parser("-+-[0000:00]-+-00.0\n" + text)


@PROPERTY
@given(st.binary(max_size=300))
def test_random_bytes_through_read_text(data):
    fd, path = tempfile.mkstemp()
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            text = read_text(path)
        except ParseError as err:
            assert err.source == path
            return
        _each_parser(text)
    finally:
        os.unlink(path)


@pytest.mark.skipif(not FIXTURE_TEXTS, reason="fixtures not present")
@PROPERTY
@given(mutated_text(FIXTURE_TEXTS, " -+\\|[]:.#0123456789abcdefxX\t",
                    ("delete", "duplicate", "truncate", "flip", "chop"), times=(1, 4)))
def test_mutated_real_input(text):
    _each_parser(text)


@pytest.mark.skipif(not FIXTURE_TEXTS, reason="fixtures not present")
@PROPERTY
@given(st.data())
def test_mutated_tree_with_real_dumps(data):
    """A damaged tree merged with intact dumps: ParseError or a topology, nothing else."""
    tree = data.draw(mutated_text(FIXTURE_TEXTS[2:5], ops=("delete", "duplicate", "truncate")))
    try:
        topo = topology_from_lspci(tree, FIXTURE_TEXTS[5:], source="t")
    except ParseError:
        return
    assert isinstance(topo, Topology)


# ---------------------------------------------------------------------------
# truncated captures: refused, or noted, never a quietly partial tree


def _cut_block_lines(text: str, address: str, drop) -> str:
    """``text`` with the lines of ``address``'s block for which ``drop(line)`` holds removed."""
    out, inside = [], False
    for line in text.split("\n"):
        if line and line[0] not in " \t":
            inside = line.startswith(address + " ")
        if not (inside and drop(line)):
            out.append(line)
    return "\n".join(out)


def test_a_device_without_its_capability_block_is_refused():
    text = text_of(DELL, "lspci-vvnn.txt")
    cut = _cut_block_lines(text, "88:00.0", lambda ln: ln.startswith(("\tCapabilities", "\t\t")))
    with pytest.raises(ParseError) as info:
        parse_lspci_verbose(cut, "cut.txt")
    err = info.value
    assert err.line == cut.split("\n").index(next(ln for ln in cut.split("\n") if ln.startswith("88:00.0"))) + 1
    assert "88:00.0" in err.expected and "Cap+" in err.expected and "cut short" in str(err)


def test_a_dump_cut_inside_an_express_capability_is_refused_on_that_capability():
    text = text_of(HPE, "lspci-vvnn.txt")
    lines = text.split("\n")
    gpu = lines.index(next(ln for ln in lines if ln.startswith("e4:00.0 ")))
    express = next(i for i in range(gpu, len(lines)) if "] Express (v2) Endpoint" in lines[i])
    devsta = next(i for i in range(express, len(lines)) if lines[i].startswith("\t\tDevSta:"))
    with pytest.raises(ParseError) as info:
        parse_lspci_verbose("\n".join(lines[: devsta + 1]) + "\n", "cut.txt")
    assert info.value.line == express + 1
    assert "e4:00.0" in info.value.expected and "LnkSta" in info.value.expected


def test_a_dump_cut_after_a_device_line_is_refused():
    text = text_of(DELL, "lspci-vvnn.txt")
    end = text.index("\n", text.index("\n88:00.0 ") + 1)
    with pytest.raises(ParseError) as info:
        parse_lspci_verbose(text[: end + 1], "cut.txt")
    assert "'Control:' and 'Status:'" in info.value.expected


@pytest.mark.parametrize("machine", [DELL, HPE])
@PROPERTY
@given(frac=st.floats(0.02, 0.999))
def test_a_dump_cut_anywhere_is_refused_or_noted(machine, frac):
    text = text_of(machine, "lspci-vvnn.txt")
    cut = int(len(text) * frac)
    notes: list[str] = []
    try:
        fns = parse_lspci_verbose(text[:cut], "cut.txt", notes=notes)
    except ParseError as err:
        assert err.source == "cut.txt"
        return
    # what passes is a cut between two devices (undetectable: the rest looks whole), or noted
    assert text[:cut].endswith("\n\n") or notes, repr(text[max(0, cut - 60):cut])
    assert len(fns) <= text.count("\n\n")


def test_whole_captures_carry_no_truncation_note():
    notes: list[str] = []
    for machine in (DELL, HPE):
        parse_lspci_verbose(text_of(machine, "lspci-vvnn.txt"), machine, notes=notes)
    for machine, bus in ((ASUS, "01_00.0"), (ASUS, "71_00.0"), (PUGET, "c1_00.0")):
        parse_lspci_verbose(text_of(machine, f"lspci-vvv-s-{bus}.txt"), machine, notes=notes)
    assert notes == []


def test_a_noted_cut_reaches_the_topology_notes():
    text = text_of(DELL, "lspci-vvnn.txt")
    end = text.index("\tKernel driver in use: nvme", text.index("\n88:00.0 "))
    topo = topology_from_lspci(verbose_texts=[(text[:end], "cut.txt")])
    assert any(n.startswith("cut.txt: the text ends without the blank line") and "88:00.0" in n
               for n in topo.notes)
