"""The SVG picture of a topology: valid XML, every node drawn once, labels, no overlaps."""

from __future__ import annotations

import itertools
import os
import xml.etree.ElementTree as ET
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import TopologyError
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcitree import PciFunction, add_memory_and_interconnect, build_pci_topology
from planner.topology.svg.draw import topology_svg, write_svg
from planner.topology.svg.layout import SMALL_BOX_H, Box, topology_layout
from planner.topology.svg.style import HIGHLIGHT, LINK_COLOURS, MAX_LABELLED_ARCS
from tests.conftest import topology_fixture

NS = "{http://www.w3.org/2000/svg}"


# -- machines built from PCI function lists ------------------------------------


def _bridge(addr, sec, sub, *, numa=None, port=None, cap=(4, 16), slot=None, name=""):
    return PciFunction(addr, class_code="0604", is_bridge=True, secondary_bus=sec,
                       subordinate_bus=sub, numa_node=numa, port_type=port, link_cap=cap,
                       slot=slot, name=name)


def _device(addr, class_code, name, cap=(4, 16), vendor=None):
    return PciFunction(addr, class_code=class_code, name=name, link_cap=cap, vendor_id=vendor)


def four_gpu_machine() -> Topology:
    """2 sockets, a Gen5 switch on each with 2 H100 and 4 NVMe in slots, a NIC and an empty slot."""
    fns = []
    for s, b in ((0, 0x00), (1, 0x80)):
        fns.append(_bridge(f"{b:02x}:01.0", b + 1, b + 9, numa=s, port="root", cap=(5, 16)))
        fns.append(_bridge(f"{b + 1:02x}:00.0", b + 2, b + 9, port="upstream", cap=(5, 16),
                           name="Broadcom PEX89048"))
        for i in range(6):
            cap = (5, 16) if i < 2 else (4, 4)
            fns.append(_bridge(f"{b + 2:02x}:{i:02x}.0", b + 3 + i, b + 3 + i, port="downstream",
                               cap=cap, slot=str(10 * s + i + 1)))
            if i < 2:
                fns.append(_device(f"{b + 3 + i:02x}:00.0", "0302",
                                   "NVIDIA Corporation GH100 [H100 SXM5 80GB]", (5, 16), "10de"))
            else:
                fns.append(_device(f"{b + 3 + i:02x}:00.0", "0108",
                                   "Micron Technology Inc 7450 PRO NVMe SSD", (4, 4)))
        fns.append(_bridge(f"{b:02x}:03.0", b + 0x10, b + 0x10, numa=s, port="root"))
        fns.append(_device(f"{b + 0x10:02x}:00.0", "0200",
                           "Mellanox Technologies MT28800 Family [ConnectX-5 Ex]"))
        fns.append(_bridge(f"{b:02x}:04.0", b + 0x11, b + 0x11, numa=s, port="root", cap=(4, 4),
                           slot=str(100 + s)))
    topo = build_pci_topology(fns, name="4-GPU 8-NVMe two-switch box")
    gpus = [n.id for n in topo.nodes(NodeKind.GPU)]
    for a, b in itertools.combinations(range(len(gpus)), 2):
        bw = 150e9 if a // 2 == b // 2 else 50e9
        topo.add_link(Link(gpus[a], gpus[b], LinkKind.NVLINK, bw, bandwidth_source="spec"))
    return topo


MISC_PER_ROOT_BUS = 12


