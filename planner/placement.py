"""Bins and placements: what every placement policy takes and returns.

A placement policy (:func:`planner.ddak.ddak`, the baselines of
:mod:`planner.baselines`) takes each item's hotness and a list of
:class:`DdakBin` (a tier, a capacity in items, a traffic target) and returns
a :class:`DdakResult`: each item's bin and row there, and each bin's traffic
against its target.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from planner import compiled
from planner.errors import PlannerError

__all__ = ["TIERS", "DdakBin", "DdakResult", "check_inputs", "result_from_bins"]

#: the storage hierarchy, fastest first
TIERS: tuple[str, ...] = ("gpu", "cpu", "ssd")

# items per chunk when the per-item outputs are written (bounds the temporaries)
_CHUNK_ITEMS = 1 << 23
# below this many items the hot-first sort runs on one thread (the split costs more than it saves)
_PARALLEL_MIN_ITEMS = 1 << 22
# from this many items on, the sort and the output scatter run compiled (planner.compiled) when numba
# is importable: below it numpy takes well under a second and a first compilation would cost more
_COMPILED_MIN_ITEMS = 1 << 22


def _use_compiled(n: int) -> bool:
    return n >= _COMPILED_MIN_ITEMS and compiled.available()



@dataclass(frozen=True)
class DdakBin:
    """One bin: ``kind`` is ``"gpu"``, ``"cpu"`` or ``"ssd"``; ``capacity_items``
    how many items (rows) it holds (with :func:`planner.ddak.ddak`'s ``item_size``:
    how many size units, e.g. bytes); ``target_traffic`` the traffic the flow model
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


