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

The text is split into records in :mod:`planner.topology.dmi.records`
(where the structures are defined too); this module interprets them, and
:mod:`planner.topology.dmi.join` joins the slots to a PCI tree.
"""

from __future__ import annotations

import re

from planner.errors import ParseError
from planner.topology.dmi.records import (
    DmiInfo,
    DmiOnboardDevice,
    DmiProcessor,
    DmiSlot,
    _check_complete,
    _Field,
    _Record,
    _records,
)
from planner.topology.pcitree import normalize_address

__all__ = ["parse_dmidecode"]


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
    populated = status is not None and status.lower().startswith("populated")
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
    """  # noqa: E501 (a doctest's or a capture's line, as printed)
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


