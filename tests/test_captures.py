"""Real captures beyond the shared set (tests/data/topology, sources in its README).

Each test asserts facts about one real machine, read off the capture by hand:
multi-item DMI records, uncore buses without a NUMA node, NCCL files without
classes, hwloc exports with a repeated bus id.
"""

from __future__ import annotations

import contextlib
import io
import re
import tarfile
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import ParseError, TopologyError
from planner.topology.dmi.parse import parse_dmidecode
from planner.topology.hwloc.parse import parse_hwloc_xml
from planner.topology.model import NodeKind
from planner.topology.nvidia.nccl import parse_nccl_topo
from planner.topology.pcitree import PciFunction, build_pci_topology
from planner.topology.sysfs import read_sysfs, topology_from_sysfs
from tests.conftest import topology_fixture

DATA = Path(__file__).parent / "data" / "topology"
SYS4028 = DATA / "supermicro-sys-4028gr-tr-dmidecode" / "dmidecode.txt"
ESC8000 = DATA / "asus-esc8000-g4-dmidecode" / "dmidecode.txt"
DAX = DATA / "hwloc-32em64t-2n8c-dax-nvme-mic"
X9DRG = DATA / "hwloc-x9drg-hf-duplicate-busid" / "hwloc.xml"
G5_48 = DATA / "aws-g5-48xlarge-nccl" / "nccl-topo.xml"
G5_12 = DATA / "aws-g5-12xlarge-nccl-issue466" / "nccl-topo.xml"


@cache
def _dmi(path: Path):
    return parse_dmidecode(path.read_text(), str(path))


@pytest.fixture(scope="module")
def dax_sysfs(tmp_path_factory) -> Path:
    """The hwloc-gather-topology tarball of the DAX/NVMe/MIC machine, unpacked."""
    dest = tmp_path_factory.mktemp("sysfs")
    with tarfile.open(DAX / "sysfs.tar.bz2") as tar:
        tar.extractall(dest, filter="data")
    return dest / "32em64t-2n8c+1mic" / "sys"


# -- dmidecode: records that list several items ---------------------------------------


def test_sys4028_type10_record_lists_two_onboard_devices():
    info = _dmi(SYS4028)
    legacy = [(o.device_type, o.reference_designation, o.enabled, o.handle)
              for o in info.onboard if o.dmi_type == 10]
    assert legacy == [("Video", "Onboard Aspeed Video", True, "0x0028"),
                      ("Ethernet", "Onboard Intel Lan", True, "0x0028")]
    assert all(o.bus_address is None for o in info.onboard if o.dmi_type == 10)


def test_sys4028_system_sockets_and_eleven_slots():
    info = _dmi(SYS4028)
    assert (info.system_vendor, info.system_product) == ("Supermicro", "SYS-4028GR-TR")
    assert info.populated_sockets == 2
    assert {p.version for p in info.processors} == {"Intel(R) Xeon(R) CPU E5-2620 v3 @ 2.40GHz"}
    assert [(p.core_count, p.thread_count) for p in info.processors] == [(6, 12), (6, 12)]
    slots = {s.designation: s for s in info.slots}
    assert len(slots) == 11
    # the eight GPU slots of this 8-GPU chassis: x16 Gen3, in use, four per CPU
    gpu_slots = {"CPU2 SLOT1": "88", "CPU2 SLOT2": "89", "CPU2 SLOT3": "84", "CPU2 SLOT4": "85",
                 "CPU1 SLOT8": "04", "CPU1 SLOT9": "05", "CPU1 SLOT10": "08", "CPU1 SLOT11": "09"}
    for name, bus in gpu_slots.items():
        s = slots[name]
        assert (s.width_lanes, s.pcie_gen, s.form_factor, s.in_use) == (16, 3, "cem", True), name
        assert s.bus_address == f"0000:{bus}:00.0"
    assert (slots["CPU2 SLOT5"].width_lanes, slots["CPU2 SLOT5"].in_use) == (8, False)
    assert (slots["CPU1 SLOT7"].width_lanes, slots["CPU1 SLOT7"].bus_address) == (4, "0000:ff:00.0")


