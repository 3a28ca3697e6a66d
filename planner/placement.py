"""Bins and placements: what every placement policy takes and returns.

A placement policy (:func:`planner.ddak.ddak`, the baselines of
:mod:`planner.baselines`) takes each item's hotness and a list of
:class:`DdakBin` (a tier, a capacity in items, a traffic target) and returns
a :class:`DdakResult`: each item's bin and row there, and each bin's traffic
against its target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.errors import PlannerError

__all__ = ["TIERS", "DdakBin", "DdakResult"]

#: the storage hierarchy, fastest first
TIERS: tuple[str, ...] = ("gpu", "cpu", "ssd")

# items per chunk when the per-item outputs are written (bounds the temporaries)
_CHUNK_ITEMS = 1 << 23



@dataclass(frozen=True)
class DdakBin:
    """One bin: ``kind`` is ``"gpu"``, ``"cpu"`` or ``"ssd"``; ``capacity_items``
    how many items (rows) it holds; ``target_traffic`` the traffic the flow model
    wants it to serve (bytes, accesses, a share: any positive scale, only the
    ratios between bins matter).

    >>> DdakBin("ssd0", "ssd", 1000, 0.25).kind
    'ssd'
    """

    id: str
    kind: str
    capacity_items: int
    target_traffic: float


@dataclass(frozen=True)
class DdakResult:
    """A placement of ``n`` items in ``m`` bins.

    ``bin_of[i]`` (int32, shape ``(n,)``) is item ``i``'s bin (index into the
    ``bins`` list); ``row_of[i]`` (int64, ``(n,)``) its row inside that bin
    (rows of a bin are ``0 .. items_per_bin[b] - 1``, hottest first for DDAK).
    ``traffic_per_bin`` (float64, ``(m,)``) is the hotness each bin serves,
    ``target_per_bin`` the targets rescaled to the same total, ``items_per_bin``
    (int64, ``(m,)``) the items in each bin. ``max_relative_deviation`` is
    ``max_j |traffic_j - target_j| / target_j`` (0 when all hotness is 0).
    """

    bin_of: np.ndarray
    row_of: np.ndarray
    traffic_per_bin: np.ndarray
    target_per_bin: np.ndarray
    items_per_bin: np.ndarray
    max_relative_deviation: float


def _check(hotness: np.ndarray, bins: Sequence[DdakBin]) -> np.ndarray:
    h = np.asarray(hotness)
    if h.ndim != 1:
        raise PlannerError(f"hotness: expected a 1-d array, got shape {h.shape}")
    if h.dtype.kind not in "fiu":
        raise PlannerError(f"hotness: expected numbers, got dtype {h.dtype}")
    if not bins:
        raise PlannerError("bins: the list is empty; give at least one bin with room")
    for b in bins:
        if b.kind not in TIERS:
            raise PlannerError(f"bin {b.id!r}: kind {b.kind!r} is not one of {', '.join(TIERS)}")
        if b.capacity_items < 0:
            raise PlannerError(f"bin {b.id!r}: capacity_items is {b.capacity_items}; must be ≥ 0")
        if not (b.target_traffic > 0 and np.isfinite(b.target_traffic)):
            raise PlannerError(
                f"bin {b.id!r}: target_traffic is {b.target_traffic}; must be positive and finite"
            )
    n = h.shape[0]
    room = sum(int(b.capacity_items) for b in bins)
    if room < n:
        raise PlannerError(
            f"bins: total capacity is {room} items for {n} items, {n - room} short; "
            "add bins or raise their capacity_items"
        )
    if n and h.dtype.kind == "f":
        lo = h.min()
        if not np.isfinite(lo) or not np.isfinite(h.max()):
            raise PlannerError("hotness: contains NaN or infinity")
        if lo < 0:
            raise PlannerError(
                f"hotness: contains a negative value ({lo}); hotness counts accesses"
            )
    elif n and h.min() < 0:
        raise PlannerError(
            f"hotness: contains a negative value ({h.min()}); hotness counts accesses"
        )
    return h


def _hot_order(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Item ids by hotness descending, ties by id (== ``np.argsort(-h, kind="stable")``),
    and the hotness in that order."""
    n = h.shape[0]
    if h.dtype == np.float32 and n < (1 << 32):
        # Non-negative float32 bits order like the values, so one key
        # (~bits << 32 | id) sorts by hotness descending then id, and np.sort on
        # uint64 (SIMD quicksort) is several times faster than a stable argsort;
        # the sorted hotness comes back out of the keys without a random gather.
        key = np.empty(n, dtype=np.uint64)
        np.subtract(np.uint32(0xFFFFFFFF), h.view(np.uint32), out=key, casting="unsafe")
        key <<= np.uint64(32)
        for a in range(0, n, _CHUNK_ITEMS):  # chunked: a full arange would be another 8n bytes
            key[a : a + _CHUNK_ITEMS] |= np.arange(a, min(n, a + _CHUNK_ITEMS), dtype=np.uint64)
        key.sort()
        hs = np.empty(n, dtype=np.uint32)
        np.right_shift(key, np.uint64(32), out=hs, casting="unsafe")
        np.subtract(np.uint32(0xFFFFFFFF), hs, out=hs)
        key &= np.uint64(0xFFFFFFFF)
        return key.view(np.int64), hs.view(np.float32)
    order = np.argsort(-h.astype(np.float64), kind="stable")
    return order, h[order]


