"""The typed sampler's compiled path: one plan call and one fill-and-relabel call per hop, over all relations.

:class:`training.hetero.sampler.HeteroNeighborSampler` samples here where numba is there
(:func:`training.compiled_sampler.available`) and every relation's ``indices`` share one
dtype. The torch path runs :func:`training.sampler.sample_neighbors` and a dozen index
operations per relation and hop; here a hop is :func:`~training.hetero._kernels.typed_plan`
(every relation's frontier rows), one ``torch.rand`` per relation that draws (the torch path's
generator, order and shapes: ``[fanout, rows drawn]`` for Floyd's steps), and
:func:`~training.hetero._kernels.typed_fill` (picks and relabelling, relation after relation,
serial: first appearance is plain program order). So the batches are the torch path's, equal
tensor for tensor for the same seed (tests/test_hetero_compiled.py).

The batch's positions live in one int64 map over global ids (``8 × num_nodes`` bytes, once),
reset for the batch's nodes after each batch.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from types import ModuleType

import numpy as np
import torch

from training.compiled_sampler import available
from training.hetero.schema import EdgeType, HeteroSchema
from training.sampler import SamplerError

#: the error of a batch whose seeds repeat a node
REPEATED_SEEDS = "`seeds` repeat a node; give each once"

#: what :func:`sample_compiled` returns: ``HeteroBatch``'s n_id, edge_index, num_sampled_nodes, num_sampled_edges
Sampled = tuple[dict[str, torch.Tensor], dict[EdgeType, torch.Tensor], dict[str, list[int]], dict[EdgeType, list[int]]]


@functools.cache
def _kernels() -> ModuleType:
    from training.hetero import _kernels as k

    return k


def _readonly(a: np.ndarray) -> np.ndarray:
    # numba types a list by its first element: every array read-only, memory maps or not
    v = np.asarray(a).view()
    v.flags.writeable = False
    return v


class TypedCsr:
    """What the kernels read of a dataset: per-relation CSRs as numba lists, type ids and offsets."""

    def __init__(self, schema: HeteroSchema, fanouts: Mapping[tuple[str, ...], Sequence[int]],
                 indptr: Mapping[EdgeType, np.ndarray], indices: Mapping[EdgeType, np.ndarray]) -> None:
        from numba import typed

        names = [t.name for t in schema.node_types]
        self.keys = schema.keys()
        self.num_hops = len(next(iter(fanouts.values())))
        self.indptrs = typed.List([_readonly(indptr[k]) for k in self.keys])
        self.indices = typed.List([_readonly(indices[k]) for k in self.keys])
        self.rel_src = np.array([names.index(k[0]) for k in self.keys], np.int64)
        self.rel_dst = np.array([names.index(k[2]) for k in self.keys], np.int64)
        self.type_off = schema.offsets()
        self.names = names
        self.fanouts = [np.array([fanouts[k][h] for k in self.keys], np.int64) for h in range(self.num_hops)]
        self.pos = np.full(schema.num_nodes, -1, np.int64)


def applies(indices: Mapping[EdgeType, np.ndarray]) -> bool:
    """Whether the compiled path can sample these relations (numba there, one ``indices`` dtype)."""
    return available() and len({np.asarray(v).dtype for v in indices.values()}) <= 1 and bool(indices)


def _draws(g: TypedCsr, fan: np.ndarray, sums: np.ndarray, generator: torch.Generator
           ) -> tuple[np.ndarray, np.ndarray]:
    """Every relation's uniforms in one flat float64 array and where each begins (``u_lo``), drawn in
    relation order as the torch path draws them (``[fanout, rows drawn]``; none where it draws none):
    ``torch.rand(..., out=)`` into the relation's slice gives the numbers a fresh ``torch.rand`` would."""
    size = np.where((fan > 0) & (sums[:, 1] > 0) & (sums[:, 0] > 0), np.maximum(fan, 0) * sums[:, 1], 0)
    u_lo = np.zeros(len(g.keys) + 1, np.int64)
    np.cumsum(size, out=u_lo[1:])
    u = np.empty(int(u_lo[-1]), np.float64)
    flat = torch.from_numpy(u)
    for r in np.flatnonzero(size):
        torch.rand((int(fan[r]), int(sums[r, 1])), generator=generator, dtype=torch.float64,
                   out=flat[u_lo[r]:u_lo[r + 1]].view(int(fan[r]), int(sums[r, 1])))
    return u, u_lo


