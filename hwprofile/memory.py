"""DRAM bandwidth, per NUMA node: numpy copies counted as STREAM's "copy" counts them."""

from __future__ import annotations

import math
import os
import socket
import time

from hwprofile._common import _now
from momentbase.units import format_size
from planner.capacities import MemoryCapacity
from planner.errors import ProfileError
from planner.hostinfo import numa_nodes
from planner.progress import Progress, report

__all__ = ["host_memory_bandwidth", "memory_bandwidth_by_node"]


def host_memory_bandwidth(bytes: int = 256 << 20, repeats: int = 5, threads: int = 1) -> float:
    """DRAM bandwidth in bytes/s: the best of ``repeats`` numpy copies of ``bytes`` bytes.

    Counted as the STREAM benchmark's "copy" does: each copy reads
    ``bytes`` and writes ``bytes``, so the figure is ``2 × bytes / time``.
    ``threads`` threads copy a slice each (numpy releases the GIL while
    copying); one thread rarely reaches a socket's full bandwidth. Both
    arrays are written before timing so their pages are in place, and the
    arrays should be well beyond the CPU caches (the default 256 MiB is).

    >>> host_memory_bandwidth(4 << 20, repeats=1) > 0
    True
    """
    import threading

    import numpy as np

    n = int(bytes)
    if n < 4096 or repeats < 1 or threads < 1:
        raise ProfileError("memory test: expected at least 4 KiB, one repeat and one thread")
    src = np.empty(n, dtype=np.uint8)
    src.fill(1)
    dst = np.empty_like(src)
    dst.fill(0)
    bounds = [(n * i // threads) // 4096 * 4096 for i in range(threads)] + [n]
    slices = [(src[a:b], dst[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    best = math.inf
    for _ in range(repeats):
        if len(slices) == 1:
            t0 = time.perf_counter()
            np.copyto(slices[0][1], slices[0][0])
            dt = time.perf_counter() - t0
        else:
            workers = [threading.Thread(target=np.copyto, args=(d, s)) for s, d in slices]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            dt = time.perf_counter() - t0
        best = min(best, dt)
    return 2.0 * n / best


def memory_bandwidth_by_node(bytes: int = 256 << 20, repeats: int = 5, threads: int | None = None,
                             sys_root: str | os.PathLike[str] = "/sys",
                             progress: Progress | None = None
                             ) -> tuple[list[MemoryCapacity], list[str]]:
    """DRAM bandwidth of each NUMA node, and notes on nodes not measured.

    For each node, the calling thread is pinned to that node's CPUs while
    the arrays are allocated and written (Linux places a page on the node of
    the CPU that first touches it) and copied, then unpinned. ``threads``
    defaults to the node's CPUs this process may use, at most 8. Without
    NUMA information in sysfs, one figure for ``all`` is measured.
    """
    nodes = numa_nodes(sys_root)
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    out: list[MemoryCapacity] = []
    notes: list[str] = []
    host, date = socket.gethostname(), _now()

    def entry(numa: int | None, bw: float, t: int) -> MemoryCapacity:
        return MemoryCapacity(numa, bw, method="numpy-copy", convention="stream-copy",
                              array_bytes=int(bytes), repeats=repeats, threads=t, date=date, host=host)

    if not nodes or allowed is None:
        t = threads or min(8, os.cpu_count() or 1)
        report(progress, f"memory: numpy copy of {format_size(bytes)}, {t} thread(s)")
        out.append(entry(None, host_memory_bandwidth(bytes, repeats, t), t))
        return out, notes
    for numa, cpus in nodes.items():
        usable = cpus & allowed
        if not usable:
            notes.append(f"memory of NUMA node {numa}: not measured: "
                         + ("the node has no CPUs" if not cpus else "none of its CPUs may be used here"))
            continue
        t = threads or min(8, len(usable))
        report(progress, f"memory of NUMA node {numa}: numpy copy of {format_size(bytes)}, {t} thread(s)")
        try:
            os.sched_setaffinity(0, usable)
            bw = host_memory_bandwidth(bytes, repeats, t)
        finally:
            os.sched_setaffinity(0, allowed)
        out.append(entry(numa, bw, t))
    return out, notes

