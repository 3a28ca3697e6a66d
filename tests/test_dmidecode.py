"""dmidecode parsing (slots, processors, onboard devices) and the join of DMI slots to a PCI tree."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import ParseError
from planner.topology.dmi.join import apply_dmi_slots
from planner.topology.dmi.parse import parse_dmidecode
from planner.topology.dmi.records import DmiInfo, DmiOnboardDevice, DmiSlot
from planner.topology.model import Link, LinkKind, NodeKind
from planner.topology.pcitree import PciFunction, build_pci_topology
from planner.topology.textio import read_text
from tests.conftest import topology_fixture
from tests.fuzz import mutated_text, parses_or_refuses

DELL = "dell-poweredge-r640-2x-xeon-gold6230-nvme"
HPE = "hpe-cray-xd665-2x-epyc9354-h100"


def fixture_text(machine: str, filename: str = "dmidecode.txt") -> str:
    return read_text(topology_fixture(machine, filename))


@pytest.fixture(scope="module")
def dell_text() -> str:
    return fixture_text(DELL)


@pytest.fixture(scope="module")
def hpe_text() -> str:
    return fixture_text(HPE)


@pytest.fixture(scope="module")
def dell(dell_text) -> DmiInfo:
    return parse_dmidecode(dell_text, "dell/dmidecode.txt")


@pytest.fixture(scope="module")
def hpe(hpe_text) -> DmiInfo:
    return parse_dmidecode(hpe_text, "hpe/dmidecode.txt")


#: what dmidecode prints in every type 9 record; ``slot`` adds those a test leaves out
_SLOT_DEFAULTS = {"Designation": "S", "Type": "Other", "Current Usage": "Unknown", "Length": "Unknown"}


def slot(text: str, source: str = "slot.txt") -> DmiSlot:
    """The one slot of a type 9 record given as its field lines (the always-printed ones added)."""
    lines = text.strip().splitlines()
    given = {ln.split(":", 1)[0] for ln in lines}
    lines += [f"{k}: {v}" for k, v in _SLOT_DEFAULTS.items() if k not in given]
    body = "\n".join("\t" + ln for ln in lines)
    info = parse_dmidecode(f"Handle 0x0900, DMI type 9, 17 bytes\nSystem Slot Information\n{body}\n", source)
    assert len(info.slots) == 1
    return info.slots[0]


# ---------------------------------------------------------------------------
# the real captures
# ---------------------------------------------------------------------------


def test_dell_system_and_processors(dell):
    assert dell.system_vendor == "Dell Inc."
    assert dell.system_product == "PowerEdge R640"
    assert dell.dmidecode_version == "3.4"
    assert dell.smbios_version == "3.2.0"
    assert dell.populated_sockets == 2
    assert [p.socket_designation for p in dell.processors] == ["CPU1", "CPU2"]
    for p in dell.processors:
        assert "Xeon(R) Gold 6230" in p.version
        assert (p.core_count, p.thread_count, p.max_speed_mhz) == (20, 40, 4000)
        assert p.populated and p.status == "Populated, Enabled"


def test_dell_has_eleven_slots_three_cards_and_eight_u2_bays(dell):
    assert len(dell.slots) == 11
    cards = [s for s in dell.slots if s.designation.startswith("PCIe Slot ")]
    assert [s.designation for s in cards] == ["PCIe Slot 1", "PCIe Slot 2", "PCIe Slot 3"]
    for s in cards:
        assert (s.width_lanes, s.pcie_gen, s.form_factor, s.length) == (16, 3, "cem", "Short")
        assert s.in_use is False and s.current_usage == "Available"
        assert s.bus_address is None
    bays = {s.designation: s for s in dell.slots if "SSD" in s.designation}
    assert len(bays) == 8
    for s in bays.values():
        assert s.slot_type == "PCI Express 3 SFF-8639 (U.2)"
        assert (s.width_lanes, s.pcie_gen, s.form_factor) == (4, 3, "u.2")
        assert s.length == '2.5" drive form factor'
    addr = {int(re.search(r"Slot (\d+)", d).group(1)): s.bus_address for d, s in bays.items()}
    assert addr == {6: "0000:86:00.0", 7: "0000:87:00.0", 8: "0000:88:00.0", 9: "0000:89:00.0",
                    4: "0000:af:00.0", 5: "0000:b0:00.0", 2: "0000:b1:00.0", 3: "0000:b2:00.0"}
    in_use = sorted(d for d, s in bays.items() if s.in_use)
    assert in_use == ["PCIe SSD Slot 8 in Bay 1", "PCIe SSD Slot 9 in Bay 1"]
    assert bays["PCIe SSD Slot 8 in Bay 1"].handle == "0x0905"
    assert bays["PCIe SSD Slot 8 in Bay 1"].slot_id == 8


def test_dell_onboard_devices_follow_dmi_naming(dell):
    by_addr = {o.bus_address: o.reference_designation for o in dell.onboard}
    # DMI and lspci's DeviceName disagree on NIC numbering; the parser reports DMI's.
    assert by_addr == {
        "0000:01:00.0": "Integrated NIC 1", "0000:01:00.1": "Integrated NIC 2",
        "0000:19:00.0": "Integrated NIC 3", "0000:19:00.1": "Integrated NIC 4",
        "0000:18:00.0": "Integrated RAID", "0000:03:00.0": "Embedded Video",
    }
    assert all(o.enabled for o in dell.onboard)
    assert {o.device_type for o in dell.onboard} == {"Ethernet", "SAS Controller", "Video"}


HPE_SLOTS = {
    # designation: (bus address, width, form factor, in use)
    "Slot 1 - PCIE slot 1": ("0000:03:00.0", 16, "cem", True),
    "Slot 2 - PCIE slot 2": ("0000:63:00.0", 16, "cem", True),
    "Slot 3 - PCIE slot 3": ("0000:83:00.0", 16, "cem", True),
    "Slot 4 - PCIE slot 4": ("0000:e3:00.0", 16, "cem", True),
    "Slot 5 - GPU 1": ("0000:84:00.0", 16, "other", True),
    "Slot 6 - GPU 2": ("0000:e4:00.0", 16, "other", True),
    "Slot 7 - GPU 3": ("0000:04:00.0", 16, "other", True),
    "Slot 8 - GPU 4": ("0000:64:00.0", 16, "other", True),
    "Slot 100 - NVMe SSD 1": ("0000:05:00.0", 4, "u.2", True),
    "Slot 101 - NVMe SSD 2": ("0000:65:00.0", 4, "u.2", True),
    "Slot 102 - NVMe SSD 3": ("0000:85:00.0", 4, "u.2", True),
    "Slot 103 - NVMe SSD 4": ("0000:e5:00.0", 4, "u.2", True),
    "Slot 13 - M.2 slot": ("0000:07:00.0", 4, "m.2", False),
    "Slot 9 - Onboard OCP NIC": ("0000:21:00.0", 16, "ocp", True),
    "Slot 10 - Riser 2": ("0000:41:00.0", 16, "cem", False),
    "Slot 11 - HPE NS204": ("0000:c1:00.0", 4, "other", True),
    "Slot 12 - HPE MR416": ("0000:c2:00.0", 8, "cem", False),
}


def test_hpe_seventeen_slots(hpe):
    assert hpe.system_vendor == "HPE"
    assert hpe.system_product == "HPE Cray SC XD665"
    assert hpe.dmidecode_version == "3.5"
    got = {s.designation: (s.bus_address, s.width_lanes, s.form_factor, s.in_use) for s in hpe.slots}
    assert got == HPE_SLOTS
    gpu3 = next(s for s in hpe.slots if s.bus_address == "0000:04:00.0")
    assert gpu3.designation == "Slot 7 - GPU 3" and gpu3.slot_id == 7
    assert (gpu3.pcie_gen, gpu3.physical_width_lanes, gpu3.length) == (5, 16, "Other")
    mr416 = next(s for s in hpe.slots if s.designation == "Slot 12 - HPE MR416")
    assert (mr416.width_lanes, mr416.physical_width_lanes) == (8, 16)  # "x8 PCI Express 5 x16"
    m2 = next(s for s in hpe.slots if s.form_factor == "m.2")
    assert m2.slot_type == "M.2 Socket 3" and m2.pcie_gen is None
    assert all(s.pcie_gen == 5 for s in hpe.slots if s.slot_type and "PCI Express" in s.slot_type)


def test_hpe_processors_and_onboard(hpe):
    assert hpe.populated_sockets == 2
    assert {p.version for p in hpe.processors} == {"AMD EPYC 9354 32-Core Processor"}
    assert {(p.core_count, p.thread_count) for p in hpe.processors} == {(32, 64)}
    assert {o.bus_address for o in hpe.onboard} == {"0000:67:00.0", "0000:68:00.0"}


def type9_only(full: str, header: str) -> str:
    """What ``dmidecode -t 9`` prints for the machine whose full dump is ``full``."""
    blocks = full.replace("\r\n", "\n").split("\n\n")
    return header + "\n\n".join(b for b in blocks if re.match(r"Handle 0x\w+, DMI type 9,", b)) + "\n"


def test_t9_output_gives_the_same_slots(dell, dell_text, hpe, hpe_text):
    for info, text, header in (
        (dell, dell_text, "# dmidecode 3.4\nGetting SMBIOS data from sysfs.\nSMBIOS 3.2.0 present.\n\n"),
        (hpe, hpe_text, "# dmidecode 3.5\nGetting SMBIOS data from sysfs.\nSMBIOS 3.5.0 present.\n"
                        "# SMBIOS implementations newer than version 3.5.0 are not\n"
                        "# fully supported by this version of dmidecode.\n\n"),
    ):
        only = parse_dmidecode(type9_only(text, header), "t9.txt")
        assert [(s.designation, s.bus_address, s.width_lanes) for s in only.slots] == [
            (s.designation, s.bus_address, s.width_lanes) for s in info.slots]
        assert only.processors == () and only.system_product is None


def test_quiet_output_without_handle_lines(dell, dell_text):
    # -q hides handles, meta-data and the OEM-specific records it cannot decode
    blocks = [b for b in dell_text.split("\n\n") if "OEM-specific Type" not in b]
    quiet = "\n".join(ln for ln in "\n\n".join(blocks).splitlines()
                      if not ln.startswith(("Handle ", "# ", "Getting ", "SMBIOS ", "Table at")))
    q = parse_dmidecode(quiet, "q.txt")
    assert [(s.designation, s.bus_address) for s in q.slots] == [
        (s.designation, s.bus_address) for s in dell.slots]
    assert q.slots[0].handle is None
    assert q.populated_sockets == 2 and q.system_product == "PowerEdge R640"


def test_crlf_and_space_indented_output(dell, dell_text):
    crlf = parse_dmidecode(dell_text.replace("\n", "\r\n"), "crlf.txt")
    assert crlf.slots == tuple(s for s in crlf.slots) and len(crlf.slots) == 11
    assert [s.bus_address for s in crlf.slots] == [s.bus_address for s in dell.slots]
    spaced = parse_dmidecode(dell_text.replace("\t", "    "), "md.txt")
    assert [(s.designation, s.bus_address, s.in_use) for s in spaced.slots] == [
        (s.designation, s.bus_address, s.in_use) for s in dell.slots]
    assert spaced.processors[0].core_count == 20


def test_dump_without_slot_records_is_valid_and_has_no_slots(dell_text):
    blocks = dell_text.split("\n\n")
    rest = "\n\n".join(b for b in blocks if not re.match(r"Handle 0x\w+, DMI type 9,", b))
    info = parse_dmidecode(rest, "noslots.txt")
    assert info.slots == ()
    assert info.populated_sockets == 2 and len(info.onboard) == 6


# ---------------------------------------------------------------------------
# type line variants
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_line", "extra", "width", "physical", "gen", "form"),
    [
        ("x16 PCI Express 3", "", 16, None, 3, "cem"),
        ("x4 PCI Express 3 SFF-8639 (U.2)", "", 4, None, 3, "u.2"),
        ("x4 PCI Express 4 SFF-8639 (U.2)", "", 4, None, 4, "u.2"),
        ("x16 PCI Express 5", "", 16, None, 5, "cem"),
        ("x16 PCI Express 5 x16", "", 16, 16, 5, "cem"),
        ("x8 PCI Express 5 x16", "", 8, 16, 5, "cem"),
        ("PCI Express 4 x16", "", 16, 16, 4, "cem"),
        ("PCI Express 4 x16", "Data Bus Width: x8", 8, 16, 4, "cem"),
        ("PCI Express 4", "Data Bus Width: x16", 16, None, 4, "cem"),
        ("PCI Express 4", "Data Bus Width: 16x or x16", 16, None, 4, "cem"),
        ("PCI Express 4", "Data Bus Width: 16x / x16", 16, None, 4, "cem"),
        ("PCI Express", "Data Bus Width: x4\nSlot Physical Width: x16", 4, 16, None, "cem"),
        ("x16 PCI Express", "", 16, None, None, "cem"),  # no generation given
        ("x8 PCI Express 2 x8", "", 8, 8, 2, "cem"),
        ("x16 PCI Express x16", "", 16, 16, None, "cem"),
        ("PCI Express Gen 2 x8", "", 8, 8, 2, "cem"),
        ("x16 PCI Express 6+", "", 16, None, 6, "cem"),
        ("x16 PCI Express", "PCI Express Generation: 4", 16, None, 4, "cem"),
        ("x8 <OUT OF SPEC>", "Data Bus Width: 11", 8, None, None, "other"),
        ("<OUT OF SPEC>", "Data Bus Width: 11", 8, None, None, "other"),  # SMBIOS code 0x0B = x8
        ("Other", "", None, None, None, "other"),
        ("Unknown", "", None, None, None, "other"),
        ("x4 M.2 Socket 3", "", 4, None, None, "m.2"),
        ("x1 M.2 Socket 1-DP", "", 1, None, None, "m.2"),
        ("x2 M.2 Socket 2", "", 2, None, None, "m.2"),
        ("x16 OCP NIC 3.0 Small Form Factor (SFF)", "", 16, None, None, "ocp"),
        ("x16 OCP NIC 3.0 Large Form Factor (LFF)", "", 16, None, None, "ocp"),
        ("x4 I/O Riser Card", "", 4, None, None, "other"),
        ("32-bit PCI", "", None, None, None, "other"),
        ("64-bit PCI-X", "", None, None, None, "other"),
        ("32-bit PCI Express", "", None, None, None, "cem"),
        ("x1 PCI Express Mini 52-pin with bottom-side keep-outs", "", 1, None, None, "other"),
        ("x4 EDSFF E1", "", 4, None, None, "other"),
    ],
)
def test_slot_type_variants(type_line, extra, width, physical, gen, form):
    s = slot(f"Designation: SLOT\nType: {type_line}\nCurrent Usage: Available\nLength: Long\n{extra}")
    assert (s.width_lanes, s.physical_width_lanes, s.pcie_gen, s.form_factor) == (width, physical, gen, form)


@pytest.mark.parametrize(
    ("designation", "type_line", "length", "form"),
    [
        ("M.2_1", "x4 PCI Express 3", "Short", "m.2"),
        ("M2_SLOT", "x4 PCI Express 4", "Other", "m.2"),
        ("OCP 3.0 Mezz", "x16 PCI Express 4", "Other", "ocp"),
        ("NVMe U.2 Bay 0", "x4 PCI Express 4", "Other", "u.2"),
        ("Front Bay 3", "x4 PCI Express 4", '2.5" drive form factor', "u.2"),
        ("RISER_SLOT_1(PCIe x32)", "x8 <OUT OF SPEC>", "Long", "cem"),
        ("PCIE6", "x16 PCI Express 4", "Long", "cem"),
        ("GPU 1", "x16 PCI Express 5 x16", "Other", "other"),  # an SXM socket, not a card slot
        ("Slot 9", "Other", "Other", "other"),
    ],
)
def test_form_factor_from_designation_and_length(designation, type_line, length, form):
    s = slot(f"Designation: {designation}\nType: {type_line}\nLength: {length}")
    assert s.form_factor == form


@pytest.mark.parametrize(
    ("usage", "in_use"),
    [("In Use", True), ("Available", False), ("Unavailable", False), ("Unknown", None), ("Other", None)],
)
def test_current_usage(usage, in_use):
    assert slot(f"Designation: S\nType: x16 PCI Express 4\nCurrent Usage: {usage}").in_use is in_use


def test_bus_address_is_normalised():
    assert slot("Designation: S\nBus Address: 0000:AF:00.0").bus_address == "0000:af:00.0"
    assert slot("Designation: S\nBus Address: 0001:3b:1f.7").bus_address == "0001:3b:1f.7"
    # SMBIOS spells "no bus" as all ones
    assert slot("Designation: S\nBus Address: ffff:ff:1f.7").bus_address is None
    assert slot("Designation: S\nBus Address: 0000:ff:1f.7").bus_address is None


@pytest.mark.parametrize("bad", ["0000:88:00", "zz:88:00.0", "0000:88:20.0", "0000:88:00.8", "88"])
def test_a_garbled_bus_address_is_a_parse_error_on_its_line(bad):
    with pytest.raises(ParseError) as exc:
        slot(f"Designation: S\nType: x4 PCI Express 3\nBus Address: {bad}", "bad.txt")
    assert exc.value.source == "bad.txt" and exc.value.line == 5
    assert "bus address" in exc.value.expected


# ---------------------------------------------------------------------------
# not dmidecode
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machine", "filename"),
    [
        (DELL, "lspci-vvnn.txt"),
        (HPE, "lspci-vvnn.txt"),
        ("dgx-a100-class-8x-a100-sxm-2x-epyc7742-topo", "nvidia-smi-topo.txt"),
        ("nvidia-dgx2h-hwloc", "hwloc.xml"),
        ("aws-p4d-24xlarge-nccl", "nccl-topo.xml"),
        ("asus-esc8000a-e12-epyc9374f-stelline", "lspci-tv.txt"),
        ("asus-esc8000a-e12-epyc9374f-stelline", "lscpu.txt"),
    ],
)
def test_other_captures_are_refused_with_source_and_line(machine, filename):
    text = fixture_text(machine, filename)
    with pytest.raises(ParseError) as exc:
        parse_dmidecode(text, filename)
    assert exc.value.source == filename
    assert str(exc.value).startswith(f"{filename}:")
    assert exc.value.line is not None and exc.value.line >= 1


@pytest.mark.parametrize(
    "text",
    ["", "   \n\n", "hello world\n", "\tindented: but no record\n",
     "# dmidecode 3.4\n# No SMBIOS nor DMI entry point found, sorry.\n",
     "Handle 0x0900, DMI type 9, 17 bytes\n",  # a header and nothing else
     "Handle 0x09, DMI type\nSystem Slot Information\n"],
)
def test_empty_or_recordless_text_is_refused(text):
    with pytest.raises(ParseError) as exc:
        parse_dmidecode(text, "x.txt")
    assert exc.value.source == "x.txt"


def test_binary_input_is_refused(tmp_path):
    with pytest.raises(ParseError):
        parse_dmidecode("Handle 0x0900, DMI type 9, 17 bytes\x00\x01", "bin")
    p = tmp_path / "dump.bin"
    p.write_bytes(b"\x7fELF\x02\x01\x00\x00garbage")
    with pytest.raises(ParseError) as exc:
        read_text(p)
    assert exc.value.source == str(p)
    p.write_bytes(b"Handle 0x0900, DMI type 9, 17 bytes\n\xff\x01\x02\n")
    with pytest.raises(ParseError):
        read_text(p)
    with pytest.raises(ParseError):
        read_text(tmp_path / "missing.txt")


def test_truncated_slot_record_is_refused_on_its_last_line(dell_text):
    lines = dell_text.splitlines()
    cut = next(i for i, ln in enumerate(lines) if ln == "\tDesignation: PCIe SSD Slot 8 in Bay 1")
    with pytest.raises(ParseError) as info:
        parse_dmidecode("\n".join(lines[: cut + 2]), "cut.txt")  # up to the Type line
    err = info.value
    assert (err.source, err.line) == ("cut.txt", cut + 2)
    assert "Current Usage, Length" in err.expected and "type 9" in err.expected
    assert "cut short" in str(err)


def test_truncation_anywhere_never_crashes(dell_text):
    lines = dell_text.splitlines()
    for n in range(0, len(lines), 7):
        try:
            parse_dmidecode("\n".join(lines[:n]), "cut.txt")
        except ParseError as exc:
            assert exc.source == "cut.txt"


# ---------------------------------------------------------------------------
# property tests: only ParseError (or a valid result) may come out
# ---------------------------------------------------------------------------


def _check(text: str) -> None:
    info = parses_or_refuses(parse_dmidecode, text, "fuzz.txt")
    if info is None:
        return
    assert isinstance(info, DmiInfo)
    for s in info.slots:
        assert s.form_factor in {"u.2", "m.2", "cem", "ocp", "other"}
        assert s.width_lanes is None or s.width_lanes in {1, 2, 4, 8, 12, 16, 32}
        assert s.bus_address is None or re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]",
                                                     s.bus_address)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=400))
def test_random_text(text):
    _check(text)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes(data):
    _check(data.decode("latin-1"))


_DMI_ALPHABET = st.sampled_from(list("Handle 0x09, DMI type 9 bytes\n\tSystem Slot:.-x16PCIExpress3U2M"))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(_DMI_ALPHABET, max_size=40), max_size=12).map("\n".join))
def test_dmidecode_like_noise(text):
    _check(text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_real_dumps(dell_text, hpe_text, data):
    text = data.draw(st.sampled_from([dell_text, hpe_text]))
    lines = text.splitlines()
    # work on a window around the slot records so that mutations hit them often
    first = next(i for i, ln in enumerate(lines) if "DMI type 9," in ln)
    lo = data.draw(st.integers(0, first))
    hi = data.draw(st.integers(first + 1, len(lines)))
    window = "\n".join(lines[lo:hi])
    _check(data.draw(mutated_text([window], None, ("delete", "duplicate", "cut", "flip", "dedent", "swap"),
                                  times=(1, 6))))


# ---------------------------------------------------------------------------
# the join, on hand-made trees
# ---------------------------------------------------------------------------


def root(addr, sec, *, numa=0, slot=None, cap=(4, 16)):
    return PciFunction(addr, class_code="0604", is_bridge=True, secondary_bus=sec,
                       subordinate_bus=sec, numa_node=numa, port_type="root", slot=slot, link_cap=cap)


def nvme(addr, numa=0, cap=(4, 4)):
    return PciFunction(addr, class_code="0108", vendor_id="8086", device_id="0a54",
                       name="NVMe SSD", numa_node=numa, link_cap=cap)


def gpu(addr, numa=0, cap=(4, 16)):
    return PciFunction(addr, class_code="0302", vendor_id="10de", name="A100", numa_node=numa,
                       link_cap=cap)


def dmi(*slots: DmiSlot, onboard: tuple[DmiOnboardDevice, ...] = ()) -> DmiInfo:
    return DmiInfo(slots=slots, onboard=onboard)


def u2(designation, addr, in_use, handle="0x0905"):
    return DmiSlot(designation, "PCI Express 3 SFF-8639 (U.2)", 4, 3, "u.2", '2.5" drive form factor',
                   "In Use" if in_use else "Available", in_use, addr, None, handle)


def card(designation, addr, in_use=True, width=16, gen=4, handle="0x0900"):
    return DmiSlot(designation, f"PCI Express {gen}", width, gen, "cem", "Long",
                   "In Use" if in_use else "Available", in_use, addr, 1, handle)


def slots_of(topo):
    return topo.nodes(NodeKind.SLOT)


def test_device_without_slot_gets_a_slot_node_between_it_and_its_parent():
    fns = [root("0000:00:01.0", 1, cap=(4, 16)), gpu("0000:01:00.0", cap=(4, 16))]
    topo = build_pci_topology(fns, name="toy")
    before = [(lk.src, lk.dst) for lk in topo.links()]
    merged = apply_dmi_slots(topo, dmi(card("SLOT1", "0000:01:00.0", width=16, gen=5)))
    (s,) = slots_of(merged)
    assert merged.parent("pci:0000:01:00.0").id == s.id
    assert merged.parent(s.id).id == "socket0"
    assert merged.link_between("socket0", "pci:0000:01:00.0") is None
    up, down = merged.link_between("socket0", s.id), merged.link_between(s.id, "pci:0000:01:00.0")
    assert (up.pcie_gen, up.lanes) == (4, 16)  # the parent link's generation, the slot's width
    assert (down.pcie_gen, down.lanes) == (4, 16)  # the original link
    assert down.bytes_per_s == topo.link_between("socket0", "pci:0000:01:00.0").bytes_per_s
    assert s.attrs["designation"] == "SLOT1" and s.attrs["in_use"] is True
    assert s.attrs["source"] == "dmidecode" and s.attrs["bus_address"] == "0000:01:00.0"
    assert s.attrs["form_factor"] == "cem" and s.attrs["pcie_gen"] == 5
    # the input is not touched
    assert [(lk.src, lk.dst) for lk in topo.links()] == before and not slots_of(topo)
    # the graph edges follow the links
    assert not merged.graph.has_edge("socket0", "pci:0000:01:00.0")
    assert merged.graph.edges[s.id, "pci:0000:01:00.0"]["bytes_per_s"] == down.bytes_per_s


def test_slot_node_width_narrower_than_the_device_link():
    fns = [root("0000:00:01.0", 1, cap=(3, 16)), gpu("0000:01:00.0", cap=(3, 16))]
    merged = apply_dmi_slots(build_pci_topology(fns), dmi(card("X8 SLOT", "0000:01:00.0", width=8, gen=3)))
    (s,) = slots_of(merged)
    assert merged.link_between("socket0", s.id).lanes == 8


def test_device_under_a_sltcap_slot_enriches_that_slot():
    fns = [root("0000:85:02.0", 0x88, numa=1, slot="168", cap=(3, 4)), nvme("0000:88:00.0", numa=1, cap=(3, 4))]
    topo = build_pci_topology(fns)
    assert [s.id for s in slots_of(topo)] == ["slot:0000:85:02.0"]
    merged = apply_dmi_slots(topo, dmi(u2("PCIe SSD Slot 8 in Bay 1", "0000:88:00.0", True)))
    (s,) = slots_of(merged)
    assert s.id == "slot:0000:85:02.0"
    assert s.name == "slot PCIe SSD Slot 8 in Bay 1"
    assert s.attrs["designation"] == "PCIe SSD Slot 8 in Bay 1"
    assert s.attrs["pci_slot"] == "168" and s.attrs["port"] == "0000:85:02.0"
    assert (s.attrs["form_factor"], s.attrs["width_lanes"], s.attrs["in_use"]) == ("u.2", 4, True)
    assert s.attrs["source"] == "lspci+dmidecode"
    assert merged.parent("pci:0000:88:00.0").id == s.id
    assert len(merged.links()) == len(topo.links())


def test_empty_sltcap_slot_found_through_the_bridge_secondary_bus():
    fns = [root("0000:85:00.0", 0x86, numa=1, slot="166", cap=(3, 4)),
           root("0000:85:02.0", 0x88, numa=1, slot="168", cap=(3, 4)), nvme("0000:88:00.0", numa=1)]
    topo = build_pci_topology(fns)
    info = dmi(u2("PCIe SSD Slot 6 in Bay 1", "0000:86:00.0", False, "0x0903"))
    merged = apply_dmi_slots(topo, info, functions=fns)
    s = merged.node("slot:0000:85:00.0")
    assert s.attrs["designation"] == "PCIe SSD Slot 6 in Bay 1"
    assert s.attrs["in_use"] is False and s.attrs["bus_address"] == "0000:86:00.0"
    assert len(slots_of(merged)) == 2
    # the tree builder records each port's secondary bus, so the functions are not needed
    alone = apply_dmi_slots(topo, info)
    assert len(slots_of(alone)) == 2
    assert alone.node("slot:0000:85:00.0").attrs["designation"] == "PCIe SSD Slot 6 in Bay 1"
    assert not any(n.startswith("unplaced slot") for n in alone.notes)


def test_secondary_bus_recorded_on_the_slot_node_is_enough():
    fns = [root("0000:85:00.0", 0x86, numa=1, slot="166", cap=(3, 4))]
    topo = build_pci_topology(fns)
    s0 = topo.node("slot:0000:85:00.0")
    topo.replace_node(s0.with_attrs(secondary_bus=0x86))
    merged = apply_dmi_slots(topo, dmi(u2("Bay 6", "0000:86:00.0", False)))
    assert merged.node("slot:0000:85:00.0").attrs["designation"] == "Bay 6"


def test_bios_giving_the_port_address_matches_that_ports_slot():
    fns = [root("0000:00:01.0", 1, slot="1"), gpu("0000:01:00.0")]
    merged = apply_dmi_slots(build_pci_topology(fns), dmi(card("PCIEX16_1", "0000:00:01.0", False)))
    s = merged.node("slot:0000:00:01.0")
    assert s.attrs["designation"] == "PCIEX16_1"
    assert s.attrs["in_use"] is True  # lspci saw a device in it, whatever the BIOS says


def test_empty_slot_on_a_port_without_sltcap_goes_under_the_switch_or_socket():
    fns = [
        root("0000:00:01.0", 1, numa=0, cap=(4, 16)),
        PciFunction("0000:01:00.0", class_code="0604", is_bridge=True, port_type="upstream",
                    secondary_bus=2, subordinate_bus=4, link_cap=(4, 16), numa_node=0),
        PciFunction("0000:02:00.0", class_code="0604", is_bridge=True, port_type="downstream",
                    secondary_bus=3, subordinate_bus=3, link_cap=(4, 16), numa_node=0),
        PciFunction("0000:02:01.0", class_code="0604", is_bridge=True, port_type="downstream",
                    secondary_bus=4, subordinate_bus=4, link_cap=(4, 16), numa_node=0),
        gpu("0000:03:00.0"),
        root("0000:40:01.1", 0x41, numa=1, cap=(5, 16)),
        root("0000:40:03.1", 0x42, numa=1, cap=(5, 16)), nvme("0000:42:00.0", numa=1),
    ]
    topo = build_pci_topology(fns)
    info = dmi(card("SW SLOT B", "0000:04:00.0", False, handle="0x0010"),
               card("Riser 2", "0000:41:00.0", False, gen=5, handle="0x0011"))
    merged = apply_dmi_slots(topo, info, functions=fns)
    by_name = {s.attrs["designation"]: s for s in slots_of(merged)}
    assert merged.parent(by_name["SW SLOT B"].id).id == "switch:0000:01:00.0"
    assert merged.parent(by_name["Riser 2"].id).id == "socket1"
    assert merged.link_between("socket1", by_name["Riser 2"].id).pcie_gen == 5
    assert by_name["Riser 2"].attrs["in_use"] is False and not merged.children(by_name["Riser 2"].id)


def test_empty_slot_with_nothing_to_go_on_is_only_a_note():
    fns = [root("0000:00:01.0", 1), gpu("0000:01:00.0")]
    topo = build_pci_topology(fns)
    merged = apply_dmi_slots(topo, dmi(card("M.2 slot", "0000:07:00.0", False)))
    assert not slots_of(merged)
    assert any("unplaced slot 'M.2 slot' (0000:07:00.0)" in n for n in merged.notes)


def test_slot_without_bus_address_is_a_parentless_slot_node_and_a_note():
    fns = [root("0000:00:01.0", 1), gpu("0000:01:00.0")]
    info = dmi(card("PCIe Slot 1", None, False, handle="0x0900"),
               card("PCIe Slot 2", None, False, handle="0x0901"))
    merged = apply_dmi_slots(build_pci_topology(fns), info)
    got = slots_of(merged)
    assert [s.attrs["designation"] for s in got] == ["PCIe Slot 1", "PCIe Slot 2"]
    assert [s.id for s in got] == ["slot:dmi:0x0900", "slot:dmi:0x0901"]
    for s in got:
        assert s.attrs["placement"] == "unknown" and merged.parent(s.id) is None
        assert s.attrs["bus_address"] is None and s.attrs["source"] == "dmidecode"
    assert any("PCIe Slot 1, PCIe Slot 2" in n and "placement unknown" in n for n in merged.notes)


def test_two_dmi_records_for_one_device_do_not_make_two_slots():
    fns = [root("0000:00:01.0", 1), gpu("0000:01:00.0")]
    info = dmi(card("A", "0000:01:00.0", handle="0x0001"), card("B", "0000:01:00.0", handle="0x0002"))
    merged = apply_dmi_slots(build_pci_topology(fns), info)
    (s,) = slots_of(merged)
    assert s.attrs["designation"] == "A"
    assert any("'A' and 'B'" in n for n in merged.notes)


def test_a_switch_card_in_a_slot():
    fns = [
        root("0000:00:01.0", 1, cap=(4, 16)),
        PciFunction("0000:01:00.0", class_code="0604", is_bridge=True, port_type="upstream",
                    secondary_bus=2, subordinate_bus=3, link_cap=(4, 16), numa_node=0),
        PciFunction("0000:02:00.0", class_code="0604", is_bridge=True, port_type="downstream",
                    secondary_bus=3, subordinate_bus=3, link_cap=(4, 4), numa_node=0),
        nvme("0000:03:00.0"),
    ]
    merged = apply_dmi_slots(build_pci_topology(fns), dmi(card("RISER", "0000:01:00.0")))
    (s,) = slots_of(merged)
    assert merged.parent("switch:0000:01:00.0").id == s.id
    assert merged.parent(s.id).id == "socket0"
    assert merged.socket_of("pci:0000:03:00.0").id == "socket0"


def test_multi_function_device_found_by_any_function_and_onboard_marking():
    fns = [root("0000:17:02.0", 0x19), PciFunction("0000:19:00.0", class_code="0200", name="X540"),
           PciFunction("0000:19:00.1", class_code="0200", name="X540")]
    topo = build_pci_topology(fns)
    info = dmi(card("NIC SLOT", "0000:19:00.1"),
               onboard=(DmiOnboardDevice("Integrated NIC 3", "Ethernet", True, 3, "0000:19:00.0"),
                        DmiOnboardDevice("Integrated NIC 4", "Ethernet", True, 4, "0000:19:00.1")))
    merged = apply_dmi_slots(topo, info)
    nic = merged.node("pci:0000:19:00.0")
    assert merged.parent(nic.id).kind == NodeKind.SLOT
    assert nic.attrs["onboard"] is True
    assert nic.attrs["onboard_designations"] == ["Integrated NIC 3", "Integrated NIC 4"]


def test_no_slots_changes_nothing():
    topo = build_pci_topology([root("0000:00:01.0", 1, slot="1"), gpu("0000:01:00.0")])
    merged = apply_dmi_slots(topo, DmiInfo())
    assert merged is not topo
    assert [n.id for n in merged.nodes()] == [n.id for n in topo.nodes()]
    assert [lk.key for lk in merged.links()] == [lk.key for lk in topo.links()]
    assert merged.notes == topo.notes


def test_other_links_survive_the_relink():
    fns = [root("0000:00:01.0", 1), gpu("0000:01:00.0"), root("0000:00:02.0", 2), gpu("0000:02:00.0")]
    topo = build_pci_topology(fns)
    topo.add_link(Link("pci:0000:01:00.0", "pci:0000:02:00.0", LinkKind.NVLINK, 300e9,
                       bandwidth_source="spec"))
    merged = apply_dmi_slots(topo, dmi(card("S1", "0000:01:00.0")))
    assert merged.link_between("pci:0000:01:00.0", "pci:0000:02:00.0").kind == LinkKind.NVLINK
    assert len(merged.links()) == len(topo.links()) + 1
    assert merged.notes == topo.notes and merged.sources == topo.sources


# ---------------------------------------------------------------------------
# the join on the real pairs (needs planner.topology.lspci.parse)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lspci():
    return pytest.importorskip("planner.topology.lspci.parse")


def merged_machine(lspci, machine, with_functions=True):
    path = topology_fixture(machine, "lspci-vvnn.txt")
    text = read_text(path)
    fns = lspci.parse_lspci_verbose(text, str(path))
    topo = lspci.topology_from_lspci(verbose_texts=[(text, str(path))], source=str(path))
    info = parse_dmidecode(fixture_text(machine), f"{machine}/dmidecode.txt")
    return topo, apply_dmi_slots(topo, info, functions=fns if with_functions else ())


def test_dell_merged_topology_has_eleven_slot_nodes(lspci):
    topo, merged = merged_machine(lspci, DELL)
    slots = slots_of(merged)
    assert len(slots) == 11
    assert merged.counts()["slot"] == 11
    by_name = {s.attrs["designation"]: s for s in slots}
    assert len(by_name) == 11  # no duplicates
    s8 = by_name["PCIe SSD Slot 8 in Bay 1"]
    assert s8.attrs["bus_address"] == "0000:88:00.0" and s8.attrs["in_use"] is True
    assert [c.id for c in merged.children(s8.id)] == ["pci:0000:88:00.0"]
    assert merged.children(s8.id)[0].kind == NodeKind.NVME
    s9 = by_name["PCIe SSD Slot 9 in Bay 1"]
    assert [c.id for c in merged.children(s9.id)] == ["pci:0000:89:00.0"]
    ports = {8: "0000:85:02.0", 9: "0000:85:03.0", 6: "0000:85:00.0", 7: "0000:85:01.0",
             4: "0000:ae:00.0", 5: "0000:ae:01.0", 2: "0000:ae:02.0", 3: "0000:ae:03.0"}
    for n, port in ports.items():
        s = by_name[f"PCIe SSD Slot {n} in Bay 1"]
        assert s.id == f"slot:{port}" and s.attrs["port"] == port
        assert s.attrs["form_factor"] == "u.2" and s.attrs["width_lanes"] == 4
        assert s.attrs["source"] == "lspci+dmidecode"
        assert merged.socket_of(s.id).id == "socket1"
        if n not in (8, 9):
            assert s.attrs["in_use"] is False and not merged.children(s.id)
    assert {s.attrs["bus_address"] for s in slots if s.attrs["in_use"] is False} >= {
        "0000:86:00.0", "0000:87:00.0", "0000:af:00.0", "0000:b0:00.0", "0000:b1:00.0", "0000:b2:00.0"}
    for n in (1, 2, 3):
        s = by_name[f"PCIe Slot {n}"]
        assert s.attrs["placement"] == "unknown" and merged.parent(s.id) is None
        assert (s.attrs["form_factor"], s.attrs["width_lanes"], s.attrs["pcie_gen"]) == ("cem", 16, 3)
    assert merged.counts()["nvme"] == 2 and merged.counts()["socket"] == 2
    assert topo.counts()["slot"] == 8


def test_dell_count_rule_holds_without_the_functions_too(lspci):
    _, merged = merged_machine(lspci, DELL, with_functions=False)
    assert merged.counts()["slot"] == 11
    assert merged.node("slot:0000:85:02.0").attrs["designation"] == "PCIe SSD Slot 8 in Bay 1"


def test_dell_onboard_nics_are_marked(lspci):
    _, merged = merged_machine(lspci, DELL)
    assert merged.find("0000:01:00.0").attrs["onboard_designations"] == [
        "Integrated NIC 1", "Integrated NIC 2"]
    assert merged.find("0000:19:00.1").attrs["onboard"] is True


HPE_DEVICE_SLOTS = {
    "0000:04:00.0": "Slot 7 - GPU 3", "0000:64:00.0": "Slot 8 - GPU 4",
    "0000:84:00.0": "Slot 5 - GPU 1", "0000:e4:00.0": "Slot 6 - GPU 2",
    "0000:05:00.0": "Slot 100 - NVMe SSD 1", "0000:65:00.0": "Slot 101 - NVMe SSD 2",
    "0000:03:00.0": "Slot 1 - PCIE slot 1", "0000:83:00.0": "Slot 3 - PCIE slot 3",
    "0000:21:00.0": "Slot 9 - Onboard OCP NIC", "0000:c1:00.0": "Slot 11 - HPE NS204",
}


def test_hpe_devices_sit_in_their_dmi_slots(lspci):
    _, merged = merged_machine(lspci, HPE)
    for addr, designation in HPE_DEVICE_SLOTS.items():
        dev = merged.find(addr)
        assert dev is not None, addr
        s = merged.parent(dev.id)
        assert s.kind == NodeKind.SLOT, addr
        assert s.attrs["designation"] == designation
        assert s.attrs["in_use"] is True
    gpu3 = merged.parent("pci:0000:04:00.0")
    assert merged.parent(gpu3.id).kind == NodeKind.SWITCH
    assert (gpu3.attrs["width_lanes"], gpu3.attrs["pcie_gen"], gpu3.attrs["form_factor"]) == (16, 5, "other")
    assert merged.counts()["gpu"] == 4 and merged.counts()["switch"] == 4


def test_hpe_every_dmi_slot_is_joined_once(lspci):
    topo, merged = merged_machine(lspci, HPE)
    # the 3 empty slots sit on root ports without SltCap slot numbers: new nodes
    assert merged.counts()["slot"] == topo.counts()["slot"] + 3 == 17
    names = [s.attrs.get("designation") for s in slots_of(merged) if s.attrs.get("dmi_handle")]
    assert sorted(names) == sorted(HPE_SLOTS)
    assert not [n for n in merged.notes if n.startswith("unplaced slot")]
    for designation in ("Slot 13 - M.2 slot", "Slot 10 - Riser 2", "Slot 12 - HPE MR416"):
        s = next(s for s in slots_of(merged) if s.attrs.get("designation") == designation)
        assert s.attrs["in_use"] is False and not merged.children(s.id)
        assert merged.socket_of(s.id) is not None
