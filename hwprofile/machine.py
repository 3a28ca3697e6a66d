"""The whole machine: SSDs, memory and CUDA copies, as planner :class:`~planner.capacities.Capacities`."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
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

__all__ = ["MemoryProbe", "ProfileSpec", "SsdProbe", "profile_machine"]


def _device_key(info: BlockDevice, topo: Topology | None, path: str) -> str:
    if info.pci_address:
        node = topo.find(info.pci_address) if topo is not None else None
        return node.id if node is not None else info.pci_address
    if info.name:
        return f"block:{info.name}"
    return f"path:{path}"


@dataclass(frozen=True)
class SsdProbe:
    """The SSD test (:func:`hwprofile.ssd.ssd_random_read`): random aligned reads of ``block_bytes`` at
    ``queue_depth`` for ``seconds`` from a test file of ``file_bytes`` in each of ``paths`` (a directory
    on each SSD; none: SSDs not measured); with fio too when ``use_fio`` and it is installed;
    ``keep_files`` leaves the test files; ``processes``: the posix reader's worker processes
    (``None``: its default).

    >>> SsdProbe(["/mnt/nvme0"], queue_depth=0)
    Traceback (most recent call last):
    ...
    planner.errors.ProfileError: queue depth 0: expected 1 to 4096
    """

    paths: Sequence[str | os.PathLike[str]] = ()
    block_bytes: int = 4096
    queue_depth: int = 64
    seconds: float = 5.0
    file_bytes: int = DEFAULT_FILE_BYTES
    use_fio: bool = True
    keep_files: bool = False
    processes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))
        _validate(self.block_bytes, self.queue_depth, self.seconds, self.file_bytes)


@dataclass(frozen=True)
class MemoryProbe:
    """The memory test (:func:`hwprofile.memory.memory_bandwidth_by_node`): a numpy copy of ``array_bytes``,
    the best of ``repeats``, on every NUMA node."""

    array_bytes: int = 256 << 20
    repeats: int = 5

    def __post_init__(self) -> None:
        if int(self.array_bytes) < 4096 or int(self.repeats) < 1:
            raise ProfileError(f"memory test: expected at least 4 KiB and one repeat, got {self.array_bytes} "
                               f"bytes and {self.repeats} repeat(s)")


@dataclass(frozen=True)
class ProfileSpec:
    """What :func:`profile_machine` measures: the SSDs under ``ssd.paths``, the memory (``memory``;
    ``None``: not measured) and CUDA copies (``cuda``; where there is a GPU)."""

    ssd: SsdProbe = field(default_factory=SsdProbe)
    memory: MemoryProbe | None = field(default_factory=MemoryProbe)
    cuda: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.ssd, SsdProbe) or not isinstance(self.memory, (MemoryProbe, type(None))):
            raise ProfileError(f"ssd and memory: expected an SsdProbe and a MemoryProbe or None, got "
                               f"{type(self.ssd).__name__} and {type(self.memory).__name__}")


def profile_machine(spec: ProfileSpec | None = None, topo: Topology | None = None, *,
                    progress: Progress | None = None, sys_root: str | os.PathLike[str] = "/sys") -> Capacities:
    """Measure this machine as ``spec`` says: SSDs, memory, and CUDA copies when present.

    Parameters
    ----------
    spec : ProfileSpec, optional
        What to measure and how (default: memory and CUDA, no SSD).
    topo : Topology, optional
        This machine's topology: SSD figures are keyed by its nodes.
    progress : callable, optional
        Called as the tests advance (:mod:`planner.progress`).
    sys_root : path
        Where sysfs is (tests point it at a copy).

    Returns
    -------
    Capacities
        Each SSD figure is keyed by the device its path lives on: the topology
        node of the PCI function above the block device when ``topo`` has it,
        else the bus address, else ``block:NAME`` (no PCI parent) or
        ``path:PATH`` (no block device). The figure used is the tool with the
        most reads per second (the device delivers at least that); the other
        tools' figures are kept as ``others``. ``notes`` say what was not
        measured and why.

    Raises
    ------
    ProfileError
        A path that does not exist, a test file that cannot be written.
    """
    spec = spec if spec is not None else ProfileSpec()
    ssd = spec.ssd
    paths = [Path(p) for p in ssd.paths]
    for p in paths:  # fail before spending minutes on the first path
        if not p.exists():
            raise ProfileError(f"{p}: no such directory or file")
    notes: list[str] = []
    devices: dict[str, DeviceCapacity] = {}
    if not paths:
        notes.append("SSDs: not measured: no path given (name a directory on each SSD: --ssd PATH)")
    for p in paths:
        _add_ssd(devices, notes, p, topo, sys_root,
                 ssd_random_read(p, ssd.block_bytes, ssd.queue_depth, ssd.seconds, ssd.file_bytes,
                                 use_fio=ssd.use_fio, direct=None, keep_file=ssd.keep_files,
                                 processes=ssd.processes, progress=progress))
    mem: list[MemoryCapacity] = []
    if spec.memory is not None:
        mem, mem_notes = memory_bandwidth_by_node(spec.memory.array_bytes, spec.memory.repeats, sys_root=sys_root,
                                                  progress=progress)
        notes.extend(mem_notes)
    else:
        notes.append("memory: not measured (asked not to)")
    links: list[LinkCapacity] = []
    eff = None
    if spec.cuda:
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

