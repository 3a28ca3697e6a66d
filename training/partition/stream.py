"""LDG, a streaming partitioner: one pass over the CSR in vertex order, memory O(N) plus a chunk.

Linear Deterministic Greedy (Stanton & Kliot, KDD 2012): each vertex, in id
order, goes to the partition holding most of its already-placed neighbours,
weighted by how much room that partition has left (``1 - load / capacity``);
a vertex with no placed neighbour goes to the emptiest partition. Here the
load is the largest of the shares the vertex adds to (vertices, training
seeds, CSR entries, each against ``(1 + slack) / parts`` of its total: a
non-seed is not turned away by a partition full of seeds), so the partitions
come out balanced on all three, and a partition at capacity takes no more. With
``passes`` > 1 the stream is read again (ReLDG, Nishimura & Ugander, KDD 2013):
a vertex then sees every neighbour's partition from the pass before, which
cuts markedly fewer edges for one more read of the CSR.

Only the CSR's rows are read (a vertex's in-neighbours; both directions on an
undirected graph), in blocks of ``chunk_edges`` entries from the memory-mapped
files: memory is ``part_of`` (2 bytes a vertex), the seed mask (1 byte a
vertex) and a block, whatever the edge count; at 10^9 edges it never holds the
graph. The loop is compiled with numba when numba imports (about 20 ns an
edge); without it the same function runs as Python (about 1 us an edge: fine
for the fixtures, slow past 10^7 edges).

>>> import numpy as np, tempfile
>>> from training.synth import SynthSpec
>>> from training.synth_run import synthesize
>>> from training.data import open_dataset
>>> d = tempfile.mkdtemp()
>>> ds = open_dataset(synthesize(f"{d}/g", SynthSpec(num_nodes=400, num_edges=2000, feature_dim=2)).path)
>>> part_of = ldg_partition(ds, 2)
>>> part_of.dtype, np.bincount(part_of).tolist()
(dtype('int16'), [201, 199])
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from planner.progress import Progress
from training.data import DEFAULT_CHUNK_EDGES, Dataset
from training.partition.common import check_parts, seed_mask

log = logging.getLogger(__name__)

#: how far above an even share a partition may fill, on each balanced count
SLACK = 0.05


def _ldg_block(indptr, indices, v0, part_of, seeds, loads, caps):  # pragma: no cover - compiled
    """Assign vertices ``v0 .. v0 + len(indptr) - 2`` (rows ``indices[indptr[i] - indptr[0] : ...]``)."""
    parts = loads.shape[1]
    score = np.zeros(parts, np.float64)
    base = indptr[0]
    for i in range(indptr.shape[0] - 1):
        v = v0 + i
        a, b = indptr[i] - base, indptr[i + 1] - base
        score[:] = 0.0
        for j in range(a, b):
            p = part_of[indices[j]]
            if p >= 0:
                score[p] += 1.0
        deg = float(b - a)
        best, best_score, best_load = -1, -1.0, 2.0
        for k in range(parts):
            # only the counts this vertex adds to: a full seed count does not turn away a non-seed
            load = loads[0, k] / caps[0]
            if seeds[v] > 0:
                load = max(load, loads[1, k] / caps[1])
            if deg > 0.0:
                load = max(load, loads[2, k] / caps[2])
            room = 1.0 - load
            if room <= 0.0:
                continue
            s = score[k] * room
            if s > best_score or (s == best_score and load < best_load):
                best, best_score, best_load = k, s, load
        if best < 0:  # every partition at capacity (the slack is spent): the emptiest
            best_load = 1e300
            for k in range(parts):
                load = max(loads[0, k] / caps[0], loads[1, k] / caps[1], loads[2, k] / caps[2])
                if load < best_load:
                    best, best_load = k, load
        part_of[v] = best
        loads[0, best] += 1.0
        loads[1, best] += seeds[v]
        loads[2, best] += deg


@functools.lru_cache(maxsize=1)
def _kernel():
    """The compiled loop, or the Python one where numba does not import (the same assignments)."""
    try:
        import numba
    except ImportError as exc:
        log.info("numba is not importable (%s); LDG runs as Python", exc)
        return _ldg_block
    return numba.njit(cache=True, nogil=True)(_ldg_block)


def ldg_partition(ds: Dataset, parts: int, *, seed: int = 0, passes: int = 2, chunk_edges: int = DEFAULT_CHUNK_EDGES,
                  progress: Progress | None = None) -> np.ndarray:
    """``part_of`` (int16 ``[N]``) by ``passes`` streaming passes of LDG over ``ds``'s CSR in id order.

    Deterministic: ``seed`` is accepted for the registry's interface and not
    used (the stream order is the id order).

    Raises
    ------
    PartitionError
        ``parts`` below 1 or above the vertex count.
    """
    p = check_parts(ds, parts)
    n = ds.num_nodes
    part_of = np.full(n, -1, np.int16)
    if p == 1:
        part_of[:] = 0
        return part_of
    seeds = seed_mask(ds)
    totals = np.array([n, max(int(seeds.sum()), 1), max(ds.num_edges, 1)], np.float64)
    caps = np.maximum(totals * (1.0 + SLACK) / p, 1.0)
    kernel = _kernel()
    indptr = ds.indptr
    for pass_no in range(max(1, int(passes))):
        loads = np.zeros((3, p), np.float64)
        v = 0
        while v < n:
            # the largest row block of about chunk_edges entries (at least one row)
            hi = int(np.searchsorted(indptr, int(indptr[v]) + chunk_edges, side="right")) - 1
            hi = min(max(hi, v + 1), n)
            ip = np.asarray(indptr[v:hi + 1], np.int64)
            idx = np.asarray(ds.indices[int(ip[0]):int(ip[-1])])
            kernel(ip, idx, v, part_of, seeds, loads, caps)
            v = hi
            if progress is not None:
                progress(f"LDG pass {pass_no + 1}", v, n)
    return part_of
