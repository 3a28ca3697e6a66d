"""Neighbour sampling shaped for a GPU: fixed-size tensors per hop, a few dozen kernels, no host synchronisation.

:class:`~training.sampler.NeighborSampler`'s own hop is tuned for the CPU: its
output sizes depend on the data (``int(count.sum())``, ``nonzero``,
``masked_select``), so on a GPU every hop waits for the device four times, and
its Floyd loop for many rows compares column by column, some hundreds of small
kernels per hop. Here every hop's tensors have sizes the host knows in advance
(``frontier slots × fan-out``), invalid slots masked rather than removed, and the
batch is compacted once at its end, after one read-back of its sizes: one host
synchronisation per batch.

The draws are still Robert Floyd's (``_floyd`` of :mod:`training.sampler`:
step ``i`` draws ``t_i`` uniform on ``[0, j_i]``, ``j_i = d - k + i``, and takes
``j_i`` instead when ``t_i`` is taken), but the repeat test is not sequential:
``t_i`` is taken iff it equals an earlier draw, or equals ``j_m`` for the step
``m = t_i - (d - k) < i`` whose own draw was taken (every earlier draw is in the set,
and the only other members are the ``j_m`` of repeats). That is a chain over
the steps, resolved by pointer jumping in ``ceil(log2 k)`` rounds of gathers, so
the output is exactly Floyd's, a uniform ``k``-subset per row.

Relabelling follows ``NeighborSampler``'s ``map``: a vertex map of ``num_nodes + 1``
entries (the last one a sink for masked slots) holding ``stamp << 32 | local id``;
a new vertex's local id is its rank among the hop's new vertices by first
appearance. The same torch code runs on the CPU, where the tests check it against
the sampling rules (:mod:`training.samplecheck`) and count its synchronising ops.

>>> indptr, indices = torch.tensor([0, 3, 3, 103]), torch.arange(103) % 3
>>> n_id, edge_index, nodes, edges = sample_fixed(indptr, indices, torch.tensor([0, 2]), (5, 2),
...                                               torch.zeros(4, dtype=torch.int64), 1 << 32)
>>> nodes, edges
((2, 1, 0), (8, 0))
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def floyd_parallel(deg: Tensor, k: int, u: Tensor) -> Tensor:
    """Floyd's ``k``-subsets of ``[0, deg[i])`` for every row, given its uniforms ``u`` (float64 ``[rows, k]``).

    Rows with ``deg <= k`` get meaningless values (the caller takes their whole
    neighbourhood instead). Returns int64 ``[rows, k]``.
    """
    rows = deg.numel()
    steps = torch.arange(k, device=deg.device)
    lo = (deg - k).clamp(min=0).unsqueeze(1)  # j_0 = d - k
    j = lo + steps  # j_i, [rows, k]
    t = torch.minimum((u * (j + 1)).to(torch.int64), j)  # uniform on [0, j_i]
    # an earlier draw equal to t_i: [rows, k, k] with m < i (those draws are all in the set)
    earlier = torch.ones(k, k, dtype=torch.bool, device=deg.device).tril(-1)
    taken = ((t.unsqueeze(2) == t.unsqueeze(1)) & earlier).any(2)
    # or t_i == j_m for an earlier step m whose own draw was taken: a chain m -> p(m) < m
    m = t - lo
    link = (m >= 0) & (m < steps)
    parent = torch.where(link, m, steps.expand(rows, k))
    for _ in range(max(1, math.ceil(math.log2(max(k, 2))))):
        taken = taken | (link & taken.gather(1, parent))
        link = link & link.gather(1, parent)
        parent = parent.gather(1, parent)
    return torch.where(taken, j, t)


def _hop(indptr: Tensor, indices: Tensor, frontier: Tensor, valid: Tensor, fanout: int,
         generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """CSR positions ``[slots, fanout]`` of each frontier slot's sampled neighbours, and which are real."""
    start = indptr.index_select(0, frontier)
    deg = torch.where(valid, indptr.index_select(0, frontier + 1) - start, 0)
    cols = torch.arange(fanout, device=indptr.device)
    u = torch.rand((frontier.numel(), fanout), generator=generator, dtype=torch.float64, device=indptr.device)
    offset = torch.where((deg > fanout).unsqueeze(1), floyd_parallel(deg, fanout, u), cols)
    real = cols < deg.clamp(max=fanout).unsqueeze(1)
    pos = torch.where(real, start.unsqueeze(1) + offset, 0)
    return pos.reshape(-1), real.reshape(-1)


