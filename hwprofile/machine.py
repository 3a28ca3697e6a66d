"""The whole machine: SSDs, memory and CUDA copies, as planner :class:`~planner.capacities.Capacities`."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from pathlib import Path

from hwprofile._common import _now
from hwprofile.cuda import cuda_bandwidths
from hwprofile.memory import memory_bandwidth_by_node
from hwprofile.ssd import DEFAULT_FILE_BYTES, SsdMeasurement, _validate, ssd_random_read
from momentbase import __version__
from planner.capacities import Capacities, DeviceCapacity, LinkCapacity, MemoryCapacity
from planner.errors import ProfileError
from planner.hostinfo import BlockDevice, block_device_of
from planner.progress import Progress
from planner.topology.model import NodeKind, Topology

__all__ = ["profile_machine"]


def _device_key(info: BlockDevice, topo: Topology | None, path: str) -> str:
    if info.pci_address:
        node = topo.find(info.pci_address) if topo is not None else None
        return node.id if node is not None else info.pci_address
    if info.name:
        return f"block:{info.name}"
    return f"path:{path}"


def profile_machine(
    topo: Topology | None = None,
    *,
    ssd_paths: Iterable[str | os.PathLike[str]] = (),
    block_bytes: int = 4096,
    queue_depth: int = 64,
    seconds: float = 5.0,
    file_bytes: int = DEFAULT_FILE_BYTES,
    use_fio: bool = True,
    memory: bool = True,
    memory_bytes: int = 256 << 20,
    memory_repeats: int = 5,
    cuda: bool = True,
    keep_files: bool = False,
    processes: int | None = None,
    progress: Progress | None = None,
    sys_root: str | os.PathLike[str] = "/sys",
) -> Capacities:
    """Measure this machine: SSDs under ``ssd_paths``, memory, and CUDA copies when present.

    Each SSD figure is keyed by the device its path lives on: the topology
    node of the PCI function above the block device when ``topo`` has it,
    else the bus address, else ``block:NAME`` (no PCI parent) or
    ``path:PATH`` (no block device). The figure used is the tool with the
    most reads per second (the device delivers at least that); the other
    tools' figures are kept as ``others``. ``notes`` of the result say what
    was not measured and why. Parameters are those of
    :func:`ssd_random_read`, :func:`memory_bandwidth_by_node` and
    :func:`cuda_bandwidths`.
    """
    _validate(block_bytes, queue_depth, seconds, file_bytes)
    paths = [Path(p) for p in ssd_paths]
    for p in paths:  # fail before spending minutes on the first path
        if not p.exists():
            raise ProfileError(f"{p}: no such directory or file")
    notes: list[str] = []
    devices: dict[str, DeviceCapacity] = {}
    if not paths:
        notes.append("SSDs: not measured: no path given (name a directory on each SSD: --ssd PATH)")
    for p in paths:
        _add_ssd(devices, notes, p, topo, sys_root,
                 ssd_random_read(p, block_bytes, queue_depth, seconds, file_bytes, use_fio=use_fio, direct=None,
                                 keep_file=keep_files, processes=processes, progress=progress))
    mem: list[MemoryCapacity] = []
    if memory:
        mem, mem_notes = memory_bandwidth_by_node(memory_bytes, memory_repeats, sys_root=sys_root,
                                                  progress=progress)
        notes.extend(mem_notes)
    else:
        notes.append("memory: not measured (asked not to)")
    links: list[LinkCapacity] = []
    eff = None
    if cuda:
        links, eff, cuda_notes = cuda_bandwidths(topo, progress=progress, sys_root=sys_root)
        notes.extend(cuda_notes)
    else:
        notes.append("host↔GPU and GPU↔GPU links: not measured (asked not to)")
    if eff is None:
        notes.append("PCIe links: not measured (that needs host-to-device copies to a GPU); "
                     "their figures stay generation x width x the default efficiency")
    if topo is not None and topo.links("inter-socket"):
        notes.append("inter-socket links: not measured; the table or spec figure stays")
    if topo is not None and topo.nodes(NodeKind.NVME) and not paths:
        notes.append(f"the topology has {len(topo.nodes(NodeKind.NVME))} NVMe device(s); "
                     "none was measured")
    return Capacities(devices=tuple(devices.values()), links=tuple(links), memory=tuple(mem),
                      pcie_efficiency=eff, host=socket.gethostname(), date=_now(),
                      tool=_tool_name(), notes=tuple(notes))


def _add_ssd(devices: dict[str, DeviceCapacity], notes: list[str], p: Path, topo: Topology | None,
             sys_root: str | os.PathLike[str], m: SsdMeasurement) -> None:
    """Path ``p``'s measurement ``m`` into ``devices`` (keyed by its device; the best of paths on one device wins)."""
    info = block_device_of(p, sys_root)
    key = _device_key(info, topo, str(p))
    notes.extend(f"{p}: {n}" for n in info.notes)
    notes.extend(f"{p}: {n}" for n in m.not_measured)
    if m.mode_note:
        notes.append(f"{p}: {m.mode_note}")
    if m.kept:
        notes.append(f"{p}: test file kept at {m.path}")
    best = m.best
    others = tuple(r for r in m.results if r is not best)
    old = devices.get(key)
    if old is not None:
        allm = [*old.measurements(), *m.results]
        best = max(allm, key=lambda r: r.read_iops or 0.0)
        others = tuple(r for r in allm if r is not best)
    devices[key] = DeviceCapacity(key, best, model=info.model, block_device=info.name, path=str(p), others=others)


def _tool_name() -> str:
    return f"moment {__version__} (hwprofile)"

