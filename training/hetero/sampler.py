"""Typed neighbour sampling with per-relation fan-outs (PyG's hetero ``NeighborLoader`` semantics).

From seeds of one node type, hop ``h`` visits every relation ``(src, rel, dst)`` whose ``dst``
type has nodes that the previous hop added (the seeds, at hop 0), and draws up to
``fanouts[(src, rel, dst)][h]`` distinct in-neighbours of each (``-1``: all) with the
homogeneous sampler's draw (:func:`training.sampler.sample_neighbors`, per relation CSR). New
``src`` nodes join that type's node list in order of first appearance, once per batch (PyG's
``disjoint=False``); they are the next hop's frontier. As in PyG, a node added by one relation
in hop ``h`` is not sampled from by another relation in the same hop.

The batch holds, per type, ``n_id`` (local ids; the seeds first for the seed type) and, per
relation, ``edge_index`` ``[2, E]`` of positions into ``n_id[src]`` (row 0) and ``n_id[dst]``
(row 1), the layout of PyG's ``HeteroData`` from ``NeighborLoader``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from training.hetero.compiled import REPEATED_SEEDS, TypedCsr, applies, sample_compiled
from training.hetero.schema import EdgeType
from training.hetero.store import HeteroDataset
from training.sampler import SamplerError, _as_tensor, sample_neighbors

#: the scratch map's value for "not seen in this hop"
_UNSET = torch.iinfo(torch.int64).max


@dataclass(frozen=True)
class HeteroBatch:
    """One sampled typed subgraph (see the module docstring for the layout)."""

    seed_type: str
    batch_size: int
    n_id: dict[str, Tensor]
    edge_index: dict[EdgeType, Tensor]
    #: per type, nodes added at each hop (hop 0: the seeds for the seed type, 0 for the others)
    num_sampled_nodes: dict[str, list[int]]
    #: per relation, edges sampled at each hop
    num_sampled_edges: dict[EdgeType, list[int]]


class HeteroNeighborSampler:
    """Multi-hop typed sampler over a :class:`HeteroDataset`'s per-relation CSRs.

    ``fanouts``: one list for every relation (PyG's ``num_neighbors=[15, 10]``) or a mapping from
    every relation to its list, all of one length (the hop count). ``seed`` makes batches
    repeatable. ``compiled``: sample on :mod:`training.hetero.compiled`'s numba path where it
    applies (the same batches, tensor for tensor), else the torch path below.
    """

    def __init__(self, data: HeteroDataset, fanouts: Sequence[int] | Mapping[EdgeType, Sequence[int]], *,
                 seed: int | None = None, compiled: bool = True) -> None:
        keys = data.schema.keys()
        if isinstance(fanouts, Mapping):
            missing = [k for k in keys if tuple(k) not in {tuple(f) for f in fanouts}]
            if missing:
                raise SamplerError(f"`fanouts` gives no fan-out for relations {missing}")
            self.fanouts = {tuple(k): [int(f) for f in v] for k, v in fanouts.items()}
        else:
            self.fanouts = {k: [int(f) for f in fanouts] for k in keys}
        hops = {len(v) for v in self.fanouts.values()}
        if len(hops) != 1:
            raise SamplerError(f"`fanouts` lists of different lengths {sorted(hops)}; give every relation one per hop")
        self.num_hops = hops.pop()
        self.schema = data.schema
        self.keys = keys
        self.indptr = {k: _as_tensor(data.rel_indptr[k], "indptr") for k in keys}
        self.indices = {k: _as_tensor(data.rel_indices[k], "indices") for k in keys}
        self.count = {t.name: t.count for t in data.schema.node_types}
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        self._typed = TypedCsr(data.schema, self.fanouts, data.rel_indptr, data.rel_indices) \
            if compiled and applies(data.rel_indices) else None
        if self._typed is not None:
            return
        # local id -> position in this batch's n_id, -1 when absent; reset after each batch
        self._pos = {t: torch.full((n,), -1, dtype=torch.int64) for t, n in self.count.items()}
        # scratch: local id -> first edge position it appears at in a hop, _UNSET between uses
        self._first = {t: torch.full((n,), _UNSET, dtype=torch.int64) for t, n in self.count.items()}

    def sample(self, seed_type: str, seeds: Tensor | np.ndarray | Sequence[int]) -> HeteroBatch:
        """Sample the typed neighbourhood of ``seeds`` (distinct local ids of ``seed_type``).

        Raises
        ------
        SamplerError
            ``seed_type`` is not a node type, or a seed is out of range or repeated.
        """
        if seed_type not in self.count:
            raise SamplerError(f"`seed_type` {seed_type!r} is not one of {sorted(self.count)}")
        s = _as_tensor(seeds, "seeds").to(torch.int64).reshape(-1)
        if s.numel() and (int(s.min()) < 0 or int(s.max()) >= self.count[seed_type]):
            raise SamplerError(f"a seed is outside [0, {self.count[seed_type]}) of {seed_type!r}")
        if self._typed is not None:  # checks for repeats through its position map
            return HeteroBatch(seed_type, int(s.numel()), *sample_compiled(self._typed, self.generator, seed_type, s))
        if torch.unique(s).numel() != s.numel():
            raise SamplerError(REPEATED_SEEDS)
        nodes = {t: [s] if t == seed_type else [] for t in self.count}
        size = {t: (s.numel() if t == seed_type else 0) for t in self.count}
        self._pos[seed_type].index_copy_(0, s, torch.arange(s.numel()))
        frontier = {t: (0, s) if t == seed_type else (0, s[:0]) for t in self.count}
        rows: dict[EdgeType, list[Tensor]] = {k: [] for k in self.keys}
        cols: dict[EdgeType, list[Tensor]] = {k: [] for k in self.keys}
        n_nodes = {t: [size[t]] for t in self.count}
        n_edges: dict[EdgeType, list[int]] = {k: [] for k in self.keys}
        try:
            for hop in range(self.num_hops):
                start_size = dict(size)
                for k in self.keys:
                    src, _, dst = k
                    first, front = frontier[dst]
                    row, nbr = sample_neighbors(self.indptr[k], self.indices[k], front, self.fanouts[k][hop],
                                                generator=self.generator)
                    nbr = nbr.to(torch.int64)
                    # index_select / index_copy_ / index_fill_, not ``a[idx]``: on CPU the
                    # advanced-indexing kernels took most of a batch (torch.profiler)
                    fresh = nbr[self._pos[src].index_select(0, nbr) < 0]
                    if fresh.numel():
                        # in order of first appearance, as PyG adds them: an id's first edge is the
                        # smallest position scattered to it (linear, no sort)
                        at = torch.arange(fresh.numel())
                        first_at = self._first[src]
                        first_at.scatter_reduce_(0, fresh, at, "amin")
                        new = fresh[first_at.index_select(0, fresh) == at]
                        first_at.index_fill_(0, fresh, _UNSET)
                        self._pos[src].index_copy_(0, new, torch.arange(size[src], size[src] + new.numel()))
                        nodes[src].append(new)
                        size[src] += new.numel()
                    rows[k].append(self._pos[src].index_select(0, nbr))
                    cols[k].append(row + first)
                    n_edges[k].append(int(nbr.numel()))
                for t in self.count:
                    added = size[t] - start_size[t]
                    n_nodes[t].append(added)
                    got = torch.cat(nodes[t]) if nodes[t] else s[:0]
                    frontier[t] = (start_size[t], got[start_size[t]:])
        finally:
            for t in self.count:
                if nodes[t]:
                    self._pos[t].index_fill_(0, torch.cat(nodes[t]), -1)
        n_id = {t: torch.cat(v) if v else s[:0] for t, v in nodes.items()}
        edge_index = {k: torch.stack([torch.cat(rows[k]), torch.cat(cols[k])]) if rows[k]
                      else torch.zeros((2, 0), dtype=torch.int64) for k in self.keys}
        return HeteroBatch(seed_type, int(s.numel()), n_id, edge_index, n_nodes, n_edges)


__all__ = ["HeteroBatch", "HeteroNeighborSampler"]