def big_machine() -> Topology:
    """60+ nodes: two switch levels per socket, empty U.2 bays, many OTHER functions, no-NUMA buses."""
    fns = []
    for s, b in ((0, 0x00), (1, 0x80)):
        fns.append(_bridge(f"{b + 0x10:02x}:00.0", b + 0x11, b + 0x2f, numa=s, port="root", cap=(3, 16)))
        fns.append(_bridge(f"{b + 0x11:02x}:00.0", b + 0x12, b + 0x2f, port="upstream", cap=(3, 16),
                           name="PLX 9797"))
        nb = b + 0x13
        for k in range(2):
            fns.append(_bridge(f"{b + 0x12:02x}:{k:02x}.0", nb, nb + 8, port="downstream", cap=(3, 16)))
            fns.append(_bridge(f"{nb:02x}:00.0", nb + 1, nb + 8, port="upstream", cap=(3, 16),
                               name="PLX 9781"))
            for i in range(4):
                fns.append(_bridge(f"{nb + 1:02x}:{i:02x}.0", nb + 2 + i, nb + 2 + i,
                                   port="downstream", cap=(3, 16)))
                addr = f"{nb + 2 + i:02x}:00.0"
                if i < 2:
                    fns.append(_device(addr, "0302", "NVIDIA Corporation GV100GL [Tesla V100 SXM3 32GB]",
                                       (3, 16), "10de"))
                elif i == 2:
                    fns.append(_device(addr, "0207", "Mellanox Technologies MT27800 Family [ConnectX-5]",
                                       (3, 16)))
                else:
                    fns.append(_device(addr, "0108", "Samsung Electronics Co Ltd NVMe SSD Controller PM1725b",
                                       (3, 4)))
            nb += 9
        for i in range(4):
            fns.append(_bridge(f"{b + 0x50:02x}:{i:02x}.0", b + 0x51 + i, b + 0x51 + i, numa=s,
                               port="root", cap=(3, 4), slot=str(160 + 4 * s + i)))
        fns.append(_bridge(f"{b + 0x60:02x}:00.0", b + 0x61, b + 0x61, numa=s, port="root", cap=(3, 8)))
        fns.append(_device(f"{b + 0x61:02x}:00.0", "0107", "Broadcom / LSI SAS3008 [HBA330]", (3, 8)))
        # root-bus functions with no NUMA node: they hang under "socket?" and are OTHER
        for i in range(MISC_PER_ROOT_BUS):
            fns.append(_device(f"{b + 0x65:02x}:{i:02x}.0", "0880", f"Intel Corporation misc function {i}",
                               None))
    topo = build_pci_topology(fns, name="big synthetic", keep_root_bus_platform=True)
    gpus = [n.id for n in topo.nodes(NodeKind.GPU)]
    for i in range(0, len(gpus), 2):
        topo.add_link(Link(gpus[i], gpus[i + 1], LinkKind.NVLINK, 150e9, bandwidth_source="spec"))
    return topo


# -- helpers ----------------------------------------------------------------------


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    return root


def _node_groups(root: ET.Element) -> dict[str, ET.Element]:
    groups = [g for g in root.iter(f"{NS}g") if g.get("class") == "node"]
    ids = [g.get("data-id") for g in groups]
    assert len(ids) == len(set(ids)), "a node is drawn twice"
    return dict(zip(ids, groups, strict=True))


def _rect_box(rect: ET.Element) -> Box:
    return Box(*(float(rect.get(k)) for k in ("x", "y", "width", "height")))


def _all_text(root: ET.Element) -> str:
    return "\n".join(t.text or "" for t in root.iter(f"{NS}text"))


def _link_group(root: ET.Element, a: str, b: str) -> ET.Element:
    for g in root.iter(f"{NS}g"):
        if g.get("class") == "link" and {g.get("data-src"), g.get("data-dst")} == {a, b}:
            return g
    raise AssertionError(f"no link group for {a} — {b}")


def assert_no_overlaps(topo: Topology, svg: str | None = None) -> None:
    """Node boxes never overlap each other, nor tree-link labels each other or any box."""
    lay = topology_layout(topo)
    boxes = list(lay.boxes.items())
    assert set(lay.boxes) == {n.id for n in topo.nodes()}
    for (ia, a), (ib, b) in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), f"boxes of {ia} and {ib} overlap: {a} {b}"
    labels = list(lay.link_label_boxes.items())
    for (ka, a), (kb, b) in itertools.combinations(labels, 2):
        assert not a.overlaps(b), f"labels of {ka} and {kb} overlap"
    for (k, lab), (i, box) in itertools.product(labels, boxes):
        assert not lab.overlaps(box), f"label of {k} covers node {i}"
    assert {k for k, _ in labels} == set(lay.tree_links)
    if svg is not None:  # the drawn rectangles, not just the layout
        rects = [(i, _rect_box(g.find(f"{NS}rect"))) for i, g in _node_groups(_parse(svg)).items()]
        for (ia, a), (ib, b) in itertools.combinations(rects, 2):
            assert not a.overlaps(b), f"drawn boxes of {ia} and {ib} overlap"


# -- the two sample machines --------------------------------------------------------


@pytest.fixture(scope="module")
def four() -> Topology:
    return four_gpu_machine()


@pytest.fixture(scope="module")
def big() -> Topology:
    return big_machine()


def test_valid_xml_one_group_and_rect_per_node(four: Topology) -> None:
    root = _parse(topology_svg(four))
    groups = _node_groups(root)
    assert set(groups) == {n.id for n in four.nodes()}
    for node_id, g in groups.items():
        assert len(g.findall(f"{NS}rect")) == 1, node_id
        assert node_id in g.find(f"{NS}title").text


