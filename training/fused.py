"""Several seed batches sampled in one pass: the batches :class:`~training.sampler.NeighborSampler` gives, for less.

A sampled batch is a chain of some 150 short tensor operations (Floyd's subset draws run
one batch of operations per fan-out step), so a batch of 512 seeds costs about as much in
per-operation overhead as in work: on the benchmark graph a 512-seed batch took 2.5 ms of
CPU and a 1024-seed one 3.0 ms. :class:`FusedSampler` samples ``L`` batches ("lanes")
with one chain of operations over all their rows, so the overhead is paid once per ``L``
batches. It is what the sampling server's workers run over the requests waiting for them
(:mod:`training.serve.workers`).

The batches are bit-identical to ``sampler.reseed(rng_seed); sampler.sample(seeds)`` of
each lane on its own (``relabel="map"``, the default), because every step is either
elementwise over rows or done per lane:

- random numbers are drawn per lane, from the lane's own generator, in exactly the shapes
  the single-batch sampler draws, and concatenated;
- local ids come from a vertex map with one region per lane (key ``lane * num_nodes +
  vertex``), so a vertex reached by two lanes gets each lane's own id; a vertex's first
  appearance (the ``amin`` scatter) is found within its lane's keys, in the lane's order.

A sampler that takes the compiled CPU path (:mod:`training.compiled_sampler`, the default
where numba is importable) has little per-operation overhead to share: its batches are
sampled one at a time, the same batches, laid into ``out`` all the same. The fused pass
serves the torch path (``compiled=False``, or no numba) and the GPU.

The price is the map: ``8 × num_nodes`` bytes per lane (the single sampler keeps one);
``max_lanes`` is lowered to keep it within ``map_bytes``.

>>> import torch
>>> from training.sampler import NeighborSampler
>>> indptr, indices = torch.tensor([0, 2, 4, 6, 6]), torch.tensor([1, 2, 0, 2, 0, 1])
>>> fused = FusedSampler(NeighborSampler(indptr, indices, (1, -1)), max_lanes=2)
>>> a, b = fused.sample([torch.tensor([0, 3]), torch.tensor([1])], rng_seeds=[5, 6])
>>> alone = NeighborSampler(indptr, indices, (1, -1))
>>> alone.reseed(6); c = alone.sample(torch.tensor([1]))
>>> torch.equal(b.n_id, c.n_id), torch.equal(b.edge_index, c.edge_index), a.batch_size
(True, True, 2)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from training import compiled_sampler as cs
from training.sampler import (
    _MAX_STAMP,
    NeighborSampler,
    SampledBatch,
    SamplerError,
    _floyd,
    _put_rows,
)

__all__ = ["FusedSampler"]

#: the lanes' vertex maps together stay within this by default (8 bytes per vertex per lane)
DEFAULT_MAP_BYTES = 1 << 30

#: ``out(lane, words)``: an int64 tensor of ``words`` elements to lay lane ``lane``'s batch into
#: (``n_id`` then ``edge_index`` row-major), or None to allocate one
Destination = Callable[[int, int], "Tensor | None"]


class FusedSampler:
    """Samples up to ``max_lanes`` seed batches at once with ``sampler``'s graph, fan-outs and threads.

    Args:
        sampler: the single-batch sampler whose batches this reproduces (its ``relabel``
            must be ``"map"``; with ``"unique"`` every lane is sampled on its own).
        max_lanes: batches per pass; more are sampled in passes of ``max_lanes``.
        map_bytes: bound on the lanes' vertex maps (``8 × num_nodes`` bytes per lane);
            ``max_lanes`` is lowered to fit, never below 1.
    """

    def __init__(self, sampler: NeighborSampler, max_lanes: int = 4, *, map_bytes: int = DEFAULT_MAP_BYTES) -> None:
        if max_lanes < 1:
            raise SamplerError(f"max_lanes: expected a positive integer, got {max_lanes}")
        self.sampler = sampler
        self.max_lanes = max(1, min(int(max_lanes), int(map_bytes) // max(1, 8 * sampler.num_nodes)))
        self._map: Tensor | None = None
        self._stamp = 0
        self._gens: list[torch.Generator] = []

    def sample(self, seeds: Sequence[Tensor], rng_seeds: Sequence[int], *,
               out: Destination | None = None) -> list[SampledBatch]:
        """One batch per entry of ``seeds`` (distinct, valid vertex ids: not checked here), lane ``i`` drawn
        with its generator seeded by ``rng_seeds[i]``; ``out`` chooses where each batch's tensors live."""
        if len(seeds) != len(rng_seeds):
            raise SamplerError(f"seeds and rng_seeds: expected one seed per batch, got {len(seeds)} "
                               f"and {len(rng_seeds)}")
        s = self.sampler
        # a compiled CPU batch (training.compiled_sampler) has no per-operation overhead left for a fused
        # pass to share: on the serve benchmark's graph it costs ~1.5 ms of CPU alone against ~2.0-2.5 ms
        # per batch in a torch pass over 4 lanes (tools/bench_serve.py); so such a sampler samples each alone
        if s.relabel != "map" or cs.applies(s.shapes, s.compiled, s.device, s.indices):
            return [_alone(s, x, r, out, i) for i, (x, r) in enumerate(zip(seeds, rng_seeds, strict=True))]
        before = torch.get_num_threads()
        if s.num_threads is not None and s.device.type == "cpu":
            torch.set_num_threads(s.num_threads)
        try:
            batches: list[SampledBatch] = []
            for at in range(0, len(seeds), self.max_lanes):
                part = range(at, min(at + self.max_lanes, len(seeds)))
                batches += self._pass([seeds[i] for i in part], [rng_seeds[i] for i in part],
                                      None if out is None else (lambda lane, words, at=at: out(at + lane, words)))
            return batches
        finally:
            torch.set_num_threads(before)

    def _pass(self, seeds: list[Tensor], rng_seeds: list[int], out: Destination | None) -> list[SampledBatch]:
        s, lanes, dev = self.sampler, len(seeds), self.sampler.device
        n = s.num_nodes
        while len(self._gens) < lanes:
            self._gens.append(torch.Generator(device=dev))
        gens = self._gens[:lanes]
        for g, r in zip(gens, rng_seeds, strict=True):
            g.manual_seed(int(r))
        if self._map is None or self._map.numel() < lanes * n or self._stamp >= _MAX_STAMP:
            self._map = torch.zeros(lanes * n, dtype=torch.int64, device=dev)  # grows with the widest pass
            self._stamp = 0
        self._stamp += 1
        base, node_map = self._stamp << 32, self._map
        seeds = [x.to(device=dev, dtype=torch.int64).view(-1) for x in seeds]
        # Rows, edges and new vertices are laid lane after lane; ``*_at`` lists hold where each
        # lane's run begins (and, last, where the runs end), so per-lane work is on slices.
        rows_at = _offsets([int(x.numel()) for x in seeds])
        frontier = _cat(seeds)
        keys = frontier.clone() if lanes > 1 else frontier
        ids = torch.arange(frontier.numel(), device=dev)  # a seed's local id: its position in its lane
        for b in range(1, lanes):
            _add(keys, rows_at, b, b * n)
            _add(ids, rows_at, b, -rows_at[b])
        node_map.scatter_(0, keys, ids.add_(base))
        nodes = _diff(rows_at)  # vertices per lane so far
        starts = [0] * lanes  # where each lane's frontier begins among its vertices
        hops = []  # per hop: (new vertices, their lane offsets, sources, targets, edge lane offsets)
        for fanout in s.fanouts:
            row, keys, edges_at = _neighbors(s, frontier, rows_at, fanout, gens)
            if keys.dtype != torch.int64 and lanes * n > torch.iinfo(keys.dtype).max:
                keys = keys.to(torch.int64)  # else keys stay narrow: only the unseen ones are widened
            for b in range(lanes):  # the map region of each lane; targets: lane-local ids of the frontier
                _add(keys, edges_at, b, b * n)
                _add(row, edges_at, b, starts[b] - rows_at[b])
            local = node_map.index_select(0, keys)
            unseen = (local < base).nonzero().squeeze(1)
            local.sub_(base)
            cand = keys.index_select(0, unseen).to(torch.int64)
            cand_at = _bounds(unseen, edges_at)
            at = torch.arange(cand.numel(), device=dev)
            # each unseen vertex takes the position of its first appearance in its lane (keys of
            # different lanes never meet, so the minimum is the single-batch sampler's)
            node_map.scatter_reduce_(0, cand, at, reduce="amin", include_self=False)
            first_at = node_map.index_select(0, cand)
            is_new = first_at == at
            new_id = torch.cumsum(is_new, 0)
            new_at = _prefix_at(new_id, cand_at)
            # local id of a new vertex: its lane's vertex count + its rank among the lane's new ones
            new_id.sub_(1)
            for b in range(lanes):
                _add(new_id, cand_at, b, nodes[b] - new_at[b])
            new = cand.masked_select(is_new)
            node_map.scatter_(0, new, new_id.masked_select(is_new).add_(base))
            local.scatter_(0, unseen, new_id.index_select(0, first_at))
            for b in range(1, lanes):
                _add(new, new_at, b, -b * n)
            hops.append((new, new_at, local, row, edges_at))
            fresh = _diff(new_at)
            starts, nodes = list(nodes), [nodes[b] + fresh[b] for b in range(lanes)]
            frontier, rows_at = new, new_at
        return [_assemble(b, seeds[b], hops, out) for b in range(lanes)]


