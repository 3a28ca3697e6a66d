"""DDAK with consumer groups: each item's reads per group, each bin's target split per group.

The algorithm and where it departs from the paper's formula (2) are described
under "Consumer groups" in :mod:`planner.ddak`. :func:`ddak_affinity` is DDAK
with an :class:`Affinity` (one group, or none: :func:`planner.ddak.ddak` itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.ddak import ddak
from planner.errors import PlannerError
from planner.placement import _CHUNK_ITEMS, DdakBin, DdakResult, _deviation, _targets, check_inputs
from planner.progress import Progress


@dataclass(frozen=True)
class Affinity:
    """Who reads what: ``item_reads`` (shape ``(n, G)``, non-negative) is each item's reads by
    each of ``G`` consumer groups; ``bin_split`` (shape ``(m, G)``) each bin's target split
    over the groups (rows are normalised; an all-zero row splits like the groups' reads).

    >>> import numpy as np
    >>> Affinity(np.ones((4, 2), np.float32), np.array([[1.0, 0.0], [0.0, 1.0]])).groups
    2
    """

    item_reads: np.ndarray
    bin_split: np.ndarray

    @property
    def groups(self) -> int:
        return int(np.asarray(self.item_reads).shape[1])


def item_groups(item_reads: np.ndarray) -> np.ndarray:
    """Each item's group: the one reading it most; ties go to group ``i mod G`` (int32, ``(n,)``).

    >>> item_groups(np.array([[3, 1], [0, 2], [1, 1], [1, 1]], np.float32)).tolist()
    [0, 1, 0, 1]
    """
    r = np.asarray(item_reads)
    n, g = r.shape
    out = np.empty(n, dtype=np.int32)
    for a in range(0, n, _CHUNK_ITEMS):
        blk = r[a : a + _CHUNK_ITEMS]
        best = np.argmax(blk, axis=1).astype(np.int32)
        top = blk.max(axis=1)
        tied = (blk == top[:, None]).sum(axis=1) > 1
        ids = np.arange(a, a + blk.shape[0], dtype=np.int64)
        best[tied] = (ids[tied] % g).astype(np.int32)
        out[a : a + blk.shape[0]] = best
    return out


def ddak_affinity(hotness: np.ndarray, bins: Sequence[DdakBin], affinity: Affinity | None = None, *,
                  pool: int = 100, progress: Progress | None = None) -> DdakResult:
    """:func:`planner.ddak.ddak` run once per consumer group (see "Consumer groups" in its module docstring).

    ``affinity`` ``None`` or with one group: :func:`planner.ddak.ddak` itself. The result indexes
    ``bins`` as :func:`~planner.ddak.ddak`'s does; rows of a bin are its groups' rows one after another.

    Two SSDs, one per socket; even items are read by socket 0, odd ones by
    socket 1; each group's items go to its socket's SSD (but the first pool,
    which the other bin's near-zero target in that group takes):

    >>> import numpy as np
    >>> h = np.arange(20, 0, -1).astype(np.float32)
    >>> reads = np.zeros((20, 2), np.float32); reads[0::2, 0] = h[0::2]; reads[1::2, 1] = h[1::2]
    >>> bins = [DdakBin("s0", "ssd", 20, 1.0), DdakBin("s1", "ssd", 20, 1.0)]
    >>> b = ddak_affinity(h, bins, Affinity(reads, np.array([[1.0, 0.0], [0.0, 1.0]])), pool=1).bin_of
    >>> int((b[0::2] == 0).sum()), int((b[1::2] == 1).sum())
    (9, 9)
    """
    if pool < 1:
        raise PlannerError(f"pool: {pool} items; must be ≥ 1")
    if affinity is None or affinity.groups < 2:
        return ddak(hotness, bins, pool=pool, progress=progress)
    h = check_inputs(hotness, bins)
    aff = affinity
    n, m = h.shape[0], len(bins)
    reads = np.asarray(aff.item_reads)
    split = np.asarray(aff.bin_split, dtype=np.float64)
    G = reads.shape[1]
    if reads.shape != (n, G) or split.shape != (m, G):
        raise PlannerError(f"affinity: expected item_reads of shape ({n}, G) and bin_split of shape ({m}, G), "
                           f"got {reads.shape} and {split.shape}")
    if not (np.isfinite(split).all() and (split >= 0).all()):
        raise PlannerError("affinity: bin_split must be finite and non-negative")
    group = item_groups(reads)
    size = np.bincount(group, minlength=G).astype(np.int64)
    by_reads = size / max(1, n)
    rows = split.sum(axis=1, keepdims=True)
    split = np.where(rows > 0, split / np.where(rows > 0, rows, 1.0), by_reads[None, :])
    cap = np.array([b.capacity_items for b in bins], dtype=np.int64)
    sub_cap = np.empty((m, G), dtype=np.int64)
    for j in range(m):
        if cap[j] >= n:  # room for every item in each group: no need to divide it
            sub_cap[j] = cap[j]
            continue
        c = np.floor(split[j] * cap[j]).astype(np.int64)
        c[int(np.argmax(split[j]))] += cap[j] - int(c.sum())
        sub_cap[j] = c
    bin_of = np.empty(n, dtype=np.int32)
    row_of = np.empty(n, dtype=np.int64)
    used = np.zeros(m, dtype=np.int64)
    traffic = np.zeros(m, dtype=np.float64)
    for g in range(G):
        idx = np.flatnonzero(group == g)
        if idx.size == 0:
            continue
        if int(np.minimum(sub_cap[:, g], np.maximum(0, cap - used)).sum()) < idx.size:
            raise PlannerError(f"affinity: group {g}'s {idx.size} items do not fit its share of the bins; "
                               "give a bin with room for every item (an SSD) or drop the affinity")
        sub = [DdakBin(b.id, b.kind, int(min(sub_cap[j, g], cap[j] - used[j])),
                       max(b.target_traffic * split[j, g], 1e-12 * b.target_traffic, 1e-300))
               for j, b in enumerate(bins)]
        r = ddak(h[idx], sub, pool=pool, progress=progress)
        bin_of[idx] = r.bin_of
        row_of[idx] = r.row_of + used[r.bin_of]
        used += r.items_per_bin
        traffic += r.traffic_per_bin
    target = _targets(float(traffic.sum()), bins)
    return DdakResult(bin_of, row_of, traffic, target, used, _deviation(traffic, target))


__all__ = ["Affinity", "ddak_affinity", "item_groups"]