def test_esc8000_g4_nine_gpu_slots_two_m2_and_type40_items():
    info = _dmi(ESC8000)
    assert (info.system_vendor, info.system_product) == ("ASUSTeK COMPUTER INC.", "ESC8000 G4")
    assert {p.version for p in info.processors} == {"Intel(R) Xeon(R) Silver 4214 CPU @ 2.20GHz"}
    assert len(info.slots) == 14
    pcie = [s for s in info.slots if re.fullmatch(r"PCIE\d", s.designation)]
    assert [s.bus_address[5:7] for s in pcie] == ["21", "23", "24", "22", "1d", "1f", "20", "1e", "1c"]
    assert all((s.width_lanes, s.pcie_gen, s.in_use) == (16, 3, True) for s in pcie)
    m2 = [s for s in info.slots if s.form_factor == "m.2"]
    assert [(s.designation, s.width_lanes, s.in_use) for s in m2] == [("NGFF1", 4, False), ("NGFF2", 4, False)]
    legacy = [o.reference_designation for o in info.onboard if o.dmi_type == 10]
    assert legacy == ["AST 2500", "Intel i350-AM2", "Intel i350-AM2"]
    extended = {o.bus_address: o.reference_designation for o in info.onboard if o.dmi_type == 41}
    assert extended["0000:03:00.0"] == "AST 2500"
    assert extended["0000:81:00.1"] == "Intel i350-AM2"


def test_quiet_output_of_a_multi_item_record_gives_the_same_items():
    text = SYS4028.read_text()
    quiet = "\n".join(ln for ln in text.splitlines()
                      if not ln.startswith(("Handle ", "#", "Getting", "SMBIOS", "Table at"))
                      and not re.match(r"^\d+ structures", ln))
    # dmidecode -q drops the header, the Handle lines and the records it cannot decode
    info = parse_dmidecode(quiet + "\n", "quiet.txt")
    assert [o.reference_designation for o in info.onboard if o.dmi_type == 10] == \
        ["Onboard Aspeed Video", "Onboard Intel Lan"]


_WORD = st.text(st.characters(whitelist_categories=("Lu", "Ll", "Nd")), min_size=1, max_size=12)


@given(items=st.lists(st.tuples(st.sampled_from(["Video", "Ethernet", "Sound", "SATA Controller"]),
                                st.sampled_from(["Enabled", "Disabled"]), _WORD),
                      min_size=1, max_size=6))
def test_every_item_of_a_type10_record_is_read_in_order(items):
    body = "".join(f"On Board Device {i} Information\n\tType: {t}\n\tStatus: {s}\n\tDescription: {d}\n"
                   for i, (t, s, d) in enumerate(items, 1))
    info = parse_dmidecode(f"Handle 0x0028, DMI type 10, 8 bytes\n{body}\n", "t10.txt")
    assert [(o.device_type, o.enabled, o.reference_designation) for o in info.onboard] == \
        [(t, s == "Enabled", d) for t, s, d in items]


# -- truncated dmidecode: refused, never a quietly shorter slot list -------------------


@pytest.mark.parametrize("path", [SYS4028, ESC8000])
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frac=st.floats(0.0, 0.999))
def test_a_full_dump_cut_anywhere_is_refused(path, frac):
    text = path.read_text()
    cut = int(len(text.rstrip("\n").rsplit("\n", 1)[0]) * frac)  # before the End Of Table line
    with pytest.raises(ParseError) as info:
        parse_dmidecode(text[:cut], "cut.txt")
    assert info.value.source == "cut.txt"