def test_every_link_has_a_group(four: Topology) -> None:
    root = _parse(topology_svg(four))
    pairs = {frozenset((g.get("data-src"), g.get("data-dst")))
             for g in root.iter(f"{NS}g") if g.get("class") == "link"}
    assert pairs == {frozenset(lk.key) for lk in four.links()}


def test_link_labels_show_generation_width_and_gb_per_s(four: Topology) -> None:
    text = _all_text(_parse(topology_svg(four)))
    for expected in ("Gen5 x16", "50.4 GB/s", "Gen4 x4", "6.3 GB/s", "Gen4 x16", "25.2 GB/s",
                     "inter-socket ~41.6 GB/s", "~100 GB/s", "150 GB/s", "50.0 GB/s"):
        assert expected in text, expected


def test_node_labels(four: Topology) -> None:
    text = _all_text(_parse(topology_svg(four)))
    for expected in ("GPU 03:00.0", "H100 SXM5 80GB", "NVMe 05:00.0", "7450 PRO NVMe SSD",
                     "switch 0", "Broadcom PEX89048", "slot 1", "x16", "NIC 10:00.0", "ConnectX-5 Ex",
                     "socket 0", "NUMA 1", "slot 100", "x4 · empty"):
        assert expected in text, expected
    assert "4-GPU 8-NVMe two-switch box" in text
    assert "2 sockets · 4 GPUs · 8 NVMe · 2 NICs · 2 switches · 14 slots" in text


def test_unknown_bandwidth_is_question_mark_and_dotted() -> None:
    topo = Topology("unknown")
    topo.add_node(Node("socket0", NodeKind.SOCKET, "socket 0"))
    topo.add_node(Node("pci:0000:01:00.0", NodeKind.NVME, "disk", bus_address="0000:01:00.0"))
    topo.add_link(Link.pcie("socket0", "pci:0000:01:00.0", None, None))
    root = _parse(topology_svg(topo))
    assert "? GB/s" in _all_text(root)
    path = _link_group(root, "socket0", "pci:0000:01:00.0").find(f"{NS}path")
    assert path.get("stroke-dasharray")


def test_empty_slot_is_dashed_and_used_slot_is_not(four: Topology) -> None:
    groups = _node_groups(_parse(topology_svg(four)))
    empty = [n for n in four.nodes(NodeKind.SLOT) if not four.children(n.id)]
    used = [n for n in four.nodes(NodeKind.SLOT) if four.children(n.id)]
    assert empty and used
    for n in empty:
        assert groups[n.id].find(f"{NS}rect").get("stroke-dasharray"), n.id
    for n in used:
        assert groups[n.id].find(f"{NS}rect").get("stroke-dasharray") is None, n.id


def test_no_overlaps_sample_machines(four: Topology, big: Topology) -> None:
    assert len(big) >= 60
    for topo in (four, big):
        assert_no_overlaps(topo, topology_svg(topo))


def test_thickness_grows_with_bandwidth(four: Topology) -> None:
    root = _parse(topology_svg(four))
    gpu = "pci:0000:03:00.0"
    nvme = "pci:0000:05:00.0"
    w_gpu = float(_link_group(root, four.parent(gpu).id, gpu).find(f"{NS}path").get("stroke-width"))
    w_nvme = float(_link_group(root, four.parent(nvme).id, nvme).find(f"{NS}path").get("stroke-width"))
    assert w_gpu > w_nvme > 0


def test_highlight_and_extra_label(four: Topology) -> None:
    gpu = "pci:0000:03:00.0"
    slot = four.parent(gpu).id
    plain = _parse(topology_svg(four))
    # the pair is accepted in either orientation
    root = _parse(topology_svg(four, highlight_links=[(gpu, slot)], link_labels={(gpu, slot): "87%"}))
    path = _link_group(root, slot, gpu).find(f"{NS}path")
    before = _link_group(plain, slot, gpu).find(f"{NS}path")
    assert path.get("stroke") == HIGHLIGHT
    assert float(path.get("stroke-width")) > float(before.get("stroke-width"))
    assert HIGHLIGHT not in topology_svg(four).split("<g class=\"legend\">")[1].split("</g>")[0]
    assert "50.4 GB/s · 87%" in _all_text(root)
    # highlighted NVLink and inter-socket links are red too
    root = _parse(topology_svg(four, highlight_links=[("socket0", "socket1"),
                                                      (gpu, "pci:0000:04:00.0")]))
    for a, b in (("socket0", "socket1"), (gpu, "pci:0000:04:00.0")):
        assert _link_group(root, a, b).find(f"{NS}path").get("stroke") == HIGHLIGHT


