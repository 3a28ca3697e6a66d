"""Linux sysfs: the PCI hierarchy of the running machine.

Every PCI function is a directory ``/sys/bus/pci/devices/DDDD:BB:DD.F``, a
symbolic link into ``/sys/devices`` whose path is the chain of bridges above
it::

    /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0
                 └ root bus  └ root port  └ the device

Its attribute files give the class (``0x010802``), vendor and device ids,
the link's capability and state (``max_link_speed`` ``16.0 GT/s PCIe``,
``max_link_width`` ``16``, ``current_*``), the NUMA node (``-1`` when the
firmware gives none) and, for bridges, the bus range below them. The PCIe
port type is in no attribute: it is read from the ``config`` file's PCI
Express capability when the capability list is readable (root can read 256
bytes, other users only the first 64). ``/sys/bus/pci/slots/*/address``
names the physical slots, and ``/sys/devices/system`` tells which NUMA nodes
share a CPU package.

:func:`read_sysfs` turns that into :class:`PciFunction` records and
:func:`topology_from_sysfs` into a :class:`Topology`. The parsers of single
attribute values are public so that they can be tested alone:

>>> parse_class("0x010802\\n", "class"), parse_link_speed("8.0 GT/s PCIe\\n", "max_link_speed")
('0108', 3)
>>> parse_link_width("0\\n", "current_link_width") is None   # link down
True
"""

from __future__ import annotations

import functools
import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.errors import ParseError, TopologyError
from planner.topology.model import Node, NodeKind, Topology
from planner.topology.pcie import VALID_WIDTHS, gen_from_gts
from planner.topology.pcitree import PciFunction, add_memory_and_interconnect, build_pci_topology

_ADDR = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ROOT_BUS = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_SLOT_ADDR = re.compile(r"^([0-9a-f]{4,8}):([0-9a-f]{2})(?::([0-9a-f]{2}))?(?:\.[0-7])?$")

#: PCI Express capability, Device/Port Type field (PCIe base spec 7.5.3.2)
_PORT_TYPES = {
    0x0: "endpoint",
    0x1: "legacy-endpoint",
    0x4: "root",
    0x5: "upstream",
    0x6: "downstream",
    0x7: "pci-bridge",  # PCIe to PCI/PCI-X bridge
    0x8: "pci-bridge",  # PCI/PCI-X to PCIe bridge
    0x9: "rc-endpoint",
}

#: where pci.ids usually lives (pciutils / hwdata packages)
PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")


# -- single attribute values ---------------------------------------------------

def parse_class(text: str, source: str) -> str:
    """The 4-hex-digit class code (class and subclass) of a ``class`` file.

    >>> parse_class("0x060400", "class")
    '0604'
    """
    s = text.strip()
    m = re.fullmatch(r"0x([0-9a-fA-F]{6})", s)
    if not m:
        raise ParseError(source, 1, "a PCI class like 0x010802", s)
    return m.group(1)[:4].lower()


def parse_id(text: str, source: str) -> str:
    """A vendor or device id (``0x10de`` → ``'10de'``)."""
    s = text.strip()
    m = re.fullmatch(r"0x([0-9a-fA-F]{4})", s)
    if not m:
        raise ParseError(source, 1, "a 16-bit id like 0x10de", s)
    return m.group(1).lower()


def parse_link_speed(text: str, source: str) -> int | None:
    """The PCIe generation of a ``*_link_speed`` file; ``None`` for ``Unknown``.

    Kernels print ``"16.0 GT/s PCIe"`` (since 5.x) or ``"16 GT/s"`` (older).

    >>> parse_link_speed("2.5 GT/s PCIe", "s"), parse_link_speed("5 GT/s", "s"), parse_link_speed("Unknown", "s")
    (1, 2, None)
    """
    s = text.strip()
    if s.startswith("Unknown"):
        return None
    m = re.fullmatch(r"([0-9]{1,4}(?:\.[0-9]{1,4})?) GT/s(?: PCIe)?", s)
    if not m:
        raise ParseError(source, 1, "a link speed like '16.0 GT/s PCIe' or 'Unknown'", s)
    try:
        return gen_from_gts(float(m.group(1)))
    except TopologyError:
        return None  # a rate this table does not know: leave the link unknown


