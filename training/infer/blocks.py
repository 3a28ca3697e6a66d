"""The blocks of layer-wise inference: every vertex in chunks of consecutive ids, each with its neighbourhood.

A layer is applied to all vertices a chunk at a time. A chunk is a range
``[start, stop)`` of vertex ids (:func:`chunk_ranges`), cut so that the rows a
block reads stay bounded whatever the degrees: at most ``chunk_rows`` target
vertices and at most ``chunk_rows`` edges (a hub of more edges is a chunk of
its own). Its :class:`Block` lists the rows to gather (``n_id``: the targets
first, in order, then their distinct neighbours) and the local edges, laid out
as the models read them (:meth:`training.models._Sampled.layer_forward`: row 0
the neighbour, row 1 the target, grouped by target in order).

Full neighbourhoods (:func:`full_block`) come straight from the CSR: a chunk of
consecutive targets owns one contiguous slice of ``indices``, read in order
(a memory-mapped graph is read front to back, once per layer). A stated fan-out
samples with :class:`training.sampler.NeighborSampler` (:func:`sampled_block`).

>>> import numpy as np
>>> indptr, indices = np.array([0, 2, 3, 3, 5]), np.array([1, 3, 0, 0, 2])
>>> chunk_ranges(indptr, 2)
[(0, 1), (1, 3), (3, 4)]
>>> b = full_block(indptr, indices, 0, 2)
>>> b.n_id.tolist(), b.edge_index.tolist()
([0, 1, 3], [[1, 2, 0], [0, 0, 1]])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["Block", "chunk_ranges", "full_block", "sampled_block"]


@dataclass(frozen=True)
class Block:
    """One chunk's rows and edges: ``n_id`` int64 ``[n]`` global ids (the ``num_out`` targets first),
    ``edge_index`` int64 ``[2, E]`` local ids into ``n_id``, ``start`` the first target's id."""

    start: int
    num_out: int
    n_id: Tensor
    edge_index: Tensor


def chunk_ranges(indptr: np.ndarray, chunk_rows: int, *, fanout: int = -1) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges covering every vertex: at most ``chunk_rows`` targets and ``chunk_rows`` edges each
    (with a ``fanout`` ``k >= 0``, edges are counted ``k`` per target at most), never an empty range.

    ``indptr``: int ``[num_nodes + 1]`` CSR row pointers (a memory map is fine: one binary search a chunk).
    """
    n = int(indptr.shape[0]) - 1
    budget = max(1, int(chunk_rows))
    if fanout >= 0:  # a sampled block has at most `fanout` edges a target
        step = min(budget, max(1, budget // max(1, fanout)))
        return [(a, min(n, a + step)) for a in range(0, n, step)]
    out, a = [], 0
    while a < n:
        # the last stop whose edges since a fit the budget (indptr is sorted), capped at `budget` targets
        limit = int(indptr[a]) + budget
        b = int(np.searchsorted(indptr, limit, side="right")) - 1
        b = max(a + 1, min(b, a + budget, n))
        out.append((a, b))
        a = b
    return out


def full_block(indptr: np.ndarray, indices: np.ndarray, start: int, stop: int) -> Block:
    """Targets ``start..stop-1`` with every in-neighbour: the CSR rows of the range, one slice of ``indices``."""
    lo, hi = int(indptr[start]), int(indptr[stop])
    nbr = np.asarray(indices[lo:hi], np.int64)
    counts: np.ndarray = np.diff(np.asarray(indptr[start:stop + 1], np.int64))
    m = stop - start
    inside = (nbr >= start) & (nbr < stop)
    outside = nbr[~inside]
    others = np.unique(outside)  # sorted distinct neighbours that are not targets: rows m.. of the block
    local = np.empty_like(nbr)
    local[inside] = nbr[inside] - start
    local[~inside] = m + np.searchsorted(others, outside)
    n_id = np.concatenate([np.arange(start, stop, dtype=np.int64), others])
    dst = np.repeat(np.arange(m, dtype=np.int64), counts)
    return Block(start, m, torch.from_numpy(n_id), torch.from_numpy(np.stack([local, dst])))


def sampled_block(sampler, start: int, stop: int, seed: int) -> Block:
    """Targets ``start..stop-1`` with at most the sampler's fan-out of neighbours each (one hop), reseeded from
    ``(seed, start)`` so a chunk's sample does not depend on the chunks before it."""
    sampler.reseed(seed * 1_000_003 + start)
    b = sampler.sample(torch.arange(start, stop, dtype=torch.int64))
    return Block(start, stop - start, b.n_id.to("cpu", torch.int64), b.edge_index_per_layer[0].to("cpu"))
