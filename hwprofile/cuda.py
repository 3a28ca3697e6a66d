"""Host↔GPU and GPU↔GPU copy bandwidths, and the PCIe efficiency they show (PyTorch with CUDA only)."""

from __future__ import annotations

import contextlib
import math
import os
import socket
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from hwprofile._common import _now
from momentbase.units import format_size
from planner.capacities import LinkCapacity, PcieEfficiency
from planner.hostinfo import gpu_numa_node, numa_nodes, props_bus_address
from planner.progress import Progress, report
from planner.topology.model import Topology
from planner.topology.pcie import pcie_bytes_per_s

__all__ = ["cuda_bandwidths"]


def _gpu_node(topo: Topology | None, props: Any, ordinal: int = 0) -> tuple[str, str | None]:
    """(key to write, topology node id or None) of CUDA device ``ordinal``.

    Without a bus address (PyTorch before the ``pci_*`` properties) the key is
    the device's UUID where torch gives one, else its ordinal: never the model
    name alone, which two GPUs of one model share (their figures would collide).
    """
    addr = props_bus_address(props)
    if addr is None:
        uuid = str(getattr(props, "uuid", "") or "")
        ident = f"GPU-{uuid.removeprefix('GPU-')}" if uuid else str(ordinal)
        return f"cuda:{ident}:{getattr(props, 'name', '?')}", None
    node = topo.find(addr) if topo is not None else None
    return (node.id if node is not None else addr), (node.id if node is not None else None)


@contextlib.contextmanager
def _on_numa_node(numa: int | None, sys_root: str | os.PathLike[str]) -> Iterator[bool]:
    """Run the block on ``numa``'s CPUs (first-touch puts new pages there); yields whether it could."""
    cpus = numa_nodes(sys_root).get(numa, set()) if numa is not None else set()
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    usable = cpus & allowed if allowed is not None else set()
    if not usable:
        yield False
        return
    os.sched_setaffinity(0, usable)
    try:
        yield True
    finally:
        os.sched_setaffinity(0, allowed)