def check_inputs(hotness: np.ndarray, bins: Sequence[DdakBin], item_size: np.ndarray | None = None) -> np.ndarray:
    """``hotness`` as an array after the checks every placement policy owes its caller.

    One dimension of non-negative finite numbers, at least one bin, each of a
    known tier with a capacity ≥ 0 and a positive finite target, and room for
    every item (for the sum of ``item_size``, each item's size in capacity
    units, when given); else :class:`~planner.errors.PlannerError` naming the input.

    Raises
    ------
    PlannerError
        ``hotness`` is not one dimension of non-negative finite numbers, the bins are empty, too small or
        malformed, or ``item_size`` is not one integer ≥ 1 per item.
    """
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
    need, unit = n, "items"
    if item_size is not None:
        size = np.asarray(item_size)
        if size.shape != (n,) or size.dtype.kind not in "iu" or (n and size.min() < 1):
            raise PlannerError(f"item_size: expected {n} integers ≥ 1 (one per item), got shape {size.shape} "
                               f"of {size.dtype}")
        need, unit = int(size.sum(dtype=np.int64)), "size units"
    if room < need:
        raise PlannerError(
            f"bins: total capacity is {room} {unit} for {need} {unit}, {need - room} short; "
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


def _sort_threads() -> int:
    """Threads for numpy's hot-first sort: the cores this process may run on, at most 8."""
    return min(8, compiled.usable_cores())


def _hot_keys(h: np.ndarray, threads: int | None = None) -> np.ndarray:
    """Sorted keys ``(~bits(h[i]) << 32) | i`` (uint64, shape ``(n,)``) of float32 ``h``, ``n < 2**32``:
    hottest first, ties by id.

    Non-negative float32 bits order like the values, so one key sorts by
    hotness descending then id, and ``np.sort`` on uint64 is several times
    faster than a stable argsort. numpy's sort runs on one core, so with
    several (``threads``, default the cores this process may use) the keys are
    first laid out in ranges of hotness, one per thread (splitters from a
    strided sample; a hotness value never straddles two ranges), and each
    range is sorted in place by its own thread (``np.sort`` releases the GIL).
    """
    n = h.shape[0]
    bits = h.view(np.uint32)
    k = (threads or _sort_threads()) if n >= max(1, _PARALLEL_MIN_ITEMS) else 1
    split = np.empty(0, dtype=np.uint32)
    if k > 1:
        sample = np.sort(_key32(bits[:: max(1, n // (1 << 16))]))
        split = np.unique(sample[(np.arange(1, k) * sample.size) // k])

    def ranges(x: np.ndarray) -> np.ndarray:  # the range of each ~bits: splitters at or below it
        r = np.zeros(x.shape[0], dtype=np.uint8)
        for s in split:
            r += x >= s
        return r

    count = np.zeros(split.size + 1, dtype=np.int64)
    if split.size:
        for a in range(0, n, _CHUNK_ITEMS):
            count += np.bincount(ranges(_key32(bits[a : a + _CHUNK_ITEMS])), minlength=split.size + 1)
    else:
        count[0] = n
    start = np.concatenate(([0], np.cumsum(count)))
    at = start[:-1].copy()
    key = np.empty(n, dtype=np.uint64)
    for a in range(0, n, _CHUNK_ITEMS):  # chunked: a full arange would be another 8n bytes
        kc = _key32(bits[a : a + _CHUNK_ITEMS]).astype(np.uint64)
        kc <<= np.uint64(32)
        kc |= np.arange(a, a + kc.shape[0], dtype=np.uint64)
        if not split.size:
            key[a : a + kc.shape[0]] = kc
            continue
        r = ranges((kc >> np.uint64(32)).astype(np.uint32))
        for i in range(split.size + 1):
            sel = kc[r == i]
            key[at[i] : at[i] + sel.shape[0]] = sel
            at[i] += sel.shape[0]
    parts = [key[start[i] : start[i + 1]] for i in range(split.size + 1)]
    if len(parts) == 1:
        key.sort()
    else:
        with ThreadPoolExecutor(len(parts)) as ex:
            list(ex.map(np.ndarray.sort, parts))
    return key


def _key32(bits: np.ndarray) -> np.ndarray:
    """Sort keys (uint32, a new array) of float32 ``bits``: hotter is smaller, -0.0 counts as 0.0
    (it passes the check for negative hotness, and its bits would sort it among the cold)."""
    k = np.subtract(np.uint32(0xFFFFFFFF), bits)
    k[bits == np.uint32(0x80000000)] = np.uint32(0xFFFFFFFF)
    return k


def _key_hotness(key: np.ndarray) -> np.ndarray:
    """The float32 hotness inside keys of :func:`_hot_keys` (a new array)."""
    hs = np.empty(key.shape[0], dtype=np.uint32)
    np.right_shift(key, np.uint64(32), out=hs, casting="unsafe")
    np.subtract(np.uint32(0xFFFFFFFF), hs, out=hs)
    return hs.view(np.float32)


def _hot_order(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Item ids by hotness descending, ties by id (== ``np.argsort(-h, kind="stable")``),
    and the hotness in that order."""
    if h.dtype == np.float32 and h.shape[0] < (1 << 32):
        if _use_compiled(h.shape[0]):
            srt = compiled.hot_sort(h)
            return srt.order, srt.hotness()
        key = _hot_keys(h)
        hs = _key_hotness(key)
        key &= np.uint64(0xFFFFFFFF)
        return key.view(np.int64), hs
    order = np.argsort(-h.astype(np.float64), kind="stable")
    return order, h[order]


def _targets(h_total: float, bins: Sequence[DdakBin]) -> np.ndarray:
    t = np.array([b.target_traffic for b in bins], dtype=np.float64)
    return t / t.sum() * h_total


def _codes(n: int, order: np.ndarray, seg_start: np.ndarray, seg_len: np.ndarray, seg_bin: np.ndarray,
           seg_row: np.ndarray, m: int, out: np.ndarray | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    """Each item's ``row << bits | bin`` in id order (int64, ``(n,)``), ``bits``, and the items per bin.

    Segment ``k`` puts sorted positions ``seg_start[k] .. + seg_len[k]`` in bin
    ``seg_bin[k]`` from row ``seg_row[k]``. Going from sorted positions to item
    ids is an inverse permutation, written as a scatter (``packed[order] = code``)
    a block of sorted positions at a time: a random write per item, yet 3-4x
    cheaper here than sorting ``id | row | bin`` keys by id, which an earlier
    version did (20 against 75 ns per item at 4·10⁷ items: numpy's uint64 sort
    is a comparison sort), and with a uint32 ``order`` no more memory (12n bytes).
    ``out``: an int64 ``(n,)`` array to write the codes into (its old contents are lost).
    """
    items = np.bincount(seg_bin, weights=seg_len, minlength=m).astype(np.int64)
    bits = max(1, int(m - 1).bit_length())
    # sorted position p of segment k holds row seg_row[k] + p - seg_start[k], i.e.
    # (row << bits | bin) = code[k] + (p << bits)
    code = ((seg_row - seg_start) << bits) + seg_bin.astype(np.int64)
    if _use_compiled(n):
        return compiled.scatter_codes(order, seg_start, seg_len, code, bits, out), bits, items
    packed = np.empty(n, dtype=np.int64) if out is None else out
    ends = seg_start + seg_len
    step = 1 << 18  # small chunks: the passes over one stay in the cache
    for a in range(0, n, step):
        b = min(n, a + step)
        i0 = int(np.searchsorted(ends, a, side="right"))
        i1 = int(np.searchsorted(seg_start, b, side="left"))
        ln = np.minimum(ends[i0:i1], b) - np.maximum(seg_start[i0:i1], a)
        v = np.repeat(code[i0:i1], ln)
        v += np.arange(a << bits, b << bits, 1 << bits, dtype=np.int64)
        packed[order[a:b]] = v
    return packed, bits, items


def _split_codes(packed: np.ndarray, bits: int, spent_order: np.ndarray | None = None) -> np.ndarray:
    """``bin_of`` (int32) out of :func:`_codes`' codes; ``packed`` becomes ``row_of`` in place.

    ``spent_order``: the placement's own hot-first order once the codes are
    written, uint32 or int32 (``n`` items), whose memory ``bin_of`` then takes
    over: fresh memory costs a page fault per page, about 1 s a GB of CPU time
    on these VMs, 4 s at 10⁹ items. Never a caller's array.
    """
    n = packed.shape[0]
    if spent_order is not None and spent_order.dtype in (np.uint32, np.int32) \
            and spent_order.shape == (n,) and spent_order.flags.c_contiguous:
        bin_of = spent_order.view(np.int32)
    else:
        bin_of = np.empty(n, dtype=np.int32)
    if _use_compiled(n):
        return compiled.split_codes(packed, bits, out=bin_of)
    step = 1 << 17  # 1 MB of codes: both passes over a chunk stay in the cache
    for a in range(0, n, step):
        v = packed[a : a + step]
        np.bitwise_and(v, (1 << bits) - 1, out=bin_of[a : a + step], casting="unsafe")
        v >>= bits
    return bin_of


def _deviation(traffic: np.ndarray, target: np.ndarray) -> float:
    if target.sum() <= 0:
        return 0.0
    return float(np.max(np.abs(traffic - target) / target))


def _traffic(h: np.ndarray, bin_of: np.ndarray, m: int) -> np.ndarray:
    out = np.zeros(m, dtype=np.float64)
    for a in range(0, h.shape[0], _CHUNK_ITEMS):
        out += np.bincount(
            bin_of[a : a + _CHUNK_ITEMS], weights=h[a : a + _CHUNK_ITEMS], minlength=m
        )
    return out


def result_from_bins(h: np.ndarray, bins: Sequence[DdakBin], bin_of: np.ndarray) -> DdakResult:
    """The :class:`DdakResult` of a policy that chose each item's bin: rows in id order within each bin.

    ``h``: the checked hotness (:func:`check_inputs`), ``[n]``; ``bin_of``: int ``[n]``, each
    item's index into ``bins``. Adds each bin's traffic, target and the largest relative
    deviation from the targets, as DDAK reports them.
    """
    n, m = h.shape[0], len(bins)
    row_of = np.empty(n, dtype=np.int64)
    nxt = np.zeros(m, dtype=np.int64)
    for a in range(0, n, _CHUNK_ITEMS):
        b = bin_of[a : a + _CHUNK_ITEMS]
        # rank of each item among the chunk's items of its bin, in id order
        srt = np.argsort(b, kind="stable")
        cnt = np.bincount(b, minlength=m)
        first = np.concatenate(([0], np.cumsum(cnt)[:-1]))
        r = np.empty(b.shape[0], dtype=np.int64)
        r[srt] = np.arange(b.shape[0], dtype=np.int64) - np.repeat(first, cnt)
        row_of[a : a + b.shape[0]] = r + nxt[b]
        nxt += cnt
    traffic = _traffic(h, bin_of, m)
    target = _targets(float(traffic.sum()), bins)
    return DdakResult(bin_of, row_of, traffic, target, nxt, _deviation(traffic, target))
