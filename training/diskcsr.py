"""A CSR whose ``indices`` stay on the SSD: the neighbour lists a batch samples, read with direct I/O.

At IGB-HOM's 4 B edges the CSR's ``indices.npy`` alone is 16-32 GB, more than
the page cache of the machines Moment targets, and a memory map of it turns
every sampled neighbour into a synchronous page fault. :class:`DiskNeighbours`
stands in for the ``indices`` tensor of :class:`training.sampler.NeighborSampler`
(it is a :class:`~training.sampler.NeighbourSource`): the sampler draws its
positions from the degrees alone (``indptr``), then asks for ``indices[pos]``
of a whole hop at once, and this reads them:

- from the **hot-vertex adjacency cache** when the position lies in a cached
  vertex's list: the highest-degree vertices' whole lists, held in memory up
  to a byte budget (:func:`hot_vertices`). Degree is the right order for
  uniform sampling: a vertex enters a frontier about as often as it has
  neighbours, and each visit of a vertex of degree ``d`` reads up to
  ``min(fanout, d / items per page)`` pages, so the reads saved per cached
  byte never fall as the degree grows;
- else from ``indices.npy`` through :class:`iostack.pagefile.PagedFile`: the
  distinct pages holding the hop's positions, sorted, neighbouring pages
  coalesced into one request (optionally gaps of a few pages too:
  :data:`DEFAULT_GAP_PAGES`), read with O_DIRECT through the feature store's engines (native
  AIO / io_uring), buffered where the file system refuses O_DIRECT.

Only the pages holding *sampled* positions are read, not each frontier
vertex's whole ``[indptr[v], indptr[v + 1])``: for a vertex whose degree is at
most the fan-out (most of a power-law graph) that is its whole list, and for a
high-degree vertex it is at most ``fanout`` pages of its list instead of all of
them. The values are exactly ``indices[pos]``, so the sampler draws the same
batches from the same seed as it does over the in-memory CSR.

``indptr`` (``8 × (num_nodes + 1)`` bytes: 0.9 GB at papers100M's 111 M
vertices) stays a memory map: the sampler reads two entries per frontier
vertex, the pages it touches stay in the page cache while there is room, and
the kernel evicts them under a memory limit like any clean file page.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from iostack.backends.base import ReadBackend
from iostack.errors import StoreError
from iostack.pagefile import DEFAULT_BUFFER_BYTES, PagedFile, PageReads
from training.errors import TrainingError

#: vertices per step of the passes over ``indptr`` (8 MiB of int64 degrees; each step's temporaries are
#: a few times that, which must fit beside the cache under a tight memory limit)
CHUNK_VERTICES = 1 << 20
#: pages of a gap between two needed pages that a lookup reads rather than split the request there (a disk
#: that caps requests per second, not bytes, gains). Off: on a 1.9e8-edge R-MAT graph (25,10, batch 1024,
#: 64 MiB cache, 512 MiB cgroup, tools/bench_csr_ssd.py) 6-page gaps gave 1.05, 0.90, 0.94 and 1.16x the
#: edges/s of none (medians of four interleaved runs of 3-5 rounds, load 3-11): no gain beyond noise.
#: ``open_disk_csr(max_gap_pages=...)`` and the bench's ``disk-gap`` mode keep it measurable
DEFAULT_GAP_PAGES = 0
#: positions per step while the adjacency cache is filled (each costs ~60 bytes of temporaries)
FILL_CHUNK_ITEMS = 1 << 20

__all__ = ["CHUNK_VERTICES", "DEFAULT_GAP_PAGES", "FILL_CHUNK_ITEMS", "AdjacencyCache", "CsrReadStats",
           "DiskCsrError", "DiskNeighbours", "hot_vertices", "npy_layout", "open_disk_csr"]


class DiskCsrError(TrainingError):
    """An ``indices.npy`` that cannot be read from disk as a CSR's neighbour lists, or a bad cache budget."""