def test_highlight_of_a_missing_link_raises(four: Topology) -> None:
    with pytest.raises(TopologyError):
        topology_svg(four, highlight_links=[("socket0", "pci:0000:03:00.0")])
    with pytest.raises(TopologyError):
        topology_svg(four, link_labels={("nowhere", "socket0"): "x"})
    with pytest.raises(TopologyError):
        topology_svg(four, highlight_links=["socket0"])  # type: ignore[list-item]


def test_nvlink_arcs_are_green(four: Topology) -> None:
    root = _parse(topology_svg(four))
    g = _link_group(root, "pci:0000:03:00.0", "pci:0000:04:00.0")
    assert g.get("data-kind") == "nvlink"
    assert g.find(f"{NS}path").get("stroke") == LINK_COLOURS[LinkKind.NVLINK]
    assert " C" in g.find(f"{NS}path").get("d")  # a curve, not a straight line


def test_dense_nvlinks_are_summarised_in_the_legend() -> None:
    topo = Topology("dense")
    topo.add_node(Node("socket0", NodeKind.SOCKET, "socket 0"))
    gpus = [f"gpu{i}" for i in range(8)]
    for g in gpus:
        topo.add_node(Node(g, NodeKind.GPU, "A100"))
        topo.add_link(Link.pcie("socket0", g, 4, 16))
    for a, b in itertools.combinations(gpus, 2):
        topo.add_link(Link(a, b, LinkKind.NVLINK, 300e9, bandwidth_source="spec"))
    assert len(topo.links(LinkKind.NVLINK)) > MAX_LABELLED_ARCS
    text = _all_text(_parse(topology_svg(topo, link_labels={("gpu0", "gpu1"): "95%"})))
    assert "NVLink (28 links, 300 GB/s)" in text
    assert text.count("300 GB/s") == 2  # the legend and the one annotated link
    assert "300 GB/s · 95%" in text
    assert_no_overlaps(topo)


def test_escaping_of_names_and_ids() -> None:
    nasty = 'R&D <GPU> "quoted" \x01bell'
    topo = Topology(name="a & b <c>")
    topo.add_node(Node("socket0", NodeKind.SOCKET, "socket <0> & co"))
    topo.add_node(Node("pci:&<1>\"", NodeKind.GPU, nasty, bus_address="0000:01:00.0"))
    topo.add_node(Node("x&y", NodeKind.OTHER, "<other>"))
    topo.add_link(Link.pcie("socket0", "pci:&<1>\"", 4, 16, note="<&>"))
    svg = topology_svg(topo, title="T&T <1>", link_labels={("socket0", "pci:&<1>\""): "<90% & up>"})
    root = _parse(svg)
    assert set(_node_groups(root)) == {"socket0", "pci:&<1>\"", "x&y"}
    text = _all_text(root)
    assert "T&T <1>" in text and "<90% & up>" in text
    assert "R&D <GPU>" in svg.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    assert "\x01" not in svg


def test_unplaced_band() -> None:
    topo = Topology("loose parts")
    topo.add_node(Node("socket0", NodeKind.SOCKET, "socket 0", numa_node=0))
    topo.add_node(Node("pci:0000:01:00.0", NodeKind.GPU, "A100", bus_address="0000:01:00.0"))
    topo.add_link(Link.pcie("socket0", "pci:0000:01:00.0", 4, 16))
    topo.add_node(Node("switch:x", NodeKind.SWITCH, "switch ?"))
    topo.add_node(Node("pci:0000:99:00.0", NodeKind.NVME, "lost disk", bus_address="0000:99:00.0"))
    topo.add_link(Link.pcie("switch:x", "pci:0000:99:00.0", 3, 4))
    topo.add_node(Node("slot:loose", NodeKind.SLOT, "slot 3", attrs={"in_use": False}))
    add_memory_and_interconnect(topo)
    lay = topology_layout(topo)
    assert lay.unplaced == ("switch:x", "slot:loose")
    main_bottom = max(lay.boxes[i].bottom for i in ("socket0", "mem0", "pci:0000:01:00.0"))
    assert lay.unplaced_top is not None and lay.unplaced_top >= main_bottom
    for i in ("switch:x", "pci:0000:99:00.0", "slot:loose"):
        assert lay.boxes[i].y > lay.unplaced_top
    svg = topology_svg(topo)
    assert "unplaced" in _all_text(_parse(svg))
    assert_no_overlaps(topo, svg)