def test_a_slot_listing_cut_inside_a_record_is_refused_or_noted():
    """``dmidecode -t 9`` output has no End Of Table: a cut inside a slot is still caught."""
    text = topology_fixture("dell-poweredge-r640-2x-xeon-gold6230-nvme", "dmidecode.txt").read_text()
    records = [r for r in text.split("\n\n") if ", DMI type 9," in r]
    t9 = "# dmidecode 3.4\nGetting SMBIOS data from sysfs.\nSMBIOS 3.2.0 present.\n\n" + "\n\n".join(records)
    assert len(parse_dmidecode(t9 + "\n\n", "t9.txt").slots) == 11
    last = t9.rindex("Handle 0x")
    for cut in range(last + 1, len(t9)):
        try:
            info = parse_dmidecode(t9[:cut], "t9.txt")
        except ParseError:
            continue
        assert any("cut short" in w for w in info.warnings), repr(t9[last:cut])


# -- Intel uncore buses (7f, ff) without a NUMA node are not a socket -----------------


def test_sysfs_capture_has_two_sockets_and_leaves_the_uncore_buses_out(dax_sysfs):
    fns = {f.address: f for f in read_sysfs(dax_sysfs)}
    uncore = [a for a in fns if a.startswith(("0000:7f:", "0000:ff:"))]
    assert sum(a.startswith("0000:7f:") for a in uncore) == sum(a.startswith("0000:ff:") for a in uncore) == 46
    # system peripherals and performance counters (class 0880 / 1101), none with a NUMA node
    assert all(fns[a].numa_node is None and fns[a].class_code in ("0880", "1101") for a in uncore)
    topo = topology_from_sysfs(dax_sysfs)
    assert sorted(n.id for n in topo.nodes(NodeKind.SOCKET)) == ["socket0", "socket1"]
    assert any("0000:7f, 0000:ff" in n and "not a socket" in n for n in topo.notes)
    assert not any(n.bus_address and n.bus_address.startswith(("0000:7f", "0000:ff")) for n in topo.nodes())


def test_sysfs_capture_devices_hang_where_the_kernel_says(dax_sysfs):
    topo = topology_from_sysfs(dax_sysfs)
    # ConnectX-3 (15b3:1003) and the Xeon Phi coprocessor (8086:225c, class 0b40) on CPU 1's slots
    assert topo.node("pci:0000:82:00.0").kind == NodeKind.NIC
    assert topo.parent("pci:0000:82:00.0").id == "slot:0000:80:02.2"
    assert topo.socket_of("pci:0000:82:00.0").id == "socket1"
    phi = topo.node("pci:0000:83:00.0")
    assert (phi.vendor_id, phi.device_id, phi.attrs["class_code"]) == ("8086", "225c", "0b40")
    assert topo.socket_of(phi.id).id == "socket1"
    # the NVMe function on root bus 00 reports no NUMA node; its root complex is socket 0's
    assert topo.node("pci:0000:00:02.0").kind == NodeKind.NVME
    assert topo.socket_of("pci:0000:00:02.0").id == "socket0"


def test_a_bridge_with_unnumbered_buses_adopts_nothing(dax_sysfs):
    """00:11.0 (C600 virtual root port) reports secondary bus 0: nothing is below it."""
    fns = {f.address: f for f in read_sysfs(dax_sysfs)}
    assert (fns["0000:00:11.0"].secondary_bus, fns["0000:00:11.0"].subordinate_bus) == (0, 0)
    topo = topology_from_sysfs(dax_sysfs)
    assert topo.parent("pci:0000:02:00.0").id == "socket0"  # the I350 NIC behind root port 00:01.1
    assert not topo.nodes(NodeKind.SWITCH)  # 00:1c.0 -> 04:00.0 -> VGA is a PCIe-to-PCI bridge


def test_hwloc_export_of_the_same_machine_agrees():
    topo = parse_hwloc_xml((DAX / "hwloc.xml").read_text(), "dax.xml")
    assert sorted(n.id for n in topo.nodes(NodeKind.SOCKET)) == ["socket0", "socket1"]
    assert topo.name == "DCS8000Z"
    assert any("0000:7f, 0000:ff" in n for n in topo.notes)
    assert {n.bus_address for n in topo.nodes(NodeKind.NIC)} == {"0000:02:00.0", "0000:82:00.0"}


