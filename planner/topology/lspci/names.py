"""PCI names read without ``-nn``: pci.ids class names, vendor and device class from a device's name.

Without a class code (``lspci -t`` output), the device name decides the class
where it is unambiguous (:func:`class_from_name`): "NVMe SSD Controller" is
``0108``, but a HighPoint "NVMe RAID Controller" is a RAID controller
(``0104``), and AMD's unnamed internal functions ("Device 14ac") stay unknown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from planner.topology.pcitree import PciFunction

__all__ = ["CLASS_NAMES", "class_from_name", "vendor_from_name"]

# ---------------------------------------------------------------------------
# Names → class codes and vendor ids

#: the class names ``lspci`` prints without ``-nn`` (pci.ids subclass names;
#: a class name stands for the class only where pci.ids gives the "other"
#: subclass 80 the same name), lower-cased, to the 4-digit class code
CLASS_NAMES: Mapping[str, str] = {
    "non-vga unclassified device": "0000",
    "vga compatible unclassified device": "0001",
    "image coprocessor": "0005",
    "scsi storage controller": "0100",
    "ide interface": "0101",
    "floppy disk controller": "0102",
    "ipi bus controller": "0103",
    "raid bus controller": "0104",
    "ata controller": "0105",
    "sata controller": "0106",
    "serial attached scsi controller": "0107",
    "non-volatile memory controller": "0108",
    "universal flash storage controller": "0109",
    "mass storage controller": "0180",
    "ethernet controller": "0200",
    "token ring network controller": "0201",
    "fddi network controller": "0202",
    "atm network controller": "0203",
    "isdn controller": "0204",
    "worldfip controller": "0205",
    "picmg controller": "0206",
    "infiniband controller": "0207",
    "fabric controller": "0208",
    "network controller": "0280",
    "vga compatible controller": "0300",
    "xga compatible controller": "0301",
    "3d controller": "0302",
    "display controller": "0380",
    "multimedia video controller": "0400",
    "multimedia audio controller": "0401",
    "computer telephony device": "0402",
    "audio device": "0403",
    "multimedia controller": "0480",
    "ram memory": "0500",
    "flash memory": "0501",
    "cxl": "0502",
    "memory controller": "0580",
    "host bridge": "0600",
    "isa bridge": "0601",
    "eisa bridge": "0602",
    "microchannel bridge": "0603",
    "pci bridge": "0604",
    "pcmcia bridge": "0605",
    "nubus bridge": "0606",
    "cardbus bridge": "0607",
    "raceway bridge": "0608",
    "semi-transparent pci-to-pci bridge": "0609",
    "infiniband to pci host bridge": "060a",
    "bridge": "0680",
    "serial controller": "0700",
    "parallel controller": "0701",
    "multiport serial controller": "0702",
    "modem": "0703",
    "gpib controller": "0704",
    "smard card controller": "0705",  # sic, as in pci.ids
    "communication controller": "0780",
    "pic": "0800",
    "dma controller": "0801",
    "timer": "0802",
    "rtc": "0803",
    "pci hot-plug controller": "0804",
    "sd host controller": "0805",
    "iommu": "0806",
    "system peripheral": "0880",
    "keyboard controller": "0900",
    "digitizer pen": "0901",
    "mouse controller": "0902",
    "scanner controller": "0903",
    "gameport controller": "0904",
    "input device controller": "0980",
    "generic docking station": "0a00",
    "docking station": "0a80",
    "firewire (ieee 1394)": "0c00",
    "access bus": "0c01",
    "ssa": "0c02",
    "usb controller": "0c03",
    "fibre channel": "0c04",
    "smbus": "0c05",
    "infiniband": "0c06",
    "ipmi interface": "0c07",
    "sercos interface": "0c08",
    "canbus": "0c09",
    "serial bus controller": "0c80",
    "irda controller": "0d00",
    "consumer ir controller": "0d01",
    "rf controller": "0d10",
    "bluetooth": "0d11",
    "broadband": "0d12",
    "wireless controller": "0d80",
    "network and computing encryption device": "1000",
    "entertainment encryption device": "1010",
    "encryption controller": "1080",
    "dpio module": "1100",
    "performance counters": "1101",
    "communication synchronizer": "1110",
    "signal processing management": "1120",
    "signal processing controller": "1180",
    "processing accelerators": "1200",
    "unassigned class": "ff00",
}

#: pci.ids vendor names as lspci prints them, to their vendor ids
_VENDORS: tuple[tuple[str, str], ...] = (
    ("NVIDIA Corporation", "10de"),
    ("Advanced Micro Devices, Inc. [AMD/ATI]", "1002"),
    ("Advanced Micro Devices, Inc. [AMD]", "1022"),
    ("Intel Corporation", "8086"),
    ("Mellanox Technologies", "15b3"),
    ("Samsung Electronics Co Ltd", "144d"),
    ("Broadcom / LSI", "1000"),
    ("Broadcom Inc. and subsidiaries", "14e4"),
    ("PLX Technology, Inc.", "10b5"),
    ("ASPEED Technology, Inc.", "1a03"),
    ("Matrox Electronics Systems Ltd.", "102b"),
    ("HighPoint Technologies, Inc.", "1103"),
    ("Kingston Technology Company, Inc.", "2646"),
    ("Micron Technology Inc", "1344"),
    ("Marvell Technology Group Ltd.", "1b4b"),
    ("ASMedia Technology Inc.", "1b21"),
    ("Sandisk Corp", "15b7"),
    ("SK hynix", "1c5c"),
    ("KIOXIA Corporation", "1e0f"),
    ("Toshiba Corporation", "1179"),
    ("Phison Electronics Corporation", "1987"),
    ("Silicon Motion, Inc.", "126f"),
    ("Xilinx Corporation", "10ee"),
    ("Amazon.com, Inc.", "1d0f"),
    ("PLDA", "1556"),
)


def vendor_from_name(name: str) -> str | None:
    """The PCI vendor id of a device name that starts with a known pci.ids vendor name.

    >>> vendor_from_name("NVIDIA Corporation AD102GL [RTX 6000 Ada Generation]")
    '10de'
    >>> vendor_from_name("Advanced Micro Devices, Inc. [AMD] Device 14ac")
    '1022'
    >>> vendor_from_name("Device 14ac") is None
    True
    """
    for vendor, vid in _VENDORS:
        if name == vendor or name.startswith(vendor + " "):
            return vid
    return None


_NVIDIA_CHIP = re.compile(r"\b(?:G[A-Z]{1,2}\d{2,3}|AD\d{3}|TU\d{3})[A-Z]*\b")
_NVIDIA_NOT_GPU = re.compile(r"Switch|Bridge|UCSI|\bUSB\b|Audio", re.I)
_NVIDIA_DISPLAY = re.compile(r"GeForce|Quadro|\bRTX\b|TITAN|\bNVS\b")
_AMD_GPU = re.compile(
    r"Radeon|Instinct|FirePro|\bMI\d{2,3}|Navi|Vega|Polaris|Aldebaran|Arcturus|Ellesmere|Fiji"
)
_AMD_ACCEL = re.compile(r"Instinct|\bMI\d{2,3}|Aldebaran|Arcturus")

# Ordered: storage controllers that merely *mention* NVMe or SATA (RAID cards
# such as the HighPoint SSD7540 "NVMe RAID Controller", Intel VMD) come
# before the SSD rule, and a GPU's HDMI audio before anything GPU-like.
_NAME_CLASS_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bRAID\b|MegaRAID"), "0104"),
    (re.compile(r"\bSAS\d*\b|\bSAS-\d|Serial Attached SCSI|Fusion-MPT"), "0107"),
    (re.compile(r"\bSATA\b|Serial ATA|\bAHCI\b"), "0106"),
    (re.compile(r"Non-Volatile memory controller|\bNVMe\b|NVM Express|\bSSD\b|Solid State",
                re.I), "0108"),
    (re.compile(r"\bAudio\b|\bHDMI\b", re.I), "0403"),
    (re.compile(r"\bUSB\d?\b|\bxHCI\b", re.I), "0c03"),
    (re.compile(r"\bSMBus\b"), "0c05"),
    (re.compile(r"\bInfiniBand\b", re.I), "0207"),
    (re.compile(r"\bEthernet\b|Network Connection|\bNetXtreme\b|\b\d+GbE\b"), "0200"),
    (re.compile(r"\bConnectX|\bBlueField|Network (?:controller|Adapter)|Wi-Fi|Wireless"
                r"|Elastic Fabric Adapter|Omni-Path"), "0280"),
)


def class_from_name(name: str) -> str | None:
    """The PCI class code a device name makes certain, or ``None``.

    For output that has no class codes (``lspci -tv``). Only names that
    leave no doubt get a class: an NVIDIA chip name is a GPU, a HighPoint
    "NVMe RAID Controller" is a RAID controller (not an SSD), an AMD
    internal "Device 14ac" is unknown.

    >>> class_from_name("Samsung Electronics Co Ltd NVMe SSD Controller S4LV008[Pascal]")
    '0108'
    >>> class_from_name("HighPoint Technologies, Inc. SSD7540 PCIe Gen4 x16 8-Port M.2 NVMe RAID Controller")
    '0104'
    >>> class_from_name("NVIDIA Corporation GH100 [H100 SXM5 80GB]")
    '0302'
    >>> class_from_name("NVIDIA Corporation AD102 High Definition Audio Controller")
    '0403'
    >>> class_from_name("Mellanox Technologies MT2910 Family [ConnectX-7]")
    '0280'
    >>> class_from_name("Advanced Micro Devices, Inc. [AMD] Device 14ac") is None
    True
    """
    if not name:
        return None
    for pattern, code in _NAME_CLASS_RULES:
        if pattern.search(name):
            return code
    if name.startswith("NVIDIA Corporation "):
        if "NVSwitch" in name:
            return "0680"
        if _NVIDIA_CHIP.search(name) and not _NVIDIA_NOT_GPU.search(name):
            return "0300" if _NVIDIA_DISPLAY.search(name) else "0302"
        return None
    if name.startswith("Advanced Micro Devices, Inc. [AMD/ATI] "):
        if _AMD_GPU.search(name) and not re.search(r"Switch|Bridge|USB", name):
            return "0380" if _AMD_ACCEL.search(name) else "0300"
        return None
    if re.search(r"\bVGA\b|Graphics", name):
        return "0300"  # a BMC's or an integrated display; the vendor says whether it is a GPU
    return None


def _ids_from_name(name: str) -> tuple[str, str | None, str | None]:
    """(name without ids, vendor id, device id) of a name that may end in ``[vvvv:dddd]``."""
    m = re.fullmatch(r"(?:(?:Unknown )?[Dd]evice )?([0-9a-fA-F]{4}):([0-9a-fA-F]{4})", name)
    if m:  # -n output, or a device pci.ids does not know
        return "", m.group(1).lower(), m.group(2).lower()
    m = re.fullmatch(r"(.*?)\s*\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]", name)
    if m:
        return m.group(1), m.group(2).lower(), m.group(3).lower()
    return name, None, None


def _named_function(address: str, name: str, **fields: Any) -> PciFunction:
    """A function whose class (unless given) and vendor come from its name."""
    name, vendor, device = _ids_from_name(name)
    attrs = dict(fields.pop("attrs", {}))
    class_code = fields.pop("class_code", None)
    if class_code is None and not fields.get("is_bridge"):
        class_code = class_from_name(name)
        if class_code is not None:
            attrs["class_from_name"] = True
    return PciFunction(
        address, class_code=class_code, vendor_id=vendor or vendor_from_name(name),
        device_id=device, name=name, attrs=attrs, **fields,
    )
