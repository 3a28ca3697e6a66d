"""Slots, processors and onboard devices from ``dmidecode`` output.

``dmidecode -t 9`` (``-t slot``) lists a machine's physical slots and bays
with their designation, type, width, length, usage and — since SMBIOS 2.6 —
the PCI address of what sits in them; a whole ``dmidecode`` dump adds the
system name (type 1), the processor sockets (type 4) and the onboard devices
(type 41). :func:`parse_dmidecode` reads any of these; :func:`apply_dmi_slots`
joins the slots to a PCI tree built by :mod:`planner.topology.pcitree`.

>>> text = '''# dmidecode 3.4
... Handle 0x0905, DMI type 9, 17 bytes
... System Slot Information
... \\tDesignation: PCIe SSD Slot 8 in Bay 1
... \\tType: x4 PCI Express 3 SFF-8639 (U.2)
... \\tCurrent Usage: In Use
... \\tLength: 2.5" drive form factor
... \\tID: 8
... \\tBus Address: 0000:88:00.0
... '''
>>> slot = parse_dmidecode(text, "dmidecode.txt").slots[0]
>>> slot.width_lanes, slot.pcie_gen, slot.form_factor, slot.in_use, slot.bus_address
(4, 3, 'u.2', True, '0000:88:00.0')

Form factor
-----------
:attr:`DmiSlot.form_factor` is one of ``"u.2"``, ``"m.2"``, ``"cem"``,
``"ocp"`` or ``"other"``, decided by the first rule that applies:

1. the slot type names it: ``SFF-8639 (U.2)`` → ``u.2``, ``M.2 Socket …`` →
   ``m.2``, ``OCP NIC …`` → ``ocp``;
2. the designation names it (BIOSes often give a plain PCI Express type or
   ``<OUT OF SPEC>`` for such slots): ``M.2``/``M2`` → ``m.2``, ``OCP`` →
   ``ocp``, ``U.2``/``SFF-8639`` → ``u.2``;
3. the length is a drive form factor (``2.5"``/``3.5" drive form factor``)
   → ``u.2`` (a drive bay);
4. a PCI Express slot type (or ``<OUT OF SPEC>`` with a designation that
   says PCIe) → ``cem``, a standard add-in card slot — unless the length is
   ``Other``: card slots have a card length (short/long), so a PCI Express
   "slot" of length Other is a socket on a board (an SXM GPU socket on an
   HGX baseboard, say) → ``other``;
5. anything else (PCI, PCI-X, riser cards, mini PCIe, EDSFF, Other) →
   ``other``.

Widths
------
``Type: x16 PCI Express 5 x16`` carries two widths: the leading one is the
slot's data bus (electrical) width, the trailing one the slot type's
physical width (SMBIOS has slot types "PCI Express 5 x16" etc.).
:attr:`DmiSlot.width_lanes` is the electrical width: the leading width,
else a ``Data Bus Width:`` line (printed on its own line by newer
dmidecode, as ``x16``, ``16x or x16`` or the raw SMBIOS code, 0x08–0x0E =
x1…x32), else the physical width. ``Type: PCI Express 4 x16`` therefore
gives 16 lanes.

This module is long (reading records, checking a dump is whole, interpreting
slots, processors and onboard devices, joining slots to a PCI tree) because
each part needs the others' records and conventions; the join is
:func:`apply_dmi_slots` and its ``_Join`` class, at the end.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from planner.errors import ParseError, TopologyError
from planner.topology.model import DEVICE_KINDS, Link, Node, NodeKind, Topology
from planner.topology.pcitree import PciFunction, normalize_address, split_address
from planner.topology.textio import guess_format, read_text, text_lines

__all__ = [
    "DmiInfo",
    "DmiOnboardDevice",
    "DmiProcessor",
    "DmiSlot",
    "apply_dmi_slots",
    "parse_dmidecode",
    "read_text",
]


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DmiSlot:
    """One System Slot (DMI type 9) record.

    ``width_lanes`` is the electrical width in lanes and
    ``physical_width_lanes`` the connector's width (``None`` when not
    given); ``pcie_gen`` is the PCIe generation the slot type names
    (``None`` for a plain "PCI Express" type, which says nothing about the
    generation). ``in_use`` is ``True`` for "In Use", ``False`` for
    "Available" or "Unavailable", ``None`` otherwise. ``bus_address`` is the
    normalised PCI address (``0000:88:00.0``) of the device in the slot, or
    where it would be; ``None`` when the BIOS gives none. ``handle`` is the
    record's DMI handle (``"0x0905"``), ``line`` the 1-based line of its
    header in the source text.
    """

    designation: str
    slot_type: str | None = None
    width_lanes: int | None = None
    pcie_gen: int | None = None
    form_factor: str = "other"
    length: str | None = None
    current_usage: str | None = None
    in_use: bool | None = None
    bus_address: str | None = None
    slot_id: int | None = None
    handle: str | None = None
    physical_width_lanes: int | None = None
    line: int | None = None


@dataclass(frozen=True)
class DmiProcessor:
    """One Processor Information (DMI type 4) record: a CPU socket.

    ``populated`` is ``True`` when the status says a CPU is in the socket;
    ``max_speed_mhz`` is in MHz; counts are ``None`` when not given.
    """

    socket_designation: str
    version: str | None = None
    manufacturer: str | None = None
    status: str | None = None
    populated: bool = False
    core_count: int | None = None
    core_enabled: int | None = None
    thread_count: int | None = None
    max_speed_mhz: int | None = None
    handle: str | None = None


@dataclass(frozen=True)
class DmiOnboardDevice:
    """One onboard device: an Onboard Devices Extended Information (DMI type 41) record,
    or one device of an On Board Devices Information (type 10, obsolete) record.

    Type 10 gives no bus address and no instance: ``reference_designation``
    is then its ``Description``. Several type 10 devices share one handle.
    """

    reference_designation: str
    device_type: str | None = None
    enabled: bool | None = None
    type_instance: int | None = None
    bus_address: str | None = None
    handle: str | None = None
    dmi_type: int = 41


@dataclass(frozen=True)
class DmiInfo:
    """What a ``dmidecode`` output says about a machine's slots and sockets.

    A dump without type 9 records has ``slots == ()``; whether that is an
    error is the caller's decision.
    """

    system_vendor: str | None = None
    system_product: str | None = None
    processors: tuple[DmiProcessor, ...] = ()
    slots: tuple[DmiSlot, ...] = ()
    onboard: tuple[DmiOnboardDevice, ...] = ()
    dmidecode_version: str | None = None
    smbios_version: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def populated_sockets(self) -> int:
        """Number of processor sockets with a CPU in them."""
        return sum(1 for p in self.processors if p.populated)


# ---------------------------------------------------------------------------
# generic record reader
# ---------------------------------------------------------------------------

_HANDLE = re.compile(r"^Handle (0x[0-9A-Fa-f]{1,4}), DMI type (\d{1,3}), (\d{1,5}) bytes\.?$")
_BANNER = (
    re.compile(r"^#"),  # "# dmidecode 3.4", "# SMBIOS implementations newer than ..."
    re.compile(r"^(Getting SMBIOS data from|Scanning /dev/mem for|Reading SMBIOS/DMI data from|"
               r"Found SMBIOS entry point in)\b"),
    re.compile(r"^(SMBIOS|Legacy DMI|DMI) \d+\.\d+(\.\d+)? present\.$"),
    re.compile(r"^\d+ structures occupying \d+ bytes\.$"),
    re.compile(r"^Table at 0x[0-9A-Fa-f]+\.$"),
)
# dmidecode's complaints about a broken table; the records before them stand.
_WARNING = re.compile(
    r"^(Wrong DMI structures (count|length)|Invalid entry length|Invalid SMBIOS|SMBIOS version fixup|"
    r"Table is unreachable|Can't read|No SMBIOS nor DMI entry point found|"
    r"SMBIOS \d+\.\d+(\.\d+)? not supported|.*DMI table is broken)"
)
_STRUCTURES = re.compile(r"^(\d{1,6}) structures occupying \d+ bytes\.$")
_DMIDECODE_VERSION = re.compile(r"^# dmidecode (\d+\.\d+(?:\.\d+)?)")
_SMBIOS_VERSION = re.compile(r"^SMBIOS (\d+\.\d+(?:\.\d+)?) present\.$")
_MARKER = re.compile(r"^<[A-Z][A-Z ]*>$")
# A type 10 record lists every onboard device under a title of its own.
_ONBOARD_TITLE = re.compile(r"^On Board Device (\d+ )?Information$")
_FIELD = re.compile(r"^([^:]+):(?:[ \t]+(.*))?$")

#: record titles dmidecode prints, for ``dmidecode -q`` output (no Handle lines)
_TITLES = {
    "BIOS Information": 0, "System Information": 1, "Base Board Information": 2,
    "Chassis Information": 3, "Processor Information": 4,
    "Memory Controller Information": 5, "Memory Module Information": 6,
    "Cache Information": 7, "Port Connector Information": 8,
    "System Slot Information": 9, "On Board Device Information": 10,
    "OEM Strings": 11, "System Configuration Options": 12,
    "BIOS Language Information": 13, "Group Associations": 14,
    "System Event Log": 15, "Physical Memory Array": 16, "Memory Device": 17,
    "32-bit Memory Error Information": 18, "Memory Array Mapped Address": 19,
    "Memory Device Mapped Address": 20, "Built-in Pointing Device": 21,
    "Portable Battery": 22, "System Reset": 23, "Hardware Security": 24,
    "System Power Controls": 25, "Voltage Probe": 26, "Cooling Device": 27,
    "Temperature Probe": 28, "Electrical Current Probe": 29,
    "Out-of-band Remote Access": 30, "Boot Integrity Services Entry Point": 31,
    "System Boot Information": 32, "64-bit Memory Error Information": 33,
    "Management Device": 34, "Management Device Component": 35,
    "Management Device Threshold Data": 36, "Memory Channel": 37,
    "IPMI Device Information": 38, "System Power Supply": 39,
    "Additional Information": 40, "Onboard Device": 41,
    "Management Controller Host Interface": 42, "TPM Device": 43,
    "Processor Additional Information": 44, "Firmware Inventory Information": 45,
    "String Property": 46, "Inactive": 126, "End Of Table": 127,
}


@dataclass
class _Field:
    key: str
    value: str
    line: int
    items: list[str] = field(default_factory=list)


@dataclass
class _Record:
    handle: str | None
    dmi_type: int | None
    line: int  # of the Handle line, or of the title in -q output
    title: str | None = None
    fields: list[_Field] = field(default_factory=list)
    indent: str | None = None  # the indentation of its first-level fields
    item: bool = False  # a second or later item of a record that titles its items

    def get(self, key: str) -> _Field | None:
        for f in self.fields:
            if f.key == key:
                return f
        return None


def _records(text: str, source: str) -> tuple[list[_Record], dict[str, str], list[str]]:
    """Split dmidecode output into records; ParseError on anything that is not dmidecode."""
    nul = text.find("\x00")
    if nul >= 0:
        raise ParseError(source, text.count("\n", 0, nul) + 1, "dmidecode text output",
                         "binary data (a NUL byte)")
    sp = _Splitter(text, source)
    for no, raw in enumerate(text_lines(text), start=1):
        line = raw.rstrip()
        if not line and raw[:1] in (" ", "\t") and sp.cur is not None and not sp.want_title:
            continue  # an indented blank: a string of spaces in an OEM record's "Strings:" list
        if not line.strip():
            sp.blank()
        elif line[0] not in " \t":
            sp.top_line(no, line)
        else:
            sp.field_line(no, line)
    if sp.want_title and sp.records:
        rec = sp.records[-1]
        raise ParseError(source, rec.line, "a record title after the 'Handle ...' line",
                         "the end of the text: the capture is cut short")
    return sp.records, sp.meta, sp.warnings


class _Splitter:
    """dmidecode's lines into records, a line at a time."""

    def __init__(self, text: str, source: str) -> None:
        self.text, self.source = text, source
        self.records: list[_Record] = []
        self.meta: dict[str, str] = {}
        self.warnings: list[str] = []
        self.cur: _Record | None = None
        self.want_title = False  # the previous line was a Handle line
        self.after_blank = True
        self.seen_handle = False

    def blank(self) -> None:
        if self.want_title:
            self.records.pop()  # a Handle line and nothing else: a record cut short
            self.want_title = False
        self.cur, self.after_blank = None, True

    def top_line(self, no: int, line: str) -> None:
        """A line at the left margin: a record header or title, a banner, or dmidecode's own lines."""
        m = _HANDLE.match(line)
        if m:
            self.seen_handle = True
            self.cur = _Record(m.group(1).upper().replace("0X", "0x"), int(m.group(2)), no)
            self.records.append(self.cur)
            self.want_title, self.after_blank = True, False
            return
        if self.want_title and self.cur is not None:
            if _WARNING.match(line):  # "Invalid entry length (16). Fixed up to 11."
                self.warnings.append(f"{self.source}:{no}: {line.strip()}")
                return
            self.cur.title = line.strip()
            self.want_title, self.after_blank = False, False
            return
        if line.startswith("Handle "):
            raise ParseError(self.source, no, "a record header like 'Handle 0x0900, DMI type 9, 17 bytes'", line)
        if self.cur is not None and _same_title(self.cur.title, line.strip()):
            # Records that list several items title each one: "On Board Device 2
            # Information" (type 10), "Additional Information 2" (type 40).
            self.cur = _Record(self.cur.handle, self.cur.dmi_type, no, line.strip(), indent=self.cur.indent,
                               item=True)
            self.records.append(self.cur)
            return
        mv = _DMIDECODE_VERSION.match(line)
        if mv:
            self.meta.setdefault("dmidecode", mv.group(1))
        ms = _SMBIOS_VERSION.match(line)
        if ms:
            self.meta.setdefault("smbios", ms.group(1))
        mc = _STRUCTURES.match(line)
        if mc:
            self.meta.setdefault("structures", mc.group(1))
        if line.startswith("Table at 0x"):
            self.meta["full_dump"] = "yes"  # dmidecode prints it only without -t
        if any(p.match(line) for p in _BANNER):
            self.cur, self.after_blank = None, True
            return
        if _WARNING.match(line):
            self.warnings.append(f"{self.source}:{no}: {line.strip()}")
            self.cur, self.after_blank = None, True
            return
        title = line.strip()
        quiet_title = (title in _TITLES or bool(_ONBOARD_TITLE.match(title))
                       or (self.records and not self.seen_handle))
        if quiet_title and (self.after_blank or self.cur is None):
            # dmidecode -q prints records without their Handle line; once it is
            # clear that the text is such output, vendor (OEM) titles are let in too
            self.cur = _Record(None, 10 if _ONBOARD_TITLE.match(title) else _TITLES.get(title), no, title)
            self.records.append(self.cur)
            self.after_blank = False
            return
        raise ParseError(self.source, no, _expected_line(self.text, self.records), line)

    def field_line(self, no: int, line: str) -> None:
        """An indented line: a field of the current record."""
        if self.want_title and self.cur is not None and line.strip() in _TITLES:
            # dmidecode before 3.0 printed type 25's title indented ("\tSystem Power Controls")
            self.cur.title = line.strip()
            self.want_title, self.after_blank = False, False
            return
        if self.cur is None or self.want_title:
            raise ParseError(self.source, no, _expected_line(self.text, self.records, field=True), line)
        indent = line[: len(line) - len(line.lstrip())]
        body = line.strip()
        if self.cur.indent is None:
            self.cur.indent = indent
        if len(indent) > len(self.cur.indent) and self.cur.fields:
            self.cur.fields[-1].items.append(body)  # a list item or sub-attribute
        elif _MARKER.match(body):
            return  # dmidecode's "<TRUNCATED>" and the like
        else:
            m = _FIELD.match(body)
            if m:
                self.cur.fields.append(_Field(m.group(1).strip(), (m.group(2) or "").strip(), no))
            else:
                # real dumps hold bare values (a BIOS string where a field was): keep, unnamed
                self.cur.fields.append(_Field("", body, no))
        self.after_blank = False


