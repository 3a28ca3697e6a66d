"""The CPU sampler's compiled path: each hop a few compiled loops split over the threads given.

:class:`training.sampler.NeighborSampler` samples a CPU batch here when numba is there
(:func:`available`). The torch path is a chain of ~100 short tensor operations, each an
OpenMP fork and join, and its relabelling (the ``amin`` scatter, ``torch.unique``) runs
on one core: a second thread gained it 1.1-1.5x where DGL's C++ sampler gains 3x. Here a
hop is a few steps (:mod:`training._sample_kernels`), each split into one part per thread,
as DGL parallelises its row-wise sampling and its ``to_block`` id map:

1. per frontier row, its degree and edge count;
2. per row, its neighbours: all of them, or Floyd's ``fanout``-subset drawn from the
   *same* uniforms the torch path draws (one ``torch.rand`` per hop on the sampler's
   generator, same shape), scaled and truncated the same way;
3. the relabelling, each part scanning its own run of the edges: a vertex not in the batch
   yet keeps the smallest edge index min-ed into its entry (vertex map or hash table), so
   the edges still holding it after all parts are done are the first appearances; they are
   numbered in edge order (a prefix sum over the parts) and the repeats read their ids.
   That costs about twice the CPU of one pass, so below :data:`PARALLEL_RELABEL_THREADS`
   one thread relabels in one pass (no atomics), chunk by chunk right behind the helpers
   that fill the hop's rows (and filling chunks itself while the next is not ready), so
   the relabelling overlaps the filling instead of following it.

So a batch is bit-identical to the torch path's for the same seed, at any thread count
(tests/test_sampler_compiled.py checks it). The parts run on a pool of Python threads (the
kernels release the GIL), not numba's OpenMP ``prange``: OpenMP's threads spin ~300,000
rounds at every barrier before sleeping, and on a loaded machine the spinning thread takes
the core its partner needs (at load 15 on 2 cores, 2 threads took 189 ms of CPU for a batch
that costs 27 ms on one). A pool thread sleeps in a lock while it waits.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

log = logging.getLogger(__name__)

__all__ = ["Csr", "Hops", "applies", "available", "hop", "sample", "sample_map", "sample_unique", "threads_for"]


@functools.cache
def _kernels() -> ModuleType | None:
    try:
        from training import _sample_kernels
    except ImportError as e:  # no numba wheel for this platform: the torch path, same batches
        log.info("numba is not importable (%s); the sampler uses its torch path", e)
        return None
    return _sample_kernels


def available() -> bool:
    """Whether the compiled kernels can run here (numba importable)."""
    return _kernels() is not None


def applies(shapes: str, compiled: bool, device: torch.device, indices: object) -> bool:
    """Whether a sampler with these settings samples a CPU batch here (data-shaped batches, ``compiled``
    asked for, a CPU tensor graph, numba importable)."""
    return shapes == "data" and compiled and device.type == "cpu" and isinstance(indices, torch.Tensor) \
        and available()


def threads_for(num_threads: int | None) -> int:
    """Threads a batch runs on: ``num_threads``, or torch's intra-op setting when None."""
    return max(1, int(torch.get_num_threads() if num_threads is None else num_threads))


_POOL_LOCK = threading.Lock()
_POOL: list[ThreadPoolExecutor] = []


def _forget_pool() -> None:
    # a forked child has none of the parent's threads: its first batch starts a new pool
    _POOL.clear()


os.register_at_fork(after_in_child=_forget_pool)


def _pool(workers: int) -> ThreadPoolExecutor:
    """The process's helper threads (grown to the most parts asked for, minus the caller)."""
    with _POOL_LOCK:
        if not _POOL or _POOL[0]._max_workers < workers:
            _POOL[:] = [ThreadPoolExecutor(workers, thread_name_prefix="moment-sampler")]
        return _POOL[0]


def _run(parts: int, kernel: Callable[..., None], *args: object) -> None:
    """``kernel(c, parts, *args)`` for every part ``c``, at once; returns when all are done."""
    if parts == 1:
        kernel(0, 1, *args)
        return
    futures = [_pool(parts - 1).submit(kernel, c, parts, *args) for c in range(1, parts)]
    kernel(0, parts, *args)
    for f in futures:
        f.result()