def test_memory_beside_socket_and_other_nodes_small(big: Topology) -> None:
    lay = topology_layout(big)
    for s, m in lay.beside.items():
        assert abs(lay.boxes[s].cy - lay.boxes[m].cy) < 1
    assert set(lay.beside) == {"socket0", "socket1", "socket?"}
    others = big.nodes(NodeKind.OTHER)
    assert others and all(lay.boxes[n.id].height == SMALL_BOX_H for n in others)
    # the loose functions under "socket?" are stacked in columns on rails
    stacked = [n.id for n in others if n.id in lay.rails]
    # and each socket's SAS HBA, stacked with its four empty U.2 bays
    assert len(stacked) == 2 * MISC_PER_ROOT_BUS + 2
    bays = [n.id for n in big.nodes(NodeKind.SLOT) if not big.children(n.id)]
    assert len(bays) == 8 and all(b in lay.rails for b in bays)
    assert len({lay.boxes[i].x for i in stacked}) < len(stacked)


def test_empty_and_lonely_topologies() -> None:
    root = _parse(topology_svg(Topology()))
    assert _node_groups(root) == {}
    topo = Topology("one")
    topo.add_node(Node("pci:0000:01:00.0", NodeKind.NIC, "nic"))
    assert set(_node_groups(_parse(topology_svg(topo)))) == {"pci:0000:01:00.0"}


def test_a_cycle_and_a_second_parent_still_draw_each_node_once() -> None:
    topo = Topology("odd")
    for i, kind in enumerate([NodeKind.SOCKET, NodeKind.SWITCH, NodeKind.SWITCH, NodeKind.GPU]):
        topo.add_node(Node(f"n{i}", kind))
    topo.add_link(Link.pcie("n0", "n1", 4, 16))
    topo.add_link(Link.pcie("n0", "n2", 4, 16))
    topo.add_link(Link.pcie("n1", "n3", 4, 16))
    topo.add_link(Link.pcie("n2", "n3", 4, 16))  # a second way up
    for i in range(3):  # a ring of switches, each "under" the next: no way in
        topo.add_node(Node(f"c{i}", NodeKind.SWITCH))
    for i in range(3):
        topo.add_link(Link.pcie(f"c{i}", f"c{(i + 1) % 3}", 3, 8))
    svg = topology_svg(topo)
    assert set(_node_groups(_parse(svg))) == {"n0", "n1", "n2", "n3", "c0", "c1", "c2"}
    assert_no_overlaps(topo, svg)


def test_three_hundred_nodes() -> None:
    topo = Topology("wide")
    for s in range(2):
        topo.add_node(Node(f"socket{s}", NodeKind.SOCKET, f"socket {s}", numa_node=s))
    add_memory_and_interconnect(topo)
    n = 0
    for s in range(2):
        for k in range(3):
            sw = f"switch:{s}.{k}"
            topo.add_node(Node(sw, NodeKind.SWITCH, f"switch {s}.{k}"))
            topo.add_link(Link.pcie(f"socket{s}", sw, 4, 16))
            for j in range(50):
                kind = [NodeKind.GPU, NodeKind.NVME, NodeKind.OTHER, NodeKind.OTHER][j % 4]
                nid = f"pci:{n}"
                topo.add_node(Node(nid, kind, f"device {n}", bus_address=f"0000:{n % 256:02x}:00.0"))
                topo.add_link(Link.pcie(sw, nid, 4, 4 if kind == NodeKind.NVME else 16))
                n += 1
    assert len(topo) >= 300
    svg = topology_svg(topo)
    assert len(_node_groups(_parse(svg))) == len(topo)
    assert_no_overlaps(topo, svg)


# -- write_svg ------------------------------------------------------------------------


