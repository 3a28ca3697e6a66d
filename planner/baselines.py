"""The placements DDAK is measured against: by id (hash), hottest first, random.

Each takes what :func:`planner.ddak.ddak` takes and returns a
:class:`~planner.placement.DdakResult`; targets are computed for comparison
but not aimed at.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.placement import (
    _CHUNK_ITEMS,
    TIERS,
    DdakBin,
    DdakResult,
    _codes,
    _deviation,
    _hot_order,
    _split_codes,
    _targets,
    check_inputs,
    result_from_bins,
)

__all__ = ["hash_placement", "hot_first_placement", "random_placement"]


def hash_placement(hotness: np.ndarray, bins: Sequence[DdakBin]) -> DdakResult:
    """Baseline: item ``i`` in bin ``i mod m``; what overflows a full bin fills the others.

    Items whose bin is full (the highest ids of that residue) go, in id
    order, to the bins with room left, listed order. Rows are in id order.

    >>> import numpy as np
    >>> bins = [DdakBin("a", "cpu", 2, 1.0), DdakBin("b", "ssd", 5, 1.0)]
    >>> hash_placement(np.ones(6), bins).bin_of.tolist()
    [0, 1, 0, 1, 1, 1]
    """
    h = check_inputs(hotness, bins)
    n, m = h.shape[0], len(bins)
    cap = np.array([b.capacity_items for b in bins], dtype=np.int64)
    bin_of = np.empty(n, dtype=np.int32)
    over: list[np.ndarray] = []
    for a in range(0, n, _CHUNK_ITEMS):
        ids = np.arange(a, min(n, a + _CHUNK_ITEMS), dtype=np.int64)
        b = ids % m
        bad = ids // m >= cap[b]  # row within the residue class past capacity
        bin_of[a : a + ids.shape[0]] = b
        if bad.any():
            over.append(ids[bad])
    if over:
        ov = np.concatenate(over)
        # items of residue j: n // m, one more for the first n % m residues (np.arange(n) % m would be 16n bytes)
        natural = np.minimum(n // m + (np.arange(m) < n % m), cap)
        spare = cap - natural
        bin_of[ov] = np.repeat(np.arange(m, dtype=np.int32), spare)[: ov.shape[0]]
    return result_from_bins(h, bins, bin_of)


def hot_first_placement(hotness: np.ndarray, bins: Sequence[DdakBin]) -> DdakResult:
    """Baseline: fill bins hottest items first, fastest tier first, bins of a tier in listed order.

    With in-degree as hotness this is "degree-hot-first". Targets are ignored.

    >>> import numpy as np
    >>> bins = [DdakBin("s", "ssd", 9, 1.0), DdakBin("g", "gpu", 1, 1.0)]
    >>> hot_first_placement(np.array([1.0, 3.0, 2.0]), bins).bin_of.tolist()
    [0, 1, 0]
    """
    h = check_inputs(hotness, bins)
    n, m = h.shape[0], len(bins)
    order, hs = _hot_order(h)
    seq = sorted(range(m), key=lambda j: (TIERS.index(bins[j].kind), j))
    cap = np.array([bins[j].capacity_items for j in seq], dtype=np.int64)
    take = np.minimum(cap, np.maximum(0, n - np.concatenate(([0], np.cumsum(cap)[:-1]))))
    starts = np.concatenate(([0], np.cumsum(take)[:-1])).astype(np.int64)
    keep = take > 0
    seg_bin = np.array(seq, dtype=np.int32)[keep]
    traffic = np.zeros(m)
    hs_sums = [
        float(hs[s : s + t].sum(dtype=np.float64))
        for s, t in zip(starts[keep], take[keep], strict=True)
    ]
    for j, v in zip(seg_bin.tolist(), hs_sums, strict=True):
        traffic[j] = v
    target = _targets(float(traffic.sum()), bins)
    del hs
    packed, bits, items = _codes(n, order, starts[keep], take[keep], seg_bin,
                                 np.zeros(int(keep.sum()), np.int64), m)
    bin_of = _split_codes(packed, bits, order)
    del order
    return DdakResult(bin_of, packed, traffic, target, items, _deviation(traffic, target))


def random_placement(hotness: np.ndarray, bins: Sequence[DdakBin], seed: int = 0) -> DdakResult:
    """Baseline: a seeded random placement, bins filled in proportion to their capacity.

    Bin sizes are the capacities scaled to ``n`` (largest remainder, capped
    at capacity); which items go where is a random permutation.

    >>> import numpy as np
    >>> r = random_placement(np.ones(10), [DdakBin("a", "cpu", 10, 1.0), DdakBin("b", "ssd", 10, 1.0)])
    >>> r.items_per_bin.tolist()
    [5, 5]
    """
    h = check_inputs(hotness, bins)
    n, m = h.shape[0], len(bins)
    cap = np.array([b.capacity_items for b in bins], dtype=np.int64)
    want = cap / cap.sum() * n if cap.sum() else np.zeros(m)
    size = np.minimum(np.floor(want).astype(np.int64), cap)
    rest = n - int(size.sum())
    for j in np.argsort(-(want - size), kind="stable"):
        if rest == 0:
            break
        add = min(rest, int(cap[j] - size[j]))
        size[j] += add
        rest -= add
    perm = np.random.default_rng(seed).permutation(n)
    bin_of = np.empty(n, dtype=np.int32)
    bin_of[perm] = np.repeat(np.arange(m, dtype=np.int32), size)
    return result_from_bins(h, bins, bin_of)