def cuda_bandwidths(topo: Topology | None = None, bytes: int = 256 << 20, repeats: int = 5,
                    progress: Progress | None = None, sys_root: str | os.PathLike[str] = "/sys"
                    ) -> tuple[list[LinkCapacity], PcieEfficiency | None, list[str]]:
    """Host→device, device→host and peer copy bandwidths of every CUDA device.

    Needs PyTorch with CUDA (imported here, not by the planner): without it,
    returns no figures and a note saying why. Host buffers are pinned and
    allocated, page-locked and copied from the GPU's own NUMA node (the socket
    its PCIe link goes to; a buffer on the other socket would measure the
    inter-socket link too); each figure is the best of ``repeats`` copies of
    ``bytes``, timed with CUDA events. The measured protocol efficiency is the
    median over GPUs of host→device bandwidth / the encoded rate of the GPU's
    link (generation × width from ``topo``).
    """
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return [], None, ["host↔GPU and GPU↔GPU links: not measured: PyTorch is not installed"]
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # a broken driver raises assorted errors
        return [], None, [f"host↔GPU and GPU↔GPU links: not measured: CUDA failed ({exc})"]
    if count == 0:
        return [], None, ["host↔GPU and GPU↔GPU links: not measured: no CUDA device"]

    host, date = socket.gethostname(), _now()
    n = int(bytes)
    links: list[LinkCapacity] = []
    notes: list[str] = []
    effs: list[float] = []
    keys = []
    for i in range(count):
        key, host_links, note, eff_i = _host_links(torch, i, topo, n, repeats, progress, sys_root, host, date)
        keys.append(key)
        links.extend(host_links)
        notes.extend(note)
        if eff_i is not None:
            effs.append(eff_i)
    peer, peer_notes = _peer_links(torch, keys, n, repeats, progress, host, date)
    links.extend(peer)
    notes.extend(peer_notes)
    eff = None
    if effs:
        effs.sort()
        eff = PcieEfficiency(round(effs[len(effs) // 2], 4),
                             derived_from=f"median over {len(effs)} GPU(s) of host-to-device "
                                          "bandwidth / encoded PCIe rate of the GPU's link")
    else:
        notes.append("PCIe protocol efficiency: not measured: no GPU with a known link "
                     "generation and width in the topology")
    return links, eff, notes


@contextlib.contextmanager
# Any: a torch tensor (torch is imported lazily here, its type is not named at module level)
def _local_pinned(torch: ModuleType, n: int) -> Iterator[tuple[Any, str | None]]:
    """``n`` fresh bytes, first touched by the calling thread (its NUMA node), page-locked while the block runs.

    Not ``torch.empty(pin_memory=True)``: PyTorch's caching host allocator
    keeps a freed pinned block and hands it to the next request of its size,
    so every GPU after the first would be measured with GPU 0's block, on GPU
    0's node. The pages are allocated and touched here and registered in
    place (``cudaHostRegister``), then unregistered. Yields the tensor and a
    note when registration was refused (then the copies run from pageable
    memory, said).
    """
    import numpy as np

    host = np.empty(n, np.uint8)
    host.fill(0)  # first touch: the pages land on this thread's node
    t = torch.from_numpy(host)
    cudart = torch.cuda.cudart()
    rc = int(cudart.cudaHostRegister(t.data_ptr(), n, 0))
    try:
        yield t, (None if rc == 0 else f"cudaHostRegister refused ({rc}): copies measured from pageable memory")
    finally:
        if rc == 0:
            cudart.cudaHostUnregister(t.data_ptr())


def _best_bytes_per_s(torch: ModuleType, copy: Callable[[], object], device: int, n: int, repeats: int) -> float:
    """``n`` bytes over the fastest of ``repeats`` runs of ``copy`` (after a warm-up), timed with CUDA events."""
    best = math.inf
    with torch.cuda.device(device):
        copy()  # warm up
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            copy()
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1000.0)
    return n / best


def _host_links(torch: ModuleType, i: int, topo: Topology | None, n: int, repeats: int, progress: Progress | None,
                sys_root: str | os.PathLike[str], host: str, date: str
                ) -> tuple[str, list[LinkCapacity], list[str], float | None]:
    """GPU ``i``'s host→device and device→host figures from its own NUMA node: its key, links, notes, efficiency.

    The efficiency (host→device bandwidth over the encoded rate of its link)
    is None when ``topo`` does not know the link's generation and width.
    """
    props = torch.cuda.get_device_properties(i)
    key, node_id = _gpu_node(topo, props, i)
    report(progress, f"GPU {i} ({props.name}): host↔device copies of {format_size(n)}")
    numa = gpu_numa_node(props_bus_address(props), topo, sys_root)
    with _on_numa_node(numa, sys_root) as local, _local_pinned(torch, n) as (pinned, how):
        dev = torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}")
        h2d = _best_bytes_per_s(torch, lambda d=dev, p=pinned: d.copy_(p, non_blocking=True), i, n, repeats)
        d2h = _best_bytes_per_s(torch, lambda d=dev, p=pinned: p.copy_(d, non_blocking=True), i, n, repeats)
        del dev
    where = (f"pinned host buffer on NUMA node {numa}, the GPU's" if local else
             "pinned host buffer where the OS put it (the GPU's NUMA node is not known or not usable)")
    notes = [] if local else [f"GPU {i}: host↔device copies not pinned to the GPU's socket ({where})"]
    if how:
        notes.append(f"GPU {i}: {how}")
    links = [LinkCapacity(bw, link_class=cls, device=key, transfer_bytes=n, tool="torch-cuda", date=date, host=host,
                          note=where) for cls, bw in (("host-to-device", h2d), ("device-to-host", d2h))]
    eff = None
    if topo is not None and node_id is not None:
        parent = topo.parent(node_id)
        lk = topo.link_between(parent.id, node_id) if parent is not None else None
        if lk is not None and lk.pcie_gen and lk.lanes:
            eff = min(1.0, h2d / pcie_bytes_per_s(lk.pcie_gen, lk.lanes, 1.0))
    return key, links, notes, eff


def _peer_links(
    torch: ModuleType, keys: list[str], n: int, repeats: int, progress: Progress | None, host: str, date: str
) -> tuple[list[LinkCapacity], list[str]]:
    """GPU → GPU copy figures of every ordered pair with peer access; notes for the pairs without."""
    links: list[LinkCapacity] = []
    notes: list[str] = []
    for i in range(len(keys)):
        for j in range(len(keys)):
            if i == j:
                continue
            if not torch.cuda.can_device_access_peer(i, j):
                notes.append(f"GPU {i} → GPU {j}: not measured: no peer access")
                continue
            report(progress, f"GPU {i} → GPU {j}: peer copies of {format_size(n)}")
            a = torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}")
            b = torch.empty(n, dtype=torch.uint8, device=f"cuda:{j}")
            bw = _best_bytes_per_s(torch, lambda a=a, b=b: b.copy_(a, non_blocking=True), i, n, repeats)
            links.append(LinkCapacity(bw, src=keys[i], dst=keys[j], link_class="peer-to-peer",
                                      transfer_bytes=n, tool="torch-cuda", date=date, host=host))
            del a, b
    return links, notes