def test_write_svg_replaces_atomically(tmp_path: Path, four: Topology) -> None:
    target = tmp_path / "topo.svg"
    target.write_text("old")
    os.chmod(target, 0o640)
    out = write_svg(four, target, title="hello")
    assert out == target
    _parse(target.read_text(encoding="utf-8"))
    assert "hello" in target.read_text(encoding="utf-8")
    assert (target.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topo.svg"]


def test_write_svg_failure_leaves_old_file(tmp_path: Path, four: Topology) -> None:
    target = tmp_path / "topo.svg"
    target.write_text("old")
    with pytest.raises(TopologyError):
        write_svg(four, target, highlight_links=[("socket0", "nowhere")])
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topo.svg"]


def test_write_svg_new_file(tmp_path: Path, four: Topology) -> None:
    target = tmp_path / "new.svg"
    write_svg(four, str(target))
    assert _node_groups(_parse(target.read_text(encoding="utf-8")))


# -- random trees -----------------------------------------------------------------------

_KINDS = [NodeKind.SWITCH, NodeKind.SLOT, NodeKind.GPU, NodeKind.NVME, NodeKind.NIC, NodeKind.OTHER,
          NodeKind.OTHER, NodeKind.MEMORY]


@st.composite
def random_topologies(draw) -> Topology:
    topo = random_topologies_of(draw, max_nodes=45, kinds=_KINDS)
    gpus = [x.id for x in topo.nodes(NodeKind.GPU)]
    if len(gpus) >= 2:
        free = [(a, b) for a, b in itertools.combinations(gpus, 2) if topo.link_between(a, b) is None]
        for a, b in draw(st.lists(st.sampled_from(free), max_size=6, unique=True)) if free else ():
            topo.add_link(Link(a, b, LinkKind.NVLINK, draw(st.floats(1e9, 9e11)), bandwidth_source="spec"))
    return topo


def random_topologies_of(draw, *, max_nodes: int, kinds: list[NodeKind]) -> Topology:
    """Sockets (maybe with memory), then ``max_nodes`` or fewer nodes each under an earlier one or none."""
    n_sockets = draw(st.integers(0, 3))
    n = draw(st.integers(0, max_nodes))
    names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
    topo = Topology(draw(names))
    ids = []
    for s in range(n_sockets):
        topo.add_node(Node(f"socket{s}", NodeKind.SOCKET, draw(names), numa_node=s))
        ids.append(f"socket{s}")
    if n_sockets and draw(st.booleans()):
        add_memory_and_interconnect(topo)
        ids.extend(f"mem{s}" for s in range(n_sockets))
    for i in range(n):
        kind = draw(st.sampled_from(kinds))
        addr = draw(st.none() | st.just(f"0000:{i:02x}:00.0"))
        attrs = {}
        if kind == NodeKind.SLOT:
            attrs = {"form_factor": draw(st.sampled_from(["U.2", "OCP", None])),
                     "width_lanes": draw(st.sampled_from([4, 16, None]))}
        nid = f"n{i}<&>" if i % 7 == 3 else f"n{i}"
        topo.add_node(Node(nid, kind, draw(names), bus_address=addr, attrs=attrs))
        parent = draw(st.none() | st.sampled_from(ids)) if ids else None
        if parent is not None:
            gen = draw(st.none() | st.integers(1, 6))
            lanes = draw(st.sampled_from([None, 1, 4, 8, 16]))
            topo.add_link(Link.pcie(parent, nid, gen, lanes))
        ids.append(nid)
    return topo


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_topologies(), st.data())
def test_random_trees_valid_xml_and_no_overlaps(topo: Topology, data) -> None:
    links = topo.links()
    highlight = data.draw(st.lists(st.sampled_from([lk.key for lk in links]), max_size=3)) if links else []
    labels = {k: data.draw(st.text(max_size=8)) for k in highlight}
    svg = topology_svg(topo, highlight_links=highlight, link_labels=labels)
    root = _parse(svg)
    groups = _node_groups(root)
    assert set(groups) == {n.id for n in topo.nodes()}
    assert all(len(g.findall(f"{NS}rect")) == 1 for g in groups.values())
    assert_no_overlaps(topo, svg)


def _nvlinked_row(n_gpus: int, notes: int, pairs) -> Topology:
    """Unplaced GPUs in one row with wide NVLink arcs over a shared stretch."""
    topo = Topology("arcs")
    for i in range(n_gpus):
        topo.add_node(Node(f"g{i}", NodeKind.GPU, "H100"))
    topo.notes.extend(f"note {i}" for i in range(notes))
    for a, b in pairs:
        topo.add_link(Link(f"g{a}", f"g{b}", LinkKind.NVLINK, 1e11, bandwidth_source="spec"))
    return topo


