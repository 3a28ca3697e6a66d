"""The topology model, PCIe bandwidth table, PCI tree builder rules and JSON round-trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import TopologyError
from planner.topology import jsonio
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import gen_from_gts, pcie_bytes_per_s
from planner.topology.pcitree import PciFunction, build_pci_topology, normalize_address


@pytest.mark.parametrize(
    ("gen", "lanes", "gb_per_s"),
    [(1, 1, 0.25), (2, 8, 4.0), (3, 16, 15.754), (4, 16, 31.508), (5, 16, 63.015), (6, 16, 121.0)],
)
def test_pcie_raw_bandwidth_matches_the_standard(gen, lanes, gb_per_s):
    assert pcie_bytes_per_s(gen, lanes, efficiency=1.0) / 1e9 == pytest.approx(gb_per_s, rel=1e-3)


def test_pcie_default_efficiency_is_applied_and_overridable():
    assert pcie_bytes_per_s(4, 16) == pytest.approx(0.8 * pcie_bytes_per_s(4, 16, 1.0))
    assert pcie_bytes_per_s(4, 16, 0.9) == pytest.approx(0.9 * pcie_bytes_per_s(4, 16, 1.0))


@pytest.mark.parametrize("bad", [dict(gen=9, lanes=4), dict(gen=3, lanes=0), dict(gen=3, lanes=4, efficiency=1.5)])
def test_pcie_rejects_impossible_links(bad):
    with pytest.raises(TopologyError):
        pcie_bytes_per_s(**bad)


def test_gen_from_gts():
    assert [gen_from_gts(x) for x in (2.5, 5, 8, 16, 32, 64)] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(TopologyError):
        gen_from_gts(7.0)


def _toy() -> Topology:
    t = Topology("toy", ["unit"])
    t.add_node(Node("socket0", NodeKind.SOCKET, "socket 0", numa_node=0))
    t.add_node(Node("switch:0000:01:00.0", NodeKind.SWITCH, "switch 0", "0000:01:00.0"))
    t.add_node(Node("pci:0000:03:00.0", NodeKind.GPU, "A100", "0000:03:00.0", 0, "10de", "20b1",
                    {"functions": ["0000:03:00.0", "0000:03:00.1"]}))
    t.add_link(Link.pcie("socket0", "switch:0000:01:00.0", 4, 16))
    t.add_link(Link.pcie("switch:0000:01:00.0", "pci:0000:03:00.0", 4, 16, current_gen=1))
    return t


def test_links_are_two_directed_edges_with_per_direction_capacity():
    t = _toy()
    up = t.graph.edges["pci:0000:03:00.0", "switch:0000:01:00.0"]["bytes_per_s"]
    down = t.graph.edges["switch:0000:01:00.0", "pci:0000:03:00.0"]["bytes_per_s"]
    assert up == down == pytest.approx(pcie_bytes_per_s(4, 16))
    assert len(t.links()) == 2 and t.graph.number_of_edges() == 4


def test_tree_navigation():
    t = _toy()
    assert t.parent("pci:0000:03:00.0").id == "switch:0000:01:00.0"
    assert [n.id for n in t.ancestors("pci:0000:03:00.0")] == ["switch:0000:01:00.0", "socket0"]
    assert t.socket_of("pci:0000:03:00.0").id == "socket0"
    assert t.find("0000:03:00.1").id == "pci:0000:03:00.0"
    assert t.counts()["gpu"] == 1 and t.counts()["nvme"] == 0


def test_model_rejects_inconsistent_edits():
    t = _toy()
    with pytest.raises(TopologyError):
        t.add_node(Node("socket0", NodeKind.SOCKET))
    with pytest.raises(TopologyError):
        t.add_link(Link.pcie("socket0", "nowhere", 4, 16))
    with pytest.raises(TopologyError):
        t.add_link(Link.pcie("pci:0000:03:00.0", "switch:0000:01:00.0", 4, 16))  # already linked
    with pytest.raises(TopologyError):
        t.add_link(Link("socket0", "socket0", LinkKind.PCIE, 1.0))


def test_json_round_trip_is_exact():
    t = _toy()
    t.notes.append("a note")
    data = jsonio.to_dict(t)
    again = jsonio.from_dict(json.loads(json.dumps(data)))
    assert jsonio.to_dict(again) == data
    assert data["schema"] == "moment.topology" and data["version"] == 1
    assert data["counts"]["switch"] == 1


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"schema": "moment.topology", "version": 99},
        {"schema": "moment.topology", "version": 1, "nodes": [{"id": "a", "kind": "toaster"}]},
        {"schema": "moment.topology", "version": 1, "nodes": [{"kind": "gpu"}]},
        {"schema": "moment.topology", "version": 1, "nodes": ["x"]},
    ],
)
def test_json_bad_documents_are_topology_errors(data):
    with pytest.raises(TopologyError):
        jsonio.from_dict(data)


def test_json_load_reports_file_and_line(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"schema": \n oops}')
    with pytest.raises(TopologyError, match=r"t.json:2"):
        jsonio.load(p)


def _f(addr, **kw):
    return PciFunction(addr, **kw)


def test_builder_cascaded_switches_from_bus_ranges_only():
    # The shape of RC4ML's Machine A capture: a root port, a switch, and a second switch
    # below one of the first switch's downstream ports; no port types given.
    fns = [
        _f("0000:30:02.0", is_bridge=True, secondary_bus=0x31, subordinate_bus=0x3D, numa_node=0),
        _f("0000:31:00.0", is_bridge=True, secondary_bus=0x32, subordinate_bus=0x3D),
        _f("0000:32:00.0", is_bridge=True, secondary_bus=0x33, subordinate_bus=0x39),
        _f("0000:32:01.0", is_bridge=True, secondary_bus=0x3A, subordinate_bus=0x3A),
        _f("0000:33:00.0", is_bridge=True, secondary_bus=0x34, subordinate_bus=0x39),
        _f("0000:34:00.0", is_bridge=True, secondary_bus=0x35, subordinate_bus=0x35),
        _f("0000:34:01.0", is_bridge=True, secondary_bus=0x36, subordinate_bus=0x36),
        _f("0000:35:00.0", class_code="0302", vendor_id="10de"),
        _f("0000:36:00.0", class_code="0108"),
        _f("0000:3a:00.0", class_code="0108"),
    ]
    t = build_pci_topology(fns)
    switches = t.nodes(NodeKind.SWITCH)
    assert [s.id for s in switches] == ["switch:0000:31:00.0", "switch:0000:33:00.0"]
    assert t.parent("switch:0000:33:00.0").id == "switch:0000:31:00.0"
    assert t.parent("switch:0000:31:00.0").id == "socket0"
    assert t.parent("pci:0000:35:00.0").id == "switch:0000:33:00.0"
    assert t.parent("pci:0000:3a:00.0").id == "switch:0000:31:00.0"
    assert [s.name for s in switches] == ["switch 0", "switch 1"]


def test_builder_slots_sockets_and_multifunction_devices():
    fns = [
        _f("0000:00:01.0", is_bridge=True, port_type="root", secondary_bus=1, subordinate_bus=1,
           numa_node=0, link_cap=(4, 16), slot="3", attrs={"slot_implemented": True}),
        _f("0000:01:00.0", class_code="0302", vendor_id="10de", link_cap=(4, 16), link_sta=(1, 16)),
        _f("0000:01:00.1", class_code="0403", vendor_id="10de"),
        _f("0000:80:01.0", is_bridge=True, port_type="root", secondary_bus=0x81, subordinate_bus=0x81,
           numa_node=1, link_cap=(4, 4), slot="9", attrs={"slot_implemented": True}),
        _f("0000:80:02.0", is_bridge=True, port_type="root", secondary_bus=0x82, subordinate_bus=0x82,
           numa_node=1, link_cap=(3, 8)),
        _f("0000:82:00.0", class_code="0200", link_cap=(3, 8)),
        _f("0000:00:00.0", class_code="0600"),  # host bridge: chipset, not a node
    ]
    t = build_pci_topology(fns)
    assert t.counts() == {"socket": 2, "memory": 2, "switch": 0, "slot": 2, "gpu": 1, "nvme": 0,
                          "nic": 1, "other": 0}
    gpu = t.node("pci:0000:01:00.0")
    assert gpu.attrs["functions"] == ["0000:01:00.0", "0000:01:00.1"]
    slot = t.parent(gpu.id)
    assert slot.kind == NodeKind.SLOT and slot.attrs["in_use"] and slot.attrs["designation"] == "3"
    assert t.node("slot:0000:80:01.0").attrs["in_use"] is False  # empty slot kept
    assert t.socket_of("pci:0000:82:00.0").id == "socket1"
    lk = t.link_between(slot.id, gpu.id)
    assert (lk.pcie_gen, lk.lanes, lk.attrs["current_gen"]) == (4, 16, 1)
    assert t.link_between("socket0", "socket1").kind == LinkKind.INTER_SOCKET


def test_builder_unknown_numa_goes_under_unknown_socket_with_a_note():
    t = build_pci_topology([
        _f("0000:00:01.0", is_bridge=True, secondary_bus=1, subordinate_bus=1),
        _f("0000:01:00.0", class_code="0108"),
    ])
    assert t.socket_of("pci:0000:01:00.0").id == "socket?"
    assert any("NUMA" in n for n in t.notes)


def test_normalize_address():
    assert normalize_address("0000:E1:00.0") == "0000:e1:00.0"
    assert normalize_address("03:00.1") == "0000:03:00.1"
    assert normalize_address("0002:01:00.0") == "0002:01:00.0"
    with pytest.raises(TopologyError):
        normalize_address("zz:00.0")


@st.composite
def random_trees(draw):
    """Random PCI hierarchies: each bridge gets a unique bus; endpoints hang on bridge buses."""
    n_bridges = draw(st.integers(1, 12))
    parents = [None] + [draw(st.integers(0, i - 1)) for i in range(1, n_bridges)]
    bus_of = {i: i + 1 for i in range(n_bridges)}  # secondary bus of bridge i
    on_bus = {i: (0 if parents[i] is None else bus_of[parents[i]]) for i in range(n_bridges)}
    dev_counter: dict[int, int] = {}
    fns = []
    for i in range(n_bridges):
        dev = dev_counter.get(on_bus[i], 0)
        dev_counter[on_bus[i]] = dev + 1
        fns.append(_f(f"0000:{on_bus[i]:02x}:{dev:02x}.0", is_bridge=True, secondary_bus=bus_of[i],
                      subordinate_bus=bus_of[i], numa_node=draw(st.sampled_from([None, 0, 1])),
                      link_cap=draw(st.sampled_from([None, (3, 16), (4, 4)]))))
    for b in range(n_bridges):
        for _ in range(draw(st.integers(0, 2))):
            bus = bus_of[b]
            dev = dev_counter.get(bus, 0)
            dev_counter[bus] = dev + 1
            fns.append(
                _f(
                    f"0000:{bus:02x}:{dev:02x}.0",
                    class_code=draw(st.sampled_from(["0108", "0302", "0200", "0604"])),
                    vendor_id="10de",
                )
            )
    return [f for f in fns if not (f.class_code == "0604" and not f.is_bridge)]


@settings(max_examples=150, deadline=None)
@given(random_trees())
def test_builder_invariants_on_random_trees(fns):
    t = build_pci_topology(fns)
    devices = {f.address for f in fns if not f.is_bridge}
    # every endpoint is a node, under exactly one socket, reached without cycles
    assert sum(1 for n in t.nodes() if n.bus_address in devices) == len(devices)
    for n in t.nodes():
        if n.kind in (NodeKind.GPU, NodeKind.NVME, NodeKind.NIC, NodeKind.SWITCH, NodeKind.SLOT):
            assert t.socket_of(n.id) is not None
    again = jsonio.from_dict(jsonio.to_dict(t))
    assert jsonio.to_dict(again) == jsonio.to_dict(t)