@dataclass(frozen=True)
class CsrReadStats:
    """What the sampler asked of a :class:`DiskNeighbours` so far: edges (positions) looked up, those
    the adjacency cache served, and the SSD reads for the rest (pages, requests, bytes, seconds inside them)."""

    edges: int = 0
    cached_edges: int = 0
    pages: int = 0
    requests: int = 0
    bytes_read: int = 0
    read_s: float = 0.0

    @property
    def cache_hit_rate(self) -> float:
        """Share of looked-up edges the adjacency cache served (0 before any)."""
        return self.cached_edges / self.edges if self.edges else 0.0

    def __sub__(self, other: CsrReadStats) -> CsrReadStats:
        return CsrReadStats(self.edges - other.edges, self.cached_edges - other.cached_edges,
                            self.pages - other.pages, self.requests - other.requests,
                            self.bytes_read - other.bytes_read, self.read_s - other.read_s)

    def to_dict(self) -> dict:
        return {"edges": self.edges, "cached_edges": self.cached_edges, "cache_hit_rate": self.cache_hit_rate,
                "pages": self.pages, "requests": self.requests, "bytes_read": self.bytes_read,
                "read_s": self.read_s}


def npy_layout(path: str | Path) -> tuple[np.dtype, tuple[int, ...], int]:
    """``(dtype, shape, byte offset of the data)`` of a C-ordered ``.npy`` file, from its header alone.

    Raises
    ------
    DiskCsrError
        The file is not a readable ``.npy``, or is Fortran-ordered.
    """
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
    except (OSError, ValueError) as exc:
        raise DiskCsrError(f"{path}: not a readable .npy file ({exc})") from None
    if fortran and len(shape) > 1:
        raise DiskCsrError(f"{path}: Fortran-ordered arrays are not supported; save it C-ordered")
    return np.dtype(dtype), tuple(shape), int(offset)


