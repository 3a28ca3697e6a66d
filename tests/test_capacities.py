"""Capacities files: format, errors with lines, and measured figures replacing table ones."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from momentbase.errors import MomentError
from momentbase.units import format_size, parse_size
from planner.capacities import (
    AppliedCapacities,
    Capacities,
    DeviceCapacity,
    LinkCapacity,
    MemoryCapacity,
    PcieEfficiency,
    ReadMeasurement,
    apply_capacities,
    apply_capacities_report,
    apply_to_inventory,
    dump_capacities,
    find_device,
    load_capacities,
    measured_figures,
    parse_capacities,
    save_capacities,
    to_dict,
)
from planner.errors import ParseError, PlannerError
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import pcie_bytes_per_s
from planner.topology.spec.load import load_machine, spec_inventory
from tests.conftest import REPO, topology_fixture

HEAD = "schema: moment.capacities\nversion: 1\n"

FULL = Capacities(
    devices=(
        DeviceCapacity(
            "pci:0000:00:02.0",
            ReadMeasurement(311458988.0, 76039.8, 4096, 64, "fio-io_uring", "direct", 1 << 30, 5.001,
                            "1 job, iodepth 64 (fio-3.33)", "2026-11-22T00:36:28+00:00", "vm"),
            model="virtio disk", block_device="vda", path="/work/x",
            others=(ReadMeasurement(248814872.7, 60745.8, 4096, 64, "moment-posix", "direct",
                                    1 << 30, 5.026, "2 processes x 32 threads"),),
        ),
        DeviceCapacity("Intel P5510 3.84 TB", ReadMeasurement(6 * 2.0**30, note="datasheet")),
    ),
    links=(
        LinkCapacity(25e9, link_class="host-to-device", device="0000:04:00.0", transfer_bytes=1 << 28,
                     tool="torch-cuda"),
        LinkCapacity(24e9, link_class="device-to-host"),
        LinkCapacity(3.7e11, src="0000:04:00.0", dst="0000:64:00.0", link_class="peer-to-peer"),
        LinkCapacity(4e10, link_class="inter-socket"),
        LinkCapacity(2e10, src="socket0", dst="switch:0000:01:00.0"),
    ),
    memory=(
        MemoryCapacity(0, 17910130243.7, "numpy-copy", "stream-copy", 1 << 28, 5, 2),
        MemoryCapacity(None, 1e10),
    ),
    pcie_efficiency=PcieEfficiency(0.83, derived_from="median over 4 GPUs"),
    host="vm", date="2026-11-22T00:36:34+00:00", tool="moment 0.1.0",
    notes=("host↔GPU: not measured: no CUDA device",),
)


# -- format ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_round_trip(fmt):
    text = dump_capacities(FULL, fmt)
    back = parse_capacities(text, f"caps.{fmt}")
    assert to_dict(back) == to_dict(FULL)
    assert back.devices[0].read.read_iops == 76039.8
    assert back.devices[0].others[0].tool == "moment-posix"
    assert back.memory[1].numa_node is None
    assert back.links[0].link_class == "host-to-device" and back.links[0].device == "0000:04:00.0"
    assert back.source == f"caps.{fmt}"
    # lines point into the file
    lines = text.split("\n")
    assert "pci:0000:00:02.0" in lines[back.devices[0].line - 1]


def test_save_and_load(tmp_path):
    out = save_capacities(FULL, tmp_path / "caps.yaml")
    assert load_capacities(out).devices[1].key == "Intel P5510 3.84 TB"
    assert [p.name for p in tmp_path.iterdir()] == ["caps.yaml"]  # no temporary left behind
    js = save_capacities(FULL, tmp_path / "caps.json")
    assert json.loads(js.read_text())["schema"] == "moment.capacities"
    assert to_dict(load_capacities(js)) == to_dict(FULL)
    with pytest.raises(PlannerError, match="no directory"):
        save_capacities(FULL, tmp_path / "missing" / "caps.yaml")


def test_units_and_derived_figures():
    caps = parse_capacities(HEAD + """
date: 2026-11-22T00:36:34Z
devices:
  0000:01:00.0: {read_iops: 1000, block_bytes: 4 KiB}
  "Samsung  PM9A3": {read_bytes_per_s: 6.5 GB/s, file_bytes: 1 GiB, mode: buffered}
