"""The tiered feature store: ``gather(ids)`` from GPU caches, CPU caches and SSD bins.

>>> import numpy as np, tempfile, torch
>>> from iostack.bins import write_bins
>>> from iostack.placement import simple_placement
>>> feats = np.arange(20, dtype=np.float32).reshape(10, 2)
>>> p = simple_placement(10, [("gpu", 2), ("cpu", 3), ("ssd", 5)])
>>> with tempfile.TemporaryDirectory() as d:
...     _ = write_bins(feats, p, d)
...     with FeatureStore(p, d, features=feats, backend_options={"processes": 0}) as s:
...         s.gather(torch.tensor([9, 0, 4, 9]))[:, 0].tolist()
[18.0, 0.0, 8.0, 18.0]
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from iostack.backends import get_backend
from iostack.backends.base import aligned_empty
from iostack.bins import open_bin
from iostack.errors import StoreError
from iostack.placement import Placement

#: latency samples kept per bin (a ring: the most recent gathers)
RESERVOIR = 1024


@dataclass(frozen=True)
class BinStats:
    """What one bin served: rows, bytes, read requests (SSD: after coalescing), latency of its part of a gather."""

    bin_id: int
    kind: str
    rows: int
    bytes: int
    requests: int
    calls: int
    latency_p50_s: float
    latency_p99_s: float


class _Counter:
    __slots__ = ("rows", "bytes", "requests", "calls", "ring", "lock")

    def __init__(self) -> None:
        self.rows = self.bytes = self.requests = self.calls = 0
        self.ring = np.zeros(RESERVOIR, np.float64)
        self.lock = threading.Lock()

    def add(self, rows: int, nbytes: int, requests: int, seconds: float) -> None:
        with self.lock:
            self.ring[self.calls % RESERVOIR] = seconds
            self.rows += rows
            self.bytes += nbytes
            self.requests += requests
            self.calls += 1


class FeatureStore:
    """Feature rows of ``placement``'s vertices, served from its bins.

    ``bin_dir``: where the SSD bin files are (relative bin paths resolve there).
    ``features`` (``(V, dim)`` array or memmap): source of the GPU and CPU tiers,
    copied in once; needed only when the placement has such bins. GPU bins get
    a device tensor on their ``device`` (``cuda:N``); without CUDA (tests, this
    machine) a "gpu" bin is held on the CPU, which exercises the same code path
    except for the device. CPU bins are host tensors in shared memory
    (``share_memory_()``, so trainer processes map them once), pinned on a CUDA
    machine. SSD bins are read by ``backend`` (``"auto"``, ``"posix"``,
    ``"kvikio"``, or a :class:`~iostack.backends.ReadBackend`).
    ``device``: where :meth:`gather` puts its result by default.
    Safe to call from several threads at once.
    """

    def __init__(self, placement: Placement, bin_dir: str | os.PathLike[str] | None = None, *,
                 features: np.ndarray | None = None, backend: Any = "auto",
                 backend_options: dict[str, Any] | None = None, device: str | torch.device = "cpu",
                 full_check: bool = False) -> None:
        self.placement = placement
        self.device = torch.device(device)
        kinds = {b.kind for b in placement.bins}
        self._bin_of = torch.from_numpy(np.ascontiguousarray(placement.bin_of).astype(np.int64))
        self._row_of = torch.from_numpy(np.array(placement.row_of, np.int64))  # a writable copy
        self._tensors: dict[int, torch.Tensor] = {}
        self._handles: dict[int, Any] = {}
        self._counters = {b.id: _Counter() for b in placement.bins}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        cuda = torch.cuda.is_available()
        dtype, dim = None, None
        if features is not None:
            dtype, dim = np.dtype(features.dtype), int(features.shape[1]) if features.ndim == 2 else 1
        elif kinds & {"gpu", "cpu"}:
            raise StoreError("the placement has GPU or CPU bins: pass features= to fill them")
        self.backend = None
        if "ssd" in kinds:
            if bin_dir is None:
                raise StoreError("the placement has SSD bins: pass bin_dir, the directory of the bin files")
            self.backend = (get_backend(backend, **(backend_options or {})) if isinstance(backend, str)
                            else backend)
            try:
                for b in placement.bins:
                    if b.kind != "ssd":
                        continue
                    used = placement.row_of[placement.bin_of == b.id]
                    info = open_bin(bin_dir, b, dtype=dtype, dim=dim, full_check=full_check,
                                    min_rows=int(used.max()) + 1 if used.size else 0)
                    dtype, dim = np.dtype(info.dtype), info.dim
                    self._handles[b.id] = self.backend.open(info)
            except BaseException:
                self.close()
                raise
        if dtype is None:
            raise StoreError("no features and no SSD bins: nothing says the rows' dtype and width")
        self.dtype_np, self.dim = dtype, dim
        self.dtype = torch.from_numpy(np.empty(0, dtype)).dtype
        self.row_bytes = dim * dtype.itemsize
        feats = None if features is None else (features.reshape(-1, 1) if features.ndim == 1 else features)
        for b in placement.bins:
            if b.kind == "ssd":
                continue
            verts = placement.vertices_of(b.id)
            rows = int(placement.row_of[verts[-1]]) + 1 if verts.size else 0
            t = torch.zeros((rows, dim), dtype=self.dtype)
            for a in range(0, verts.size, 1 << 16):  # bounded copies out of a memmap
                v = verts[a:a + (1 << 16)]
                t[torch.from_numpy(placement.row_of[v])] = torch.from_numpy(np.ascontiguousarray(feats[v]))
            if b.kind == "gpu" and cuda:
                t = t.to(b.device if b.device and b.device.startswith("cuda") else "cuda")
            elif b.kind == "cpu":
                t.share_memory_()
                if cuda:
                    t = t.pin_memory()
            self._tensors[b.id] = t

    # ------------------------------------------------------------------
    @property
    def num_vertices(self) -> int:
        return self.placement.num_vertices

    def direct_io(self) -> dict[int, tuple[bool, str | None]]:
        """Per SSD bin: whether reads bypass the page cache (O_DIRECT), and why not."""
        return {i: (h.direct, h.note) for i, h in self._handles.items()}

    def memory_bytes(self) -> dict[str, int]:
        """Memory the store holds, bytes: per tier (``gpu``, ``cpu``) and the backend's buffers (``buffers``)."""
        out = {"gpu": 0, "cpu": 0, "buffers": self.backend.buffer_bytes if self.backend else 0}
        for i, t in self._tensors.items():
            out[self.placement.bins[i].kind] += t.numel() * t.element_size()
        return out

    def gather(self, ids: torch.Tensor | np.ndarray, device: str | torch.device | None = None) -> torch.Tensor:
        """Rows of ``ids`` (1-D int, any order, duplicates fine), shape ``(len(ids), dim)``, on ``device``.

        ``out[i]`` is the feature row of vertex ``ids[i]``.
        """
        dev = torch.device(device) if device is not None else self.device
        ids_t = torch.as_tensor(ids).reshape(-1).to("cpu", torch.int64)
        n = ids_t.numel()
        on_host = dev.type == "cpu"
        if on_host:  # page-aligned, so that O_DIRECT reads of SSD rows land in the result itself
            out_np = aligned_empty(n, self.row_bytes)
            out = torch.from_numpy(out_np.view(self.dtype_np).reshape(n, self.dim))
        else:
            out = torch.empty((n, self.dim), dtype=self.dtype, device=dev)
        if n == 0:
            return out
        if ids_t.min() < 0 or ids_t.max() >= self.num_vertices:
            bad = int(ids_t[(ids_t < 0) | (ids_t >= self.num_vertices)][0])
            raise IndexError(f"vertex {bad} is not in the store ({self.num_vertices} vertices)")
        bins = self._bin_of[ids_t]
        rows = self._row_of[ids_t]
        # one pass over bins present in this request, grouped by a sort
        order = torch.argsort(bins, stable=True)
        present, counts = torch.unique_consecutive(bins[order], return_counts=True)
        start = 0
        for b, c in zip(present.tolist(), counts.tolist(), strict=True):
            pos = order[start:start + c]
            start += c
            t0 = time.perf_counter()
            r = rows[pos]
            tensor = self._tensors.get(b)
            if tensor is not None:
                vals = tensor.index_select(0, r.to(tensor.device))
                requests = 1
            elif on_host:
                requests = self.backend.read_rows_at(self._handles[b], r.numpy(), out_np, pos.numpy())
                self._counters[b].add(c, c * self.row_bytes, requests, time.perf_counter() - t0)
                continue
            else:
                buf = aligned_empty(c, self.row_bytes)  # page-aligned: O_DIRECT reads land in it, no staging copy
                requests = self.backend.read_rows(self._handles[b], r.numpy(), buf)
                vals = torch.from_numpy(buf.view(self.dtype_np).reshape(c, self.dim))
            out[pos.to(dev)] = vals.to(dev, non_blocking=True)
            self._counters[b].add(c, c * self.row_bytes, requests, time.perf_counter() - t0)
        return out

    def gather_async(self, ids: torch.Tensor | np.ndarray,
                     device: str | torch.device | None = None) -> concurrent.futures.Future:
        """:meth:`gather` on a background thread: a Future of the tensor (to overlap with compute)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="moment-gather")
        return self._pool.submit(self.gather, ids, device)

    def stats(self) -> list[BinStats]:
        """Counters per bin since the store opened (or :meth:`reset_stats`)."""
        out = []
        for b in self.placement.bins:
            c = self._counters[b.id]
            with c.lock:
                lat = c.ring[:min(c.calls, RESERVOIR)].copy()
                rows, nbytes, req, calls = c.rows, c.bytes, c.requests, c.calls
            p50, p99 = (np.percentile(lat, [50, 99]).tolist() if lat.size else (0.0, 0.0))
            out.append(BinStats(b.id, b.kind, rows, nbytes, req, calls, p50, p99))
        return out

    def tier_stats(self) -> dict[str, dict[str, float]]:
        """Counters summed per tier (``gpu``, ``cpu``, ``ssd``): rows, bytes, requests, share of rows."""
        st = self.stats()
        total = sum(s.rows for s in st) or 1
        out: dict[str, dict[str, float]] = {}
        for s in st:
            t = out.setdefault(s.kind, {"rows": 0, "bytes": 0, "requests": 0, "share": 0.0})
            t["rows"] += s.rows
            t["bytes"] += s.bytes
            t["requests"] += s.requests
            t["share"] = t["rows"] / total
        return out

    def reset_stats(self) -> None:
        self._counters = {b.id: _Counter() for b in self.placement.bins}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.backend is not None:
            for h in self._handles.values():
                self.backend.close_handle(h)
            self.backend.close()
            self._handles.clear()

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