def test_parallel_wide_arcs_end_and_stay_apart() -> None:
    """Issue 13: with these rows' y, re-adding the row's y to a bumped arc's depth
    left it an ulp short of 8 px from the arc above, and the layout looped for ever."""
    for n_gpus, notes in ((6, 0), (8, 1)):
        topo = _nvlinked_row(n_gpus, notes, [(0, n_gpus - 1), (1, n_gpus - 1), (0, n_gpus - 2),
                                             (1, n_gpus - 2), (0, n_gpus - 3)])
        svg = topology_svg(topo)
        lay = topology_layout(topo)
        lows = sorted(max(lay.boxes[a].bottom, lay.boxes[b].bottom) + d
                      for (a, b), d in lay.nvlink_drops.items())
        assert len(lows) == 5 and all(y - x >= 8.0 - 1e-6 for x, y in itertools.pairwise(lows))
        assert_no_overlaps(topo, svg)


@st.composite
def nvlinked_topologies(draw) -> Topology:
    """Up to 60 nodes, GPU-heavy, with many NVLinks: the arcs' layout under stress."""
    topo = random_topologies_of(draw, max_nodes=60, kinds=[NodeKind.GPU, NodeKind.GPU, *_KINDS])
    topo.notes.extend(draw(st.lists(st.text(max_size=20), max_size=3)))
    gpus = [x.id for x in topo.nodes(NodeKind.GPU)]
    free = [(a, b) for a, b in itertools.combinations(gpus, 2) if topo.link_between(a, b) is None]
    for a, b in draw(st.lists(st.sampled_from(free), max_size=24, unique=True)) if free else ():
        topo.add_link(Link(a, b, LinkKind.NVLINK, 1e11, bandwidth_source="spec"))
    return topo


@settings(max_examples=25, deadline=timedelta(seconds=30), suppress_health_check=[HealthCheck.too_slow])
@given(nvlinked_topologies())
def test_random_topologies_up_to_60_nodes_render_in_time(topo: Topology) -> None:
    """A generous deadline (a draw takes ~0.05 s) that a runaway layout step cannot meet."""
    svg = topology_svg(topo)
    assert set(_node_groups(_parse(svg))) == {n.id for n in topo.nodes()}
    assert_no_overlaps(topo, svg)


# -- real captures (when their parsers are there) -----------------------------------------


def test_real_hpe_lspci_renders() -> None:
    lspci = pytest.importorskip("planner.topology.lspci.parse")
    textio = pytest.importorskip("planner.topology.textio")
    path = topology_fixture("hpe-cray-xd665-2x-epyc9354-h100", "lspci-vvnn.txt")
    topo = lspci.topology_from_lspci(textio.read_text(path), source=str(path), name="hpe")
    svg = topology_svg(topo)
    root = _parse(svg)
    assert set(_node_groups(root)) == {n.id for n in topo.nodes()}
    text = _all_text(root)
    for gpu in ("GPU 04:00.0", "GPU 64:00.0", "GPU 84:00.0", "GPU e4:00.0"):
        assert gpu in text
    assert "Gen5 x16" in text
    assert_no_overlaps(topo, svg)


def test_real_dgx2_hwloc_renders() -> None:
    hwloc = pytest.importorskip("planner.topology.hwloc.parse")
    textio = pytest.importorskip("planner.topology.textio")
    path = topology_fixture("nvidia-dgx2h-hwloc", "hwloc.xml")
    topo = hwloc.parse_hwloc_xml(textio.read_text(path), str(path))
    svg = topology_svg(topo)
    root = _parse(svg)
    assert len([g for g in _node_groups(root).values() if g.get("data-kind") == "gpu"]) == 16
    assert_no_overlaps(topo, svg)


# -- the plan picture (`moment plan --svg`): bottlenecks, numbers, labels, size --------


def _plan_svg(tmp_path: Path, *argv: str) -> tuple[ET.Element, str]:
    """Run ``moment plan ARGV --svg`` (the CLI, as a user would) and parse the picture."""
    import contextlib
    import io

    from moment.cli import main

    svg = tmp_path / "plan.svg"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["plan", *argv, "--svg", str(svg)]) == 0
    return _parse(svg.read_text()), out.getvalue()


def _texts(group: ET.Element) -> list[str]:
    return [t.text or "" for t in group.iter(f"{NS}text")]