def _same_title(title: str | None, line: str) -> bool:
    """Whether ``line`` titles the next item of a record titled ``title`` ("... 1 ..." → "... 2 ...")."""
    if not title or not re.search(r"\d", title) or line == title:
        return False
    return re.sub(r"\d+", "#", title) == re.sub(r"\d+", "#", line)


#: fields dmidecode prints for every record of a type this module reads, whatever
#: the firmware says (checked on 2,049 server dumps of linuxhw/DMI)
_ALWAYS = {
    1: ("Manufacturer", "Product Name"),
    4: ("Socket Designation", "Type", "Family"),
    9: ("Designation", "Type", "Current Usage", "Length"),
    10: ("Type", "Status", "Description"),
    41: ("Reference Designation", "Type", "Status", "Type Instance"),
}
_TABLE_WARNING = re.compile(r"DMI table is broken|Wrong DMI structures|Invalid entry length")


def _check_complete(text: str, records: list[_Record], meta: dict[str, str],
                    warnings: list[str], source: str) -> list[str]:
    """Refuse a dump that is certainly cut short; return warnings for one that may be.

    Certain: fewer records than the header's "N structures occupying"; a
    full dump (``Table at 0x...``) of an SMBIOS 3 table (no count) without
    its End Of Table record — both unless dmidecode itself complained about
    the table; a last record of a type read here without a field dmidecode
    always prints. Possible: the text does not end with the blank line
    dmidecode prints after every record (``dmidecode -t 9`` output cut
    between two fields).
    """
    lines = text_lines(text)
    last_no = max((i for i, ln in enumerate(lines, 1) if ln.strip()), default=1)
    broken_table = any(_TABLE_WARNING.search(w) for w in warnings)
    announced = int(meta.get("structures", "0"))
    handles = sum(1 for r in records if r.handle is not None and not r.item)
    out: list[str] = []
    last = records[-1]
    required = _ALWAYS.get(last.dmi_type or -1, ())
    missing = [k for k in required if last.get(k) is None]
    if missing and last.title is not None:
        raise ParseError(source, last_no,
                         f"the field(s) {', '.join(missing)} that dmidecode prints in every "
                         f"type {last.dmi_type} record",
                         f"the end of the text inside record {last.handle or last.title}: "
                         "the capture is cut short")
    if announced and handles < announced and not broken_table:
        raise ParseError(source, last_no, f"{announced} DMI records, as the header announces",
                         f"{handles} before the text ends: the capture is cut short")
    if (meta.get("full_dump") and not announced and not broken_table
            and not any(r.dmi_type == 127 for r in records)):
        # An SMBIOS 3 table announces no count: its End Of Table record closes it.
        raise ParseError(source, last_no, "the End Of Table record that closes a full dmidecode dump",
                         "the end of the text: the capture is cut short")
    if len(lines) - last_no < 2 and last.dmi_type in _ALWAYS:
        out.append(f"{source}:{last_no}: the text ends without the blank line dmidecode prints after "
                   f"every record: record {last.handle or last.title} may be cut short")
    return out


