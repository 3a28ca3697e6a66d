"""What a feature store's bins served: :class:`BinStats` per bin, kept by a :class:`Counter` each."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from iostack.transfer import DeviceMemory

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

    __slots__ = ("rows", "bytes", "requests", "calls", "ring", "lock", "pending", "seconds", "pages", "read_rows")

    def __init__(self) -> None:
        self.rows = self.bytes = self.requests = self.calls = self.pages = self.read_rows = 0
        self.seconds = 0.0  # all calls' time together (what a prediction of read time is checked against)
        self.ring = np.zeros(RESERVOIR, np.float64)
        self.lock = threading.Lock()
        self.pending: list[tuple[Any, Any]] = []

    def add(self, rows: int, nbytes: int, requests: int, seconds: float | None,
            marks: tuple[Any, Any] | None = None, *, pages: int = 0, read_rows: int = 0) -> None:
        with self.lock:
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


__all__ = ["RESERVOIR", "BinStats", "Counter"]