@settings(max_examples=40, deadline=None)
@given(buses=st.sets(st.integers(0x10, 0xff), min_size=1, max_size=4),
       classes=st.lists(st.sampled_from(["0880", "0600", "0800", "1101", "ff00", None]), min_size=1, max_size=6))
def test_numa_less_platform_buses_never_add_a_socket(buses, classes):
    base = [
        PciFunction("0000:00:01.0", class_code="0604", is_bridge=True, secondary_bus=1, subordinate_bus=1,
                    numa_node=0, port_type="root"),
        PciFunction("0000:01:00.0", class_code="0302", vendor_id="10de"),
        PciFunction("0000:80:01.0", class_code="0604", is_bridge=True, secondary_bus=0x81,
                    subordinate_bus=0x81, numa_node=1, port_type="root"),
        PciFunction("0000:81:00.0", class_code="0108"),
    ]
    taken = {0, 1, 0x80, 0x81}
    extra = [PciFunction(f"0000:{b:02x}:{i:02x}.0", class_code=c)
             for b in sorted(buses - taken) for i, c in enumerate(classes)]
    topo = build_pci_topology(base + extra)
    assert sorted(n.id for n in topo.nodes(NodeKind.SOCKET)) == ["socket0", "socket1"]
    assert topo.counts()["gpu"] == 1 and topo.counts()["nvme"] == 1


# -- NCCL files whose <pci> entries carry no class ------------------------------------


def test_aws_g5_48xlarge_keeps_its_eight_classless_devices():
    topo = parse_nccl_topo(G5_48.read_text(), str(G5_48))
    assert topo.counts()["socket"] == 2
    by_socket = {s: sorted(d.bus_address for d in topo.nodes(NodeKind.OTHER) if topo.socket_of(d.id).id == s)
                 for s in ("socket0", "socket1")}
    assert by_socket == {"socket0": [f"0000:00:{d}.0" for d in ("16", "17", "18", "19")],
                         "socket1": [f"0000:00:{d}.0" for d in ("1a", "1b", "1c", "1d")]}
    assert all(d.attrs["class_given"] is False for d in topo.nodes(NodeKind.OTHER))
    assert any(n.startswith("8 <pci> element(s) give no class") for n in topo.notes)


def test_aws_g5_12xlarge_file_from_the_issue_tracker():
    topo = parse_nccl_topo(G5_12.read_text(), str(G5_12))
    assert (topo.counts()["socket"], topo.counts()["other"]) == (1, 4)


def test_a_classless_pci_with_a_gpu_or_nic_child_is_that_device():
    topo = parse_nccl_topo(
        '<system version="1"><cpu numaid="0">'
        '<pci busid="0000:01:00.0" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="0" sm="80"/></pci>'
        '<pci busid="0000:02:00.0"><nic><net name="mlx5_0" dev="0" speed="100000"/></nic></pci>'
        "</cpu></system>", "mixed.xml")
    assert [n.bus_address for n in topo.nodes(NodeKind.GPU)] == ["0000:01:00.0"]
    assert [n.bus_address for n in topo.nodes(NodeKind.NIC)] == ["0000:02:00.0"]
    assert topo.link_between("socket0", "pci:0000:01:00.0").pcie_gen == 4
    assert not topo.notes


@given(n=st.integers(1, 12), classed=st.lists(st.booleans(), min_size=12, max_size=12))
def test_classless_leaves_are_all_kept(n, classed):
    body = "".join(f'<pci busid="0000:{i + 1:02x}:00.0"' + (' class="0x030200"' if classed[i] else "") + "/>"
                   for i in range(n))
    topo = parse_nccl_topo(f'<system version="1"><cpu numaid="0">{body}</cpu></system>', "p.xml")
    want_gpu = sum(classed[:n])
    assert (topo.counts()["gpu"], topo.counts()["other"]) == (want_gpu, n - want_gpu)


# -- hwloc exports with a repeated bus id ---------------------------------------------


