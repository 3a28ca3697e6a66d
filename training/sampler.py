"""Uniform neighbour sampling over a CSR graph: compiled loops on CPU, tensor operations on CUDA.

The graph is CSR: ``indices[indptr[v]:indptr[v + 1]]`` are the vertices ``v`` aggregates from
(the dataset format of :mod:`training.data`). For a mini-batch of seed vertices, :class:`NeighborSampler`
draws, per layer, ``fanout`` distinct neighbours of every vertex reached in the previous hop, uniformly
without replacement (all of them when the degree is at most the fan-out, or the fan-out is ``-1``), and
returns a :class:`SampledBatch` laid out like PyTorch Geometric's ``NeighborLoader`` output (PyG's
convolutions take it, ``trim_to_layer`` trims it with the per-hop counts).

On CPU a hop is a few compiled loops (:mod:`training.compiled_sampler`); the torch path (CUDA,
lists on disk, no numba) is tensor operations (:func:`sample_neighbors`, :mod:`training.gpusample`).

>>> import torch
>>> indptr = torch.tensor([0, 2, 4, 6, 6])           # 4 vertices, vertex 3 isolated
>>> indices = torch.tensor([1, 2, 0, 2, 0, 1])       # a triangle 0-1-2
>>> sampler = NeighborSampler(indptr, indices, fanouts=(1, -1), seed=0)
>>> batch = sampler.sample(torch.tensor([0, 3]))
>>> batch.n_id[:2].tolist(), batch.batch_size, batch.num_sampled_edges[0]
([0, 3], 2, 1)
>>> batch.edge_index.shape[0], int(batch.edge_index.max()) < batch.num_nodes
(2, True)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from training import compiled_sampler as cs
from training.errors import TrainingError
from training.gpusample import sample_fixed

__all__ = ["NeighborSampler", "NeighbourSource", "SampledBatch", "SamplerError", "count_accesses", "sample_neighbors"]

#: from this many rows on, Floyd's membership test runs column by column (measured: it
#: wins for 30 000 rows, loses to one matrix comparison for a few hundred)
_FLOYD_COLUMNWISE_ROWS = 4096

#: batch stamps of the reusable vertex map live in the high 32 bits of an int64
_MAX_STAMP = (1 << 31) - 1


class SamplerError(TrainingError):
    """Bad input to the sampler: a malformed CSR, a bad fan-out, seeds out of range."""


@dataclass(frozen=True)
class SampledBatch:
    """One sampled mini-batch, in PyG ``NeighborLoader`` layout.

    Attributes:
        n_id: int64 ``[num_nodes]`` global vertex ids; the first ``batch_size`` are the
            seeds in the order given, then the vertices first reached at each hop.
        batch_size: number of seeds.
        edge_index: int64 ``[2, num_edges]`` local ids into ``n_id``; row 0 is the
            sampled neighbour (source), row 1 the vertex that aggregates from it
            (target). Edges of hop 1 come first, then hop 2, ...
        num_sampled_nodes: vertices added per hop, hop 0 (the seeds) first;
            ``len == num_layers + 1`` and the sum is ``len(n_id)``.
        num_sampled_edges: edges sampled per hop, hop 1 first; ``len == num_layers``.

    Model layer ``l`` (0 = the first applied, the outermost hop) needs the edges of hops
    ``1 .. num_layers - l``; :attr:`edge_index_per_layer` gives those prefixes, which is
    what ``torch_geometric.utils.trim_to_layer`` computes from the two count lists.
    """

    n_id: Tensor
    batch_size: int
    edge_index: Tensor
    num_sampled_nodes: tuple[int, ...]
    num_sampled_edges: tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        """Vertices in the batch (``len(n_id)``)."""
        return int(self.n_id.numel())

    @property
    def num_edges(self) -> int:
        """Sampled edges over all hops."""
        return int(self.edge_index.shape[1])

    @property
    def num_layers(self) -> int:
        """Number of hops sampled (the number of fan-outs)."""
        return len(self.num_sampled_edges)

    @property
    def edge_index_per_layer(self) -> tuple[Tensor, ...]:
        """Per model layer, outermost first: the ``[2, E_l]`` local edges that layer needs.

        Layer ``l`` gets the edges of hops ``1 .. num_layers - l`` (views, no copies), so
        the last layer sees only the seeds' own neighbourhoods.
        """
        ends = np.cumsum(self.num_sampled_edges)
        return tuple(self.edge_index[:, : int(ends[-1 - layer])] for layer in range(self.num_layers))

    @property
    def nbytes(self) -> int:
        """Bytes held by the batch's tensors."""
        return _nbytes(self.n_id) + _nbytes(self.edge_index)

    def to(self, device: torch.device | str) -> SampledBatch:
        """The same batch with its tensors on ``device``."""
        return SampledBatch(self.n_id.to(device), self.batch_size, self.edge_index.to(device),
                            self.num_sampled_nodes, self.num_sampled_edges)