def _alone(sampler: NeighborSampler, seeds: Tensor, rng_seed: int, out: Destination | None, i: int) -> SampledBatch:
    sampler.reseed(int(rng_seed))
    batch = sampler.sample(seeds, check=False)
    if out is None:
        return batch
    dest = out(i, batch.num_nodes + 2 * batch.num_edges)
    if dest is None:
        return batch
    n, e = batch.num_nodes, batch.num_edges
    dest[:n].copy_(batch.n_id)
    dest[n:n + 2 * e].view(2, e).copy_(batch.edge_index)
    return SampledBatch(dest[:n], batch.batch_size, dest[n:n + 2 * e].view(2, e), batch.num_sampled_nodes,
                        batch.num_sampled_edges)


def _cat(parts: list[Tensor], dim: int = 0) -> Tensor:
    """``torch.cat``, without its copy when there is one part (one lane)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _offsets(counts: list[int]) -> list[int]:
    """``[0, c0, c0 + c1, ...]``: where runs of ``counts`` begin, and (last) where they end."""
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def _diff(at: list[int]) -> list[int]:
    return [at[b + 1] - at[b] for b in range(len(at) - 1)]


def _add(t: Tensor, at: list[int], b: int, value: int) -> None:
    """Add ``value`` to run ``b`` of ``t`` (in place: a slice, no per-element lane lookup)."""
    if value and at[b + 1] > at[b]:
        t[at[b]:at[b + 1]].add_(value)


def _bounds(positions: Tensor, at: list[int]) -> list[int]:
    """Runs of ``positions`` (ascending, each below ``at[-1]``) that fall in each run of ``at``: their
    offsets. The ends are known; the lane boundaries between are one scalar search each (a tensor
    built from a list costs more than a few of them)."""
    inner = [int(torch.searchsorted(positions, x)) for x in at[1:-1]]
    return [0, *inner, int(positions.numel())]


def _prefix_at(cum: Tensor, at: list[int]) -> list[int]:
    """``cum[x - 1]`` (0 for ``x == 0``) for every ``x`` in ``at``: counts before each run."""
    return [int(cum[x - 1]) if x else 0 for x in at]


def _neighbors(s: NeighborSampler, frontier: Tensor, rows_at: list[int], fanout: int,
               gens: list[torch.Generator]) -> tuple[Tensor, Tensor, list[int]]:
    """:func:`~training.sampler.sample_neighbors` over every lane's frontier at once.

    Returns ``(row, nbr, edges_at)``: the row of the fused frontier of every edge (int64), the
    sampled neighbour (a new tensor, of the dtype of ``indices``), and where each lane's edges
    begin (then end).
    """
    dev = frontier.device
    start = s.indptr.index_select(0, frontier)
    deg = s.indptr.index_select(0, frontier + 1).sub_(start)
    if fanout < 0 or frontier.numel() == 0:
        count = deg
    elif s.replace:
        count = torch.where(deg > 0, fanout, 0)
    else:
        count = deg.clamp(max=fanout)
    ends = torch.cumsum(count, 0)
    edges_at = _prefix_at(ends, rows_at)
    total = edges_at[-1]
    row = torch.repeat_interleave(torch.arange(frontier.numel(), device=dev), count, output_size=total)
    first = ends.sub_(count)
    pos = (start - first).index_select(0, row).add_(torch.arange(total, device=dev))
    if fanout >= 0 and total > 0:
        drawn = ((deg > 0) if s.replace else (deg > fanout)).nonzero().squeeze(1)
        if drawn.numel():
            per = _diff(_bounds(drawn, rows_at))
            # the single sampler's draws for each lane, in its shapes, from the lane's generator
            if s.replace:
                u = _cat([torch.rand((c, fanout), generator=g, dtype=torch.float64, device=dev)
                          for c, g in zip(per, gens, strict=True) if c])
                picks = (u * deg.index_select(0, drawn).unsqueeze(1)).to(torch.int64)
            else:
                u = _cat([torch.rand((fanout, c), generator=g, dtype=torch.float64, device=dev)
                          for c, g in zip(per, gens, strict=True) if c], dim=1)
                picks = _floyd(deg.index_select(0, drawn), fanout, u)
            _put_rows(pos, first.index_select(0, drawn), start.index_select(0, drawn), picks)
    return row, s.indices.index_select(0, pos), edges_at


def _assemble(b: int, seeds: Tensor, hops: list, out: Destination | None) -> SampledBatch:
    """Lane ``b``'s batch out of the fused hops, laid straight into ``out``'s tensor when given."""
    news, srcs, tgts, node_counts, edge_counts = [seeds], [], [], [int(seeds.numel())], []
    for new, new_at, local, row, edges_at in hops:
        news.append(new[new_at[b]:new_at[b + 1]])
        srcs.append(local[edges_at[b]:edges_at[b + 1]])
        tgts.append(row[edges_at[b]:edges_at[b + 1]])
        node_counts.append(new_at[b + 1] - new_at[b])
        edge_counts.append(edges_at[b + 1] - edges_at[b])
    n, e = sum(node_counts), sum(edge_counts)
    dest = out(b, n + 2 * e) if out is not None else None
    if dest is None:
        dest = torch.empty(n + 2 * e, dtype=torch.int64, device=seeds.device)
    torch.cat(news, out=dest[:n])
    torch.cat(srcs, out=dest[n:n + e])
    torch.cat(tgts, out=dest[n + e:n + 2 * e])
    return SampledBatch(dest[:n], int(seeds.numel()), dest[n:n + 2 * e].view(2, e), tuple(node_counts),
                        tuple(edge_counts))