def _targets(h_total: float, bins: Sequence[DdakBin]) -> np.ndarray:
    t = np.array([b.target_traffic for b in bins], dtype=np.float64)
    return t / t.sum() * h_total


def _result(n: int, order: np.ndarray, seg_start: np.ndarray, seg_len: np.ndarray,
            seg_bin: np.ndarray, seg_row: np.ndarray, traffic: np.ndarray, target: np.ndarray,
            *, own_order: bool = False) -> DdakResult:
    """Per-item outputs from segments of the sorted order.

    Segment ``k`` puts sorted positions ``seg_start[k] .. + seg_len[k]`` in bin
    ``seg_bin[k]`` from row ``seg_row[k]``. Going from sorted positions to item
    ids is an inverse permutation. A scatter (``out[order] = v``) costs a cache
    miss per item (4-5 s for 10⁸ items here); sorting ``id << s | row << b |
    bin`` by id is a sequential SIMD sort and faster (about 3 s), so that is
    done whenever the three fit in 64 bits (up to about 2³⁰ items), in place
    over ``order`` when ``own_order`` (the caller's array is not needed after).
    """
    m = target.shape[0]
    items = np.bincount(seg_bin, weights=seg_len, minlength=m).astype(np.int64)
    bits = max(1, int(m - 1).bit_length())
    row_bits = max(1, int(items.max(initial=1)).bit_length())
    id_bits = max(1, int(n - 1).bit_length())
    by_sort = id_bits + row_bits + bits <= 64
    if by_sort:
        key = order.view(np.uint64) if own_order else np.empty(n, dtype=np.uint64)
    else:
        packed = np.empty(n, dtype=np.int64)
    ends = seg_start + seg_len
    # sorted position p of segment k holds row seg_row[k] + p - seg_start[k], i.e.
    # (row << bits | bin) = code[k] + (p << bits)
    code = ((seg_row - seg_start) << bits) + seg_bin.astype(np.int64)
    step = 1 << 18  # small chunks: the passes over one stay in the cache
    for a in range(0, n, step):
        b = min(n, a + step)
        i0 = int(np.searchsorted(ends, a, side="right"))
        i1 = int(np.searchsorted(seg_start, b, side="left"))
        ln = np.minimum(ends[i0:i1], b) - np.maximum(seg_start[i0:i1], a)
        v = np.repeat(code[i0:i1], ln)
        v += np.arange(a << bits, b << bits, 1 << bits, dtype=np.int64)
        if by_sort:
            k = key[a:b]
            if own_order:
                k <<= np.uint64(row_bits + bits)
            else:
                np.left_shift(order[a:b], row_bits + bits, out=k, casting="unsafe")
            k |= v.view(np.uint64)
        else:
            packed[order[a:b]] = v
    if by_sort:
        key.sort()  # position i now holds item i: the ids are 0..n-1
        packed = key.view(np.int64)
    bin_of = np.empty(n, dtype=np.int32)
    payload = (1 << (row_bits + bits)) - 1
    step = 1 << 17  # 1 MB of keys: the three passes over a chunk stay in the cache
    for a in range(0, n, step):
        v = packed[a : a + step]
        if by_sort:
            v &= payload
        np.bitwise_and(v, (1 << bits) - 1, out=bin_of[a : a + step], casting="unsafe")
        v >>= bits
    return DdakResult(bin_of, packed, traffic, target, items, _deviation(traffic, target))


def _deviation(traffic: np.ndarray, target: np.ndarray) -> float:
    if target.sum() <= 0:
        return 0.0
    return float(np.max(np.abs(traffic - target) / target))