links:
  - {class: inter-socket, bytes_per_s: 100 Gb/s}
memory:
  all: {bytes_per_s: 20 GiB/s}
pcie_efficiency: 0.9
""", "u.yaml")
    assert caps.date.startswith("2026-11-22T00:36:34")  # an unquoted YAML time stays text
    assert caps.devices[0].key == "0000:01:00.0"  # not a YAML 1.1 sexagesimal number
    assert caps.devices[0].read_bytes_per_s == 1000 * 4096
    assert caps.devices[1].read.file_bytes == 2**30 and caps.devices[1].read.mode == "buffered"
    assert caps.links[0].bytes_per_s == 12.5e9
    assert caps.memory[0].numa_node is None and caps.memory[0].bytes_per_s == 20 * 2**30
    assert caps.pcie_efficiency.value == 0.9


def test_docs_example_parses():
    doc = REPO / "docs" / "capacities.md"
    block = re.search(r"```yaml\n(.*?)```", doc.read_text(), re.S).group(1)
    caps = parse_capacities(block, str(doc))
    assert len(caps.devices) == 2 and len(caps.links) == 5 and len(caps.memory) == 2
    assert caps.devices[0].others[0].tool == "moment-posix"


@pytest.mark.parametrize(("text", "line", "needle"), [
    ("", None, "an empty file"),
    ("# only a comment\n", None, "an empty file"),
    ("- a\n- b\n", 1, "a capacities file"),
    ("schema: moment.machine\nversion: 1\n", 1, "schema: moment.capacities"),
    ("version: 1\n", 1, "'schema:'"),
    ("schema: moment.capacities\nversion: 2\n", 2, "version 1"),
    (HEAD + "devises: {}\n", 3, "did you mean 'devices'"),
    (HEAD + "devices:\n  x: {tool: fio}\n", 4, "'read_bytes_per_s:'"),
    (HEAD + "devices:\n  x: {read_bytes_per_s: -5}\n", 4, "read rate"),
    (HEAD + "devices:\n  x:\n    read_bytes_per_s: 1e9\n    mode: odirect\n", 6, "one of direct, buffered"),
    (HEAD + "devices:\n  x:\n    read_bytes_per_s: 1e9\n    queue_depth: 0\n", 6, "queue depth"),
    (HEAD + "devices:\n  x:\n    read_bytes_per_s: 1e9\n    block_bytes: 4.5\n", 6, "whole number"),
    (HEAD + "devices:\n  x:\n    read_bytes_per_s: 1e9\n    other_measurements: [{tool: a}]\n", 6,
     "read_bytes_per_s"),
    (HEAD + "devices:\n  x: {read_bytes_per_s: 1e9}\n  x: {read_bytes_per_s: 2e9}\n", 5, "each key once"),
    (HEAD + "links:\n  - {src: a, bytes_per_s: 1e9}\n", 4, "both 'src:' and 'dst:'"),
    (HEAD + "links:\n  - {bytes_per_s: 1e9}\n", 4, "'class:'"),
    (HEAD + "links:\n  - {class: peer-to-peer, bytes_per_s: 1e9}\n", 4, "the two GPUs"),
    (HEAD + "links:\n  - {class: inter-socket, device: a, bytes_per_s: 1e9}\n", 4, "'device:' only"),
    (HEAD + "links:\n  - {class: host-to-device, src: a, dst: b, bytes_per_s: 1e9}\n", 4, "name the GPU"),
    (HEAD + "links:\n  - {class: pcie, bytes_per_s: 1e9}\n", 4, "a link class"),
    (HEAD + "links:\n  - {src: a, dst: a, bytes_per_s: 1e9}\n", 4, "two different ends"),
    (HEAD + "links:\n  - {src: a, dst: b}\n", 4, "'bytes_per_s:'"),
    (HEAD + "memory:\n  zero: {bytes_per_s: 1e9}\n", 4, "NUMA node number"),
    (HEAD + "memory:\n  0: {bytes_per_s: fast}\n", 4, "memory bandwidth"),
    (HEAD + "pcie_efficiency: 1.5\n", 3, "(0, 1]"),
    (HEAD + "pcie_efficiency: {derived_from: x}\n", 3, "'value:'"),
    (HEAD + "devices: [1, 2]\n", 3, "devices"),
    (HEAD + "notes: x\n", 3, "a list of notes"),
    (HEAD + "devices:\n  x: {read_bytes_per_s: 1e9\n", 5, "valid YAML"),
])
def test_bad_files(text, line, needle):
    with pytest.raises(ParseError) as err:
        parse_capacities(text, "bad.yaml")
    assert err.value.source == "bad.yaml"
    assert err.value.line == line
    assert needle in str(err.value)


def test_bad_file_on_disk(tmp_path):
    p = tmp_path / "caps.yaml"
    p.write_bytes(b"schema: moment.capacities\n\x00\x01")
    with pytest.raises(ParseError) as err:
        load_capacities(p)
    assert err.value.source == str(p) and err.value.line == 2
    p.write_text(HEAD + "memory:\n  0: {bytes_per_s: 1 GB/s, treads: 4}\n")
    with pytest.raises(ParseError, match=r"caps.yaml:4: .*did you mean 'threads'"):
        load_capacities(p)


def _mutations(text: str):
    lines = text.split("\n")
    return st.one_of(
        st.integers(0, len(lines) - 1).map(lambda i: "\n".join(lines[:i] + lines[i + 1:])),
        st.integers(0, len(lines) - 1).map(lambda i: "\n".join(lines[:i] + [lines[i]] + lines[i:])),
        st.integers(0, len(text)).map(lambda i: text[:i]),
        st.tuples(st.integers(0, len(text) - 1), st.characters()).map(
            lambda t: text[:t[0]] + t[1] + text[t[0] + 1:]),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_files_raise_only_parse_error(data):
    text = data.draw(st.one_of(_mutations(dump_capacities(FULL)), _mutations(dump_capacities(FULL, "json")),
                               st.text(max_size=300)))
    try:
        caps = parse_capacities(text, "m.yaml")
    except ParseError as exc:
        assert exc.source == "m.yaml"
    else:
        assert isinstance(caps, Capacities)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_parse_error(tmp_path_factory, blob):
    p = tmp_path_factory.mktemp("caps") / "c.yaml"
    p.write_bytes(blob)
    with contextlib.suppress(ParseError):
        load_capacities(p)


# -- sizes -------------------------------------------------------------------


@pytest.mark.parametrize(("text", "n"), [("4096", 4096), ("4KiB", 4096), ("4 kib", 4096), ("4k", 4096),
                                         ("1GiB", 2**30), ("1G", 2**30), ("1GB", 10**9),
                                         ("64MiB", 2**26), ("0.5KiB", 512), ("512B", 512)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "0", "-4KiB", "4 parsecs", "1.5", "KiB", "4 KiB/s", "nan"])
def test_parse_size_rejects(text):
    with pytest.raises(MomentError):  # a SizeError, from momentbase.units
        parse_size(text)


def test_format_size():
    assert [format_size(x) for x in (512, 4096, 3 << 20, 1 << 30)] == ["512 B", "4 KiB", "3 MiB", "1 GiB"]


# -- applying ----------------------------------------------------------------


def _toy() -> Topology:
    t = Topology("toy")
    for n in (Node("socket0", NodeKind.SOCKET, numa_node=0), Node("socket1", NodeKind.SOCKET, numa_node=1),
              Node("mem0", NodeKind.MEMORY, numa_node=0), Node("mem1", NodeKind.MEMORY, numa_node=1),
              Node("switch:0000:01:00.0", NodeKind.SWITCH, "switch 0", bus_address="0000:01:00.0"),
              Node("pci:0000:02:00.0", NodeKind.GPU, "A100", bus_address="0000:02:00.0",
                   attrs={"model": "A100"}),
              Node("pci:0000:03:00.0", NodeKind.GPU, "A100", bus_address="0000:03:00.0",
                   attrs={"model": "A100"}),
              Node("pci:0000:04:00.0", NodeKind.NVME, "Intel P5510 3.84 TB", bus_address="0000:04:00.0",
                   attrs={"model": "Intel P5510 3.84 TB", "functions": ["0000:04:00.0"]}),
              Node("pci:0000:05:00.0", NodeKind.NVME, "Intel P5510 3.84 TB", bus_address="0000:05:00.0",
                   attrs={"model": "Intel P5510 3.84 TB"})):
        t.add_node(n)
    t.add_link(Link("socket0", "mem0", LinkKind.MEMORY, 1e11, bandwidth_source="default"))
    t.add_link(Link("socket1", "mem1", LinkKind.MEMORY, 1e11, bandwidth_source="default"))
    t.add_link(Link("socket0", "socket1", LinkKind.INTER_SOCKET, 2e10, bandwidth_source="spec"))
    t.add_link(Link.pcie("socket0", "switch:0000:01:00.0", gen=4, lanes=16))
    t.add_link(Link.pcie("switch:0000:01:00.0", "pci:0000:02:00.0", gen=4, lanes=16))
    t.add_link(Link.pcie("switch:0000:01:00.0", "pci:0000:03:00.0", gen=4, lanes=16))
    t.add_link(Link("socket1", "pci:0000:04:00.0", LinkKind.PCIE, 7e9, 4, 4, "spec"))
    t.add_link(Link.pcie("socket1", "pci:0000:05:00.0", gen=4, lanes=4))
    return t


def test_apply_on_hand_made_topology():
    topo = _toy()
    caps = Capacities(
        devices=(DeviceCapacity("Intel P5510 3.84 TB", ReadMeasurement(2e9, 488281.25, 4096, tool="fio-io_uring")),
                 DeviceCapacity("05:00.0", ReadMeasurement(3e9, 732421.875, 4096, 64, "moment-posix"))),
        links=(LinkCapacity(2.2e10, link_class="host-to-device", device="pci:0000:02:00.0"),
               LinkCapacity(2.1e10, link_class="device-to-host", device="0000:02:00.0"),
               LinkCapacity(1.9e10, link_class="host-to-device"),
               LinkCapacity(3.5e10, link_class="inter-socket"),
               LinkCapacity(2.4e10, src="socket0", dst="0000:01:00.0")),
        memory=(MemoryCapacity(0, 4e10, "numpy-copy"), MemoryCapacity(None, 3e10)),
        pcie_efficiency=PcieEfficiency(0.9), source="caps.yaml",
    )
    result = apply_capacities_report(topo, caps)
    assert isinstance(result, AppliedCapacities)
    new = result.topology
    # the input topology is left as it was
    assert topo.link_between("socket0", "mem0").bytes_per_s == 1e11
    assert "read_bytes_per_s" not in topo.node("pci:0000:04:00.0").attrs

    gpu0 = new.link_between("switch:0000:01:00.0", "pci:0000:02:00.0")
    assert gpu0.bytes_per_s == 2.1e10 and gpu0.bandwidth_source == "measured"  # lower direction
    assert gpu0.attrs["measured_directions"] == {
        "switch:0000:01:00.0→pci:0000:02:00.0": 2.2e10, "pci:0000:02:00.0→switch:0000:01:00.0": 2.1e10}
    assert gpu0.attrs["table_bytes_per_s"] == pytest.approx(pcie_bytes_per_s(4, 16, 0.9))
    gpu1 = new.link_between("switch:0000:01:00.0", "pci:0000:03:00.0")
    assert gpu1.bytes_per_s == 1.9e10  # the class-wide figure: no figure of its own
    uplink = new.link_between("socket0", "switch:0000:01:00.0")
    assert uplink.bytes_per_s == 2.4e10 and uplink.bandwidth_source == "measured"
    assert new.link_between("socket0", "socket1").bytes_per_s == 3.5e10
    assert new.link_between("socket0", "mem0").bytes_per_s == 4e10
    assert new.link_between("socket1", "mem1").bytes_per_s == 3e10  # from "all"
    assert new.link_between("socket0", "mem0").bandwidth_source == "measured"

    # efficiency: table links recomputed, spec links untouched
    ssd1 = new.link_between("socket1", "pci:0000:05:00.0")
    assert ssd1.bytes_per_s == pytest.approx(pcie_bytes_per_s(4, 4, 0.9))
    assert ssd1.bandwidth_source == "pcie" and ssd1.attrs["efficiency_source"] == "measured"
    assert new.link_between("socket1", "pci:0000:04:00.0").bytes_per_s == 7e9

    # devices: the model entry for both SSDs, the address entry wins for 05:00.0
    a, b = new.node("pci:0000:04:00.0").attrs, new.node("pci:0000:05:00.0").attrs
    assert a["read_bytes_per_s"] == 2e9 and a["read_measurement"]["tool"] == "fio-io_uring"
    assert b["read_bytes_per_s"] == 3e9 and b["read_iops"] == 732421.875 and b["read_block_bytes"] == 4096
    assert b["read_measurement"]["entry"] == "05:00.0" and b["read_source"] == "measured"

    elements = {(r.element, r.field) for r in result.replaced}
    assert ("pci:0000:04:00.0", "read_bytes_per_s") in elements
    assert ("socket1→mem1", "bytes_per_s") in elements
    assert ("switch:0000:01:00.0→pci:0000:02:00.0", "bytes_per_s") in elements
    assert result.unused == ()
    assert any("measured" in n for n in new.notes)
    figures = measured_figures(new)
    assert ("pci:0000:05:00.0", "read_bytes_per_s", "measured") in figures
    assert ("socket1→pci:0000:05:00.0", "bytes_per_s", "measured efficiency") in figures
    assert ("socket0→mem0", "bytes_per_s", "measured") in figures
    # the plain form returns the same topology
    plain = apply_capacities(topo, caps)
    assert isinstance(plain, Topology) and measured_figures(plain) == figures
    json.dumps([dict(n.attrs) for n in new.nodes()])  # attrs stay JSON-serialisable


def test_apply_reports_what_matched_nothing():
    caps = Capacities(
        devices=(DeviceCapacity("block:loop0", ReadMeasurement(1e9)),),
        links=(LinkCapacity(1e11, src="pci:0000:02:00.0", dst="pci:0000:03:00.0", link_class="peer-to-peer"),
               LinkCapacity(1e10, src="socket0", dst="pci:0000:02:00.0"),
               LinkCapacity(1e10, link_class="host-to-device", device="0000:99:00.0")),
        memory=(MemoryCapacity(7, 1e10),), source="c.yaml",
    )
    new, replaced, unused = apply_capacities_report(_toy(), caps)
    assert replaced == ()
    assert len(unused) == 5
    assert any("no direct NVLink link" in u for u in unused)
    assert any("no link joins them" in u for u in unused)
    assert any("0000:99:00.0" in u for u in unused)
    assert any(u.startswith("memory[7]") for u in unused)
    assert any(u.startswith("devices[block:loop0]") for u in unused)
    assert sum("not applied" in n for n in new.notes) == 5


def test_apply_peer_to_peer_on_nvlink():
    t = _toy()
    t.add_link(Link("pci:0000:02:00.0", "pci:0000:03:00.0", LinkKind.NVLINK, 3e11, bandwidth_source="spec"))
    caps = Capacities(links=(LinkCapacity(2.5e11, src="0000:02:00.0", dst="0000:03:00.0",
                                          link_class="peer-to-peer"),))
    new, replaced, unused = apply_capacities_report(t, caps)
    assert new.link_between("pci:0000:02:00.0", "pci:0000:03:00.0").bytes_per_s == 2.5e11
    assert unused == ()


def test_apply_on_machine_b():
    topo = load_machine("moment-b")
    caps = Capacities(memory=(MemoryCapacity(0, 1.5e11), MemoryCapacity(1, 1.4e11)),
                      links=(LinkCapacity(1.8e10, link_class="inter-socket"),),
                      pcie_efficiency=PcieEfficiency(0.85), source="b.yaml")
    new, replaced, unused = apply_capacities_report(topo, caps)
    assert unused == ()
    assert new.link_between("socket0", "mem0").bytes_per_s == 1.5e11
    assert new.link_between("socket1", "mem1").bytes_per_s == 1.4e11
    assert new.link_between("socket0", "mem0").attrs["table_bytes_per_s"] == 307.2e9
    assert new.link_between("socket0", "socket1").bandwidth_source == "measured"
    # the 8 front bays are table links (gen 4 x4): recomputed; the spec's 20 GiB/s links are not
    bays = [lk for lk in new.links(LinkKind.PCIE) if lk.dst.startswith("slot:b1-bay")]
    assert len(bays) == 8
    assert all(lk.bytes_per_s == pytest.approx(pcie_bytes_per_s(4, 4, 0.85)) for lk in bays)
    spec_links = [lk for lk in new.links(LinkKind.PCIE) if lk.bandwidth_source == "spec"]
    assert spec_links and all(lk.bytes_per_s == 20 * 2**30 for lk in spec_links)
    assert {r.entry for r in replaced} == {"memory[0]", "memory[1]", "links[0]", "pcie_efficiency"}
    assert sum(r.entry == "pcie_efficiency" for r in replaced) == 8


def test_inventory_figures_of_machine_b():
    items = spec_inventory("moment-b")
    caps = Capacities(devices=(DeviceCapacity("intel p5510 3.84 TB",
                                              ReadMeasurement(2.8e9, 683593.75, 4096, tool="fio-io_uring")),))
    new = apply_to_inventory(items, caps)
    ssd = next(i for i in new if i.kind == NodeKind.NVME)
    gpu = next(i for i in new if i.kind == NodeKind.GPU)
    assert ssd.attrs["read_bytes_per_s"] == 2.8e9 and ssd.attrs["random_read_iops"] == 683593.75
    assert ssd.attrs["measured_fields"] == ["read_bytes_per_s", "random_read_iops"]
    assert "random_read_iops" not in ssd.attrs.get("inferred_fields", [])
    assert gpu == next(i for i in items if i.kind == NodeKind.GPU)
    assert find_device(caps, "Intel P5510 3.84 TB") is caps.devices[0]


def test_inventory_device_models():
    from planner.inventory import device_model

    caps = Capacities(devices=(DeviceCapacity("p5510", ReadMeasurement(2.8e9, 683593.75, 4096,
                                                                        tool="fio-io_uring")),
                               DeviceCapacity("Samsung 980 PRO", ReadMeasurement(5e9, 40000.0, 131072))))
    p5510, pro, a100 = apply_to_inventory(
        [device_model("p5510"), device_model("980pro"), device_model("a100")], caps)
    assert (p5510.read_bytes_per_s, p5510.read_iops, p5510.source) == (2.8e9, 683593.75, "measured (fio-io_uring)")
    # matched by title; measured at 128 KiB, so its 4 KiB IOPS figure stays
    assert pro.read_bytes_per_s == 5e9 and pro.read_iops == device_model("980pro").read_iops
    assert a100 == device_model("a100")


def test_apply_on_a_real_capture():
    from planner.topology.discover import topology_from_files

    lspci = topology_fixture("hpe-cray-xd665-2x-epyc9354-h100", "lspci-vvnn.txt")
    dmi = topology_fixture("hpe-cray-xd665-2x-epyc9354-h100", "dmidecode.txt")
    topo = topology_from_files(lspci_vvv=[lspci], dmidecode=dmi)
    caps = Capacities(
        devices=(DeviceCapacity("Micron Technology Inc 7450 PRO NVMe SSD",
                                ReadMeasurement(3.2e9, 781250.0, 4096, 64, "fio-io_uring")),),
        links=(LinkCapacity(5.3e10, link_class="host-to-device", device="0000:04:00.0"),
               LinkCapacity(4.9e10, link_class="host-to-device")),
    )
    new, replaced, unused = apply_capacities_report(topo, caps)
    assert unused == ()
    micron = [n for n in new.nodes(NodeKind.NVME) if "7450" in n.name]
    assert len(micron) == 2 and all(n.attrs["read_bytes_per_s"] == 3.2e9 for n in micron)
    marvell = new.node("pci:0000:c1:00.0")
    assert "read_bytes_per_s" not in marvell.attrs
    gpu_links = {g.id: new.link_between(new.parent(g.id).id, g.id) for g in new.nodes(NodeKind.GPU)}
    assert len(gpu_links) == 4
    assert gpu_links["pci:0000:04:00.0"].bytes_per_s == 5.3e10
    assert {lk.bytes_per_s for gid, lk in gpu_links.items() if gid != "pci:0000:04:00.0"} == {4.9e10}
    assert all(lk.bandwidth_source == "measured" for lk in gpu_links.values())
    assert len(replaced) == 6


def test_measured_file_applies_to_the_topology_it_came_from(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(HEAD + "devices:\n  pci:0000:04:00.0: {read_iops: 5e5, block_bytes: 4096}\n")
    new, replaced, _ = apply_capacities_report(_toy(), load_capacities(p))
    assert new.node("pci:0000:04:00.0").attrs["read_bytes_per_s"] == 5e5 * 4096
    assert str(p) in new.notes[-1]


def test_loading_missing_file_names_it():
    with pytest.raises(ParseError, match="no such file"):
        load_capacities(Path("/nonexistent/caps.yaml"))