def test_two_different_devices_on_one_bus_id_load_apart_as_hwloc_loads_them():
    """hwloc's own test file names 0000:04:00.0 twice (issue 28: 21 of its 23 XML tests loaded).

    hwloc loads both objects, each where the XML nests it; so does the parser: the SATA unit
    keeps the bus id, the ConnectX-4 is its repeat ``#2`` under socket 1, and one note names both lines.
    """
    topo = parse_hwloc_xml(X9DRG.read_text(), "x9drg.xml")
    sata, cx4 = topo.node("pci:0000:04:00.0"), topo.node("pci:0000:04:00.0#2")
    assert (sata.kind, "C602" in sata.name, topo.parent(sata.id).id) == (NodeKind.OTHER, True, "socket0")
    assert (cx4.kind, "ConnectX-4" in cx4.name, topo.parent(cx4.id).id) == (NodeKind.NIC, True, "socket1")
    assert (cx4.vendor_id, cx4.device_id) == ("15b3", "1013")
    notes = [n for n in topo.notes if "two different objects" in n]
    assert len(notes) == 1 and "line 100" in notes[0] and "line 247" in notes[0]
    assert "C602 chipset 4-Port SATA Storage Control Unit" in notes[0]
    assert "MT27700 Family [ConnectX-4]" in notes[0]


def _with_repeat(text: str, busid: str) -> str:
    """``text`` with the element of ``busid`` (and what it holds) repeated right after itself."""
    start, i = _element(text, busid)
    element = text[start:i]
    return text[:i] + "\n" + re.sub(r'gp_index="\d+"', 'gp_index="99999"', element) + text[i:]


@pytest.mark.parametrize("busid", ["0000:34:00.0", "0000:32:00.0"])  # a GPU; a switch with its subtree
def test_an_identical_repeat_is_accepted_with_a_note(busid):
    text = topology_fixture("nvidia-dgx2h-hwloc", "hwloc.xml").read_text()
    plain = parse_hwloc_xml(text, "dgx2.xml")
    repeated = parse_hwloc_xml(_with_repeat(text, busid), "dgx2.xml")
    assert repeated.counts() == plain.counts()
    assert any(busid in n and "appear twice, identically" in n for n in repeated.notes)


def _element(text: str, busid: str) -> tuple[int, int]:
    """Where the element of ``busid`` (and what it holds) starts and ends in ``text``."""
    start = text.rindex("<object", 0, text.index(f'pci_busid="{busid}"'))
    depth = 0
    for m in re.finditer(r"<object\b[^>]*?(/?)>|</object>", text[start:]):
        depth += -1 if m.group(0).startswith("</") else (m.group(1) != "/")
        if depth == 0:
            return start, start + m.end()
    raise AssertionError(f"{busid}: unclosed element")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(copies=st.integers(1, 3), busid=st.sampled_from(["0000:34:00.0", "0000:b7:00.0"]))
def test_each_different_repeat_is_one_more_device_and_one_note(copies, busid):
    """A GPU of the DGX-2 export repeated ``copies`` times, each copy another device: all are
    loaded (``#2``, ``#3``, ...), in the same place, and one note lists them all."""
    text = topology_fixture("nvidia-dgx2h-hwloc", "hwloc.xml").read_text()
    plain = parse_hwloc_xml(text, "dgx2.xml")
    a, b = _element(text, busid)
    element = re.sub(r'gp_index="\d+"', "", text[a:b])
    # another revision makes each copy another object (hwloc's revision byte: "a1" in the export)
    extra = "".join("\n" + element.replace(' a1 00"', f' b{i} 00"', 1) for i in range(copies))
    topo = parse_hwloc_xml(text[:b] + extra + text[b:], "dgx2.xml")
    assert topo.counts()["gpu"] == plain.counts()["gpu"] + copies
    ids = [f"pci:{busid}#{k}" for k in range(2, copies + 2)]
    assert all(topo.parent(i).id == topo.parent(f"pci:{busid}").id for i in ids)
    notes = [n for n in topo.notes if "two different objects" in n]
    assert len(notes) == 1 and notes[0].count(busid) == copies