def _expected_line(text: str, records: list[_Record], field: bool = False) -> str:
    what = ("a field inside a DMI record (after a 'Handle ...' line and a title)" if field else
            "a dmidecode line ('Handle 0x0900, DMI type 9, 17 bytes', a record title or a banner)")
    if not records:
        guess = guess_format(text)
        if guess and "dmidecode" not in guess:
            what += f"; the input looks like {guess}, not dmidecode"
    return what


# ---------------------------------------------------------------------------
# interpreting records
# ---------------------------------------------------------------------------

_UNSET = {"", "not specified", "not present", "to be filled by o.e.m.", "default string",
          "unknown", "none", "n/a", "--", "not provided", "system product name",
          "system manufacturer"}

_BUS_ADDRESS = re.compile(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")
_LEAD_WIDTH = re.compile(r"^x(\d{1,2})\s+(.*)$")
_LEAD_BITS = re.compile(r"^(\d{1,3})-bit\s+(.*)$")
_PCIE = re.compile(r"PCI Express(?:\s+(?:Gen\s*)?(\d)\+?)?(?:\s+x(\d{1,2}))?", re.I)
_WIDTH_TEXT = re.compile(r"(?:^|\s|/)x(\d{1,2})\b|^(\d{1,2})x\b", re.I)

#: SMBIOS "slot data bus width" codes, which older dmidecode prints raw in
#: "Data Bus Width:" (SMBIOS 3.2 field): 0x08 = x1 ... 0x0E = x32
_WIDTH_CODE = {8: 1, 9: 2, 10: 4, 11: 8, 12: 12, 13: 16, 14: 32}
_LANE_WIDTHS = {1, 2, 4, 8, 12, 16, 32}


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    v = value.strip()
    return None if v.lower() in _UNSET else v


def _int(value: str | None) -> int | None:
    m = re.match(r"^\s*(\d{1,9})\b", value or "")
    return int(m.group(1)) if m else None


def _bus_address(f: _Field | None, source: str) -> str | None:
    if f is None:
        return None
    m = _BUS_ADDRESS.match(f.value)
    if not m:
        raise ParseError(source, f.line, "a bus address like '0000:88:00.0'", f.value)
    domain, bus, dev, fn = m.groups()
    if int(dev, 16) > 0x1F:
        raise ParseError(source, f.line, "a PCI device number 00..1f in the bus address", f.value)
    if domain.lower() in ("ffff", "0000ffff") or (bus.lower() == "ff" and dev.lower() == "1f" and fn == "7"):
        # SMBIOS marks "no bus" with all-ones segment/bus/devfn (0xff devfn = 1f.7)
        return None
    return normalize_address(f"{domain[-4:]}:{bus}:{dev}.{fn}")


def _width_of(text: str | None) -> int | None:
    """Lanes in a ``Data Bus Width`` / ``Slot Physical Width`` value."""
    if not text:
        return None
    t = text.strip()
    if t.isdigit():
        return _WIDTH_CODE.get(int(t))
    m = _WIDTH_TEXT.search(t)
    if not m:
        return None
    w = int(m.group(1) or m.group(2))
    return w if w in _LANE_WIDTHS else None


def _parse_slot_type(type_text: str | None) -> tuple[str | None, int | None, int | None, int | None]:
    """(slot type without the width, electrical lanes, physical lanes, PCIe generation).

    >>> _parse_slot_type("x16 PCI Express 3")
    ('PCI Express 3', 16, None, 3)
    >>> _parse_slot_type("x8 PCI Express 5 x16")
    ('PCI Express 5 x16', 8, 16, 5)
    >>> _parse_slot_type("PCI Express 4 x16")
    ('PCI Express 4 x16', None, 16, 4)
    >>> _parse_slot_type("x4 PCI Express 3 SFF-8639 (U.2)")
    ('PCI Express 3 SFF-8639 (U.2)', 4, None, 3)
    >>> _parse_slot_type("x16 <OUT OF SPEC>")
    ('<OUT OF SPEC>', 16, None, None)
    """
    if type_text is None:
        return None, None, None, None
    t = type_text.strip()
    lanes: int | None = None
    m = _LEAD_WIDTH.match(t)
    if m:
        w = int(m.group(1))
        lanes = w if w in _LANE_WIDTHS else None
        t = m.group(2).strip()
    else:
        mb = _LEAD_BITS.match(t)
        if mb:  # "32-bit PCI": a parallel bus width, not lanes
            t = mb.group(2).strip()
    gen = physical = None
    mp = _PCIE.search(t)
    if mp and "mini" not in t.lower():
        if mp.group(1):
            gen = int(mp.group(1))
        if mp.group(2) and int(mp.group(2)) in _LANE_WIDTHS:
            physical = int(mp.group(2))
    return (t or None), lanes, physical, gen


def _form_factor(slot_type: str | None, designation: str, length: str | None) -> str:
    st = (slot_type or "").lower()
    des = designation.lower()
    ln = (length or "").lower()
    if "sff-8639" in st or "u.2" in st:
        return "u.2"
    if "m.2" in st:
        return "m.2"
    if "ocp" in st:
        return "ocp"
    if re.search(r"(?<![a-z0-9])m\.?2(?![0-9])", des):
        return "m.2"
    if re.search(r"(?<![a-z0-9])ocp(?![a-z])", des):
        return "ocp"
    if re.search(r"\bu\.2\b|sff-8639", des):
        return "u.2"
    if "drive form factor" in ln:
        return "u.2"
    pcie_type = "pci express" in st and "mini" not in st and "edsff" not in st
    out_of_spec_pcie = "out of spec" in st and re.search(r"pci-?e|pci express", des)
    if pcie_type or out_of_spec_pcie:
        return "other" if ln == "other" else "cem"
    return "other"


def _usage(text: str | None) -> bool | None:
    u = (text or "").strip().lower()
    if u == "in use":
        return True
    if u in ("available", "unavailable"):
        return False
    return None


def _slot(rec: _Record, source: str) -> DmiSlot:
    def val(key: str) -> str | None:
        f = rec.get(key)
        return f.value if f is not None else None

    designation = (val("Designation") or "").strip()
    type_text = _clean(val("Type"))
    slot_type, lanes, physical, gen = _parse_slot_type(type_text)
    if lanes is None:
        lanes = _width_of(val("Data Bus Width"))
    phys_line = _width_of(val("Slot Physical Width"))
    physical = physical or phys_line
    if lanes is None:
        lanes = physical
    if gen is None:
        g = _int(val("PCI Express Generation"))
        gen = g if g and 1 <= g <= 7 else None
    length = _clean(val("Length"))
    usage = _clean(val("Current Usage"))
    return DmiSlot(
        designation=designation,
        slot_type=slot_type,
        width_lanes=lanes,
        pcie_gen=gen,
        form_factor=_form_factor(slot_type, designation, length),
        length=length,
        current_usage=usage,
        in_use=_usage(usage),
        bus_address=_bus_address(rec.get("Bus Address"), source),
        slot_id=_int(val("ID")),
        handle=rec.handle,
        physical_width_lanes=physical,
        line=rec.line,
    )


def _processor(rec: _Record) -> DmiProcessor:
    def val(key: str) -> str | None:
        f = rec.get(key)
        return f.value if f is not None else None

    status = _clean(val("Status"))
    populated = bool(status) and status.lower().startswith("populated")
    return DmiProcessor(
        socket_designation=(val("Socket Designation") or "").strip(),
        version=_clean(val("Version")),
        manufacturer=_clean(val("Manufacturer")),
        status=status,
        populated=populated,
        core_count=_int(val("Core Count")),
        core_enabled=_int(val("Core Enabled")),
        thread_count=_int(val("Thread Count")),
        max_speed_mhz=_int(val("Max Speed")),
        handle=rec.handle,
    )


def _onboard(rec: _Record, source: str) -> DmiOnboardDevice:
    """A type 41 record, or one item of a type 10 record (no bus address, a description)."""
    def val(key: str) -> str | None:
        f = rec.get(key)
        return f.value if f is not None else None

    legacy = rec.dmi_type == 10
    status = (val("Status") or "").strip().lower()
    return DmiOnboardDevice(
        reference_designation=(val("Description" if legacy else "Reference Designation") or "").strip(),
        device_type=_clean(val("Type")),
        enabled={"enabled": True, "disabled": False}.get(status),
        type_instance=None if legacy else _int(val("Type Instance")),
        bus_address=None if legacy else _bus_address(rec.get("Bus Address"), source),
        handle=rec.handle,
        dmi_type=10 if legacy else 41,
    )


def parse_dmidecode(text: str, source: str) -> DmiInfo:
    """Read ``dmidecode``, ``dmidecode -t 9``/``-t slot`` or ``dmidecode -q`` output.

    ``source`` names the input in error messages. Raises :class:`ParseError`
    (naming ``source`` and the 1-based line) for text that is not dmidecode
    output, has no DMI record at all, or is certainly cut short: fewer
    records than the header announces, a full dump without its End Of Table
    record, a text that ends after a ``Handle`` line or inside a record of a
    type read here (before a field dmidecode always prints). A text that
    merely ends without dmidecode's closing blank line is read, with a
    warning in :attr:`DmiInfo.warnings`. Records that title several items
    ("On Board Device 2 Information", "Additional Information 2") give one
    entry per item. Records of types other than 1, 4, 9, 10 and 41 are
    checked for shape and otherwise ignored.

    >>> info = parse_dmidecode('''Handle 0x0100, DMI type 1, 27 bytes
    ... System Information
    ... \\tManufacturer: Dell Inc.
    ... \\tProduct Name: PowerEdge R640
    ...
    ... Handle 0x0900, DMI type 9, 17 bytes
    ... System Slot Information
    ... \\tDesignation: PCIe Slot 1
    ... \\tType: x16 PCI Express 3
    ... \\tCurrent Usage: Available
    ... \\tLength: Short
    ... \\tID: 1
    ... ''', "dmi.txt")
    >>> info.system_product, info.slots[0].form_factor, info.slots[0].bus_address
    ('PowerEdge R640', 'cem', None)
    >>> parse_dmidecode("00:00.0 Host bridge: Intel Corporation", "lspci.txt")
    Traceback (most recent call last):
    ...
    planner.errors.ParseError: lspci.txt:1: expected a dmidecode line ('Handle 0x0900, DMI type 9, 17 bytes', a record title or a banner); the input looks like the output of lspci, not dmidecode, found '00:00.0 Host bridge: Intel Corporation'
    """
    if not isinstance(text, str):
        raise ParseError(source, None, "dmidecode text output", type(text).__name__)
    if not text.strip():
        raise ParseError(source, None, "dmidecode output", "empty input")
    records, meta, warnings = _records(text, source)
    if not records:
        raise ParseError(source, None, "at least one DMI record ('Handle 0x..., DMI type N, ...')",
                         "no records")
    warnings.extend(_check_complete(text, records, meta, warnings, source))
    vendor = product = None
    processors: list[DmiProcessor] = []
    slots: list[DmiSlot] = []
    onboard: list[DmiOnboardDevice] = []
    for rec in records:
        if rec.title is None:
            continue  # a Handle line cut off from its record
        if rec.dmi_type == 1 and vendor is None and product is None:
            f_v, f_p = rec.get("Manufacturer"), rec.get("Product Name")
            vendor = _clean(f_v.value) if f_v else None
            product = _clean(f_p.value) if f_p else None
        elif rec.dmi_type == 4:
            processors.append(_processor(rec))
        elif rec.dmi_type == 9:
            slots.append(_slot(rec, source))
        elif rec.dmi_type in (10, 41):
            onboard.append(_onboard(rec, source))
    return DmiInfo(
        system_vendor=vendor,
        system_product=product,
        processors=tuple(processors),
        slots=tuple(slots),
        onboard=tuple(onboard),
        dmidecode_version=meta.get("dmidecode"),
        smbios_version=meta.get("smbios"),
        warnings=tuple(warnings),
    )


# ---------------------------------------------------------------------------
# joining slots to a PCI tree
# ---------------------------------------------------------------------------


def _slot_attrs(s: DmiSlot) -> dict[str, Any]:
    return {
        "designation": s.designation,
        "width_lanes": s.width_lanes,
        "pcie_gen": s.pcie_gen,
        "form_factor": s.form_factor,
        "length": s.length,
        "in_use": s.in_use,
        "bus_address": s.bus_address,
        "slot_type": s.slot_type,
        "current_usage": s.current_usage,
        "physical_width_lanes": s.physical_width_lanes,
        "slot_id": s.slot_id,
        "dmi_handle": s.handle,
    }


def _slot_label(s: DmiSlot) -> str:
    return s.designation or (f"DMI slot {s.handle}" if s.handle else "DMI slot")


def _devices_by_address(topo: Topology) -> dict[str, Node]:
    """Every function address of a non-slot node (devices and switch upstream ports)."""
    out: dict[str, Node] = {}
    for n in topo.nodes():
        if n.kind in (NodeKind.SLOT, NodeKind.SOCKET, NodeKind.MEMORY):
            continue
        for a in (n.bus_address, *n.attrs.get("functions", ())):
            if isinstance(a, str):
                out.setdefault(a.lower(), n)
    return out


def _bus_of(addr: str) -> tuple[str, int]:
    domain, bus, _, _ = split_address(addr)
    return domain, bus


def apply_dmi_slots(
    topo: Topology,
    dmi: DmiInfo,
    *,
    functions: Iterable[PciFunction] = (),
) -> Topology:
    """A copy of ``topo`` with the DMI slots joined to its PCI tree by bus address.

    ``topo`` is not changed. A DMI slot's bus address is that of the device
    in the slot (or where it would be). For each slot, in order:

    - **a device (or switch) node has that address**: if its parent is a
      slot node (from ``lspci`` SltCap), that slot node is enriched;
      otherwise a new slot node is inserted between the device and its
      parent — the link above the slot keeps the parent link's generation
      with the slot's width, the link below is the original link;
    - **no device there** (an empty slot): the bridge whose secondary bus is
      the address's bus is looked up — in slot nodes'
      ``attrs["secondary_bus"]`` or in ``functions`` (the
      :class:`PciFunction` records the tree was built from) — and its slot
      node enriched; a BIOS that gives the port's own address is matched to
      that port's slot node. Without such a slot node the slot is added
      under the switch or socket that owns the bus, when something says
      which; otherwise it is left out and a note says "unplaced slot";
    - **no bus address**: a slot node without a parent,
      ``attrs["placement"] = "unknown"``, and a note — nothing says which
      socket it belongs to.

    Every slot node joined carries the attrs ``designation``,
    ``width_lanes``, ``pcie_gen``, ``form_factor``, ``length``, ``in_use``,
    ``bus_address`` and ``source`` (``"dmidecode"``, or
    ``"lspci+dmidecode"`` for an enriched SltCap slot), plus ``slot_type``,
    ``current_usage``, ``physical_width_lanes``, ``slot_id`` and
    ``dmi_handle``. Device nodes named by a type 41 record get
    ``attrs["onboard"] = True`` and ``attrs["onboard_designations"]``.

    >>> from planner.topology.pcitree import build_pci_topology
    >>> topo = build_pci_topology([
    ...     PciFunction("0000:00:01.0", class_code="0604", is_bridge=True, secondary_bus=1,
    ...                 subordinate_bus=1, numa_node=0, port_type="root", link_cap=(4, 16)),
    ...     PciFunction("0000:01:00.0", class_code="0302", vendor_id="10de", link_cap=(4, 16)),
    ... ])
    >>> dmi = DmiInfo(slots=(DmiSlot("SLOT1", "PCI Express 4", 16, 4, "cem",
    ...                              in_use=True, bus_address="0000:01:00.0"),))
    >>> merged = apply_dmi_slots(topo, dmi)
    >>> slot = merged.parent("pci:0000:01:00.0")
    >>> slot.kind.value, slot.attrs["designation"], merged.parent(slot.id).id
    ('slot', 'SLOT1', 'socket0')
    >>> topo.parent("pci:0000:01:00.0").id   # the input is unchanged
    'socket0'
    """
    j = _Join(topo.copy(), functions)
    for s in dmi.slots:
        j.add(s)
    return j.finish(dmi)


class _Join:
    """The state of one :func:`apply_dmi_slots` call."""

    def __init__(self, topo: Topology, functions: Iterable[PciFunction]) -> None:
        self.topo = topo
        self.fns: dict[str, PciFunction] = {}
        for f in functions:
            try:
                self.fns[normalize_address(f.address)] = f
            except TopologyError:
                continue  # the tree builder refuses such an address too
        self.devices = _devices_by_address(topo)
        self.parent: dict[str, str | None] = {}  # device id -> parent id, as re-linked
        self.drop: set[tuple[str, str]] = set()  # links replaced by parent→slot→device
        self.claimed: dict[str, DmiSlot] = {}  # slot node id -> DMI slot joined to it
        self.port_of_bus = self._secondary_buses()
        self.unknown: list[str] = []
        self.unplaced: list[str] = []

    # -- lookups ---------------------------------------------------------
    def _secondary_buses(self) -> dict[tuple[str, int], str]:
        """(domain, secondary bus) -> address of the bridge that leads to that bus."""
        out: dict[tuple[str, int], str] = {}
        for n in self.topo.nodes(NodeKind.SLOT):
            port, sec = n.attrs.get("port"), n.attrs.get("secondary_bus")
            if isinstance(port, str) and isinstance(sec, int):
                out.setdefault((port.split(":")[0], sec), port)
        for n in [*self.topo.nodes(NodeKind.SOCKET), *self.topo.nodes(NodeKind.SWITCH)]:
            for port, sec in n.attrs.get("port_buses", {}).items():
                out.setdefault((port.split(":")[0], int(sec)), port)
        for addr, f in self.fns.items():
            if f.is_bridge and f.secondary_bus is not None:
                out.setdefault((addr.split(":")[0], f.secondary_bus), addr)
        return out

    def _parent_of(self, node_id: str) -> str | None:
        if node_id in self.parent:
            return self.parent[node_id]
        p = self.topo.parent(node_id)
        return p.id if p is not None else None

    def _slot_of_port(self, port: str) -> str | None:
        for n in self.topo.nodes(NodeKind.SLOT):
            if n.attrs.get("port") == port:
                return n.id
        return None

    def _owner_of_bus(self, domain: str, bus: int) -> str | None:
        """The switch or socket a bus hangs under, when something says which."""
        port = self.port_of_bus.get((domain, bus))
        if port is None:
            # Devices on one bus share the bridge above them, hence its attachment.
            return self._attachment_of_bus(domain, bus)
        for sw in self.topo.nodes(NodeKind.SWITCH):
            if port in sw.attrs.get("ports", ()):
                return sw.id  # a switch downstream port
        for sock in self.topo.nodes(NodeKind.SOCKET):
            if port in sock.attrs.get("port_buses", {}):
                return sock.id  # a root port the tree builder recorded
        # A root port: the socket of whatever else sits on the root bus, else its NUMA node's.
        owner = self._attachment_of_bus(*_bus_of(port))
        if owner is not None:
            return owner
        f = self.fns.get(port)
        if f is not None and f.numa_node is not None and f.numa_node >= 0:
            for sock in self.topo.nodes(NodeKind.SOCKET):
                if f.numa_node in sock.attrs.get("numa_nodes", ()) or sock.numa_node == f.numa_node:
                    return sock.id
        return None

    def _attachment_of_bus(self, domain: str, bus: int) -> str | None:
        for addr, n in self.devices.items():
            if _bus_of(addr) != (domain, bus):
                continue
            p = self._parent_of(n.id)
            if p is not None and self.topo.node(p).kind in (NodeKind.SOCKET, NodeKind.SWITCH):
                return p
        return None

    def _conflict(self, s: DmiSlot, node_id: str) -> None:
        self.topo.notes.append(
            f"DMI slots '{_slot_label(self.claimed[node_id])}' and '{_slot_label(s)}' "
            f"({s.bus_address}) both name slot node {node_id}; kept the first")

    # -- the join --------------------------------------------------------
    def add(self, s: DmiSlot) -> None:
        if s.bus_address is None:
            node_id = self._new_slot(s, placement="unknown")
            self.unknown.append(_slot_label(s))
            return
        dev = self.devices.get(s.bus_address)
        if dev is not None:
            self._device_slot(s, dev)
            return
        # Some BIOSes give the port's own address rather than the device's.
        target = self._slot_of_port(s.bus_address)
        if target is None:
            port = self.port_of_bus.get(_bus_of(s.bus_address))
            target = self._slot_of_port(port) if port is not None else None
        if target is not None:
            if target in self.claimed:
                self._conflict(s, target)
            else:
                self._enrich(target, s)
            return
        owner = self._owner_of_bus(*_bus_of(s.bus_address))
        if owner is None:
            self.unplaced.append(f"'{_slot_label(s)}' ({s.bus_address})")
            return
        node_id = self._new_slot(s)
        port = self.port_of_bus.get(_bus_of(s.bus_address))
        pf = self.fns.get(port) if port else None
        gen = pf.link_cap[0] if pf is not None and pf.link_cap else s.pcie_gen
        self.topo.add_link(Link.pcie(owner, node_id, gen, s.width_lanes))

    def _device_slot(self, s: DmiSlot, dev: Node) -> None:
        parent = self._parent_of(dev.id)
        if parent is not None and self.topo.node(parent).kind == NodeKind.SLOT:
            if parent in self.claimed:
                self._conflict(s, parent)
            else:
                self._enrich(parent, s)
            return
        node_id = self._new_slot(s, in_use=True)
        self.parent[dev.id] = node_id
        if parent is None:
            self.topo.replace_node(self.topo.node(node_id).with_attrs(placement="unknown"))
            self.topo.add_link(Link.pcie(node_id, dev.id, s.pcie_gen, s.width_lanes))
            self.topo.notes.append(
                f"DMI slot '{_slot_label(s)}' holds {dev.id}, which no source placed in the tree")
            return
        old = self.topo.link_between(parent, dev.id)
        if old is None:  # cannot happen: the parent is found through this link
            raise TopologyError(f"no link between {parent!r} and {dev.id!r}")
        self.drop.add(old.key)
        self.topo.add_link(Link.pcie(parent, node_id, old.pcie_gen, s.width_lanes or old.lanes))
        self.topo.add_link(Link(node_id, dev.id, old.kind, old.bytes_per_s, old.pcie_gen,
                                old.lanes, old.bandwidth_source, dict(old.attrs)))

    def _new_slot(self, s: DmiSlot, **extra: Any) -> str:
        base = f"slot:dmi:{s.handle}" if s.handle else f"slot:dmi:{s.designation or 'slot'}"
        node_id, k = base, 2
        while node_id in self.topo:
            node_id, k = f"{base}#{k}", k + 1
        self.topo.add_node(Node(node_id, NodeKind.SLOT, f"slot {_slot_label(s)}",
                                attrs={**_slot_attrs(s), "source": "dmidecode", **extra}))
        self.claimed[node_id] = s
        return node_id

    def _enrich(self, node_id: str, s: DmiSlot) -> None:
        """Merge a DMI slot into an existing slot node (one from lspci SltCap)."""
        node = self.topo.node(node_id)
        old = dict(node.attrs)
        attrs = {**old, **_slot_attrs(s)}
        for key in ("width_lanes", "pcie_gen"):
            if attrs[key] is None:
                attrs[key] = old.get(key)
            elif old.get(key) is not None and old[key] != attrs[key]:
                attrs[f"port_{key}"] = old[key]  # what the port's link capability said
        occupied = any(self._parent_of(c.id) == node_id for c in self.topo.children(node_id))
        if occupied:
            attrs["in_use"] = True  # lspci saw the device: that beats the BIOS's word
        elif s.in_use is None:
            attrs["in_use"] = old.get("in_use")
        if old.get("designation") not in (None, "", s.designation):
            attrs["pci_slot"] = old["designation"]  # the SltCap physical slot number
        source = old.get("source")
        attrs["source"] = "lspci+dmidecode" if source and source != "dmidecode" else "dmidecode"
        self.topo.replace_node(Node(node.id, node.kind, f"slot {_slot_label(s)}", node.bus_address,
                                    node.numa_node, node.vendor_id, node.device_id, attrs))
        self.claimed[node_id] = s

    def finish(self, dmi: DmiInfo) -> Topology:
        topo = self.topo
        if self.drop:
            topo = _without_links(topo, self.drop)
        if self.unknown:
            topo.notes.append(
                f"{len(self.unknown)} DMI slot(s) have no bus address, so nothing says which socket "
                "they belong to (placement unknown): " + ", ".join(self.unknown))
        for u in self.unplaced:
            topo.notes.append(f"unplaced slot {u}: no device, bridge or slot of the PCI tree is on its bus")
        topo.notes.extend(dmi.warnings)
        _mark_onboard(topo, dmi)
        return topo


def _without_links(topo: Topology, drop: set[tuple[str, str]]) -> Topology:
    """A copy of ``topo`` without the links whose (src, dst) is in ``drop``."""
    out = Topology(topo.name, topo.sources)
    out.notes = list(topo.notes)
    for n in topo.nodes():
        out.add_node(n)
    for lk in topo.links():
        if lk.key not in drop:
            out.add_link(lk)
    return out


def _mark_onboard(topo: Topology, dmi: DmiInfo) -> None:
    devices = _devices_by_address(topo)
    for ob in dmi.onboard:
        n = devices.get(ob.bus_address) if ob.bus_address else None
        if n is None or n.kind not in DEVICE_KINDS:
            continue
        cur = topo.node(n.id)
        names = [*cur.attrs.get("onboard_designations", ()), ob.reference_designation]
        topo.replace_node(cur.with_attrs(onboard=True, onboard_designations=names))