def parse_link_width(text: str, source: str) -> int | None:
    """The lane count of a ``*_link_width`` file; ``None`` for a link that is down (``0``) or invalid."""
    s = text.strip()
    if not re.fullmatch(r"[0-9]{1,5}", s):
        raise ParseError(source, 1, "a link width (a number of lanes such as 16)", s)
    w = int(s)
    return w if w in VALID_WIDTHS else None


def parse_numa_node(text: str, source: str) -> int | None:
    """A ``numa_node`` file: the node number, ``None`` for ``-1`` (firmware gave none)."""
    s = text.strip()
    if not re.fullmatch(r"-?[0-9]{1,5}", s):
        raise ParseError(source, 1, "a NUMA node number or -1", s)
    n = int(s)
    return n if n >= 0 else None


def parse_bus_number(text: str, source: str) -> int:
    """A ``secondary_bus_number`` / ``subordinate_bus_number`` file (decimal, 0–255)."""
    s = text.strip()
    if not re.fullmatch(r"[0-9]{1,3}", s) or int(s) > 255:
        raise ParseError(source, 1, "a bus number from 0 to 255", s)
    return int(s)


def parse_cpulist(text: str, source: str) -> tuple[int, ...]:
    """A kernel CPU list (``0-3,8-11``); empty for an empty file (a node without CPUs).

    >>> parse_cpulist("0-2,8\\n", "cpulist")
    (0, 1, 2, 8)
    """
    s = text.strip()
    if not s:
        return ()
    if not re.fullmatch(r"[0-9]{1,6}(?:-[0-9]{1,6})?(?:,[0-9]{1,6}(?:-[0-9]{1,6})?)*", s):
        raise ParseError(source, 1, "a CPU list like 0-3,8-11", s)
    out: list[int] = []
    for part in s.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise ParseError(source, 1, "CPU ranges from low to high", part)
        out.extend(range(a, b + 1))
    return tuple(out)


@dataclass(frozen=True)
class PcieCapability:
    """What the PCI Express capability in a function's config space says.

    ``link_cap`` / ``link_sta`` are ``(generation, lanes)`` or ``None``.
    """

    port_type: str | None
    slot_implemented: bool
    link_cap: tuple[int, int] | None
    link_sta: tuple[int, int] | None


def parse_pcie_capability(config: bytes) -> PcieCapability | None:
    """Find the PCI Express capability in config-space bytes; ``None`` if absent or unreadable.

    Only the bytes given are used: with the 64 bytes an unprivileged user
    can read, the capability (usually at 0x40 or beyond) is out of reach.

    >>> cfg = bytearray(256); cfg[6] = 0x10; cfg[0x34] = 0x40
    >>> cfg[0x40:0x44] = bytes([0x10, 0x00, 0x42, 0x01])   # PCIe cap, root port, slot
    >>> cfg[0x4C] = 0x04 | (16 << 4) & 0xF0; cfg[0x4D] = 16 >> 4   # Gen4 x16
    >>> cap = parse_pcie_capability(bytes(cfg))
    >>> cap.port_type, cap.slot_implemented, cap.link_cap
    ('root', True, (4, 16))
    """
    if len(config) < 0x40 or not (config[6] & 0x10):  # status: capabilities list present
        return None
    ptr = config[0x34] & 0xFC
    seen: set[int] = set()
    while ptr >= 0x40 and ptr not in seen and ptr + 4 <= len(config):
        seen.add(ptr)
        if config[ptr] == 0x10:
            flags = config[ptr + 2] | config[ptr + 3] << 8
            link_cap = link_sta = None
            if ptr + 0x14 <= len(config):
                lnkcap = int.from_bytes(config[ptr + 0x0C:ptr + 0x10], "little")
                lnksta = int.from_bytes(config[ptr + 0x12:ptr + 0x14], "little")
                link_cap = _speed_width(lnkcap & 0xF, lnkcap >> 4 & 0x3F)
                link_sta = _speed_width(lnksta & 0xF, lnksta >> 4 & 0x3F)
            return PcieCapability(_PORT_TYPES.get(flags >> 4 & 0xF), bool(flags & 0x100), link_cap, link_sta)
        ptr = config[ptr + 1] & 0xFC
    return None


