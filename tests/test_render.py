"""The text tree printed by `moment topo`."""

from __future__ import annotations

from planner.topology.discover import topology_from_files
from planner.topology.model import Link, Node, NodeKind, Topology
from planner.topology.render import link_text, tree_text
from tests.conftest import topology_fixture


def test_bus_numbers_are_not_turned_into_emoji():
    t = Topology("t")
    t.add_node(Node("socket0", NodeKind.SOCKET, "socket 0"))
    t.add_node(Node("pci:0000:ab:00.0", NodeKind.NVME, "disk", bus_address="0000:ab:00.0"))
    t.add_link(Link.pcie("socket0", "pci:0000:ab:00.0", 4, 4))
    assert "NVMe 0000:ab:00.0 disk" in tree_text(t)


def test_hpe_tree_shows_switches_gpus_and_link_speeds():
    lspci = topology_fixture("hpe-cray-xd665-2x-epyc9354-h100", "lspci-vvnn.txt")
    dmi = topology_fixture("hpe-cray-xd665-2x-epyc9354-h100", "dmidecode.txt")
    text = tree_text(topology_from_files(lspci_vvv=[lspci], dmidecode=dmi), width=200)
    gpu_lines = [ln for ln in text.splitlines() if "GPU 0000:" in ln]
    assert len(gpu_lines) == 4
    assert all("Gen5 x16 · 50.4 GB/s" in ln for ln in gpu_lines)
    assert text.count("switch ") >= 4
    assert "socket 0 ↔ socket 1" in text


def test_link_text_marks_running_below_capability_and_defaults():
    lk = Link.pcie("a", "b", 4, 16, current_gen=1, current_lanes=16)
    assert link_text(lk) == "Gen4 x16 · 25.2 GB/s (running Gen1 x16)"
    assert link_text(Link.pcie("a", "b", None, None)) == "Gen? x? · ? GB/s"