def sample_fixed(indptr: Tensor, indices: Tensor, seeds: Tensor, fanouts: Sequence[int], node_map: Tensor,
                 base: int, generator: torch.Generator | None = None
                 ) -> tuple[Tensor, Tensor, tuple[int, ...], tuple[int, ...]]:
    """The multi-hop sample of ``seeds`` (distinct, int64, on ``indptr``'s device), fan-outs all >= 0.

    ``node_map``: int64 ``[num_nodes + 1]`` whose entries are all below
    ``base`` (``stamp << 32``; written here, never reset); the batch is
    :class:`~training.sampler.NeighborSampler`'s layout (``n_id``, ``edge_index``, the
    vertices added per hop, the edges per hop: a ``SampledBatch``'s fields but its
    ``batch_size``). One host synchronisation, at the end (the sizes of the compacted batch).
    """
    dev = indptr.device
    sink = node_map.numel() - 1  # masked slots write here
    b = seeds.numel()
    slots = [b]
    for f in fanouts:
        slots.append(slots[-1] * f)
    cap = sum(slots)
    n_id = torch.zeros(cap + 1, dtype=torch.int64, device=dev)
    n_id[:b] = seeds
    node_map.scatter_(0, seeds, torch.arange(base, base + b, device=dev))
    count = torch.full((), b, dtype=torch.int64, device=dev)  # vertices so far (on the device)
    first_local = torch.zeros((), dtype=torch.int64, device=dev)  # the frontier's first local id
    frontier, valid = seeds, torch.ones(b, dtype=torch.bool, device=dev)
    hops: list[tuple[Tensor, Tensor, Tensor]] = []
    sizes = [count.clone()]
    for hop, f in enumerate(fanouts):
        pos, real = _hop(indptr, indices, frontier, valid, f, generator)
        nbr = indices.index_select(0, pos).to(torch.int64)
        seen = node_map.index_select(0, nbr) >= base
        fresh = real & ~seen
        at = torch.arange(nbr.numel(), device=dev)
        key = torch.where(fresh, nbr, sink)
        node_map.scatter_reduce_(0, key, at, reduce="amin", include_self=False)  # first appearance wins
        is_new = fresh & (node_map.index_select(0, key) == at)
        rank = torch.cumsum(is_new, 0) - 1
        new_local = count + rank
        node_map.scatter_(0, torch.where(is_new, nbr, sink), base + new_local)
        n_id.scatter_(0, torch.where(is_new, new_local, cap), nbr)
        local = node_map.index_select(0, torch.where(real, nbr, sink)) - base
        target = (first_local + torch.arange(frontier.numel(), device=dev)).repeat_interleave(f)
        hops.append((local, target, real))
        added = is_new.sum()
        first_local = count
        count = count + added
        sizes.append(added)
        if hop + 1 < len(fanouts):
            slot = torch.arange(slots[hop + 1], device=dev)
            valid = slot < added
            frontier = n_id.index_select(0, torch.where(valid, first_local + slot, cap))
    edges = [r.sum() for _, _, r in hops]
    got = torch.stack([*sizes, *edges]).tolist()  # the batch's one host synchronisation
    nodes, per_edge = got[:len(sizes)], got[len(sizes):]
    total = sum(per_edge)
    edge_index = torch.empty((2, total + 1), dtype=torch.int64, device=dev)
    done = 0
    for (local, target, real), e in zip(hops, per_edge, strict=True):
        dest = torch.where(real, torch.cumsum(real, 0) - 1 + done, total)  # compacted in order, masked to the sink
        edge_index[0].scatter_(0, dest, local)
        edge_index[1].scatter_(0, dest, target)
        done += e
    return n_id[:sum(nodes)], edge_index[:, :total], tuple(nodes), tuple(per_edge)