def _speed_width(speed: int, width: int) -> tuple[int, int] | None:
    # Link speed codes 1..7 are Gen1..Gen7 (2.5 GT/s .. 128 GT/s)
    if 1 <= speed <= 7 and width in VALID_WIDTHS:
        return speed, width
    return None


def parse_pci_ids(text: str) -> dict[str, tuple[str, dict[str, str]]]:
    """Vendors and devices of a ``pci.ids`` database: ``{vendor: (name, {device: name})}``.

    Lines that do not fit are skipped: the database is a convenience for
    names, never a reason to fail.

    >>> db = parse_pci_ids("10de  NVIDIA Corporation\\n\\t20b0  GA100 [A100 SXM4 40GB]\\n")
    >>> db["10de"][1]["20b0"]
    'GA100 [A100 SXM4 40GB]'
    """
    vendors: dict[str, tuple[str, dict[str, str]]] = {}
    current: dict[str, str] | None = None
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        if line.startswith("C "):
            break  # device classes follow; not needed
        if m := re.match(r"^([0-9a-f]{4})\s+(\S.*)$", line):
            current = {}
            vendors[m.group(1)] = (m.group(2).strip(), current)
        elif current is not None and (m := re.match(r"^\t([0-9a-f]{4})\s+(\S.*)$", line)):
            current[m.group(1)] = m.group(2).strip()
    return vendors


@functools.lru_cache(maxsize=4)
def _load_pci_ids(path: str) -> dict[str, tuple[str, dict[str, str]]]:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return parse_pci_ids(text)


def device_name(vendor: str | None, device: str | None, pci_ids: Mapping[str, tuple[str, dict[str, str]]]) -> str:
    """``"NVIDIA Corporation GA100 [A100 SXM4 40GB]"`` like lspci, or ``"Device 10de:20b0"``."""
    if vendor and vendor in pci_ids:
        vname, devices = pci_ids[vendor]
        if device and device in devices:
            return f"{vname} {devices[device]}"
        return f"{vname} Device {device or '?'}"
    return f"Device {vendor or '?'}:{device or '?'}"


# -- reading the tree ----------------------------------------------------------------

def _read_attr(path: Path) -> str | None:
    """A sysfs attribute's text; ``None`` if it is absent or unreadable (skipped, not fatal)."""
    try:
        data = path.read_bytes()
    except OSError:  # missing, permission, EIO from a device, a directory, a symlink loop
        return None
    if b"\x00" in data:
        raise ParseError(str(path), 1, "a text attribute", "binary data (NUL bytes)")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise ParseError(str(path), 1, "an ASCII text attribute", repr(data[:40])) from None