def _degree_classes(indptr: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct degrees (ascending) and how many vertices have each, in one chunked pass over ``indptr``."""
    degs, counts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    n = indptr.shape[0] - 1
    for a in range(0, n, chunk):
        d, c = np.unique(np.diff(np.asarray(indptr[a:min(n, a + chunk) + 1], np.int64)), return_counts=True)
        u, inv = np.unique(np.concatenate([degs[-1], d]), return_inverse=True)
        degs.append(u)
        counts.append(np.bincount(inv, weights=np.concatenate([counts[-1], c]), minlength=u.size).astype(np.int64))
    return degs[-1], counts[-1]


def hot_vertices(indptr: np.ndarray, budget_bytes: int, itemsize: int, *,
                 chunk: int = CHUNK_VERTICES) -> np.ndarray:
    """The vertices whose neighbour lists the adjacency cache holds, ascending int64 ids.

    Highest degree first, while their lists (``degree × itemsize`` bytes each)
    fit in ``budget_bytes``; among vertices of one degree, the lowest ids first;
    a degree class too large for what is left still gives what fits, and smaller
    degrees fill the rest. Isolated vertices are never taken. Memory: two
    passes over ``indptr`` in steps of ``chunk`` vertices, plus the distinct
    degrees (a few thousand on power-law graphs) and the result.

    >>> hot_vertices(np.array([0, 3, 4, 9, 9, 11]), 7 * 4, 4).tolist()   # degrees 3, 1, 5, 0, 2
    [2, 4]

    Raises
    ------
    DiskCsrError
        ``budget_bytes`` is negative.
    """
    if budget_bytes < 0:
        raise DiskCsrError(f"adjacency cache: the budget must be >= 0 bytes, got {budget_bytes}")
    if budget_bytes == 0:
        return np.zeros(0, np.int64)
    deg_u, count_u = _degree_classes(indptr, chunk)
    limit = np.zeros(deg_u.size, np.int64)  # vertices taken of each degree class
    left = int(budget_bytes)
    for i in range(deg_u.size - 1, -1, -1):
        size = int(deg_u[i]) * itemsize
        if size == 0 or left < size:
            continue
        limit[i] = min(int(count_u[i]), left // size)
        left -= int(limit[i]) * size
    seen = np.zeros(deg_u.size, np.int64)
    taken = []
    n = indptr.shape[0] - 1
    for a in range(0, n if limit.any() else 0, chunk):
        deg = np.diff(np.asarray(indptr[a:min(n, a + chunk) + 1], np.int64))
        cls = np.searchsorted(deg_u, deg)
        cand = np.flatnonzero(limit[cls] > 0)
        c = cls[cand]
        # rank of each candidate among this chunk's vertices of its class, in id order
        order = np.argsort(c, kind="stable")
        starts = np.searchsorted(c[order], c[order], side="left")
        rank = np.empty_like(c)
        rank[order] = np.arange(c.size) - starts
        keep = seen[c] + rank < limit[c]
        taken.append(cand[keep] + a)
        seen += np.bincount(c, minlength=deg_u.size)
    return np.concatenate(taken) if taken else np.zeros(0, np.int64)


@dataclass(frozen=True, eq=False)
class AdjacencyCache:
    """Whole neighbour lists of some vertices, in memory: ``starts``/``ends`` their CSR ranges (ascending,
    disjoint), ``offsets`` where each begins in ``values`` (the lists back to back, the dtype of ``indices``)."""

    vertices: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    offsets: np.ndarray
    values: np.ndarray

    def lookup(self, pos: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Write ``indices[pos[i]]`` into ``out[i]`` wherever a cached list holds ``pos[i]``; returns that mask."""
        if self.starts.size == 0:
            return np.zeros(pos.size, np.bool_)
        i = np.searchsorted(self.starts, pos, side="right") - 1
        ic = np.maximum(i, 0)
        hit = (i >= 0) & (pos < self.ends[ic])
        at = np.flatnonzero(hit)
        out[at] = self.values[self.offsets[ic[at]] + pos[at] - self.starts[ic[at]]]
        return hit


def _read_lists(file: PagedFile, data_offset: int, dtype: np.dtype, starts: np.ndarray, ends: np.ndarray,
                chunk_items: int) -> tuple[np.ndarray, PageReads]:
    """``indices[starts[i]:ends[i]]`` for every ``i``, back to back, read through ``file`` ``chunk_items`` at a time."""
    lens = ends - starts
    values = np.empty(int(lens.sum()), dtype)
    reads, done, v = PageReads(), 0, 0
    cum = np.cumsum(lens)
    while v < starts.size:
        # the lists of this step: at least one, at most chunk_items positions unless one list is longer
        w = max(v + 1, int(np.searchsorted(cum, done + chunk_items, side="right")))
        lo, hi = starts[v:w], lens[v:w]
        pos = np.repeat(lo - (np.cumsum(hi) - hi), hi) + np.arange(int(hi.sum()))
        got, r = file.gather(data_offset + pos * dtype.itemsize, dtype)
        values[done:done + got.size] = got
        reads, done, v = reads + r, done + got.size, w
    return values, reads


class DiskNeighbours:
    """``indices`` of a CSR read from its ``.npy`` file on demand, for :class:`training.sampler.NeighborSampler`.

    Args:
        path: the CSR's ``indices.npy`` (int32 or int64, one dimension).
        indptr: its row pointers (a memory map is fine; only read here to size and fill the cache).
        backend: the read backend (e.g. ``PosixBackend(processes=0)``): O_DIRECT where the file
            system allows it, through its asynchronous engine. Owned by this object: :meth:`close`
            closes it.
        cache_bytes: the adjacency cache's budget (0: none).
        max_buffer_bytes: pages read per round of a lookup (bounds the buffer).
        max_gap_pages: also read gaps of up to this many pages between needed ones (fewer requests).

    ``take(pos)`` is thread-safe (the prefetcher and evaluation may sample at once).
    """

    def __init__(self, path: str | Path, indptr: np.ndarray, backend: ReadBackend, *, cache_bytes: int = 0,
                 max_buffer_bytes: int = DEFAULT_BUFFER_BYTES, max_gap_pages: int = 0) -> None:
        dtype, shape, self.data_offset = npy_layout(path)
        num_edges = int(indptr[-1])
        if dtype.kind not in "iu" or dtype.itemsize not in (4, 8) or shape != (num_edges,):
            raise DiskCsrError(f"{path}: expected int32/int64 indices of shape ({num_edges},) to match indptr, "
                               f"got {dtype} {shape}")
        if self.data_offset % dtype.itemsize:
            raise DiskCsrError(f"{path}: the array's data starts at byte {self.data_offset}, not aligned to its "
                               f"{dtype.itemsize}-byte items; rewrite it with numpy.save")
        self.path, self.np_dtype, self.num_edges = str(path), dtype, num_edges
        self.dtype = torch.from_numpy(np.zeros(0, dtype)).dtype
        self.device = torch.device("cpu")
        self.backend = backend
        try:
            self.file = PagedFile(path, backend, max_buffer_bytes=max_buffer_bytes, max_gap_pages=max_gap_pages)
        except StoreError as exc:
            raise DiskCsrError(str(exc)) from None
        hot = hot_vertices(indptr, int(cache_bytes), dtype.itemsize)
        starts = np.asarray(indptr[hot], np.int64) if hot.size else np.zeros(0, np.int64)
        ends = np.asarray(indptr[hot + 1], np.int64) if hot.size else np.zeros(0, np.int64)
        values, self.fill_reads = _read_lists(self.file, self.data_offset, dtype, starts, ends, FILL_CHUNK_ITEMS)
        self.cache = AdjacencyCache(hot, starts, ends, np.cumsum(ends - starts) - (ends - starts), values)
        self._stats = CsrReadStats()
        self._lock = threading.Lock()

    @property
    def direct(self) -> bool:
        """Whether the SSD reads bypass the page cache (O_DIRECT)."""
        return self.file.direct

    def describe(self) -> str:
        """One line: where the lists come from (for the trainer's start record)."""
        how = "O_DIRECT" if self.direct else f"buffered ({self.file.note})"
        engine = getattr(self.backend, "engine_of", None)
        if engine is not None and self.file.handle is not None:
            how += f", {engine(self.file.handle)} engine"
        return (f"neighbour lists read from {self.path} ({how}); adjacency cache of "
                f"{self.cache.values.nbytes / 2**20:.1f} MiB: {self.cache.vertices.size:,} highest-degree vertices")

    def stats(self) -> CsrReadStats:
        """What was looked up and read so far (the cache's fill not counted: see ``fill_reads``)."""
        with self._lock:
            return self._stats

    def take(self, pos: Tensor) -> Tensor:
        """``indices[pos]`` (int64 positions, any order, repeats allowed), on ``pos``'s device.

        Raises
        ------
        DiskCsrError
            A position lies outside the edges, or the read fails.
        """
        p = pos.detach().to("cpu", torch.int64).numpy().reshape(-1)
        out = np.empty(p.size, self.np_dtype)
        if p.size and (p.min() < 0 or p.max() >= self.num_edges):
            raise DiskCsrError(f"{self.path}: edge position outside 0..{self.num_edges - 1}")
        hit = self.cache.lookup(p, out)
        miss = np.flatnonzero(~hit)
        reads = PageReads()
        if miss.size:
            try:
                out[miss], reads = self.file.gather(self.data_offset + p[miss] * self.np_dtype.itemsize,
                                                    self.np_dtype)
            except StoreError as exc:
                raise DiskCsrError(str(exc)) from None
        with self._lock:
            s = self._stats
            self._stats = CsrReadStats(s.edges + p.size, s.cached_edges + p.size - miss.size, s.pages + reads.pages,
                                       s.requests + reads.requests, s.bytes_read + reads.bytes_read,
                                       s.read_s + reads.read_s)
        return torch.from_numpy(out).to(pos.device)

    def close(self) -> None:
        """Close the file and the backend."""
        self.file.close()
        self.backend.close()

    def __enter__(self) -> DiskNeighbours:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_disk_csr(dataset, *, cache_bytes: int = 0, direct: bool | str = "auto",
                  max_buffer_bytes: int = DEFAULT_BUFFER_BYTES, max_gap_pages: int = DEFAULT_GAP_PAGES
                  ) -> tuple[Tensor, DiskNeighbours]:
    """``(indptr, indices)`` of an opened :class:`training.data.Dataset` for a sampler, ``indices`` on disk.

    ``indptr`` is a tensor over the dataset's memory map; the lists are read
    from ``indices.npy`` with a ``posix`` backend in this process (its
    asynchronous engine with O_DIRECT; ``direct``: ``"auto"``, True to
    require O_DIRECT, False for buffered reads).

    Raises
    ------
    DiskCsrError
        The CSR files cannot be opened or read.
    """
    from iostack.backends.posix import PosixBackend

    indptr = np.asarray(dataset.indptr)
    try:
        backend = PosixBackend(processes=0, direct=direct)
    except StoreError as exc:
        raise DiskCsrError(str(exc)) from None
    try:
        source = DiskNeighbours(Path(dataset.path) / "indices.npy", indptr, backend, cache_bytes=cache_bytes,
                                max_buffer_bytes=max_buffer_bytes, max_gap_pages=max_gap_pages)
    except BaseException:
        backend.close()
        raise
    with warnings.catch_warnings():  # a read-only map: fine, the sampler never writes to it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(indptr), source
