"""Where a path's disk and a GPU sit, as sysfs tells: block devices, NUMA nodes, PCI addresses.

What the profiler (:mod:`hwprofile`) and the read-backend choice
(:mod:`iostack.backends`) need to tie a measurement or a file to a device of
the topology. Reads ``/sys`` (or ``sys_root``) and ``/proc/self/mountinfo``;
measures nothing.

>>> block_device_of("/proc").name is None   # a virtual file system has no device
True
>>> gpu_numa_node(None) is None
True
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.topology.model import Topology

__all__ = ["BlockDevice", "block_device_of", "numa_nodes", "gpu_numa_node", "props_bus_address"]


@dataclass(frozen=True)
class BlockDevice:
    """The block device a path lives on, as far as sysfs tells.

    ``name`` is the whole disk (``nvme0n1``, ``vda``; a partition is
    resolved to its disk), ``pci_address`` the PCI function it hangs under
    (``None`` for a device with no PCI parent: a loop or RAM disk), ``model``
    its model string when sysfs has one, ``backing`` the disks under a
    device-mapper or md device, ``notes`` what a reader of the figures should
    know (a virtual disk, an array of several disks).
    """

    name: str | None
    major: int | None = None
    minor: int | None = None
    pci_address: str | None = None
    model: str | None = None
    kind: str | None = None
    backing: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


_PCI_ADDR = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _read_sys(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip() or None
    except OSError:
        return None


def _disk_from_sysfs(major: int, minor: int, sys_root: str | os.PathLike[str] = "/sys",
                     depth: int = 0) -> BlockDevice:
    root = Path(sys_root)
    link = root / "dev" / "block" / f"{major}:{minor}"
    try:
        real = Path(os.path.realpath(link))
    except OSError:
        real = link
    if not real.exists():
        return BlockDevice(None, major, minor, notes=(f"no block device {major}:{minor} in sysfs",))
    if (real / "partition").exists():
        real = real.parent  # a partition's directory sits inside its disk's
    name = real.name
    notes: list[str] = []
    slaves_dir = real / "slaves"
    slaves = sorted(p.name for p in slaves_dir.iterdir()) if slaves_dir.is_dir() else []
    if slaves and depth < 8:
        if len(slaves) == 1:
            dev = _read_sys(root / "class" / "block" / slaves[0] / "dev")
            if dev and ":" in dev:
                a, b = dev.split(":", 1)
                inner = _disk_from_sysfs(int(a), int(b), sys_root, depth + 1)
                return replace(inner, backing=(inner.name or slaves[0],),
                               notes=(f"{name} is a device-mapper/md device over {inner.name}",
                                      *inner.notes))
        notes.append(f"{name} spans {len(slaves)} devices ({', '.join(slaves)}): the figures "
                     "are the array's, not one device's")
        return BlockDevice(name, major, minor, kind="array", backing=tuple(slaves),
                           notes=tuple(notes))
    pci = None
    for part in real.parts:
        if _PCI_ADDR.match(part):
            pci = part  # the deepest PCI function on the path is the controller
    model = _read_sys(real / "device" / "model")
    if model is None and (real / "device" / "device" / "model").exists():
        model = _read_sys(real / "device" / "device" / "model")
    if name.startswith("nvme"):
        kind = "nvme"
    elif name.startswith("vd"):
        kind = "virtio"
        notes.append(f"{name} is a virtio disk: a virtual machine's disk, so the figures are "
                     "what the VM gets, not those of a physical SSD")
    elif name.startswith(("sd", "hd")):
        kind = "scsi/sata"
    elif name.startswith(("loop", "ram", "zram", "nbd")):
        kind = name.rstrip("0123456789")
        notes.append(f"{name} is not a physical device")
    else:
        kind = None
    if pci is None and kind not in ("loop", "ram", "zram", "nbd"):
        notes.append(f"no PCI device found above {name} in sysfs")
    return BlockDevice(name, major, minor, pci, model, kind, (), tuple(notes))


def _mount_source(path: Path) -> str | None:
    """The device a path's file system was mounted from (for btrfs and others with anonymous st_dev)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, source = -1, None
    for ln in lines:
        pre, _, post = ln.partition(" - ")
        fields, rest = pre.split(), post.split()
        if len(fields) < 5 or len(rest) < 2:
            continue
        mnt = fields[4].replace("\\040", " ")
        if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) > best:
            best, source = len(mnt), rest[1]
    return source


def block_device_of(path: str | os.PathLike[str], sys_root: str | os.PathLike[str] = "/sys") -> BlockDevice:
    """The block device holding ``path``: ``os.stat(path).st_dev`` → ``/sys/dev/block/MAJ:MIN``.

    Walks up from the partition to the disk, through a device-mapper or md
    device with one backing disk, and up the sysfs path to the PCI function
    of the controller.

    >>> block_device_of("/proc").name is None   # a virtual file system has no device
    True
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        return BlockDevice(None, notes=(f"cannot stat {p}: {exc.strerror or exc}",))
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if stat.S_ISBLK(st.st_mode):
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    elif major == 0:
        # btrfs, overlay, tmpfs, NFS: an anonymous device number; ask the mount table
        src = _mount_source(p)
        if src and src.startswith("/dev/"):
            try:
                rst = os.stat(src)
                major, minor = os.major(rst.st_rdev), os.minor(rst.st_rdev)
            except OSError:
                pass
        if major == 0:
            return BlockDevice(None, major, minor, notes=(
                f"{p} is on a file system with no block device of its own "
                f"({src or 'unknown source'}): the figures cannot be tied to a device",))
    return _disk_from_sysfs(major, minor, sys_root)



# ---------------------------------------------------------------------------
# NUMA nodes and GPUs


def _cpulist(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def numa_nodes(sys_root: str | os.PathLike[str] = "/sys") -> dict[int, set[int]]:
    """NUMA node number → its CPUs, from sysfs (empty when sysfs has no NUMA information)."""
    base = Path(sys_root) / "devices" / "system" / "node"
    out: dict[int, set[int]] = {}
    if not base.is_dir():
        return out
    for d in sorted(base.glob("node[0-9]*")):
        text = _read_sys(d / "cpulist") or ""
        try:
            out[int(d.name[4:])] = _cpulist(text)
        except ValueError:
            continue
    return out


def props_bus_address(props: Any) -> str | None:
    """The PCI bus address in a CUDA device's properties (PyTorch versions that expose the PCI fields)."""
    dom, bus, dev = (getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if bus is None or dev is None:
        return None
    return f"{int(dom or 0):04x}:{int(bus):02x}:{int(dev):02x}.0"


def gpu_numa_node(bus_address: str | None, topo: Topology | None = None,
                  sys_root: str | os.PathLike[str] = "/sys") -> int | None:
    """The NUMA node (socket memory) a GPU hangs under: sysfs ``numa_node`` of its PCI function, else the topology's.

    >>> gpu_numa_node(None) is None
    True
    """
    if bus_address:
        text = _read_sys(Path(sys_root) / "bus" / "pci" / "devices" / bus_address / "numa_node")
        if text is not None and text.strip().lstrip("-").isdigit() and int(text) >= 0:
            return int(text)
        node = topo.find(bus_address) if topo is not None else None
        if node is not None and node.numa_node is not None:
            return node.numa_node
    return None