def _slot_map_lines(printed: str) -> list[tuple[str, str]]:
    """(device, slot designation) of each line of the printed slot map."""
    import re

    section = printed.split("Recommended slot map", 1)[1].split("per-GPU inlet", 1)[0]
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^\s*((?:GPU|SSD) \d+)(?: \([^)]*\))? → (.+?) \(PCIe", section, re.M)]


@pytest.mark.parametrize("machine", ["moment-b", "moment-a"])
def test_plan_picture_numbers_every_device_as_the_slot_map(tmp_path: Path, machine: str) -> None:
    root, printed = _plan_svg(tmp_path, "--machine", machine)
    groups = _node_groups(root)
    entries = _slot_map_lines(printed)
    assert len(entries) == len([g for g in groups.values() if g.get("data-kind") in ("gpu", "nvme")])
    lay_parent = {}
    for link in root.iter(f"{NS}g"):
        if link.get("class") == "link":
            lay_parent.setdefault(link.get("data-dst"), link.get("data-src"))
    for device, designation in entries:
        node_id = device.replace("GPU ", "gpu").replace("SSD ", "ssd")
        assert _texts(groups[node_id])[0] == device, (device, _texts(groups[node_id]))
        slot = lay_parent[node_id]
        assert designation in " ".join(_texts(groups[slot])), (device, designation, _texts(groups[slot]))


@pytest.mark.parametrize("machine", ["moment-b", "moment-a"])
def test_plan_picture_labels_are_whole_and_size_sane(tmp_path: Path, machine: str) -> None:
    root, _ = _plan_svg(tmp_path, "--machine", machine)
    width, height = float(root.get("width")), float(root.get("height"))
    # before: Machine B 3855 × 632, Machine A 5176 × 528 (every slot side by side)
    assert width <= (2000 if machine == "moment-b" else 2300) and height <= 1100, (width, height)
    assert width / height <= 3.0
    cut = [t for t in _texts(root) if "…" in t]
    assert cut == []
    assert not any(t.startswith("slot Slot") for t in _texts(root))
    boxes = [_rect_box(g.find(f"{NS}rect")) for g in _node_groups(root).values()]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    assert all(b.right <= width and b.bottom <= height for b in boxes)


def test_plan_picture_draws_saturated_ssds_red_with_a_legend(tmp_path: Path) -> None:
    root, printed = _plan_svg(tmp_path, "--machine", "moment-b")
    assert "bottleneck: reads of ssd" in printed
    hot = [g for g in _node_groups(root).values() if g.get("data-highlight") == "bottleneck"]
    assert hot and all(g.get("data-kind") == "nvme" for g in hot)
    assert all(g.find(f"{NS}rect").get("stroke") == HIGHLIGHT for g in hot)
    legend = {g.get("data-key"): g for g in root.iter(f"{NS}g") if g.get("class") == "legend-item"}
    assert "hot" in legend and "highlight" not in legend  # no link binds in this plan
    assert "bottleneck" in " ".join(_texts(legend["hot"]))


def test_plan_picture_draws_bottleneck_links_red_with_a_legend(tmp_path: Path) -> None:
    root, printed = _plan_svg(tmp_path, "--machine", "moment-b", "--cpu-cache-share", "0.5", "--json")
    import json

    bottleneck = {frozenset(pair) for pair in json.loads(printed)["ranked"][0]["bottleneck"]}
    assert bottleneck
    red = set()
    for g in root.iter(f"{NS}g"):
        if g.get("class") == "link" and g.find(f"{NS}path").get("stroke") == HIGHLIGHT:
            red.add(frozenset((g.get("data-src"), g.get("data-dst"))))
    assert red == bottleneck
    legend = {g.get("data-key"): g for g in root.iter(f"{NS}g") if g.get("class") == "legend-item"}
    assert "bottleneck link" in " ".join(_texts(legend["highlight"]))
    line = legend["highlight"].find(f"{NS}line")
    assert line.get("stroke") == HIGHLIGHT


@pytest.mark.parametrize("machine, argv", [
    ("hpe-cray-xd665-2x-epyc9354-h100", ("--lspci-vvv", "lspci-vvnn.txt", "--dmidecode", "dmidecode.txt")),
    ("dell-poweredge-r640-2x-xeon-gold6230-nvme", ("--lspci-vvv", "lspci-vvnn.txt", "--dmidecode", "dmidecode.txt")),
    ("nvidia-dgx2h-hwloc", ("--hwloc", "hwloc.xml")),
])
def test_captured_machines_keep_device_labels_whole(tmp_path: Path, machine: str, argv: tuple[str, ...]) -> None:
    """Long lspci names wrap; only minor "other" functions may be cut (their tooltip has it all)."""
    import contextlib
    import io

    from moment.cli import main

    args = [str(topology_fixture(machine, a)) if i % 2 else a for i, a in enumerate(argv)]
    svg = tmp_path / "topo.svg"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["topo", *args, "--svg", str(svg)]) == 0
    root = _parse(svg.read_text())
    for g in _node_groups(root).values():
        if g.get("data-kind") != "other":
            assert not any("…" in t for t in _texts(g)), _texts(g)