def sample_compiled(g: TypedCsr, generator: torch.Generator, seed_type: str, s: torch.Tensor) -> Sampled:
    """:meth:`training.hetero.sampler.HeteroNeighborSampler.sample` on the compiled path (seeds ``s``, int64,
    in range): the batch's ``n_id``, ``edge_index``, ``num_sampled_nodes``, ``num_sampled_edges``.

    Raises
    ------
    SamplerError
        A seed is repeated (found through the position map: a later copy overwrites the first's
        position, linear where ``torch.unique`` sorts).
    """
    k = _kernels()
    nt, nr = len(g.names), len(g.keys)
    st = g.names.index(seed_type)
    seeds = s.numpy()
    at, order = g.type_off[st] + seeds, np.arange(seeds.size)
    g.pos[at] = order
    if not np.array_equal(g.pos[at], order):
        g.pos[at] = -1
        raise SamplerError(REPEATED_SEEDS)
    size = np.zeros(nt, np.int64)
    size[st] = seeds.size
    nodes: list[list[np.ndarray]] = [[seeds] if t == st else [] for t in range(nt)]
    fronts: list[np.ndarray] = [seeds if t == st else seeds[:0] for t in range(nt)]
    firsts = np.zeros(nt, np.int64)
    rows: list[list[np.ndarray]] = [[] for _ in range(nr)]
    cols: list[list[np.ndarray]] = [[] for _ in range(nr)]
    n_nodes = [[int(size[t])] for t in range(nt)]
    n_edges: list[list[int]] = [[] for _ in range(nr)]
    try:
        for hop in range(g.num_hops):
            fan = g.fanouts[hop]
            front_lo = np.zeros(nt + 1, np.int64)
            np.cumsum([f.size for f in fronts], out=front_lo[1:])
            front = np.concatenate(fronts)
            row_lo = np.zeros(nr + 1, np.int64)
            np.cumsum(front_lo[g.rel_dst + 1] - front_lo[g.rel_dst], out=row_lo[1:])
            m = int(row_lo[-1])
            start, deg, count = (np.empty(m, np.int64) for _ in range(3))
            drawn = np.empty(m, np.uint8)
            sums = np.zeros((nr, 2), np.int64)
            k.typed_plan(g.indptrs, g.rel_dst, fan, front, front_lo, row_lo, start, deg, count, drawn, sums)
            u, u_lo = _draws(g, fan, sums, generator)
            edge_lo = np.zeros(nr + 1, np.int64)
            np.cumsum(sums[:, 0], out=edge_lo[1:])
            e = int(edge_lo[-1])
            nbr, row, col, new_ids, new_type = (np.empty(e, np.int64) for _ in range(5))
            new_lo = np.zeros(nt + 1, np.int64)
            before = size.copy()
            k.typed_fill(g.indices, g.rel_src, fan, u, u_lo, firsts[g.rel_dst], row_lo, edge_lo, start, deg, count,
                         drawn, sums, g.type_off, g.pos, size, nbr, row, col, new_ids, new_type, new_lo)
            for r in range(nr):
                rows[r].append(row[edge_lo[r]:edge_lo[r + 1]])
                cols[r].append(col[edge_lo[r]:edge_lo[r + 1]])
                n_edges[r].append(int(edge_lo[r + 1] - edge_lo[r]))
            for t in range(nt):
                added = new_ids[new_lo[t]:new_lo[t + 1]]
                nodes[t].append(added)
                n_nodes[t].append(int(size[t] - before[t]))
                fronts[t], firsts[t] = added, before[t]
    finally:
        for t in range(nt):
            if nodes[t]:
                g.pos[g.type_off[t] + np.concatenate(nodes[t])] = -1
    n_id = {g.names[t]: torch.from_numpy(np.concatenate(nodes[t]) if nodes[t] else seeds[:0].copy())
            for t in range(nt)}
    edge_index = {key: torch.from_numpy(np.stack([np.concatenate(rows[r]), np.concatenate(cols[r])]) if rows[r]
                                        else np.zeros((2, 0), np.int64)) for r, key in enumerate(g.keys)}
    return (n_id, edge_index, {g.names[t]: n_nodes[t] for t in range(nt)},
            {key: n_edges[r] for r, key in enumerate(g.keys)})


__all__ = ["REPEATED_SEEDS", "Sampled", "TypedCsr", "applies", "sample_compiled"]