def _read_config(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(256)
    except OSError:
        return b""


def _parse_attr(dev: Path, name: str, parser):
    text = _read_attr(dev / name)
    return None if text is None else parser(text, str(dev / name))


def _parent_address(real: Path, known: set[str]) -> str | None:
    """The nearest PCI function above ``real`` in its device path, ``None`` on a root bus."""
    for part in reversed(real.parts[:-1]):
        if _ROOT_BUS.match(part):
            return None
        if _ADDR.match(part) and part in known:
            return part
    return None


def _slots(root: Path) -> dict[tuple[str, int, int | None], str]:
    """``(domain, bus, device or None)`` → slot name, from ``bus/pci/slots/*/address``."""
    out: dict[tuple[str, int, int | None], str] = {}
    slots_dir = root / "bus" / "pci" / "slots"
    try:
        entries = sorted(slots_dir.iterdir())
    except OSError:
        return out
    for entry in entries:
        text = _read_attr(entry / "address")
        if text is None:
            continue
        m = _SLOT_ADDR.match(text.strip().lower())
        if not m:
            raise ParseError(str(entry / "address"), 1, "a slot address like 0000:85:00", text.strip())
        dev = int(m.group(3), 16) if m.group(3) else None
        out[(m.group(1), int(m.group(2), 16), dev)] = entry.name
    return out


def read_sysfs(root: str | Path = "/sys", *, pci_ids: str | Path | None = None) -> list[PciFunction]:
    """The PCI functions under ``root/bus/pci/devices``, parent links resolved.

    ``root`` is the sysfs mount point (a copy of one in tests). Device
    names come from ``pci_ids`` (a ``pci.ids`` file) or, when that is not
    given, from the first of :data:`PCI_IDS_PATHS` that exists; without one
    they are ``Device vvvv:dddd``. SR-IOV virtual functions are left out
    (``attrs["virtual_functions"]`` counts them on their physical function).

    Unreadable attribute files are skipped; garbled ones raise
    :class:`ParseError` naming the file.
    """
    root = Path(root)
    devdir = root / "bus" / "pci" / "devices"
    try:
        entries = sorted(e for e in devdir.iterdir() if _ADDR.match(e.name))
    except OSError:
        raise ParseError(str(devdir), None, "a sysfs tree with bus/pci/devices (is /sys mounted?)") from None

    if pci_ids is None:
        pci_ids = next((p for p in PCI_IDS_PATHS if os.path.exists(p)), None)
    ids_db = _load_pci_ids(str(pci_ids)) if pci_ids else {}
    slots = _slots(root)

    physical = []
    for e in entries:
        if (e / "physfn").exists():
            continue  # an SR-IOV virtual function
        physical.append(e)
    known = {e.name for e in physical}

    return [_function(dev, known, slots, ids_db) for dev in physical]


def _function(dev: Path, known: set[str], slots: dict[tuple[str, int, int | None], str],
              ids_db: dict[str, tuple[str, dict[str, str]]]) -> PciFunction:
    """One function's record from its sysfs directory ``dev``."""
    addr = dev.name
    real = Path(os.path.realpath(dev))
    class_code = _parse_attr(dev, "class", parse_class)
    vendor = _parse_attr(dev, "vendor", parse_id)
    device = _parse_attr(dev, "device", parse_id)
    max_gen = _parse_attr(dev, "max_link_speed", parse_link_speed)
    max_width = _parse_attr(dev, "max_link_width", parse_link_width)
    cur_gen = _parse_attr(dev, "current_link_speed", parse_link_speed)
    cur_width = _parse_attr(dev, "current_link_width", parse_link_width)
    numa = _parse_attr(dev, "numa_node", parse_numa_node)
    secondary = _parse_attr(dev, "secondary_bus_number", parse_bus_number)
    subordinate = _parse_attr(dev, "subordinate_bus_number", parse_bus_number)

    config = _read_config(dev / "config")
    cap = parse_pcie_capability(config)
    header_type = config[0x0E] & 0x7F if len(config) > 0x1A else None
    is_bridge = (class_code or "").startswith(("0604", "0609")) or header_type == 1
    if is_bridge and header_type == 1:
        # older kernels have no *_bus_number files; the type-1 header has them at 0x19/0x1A
        secondary = secondary if secondary is not None else config[0x19]
        subordinate = subordinate if subordinate is not None else config[0x1A]

    link_cap = (max_gen, max_width) if max_gen and max_width else (cap.link_cap if cap else None)
    link_sta = (cur_gen, cur_width) if cur_gen and cur_width else (cap.link_sta if cap else None)

    domain, bus_s, rest = addr.split(":")
    bus, devno = int(bus_s, 16), int(rest.split(".")[0], 16)
    slot = None
    if is_bridge and secondary is not None:
        slot = slots.get((domain, secondary, 0)) or slots.get((domain, secondary, None))
    if slot is None and not is_bridge:
        slot = slots.get((domain, bus, devno))

    attrs: dict[str, Any] = {}
    try:
        driver = os.path.basename(os.readlink(dev / "driver"))
        attrs["driver"] = driver
    except OSError:
        pass
    n_vf = sum(1 for _ in dev.glob("virtfn*"))
    if n_vf:
        attrs["virtual_functions"] = n_vf
    if cap is not None and cap.port_type in ("root", "downstream"):
        attrs["slot_implemented"] = cap.slot_implemented

    return PciFunction(
        address=addr,
        class_code=class_code,
        vendor_id=vendor,
        device_id=device,
        name=device_name(vendor, device, ids_db),
        is_bridge=is_bridge,
        secondary_bus=secondary if is_bridge else None,
        subordinate_bus=subordinate if is_bridge else None,
        port_type=cap.port_type if cap else None,
        link_cap=link_cap,
        link_sta=link_sta,
        numa_node=numa,
        slot=slot,
        parent=_parent_address(real, known),
        attrs=attrs,
    )


def numa_nodes(root: str | Path = "/sys") -> dict[int, tuple[int, ...]]:
    """NUMA node → its CPUs, from ``devices/system/node/node*/cpulist`` (empty if unknown)."""
    out: dict[int, tuple[int, ...]] = {}
    node_dir = Path(root) / "devices" / "system" / "node"
    try:
        entries = list(node_dir.iterdir())
    except OSError:
        return out
    for e in entries:
        m = re.fullmatch(r"node([0-9]+)", e.name)
        if not m:
            continue
        text = _read_attr(e / "cpulist")
        out[int(m.group(1))] = parse_cpulist(text, str(e / "cpulist")) if text is not None else ()
    return dict(sorted(out.items()))


def numa_to_package(root: str | Path = "/sys") -> dict[int, int]:
    """NUMA node → CPU package (socket), for the nodes that have CPUs.

    On AMD EPYC in NPS2/NPS4 mode, or Intel with sub-NUMA clustering, several
    nodes share a package.
    """
    out: dict[int, int] = {}
    for node, cpus in numa_nodes(root).items():
        if not cpus:
            continue
        path = Path(root) / "devices" / "system" / "cpu" / f"cpu{cpus[0]}" / "topology" / "physical_package_id"
        text = _read_attr(path)
        if text is None:
            continue
        s = text.strip()
        if not re.fullmatch(r"-?[0-9]{1,6}", s):
            raise ParseError(str(path), 1, "a package number", s)
        if int(s) >= 0:
            out[node] = int(s)
    return out


def topology_from_sysfs(
    root: str | Path = "/sys",
    *,
    name: str | None = None,
    pci_ids: str | Path | None = None,
) -> Topology:
    """The topology of the machine whose sysfs is mounted at ``root``.

    Sockets are CPU packages when ``devices/system`` tells which NUMA nodes
    share one (else one socket per NUMA node), including packages without
    PCI devices. A machine with a single NUMA node reports ``-1`` for its
    devices; they are put on that node (``attrs["numa_inferred"]``). On a
    machine with several nodes, a device without one hangs under
    ``socket?`` as :func:`build_pci_topology` does.
    """
    root = Path(root)
    functions = read_sysfs(root, pci_ids=pci_ids)
    nodes = numa_nodes(root)
    packages = numa_to_package(root)
    notes = []
    if len(nodes) == 1:
        only = next(iter(nodes))
        unknown = [f for f in functions if f.numa_node is None]
        if unknown:
            functions = [replace(f, numa_node=only, attrs={**f.attrs, "numa_inferred": True})
                         if f.numa_node is None else f for f in functions]
            notes.append(f"sysfs: {len(unknown)} PCI function(s) report no NUMA node; the machine has "
                         f"one (node {only}), so they are put on it")
    if name is None:
        name = platform.node() if root.resolve() == Path("/sys") else f"sysfs:{root}"
    topo = build_pci_topology(functions, name=name, source=str(root), numa_to_socket=packages or None)
    topo.notes.extend(notes)

    # Packages without PCI devices still have cores and memory.
    added = False
    for pkg in sorted(set(packages.values())):
        sid = f"socket{pkg}"
        if sid in topo:
            continue
        members = sorted(n for n, p in packages.items() if p == pkg)
        topo.add_node(Node(sid, NodeKind.SOCKET, f"socket {pkg}",
                           numa_node=members[0] if len(members) == 1 else None,
                           attrs={"numa_nodes": members}))
        added = True
    if added:
        add_memory_and_interconnect(topo)
    if not topo.nodes(NodeKind.SOCKET):
        topo.add_node(Node("socket0", NodeKind.SOCKET, "socket 0"))
        add_memory_and_interconnect(topo)
    return topo
