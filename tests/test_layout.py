"""Layouts: fit rules, counts and symmetry, classic layouts, placing devices, slot maps."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import networkx as nx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.errors import PlannerError
from planner.inventory import (
    Inventory,
    device_model,
    inventory_from_counts,
    inventory_from_spec,
    inventory_from_topology,
)
from planner.inventory.slots import slot_form_factor
from planner.layout import (
    Layout,
    classic_layouts,
    current_layout,
    enumerate_layouts,
    place,
    slot_fit,
    slot_fits,
    slot_map,
)
from planner.layout.machine import _Machine
from planner.topology.discover import topology_from_files
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.spec.load import load_machine
from tests.conftest import topology_fixture

GiB = 2**30
A100, P5510 = "a100-40gb-pcie", "p5510"


# ---------------------------------------------------------------------------
# hand-made machines


class Builder:
    """Small topologies: sockets, switches and slots with the attributes specs give."""

    def __init__(self, name: str = "toy") -> None:
        self.t = Topology(name)
        self.n = 0

    def _id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def socket(self, i: int) -> str:
        sid = f"socket{i}"
        self.t.add_node(Node(sid, NodeKind.SOCKET, f"socket {i}", numa_node=i))
        self.t.add_node(Node(f"mem{i}", NodeKind.MEMORY, attrs={"capacity_bytes": 2**38}))
        self.t.add_link(Link(sid, f"mem{i}", LinkKind.MEMORY, 1e11))
        return sid

    def switch(self, parent: str, lanes: int = 16, gen: int = 4) -> str:
        sid = self._id("switch:sw")
        self.t.add_node(Node(sid, NodeKind.SWITCH, f"PCIe {sid[7:]}"))
        self.t.add_link(Link.pcie(parent, sid, gen, lanes))
        return sid

    def slot(self, parent: str, ff: str | None = "cem", lanes: int | None = 16, gen: int = 4,
             dw: bool | None = True, **attrs) -> str:
        sid = self._id("slot:s")
        a = {"designation": f"SLOT{self.n}", "width_lanes": lanes, "pcie_gen": gen,
             "form_factor": ff, "in_use": False, **attrs}
        if dw is not None:
            a["double_width"] = dw
        self.t.add_node(Node(sid, NodeKind.SLOT, f"slot SLOT{self.n}", attrs=a))
        self.t.add_link(Link.pcie(parent, sid, gen, lanes or 16))
        return sid

    def device(self, slot: str, kind: NodeKind, name: str, lanes: int = 16) -> str:
        did = self._id("dev:d")
        self.t.add_node(Node(did, kind, name))
        self.t.add_link(Link.pcie(slot, did, 4, lanes))
        if self.t.node(slot).kind == NodeKind.SLOT:
            self.t.replace_node(self.t.node(slot).with_attrs(in_use=True))
        return did

    def inter(self, a: str = "socket0", b: str = "socket1", bw: float = 2e10) -> None:
        self.t.add_link(Link(a, b, LinkKind.INTER_SOCKET, bw))


def two_switches_one_socket() -> Topology:
    b = Builder("tiny")
    s = b.socket(0)
    for _ in range(2):
        sw = b.switch(s)
        b.slot(sw)
        b.slot(sw)
    return b.t


def mirrored(nic_on_socket1: bool = False, narrow_uplink: bool = False) -> Topology:
    """Two sockets, each with a switch of two GPU slots and a U.2 bay."""
    b = Builder("mirror")
    for i in range(2):
        s = b.socket(i)
        sw = b.switch(s, lanes=8 if (narrow_uplink and i == 1) else 16)
        b.slot(sw)
        b.slot(sw)
        b.slot(s, ff="u.2", lanes=4, dw=False, front_bay=True)
        if nic_on_socket1 and i == 1:
            nic_slot = b.slot(sw, ff="ocp", lanes=16, dw=False)
            b.device(nic_slot, NodeKind.NIC, "ConnectX-6")
    b.inter()
    return b.t


def gpus(n: int) -> Inventory:
    return inventory_from_counts(n, 0)


# ---------------------------------------------------------------------------
# fit rules


def slot_node(**attrs) -> Node:
    return Node("slot:x", NodeKind.SLOT, attrs=attrs)


def test_fit_rules():
    a100, p5510 = device_model(A100), device_model(P5510)
    gpu_slot = slot_node(form_factor="cem", width_lanes=16, double_width=True)
    assert slot_fits(gpu_slot, a100) and slot_fits(gpu_slot, p5510)  # SSD through an adapter
    bay = slot_node(form_factor="u.2", width_lanes=4)
    assert slot_fits(bay, p5510) and not slot_fits(bay, a100)
    assert "u.2 slot" in slot_fit(bay, a100).reason
    narrow = slot_node(form_factor="cem", width_lanes=8, double_width=True)
    assert not slot_fits(narrow, a100) and "x8; a100-40gb-pcie needs x16" in slot_fit(narrow, a100).reason
    single = slot_node(form_factor="cem", width_lanes=16, double_width=False)
    assert "single width" in slot_fit(single, a100).reason
    assert slot_fits(slot_node(form_factor="cem", width_lanes=1), p5510) is False
    m2 = slot_node(form_factor="m.2", width_lanes=4)
    assert slot_fits(m2, device_model("samsung-980-pro")) and not slot_fits(m2, p5510)
    ocp = slot_node(form_factor="ocp", width_lanes=16)
    assert not slot_fits(ocp, a100) and not slot_fits(ocp, p5510)


def test_double_width_unknown_is_assumed_for_long_x16_cem_slots():
    a100 = device_model(A100)
    for length in ("Long", None, "Unknown"):
        fit = slot_fit(slot_node(form_factor="cem", width_lanes=16, length=length), a100)
        assert fit.ok and fit.assumed_double_width, length
    assert not slot_fits(slot_node(form_factor="cem", width_lanes=16, length="Short"), a100)
    assert not slot_fits(slot_node(form_factor="cem", width_lanes=8, length="Long"), a100)
    # an SSD never needs the assumption
    fit = slot_fit(slot_node(form_factor="cem", width_lanes=16), device_model(P5510))
    assert fit.ok and not fit.assumed_double_width


def test_unusable_and_special_slots():
    a100, p5510 = device_model(A100), device_model(P5510)
    lost = slot_node(form_factor="cem", width_lanes=16, double_width=True, placement="unknown")
    assert "not in the PCIe tree" in slot_fit(lost, a100).reason
    assert "width unknown" in slot_fit(slot_node(form_factor="u.2"), p5510).reason
    unknown_ff = slot_fit(slot_node(width_lanes=4), p5510)
    assert unknown_ff.ok and unknown_ff.assumed_form_factor
    sxm = slot_node(form_factor="other", length="Other", slot_type="PCI Express 5 x16",
                    width_lanes=16)
    assert slot_form_factor(sxm) == "sxm"
    assert slot_fits(sxm, device_model("h100-sxm")) and not slot_fits(sxm, a100)
    virtual = slot_node(virtual=True, virtual_kind="gpu", width_lanes=None)
    assert slot_fits(virtual, a100) and not slot_fits(virtual, p5510)
    assert not slot_fits(Node("socket0", NodeKind.SOCKET), a100)


# ---------------------------------------------------------------------------
# counting and symmetry


@pytest.mark.parametrize("machine, raw, feasible, distinct", [
    ("moment-a", 1_338_557_220, 8_817_900, 2268),
    ("moment-b", 24_942_060, 2_123_550, 490),
])
def test_bundled_machine_counts(machine, raw, feasible, distinct):
    topo = load_machine(machine)
    inv = inventory_from_counts(4, 8)
    s = enumerate_layouts(topo, inv)
    # A: 24 candidate slots (the OCP slot holds the NICs); GPUs only in the 8 GPU slots,
    # SSDs in the 16 U.2 slots and the 4 GPU slots left: C(8,4) * C(20,8)
    # B: 19 candidate slots; GPUs in the 11 CEM slots, SSDs anywhere left: C(11,4) * C(15,8)
    assert (s.raw_count, s.feasible_count, len(s.distinct)) == (raw, feasible, distinct)
    assert s.raw_count >= s.feasible_count >= len(s.distinct)
    assert sum(d.multiplicity for d in s.distinct) == s.feasible_count
    assert len({d.canonical for d in s.distinct}) == len(s.distinct)
    assert s.compositions >= len(s.distinct)
    labels = {d.label for d in s.distinct if d.label}
    assert {lab[:3] for lab in labels} == {"(a)", "(b)", "(c)", "(d)"}


def test_raw_and_feasible_by_hand():
    s = enumerate_layouts(load_machine("moment-a"), inventory_from_counts(4, 8))
    assert s.raw_count == math.comb(24, 4) * math.comb(20, 8)
    assert s.feasible_count == math.comb(8, 4) * math.comb(20, 8)
    s = enumerate_layouts(load_machine("moment-b"), inventory_from_counts(4, 8))
    assert s.feasible_count == math.comb(11, 4) * math.comb(15, 8)


def test_machine_a_sockets_differ_by_their_nics():
    topo, inv = load_machine("moment-a"), inventory_from_counts(4, 8)
    strict = enumerate_layouts(topo, inv)
    loose = enumerate_layouts(topo, inv, ignore_kinds=("nic",))
    # socket 1 carries the NICs: nothing merges; without them the sockets mirror each other
    # and only the 12 socket-symmetric combinations are their own mirror: (2268 + 12) / 2
    assert len(strict.distinct) == strict.compositions == 2268
    assert len(loose.distinct) == 1140 and loose.ignore_kinds == ("nic",)
    assert sum(d.multiplicity for d in loose.distinct) == loose.feasible_count
    b = classic_layouts(topo, inv, loose)["b"]
    assert b.multiplicity == 2  # four GPUs on switch 0, or on switch 1
    assert classic_layouts(topo, inv, strict)["b"].multiplicity == 1


@pytest.mark.parametrize("machine, distinct", [("moment-a", 280), ("moment-b", 332)])
def test_flow_equivalence_merges_more(machine, distinct):
    topo, inv = load_machine(machine), inventory_from_counts(4, 8)
    strict = enumerate_layouts(topo, inv)
    s = enumerate_layouts(topo, inv, equivalence="flow")
    assert s.equivalence == "flow" and s.feasible_count == strict.feasible_count
    assert len(s.distinct) == distinct < len(strict.distinct)
    assert sum(d.multiplicity for d in s.distinct) == s.feasible_count
    c = classic_layouts(topo, inv, s)
    assert all(s.find(v) is not None for v in c.values())
    if machine == "moment-b":
        # an SSD in root complex 1's spare GPU slot is, to a flow, one more front bay
        assert c["b"].multiplicity == 5 * 9


def test_flow_equivalence_drops_empty_slots_and_nics():
    b = Builder("flow")
    s = b.socket(0)
    sw = b.switch(s)
    b.slot(sw, ff="u.2", lanes=4, dw=False)
    b.slot(sw)  # a x16 GPU slot: an SSD there runs x4 like in the bay
    other = b.switch(s)
    b.device(b.slot(other, ff="ocp", dw=False), NodeKind.NIC, "NIC")
    inv = inventory_from_counts(0, 1)
    assert len(enumerate_layouts(b.t, inv).distinct) == 2
    flow_search = enumerate_layouts(b.t, inv, equivalence="flow")
    assert len(flow_search.distinct) == 1 and flow_search.distinct[0].multiplicity == 2
    with pytest.raises(PlannerError, match="unknown equivalence"):
        enumerate_layouts(b.t, inv, equivalence="iso")


def test_tiny_machine_by_hand():
    s = enumerate_layouts(two_switches_one_socket(), gpus(2))
    # both GPUs on one switch (2 ways) or one per switch (2 x 2 ways)
    assert s.raw_count == s.feasible_count == math.comb(4, 2) == 6
    assert len(s.distinct) == 2
    assert sorted(d.multiplicity for d in s.distinct) == [2, 4]
    assert len(s.classes) == 2 and all(len(c) == 2 for c in s.classes)


def per_switch(topo: Topology, layout: Layout) -> list[int]:
    return sorted(Counter(topo.parent(s).id for s, _ in layout.assignment).values())


def test_symmetric_sockets_merge_mirrored_layouts():
    topo = mirrored()
    s = enumerate_layouts(topo, gpus(2))
    # 4 GPU slots on two mirrored sockets: both on one switch (either) or split
    assert s.feasible_count == 6 and len(s.distinct) == 2
    assert sorted(d.multiplicity for d in s.distinct) == [2, 4]
    assert sorted(per_switch(topo, d) for d in s.distinct) == [[1, 1], [2]]


def test_an_asymmetric_machine_does_not_merge():
    topo = mirrored(nic_on_socket1=True)
    s = enumerate_layouts(topo, gpus(2))
    assert s.feasible_count == 6 and len(s.distinct) == 3  # socket 0's switch ≠ socket 1's
    assert sorted(d.multiplicity for d in s.distinct) == [1, 1, 4]
    assert len(enumerate_layouts(topo, gpus(2), ignore_kinds=("nic",)).distinct) == 2
    narrow = enumerate_layouts(mirrored(narrow_uplink=True), gpus(2))
    assert len(narrow.distinct) == 3  # a x8 uplink is not a x16 one


def test_inter_socket_links_decide_socket_symmetry():
    # three identical sockets in a chain 0-1-2: the ends are alike, the middle is not
    b = Builder("chain")
    for i in range(3):
        s = b.socket(i)
        b.slot(s)
    b.inter("socket0", "socket1")
    b.inter("socket1", "socket2")
    s = enumerate_layouts(b.t, gpus(1))
    assert s.feasible_count == 3
    assert sorted(d.multiplicity for d in s.distinct) == [1, 2]
    # a triangle: all three alike
    b.inter("socket0", "socket2")
    s = enumerate_layouts(b.t, gpus(1))
    assert [d.multiplicity for d in s.distinct] == [3]


def test_nvlink_endpoints_are_told_apart():
    b = Builder("nv")
    s = b.socket(0)
    g0 = b.device(b.slot(s), NodeKind.GPU, "V100")
    g1 = b.device(b.slot(s), NodeKind.GPU, "V100")
    b.t.add_link(Link(g0, g1, LinkKind.NVLINK, 5e10))
    b.slot(s)
    b.slot(s)
    s = enumerate_layouts(b.t, inventory_from_counts(0, 1))
    assert s.feasible_count == 2 and len(s.distinct) == 1  # the two free slots are alike
    assert any("NVLink" in n for n in s.notes)


def test_find_and_layout_counts():
    topo, inv = load_machine("moment-b"), inventory_from_counts(4, 8)
    s = enumerate_layouts(topo, inv)
    c = classic_layouts(topo, inv, s)["c"]
    hit = s.find(c)
    assert hit is not None and hit.canonical == c.canonical and "(c)" in hit.label
    assert hit.assignment == c.assignment  # the classic layout is its class's representative
    assert s.find("nope") is None
    assert c.counts() == {A100: 4, P5510: 8}
    assert len(c.slots_of(A100)) == 4


def test_too_many_combinations_is_an_error():
    with pytest.raises(PlannerError, match=r"too many to compare \(limit 10\)"):
        enumerate_layouts(load_machine("moment-b"), inventory_from_counts(4, 8),
                          max_compositions=10)


# ---------------------------------------------------------------------------
# errors


def test_no_slot_fits_a_model():
    b = Builder("bays")
    s = b.socket(0)
    for _ in range(3):
        b.slot(s, ff="u.2", lanes=4, dw=False)
    with pytest.raises(PlannerError, match=r"no candidate slot fits a100-40gb-pcie \(it needs a cem "
                                           r"slot, x16 or wider, double width\); the candidate "
                                           r"slots are: 3 × u.2 x4"):
        enumerate_layouts(b.t, inventory_from_counts(1, 1))


def test_too_few_slots_for_a_model():
    with pytest.raises(PlannerError, match=r"too few slots for 5 × a100-40gb-pcie: only 4 "
                                           r"candidate slot\(s\) fit"):
        enumerate_layouts(two_switches_one_socket(), gpus(5))
    with pytest.raises(PlannerError, match=r"too few slots for 10 × a100-40gb-pcie: only 8"):
        enumerate_layouts(load_machine("moment-a"), inventory_from_counts(10, 8))


def test_counts_that_cannot_fit_together():
    with pytest.raises(PlannerError, match=r"4 × a100-40gb-pcie and 1 × p5510 cannot be placed "
                                           r"together: they need 5 slots and only 4"):
        enumerate_layouts(two_switches_one_socket(), inventory_from_counts(4, 1))


def test_no_free_slot():
    b = Builder("full")
    s = b.socket(0)
    b.device(b.slot(s), NodeKind.NIC, "NIC")
    with pytest.raises(PlannerError, match="no free slot"):
        enumerate_layouts(b.t, gpus(1))


# ---------------------------------------------------------------------------
# classic layouts


def test_classic_layouts_machine_b_follow_the_paper():
    topo, inv = load_machine("moment-b"), inventory_from_counts(4, 8)
    c = classic_layouts(topo, inv)
    assert all(isinstance(v, Layout) for v in c.values())
    bays = [f"slot:b1-bay{i}" for i in range(8)]
    # (a)/(b): all 8 SSDs on the front board (root complex 1)
    for key in "ab":
        assert sorted(c[key].slots_of(P5510)) == bays
    assert sorted(c["a"].slots_of(A100)) == ["slot:b-sw0-slot0", "slot:b-sw0-slot1",
                                             "slot:b-sw1-slot0", "slot:b-sw1-slot1"]
    assert sorted(c["b"].slots_of(A100)) == [f"slot:b-sw1-slot{i}" for i in range(4)]
    # (c): GPUs 0,1 and two SSDs on switch 0 (Buses 12-13), GPUs 2,3 and two SSDs on
    # switch 1 (Buses 17-18), four SSDs in front
    assert sorted(c["c"].slots_of(A100)) == sorted(c["a"].slots_of(A100))
    assert sorted(c["c"].slots_of(P5510)) == sorted(
        ["slot:b-sw0-slot2", "slot:b-sw0-slot3", "slot:b-sw1-slot2", "slot:b-sw1-slot3"]
        + bays[:4])
    # (d): GPUs on switch 1, one SSD on each switch, six in front
    assert sorted(c["d"].slots_of(A100)) == sorted(c["b"].slots_of(A100))
    assert sorted(c["d"].slots_of(P5510)) == sorted(
        ["slot:b-sw0-slot0", "slot:b-sw1-slot4"] + bays[:6])
    assert [c[k].label for k in "abcd"] == [
        "(a) SSDs front-board-first, GPUs spread", "(b) SSDs front-board-first, GPUs on one switch",
        "(c) SSDs balanced, GPUs spread", "(d) SSDs balanced, GPUs on one switch"]
    assert c["c"].multiplicity == math.comb(4, 2) * 30 * math.comb(8, 4)  # 12600


def test_classic_layouts_machine_a():
    topo, inv = load_machine("moment-a"), inventory_from_counts(4, 8)
    c = classic_layouts(topo, inv)
    front = [f"slot:a{s}-bay{i}" for s in (0, 1) for i in range(4)]
    sw_nvme = [f"slot:a{s}-sw-nvme{i}" for s in (0, 1) for i in range(4)]
    spread = ["slot:a0-gpu0", "slot:a0-gpu1", "slot:a1-gpu0", "slot:a1-gpu1"]
    one = [f"slot:a0-gpu{i}" for i in range(4)]
    assert (sorted(c["a"].slots_of(A100)), sorted(c["a"].slots_of(P5510))) == (spread, front)
    assert (sorted(c["b"].slots_of(A100)), sorted(c["b"].slots_of(P5510))) == (one, front)
    assert (sorted(c["c"].slots_of(A100)), sorted(c["c"].slots_of(P5510))) == (spread, sw_nvme)
    # (d): switch 0 holds 4 GPUs and 4 SSDs, one SSD per GPU (§4.6)
    assert (sorted(c["d"].slots_of(A100)), sorted(c["d"].slots_of(P5510))) == (one, sw_nvme)
    assert c["a"].multiplicity == 36 and c["d"].multiplicity == 1


def test_classic_layouts_that_do_not_apply():
    # one switch and nothing on the root complex: spread and P2P-first coincide
    b = Builder("one-switch")
    s = b.socket(0)
    sw = b.switch(s)
    for _ in range(3):
        b.slot(sw)
    b.slot(s, ff="u.2", lanes=4, dw=False, front_bay=True)
    c = classic_layouts(b.t, inventory_from_counts(2, 1))
    assert "one switch only" in c["b"] and "one switch only" in c["d"]
    assert isinstance(c["a"], Layout) and isinstance(c["c"], Layout)
    # no GPUs: (b) and (d) are (a) and (c)
    c = classic_layouts(load_machine("moment-b"), inventory_from_counts(0, 8))
    assert c["b"] == "no GPUs to place: same as (a)" and c["d"] == "no GPUs to place: same as (c)"
    # no front bays
    c = classic_layouts(two_switches_one_socket(), inventory_from_counts(1, 1))
    assert "no front bays" in c["a"] and "no front bays" in c["b"]
    assert isinstance(c["c"], Layout)


def test_classic_layouts_on_a_captured_machine_without_switches():
    d = "dell-poweredge-r640-2x-xeon-gold6230-nvme"
    topo = topology_from_files(lspci_vvv=[topology_fixture(d, "lspci-vvnn.txt")],
                               dmidecode=topology_fixture(d, "dmidecode.txt"))
    inv = inventory_from_topology(topo)
    s = enumerate_layouts(topo, inv)
    # 8 identical U.2 bays on socket 1's root complex; the 3 x16 slots have no bus address
    assert (s.raw_count, s.feasible_count, len(s.distinct)) == (28, 28, 1)
    assert "current" in s.distinct[0].label
    c = classic_layouts(topo, inv, s)
    assert isinstance(c["a"], Layout) and "balance" in c["c"]


# ---------------------------------------------------------------------------
# slot maps and placing


def test_slot_map_lines():
    topo, inv = load_machine("moment-b"), inventory_from_counts(4, 8)
    lines = slot_map(topo, classic_layouts(topo, inv)["c"])
    assert [e.device for e in lines][:5] == ["GPU 0", "GPU 1", "SSD 0", "SSD 1", "GPU 2"]
    assert lines[4].text == ("GPU 2 → Slot 0 (switch 1) (PCIe 4.0 x16), under PCIe switch 1, "
                             "behind PCIe switch 0, on socket 0")
    assert lines[-1].text == "SSD 7 → Front NVMe bay 3 (PCIe 4.0 x4), on the root complex of socket 1"
    assert lines[4].switches == ("PCIe switch 1", "PCIe switch 0") and lines[4].socket == "socket 0"
    assert (lines[0].pcie_gen, lines[0].width_lanes, lines[0].slot_id) == (4, 16, "slot:b-sw0-slot0")
    topo_a = load_machine("moment-a")
    lines = slot_map(topo_a, classic_layouts(topo_a, inv)["a"])
    assert lines[0].text == ("SSD 0 → Front NVMe bay 0 (socket 0) (PCIe 4.0 x4), "
                             "on the root complex of socket 0")


def test_slot_map_names_models_when_a_kind_has_several():
    topo = two_switches_one_socket()
    h100 = device_model("h100-pcie")
    inv = Inventory(((device_model(A100), 1), (h100, 1)))
    s = enumerate_layouts(topo, inv)
    texts = [e.text for e in slot_map(topo, s.distinct[0], inv)]
    assert any("(NVIDIA H100 PCIe)" in t for t in texts)
    assert any("(NVIDIA A100 40GB PCIe)" in t for t in texts)


def test_place_on_machine_b():
    topo, inv = load_machine("moment-b"), inventory_from_counts(4, 8)
    before = topo.counts()
    layout = classic_layouts(topo, inv)["c"]
    placed = place(topo, layout, inv)
    assert topo.counts() == before  # the input is untouched
    assert placed.counts()["gpu"] == 4 and placed.counts()["nvme"] == 8
    assert [placed.parent(f"gpu{i}").id for i in range(4)] == [
        "slot:b-sw0-slot0", "slot:b-sw0-slot1", "slot:b-sw1-slot0", "slot:b-sw1-slot1"]
    assert placed.parent("ssd7").id == "slot:b1-bay3"
    for slot_id, _ in layout.assignment:
        assert placed.node(slot_id).attrs["in_use"] is True
    gpu_link = placed.link_between("slot:b-sw0-slot0", "gpu0")
    assert (gpu_link.pcie_gen, gpu_link.lanes) == (4, 16)
    assert gpu_link.bytes_per_s == pytest.approx(20 * GiB)  # capped by the slot's 20 GiB/s
    ssd_link = placed.link_between("slot:b-sw0-slot2", "ssd0")  # an SSD in a x16 slot runs x4
    assert (ssd_link.pcie_gen, ssd_link.lanes) == (4, 4)
    assert ssd_link.bytes_per_s == pytest.approx(6.459e9, rel=1e-3)  # the spec's 0.82 efficiency
    assert ssd_link.bytes_per_s > 6 * GiB  # so the SSD's own 6 GiB/s binds, as in §2.2
    ssd = placed.node("ssd0")
    assert ssd.kind == NodeKind.NVME and ssd.attrs["read_bytes_per_s"] == 6 * GiB
    assert ssd.attrs["read_iops"] == 700_000 and ssd.attrs["model"] == P5510
    assert placed.node("gpu0").attrs["memory_bytes"] == 40 * GiB
    assert placed.node("gpu0").numa_node == 0 and placed.node("ssd7").numa_node == 1


def test_place_on_a_captured_machine_moves_its_devices():
    d = "hpe-cray-xd665-2x-epyc9354-h100"
    topo = topology_from_files(lspci_vvv=[topology_fixture(d, "lspci-vvnn.txt")],
                               dmidecode=topology_fixture(d, "dmidecode.txt"))
    inv = inventory_from_topology(topo)
    s = enumerate_layouts(topo, inv)
    cur = current_layout(topo, inv, s)
    assert cur is not None and cur.label == "current"
    assert s.find(cur).multiplicity == cur.multiplicity
    assert "current" in s.find(cur).label
    gpu_slots = {"slot:0000:02:01.0", "slot:0000:62:01.0", "slot:0000:82:01.0", "slot:0000:e2:01.0"}
    assert set(cur.slots_of("h100-sxm")) == gpu_slots
    # the SXM sockets take only the SXM GPUs, so every layout keeps them there
    assert all(set(x.slots_of("h100-sxm")) == gpu_slots for x in s.distinct)
    other = next(x for x in s.distinct if x.canonical != cur.canonical)
    placed = place(topo, other, inv)
    assert placed.counts()["gpu"] == 4 and placed.counts()["nvme"] == 3
    assert "pci:0000:05:00.0" not in placed  # the old SSD nodes are gone
    assert "pci:0000:03:00.0" in placed  # the NIC stays
    for slot_id, _ in other.assignment:
        dev = next(c for c in placed.children(slot_id))
        assert dev.attrs["placed"] is True
    lines = slot_map(topo, cur, inv)
    assert lines[0].text.startswith("GPU 0 → Slot 7 - GPU 3 (PCIe 5.0 x16), under switch 0")


def test_place_with_virtual_slots():
    t = Topology("noslots")
    for n in (Node("socket0", NodeKind.SOCKET), Node("sw", NodeKind.SWITCH, "switch 0"),
              Node("g0", NodeKind.GPU, "NVIDIA A100-PCIE-40GB"),
              Node("g1", NodeKind.GPU, "NVIDIA A100-PCIE-40GB"),
              Node("n0", NodeKind.NVME, "disk"), Node("n1", NodeKind.NVME, "disk")):
        t.add_node(n)
    t.add_link(Link.pcie("socket0", "sw", 4, 16))
    for g in ("g0", "g1"):
        t.add_link(Link("sw", g, LinkKind.PCIE, 1.2e10))  # a figure without gen or width
    t.add_link(Link.pcie("sw", "n0", 4, 4))
    t.add_link(Link.pcie("socket0", "n1", 4, 4))
    inv = inventory_from_topology(t)
    s = enumerate_layouts(t, inv)
    assert any("positions" in n for n in s.notes)
    # GPU positions take the GPUs, NVMe positions the (interchangeable) disks
    assert (s.raw_count, s.feasible_count, len(s.distinct)) == (6, 1, 1)
    placed = place(t, s.distinct[0], inv)
    assert placed.counts()["gpu"] == 2 and placed.counts()["slot"] == 4
    assert placed.link_between("slot:virtual:g0", "gpu0").bytes_per_s == 1.2e10


def test_place_rejects_bad_layouts():
    topo, inv = load_machine("moment-b"), inventory_from_counts(4, 8)
    good = classic_layouts(topo, inv)["c"]
    drop_one = Layout(good.assignment[1:], kinds=good.kinds)
    with pytest.raises(PlannerError, match=r"places \d × .*the inventory has"):
        place(topo, drop_one, inv)
    swapped = tuple(("slot:b1-bay0", A100) if (s, m) == good.assignment[0] else (s, m)
                    for s, m in good.assignment)
    with pytest.raises(PlannerError, match="does not fit slot 'slot:b1-bay0'.*u.2 slot"):
        place(topo, Layout(swapped), inv)
    with pytest.raises(PlannerError, match="no slot 'slot:nope'"):
        place(topo, Layout((("slot:nope", A100),)), inv)
    nic = load_machine("moment-a")
    with pytest.raises(PlannerError, match="not a candidate slot"):
        place(nic, Layout((("slot:a1-ocp", P5510),)), inventory_from_counts(0, 1))


def test_current_layout_of_a_spec_is_none():
    topo = load_machine("moment-b")
    assert current_layout(topo, inventory_from_spec("moment-b")) is None


# ---------------------------------------------------------------------------
# property tests: brute force on random small machines

SLOT_KINDS = [
    dict(ff="cem", lanes=16, dw=True),
    dict(ff="cem", lanes=16, dw=None, length="Long"),
    dict(ff="u.2", lanes=4, dw=False),
    dict(ff="cem", lanes=8, dw=False),
]


@st.composite
def small_machines(draw):
    b = Builder("random")
    n_sockets = draw(st.integers(1, 2))
    plans = []
    for i in range(n_sockets):
        if i == 1 and draw(st.integers(0, 2)):
            plan = plans[0]  # a mirrored socket: symmetry to find
        else:
            kinds = st.sampled_from([0, 0, 1, 2, 2, 3])  # mostly GPU slots and U.2 bays
            direct = draw(st.lists(kinds, max_size=2))
            switch_plan = draw(st.lists(kinds, min_size=1, max_size=3))
            n_switches = draw(st.sampled_from([0, 1, 2, 2]))
            uplinks = [draw(st.sampled_from([8, 16, 16])) for _ in range(n_switches)]
            nested = draw(st.sampled_from([False, False, True]))
            nic = draw(st.integers(0, 4)) == 0
            plan = (direct, switch_plan, n_switches, uplinks, nested, nic)
        plans.append(plan)
        direct, switch_plan, n_switches, uplinks, nested, nic = plan
        s = b.socket(i)
        for k in direct:
            b.slot(s, **SLOT_KINDS[k])
        parent = s
        for j in range(n_switches):
            sw = b.switch(parent, lanes=uplinks[j])
            for k in switch_plan:
                b.slot(sw, **SLOT_KINDS[k])
            if nested:
                parent = sw
        if nic:
            b.device(b.slot(s, ff="ocp", lanes=16, dw=False), NodeKind.NIC, "NIC")
    if n_sockets == 2:
        b.inter()
    n_gpus = draw(st.integers(0, 2))
    n_ssds = draw(st.integers(0 if n_gpus else 1, 3))
    return b.t, inventory_from_counts(n_gpus, n_ssds)


def brute_force(topo: Topology, inv: Inventory) -> list[tuple[tuple[str, str], ...]]:
    """Every feasible assignment, by trying every model (or none) in every candidate slot."""
    mach = _Machine(topo, inv)
    models = inv.models
    want = Counter({m.name: n for m, n in inv.items})
    out = []
    for choice in itertools.product([None, *models], repeat=len(mach.candidates)):
        got = Counter(m.name for m in choice if m is not None)
        if got != want:
            continue
        pairs = [(s, m) for s, m in zip(mach.candidates, choice, strict=True) if m is not None]
        if all(slot_fits(topo.node(s), m) for s, m in pairs):
            out.append(tuple(sorted((s, m.name) for s, m in pairs)))
    return out


def iso_label(node: Node) -> tuple:
    a = node.attrs
    if node.kind == NodeKind.SLOT:
        dw = a.get("double_width")
        return ("slot", slot_form_factor(node), a.get("width_lanes"), a.get("pcie_gen"), dw,
                a.get("length") if dw is None else None)
    if node.kind in (NodeKind.GPU, NodeKind.NVME, NodeKind.NIC, NodeKind.OTHER):
        return (node.kind.value, a.get("model") or node.name)
    return (node.kind.value, a.get("capacity_bytes"))


def isomorphic(t1: Topology, t2: Topology) -> bool:
    return nx.is_isomorphic(
        t1.graph, t2.graph,
        node_match=lambda x, y: iso_label(x["node"]) == iso_label(y["node"]),
        edge_match=lambda x, y: (x["kind"], x["bytes_per_s"]) == (y["kind"], y["bytes_per_s"]),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_machines())
def test_distinct_layouts_match_brute_force(machine):
    topo, inv = machine
    mach = _Machine(topo, inv)
    assume(len(mach.candidates) <= 8)
    brute = brute_force(topo, inv)
    if not brute:
        with pytest.raises(PlannerError):
            enumerate_layouts(topo, inv)
        return
    s = enumerate_layouts(topo, inv)
    assert s.feasible_count == len(brute)
    k = inv.total
    assert s.raw_count == math.comb(len(mach.candidates), k) * math.factorial(k) // math.prod(
        math.factorial(n) for _, n in inv.items)
    classes = Counter(mach.canonical(mach.vector(a)) for a in brute)
    assert set(classes) == {d.canonical for d in s.distinct}
    assert {d.canonical: d.multiplicity for d in s.distinct} == dict(classes)
    assert sum(d.multiplicity for d in s.distinct) == s.feasible_count
    # the canonical form decides isomorphism of the placed machines, both ways
    rng = random.Random(0)
    by_class: dict[str, list] = {}
    for a in brute:
        by_class.setdefault(mach.canonical(mach.vector(a)), []).append(a)
    kinds = tuple(sorted(inv.kinds().items()))
    placed = {c: place(topo, Layout(rng.choice(v), kinds=kinds), inv) for c, v in by_class.items()}
    for members in by_class.values():
        if len(members) > 1:
            a, b = rng.sample(members, 2)
            assert isomorphic(place(topo, Layout(a, kinds=kinds), inv),
                              place(topo, Layout(b, kinds=kinds), inv))
    if len(placed) <= 8:
        for c1, c2 in itertools.combinations(placed, 2):
            assert not isomorphic(placed[c1], placed[c2])
    # classic layouts are feasible layouts of their class
    for lay in classic_layouts(topo, inv, s).values():
        if isinstance(lay, Layout):
            assert lay.canonical in classes and lay.multiplicity == classes[lay.canonical]


# ---------------------------------------------------------------------------
# pruning by symmetry keeps the best flow

flow = pytest.importorskip("planner.flow")
workload = pytest.importorskip("planner.workload")


def seconds(topo: Topology, layout: Layout, inv: Inventory) -> float:
    placed = place(topo, layout, inv)
    consumers = [workload.Consumer(n.id, 1e9) for n in placed.nodes(NodeKind.GPU)]
    stores = [workload.Store(n.id, n.id, n.attrs.get("read_bytes_per_s"))
              for n in placed.nodes(NodeKind.NVME)]
    w = workload.Workload(consumers, [workload.Tier("ssd", stores, max_share=1.0)])
    return flow.solve(placed, w, model="maxflow").seconds_per_iteration


@pytest.mark.heavy  # 25 exhaustive layout searches (~18 s)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_machines(), st.integers(1, 2), st.integers(1, 3))
def test_same_best_time_with_and_without_pruning(machine, n_gpus, n_ssds):
    topo, _ = machine
    inv = inventory_from_counts(n_gpus, n_ssds)
    mach = _Machine(topo, inv)
    assume(len(mach.candidates) <= 7)
    brute = brute_force(topo, inv)
    assume(brute and len(brute) <= 150)
    kinds = tuple(sorted(inv.kinds().items()))
    times = {a: seconds(topo, Layout(a, kinds=kinds), inv) for a in brute}
    best_all = min(times.values())
    for equivalence in ("automorphism", "flow"):
        m = _Machine(topo, inv, equivalence=equivalence)
        by_class: dict[str, list[float]] = {}
        for a, t in times.items():
            by_class.setdefault(m.canonical(m.vector(a)), []).append(t)
        for ts in by_class.values():  # layouts of one class take the same time
            assert max(ts) == pytest.approx(min(ts), rel=1e-6), equivalence
        s = enumerate_layouts(topo, inv, equivalence=equivalence)
        assert {d.canonical for d in s.distinct} == set(by_class)
        assert {d.canonical: d.multiplicity for d in s.distinct} == {
            c: len(ts) for c, ts in by_class.items()}
        best_distinct = min(seconds(topo, d, inv) for d in s.distinct)
        assert best_distinct == pytest.approx(best_all, rel=1e-6), equivalence


def test_best_time_on_machine_b_beats_the_classic_layouts():
    topo, inv = load_machine("moment-b"), inventory_from_counts(4, 8)
    s = enumerate_layouts(topo, inv)
    c = classic_layouts(topo, inv, s)
    classic = {k: seconds(topo, v, inv) for k, v in c.items()}
    best = min(seconds(topo, d, inv) for d in s.distinct[:: max(1, len(s.distinct) // 60)])
    assert best <= min(classic.values()) * (1 + 1e-9)
    assert classic["c"] < classic["b"]  # (c) is the paper's best classic layout, (b) its worst