@pytest.mark.parametrize("address", ["0000:04:00.0#1", "0000:04:00.0#x", "0000:04:00.0#"])
def test_a_repeat_mark_other_than_two_or_more_is_refused(address):
    with pytest.raises(TopologyError, match="its repeat"):
        build_pci_topology([PciFunction(address, class_code="0200", numa_node=0)])


# -- SXM modules in positions DMI calls card slots (issue 28) ---------------------------


C4140 = DATA / "dell-poweredge-c4140-p100-sxm2"


def _c4140():
    from planner.topology.discover import topology_from_files

    return topology_from_files(lspci_vvv=[str(C4140 / "lspci-vvnn.txt")],
                               dmidecode=str(C4140 / "dmidecode.txt"))


def test_an_sxm_module_makes_its_dmi_slot_an_sxm_position():
    """Dell's C4140 calls its P100 SXM2 positions "x16 PCI Express 3", length Short: the GPU at
    18:00.0 sits in "PCIe Slot 5", which is an SXM position, while the empty PCIe slots stay CEM."""
    topo = _c4140()
    slot = topo.parent("pci:0000:18:00.0")
    assert (slot.attrs["designation"], slot.attrs["length"]) == ("PCIe Slot 5", "Short")
    assert (slot.attrs["form_factor"], slot.attrs["dmi_form_factor"]) == ("sxm", "cem")
    others = {s.attrs["designation"]: s.attrs["form_factor"] for s in topo.nodes(NodeKind.SLOT) if s.id != slot.id}
    assert others == {"PCIe Slot 1": "cem", "PCIe Slot 2": "cem", "PCIe Slot 3": "cem"}
    assert any("SXM module" in n and "PCIe Slot 5" in n for n in topo.notes)


def test_an_sxm_module_is_placed_where_it_sits():
    """Issue 28: `moment plan` on the C4140 exited 2, "no candidate slot fits …tesla-p100-sxm2…
    (double width)". The module's form factor is the device's (sxm, not double width), and the
    position it sits in takes it."""
    from planner.inventory import inventory_from_topology
    from planner.layout.fit import slot_fit

    topo = _c4140()
    inv = inventory_from_topology(topo)
    (model, count), = inv.items
    assert (count, model.form_factors, model.double_width) == (1, ("sxm",), False)
    assert slot_fit(topo.parent("pci:0000:18:00.0"), model).ok
    assert not any(slot_fit(s, model).ok for s in topo.nodes(NodeKind.SLOT)
                   if s.attrs["designation"] != "PCIe Slot 5")


def test_cli_plan_on_the_c4140_recommends_the_module_s_position():
    from moment.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", "--lspci-vvv", str(C4140 / "lspci-vvnn.txt"), "--dmidecode",
                     str(C4140 / "dmidecode.txt"), "--cpu-cache-share", "1"])
    assert code == 0
    assert "GPU 0 → PCIe Slot 5" in out.getvalue()


# -- a root port's slot capability in front of a switch on the board (issue 28) -------------


