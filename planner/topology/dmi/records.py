"""dmidecode's text as records (handle, type, title, fields), and the SMBIOS structures read from them.

The structures (:class:`DmiSlot`, :class:`DmiProcessor`, :class:`DmiOnboardDevice`,
:class:`DmiInfo`) are documented in :mod:`planner.topology.dmi.parse`, which
reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from planner.errors import ParseError
from planner.topology.textio import guess_format, text_lines

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
