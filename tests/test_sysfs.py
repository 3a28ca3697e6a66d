"""sysfs: a fake tree built in tmp_path, the live /sys of this machine, and the attribute parsers."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import ParseError
from planner.topology.model import LinkKind, NodeKind
from planner.topology.sysfs import (
    numa_to_package,
    parse_bus_number,
    parse_class,
    parse_cpulist,
    parse_id,
    parse_link_speed,
    parse_link_width,
    parse_numa_node,
    parse_pci_ids,
    parse_pcie_capability,
    read_sysfs,
    topology_from_sysfs,
)

PORT_TYPE = {"endpoint": 0, "root": 4, "upstream": 5, "downstream": 6}


def config_space(port_type: str | None, gen: int = 4, lanes: int = 16, slot: bool = False,
                 bridge: bool = False, secondary: int = 0, subordinate: int = 0) -> bytes:
    """256 bytes of config space with a PCI Express capability at 0x40."""
    cfg = bytearray(256)
    cfg[0x0E] = 1 if bridge else 0
    if bridge:
        cfg[0x19], cfg[0x1A] = secondary, subordinate
    if port_type is None:
        return bytes(cfg)
    cfg[6] = 0x10  # capabilities list
    cfg[0x34] = 0x40
    cfg[0x40] = 0x01  # power management first, to walk the list
    cfg[0x41] = 0x60
    flags = 0x2 | PORT_TYPE[port_type] << 4 | (0x100 if slot else 0)
    cfg[0x60:0x64] = bytes([0x10, 0x00, flags & 0xFF, flags >> 8])
    lnk = gen | lanes << 4
    cfg[0x6C:0x6E] = lnk.to_bytes(2, "little")
    cfg[0x72:0x74] = lnk.to_bytes(2, "little")
    return bytes(cfg)


class FakeSys:
    """A sysfs tree: /devices/pciDDDD:BB/... directories, /bus/pci/devices symlinks, slots, NUMA."""

    def __init__(self, root: Path):
        self.root = root
        (root / "bus" / "pci" / "devices").mkdir(parents=True)
        (root / "bus" / "pci" / "slots").mkdir(parents=True)

    def device(self, chain: list[str], cls: str, vendor: str, device: str, *, numa: int = -1,
               speed: str | None = None, width: str | None = None, cur_speed: str | None = None,
               cur_width: str | None = None, secondary: int | None = None, subordinate: int | None = None,
               config: bytes | None = None, driver: str | None = None) -> Path:
        addr = chain[-1]
        path = self.root / "devices" / f"pci{addr[:7]}"
        for part in chain:
            path = path / part
        path.mkdir(parents=True)
        files = {"class": cls, "vendor": vendor, "device": device, "numa_node": str(numa),
                 "max_link_speed": speed, "max_link_width": width,
                 "current_link_speed": cur_speed or speed, "current_link_width": cur_width or width,
                 "secondary_bus_number": secondary, "subordinate_bus_number": subordinate}
        for name, value in files.items():
            if value is not None:
                (path / name).write_text(f"{value}\n")
        if config is not None:
            (path / "config").write_bytes(config)
        if driver:
            drv = self.root / "bus" / "pci" / "drivers" / driver
            drv.mkdir(parents=True, exist_ok=True)
            (path / "driver").symlink_to(os.path.relpath(drv, path))
        link = self.root / "bus" / "pci" / "devices" / addr
        link.symlink_to(os.path.relpath(path, link.parent))
        return path

    def slot(self, name: str, address: str) -> None:
        d = self.root / "bus" / "pci" / "slots" / name
        d.mkdir()
        (d / "address").write_text(address + "\n")

    def numa(self, node: int, cpus: str, package: int) -> None:
        d = self.root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        first = int(cpus.split("-")[0].split(",")[0])
        t = self.root / "devices" / "system" / "cpu" / f"cpu{first}" / "topology"
        t.mkdir(parents=True)
        (t / "physical_package_id").write_text(f"{package}\n")


RP0, USP, DSP0, DSP1, GPU, GPU_AUDIO = ("0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0",
                                        "0000:03:00.0", "0000:03:00.1")
RP1, NVME, HOST0 = "0000:80:01.0", "0000:81:00.0", "0000:00:00.0"


@pytest.fixture
def fake(tmp_path: Path) -> FakeSys:
    """Socket 0: root port → switch (USP + 2 DSPs) → A100 (+ a second function); socket 1: root port → slot 3 → NVMe."""
    fs = FakeSys(tmp_path / "sys")
    fs.device([HOST0], "0x060000", "0x1022", "0x1480", numa=0)  # host bridge, dropped as platform
    fs.device([RP0], "0x060400", "0x1022", "0x1483", numa=0, speed="16.0 GT/s PCIe", width="16",
              secondary=1, subordinate=4, config=config_space("root", bridge=True, secondary=1, subordinate=4))
    fs.device([RP0, USP], "0x060400", "0x1000", "0xc010", numa=0, speed="16.0 GT/s PCIe", width="16",
              secondary=2, subordinate=4, config=config_space("upstream", bridge=True))
    fs.device([RP0, USP, DSP0], "0x060400", "0x1000", "0xc010", numa=0, speed="16.0 GT/s PCIe", width="16",
              secondary=3, subordinate=3, config=config_space("downstream", bridge=True))
    fs.device([RP0, USP, DSP1], "0x060400", "0x1000", "0xc010", numa=0, speed="16.0 GT/s PCIe", width="16",
              secondary=4, subordinate=4, config=config_space("downstream", bridge=True))
    fs.device([RP0, USP, DSP0, GPU], "0x030200", "0x10de", "0x20b0", numa=0, speed="16.0 GT/s PCIe", width="16",
              cur_speed="2.5 GT/s PCIe", config=config_space("endpoint"), driver="nvidia")
    fs.device([RP0, USP, DSP0, GPU_AUDIO], "0x040300", "0x10de", "0x1aef", numa=0, speed="16.0 GT/s PCIe",
              width="16")
    fs.device([RP1], "0x060400", "0x1022", "0x1483", numa=1, speed="8.0 GT/s PCIe", width="4",
              secondary=0x81, subordinate=0x81,
              config=config_space("root", gen=3, lanes=4, slot=True, bridge=True, secondary=0x81, subordinate=0x81))
    fs.device([RP1, NVME], "0x010802", "0x144d", "0xa80a", numa=1, speed="8.0 GT/s PCIe", width="4",
              config=config_space("endpoint", gen=3, lanes=4), driver="nvme")
    fs.slot("3", "0000:81:00")
    fs.numa(0, "0-3", 0)
    fs.numa(1, "4-7", 1)
    return fs


# -- the fake tree ---------------------------------------------------------------------

def test_read_sysfs_functions(fake):
    fns = {f.address: f for f in read_sysfs(fake.root, pci_ids="/nonexistent")}
    assert set(fns) == {HOST0, RP0, USP, DSP0, DSP1, GPU, GPU_AUDIO, RP1, NVME}
    assert fns[RP0].parent is None and fns[USP].parent == RP0 and fns[GPU].parent == DSP0
    assert fns[NVME].parent == RP1
    assert (fns[RP0].port_type, fns[USP].port_type, fns[DSP1].port_type) == ("root", "upstream", "downstream")
    assert fns[USP].is_bridge and (fns[USP].secondary_bus, fns[USP].subordinate_bus) == (2, 4)
    g = fns[GPU]
    assert (g.class_code, g.vendor_id, g.device_id) == ("0302", "10de", "20b0")
    assert g.link_cap == (4, 16) and g.link_sta == (1, 16) and g.numa_node == 0
    assert g.attrs["driver"] == "nvidia" and g.name == "Device 10de:20b0"
    assert fns[NVME].link_cap == (3, 4) and fns[NVME].slot == "3" and fns[RP1].slot == "3"
    assert fns[RP1].attrs["slot_implemented"] is True


def test_topology_structure(fake):
    t = topology_from_sysfs(fake.root, pci_ids="/nonexistent")
    counts = t.counts()
    assert (counts["socket"], counts["memory"], counts["switch"], counts["gpu"], counts["nvme"]) == (2, 2, 1, 1, 1)
    sw = t.parent("pci:" + GPU)
    assert sw.kind == NodeKind.SWITCH and sw.id == "switch:" + USP
    assert sw.attrs["ports"] == [USP, DSP0, DSP1]
    assert t.parent(sw.id).id == "socket0"
    gpu = t.node("pci:" + GPU)
    assert gpu.attrs["functions"] == [GPU, GPU_AUDIO]  # the audio function is not a second device
    up = t.link_between(sw.id, gpu.id)
    assert (up.pcie_gen, up.lanes, up.attrs["current_gen"]) == (4, 16, 1)
    slot = t.parent("pci:" + NVME)
    assert slot.kind == NodeKind.SLOT and slot.attrs["designation"] == "3" and slot.attrs["in_use"]
    assert t.socket_of("pci:" + NVME).id == "socket1"
    assert t.link_between("socket0", "socket1").kind == LinkKind.INTER_SOCKET
    assert t.name == f"sysfs:{fake.root}" and t.sources == [str(fake.root)]


def test_pci_ids_names(fake, tmp_path):
    ids = tmp_path / "pci.ids"
    ids.write_text("# comment\n10de  NVIDIA Corporation\n\t20b0  GA100 [A100 SXM4 40GB]\n"
                   "\t\t10de 134f  A100-SXM4-40GB\n144d  Samsung Electronics Co Ltd\n"
                   "C 01  Mass storage controller\n")
    fns = {f.address: f for f in read_sysfs(fake.root, pci_ids=ids)}
    assert fns[GPU].name == "NVIDIA Corporation GA100 [A100 SXM4 40GB]"
    assert fns[NVME].name == "Samsung Electronics Co Ltd Device a80a"
    assert fns[RP0].name == "Device 1022:1483"


def test_nps_nodes_share_a_socket(tmp_path):
    fs = FakeSys(tmp_path / "sys")
    fs.device(["0000:00:01.1"], "0x060400", "0x1022", "0x14ab", numa=0, secondary=1, subordinate=1)
    fs.device(["0000:00:01.1", "0000:01:00.0"], "0x010802", "0x144d", "0xa80a", numa=0)
    fs.device(["0000:40:01.1"], "0x060400", "0x1022", "0x14ab", numa=1, secondary=0x41, subordinate=0x41)
    fs.device(["0000:40:01.1", "0000:41:00.0"], "0x030200", "0x10de", "0x2330", numa=1)
    for node in range(4):  # NPS4 on one package, plus a second package without PCI devices
        fs.numa(node, f"{node * 8}-{node * 8 + 7}", 0)
    fs.numa(4, "32-39", 1)
    assert numa_to_package(fs.root) == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1}
    t = topology_from_sysfs(fs.root, pci_ids="/nonexistent")
    assert t.socket_of("pci:0000:01:00.0").id == t.socket_of("pci:0000:41:00.0").id == "socket0"
    assert t.node("socket0").attrs["numa_nodes"] == [0, 1]
    assert "socket1" in t and "mem1" in t and t.link_between("socket0", "socket1") is not None


def test_single_node_machine_puts_unknown_numa_on_it(tmp_path):
    fs = FakeSys(tmp_path / "sys")
    fs.device(["0000:00:03.0"], "0x020000", "0x1af4", "0x1041")  # numa_node -1, as in a VM
    fs.numa(0, "0-1", 0)
    t = topology_from_sysfs(fs.root, pci_ids="/nonexistent")
    assert t.socket_of("pci:0000:00:03.0").id == "socket0"
    assert t.node("pci:0000:00:03.0").attrs["numa_inferred"] is True
    assert any("no NUMA node" in n for n in t.notes)


def test_unknown_numa_on_a_multi_node_machine_goes_to_socket_unknown(tmp_path):
    fs = FakeSys(tmp_path / "sys")
    fs.device(["0000:00:03.0"], "0x020000", "0x8086", "0x1533")
    fs.numa(0, "0-1", 0)
    fs.numa(1, "2-3", 1)
    t = topology_from_sysfs(fs.root, pci_ids="/nonexistent")
    assert t.socket_of("pci:0000:00:03.0").id == "socket?"
    assert {"socket0", "socket1"} <= {s.id for s in t.nodes(NodeKind.SOCKET)}


def test_virtual_functions_are_left_out(fake):
    pf = fake.root / "bus" / "pci" / "devices" / NVME
    vf = fake.device([RP1, "0000:81:00.2"], "0x010802", "0x144d", "0xa80a", numa=1)
    (vf / "physfn").symlink_to(os.path.relpath(pf.resolve(), vf))
    (pf.resolve() / "virtfn0").symlink_to(os.path.relpath(vf, pf.resolve()))
    fns = {f.address: f for f in read_sysfs(fake.root, pci_ids="/nonexistent")}
    assert "0000:81:00.2" not in fns and fns[NVME].attrs["virtual_functions"] == 1


# -- unreadable and garbled files -------------------------------------------------------

def _dev(fake: FakeSys, addr: str) -> Path:
    return (fake.root / "bus" / "pci" / "devices" / addr).resolve()


def test_unreadable_attributes_are_skipped(fake):
    gpu = _dev(fake, GPU)
    (gpu / "numa_node").unlink()
    (gpu / "numa_node").mkdir()  # reading a directory fails with an OSError, as EIO or EACCES would
    (gpu / "max_link_speed").unlink()
    (gpu / "max_link_speed").symlink_to("max_link_speed")  # a symlink loop
    (gpu / "config").write_bytes(b"\xff" * 64)  # what a non-root user reads: no capability list
    fns = {f.address: f for f in read_sysfs(fake.root, pci_ids="/nonexistent")}
    g = fns[GPU]
    assert g.numa_node is None and g.port_type is None
    assert g.link_cap is None and g.link_sta == (1, 16)
    topology_from_sysfs(fake.root, pci_ids="/nonexistent")  # still builds


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("class", "banana\n", "PCI class"),
        ("vendor", "0x10de0\n", "16-bit id"),
        ("max_link_speed", "fast\n", "link speed"),
        ("current_link_width", "x16\n", "link width"),
        ("numa_node", "zero\n", "NUMA node"),
        ("secondary_bus_number", "300\n", "bus number"),
        ("class", b"\x00\x01\x02", "text attribute"),
        ("device", b"0x\xff\xfe", "ASCII"),
    ],
)
def test_garbled_attributes_raise_parse_error_with_path(fake, name, content, expected):
    target = _dev(fake, USP) / name
    if isinstance(content, bytes):
        target.write_bytes(content)
    else:
        target.write_text(content)
    with pytest.raises(ParseError) as info:
        topology_from_sysfs(fake.root, pci_ids="/nonexistent")
    assert info.value.source == str(fake.root / "bus" / "pci" / "devices" / USP / name)
    assert info.value.line == 1 and expected in info.value.expected


def test_garbled_slot_address(fake):
    fake.slot("9", "not-an-address")
    with pytest.raises(ParseError, match="slot address"):
        read_sysfs(fake.root, pci_ids="/nonexistent")


def test_missing_tree(tmp_path):
    with pytest.raises(ParseError, match="bus/pci/devices"):
        read_sysfs(tmp_path / "nothing")


def test_empty_tree_still_has_a_socket(tmp_path):
    fs = FakeSys(tmp_path / "sys")
    t = topology_from_sysfs(fs.root, pci_ids="/nonexistent")
    assert t.counts()["socket"] >= 1 and t.counts()["memory"] >= 1


# -- the live machine ------------------------------------------------------------------

@pytest.mark.skipif(not Path("/sys/bus/pci/devices").is_dir(), reason="no sysfs PCI tree here")
def test_live_sysfs():
    fns = read_sysfs("/sys")
    assert fns and all(f.class_code and f.vendor_id for f in fns)
    t = topology_from_sysfs("/sys")
    counts = t.counts()
    assert counts["socket"] >= 1 and counts["memory"] >= 1
    for n in t.nodes():
        if n.kind not in (NodeKind.SOCKET, NodeKind.MEMORY):
            assert t.socket_of(n.id) is not None


# -- attribute parsers -------------------------------------------------------------------

def test_attribute_parsers_on_real_values():
    assert parse_class("0xffff00\n", "c") == "ffff"
    assert parse_id("0x1AF4\n", "v") == "1af4"
    assert [parse_link_speed(s, "s") for s in ("2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe",
                                               "16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe",
                                               "8 GT/s", "Unknown", "Unknown speed", "3.0 GT/s")] == [
        1, 2, 3, 4, 5, 6, 3, None, None, None]
    assert [parse_link_width(s, "w") for s in ("16", "4", "0", "63")] == [16, 4, None, None]
    assert parse_numa_node("-1\n", "n") is None and parse_numa_node("3\n", "n") == 3
    assert parse_bus_number("129\n", "b") == 129
    assert parse_cpulist("", "c") == () and parse_cpulist("0-1,4", "c") == (0, 1, 4)
    with pytest.raises(ParseError):
        parse_cpulist("3-1", "c")


def test_pcie_capability_in_64_bytes_is_out_of_reach():
    full = config_space("root", slot=True)
    assert parse_pcie_capability(full).port_type == "root"
    assert parse_pcie_capability(full[:64]) is None
    assert parse_pcie_capability(config_space(None)) is None


PARSERS = [parse_class, parse_id, parse_link_speed, parse_link_width, parse_numa_node, parse_bus_number,
           parse_cpulist]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PARSERS), st.text(max_size=30))
def test_attribute_parsers_only_raise_parse_error(parser, text):
    try:
        parser(text, "/sys/x/attr")
    except ParseError as e:
        assert e.source == "/sys/x/attr" and e.line == 1


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(PARSERS), st.sampled_from(["0x060400", "16.0 GT/s PCIe", "16", "-1", "129", "0-3,8"]),
       st.integers(0, 40), st.characters())
def test_attribute_parsers_on_mutated_values(parser, value, pos, ch):
    text = value[:pos] + ch + value[pos + 1:]
    with contextlib.suppress(ParseError):
        parser(text, "attr")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_config_parser_never_fails(data):
    cap = parse_pcie_capability(data)
    assert cap is None or cap.port_type in (None, "endpoint", "legacy-endpoint", "root", "upstream",
                                            "downstream", "pci-bridge", "rc-endpoint")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_pci_ids_parser_never_fails(text):
    db = parse_pci_ids(text)
    assert all(len(v) == 4 for v in db)


def test_garbled_cpulist_names_the_file(fake):
    path = fake.root / "devices" / "system" / "node" / "node1" / "cpulist"
    path.write_text("four-seven\n")
    with pytest.raises(ParseError) as info:
        topology_from_sysfs(fake.root, pci_ids="/nonexistent")
    assert info.value.source == str(path) and "CPU list" in info.value.expected