@dataclass(frozen=True)
class Csr:
    """What a hop reads: the CSR as numpy arrays (``indices`` int32 or int64), the fan-outs,
    with or without replacement, and the generator the uniforms come from."""

    indptr: np.ndarray
    indices: np.ndarray
    fanouts: tuple[int, ...]
    replace: bool
    generator: torch.Generator


#: per hop, ``(new vertices, local ids of the sampled neighbours, targets)``, int64 arrays
Hops = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


#: rows per chunk of a hop filled by several threads (the relabelling follows chunk by chunk)
_CHUNK_ROWS = 2048


def _plan(g: Csr, nodes: np.ndarray, fanout: int, parts: int, row_base: int, lead: int | None = None,
          ) -> tuple[object, ...]:
    """A hop's plan and uniforms: :func:`~training._sample_kernels.hop_fill`'s arguments after
    the part/chunk ones (the output ``nbr`` and ``target`` allocated, not filled). With
    ``lead`` (the last hop: the earlier hops' edge count) ``target`` is row 1 of the batch's
    ``int64 [2, lead + E]`` edge_index from column ``lead``, so that nothing is copied there."""
    k = _kernels()
    assert k is not None
    rows = nodes.size
    start, deg, count = (np.empty(rows, np.int64) for _ in range(3))
    drawn = np.empty(rows, np.uint8)
    chunks = 1 if parts == 1 else max(parts, -(-rows // _CHUNK_ROWS))
    sums = np.zeros((chunks + 1, 2), np.int64)
    _run(parts, k.hop_plan, g.indptr, nodes, fanout, g.replace, start, deg, count, drawn, sums)
    np.cumsum(sums, axis=0, out=sums)
    edges, drawing = int(sums[-1, 0]), int(sums[-1, 1])
    u = np.empty((0, 0), np.float64)
    if drawing:
        shape = (drawing, fanout) if g.replace else (fanout, drawing)
        u = torch.rand(shape, generator=g.generator, dtype=torch.float64).numpy()
    target = np.empty(edges, np.int64) if lead is None else np.empty((2, lead + edges), np.int64)[1, lead:]
    return (g.indices, start, deg, count, drawn, sums, fanout, g.replace, u, row_base, np.empty(edges, np.int64),
            target)


def _local_beside(target: np.ndarray) -> np.ndarray:
    """Where a hop's local ids go: beside ``target`` in the batch's edge_index when ``target``
    is its row 1 (:func:`_plan` with ``lead``), else a new array."""
    ei = target.base
    if isinstance(ei, np.ndarray) and ei.ndim == 2:
        return ei[0, ei.shape[1] - target.size:]
    return np.empty(target.size, np.int64)


def _out(fill: tuple[object, ...]) -> tuple[np.ndarray, np.ndarray]:
    nbr, target = fill[-2], fill[-1]
    assert isinstance(nbr, np.ndarray) and isinstance(target, np.ndarray)
    return nbr, target


def hop(g: Csr, nodes: np.ndarray, fanout: int, parts: int, row_base: int) -> tuple[np.ndarray, np.ndarray]:
    """One hop from frontier ``nodes`` (int64): ``(nbr, target)``, int64 ``[E]`` each, the
    sampled neighbours' global ids and ``row_base +`` the row each edge belongs to, in the
    torch path's order; the uniforms come from ``g.generator`` in the torch path's shapes."""
    k = _kernels()
    assert k is not None
    fill = _plan(g, nodes, fanout, parts, row_base)
    _run(parts, k.hop_fill, *fill)
    return _out(fill)


def _one_pass(parts: int, fill: tuple[object, ...], table: bool, store: np.ndarray, a: int, b: int,
              num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Fill the hop and relabel it in one pass, through the hash table ``store`` (tags ``a, b``)
    when ``table``, else the vertex map ``store`` (base ``a``): after the fill on one thread,
    behind the helpers' filling on several. Returns ``(local, new vertices)``."""
    k = _kernels()
    assert k is not None
    nbr, target = _out(fill)
    local, new = _local_beside(target), np.empty(nbr.size, np.int64)
    if parts > 1:
        return local, new[:_piped(parts, k.relabel_piped, fill, table, store, a, b, num_nodes, local, new)]
    k.hop_fill(0, 1, *fill)
    if table:
        return local, new[:k.relabel_table_serial(nbr, store, a, b, num_nodes, local, new)]
    return local, new[:k.relabel_map_serial(nbr, store, a, num_nodes, local, new)]


def _piped(parts: int, relabel: Callable[..., None], fill: tuple[object, ...], *args: object) -> int:
    """``relabel(todo, done, progress, *fill, *args)`` on this thread while ``parts - 1`` helpers
    fill the hop's chunks (``fill``: :func:`_plan`'s); the relabelling follows the filling chunk
    by chunk, fills chunks itself while the next is not ready, and sleeps (the helpers joined)
    rather than spin on the last ones. Returns how many vertices are new."""
    k = _kernels()
    assert k is not None
    sums = fill[5]
    assert isinstance(sums, np.ndarray)
    todo, done, progress = np.zeros(1, np.int64), np.zeros(sums.shape[0] - 1, np.int64), np.zeros(2, np.int64)
    futures = [_pool(parts - 1).submit(k.fill_claimed, todo, done, *fill) for _ in range(1, parts)]
    try:
        relabel(todo, done, progress, *fill, *args)
    finally:
        for f in futures:
            f.result()
    if progress[0] < sums.shape[0] - 1:  # it stopped at a chunk being filled: all are filled now
        relabel(todo, done, progress, *fill, *args)
    return int(progress[1])


#: threads from which a hop's relabelling runs in parts; below, one thread relabels in one pass.
#: Measured on 2 cores (uniform graph, fan-out 25,10, batch 8000, 2 threads, load ~15): one
#: pass 35 ms of CPU and 128 ms wall a batch, in parts 51 ms and 210 ms; the parts' verify,
#: number and finish steps and the atomics cost twice the single pass's CPU, which 2 cores
#: do not win back. From 3 threads the parts path is taken (tests check its batches).
PARALLEL_RELABEL_THREADS = 3


def _claimed(parts: int, target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scratch for the parallel relabelling: ``local`` (:func:`_local_beside`) and ``claims``
    (``int64 [edges]``), ``counts`` per part."""
    return _local_beside(target), np.empty(target.size, np.int64), np.zeros(parts, np.int64)


def _finish(k: ModuleType, parts: int, nbr: np.ndarray, entry: np.ndarray, store: np.ndarray, tags: tuple[int, int],
            local: np.ndarray, claims: np.ndarray, counts: np.ndarray, num_nodes: int) -> np.ndarray:
    """After the parallel scan: keep the true first appearances, number them, give the repeats
    their ids; the new vertices (``store[entry[e]]``: ``tags[0] + id``, or ``tags[1] + e``)."""
    off, cand = tags
    _run(parts, k.verify, entry, store, cand, claims, counts)
    begin = np.zeros(parts + 1, np.int64)
    np.cumsum(counts, out=begin[1:])
    new = np.empty(int(begin[-1]), np.int64)
    _run(parts, k.number, nbr, entry, store, off, claims, counts, begin, num_nodes, local, new)
    _run(parts, k.finish, entry, store, off, local)
    return new


def sample_map(g: Csr, seeds: np.ndarray, node_map: np.ndarray, base: int, parts: int) -> Hops:
    """Every hop of a batch whose seeds are entered in the stamped ``node_map`` already:
    new vertices numbered in order of first appearance (the torch path's ``"map"`` order)."""
    k = _kernels()
    assert k is not None
    out: Hops = []
    frontier, num_nodes, frontier_start = seeds, seeds.size, 0
    for h, fanout in enumerate(g.fanouts):
        fill = _plan(g, frontier, fanout, parts, frontier_start, _lead(g, h, out))
        nbr, target = _out(fill)
        if parts < PARALLEL_RELABEL_THREADS:
            local, new = _one_pass(parts, fill, False, node_map, base, 0, num_nodes)
        else:
            _run(parts, k.hop_fill, *fill)
            local, claims, counts = _claimed(parts, target)
            _run(parts, k.scan_map, nbr, node_map, base, local, claims, counts)
            new = _finish(k, parts, nbr, nbr, node_map, (base, k._CAND), local, claims, counts, num_nodes)
        out.append((new, local, target))
        frontier, frontier_start, num_nodes = new, num_nodes, num_nodes + new.size
    return out


class _Table:
    """One thread's hash table for ``relabel="unique"`` (``int64 [2 * slots]``: key, value), kept
    between batches so that it is neither allocated nor cleared per batch: entries carry the
    batch's epoch. It grows with the largest batch (O(batch) bytes, never O(graph))."""

    def __init__(self) -> None:
        self.table = self._fresh(16)
        self.epoch = 0

    @staticmethod
    def _fresh(slots: int) -> np.ndarray:
        # keys 0 (stale to every epoch), values the largest int64 (any candidate's min wins)
        t = np.empty(2 * slots, np.int64)
        t[0::2] = 0
        t[1::2] = np.iinfo(np.int64).max
        return t

    def fit(self, entries: int) -> bool:
        """Make room for ``entries`` vertices at load <= 2/3; True if the table was replaced
        (empty: the caller enters the batch's vertices again)."""
        slots = 1 << max(4, int(3 * entries // 2 - 1).bit_length())
        if self.table.size // 2 >= slots and self.epoch < _MAX_EPOCH:
            return False
        self.table = self._fresh(max(slots, self.table.size // 2))
        self.epoch = 0
        return True

    def tags(self) -> tuple[int, int]:
        """This epoch's key tag (``epoch << 40``) and value tag (falling with the epoch)."""
        return self.epoch << 40, (_MAX_EPOCH + 1 - self.epoch) << 41


_MAX_EPOCH = (1 << 22) - 2  # keys tag | v: vertex ids below 2**40; value tags below 2**63
_LOCAL = threading.local()


def sample_unique(g: Csr, seeds: np.ndarray, parts: int) -> Hops:
    """Every hop of a batch with a hash table of the batch's vertices (memory O(batch), kept
    per thread) instead of a vertex map; the same batches as :func:`sample_map`."""
    k = _kernels()
    assert k is not None
    t = getattr(_LOCAL, "table", None)
    if t is None:
        t = _LOCAL.table = _Table()
    out: Hops = []
    ids = [seeds]
    t.fit(seeds.size)
    t.epoch += 1
    _run(parts, k.enter_table, t.table, *t.tags(), seeds, 0)
    frontier, frontier_start, num_nodes = seeds, 0, seeds.size
    for h, fanout in enumerate(g.fanouts):
        fill = _plan(g, frontier, fanout, parts, frontier_start, _lead(g, h, out))
        nbr, target = _out(fill)
        if t.fit(num_nodes + nbr.size):  # replaced: enter the batch's vertices again
            t.epoch += 1
            _run(parts, k.enter_table, t.table, *t.tags(), np.concatenate(ids), 0)
        tag, vt = t.tags()
        if parts < PARALLEL_RELABEL_THREADS:
            local, new = _one_pass(parts, fill, True, t.table, tag, vt, num_nodes)
        else:
            _run(parts, k.hop_fill, *fill)
            local, claims, counts = _claimed(parts, target)
            where = np.empty(nbr.size, np.int64)
            _run(parts, k.scan_table, t.table, tag, vt, nbr, local, where, claims, counts)
            new = _finish(k, parts, nbr, where, t.table, (vt, vt | k._PENDING), local, claims, counts, num_nodes)
        out.append((new, local, target))
        ids.append(new)
        frontier, frontier_start, num_nodes = new, num_nodes, num_nodes + new.size
    return out


def _lead(g: Csr, h: int, out: Hops) -> int | None:
    # the last hop writes into the batch's edge_index (see _plan), after the earlier hops' edges
    return sum(o[1].size for o in out) if h == len(g.fanouts) - 1 else None


def sample(g: Csr, seeds: np.ndarray, parts: int, node_map: np.ndarray | None, base: int,
           ) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], tuple[int, ...]]:
    """A whole batch: ``(n_id, edge_index, vertices per hop, edges per hop)`` (``SampledBatch``'s
    fields), through the stamped ``node_map`` (seeds entered) or, when None, a hash table."""
    hops = sample_unique(g, seeds, parts) if node_map is None else sample_map(g, seeds, node_map, base, parts)
    # the last hop wrote into edge_index (_plan's lead); the earlier ones are copied in front by
    # our kernel, not torch.cat: a parallel torch op leaves torch's OpenMP threads spinning
    edge_index = hops[-1][2].base
    assert isinstance(edge_index, np.ndarray) and edge_index.shape == (2, sum(h[1].size for h in hops))
    k, at = _kernels(), 0
    assert k is not None
    for _, local, target in hops[:-1]:
        _run(parts, k.copy, local, edge_index[0, at:at + local.size])
        _run(parts, k.copy, target, edge_index[1, at:at + local.size])
        at += local.size
    n_id = np.concatenate([seeds, *(h[0] for h in hops)])
    return n_id, edge_index, (seeds.size, *(h[0].size for h in hops)), tuple(h[1].size for h in hops)