def _sys4028gr_tr2():
    """The PCIe structure of a Supermicro SYS-4028GR-TR2, built (not captured), smallest form.

    From its capture (linuxhw/LsPCI ``Server/Supermicro/SYS-4028/SYS-4028GR-TR2/DD04B1B370C8``,
    commit 926a35a5, and linuxhw/DMI at 6e9143d8): root ports 00:02.0 (``Slot #2``, buses
    02-08) and 00:03.0 (``Slot #3``, buses 09-0f) each announce a slot and lead to a PLX
    switch (10b5:9797) whose downstream ports announce slots too (03:04.0 ``Slot #4`` to
    bus 04, ...); DMI names the GPU slots on the switches' ports (CPU1 SLOT1 at 04:00.0,
    CPU1 SLOT12 at 0c:00.0, ...). Kept here: one GPU per switch and, on the second switch,
    a port that announces a slot with nothing in it and no DMI slot naming it.
    """
    def bridge(addr, sec, sub, pt, slot=None):
        return PciFunction(addr, class_code="0604", vendor_id="8086" if pt == "root" else "10b5",
                           is_bridge=True, secondary_bus=sec, subordinate_bus=sub, port_type=pt,
                           link_cap=(3, 16), numa_node=0, slot=slot)

    gpu = dict(class_code="0302", vendor_id="10de", link_cap=(3, 16), numa_node=0)
    fns = [bridge("00:02.0", 0x02, 0x08, "root", "2"), bridge("02:00.0", 0x03, 0x08, "upstream"),
           bridge("03:04.0", 0x04, 0x04, "downstream", "4"), PciFunction("04:00.0", **gpu),
           bridge("00:03.0", 0x09, 0x0f, "root", "3"), bridge("09:00.0", 0x0a, 0x0f, "upstream"),
           bridge("0a:08.0", 0x0c, 0x0c, "downstream", "8"), PciFunction("0c:00.0", **gpu),
           bridge("0a:10.0", 0x0b, 0x0b, "downstream", "16")]
    from planner.topology.dmi.records import DmiInfo, DmiSlot

    dmi = DmiInfo(slots=(
        DmiSlot("CPU1 SLOT1", "x16 PCI Express 3 x16", 16, 3, "cem", length="Long", in_use=True,
                bus_address="0000:04:00.0", handle="0x001C"),
        DmiSlot("CPU1 SLOT12", "x16 PCI Express 3 x16", 16, 3, "cem", length="Long", in_use=True,
                bus_address="0000:0c:00.0", handle="0x0027")))
    return fns, dmi


def test_a_root_port_s_slot_in_front_of_a_board_switch_is_no_slot():
    """Issue 28: the SYS-4028GR-TR2 got 14 slots for 12: beside the DMI slots, a slot for each
    root port that holds a switch (shown empty). With DMI naming the slots on the switches'
    ports, the switches are the board's: they hang from the socket, by the root port's link."""
    from planner.topology.dmi.join import apply_dmi_slots

    fns, dmi = _sys4028gr_tr2()
    lspci_only = build_pci_topology(fns)
    assert {s.attrs["port"] for s in lspci_only.nodes(NodeKind.SLOT)} == {
        "0000:00:02.0", "0000:00:03.0", "0000:03:04.0", "0000:0a:08.0", "0000:0a:10.0"}
    assert all(lspci_only.node(f"slot:0000:00:0{i}.0").attrs["in_use"] for i in (2, 3))  # they hold a switch
    topo = apply_dmi_slots(lspci_only, dmi, functions=fns)
    slots = {s.attrs.get("designation"): s.attrs["in_use"] for s in topo.nodes(NodeKind.SLOT)}
    assert slots == {"CPU1 SLOT1": True, "CPU1 SLOT12": True, "16": False}  # the empty port stays
    for sw in ("switch:0000:02:00.0", "switch:0000:09:00.0"):
        assert topo.parent(sw).id == "socket0"
        lk = topo.link_between("socket0", sw)
        assert (lk.pcie_gen, lk.lanes) == (3, 16)
    assert topo.parent("pci:0000:04:00.0").attrs["designation"] == "CPU1 SLOT1"
    assert any("0000:00:02.0 (slot 2)" in n and "0000:00:03.0 (slot 3)" in n for n in topo.notes)


def test_a_switch_card_in_a_slot_keeps_its_slot_and_fills_it():
    """Without a DMI slot below the switch (a switch card, HighPoint's SSD7540), the root port's
    slot stays, in use."""
    from planner.topology.dmi.join import apply_dmi_slots
    from planner.topology.dmi.records import DmiInfo

    fns, _ = _sys4028gr_tr2()
    topo = apply_dmi_slots(build_pci_topology(fns), DmiInfo(), functions=fns)
    slot = topo.node("slot:0000:00:02.0")
    assert slot.attrs["in_use"] and topo.parent("switch:0000:02:00.0").id == slot.id