@runtime_checkable
class NeighbourSource(Protocol):
    """The CSR's ``indices`` when they are not a tensor: ``take(pos)`` is ``indices[pos]``.

    ``num_edges`` is ``len(indices)``, ``dtype`` its torch dtype, ``device`` where
    ``take`` returns (the sampler's device). The sampler draws its positions from
    ``indptr`` alone and looks up a whole hop's at once, so a source on disk
    (:class:`training.diskcsr.DiskNeighbours`) reads them in one batch, and the
    batches are the same as over the tensor.
    """

    num_edges: int
    dtype: torch.dtype
    device: torch.device

    def take(self, pos: Tensor) -> Tensor:
        """``indices[pos]`` for int64 positions, in ``dtype``."""
        ...


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _as_tensor(a: Tensor | np.ndarray | Sequence[int], what: str) -> Tensor:
    if isinstance(a, Tensor):
        return a
    arr = np.asarray(a)
    if arr.dtype.kind not in "iu":
        raise SamplerError(f"{what}: expected an integer array, got dtype {arr.dtype}")
    with warnings.catch_warnings():
        # read-only memory maps are fine: the sampler never writes to the CSR
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def sample_neighbors(
    indptr: Tensor,
    indices: Tensor | NeighbourSource,
    nodes: Tensor,
    fanout: int,
    *,
    replace: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample up to ``fanout`` neighbours of every vertex in ``nodes``, all rows at once.

    Returns ``(row, nbr)``, two tensors of length ``E``: the position in ``nodes`` (int64)
    of the vertex that aggregates, and the global id of the sampled neighbour (the dtype
    of ``indices``). Edges are grouped by ``row`` in the order of ``nodes``; a vertex of degree ``d`` gets
    ``min(d, fanout)`` edges (``d`` when ``fanout == -1``, exactly ``fanout`` draws when
    ``replace``).

    Without replacement, a row with ``d <= fanout`` takes its whole neighbourhood, the
    others a uniform ``fanout``-subset by Robert Floyd's algorithm (:func:`_subset_floyd`),
    all rows at once: exact, ``fanout`` random numbers per row, no rejection rounds.

    Draws use float64 uniforms scaled by ``d`` (bias below ``d / 2**53``).

    >>> indptr = torch.tensor([0, 3, 3, 103])
    >>> indices = torch.arange(103)
    >>> g = torch.Generator().manual_seed(0)
    >>> row, nbr = sample_neighbors(indptr, indices, torch.tensor([0, 1, 2]), 5, generator=g)
    >>> row.tolist()
    [0, 0, 0, 2, 2, 2, 2, 2]
    >>> nbr[:3].tolist(), len(set(nbr[3:].tolist())), bool((nbr[3:] >= 3).all())
    ([0, 1, 2], 5, True)
    """
    device = indptr.device
    nodes = nodes.to(device=device, dtype=torch.int64)
    # index_select, not ``a[idx]``: the same gather at about half the cost on CPU
    start = indptr.index_select(0, nodes)
    deg = indptr.index_select(0, nodes + 1).sub_(start)
    num_rows = nodes.numel()
    if fanout < 0 or num_rows == 0:
        count = deg
    elif replace:
        count = torch.where(deg > 0, fanout, 0)
    else:
        count = deg.clamp(max=fanout)
    total = int(count.sum())
    row = torch.repeat_interleave(torch.arange(num_rows, device=device), count, output_size=total)
    first = torch.cumsum(count, 0) - count  # where each row's edges begin in the output
    # CSR position of each output edge: start, start + 1, ... for now, which is already
    # right for every row that takes its whole neighbourhood (a repeat and an add; a
    # repeat of the per-row offsets is one pass, a gather through ``row`` two)
    pos = torch.repeat_interleave(start - first, count, output_size=total).add_(torch.arange(total, device=device))
    if fanout >= 0 and total > 0:
        if replace:
            picked = (deg > 0).nonzero().squeeze(1)
            draws = _uniform_below(deg[picked], fanout, generator)
            _put_rows(pos, first[picked], start[picked], draws)
        else:
            partial = (deg > fanout).nonzero().squeeze(1)
            if partial.numel():
                subset = _subset_floyd(deg.index_select(0, partial), fanout, generator)
                _put_rows(pos, first.index_select(0, partial), start.index_select(0, partial), subset)
    nbr = indices.index_select(0, pos) if isinstance(indices, Tensor) else indices.take(pos)
    return row, nbr


def _put_rows(pos: Tensor, first: Tensor, start: Tensor, offsets: Tensor) -> None:
    """``pos[first[i] + j] = start[i] + offsets[i, j]`` for every row ``i``, column ``j``."""
    cols = torch.arange(offsets.shape[1], device=pos.device)
    pos.scatter_(0, (first.unsqueeze(1) + cols).reshape(-1), (start.unsqueeze(1) + offsets).reshape(-1))


def _uniform_below(high: Tensor, num: int, generator: torch.Generator | None) -> Tensor:
    """``[len(high), num]`` int64 draws, row ``i`` uniform on ``[0, high[i])``."""
    u = torch.rand(
        (high.numel(), num), generator=generator, dtype=torch.float64, device=high.device
    )
    return (u * high.unsqueeze(1)).to(torch.int64)


def _subset_floyd(deg: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
    """Uniform ``k``-subsets of ``[0, deg[i])`` for every row at once (Floyd; needs deg > k).

    Robert Floyd's algorithm: for ``j = d-k, ..., d-1`` draw ``t`` uniform on ``[0, j]``
    and add ``t``, or ``j`` if ``t`` is already in the set. Every ``k``-subset comes out
    with probability ``1 / C(d, k)``. The loop runs over the ``k`` steps, each step one
    batch of tensor operations over all rows; membership is a comparison against the
    ``i`` columns chosen so far (``O(k²)`` per row, cheap for fan-outs of tens).
    """
    u = torch.rand((k, deg.numel()), generator=generator, dtype=torch.float64, device=deg.device)
    return _floyd(deg, k, u)


def _floyd(deg: Tensor, k: int, u: Tensor) -> Tensor:
    """:func:`_subset_floyd` with its uniforms given: float64 ``[k, len(deg)]``, consumed (written over)."""
    rows = deg.numel()
    # step-major layout: every step reads and writes contiguous rows of length ``rows``.
    # Every step's draw at once: step i scales its uniforms by j_i + 1 = deg - k + i + 1 (the
    # same float64 products as one step at a time); only the repeat check is sequential.
    out = u.mul_((deg - (k - 1)).unsqueeze(0) + torch.arange(k, device=deg.device).unsqueeze(1)).to(torch.int64)
    hit = torch.empty(rows if rows >= _FLOYD_COLUMNWISE_ROWS else 0, dtype=torch.bool, device=deg.device)
    j = deg - k
    for i in range(1, k):
        j += 1
        t = out[i]
        if rows >= _FLOYD_COLUMNWISE_ROWS:
            # many rows: compare column by column into one reused mask (no [i, rows] temporary)
            torch.eq(out[0], t, out=hit)
            for c in range(1, i):
                hit |= out[c] == t
        else:
            # few rows: one [i, rows] comparison beats i small operations' overhead
            hit = (out[:i] == t).any(0)
        torch.where(hit, j, t, out=t)  # a repeat takes j itself (Floyd), in place
    return out.t()


class NeighborSampler:
    """Multi-hop uniform neighbour sampler over a CSR graph (PyG ``NeighborLoader`` layout).

    Args:
        indptr: int64 ``[num_nodes + 1]`` CSR row pointers (torch tensor or numpy array,
            memory maps welcome).
        indices: int32/int64 ``[num_edges]``; ``indices[indptr[v]:indptr[v + 1]]`` are the
            vertices ``v`` aggregates from. Or a :class:`NeighbourSource` (lists on the SSD:
            :class:`training.diskcsr.DiskNeighbours`), with the same batches.
        fanouts: neighbours per vertex per hop, hop 1 (the seeds' own) first; ``-1`` = all.
        replace: sample with replacement (exactly ``fanout`` draws per non-isolated
            vertex) instead of without (the default).
        seed: seed of the sampler's ``torch.Generator``; ``None`` draws a fresh seed. The
            same seed, graph and seed vertices give the same batches.
        relabel: how global ids become local ids: ``"map"`` (default) scatters into a
            vertex-sized ``int64`` map kept between batches (stamped per batch, never
            reset) — ``O(E)`` per batch, ``8 × num_nodes`` bytes once; ``"unique"`` holds
            only the batch's vertices (a hash table on the compiled path, ``torch.unique``
            and ``searchsorted`` on the torch path) — no per-graph memory. Both give the
            same batches (new vertices in order of first appearance).

        num_threads: threads a CPU batch runs on (torch's intra-op setting and the
            compiled kernels'; restored after); ``None``: torch's current setting.
        shapes: ``"fixed"`` (:mod:`training.gpusample`: no host synchronisation per hop),
            ``"data"`` (the CPU's), ``"auto"`` (default): fixed on CUDA where it applies.
        compiled: data-sized CPU batches from :mod:`training.compiled_sampler` where numba
            is there (the same batches); ``False``, CUDA, a :class:`NeighbourSource`: torch's.

    The device is the CSR's: put ``indptr``/``indices`` on CUDA to sample there.
    On a GPU a batch synchronises with the host only where a size decides the
    next allocation (per hop: the edge count, the rows drawn from, the vertices
    not seen before); the seeds' checks are one more each unless the caller
    validated them once (``sample(..., check=False)``).
    With ``relabel="map"`` a sampler is not re-entrant (one per thread or worker).

    >>> import torch
    >>> ring = NeighborSampler(torch.arange(0, 21, 2), (torch.arange(10).repeat_interleave(2)
    ...     + torch.tensor([1, -1]).repeat(10)) % 10, fanouts=(-1, -1))
    >>> b = ring.sample(torch.tensor([0]))
    >>> b.n_id.tolist(), b.num_sampled_nodes, b.num_sampled_edges
    ([0, 1, 9, 2, 8], (1, 2, 2), (2, 4))
    """

    def __init__(
        self,
        indptr: Tensor | np.ndarray,
        indices: Tensor | np.ndarray | NeighbourSource,
        fanouts: Sequence[int] = (25, 10),
        replace: bool = False,
        seed: int | None = None,
        *,
        relabel: str = "map",
        num_threads: int | None = None,
        shapes: str = "auto",
        compiled: bool = True,
    ) -> None:
        indptr = _as_tensor(indptr, "indptr")
        if not isinstance(indices, NeighbourSource):
            indices = _as_tensor(indices, "indices")
            if indices.dim() != 1:
                raise SamplerError(f"indices: expected a 1-D tensor, got shape {tuple(indices.shape)}")
        if indptr.dim() != 1 or indptr.numel() < 1:
            raise SamplerError(
                f"indptr: expected a 1-D tensor of num_nodes + 1 entries, got shape {tuple(indptr.shape)}"
            )
        if indptr.dtype.is_floating_point or indices.dtype.is_floating_point:
            raise SamplerError("indptr/indices: expected integer tensors, got floating point")
        num_edges = indices.numel() if isinstance(indices, Tensor) else int(indices.num_edges)
        if int(indptr[0]) != 0 or int(indptr[-1]) != num_edges:
            raise SamplerError(
                f"indptr: must run from 0 to len(indices) = {num_edges}, "
                f"got {int(indptr[0])} .. {int(indptr[-1])}"
            )
        if indices.device != indptr.device:
            raise SamplerError(f"indptr is on {indptr.device} but indices on {indices.device}: move both to one device")
        fanouts = tuple(int(f) for f in fanouts)
        if not fanouts or any(f < -1 or f == 0 for f in fanouts):
            raise SamplerError(f"fanouts: expected positive integers or -1 (all neighbours), got {list(fanouts)}")
        if num_threads is not None and num_threads < 1:
            raise SamplerError(f"num_threads: expected a positive integer or None, got {num_threads}")
        if relabel not in ("map", "unique"):
            raise SamplerError(f"relabel: expected 'map' or 'unique', got {relabel!r}")
        fixable = relabel == "map" and not replace and all(int(f) > 0 for f in fanouts) and isinstance(indices, Tensor)
        if shapes not in ("auto", "data") and not (shapes == "fixed" and fixable):
            raise SamplerError(f"shapes: expected 'auto', 'data' or 'fixed' (needs relabel 'map', no replacement, "
                               f"fan-outs > 0 and an in-memory CSR), got {shapes!r}")
        self.indptr = indptr.to(torch.int64)
        self.indices = indices
        self.fanouts = fanouts
        self.replace = bool(replace)
        self.relabel = relabel
        self.num_threads = num_threads
        self.compiled = bool(compiled)
        self.num_nodes = indptr.numel() - 1
        self.device = indptr.device
        self.generator = torch.Generator(device=self.device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(int(seed))
        self._map: Tensor | None = None  # global id -> stamp << 32 | local id (see _sample_map)
        self._stamp = 0
        # fixed-size hops (training.gpusample): no host synchronisation per hop, what a GPU wants
        self.shapes = "fixed" if fixable and (shapes == "fixed" or (shapes == "auto" and self.device.type == "cuda")) \
            else "data"

    def reseed(self, seed: int) -> None:
        """Restart the random stream at ``seed``."""
        self.generator.manual_seed(int(seed))

    @property
    def map_nbytes(self) -> int:
        """Bytes of the reusable vertex map (0 until the first batch, or with ``"unique"``)."""
        return 0 if self._map is None else _nbytes(self._map)

    def sample(self, seeds: Tensor | np.ndarray | Sequence[int], *, check: bool = True) -> SampledBatch:
        """Sample the multi-hop neighbourhood of ``seeds`` (distinct global vertex ids).

        Returns a :class:`SampledBatch`; its tensors are on the sampler's device.
        ``check=False`` skips the range and distinctness checks of the seeds (a
        caller that validated them once, as :class:`training.batches.LocalBatchSource`
        does): on a GPU each check is a host synchronisation per batch.
        """
        seeds = _as_tensor(seeds, "seeds").view(-1)
        if check:
            self.check_seeds(seeds)
        seeds = seeds.to(device=self.device, dtype=torch.int64)
        run = self._sample_fixed if self.shapes == "fixed" else self._sample_map if self.relabel == "map" \
            else self._sample_unique
        if cs.applies(self.shapes, self.compiled, self.device, self.indices):
            run = self._sample_compiled
        if self.num_threads is None or self.device.type != "cpu":
            return run(seeds, check)
        before = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        try:
            return run(seeds, check)
        finally:
            torch.set_num_threads(before)

    def check_seeds(self, seeds: Tensor | np.ndarray | Sequence[int]) -> None:
        """Raise :class:`SamplerError` unless every seed is a vertex id (distinctness is checked by :meth:`sample`)."""
        seeds = _as_tensor(seeds, "seeds").view(-1)
        if seeds.numel():
            lo, hi = torch.aminmax(seeds)  # one pass, and one synchronisation on a device
            lo, hi = int(lo), int(hi)
            if lo < 0 or hi >= self.num_nodes:
                raise SamplerError(f"seeds: vertex ids must lie in [0, {self.num_nodes}), got {lo} .. {hi}")

    __call__ = sample

    def _hops(self, frontier: Tensor, hop: int) -> tuple[Tensor, Tensor]:
        return sample_neighbors(self.indptr, self.indices, frontier, self.fanouts[hop], replace=self.replace,
                                generator=self.generator)

    def _stamp_seeds(self, seeds: Tensor, check: bool) -> tuple[Tensor, int]:
        # The map holds ``stamp << 32 | local id``; a new stamp per batch makes every older
        # entry read as "not in this batch" (it is smaller than ``base``), so nothing is
        # ever reset: the map costs O(batch) per batch, like the batch itself.
        if self._map is None or self._stamp >= _MAX_STAMP:
            self._map = torch.zeros(self.num_nodes, dtype=torch.int64, device=self.device)
            self._stamp = 0
        self._stamp += 1
        base = self._stamp << 32
        ids = torch.arange(seeds.numel(), device=self.device)
        self._map.scatter_(0, seeds, ids + base)
        if check and seeds.numel() and not bool((self._map.index_select(0, seeds) - base == ids).all()):
            raise SamplerError("seeds: contain repeated vertex ids; pass each seed once")
        return self._map, base

    def _sample_compiled(self, seeds: Tensor, check: bool = True) -> SampledBatch:
        g = cs.Csr(self.indptr.numpy(), self.indices.numpy(), self.fanouts, self.replace, self.generator)
        node_map, base = self._stamp_seeds(seeds, check) if self.relabel == "map" else (None, 0)
        if node_map is None:
            _check_distinct(seeds.sort()[0], check)
        n_id, edge_index, nodes, edges = cs.sample(g, seeds.numpy(), cs.threads_for(self.num_threads),
                                                   None if node_map is None else node_map.numpy(), base)
        return SampledBatch(torch.from_numpy(n_id), seeds.numel(), torch.from_numpy(edge_index), nodes, edges)

    def _sample_map(self, seeds: Tensor, check: bool = True) -> SampledBatch:
        node_map, base = self._stamp_seeds(seeds, check)
        num_seeds = seeds.numel()
        parts, sources, targets = [seeds], [], []
        num_nodes, frontier_start = num_seeds, 0
        for hop in range(len(self.fanouts)):
            row, nbr = self._hops(parts[-1], hop)
            local = node_map.index_select(0, nbr)
            unseen = (local < base).nonzero().squeeze(1)
            local.sub_(base)
            cand = nbr.index_select(0, unseen).to(torch.int64)
            if cand.numel():
                at = torch.arange(cand.numel(), device=self.device)
                # each unseen vertex takes the position of its first appearance: amin is
                # order-independent, hence deterministic on CUDA as well
                node_map.scatter_reduce_(0, cand, at, reduce="amin", include_self=False)
                first_at = node_map.index_select(0, cand)
                is_new = first_at == at
                new = cand.masked_select(is_new)
                # local id of a new vertex: num_nodes + its rank among the new ones (so the new
                # ones, in order, take num_nodes, num_nodes + 1, ...: no second masked select)
                new_id = torch.cumsum(is_new, 0).sub_(1 - num_nodes)
                node_map.scatter_(0, new, torch.arange(base + num_nodes, base + num_nodes + new.numel(),
                                                       device=self.device))
                local.scatter_(0, unseen, new_id.index_select(0, first_at))
            else:
                new = cand
            parts.append(new)
            sources.append(local)
            targets.append(row.add_(frontier_start))
            frontier_start = num_nodes
            num_nodes += new.numel()
        return _batch(torch.cat(parts), num_seeds, sources, targets, parts)

    def _sample_fixed(self, seeds: Tensor, check: bool = True) -> SampledBatch:
        _check_distinct(seeds.sort().values if check else seeds[:0], check)
        if self._map is None or self._map.numel() != self.num_nodes + 1 or self._stamp >= _MAX_STAMP:
            self._map, self._stamp = torch.zeros(self.num_nodes + 1, dtype=torch.int64, device=self.device), 0  # + sink
        self._stamp += 1
        assert isinstance(self.indices, Tensor)  # "fixed" needs an in-memory CSR (checked at construction)
        n_id, edge_index, nodes, edges = sample_fixed(self.indptr, self.indices, seeds, self.fanouts, self._map,
                                                      self._stamp << 32, self.generator)
        return SampledBatch(n_id, seeds.numel(), edge_index, nodes, edges)

    def _sample_unique(self, seeds: Tensor, check: bool = True) -> SampledBatch:
        num_seeds = seeds.numel()
        known, order = seeds.sort()
        _check_distinct(known, check)
        parts, sources, targets = [seeds], [], []
        num_nodes, frontier_start = num_seeds, 0
        for hop in range(len(self.fanouts)):
            row, nbr = self._hops(parts[-1], hop)
            nbr = nbr.to(torch.int64)
            uniq, inverse = torch.unique(nbr, return_inverse=True)
            at = torch.searchsorted(known, uniq).clamp(max=max(known.numel() - 1, 0))
            found = known[at] == uniq if known.numel() else torch.zeros_like(uniq, dtype=torch.bool)
            # new vertices in order of first appearance, as relabel="map" (the same batches)
            at_e = torch.arange(nbr.numel(), device=self.device)
            first_at = torch.full_like(uniq, nbr.numel()).scatter_reduce_(0, inverse, at_e, reduce="amin")
            fresh = (~found).nonzero().squeeze(1)
            fresh = fresh.index_select(0, first_at.index_select(0, fresh).argsort())
            new = uniq.index_select(0, fresh)
            local_uniq = torch.empty_like(uniq)
            local_uniq[found] = order[at[found]]
            local_uniq[fresh] = torch.arange(num_nodes, num_nodes + new.numel(), device=self.device)
            parts.append(new)
            sources.append(local_uniq[inverse])
            targets.append(row + frontier_start)
            frontier_start = num_nodes
            num_nodes += new.numel()
            # keep the sorted (global id, local id) pairs for the next hop's lookups
            known, perm = torch.cat([known, new]).sort()
            order = torch.cat([order, local_uniq[fresh]])[perm]
        return _batch(torch.cat(parts), num_seeds, sources, targets, parts)


def _check_distinct(ordered: Tensor, check: bool) -> None:
    if check and ordered.numel() > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        raise SamplerError("seeds: contain repeated vertex ids; pass each seed once")


def _batch(
    n_id: Tensor, num_seeds: int, sources: list[Tensor], targets: list[Tensor], parts: list[Tensor]
) -> SampledBatch:
    num_edges = sum(int(s.numel()) for s in sources)
    edge_index = torch.empty((2, num_edges), dtype=torch.int64, device=n_id.device)
    torch.cat(sources, out=edge_index[0])
    torch.cat(targets, out=edge_index[1])
    return SampledBatch(
        n_id=n_id,
        batch_size=num_seeds,
        edge_index=edge_index,
        num_sampled_nodes=tuple(int(p.numel()) for p in parts),
        num_sampled_edges=tuple(int(s.numel()) for s in sources),
    )


def count_accesses(
    sampler: NeighborSampler,
    seeds: Tensor | np.ndarray | Sequence[int],
    batch_size: int,
    *,
    num_batches: int | None = None,
    epochs: float = 1.0,
    shuffle_seed: int | None = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Tensor:
    """Pre-sampling: how often each vertex's feature row is read, over many mini-batches.

    Walks ``seeds`` (typically the training vertices) in mini-batches of ``batch_size``,
    reshuffled every epoch with a generator seeded by ``shuffle_seed`` (``None`` keeps
    the given order), samples each batch with ``sampler`` and adds one to every vertex of
    its ``n_id`` — the rows a trainer would gather. Stops after ``num_batches`` batches
    if given, else after ``epochs`` passes (fractions allowed; the last batch of an epoch
    may be short).

    Returns int64 ``[num_nodes]`` access counts on the sampler's device (the placement
    step's hotness); the total equals the sum of ``len(n_id)`` over the batches.
    ``progress(done, total)`` is called after every batch.

    >>> import torch
    >>> s = NeighborSampler(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 0]), (1,), seed=0)
    >>> count_accesses(s, torch.arange(3), 2, epochs=1, shuffle_seed=None).tolist()
    [2, 1, 2]
    """
    seeds = _as_tensor(seeds, "seeds").to(device=sampler.device, dtype=torch.int64).view(-1)
    if batch_size < 1:
        raise SamplerError(f"batch_size: expected a positive integer, got {batch_size}")
    n = seeds.numel()
    per_epoch = math.ceil(n / batch_size) if n else 0
    if num_batches is None:
        if epochs < 0:
            raise SamplerError(f"epochs: expected a non-negative number, got {epochs}")
        num_batches = math.ceil(per_epoch * epochs)
    elif num_batches < 0:
        raise SamplerError(f"num_batches: expected a non-negative integer, got {num_batches}")
    if per_epoch == 0:
        num_batches = 0
    counts = torch.zeros(sampler.num_nodes, dtype=torch.int64, device=sampler.device)
    shuffler = None
    if shuffle_seed is not None:
        shuffler = torch.Generator(device="cpu").manual_seed(int(shuffle_seed))
    order = seeds
    for done in range(num_batches):
        step = done % per_epoch
        if step == 0 and shuffler is not None:
            order = seeds[torch.randperm(n, generator=shuffler).to(seeds.device)]
        batch = sampler.sample(order[step * batch_size : (step + 1) * batch_size])
        # n_id is duplicate-free, so index_add of ones counts each vertex once per batch
        counts.index_add_(0, batch.n_id, torch.ones_like(batch.n_id))
        if progress is not None:
            progress(done + 1, num_batches)
    return counts
