"""Fast draws from discrete distributions, as the graph generator (:mod:`training.synth`) makes them.

Walker's alias table (:func:`alias_table`; numpy's ``Generator.choice``
builds a cumulative table per call and searches it, too slow for billions of
draws from one distribution), the joint table of several R-MAT levels
(:func:`rmat_table`), the R-MAT destination weights by popcount
(:func:`rmat_destination_weights`), and a guided search over a cumulative
weight array (:func:`guide`, :func:`locate`: ``np.searchsorted`` with the
cache misses of a large array taken out).

>>> cum = np.cumsum([1.0, 3.0, 0.0, 4.0])
>>> locate(cum, guide(cum), np.array([0.5, 1.0, 3.9, 7.9])).tolist()
[0, 1, 1, 3]
"""

from __future__ import annotations

import functools
import math

import numpy as np

#: Graph500's b : c : d, the shares of ``1 - a`` given to the other quadrants
_GRAPH500_BCD = (0.19, 0.19, 0.05)


def rmat_probabilities(skew: float) -> tuple[float, float, float, float]:
    """R-MAT's ``(a, b, c, d)`` for ``a = skew``, the rest in Graph500's proportions.

    >>> tuple(round(p, 2) for p in rmat_probabilities(0.57))
    (0.57, 0.19, 0.19, 0.05)
    """
    rest = 1.0 - skew
    total = sum(_GRAPH500_BCD)
    b, c, d = (rest * x / total for x in _GRAPH500_BCD)
    return (skew, b, c, d)




RMAT_LEVELS_PER_DRAW = 6


def alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table for the distribution ``p``: ``(keep, alias)``.

    Draw: ``x = u * len(p)``, ``i = floor(x)``; the outcome is ``i`` if
    ``x - i < keep[i]`` else ``alias[i]`` (Vose's construction, deterministic).
    """
    n = p.size
    scaled = p * n / p.sum()
    keep = np.ones(n)
    alias = np.arange(n)
    small = [i for i in range(n) if scaled[i] < 1.0]
    large = [i for i in range(n) if scaled[i] >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()
        keep[s], alias[s] = scaled[s], g
        scaled[g] -= 1.0 - scaled[s]
        (small if scaled[g] < 1.0 else large).append(g)
    return keep, alias  # leftovers are 1 up to rounding: keep = 1 is right for them


@functools.lru_cache(maxsize=16)
def rmat_table(skew: float, levels: int) -> tuple[np.ndarray, ...]:
    """Joint outcomes of ``levels`` R-MAT levels: alias table, row bits, column bits.

    Outcome ``i`` spells its quadrants in base 4, most significant level first;
    quadrant ``q`` (a=0, b=1, c=2, d=3) adds row bit ``q >> 1`` and column bit ``q & 1``.
    """
    probs = np.asarray(rmat_probabilities(skew))
    outcome = np.arange(4**levels)
    p = np.ones(outcome.size)
    src = np.zeros(outcome.size, dtype=np.int64)
    dst = np.zeros(outcome.size, dtype=np.int64)
    for level in range(levels):
        q = (outcome >> (2 * (levels - 1 - level))) & 3
        p *= probs[q]
        src = (src << 1) | (q >> 1)
        dst = (dst << 1) | (q & 1)
    keep, alias = alias_table(p)
    return keep, alias, src, dst


def popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each non-negative int64 (``np.bitwise_count`` arrived only in numpy 2.0)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x).astype(np.intp)
    x = x.astype(np.uint64)
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return ((x * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.intp)


def rmat_destination_weights(n: int, abcd: tuple[float, float, float, float]) -> np.ndarray:
    """Probability that an R-MAT edge ends at raw node ``0..n-1`` (float64, sums to 1).

    A cell's column bit is 0 with probability ``a + c`` and 1 with ``b + d``, at
    every level independently, so a cell's weight depends on its popcount only.
    """
    a, b, c, d = abcd
    k = max(1, math.ceil(math.log2(n)))
    p0, p1 = a + c, b + d
    table = p0 ** (k - np.arange(k + 1)) * p1 ** np.arange(k + 1)  # by popcount
    out = np.zeros(n, dtype=np.float64)
    step = 1 << 22  # cells per pass: bounded memory for big graphs
    for lo in range(0, 1 << k, step):
        cells = np.arange(lo, min(lo + step, 1 << k), dtype=np.int64)
        raw = (cells * n) >> k
        w = table[popcount(cells)]
        # raw is sorted: one bincount over the slice it spans
        first = int(raw[0])
        out[first:int(raw[-1]) + 1] += np.bincount(raw - first, weights=w)
    return out




def guide(cum: np.ndarray) -> np.ndarray:
    """A guide table for :func:`locate`: ``guide[b]`` is the first position whose running
    weight exceeds ``b / K`` of the total, ``K = len(cum)`` buckets (int32 when it fits)."""
    k = cum.size
    marks = np.arange(k + 1, dtype=np.float64) * (cum[-1] / k)
    guide = np.searchsorted(cum, marks, side="right")  # sorted probes: cheap
    guide[-1] = k  # the last mark may round below the total; nothing lies beyond the end
    return guide.astype(np.int32 if k < 2**31 - 1 else np.int64)


def locate(cum: np.ndarray, guide: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``np.searchsorted(cum, values, side="right")`` capped at ``len(cum) - 1``, for many values.

    A binary search over the whole of a large ``cum`` misses the cache at every
    step; the guide table narrows each value to its bucket's few positions, and
    a vectorised binary search over only the unresolved values finishes the job
    (a few rounds; heavy nodes span whole buckets). Same result as searchsorted.
    """
    k = cum.size
    bucket = np.clip((values * (k / cum[-1])).astype(np.int64), 0, k - 1)
    # one bucket of slack either side absorbs rounding in the bucket arithmetic
    lo = guide[np.maximum(bucket - 1, 0)].astype(np.int64)
    hi = np.minimum(guide[np.minimum(bucket + 2, k)], k - 1).astype(np.int64)
    active = np.flatnonzero(lo < hi)
    while active.size:
        a, b = lo[active], hi[active]
        mid = (a + b) >> 1
        right = cum[mid] <= values[active]
        a = np.where(right, mid + 1, a)
        b = np.where(right, b, mid)
        lo[active], hi[active] = a, b
        active = active[a < b]
    return lo


__all__ = ["RMAT_LEVELS_PER_DRAW", "alias_table", "guide", "locate", "popcount", "rmat_destination_weights",
           "rmat_probabilities", "rmat_table"]
