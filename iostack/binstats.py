"""What a feature store's bins served: :class:`BinStats` per bin, kept by a :class:`Counter` each (in the tier
serving the bin), and their sums per kind of tier."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from iostack.placement import Bin, Placement
from iostack.transfer import DeviceMemory, Mark


class Held(Protocol):
    """What the figures need of a tier (:class:`iostack.tiers.Tier`, whose module imports this one): where its
    rows are."""

    held: str

#: latency samples kept per bin (a ring: the most recent gathers)
RESERVOIR = 1024


@dataclass(frozen=True)
class BinStats:
    """What one bin served: rows, bytes, read requests (SSD: after coalescing, this process's own), latency of its
    part of a gather.

    ``held``: where its rows were served from: ``device`` (a GPU cache on this
    store's GPU), ``host`` (host memory) or ``file`` (an SSD bin). GPU-tier
    latencies on a device are timed with device events (the work, not its launch).
    """

    bin_id: int
    kind: str
    rows: int
    bytes: int
    requests: int
    calls: int
    latency_p50_s: float
    latency_p99_s: float
    held: str = "host"
    #: SSD bins: 4 KiB pages and distinct rows this process read from the file (with node-shared reads its
    #: part of the node's union; ``rows`` stays the rows its gathers were served)
    pages: int = 0
    read_rows: int = 0


class Counter:
    """A bin's running counts and its latest latencies (a ring of :data:`RESERVOIR`), safe across threads.

    Device-timed latencies arrive as event pairs (``marks``) and become seconds
    in :meth:`resolve`, so a gather never waits on the device to count.
    """

    __slots__ = ("rows", "bytes", "requests", "calls", "ring", "lock", "pending", "seconds", "pages", "read_rows",
                 "cpu_wait_s")

    def __init__(self) -> None:
        self.rows = self.bytes = self.requests = self.calls = self.pages = self.read_rows = 0
        self.seconds = 0.0  # all calls' time together (what a prediction of read time is checked against)
        self.cpu_wait_s = 0.0  # of which the calling threads waited for a core (a loaded machine's share)
        self.ring = np.zeros(RESERVOIR, np.float64)
        self.lock = threading.Lock()
        self.pending: list[tuple[Mark, Mark]] = []

    def add(self, rows: int, nbytes: int, requests: int, seconds: float | None,
            marks: tuple[Mark, Mark] | None = None, *, pages: int = 0, read_rows: int = 0,
            cpu_wait_s: float = 0.0) -> None:
        with self.lock:
            self.cpu_wait_s += cpu_wait_s
            self.pages += pages
            self.read_rows += read_rows
            if marks is not None:
                self.pending.append(marks)
            else:
                self.ring[self.calls % RESERVOIR] = seconds
                self.seconds += seconds or 0.0
            self.rows += rows
            self.bytes += nbytes
            self.requests += requests
            self.calls += 1

    def add_disk(self, requests: int, pages: int, read_rows: int, seconds: float) -> None:
        """Reads this process made for others too (its part of a node-shared step): no call, no rows served."""
        with self.lock:
            self.requests += requests
            self.pages += pages
            self.read_rows += read_rows
            self.seconds += seconds

    def resolve(self, memory: DeviceMemory, keep: int = 0) -> None:
        """Turn device marks into seconds (waits for them), all but the newest ``keep``."""
        with self.lock:
            done, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
            filled = self.calls - len(self.pending) - len(done)
        for i, (a, b) in enumerate(done):
            s = memory.seconds(a, b)
            with self.lock:
                self.ring[(filled + i) % RESERVOIR] = s
                self.seconds += s


class _Schedstat:
    """The calling thread's ``/proc/thread-self/schedstat``, opened once: a ``pread`` of the open file
    costs about a tenth of an open-read-close, which matters twice per SSD read call. Closed with the
    thread's local storage when the thread ends; opened again in a forked child (the file names the
    thread that opened it)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        try:
            self.fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = None

    def __del__(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


_SCHEDSTAT = threading.local()


def thread_wait_s() -> float:
    """Seconds the calling thread has waited in the run queue for a core since it began
    (``/proc/thread-self/schedstat``, second field); 0.0 where the kernel does not say. Read before and
    after a read call, the difference is the call's time lost to a loaded machine's time slicing."""
    stat = getattr(_SCHEDSTAT, "stat", None)
    if stat is None or stat.pid != os.getpid():
        stat = _SCHEDSTAT.stat = _Schedstat()
    if stat.fd is None:
        return 0.0
    try:
        return int(os.pread(stat.fd, 96, 0).split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return 0.0


def bin_stats(placement: Placement, tier_at: Mapping[int, Held], memory: DeviceMemory) -> list[BinStats]:
    """Counters per bin of ``placement`` (``tier_at[bin]``: the tier serving it, with its ``counters`` and
    ``held``); waits for pending device timings."""
    out = []
    for b in placement.bins:
        tier = tier_at[b.id]
        c = tier.counters[b.id]
        c.resolve(memory)
        with c.lock:
            lat = c.ring[:min(c.calls, RESERVOIR)].copy()
            rows, nbytes, req, calls, pages, read = c.rows, c.bytes, c.requests, c.calls, c.pages, c.read_rows
        p50, p99 = (np.percentile(lat, [50, 99]).tolist() if lat.size else (0.0, 0.0))
        out.append(BinStats(b.id, b.kind, rows, nbytes, req, calls, p50, p99, tier.held, pages, read))
    return out


def tier_stats(placement: Placement, tier_at: Mapping[int, Held]) -> dict[str, dict[str, float]]:
    """Counters summed per tier kind (``gpu``, ``cpu``, ``ssd``; ``gpu-peer`` for rows of another GPU's
    partition served from host memory): rows, bytes, requests, seconds of the calls that read them, share of
    rows."""
    out: dict[str, dict[str, float]] = {}
    total = 0
    for b in placement.bins:
        c = tier_at[b.id].counters[b.id]
        # no resolve() here: the trainer asks every batch, and resolving waits on the device;
        # GPU-tier seconds count once stats() resolved them
        with c.lock:
            got = {"rows": c.rows, "bytes": c.bytes, "requests": c.requests, "seconds": c.seconds,
                   "pages": c.pages, "read_rows": c.read_rows, "cpu_wait_s": c.cpu_wait_s}
        t = out.setdefault(kind_of(b, tier_at[b.id].held),
                           {k: 0 for k in got} | {"seconds": 0.0, "cpu_wait_s": 0.0, "share": 0.0})
        for k, v in got.items():
            t[k] += v
        total += got["rows"]
    for t in out.values():
        t["share"] = t["rows"] / (total or 1)
    return out


def tier_rows(placement: Placement, tier_at: Mapping[int, Held], bin_of: np.ndarray, ids: np.ndarray,
              row_bytes: int) -> dict[str, tuple[int, int]]:
    """Rows and bytes a gather of ``ids`` adds to each kind of :func:`tier_stats`, counted from the placement
    alone (``bin_of``: each vertex's bin): a batch's own figures while other threads gather too."""
    per_bin = np.bincount(bin_of[np.asarray(ids, np.int64).reshape(-1)],
                          minlength=max(b.id for b in placement.bins) + 1)
    out: dict[str, tuple[int, int]] = {}
    for b in placement.bins:
        kind = kind_of(b, tier_at[b.id].held)
        r = out.get(kind, (0, 0))[0] + int(per_bin[b.id])
        out[kind] = (r, r * row_bytes)
    return out


def kind_of(b: Bin, held: str) -> str:
    """The kind bin ``b`` counts in: its own, ``gpu-peer`` for another GPU's partition held on the host."""
    return "gpu-peer" if b.kind == "gpu" and held == "host" else b.kind


__all__ = ["RESERVOIR", "BinStats", "Counter", "bin_stats", "kind_of", "tier_rows", "tier_stats"]
