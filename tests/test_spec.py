"""Machine specs: the bundled Machines A and B, the schema's checks, and fuzzing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import ParseError
from planner.topology import jsonio
from planner.topology.model import LinkKind, NodeKind, Topology
from planner.topology.spec.bundled import bundled_machines
from planner.topology.spec.load import (
    load_machine,
    load_machine_spec,
    parse_machine_spec,
    read_machine_spec,
    spec_inventory,
)
from planner.topology.spec.schema import FORM_FACTORS, MachineSpec, inferred_figures
from tests.fuzz import mutate, parses_or_refuses

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30


# ---------------------------------------------------------------------------
# helpers


def slots_under(topo: Topology, parent_id: str) -> list:
    """The slots directly below a socket or switch."""
    return [n for n in topo.children(parent_id) if n.kind == NodeKind.SLOT]


def gpu_capable(slot) -> bool:
    a = slot.attrs
    return a["form_factor"] == "cem" and a["double_width"] and a["width_lanes"] >= 16


def fits(topo: Topology, parent_id: str, gpus: int, ssds: int) -> bool:
    """Whether ``gpus`` A100s and ``ssds`` P5510s fit the slots directly under ``parent_id``.

    GPUs need a double-width x16 CEM slot; an SSD takes a U.2 bay or any CEM slot
    (the inventory's ``fits``). GPU slots are a subset of CEM slots, so placing the
    GPUs first and the SSDs in U.2 bays before spare CEM slots is optimal.
    """
    slots = slots_under(topo, parent_id)
    gpu_slots = [s for s in slots if gpu_capable(s)]
    if gpus > len(gpu_slots):
        return False
    spare_cem = sum(1 for s in slots if s.attrs["form_factor"] == "cem") - gpus
    u2 = sum(1 for s in slots if s.attrs["form_factor"] == "u.2")
    return ssds <= u2 + spare_cem


def inferred(element_attrs, name: str) -> bool:
    return name in element_attrs.get("inferred_fields", [])


@pytest.fixture(scope="module")
def machine_a() -> Topology:
    return load_machine("moment-a")


@pytest.fixture(scope="module")
def machine_b() -> Topology:
    return load_machine("moment-b")


# ---------------------------------------------------------------------------
# bundled machines


def test_bundled_machines_are_listed_and_load():
    bundled = bundled_machines()
    assert {"moment-a", "moment-b"} <= set(bundled)
    for name, path in bundled.items():
        spec = read_machine_spec(name)
        assert isinstance(spec, MachineSpec)
        assert spec.name == name == path.stem
        assert spec.topology.name == name
        assert str(path) in spec.topology.sources
        # by path and by name give the same topology
        assert jsonio.to_dict(load_machine(path)) == jsonio.to_dict(spec.topology)
        assert jsonio.to_dict(load_machine(str(path))) == jsonio.to_dict(spec.topology)
        assert jsonio.to_dict(load_machine_spec(path)) == jsonio.to_dict(spec.topology)


def test_machine_a_shape(machine_a):
    counts = machine_a.counts()
    assert counts["socket"] == 2 and counts["switch"] == 2 and counts["memory"] == 2
    assert counts["slot"] == 25
    assert counts["gpu"] == 0 and counts["nvme"] == 0  # the devices are an inventory
    assert counts["nic"] == 1  # socket 1 carries the NICs / LAN adapters
    assert machine_a.parent("switch:sw0").id == "socket0"
    assert machine_a.parent("switch:sw1").id == "socket1"
    assert machine_a.socket_of("dev:a1-nic").id == "socket1"

    # Root complex 0: four front NVMe bays (Buses 1-4) and switch 0 via Bus 9.
    rc0 = slots_under(machine_a, "socket0")
    assert [s.attrs["label"] for s in rc0] == ["Bus 1", "Bus 2", "Bus 3", "Bus 4"]
    assert all(s.attrs["form_factor"] == "u.2" and s.attrs["width_lanes"] == 4
               and s.attrs["front_bay"] for s in rc0)
    bus9 = machine_a.link_between("socket0", "switch:sw0")
    assert bus9.attrs["label"] == "Bus 9"
    assert (bus9.pcie_gen, bus9.lanes) == (4, 16)
    assert bus9.bytes_per_s == pytest.approx(20 * GiB)

    # Each switch: four double-width x16 GPU slots and four x4 SSD slots.
    for sw in ("switch:sw0", "switch:sw1"):
        slots = slots_under(machine_a, sw)
        assert len(slots) == 8
        assert sum(gpu_capable(s) for s in slots) == 4
        assert sum(s.attrs["form_factor"] == "u.2" and not s.attrs["front_bay"]
                   for s in slots) == 4
    # Root complex 1 mirrors root complex 0 and adds the OCP NIC slot.
    rc1 = slots_under(machine_a, "socket1")
    assert sum(s.attrs["front_bay"] for s in rc1) == 4
    assert [s.attrs["form_factor"] for s in rc1 if not s.attrs["front_bay"]] == ["ocp"]
    assert machine_a.node("slot:a1-ocp").attrs["in_use"] is True
    assert not any(s.attrs["in_use"] for s in machine_a.nodes(NodeKind.SLOT)
                   if s.id != "slot:a1-ocp")


def test_machine_a_cpu_and_memory(machine_a):
    for i in (0, 1):
        sock = machine_a.node(f"socket{i}")
        assert sock.attrs["cpu_model"] == "Intel Xeon Gold 5320"
        assert sock.attrs["threads"] == 52 and sock.attrs["clock_ghz"] == 2.2
        assert sock.numa_node == i
        assert machine_a.node(f"mem{i}").attrs["capacity_bytes"] == 384e9
    assert sum(machine_a.node(f"mem{i}").attrs["capacity_bytes"] for i in (0, 1)) == 768e9
    xs = machine_a.links(LinkKind.INTER_SOCKET)
    assert len(xs) == 1 and xs[0].bandwidth_source == "spec"
    assert xs[0].attrs["technology"] == "UPI"


def test_machine_a_paper_layouts_fit(machine_a):
    # (a) SSDs front first, GPUs spread; (b) SSDs front first, GPUs on switch 0
    assert fits(machine_a, "socket0", 0, 4) and fits(machine_a, "socket1", 0, 4)
    assert fits(machine_a, "switch:sw0", 2, 0) and fits(machine_a, "switch:sw1", 2, 0)
    assert fits(machine_a, "switch:sw0", 4, 0)
    # (c) SSDs balanced over the switches, GPUs spread
    assert fits(machine_a, "switch:sw0", 2, 4) and fits(machine_a, "switch:sw1", 2, 4)
    # (d) four GPUs and four SSDs on switch 0, the other four SSDs on switch 1
    assert fits(machine_a, "switch:sw0", 4, 4) and fits(machine_a, "switch:sw1", 0, 4)
    # §4.6: with four GPUs, switch 0's slot limits allow one SSD per GPU, no more
    assert not fits(machine_a, "switch:sw0", 4, 5)
    # no GPU slot on a root complex
    assert not fits(machine_a, "socket0", 1, 0)


def test_machine_a_inventory():
    items = spec_inventory("moment-a")
    assert [(i.kind, i.count) for i in items] == [(NodeKind.GPU, 4), (NodeKind.NVME, 8)]
    gpu, ssd = items
    assert gpu.model == "NVIDIA A100 40GB PCIe"
    assert gpu.double_width and gpu.fits == ("cem",) and (gpu.pcie_gen, gpu.lanes) == (4, 16)
    assert gpu.attrs["capacity_bytes"] == 40 * GiB
    assert ssd.model == "Intel P5510 3.84 TB" and ssd.form_factor == "u.2"
    assert set(ssd.fits) == {"u.2", "cem"} and set(ssd.fits) <= set(FORM_FACTORS)
    assert (ssd.pcie_gen, ssd.lanes) == (4, 4) and not ssd.double_width
    assert ssd.attrs["capacity_bytes"] == 3_840_000_000_000
    assert ssd.attrs["read_bytes_per_s"] == 6 * GiB
    assert ssd.attrs["random_read_iops"] == 700_000
    # Machine B has the same devices to place
    assert [(i.kind, i.count, i.model) for i in spec_inventory("moment-b")] == [
        (i.kind, i.count, i.model) for i in items]


def test_machine_b_shape(machine_b):
    counts = machine_b.counts()
    assert counts["socket"] == 2 and counts["switch"] == 2 and counts["slot"] == 19
    assert counts["gpu"] == counts["nvme"] == counts["nic"] == 0
    assert machine_b.parent("switch:sw0").id == "socket0"
    assert machine_b.parent("switch:sw1").id == "switch:sw0"
    assert machine_b.socket_of("switch:sw1").id == "socket0"

    bus11 = machine_b.link_between("socket0", "switch:sw0")
    bus16 = machine_b.link_between("switch:sw0", "switch:sw1")
    assert bus11.attrs["label"] == "Bus 11" and bus16.attrs["label"] == "Bus 16"
    assert (bus16.src, bus16.dst) == ("switch:sw0", "switch:sw1")
    assert (bus16.kind, bus16.pcie_gen, bus16.lanes) == (LinkKind.PCIE, 4, 16)
    assert (bus11.pcie_gen, bus11.lanes) == (4, 16)
    assert bus16.bytes_per_s == pytest.approx(20 * GiB)

    assert len(slots_under(machine_b, "socket0")) == 1
    assert len(slots_under(machine_b, "switch:sw0")) == 4
    assert len(slots_under(machine_b, "switch:sw1")) == 5
    rc1 = slots_under(machine_b, "socket1")
    assert sum(gpu_capable(s) for s in rc1) == 1  # artifact: at most one GPU on RC 1
    assert sum(s.attrs["front_bay"] and s.attrs["form_factor"] == "u.2" for s in rc1) == 8
    for i in (0, 1):
        sock = machine_b.node(f"socket{i}")
        assert sock.attrs["cpu_model"] == "Intel Xeon Gold 6426Y"
        assert sock.attrs["threads"] == 32 and sock.attrs["clock_ghz"] == 2.5
    assert sum(machine_b.node(f"mem{i}").attrs["capacity_bytes"] for i in (0, 1)) == 512e9


def test_machine_b_paper_layouts_fit(machine_b):
    # (a) 8 SSDs in front bays, GPUs 2 + 2 over the switches
    assert fits(machine_b, "socket1", 0, 8)
    assert fits(machine_b, "switch:sw0", 2, 0) and fits(machine_b, "switch:sw1", 2, 0)
    # (b) 8 SSDs in front, four GPUs on one switch (either one)
    assert fits(machine_b, "switch:sw0", 4, 0) and fits(machine_b, "switch:sw1", 4, 0)
    # (c) GPUs 0,1 + two SSDs on switch 0; GPUs 2,3 + two SSDs on switch 1; four in front
    assert fits(machine_b, "switch:sw0", 2, 2) and fits(machine_b, "switch:sw1", 2, 2)
    assert fits(machine_b, "socket1", 0, 4)
    # (d) four GPUs and an SSD on switch 1, four SSDs on switch 0, three in front
    assert fits(machine_b, "switch:sw1", 4, 1) and fits(machine_b, "switch:sw0", 0, 4)
    # Fig. 7 (Moment): GPU 0 on RC 0; GPU 3 + 4 SSDs on RC 1; 2 SSDs on switch 0;
    # 2 SSDs + 2 GPUs on switch 1
    assert fits(machine_b, "socket0", 1, 0)
    assert fits(machine_b, "socket1", 1, 4)
    assert fits(machine_b, "switch:sw0", 0, 2)
    assert fits(machine_b, "switch:sw1", 2, 2)
    # and what the artifact's slot model rules out
    assert not fits(machine_b, "socket1", 2, 0)
    assert not fits(machine_b, "socket0", 1, 1)
    assert not fits(machine_b, "switch:sw0", 3, 2)


# ---------------------------------------------------------------------------
# provenance: what the paper gives is plain, what is inferred says so


def test_machine_a_provenance(machine_a):
    gpu_slot = machine_a.node("slot:a0-gpu0").attrs
    for name in ("width_lanes", "double_width", "pcie_gen", "form_factor", "count"):
        assert not inferred(gpu_slot, name), name  # Table 1, §3.2, §2.3
    assert "§3.2" in gpu_slot["field_notes"]["double_width"]
    gpu_link = machine_a.link_between("switch:sw0", "slot:a0-gpu0")
    assert gpu_link.bandwidth_source == "spec" and not inferred(gpu_link.attrs, "bytes_per_s")

    bay = machine_a.node("slot:a0-bay0").attrs
    assert not inferred(bay, "count")  # "four NVMe SSDs via Bus 1-4"
    assert not inferred(bay, "pcie_gen")  # PCIe 4.0
    for name in ("width_lanes", "form_factor", "front_bay"):
        assert inferred(bay, name), name
    assert inferred(machine_a.node("slot:a0-sw-nvme0").attrs, "count")  # from §4.6, by reasoning

    bus9 = machine_a.link_between("socket0", "switch:sw0").attrs
    assert inferred(bus9, "lanes") and inferred(bus9, "bytes_per_s")
    assert not inferred(bus9, "pcie_gen")

    sock = machine_a.node("socket0").attrs
    for name in ("cpu_model", "threads", "clock_ghz", "numa_nodes"):
        assert not inferred(sock, name), name
    assert inferred(machine_a.node("mem0").attrs, "capacity_bytes")
    assert inferred(machine_a.link_between("socket0", "mem0").attrs, "bytes_per_s")
    assert inferred(machine_a.links(LinkKind.INTER_SOCKET)[0].attrs, "bytes_per_s")

    ocp = machine_a.node("slot:a1-ocp").attrs
    assert ocp["inferred"] is True and "NIC" in ocp["note"]
    assert "inferred" not in machine_a.node("dev:a1-nic").attrs  # the NICs themselves are in §2.3


def test_machine_b_provenance(machine_b):
    for slot_id in ("slot:b0-gpu", "slot:b1-gpu"):
        attrs = machine_b.node(slot_id).attrs
        assert "inferred" not in attrs  # Fig. 7 puts GPUs 0 and 3 here
        assert not inferred(attrs, "width_lanes") and not inferred(attrs, "double_width")
    for slot_id in ("slot:b-sw0-slot0", "slot:b-sw1-slot4", "slot:b1-bay7"):
        attrs = machine_b.node(slot_id).attrs
        assert inferred(attrs, "count") and inferred(attrs, "width_lanes")
        assert "artifact" in attrs["field_notes"]["count"]
    bus16 = machine_b.link_between("switch:sw0", "switch:sw1").attrs
    assert inferred(bus16, "lanes") and not inferred(bus16, "pcie_gen")
    assert inferred(machine_b.node("socket0").attrs, "numa_nodes")  # not in the paper for B
    assert not inferred(machine_b.node("socket0").attrs, "threads")


def test_inventory_provenance():
    gpu, ssd = spec_inventory("moment-b")
    assert gpu.attrs.get("inferred_fields", []) == []  # Table 1 and §3.2
    assert not inferred(ssd.attrs, "read_bytes_per_s")  # §2.2
    assert not inferred(ssd.attrs, "capacity_bytes") and not inferred(ssd.attrs, "pcie_gen")
    for name in ("random_read_iops", "form_factor", "lanes", "fits"):
        assert inferred(ssd.attrs, name), name
    assert "one million" in ssd.attrs["field_notes"]["random_read_iops"]


@pytest.mark.parametrize("name", ["moment-a", "moment-b"])
def test_every_inferred_figure_says_why(name):
    topo = load_machine(name)
    figures = inferred_figures(topo)
    assert len(figures) > 20
    assert all(note for _, _, note in figures)
    assert any(f"{len(figures)} figures" in n for n in topo.notes)
    for item in spec_inventory(name):
        notes = item.attrs.get("field_notes", {})
        assert all(notes.get(f) for f in item.attrs.get("inferred_fields", []))


@pytest.mark.parametrize("name", ["moment-a", "moment-b"])
def test_json_round_trip(name):
    topo = load_machine(name)
    data = jsonio.to_dict(topo)
    assert json.loads(jsonio.dumps(topo)) == data  # attrs are plain JSON
    again = jsonio.from_dict(json.loads(jsonio.dumps(topo)))
    assert jsonio.to_dict(again) == data


# ---------------------------------------------------------------------------
# the documented example


def test_documented_example_parses():
    doc = (REPO / "docs" / "machine-spec.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", doc, re.S).group(1)
    spec = parse_machine_spec(example, "docs/machine-spec.md")
    topo = spec.topology
    assert {n.id for n in topo.nodes()} == {
        "socket0", "mem0", "switch:sw0", "slot:bay0", "slot:bay1", "slot:gpu-slot0",
        "slot:gpu-slot1", "slot:ocp0", "dev:ssd0", "dev:ssd1", "dev:gpu0", "dev:gpu1"}
    assert topo.parent("dev:ssd1").id == "slot:bay1"
    assert topo.node("slot:bay1").attrs["designation"] == "Front bay 2"
    assert topo.node("slot:bay0").attrs["in_use"] and not topo.node("slot:ocp0").attrs["in_use"]
    nv = topo.links(LinkKind.NVLINK)
    assert len(nv) == 1 and nv[0].bytes_per_s == 300e9 and nv[0].attrs["nvlink_links"] == 12
    assert topo.node("dev:ssd0").attrs["random_read_iops"] == 1_100_000
    assert inferred(topo.node("slot:ocp0").attrs, "pcie_gen")
    assert [(i.kind, i.count) for i in spec.inventory] == [(NodeKind.NVME, 2)]


# ---------------------------------------------------------------------------
# validation: ParseError with the right line

BASE = """\
schema: moment.machine
version: 1
name: t
defaults: {pcie_gen: 4}
sockets:
  - id: 0
    threads: 8
    ports:
      - slot: bay{i}
        count: 2
        form_factor: u.2
        lanes: 4
        device: {kind: nvme, model: X, id: "ssd{i}"}
      - switch: sw0
        uplink: {lanes: 16}
        ports:
          - slot: g0
            form_factor: cem
            lanes: 16
            double_width: true
            device:
              kind: gpu
              model: A100
              id: gpu0
  - id: 1
interconnect:
  - sockets: [0, 1]
    bandwidth: 20 GiB/s
"""


def test_base_spec_is_valid():
    topo = parse_machine_spec(BASE, "bad.yaml").topology
    assert topo.counts()["nvme"] == 2 and topo.counts()["gpu"] == 1


def _edit(line_no: int, new: str | None = None, insert: str | None = None) -> str:
    lines = BASE.splitlines()
    if insert is not None:
        lines.insert(line_no - 1, insert)
    else:
        lines[line_no - 1] = new
    return "\n".join(lines) + "\n"


BAD = [
    # (id, text, expected line, a piece of the message)
    ("unknown key", _edit(12, "        lanse: 4"), 12, "did you mean 'lanes'"),
    ("unknown top key", _edit(3, "nmae: t"), 3, "did you mean 'name'"),
    ("wrong type", _edit(7, "    threads: eight"), 7, "thread count"),
    ("float for int", _edit(7, "    threads: 2.5"), 7, "thread count"),
    ("negative width", _edit(12, "        lanes: -4"), 12, "PCIe width"),
    ("odd width", _edit(12, "        lanes: 3"), 12, "PCIe width"),
    ("unknown kind", _edit(22, "              kind: tpu"), 22, "device kind"),
    ("unknown form factor", _edit(11, "        form_factor: sxm"), 11, "form factor"),
    ("duplicate id", _edit(17, "          - slot: sw0"), 17, "already used on line 14"),
    ("duplicate device id", _edit(24, "              id: ssd1"), 24, "unique id"),
    ("duplicate socket", _edit(25, "  - id: 0"), 25, "unique socket id"),
    ("device wider than slot", _edit(13, '        device: {kind: nvme, model: X, id: "ssd{i}", lanes: 8}'),
     13, "no wider than its x4 slot"),
    ("double-width device in single slot",
     _edit(20, "            double_width: false", None).replace(
         "              id: gpu0", "              id: gpu0\n              double_width: true"),
     25, "double-width slot"),
    ("bad YAML", _edit(11, "        form_factor: [u.2"), 12, "valid YAML"),
    ("tab", _edit(7, "\tthreads: 8"), 7, "valid YAML"),
    ("duplicate key", _edit(12, "        lanes: 4", insert="        lanes: 4"), 13,
     "'lanes' is also on line 12"),
    ("wrong schema", _edit(1, "schema: moment.topology"), 1, "schema: moment.machine"),
    ("wrong version", _edit(2, "version: 2"), 2, "version 1"),
    ("string version", _edit(2, "version: '1'"), 2, "version 1"),
    ("count without template", _edit(9, "      - slot: bay"), 9, "'{i}' or '{n}'"),
    ("count too big", _edit(10, "        count: 100000"), 10, "slot count"),
    ("bandwidth without /s", _edit(28, "    bandwidth: 20 GiB"), 28, "bytes/s"),
    ("unknown socket in interconnect", _edit(27, "  - sockets: [0, 7]"), 27, "socket defined"),
    ("provenance without value", _edit(12, "        lanes: {inferred: true}"), 12, "'value:'"),
    ("provenance unknown key", _edit(12, "        lanes: {value: 4, infered: true}"), 12,
     "did you mean 'inferred'"),
    ("slot and switch", _edit(9, "      - slot: bay{i}\n        switch: x"), 9, "exactly one of"),
    ("missing form factor", _edit(11, "        designation: Bay"), 9, "'form_factor:'"),
    ("bad bus address", _edit(10, "        bus_address: zz"), 10, "PCI address"),
    ("bus address with count", _edit(11, "        form_factor: u.2", insert="        bus_address: 01:00.0"),
     11, "no bus_address"),
    ("unknown port kind", _edit(9, "      - bay: x"), 9, "exactly one of"),
    ("null socket id", _edit(25, "  - id:"), 25, "socket id"),
    ("efficiency above 1", _edit(4, "defaults: {pcie_gen: 4, protocol_efficiency: 1.5}"), 4,
     "share in (0, 1]"),
]


@pytest.mark.parametrize("text, line, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_spec_names_file_and_line(text, line, message):
    with pytest.raises(ParseError) as info:
        parse_machine_spec(text, "bad.yaml")
    err = info.value
    assert err.source == "bad.yaml"
    assert err.line == line, str(err)
    assert message in str(err), str(err)
    assert str(err).startswith(f"bad.yaml:{line}: expected ")


def test_switch_without_gen_and_no_defaults():
    text = BASE.replace("defaults: {pcie_gen: 4}\n", "")
    with pytest.raises(ParseError) as info:
        parse_machine_spec(text, "bad.yaml")
    assert info.value.line == 9 - 1 and "'gen:'" in str(info.value)


@pytest.mark.parametrize("text, line, message", [
    ("", None, "an empty file"),
    ("# only a comment\n\n", None, "an empty file"),
    ("- a\n- b\n", 1, "found 'a list'"),
    ("just text\n", 1, "machine spec"),
    ("version: 1\nname: x\n", 1, "'schema:'"),
    ("schema: moment.machine\nname: x\n", 1, "'version:'"),
    ("schema: moment.machine\nversion: 1\nsockets: []\nname: x\n", 3, "at least one socket"),
    ("schema: moment.machine\nversion: 1\nname: x\n", 1, "'sockets:'"),
    ("a: 1\n---\nb: 2\n", 2, "valid YAML"),
    ("x: \x00\n", 1, "valid YAML"),
    ("x: *nope\n", 1, "valid YAML"),
    pytest.param("[" * 1500, None, "nested", id="deep-nesting"),
])
def test_bad_documents(text, line, message):
    with pytest.raises(ParseError) as info:
        parse_machine_spec(text, "bad.yaml")
    assert info.value.line == line, str(info.value)
    assert message in str(info.value)


def test_nvlink_checks():
    ok = BASE + "nvlink:\n  - devices: [gpu0, ssd0]\n    bandwidth: 100 GB/s\n"
    topo = parse_machine_spec(ok, "x.yaml").topology
    assert topo.links(LinkKind.NVLINK)[0].bytes_per_s == 100e9
    bad = BASE + "nvlink:\n  - devices: [gpu0, gpu9]\n    bandwidth: 100 GB/s\n"
    with pytest.raises(ParseError) as info:
        parse_machine_spec(bad, "x.yaml")
    assert info.value.line == 30 and "installed" in str(info.value)
    same = BASE + "nvlink:\n  - devices: [gpu0, gpu0]\n    bandwidth: 100 GB/s\n"
    with pytest.raises(ParseError, match="two different devices"):
        parse_machine_spec(same, "x.yaml")


def test_anchors_and_merge_keys():
    text = BASE.replace(
        "      - slot: bay{i}\n        count: 2\n        form_factor: u.2\n        lanes: 4\n",
        "      - slot: bay{i}\n        count: 2\n        <<: &bay {form_factor: u.2, lanes: 4}\n",
    ).replace("          - slot: g0\n", "          - slot: u9\n            <<: *bay\n"
              "          - slot: g0\n")
    topo = parse_machine_spec(text, "x.yaml").topology
    assert topo.node("slot:u9").attrs["form_factor"] == "u.2"
    assert topo.node("slot:bay1").attrs["width_lanes"] == 4
    loop = "a: &x\n  <<: *x\n"
    with pytest.raises(ParseError):
        parse_machine_spec(loop, "x.yaml")
    recursive = ("schema: moment.machine\nversion: 1\nname: r\nsockets:\n  - id: 0\n"
                 "    ports: &p\n      - switch: s\n        uplink: {lanes: 16, gen: 4}\n"
                 "        ports: *p\n")
    with pytest.raises(ParseError, match="unique id"):
        parse_machine_spec(recursive, "x.yaml")


def test_files_and_names(tmp_path):
    good = tmp_path / "m.yaml"
    good.write_text(BASE)
    assert load_machine(good).name == "t"
    assert load_machine(str(good)).name == "t"
    assert load_machine_spec(BASE, "inline").sources[0] == "inline"
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"schema: moment.machine\n\x00\x01\x02")
    with pytest.raises(ParseError) as info:
        load_machine(binary)
    assert info.value.source == str(binary)
    # the shared read_text takes non-UTF-8 text as Latin-1
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(BASE.replace("model: A100", "model: A100 caf\xe9").encode("latin-1"))
    assert load_machine(latin).node("dev:gpu0").name == "A100 caf\xe9"
    with pytest.raises(ParseError) as info:
        load_machine(tmp_path / "missing.yaml")
    assert info.value.source.endswith("missing.yaml")
    with pytest.raises(ParseError, match="moment-a"):
        load_machine("no-such-machine")
    with pytest.raises(ParseError):
        spec_inventory("no-such-machine")


def test_duplicate_id_in_bundled_spec_is_reported_on_its_line():
    path = bundled_machines()["moment-b"]
    lines = path.read_text().splitlines()
    idx = next(i for i, ln in enumerate(lines) if "- slot: b1-bay{i}" in ln)
    lines[idx] = lines[idx].replace("b1-bay{i}", "b-sw0-slot{i}")
    with pytest.raises(ParseError) as info:
        parse_machine_spec("\n".join(lines), str(path))
    assert info.value.line == idx + 1 and "already used" in str(info.value)


# ---------------------------------------------------------------------------
# fuzzing: a Topology or a ParseError, nothing else

BUNDLED_TEXT = {name: path.read_text() for name, path in bundled_machines().items()}


def _parse_or_parse_error(text: str) -> None:
    spec = parses_or_refuses(parse_machine_spec, text, "fuzz.yaml")
    if spec is None:
        return
    assert isinstance(spec.topology, Topology)
    jsonio.to_dict(spec.topology)


@st.composite
def mutated(draw) -> str:
    text = BUNDLED_TEXT[draw(st.sampled_from(sorted(BUNDLED_TEXT)))]
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "truncate", "flip", "insert",
                                   "indent"]))
        if not lines:
            break
        if op in ("insert", "indent"):  # YAML's own damage: stray text, wrong indentation
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i + (op == "indent")] = [draw(st.text(max_size=30)) if op == "insert" else
                                             draw(st.sampled_from(["  ", "", "    "])) + lines[i].lstrip()]
        else:
            lines = mutate(lines, op, lambda lo, hi: draw(st.integers(lo, hi)),
                           lambda: draw(st.sampled_from(list("0123456789-:{}[],&*!|>'\"# \tx."))))
    return "\n".join(lines)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_bundled_specs_give_topology_or_parse_error(text):
    _parse_or_parse_error(text)


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.text(max_size=200),
                 st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_random_text_gives_parse_error(text):
    _parse_or_parse_error(text)


@settings(max_examples=60, deadline=None)
@given(st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 40), st.text(max_size=8),
              st.sampled_from(["u.2", "cem", "gpu", "nvme", "20 GiB/s", "3.84 TB", "{i}"])),
    lambda kids: st.one_of(st.lists(kids, max_size=4),
                           st.dictionaries(st.sampled_from(
                               ["slot", "switch", "lanes", "gen", "ports", "device", "kind",
                                "model", "count", "form_factor", "value", "inferred", "id",
                                "uplink", "bandwidth", "double_width"]), kids, max_size=5)),
    max_leaves=20))
def test_structured_garbage_gives_parse_error(ports):
    doc = {"schema": "moment.machine", "version": 1, "name": "g",
           "sockets": [{"id": 0, "ports": ports}]}
    _parse_or_parse_error(json.dumps(doc))
