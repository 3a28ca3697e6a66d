"""Data-distribution-aware knapsack (DDAK): put items in bins so bin traffic matches targets.

The paper's §3.3, generic over items and bins: an item is anything with a
hotness (expected accesses per epoch; a vertex's feature row for Moment), a
bin is a storage place with a capacity in items and a target traffic (the
share of all accesses the flow model wants it to serve, e.g.
:attr:`planner.flow.FlowResult.store_bytes`; any positive scale). Nothing here
knows about graphs.

The algorithm (:func:`ddak`)
----------------------------
Items are sorted by hotness, hottest first (stable: equal hotness keeps id
order), and handed out in pools of ``pool`` consecutive items. Targets are
rescaled to the total hotness ``H``: ``T_j = target_j / Σ target · H``. With
``A_j`` the hotness already in bin ``j`` and ``U_j`` its items, the priority
score is

    ``score_j = A_j / T_j + U_j / C_j``        (``C_j`` = capacity in items)

and each pool goes to the eligible bin with the **lowest** score (ties: faster
tier, then the bin listed first). Eligibility enforces the hierarchy
GPU > CPU > SSD:

1. while some GPU bin has room and ``A_j < T_j`` (is short of its target),
   only those GPU bins are eligible; then the same for CPU bins; then SSD bins;
2. once every bin is at its target or full, every bin with room is eligible
   (this phase places the leftover, coldest items).

So the hottest items fill the fastest tier until it serves its share, and a
pool that would go to a bin with less room than the pool is split: the bin
takes what fits, the rest goes to the next choice.

Departure from the paper's formula (2),
``Bin_access/Bin_traffic · Bin_currentCapacity/Bin_Capacity``: the product is
0 for every empty bin, so all empty bins tie and the first pools' placement
is arbitrary; a bin stays at 0, the best score, until it gets an item
whatever its target. The sum keeps both terms — the share of target traffic reached and
the share of capacity used — and is strictly increasing in each, so a bin
that has served more of its target, or used more of its room, is filled
later. The hierarchy is made explicit by the tier gate instead of being left
to the score.

Consumer groups (``affinity``, not in the paper)
-----------------------------------------------
The paper's formula (2) treats every access alike: a bin's traffic is one
number. On a two-socket machine an access is cheap when the bin sits on the
reader's socket and dearer across the inter-socket link, so with an
:class:`planner.affinity.Affinity` the items carry their reads per consumer group
(``item_reads[i, g]``, e.g. the hotness seen by the GPUs of socket ``g``)
and each bin's target is split per group (``bin_split[j, g]``, e.g. how the
flow solution routes the bin's bytes to each socket's GPUs). Each item
joins the group that reads it most (ties: group ``i mod G``, so that items
read alike by all groups spread evenly and deterministically), and the
score above runs once per group over that group's items, with every bin's
target scaled by its split and a capacity smaller than the item count
divided in the same proportion (a bin that can hold every item, an SSD,
keeps its full capacity in every group). So rows go to the bins the flow
wants their readers to read from, i.e. where the GPUs that read them most
are local; without an affinity nothing changes. This departs from formula
(2) in running it per group with targets ``T_j · split_jg``
(:func:`planner.affinity.ddak_affinity`, a module above this one); a group's
items are placed by the same score, tier gate and pools as before. It costs
about 1.5x the plain call (10^7 items, two groups: 2.5-2.7 s against
1.7 s of CPU here; the grouping and the per-group gathers), and nothing
when no affinity is given.

Accuracy: when no bin fills up before its target is reached (capacities
with slack), every bin ends within one pool of its target: a bin that
reaches its target overshoots by less than the hottest pool ``P``, and the
bins short of target at the end are short by at most the sum of the others'
overshoots, so the max relative deviation is below ``(m - 1) · P / min_j T_j``
for ``m`` bins. With binding capacities no such bound holds for any
hot-first greedy (a target that wants the second-hottest item but not the
hottest cannot be met by handing out the hottest first).

Speed and memory: the sort is a ``np.sort`` of packed 64-bit keys for
float32 hotness (``argsort`` otherwise), split over the cores by hotness
ranges, a thread each (:func:`_hot_keys`); the ids come out of the keys as
uint32 and the pool sums a block at a time, so the sorted hotness is never
held. The pool loop is plain Python over a heap of at most ``m`` bins, once
per pool, with a tight path for whole pools that records only each pool's
bin (rows and offsets are rebuilt with numpy after); the per-item outputs go
from sorted order to id order by a blocked scatter of ``row | bin`` codes
(:func:`_codes`). Peak memory beyond the input is about 12 bytes an item
(the uint32 order and the int64 codes, then the codes and ``bin_of``: the
outputs themselves are 12 bytes an item). 10⁸ items, 10 bins
(``tools/bench_ddak.py``, 2 cores shared with other work, load 3-4): 12.9 s
of CPU time and 1.31 GB beyond the input against 18.1 s and 1.37 GB for the
previous version (a sort of ``id | row | bin`` keys for the outputs, the
sorted hotness held), with identical outputs; the sort is 75-80% of it
(numpy's uint64 sort is a comparison sort, about 75 ns an item here).
10⁹ items (``--items 1e9``, load 3.5-5.2): 174 s of CPU time, 401 s of wall
time, 12.6 GB beyond the input (hash placement: 67 s, 93 s, 13.9 GB); the
sort's CPU time grows as ``n log n`` and a second core helps only when it is
idle. Reaching tens of seconds needs a sort several times faster than
numpy's (a compiled parallel radix sort), not a change to the algorithm.

>>> import numpy as np
>>> bins = [DdakBin("gpu0", "gpu", 2, 6.0), DdakBin("ssd0", "ssd", 10, 4.0)]
>>> r = ddak(np.array([1.0, 5.0, 1.0, 2.0, 1.0]), bins, pool=1)
>>> r.bin_of.tolist(), r.row_of.tolist()
([1, 0, 1, 0, 1], [0, 0, 1, 1, 2])
>>> r.traffic_per_bin.tolist(), r.items_per_bin.tolist()
([7.0, 3.0], [2, 3])
>>> round(r.max_relative_deviation, 3)
0.25
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from planner.errors import PlannerError
from planner.progress import Progress, report

#: the storage hierarchy, fastest first
TIERS: tuple[str, ...] = ("gpu", "cpu", "ssd")

# items per chunk when the per-item outputs are written (bounds the temporaries)
_CHUNK_ITEMS = 1 << 23
# below this many items the hot-first sort runs on one thread (the split costs more than it saves)
_PARALLEL_MIN_ITEMS = 1 << 22


def _sort_threads() -> int:
    """Threads for the hot-first sort: the cores this process may run on, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, cores or 1))


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
    inv = np.uint32(0xFFFFFFFF)
    bits = h.view(np.uint32)
    k = (threads or _sort_threads()) if n >= max(1, _PARALLEL_MIN_ITEMS) else 1
    split = np.empty(0, dtype=np.uint32)
    if k > 1:
        sample = np.sort(inv - bits[:: max(1, n // (1 << 16))])
        split = np.unique(sample[(np.arange(1, k) * sample.size) // k])

    def ranges(x: np.ndarray) -> np.ndarray:  # the range of each ~bits: splitters at or below it
        r = np.zeros(x.shape[0], dtype=np.uint8)
        for s in split:
            r += x >= s
        return r

    count = np.zeros(split.size + 1, dtype=np.int64)
    if split.size:
        for a in range(0, n, _CHUNK_ITEMS):
            count += np.bincount(ranges(inv - bits[a : a + _CHUNK_ITEMS]), minlength=split.size + 1)
    else:
        count[0] = n
    start = np.concatenate(([0], np.cumsum(count)))
    at = start[:-1].copy()
    key = np.empty(n, dtype=np.uint64)
    for a in range(0, n, _CHUNK_ITEMS):  # chunked: a full arange would be another 8n bytes
        kc = np.subtract(inv, bits[a : a + _CHUNK_ITEMS]).astype(np.uint64)
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
        key = _hot_keys(h)
        hs = _key_hotness(key)
        key &= np.uint64(0xFFFFFFFF)
        return key.view(np.int64), hs
    order = np.argsort(-h.astype(np.float64), kind="stable")
    return order, h[order]


def _pool_sums(hs: np.ndarray, pool: int) -> list[float]:
    """Sums (float64) of consecutive pools of ``pool`` items of ``hs`` (the last may be short)."""
    return np.add.reduceat(hs.astype(np.float64), np.arange(0, hs.shape[0], pool)).tolist()


def _hot_ids(h: np.ndarray, pool: int, order: np.ndarray | None) -> tuple[np.ndarray, list[float]]:
    """The hot-first order of the ids (``order`` if given; uint32 on the fast path) and its pool sums.

    The sorted hotness is never held whole (4n bytes at 10⁹ items): the
    pool sums come out of the sorted keys, or out of ``h[order]``, a block of
    whole pools at a time, and the keys' ids go to a uint32 array (the keys'
    8n bytes are freed after).
    """
    n = h.shape[0]
    step = max(1, _CHUNK_ITEMS // pool) * pool
    sums: list[float] = []
    if order is None and h.dtype == np.float32 and n < (1 << 32):
        key = _hot_keys(h)
        order = np.empty(n, dtype=np.uint32)
        for a in range(0, n, step):
            kc = key[a : a + step]
            sums += _pool_sums(_key_hotness(kc), pool)
            np.bitwise_and(kc, np.uint64(0xFFFFFFFF), out=order[a : a + step], casting="unsafe")
        return order, sums
    if order is None:
        order = np.argsort(-h.astype(np.float64), kind="stable")
    for a in range(0, n, step):
        sums += _pool_sums(h[order[a : a + step]], pool)
    return order, sums


def _targets(h_total: float, bins: Sequence[DdakBin]) -> np.ndarray:
    t = np.array([b.target_traffic for b in bins], dtype=np.float64)
    return t / t.sum() * h_total


def _codes(
    n: int,
    order: np.ndarray,
    seg_start: np.ndarray,
    seg_len: np.ndarray,
    seg_bin: np.ndarray,
    seg_row: np.ndarray,
    m: int,
) -> tuple[np.ndarray, int, np.ndarray]:
    """Each item's ``row << bits | bin`` in id order (int64, ``(n,)``), ``bits``, and the items per bin.

    Segment ``k`` puts sorted positions ``seg_start[k] .. + seg_len[k]`` in bin
    ``seg_bin[k]`` from row ``seg_row[k]``. Going from sorted positions to item
    ids is an inverse permutation, written as a scatter (``packed[order] = code``)
    a block of sorted positions at a time: a random write per item, yet 3-4x
    cheaper here than sorting ``id | row | bin`` keys by id, which the previous
    version did (20 against 75 ns per item at 4·10⁷ items: numpy's uint64 sort
    is a comparison sort), and with a uint32 ``order`` no more memory (12n bytes).
    """
    items = np.bincount(seg_bin, weights=seg_len, minlength=m).astype(np.int64)
    bits = max(1, int(m - 1).bit_length())
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
        packed[order[a:b]] = v
    return packed, bits, items


def _split_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """``bin_of`` (int32) out of :func:`_codes`' codes; ``packed`` becomes ``row_of`` in place."""
    bin_of = np.empty(packed.shape[0], dtype=np.int32)
    step = 1 << 17  # 1 MB of codes: both passes over a chunk stay in the cache
    for a in range(0, packed.shape[0], step):
        v = packed[a : a + step]
        np.bitwise_and(v, (1 << bits) - 1, out=bin_of[a : a + step], casting="unsafe")
        v >>= bits
    return bin_of


def _deviation(traffic: np.ndarray, target: np.ndarray) -> float:
    if target.sum() <= 0:
        return 0.0
    return float(np.max(np.abs(traffic - target) / target))


def ddak(
    hotness: np.ndarray,
    bins: Sequence[DdakBin],
    pool: int = 100,
    order: np.ndarray | None = None,
    progress: Progress | None = None,
) -> DdakResult:
    """Place items so each bin's traffic matches its target (see the module docstring).

    ``hotness`` (shape ``(n,)``, non-negative; float32 is fastest) is each
    item's expected accesses; ``bins`` the bins, any order (their index is the
    value of ``bin_of``); ``pool`` how many consecutive items (in hotness order)
    move together; ``order`` an optional precomputed hot-first order of the
    item ids (a permutation of ``0..n-1``), e.g. reused across calls.
    ``progress`` hears ``("ddak", done, 3)`` after the sort, the pool loop
    and the outputs (a call per pool would slow the loop). Reads per
    consumer group: :func:`planner.affinity.ddak_affinity` (see "Consumer
    groups" in the module docstring).

    Raises :class:`PlannerError` for an empty bin list, total capacity below
    ``n``, negative or non-finite hotness, a target that is not positive.

    >>> import numpy as np
    >>> bins = [DdakBin("gpu0", "gpu", 10, 1.0), DdakBin("gpu1", "gpu", 10, 1.0),
    ...         DdakBin("ssd0", "ssd", 100, 2.0)]
    >>> h = np.array([8, 8, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1], dtype=np.float32)
    >>> r = ddak(h, bins, pool=2)
    >>> r.bin_of.tolist()
    [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
    >>> r.traffic_per_bin.tolist(), r.target_per_bin.tolist()
    ([16.0, 12.0, 12.0], [10.0, 10.0, 20.0])
    """
    h = _check(hotness, bins)
    if pool < 1:
        raise PlannerError(f"pool: {pool} items; must be ≥ 1")
    n = h.shape[0]
    m = len(bins)
    report(progress, "ddak", 0, 3)
    if order is not None and order.shape != (n,):
        raise PlannerError(f"order: expected shape ({n},), got {order.shape}")
    order, pool_sum = _hot_ids(h, pool, order)
    h_total = float(sum(pool_sum))
    report(progress, "ddak", 1, 3)
    target = _targets(h_total, bins)
    inv_t = [1.0 / t if t > 0 else 0.0 for t in target.tolist()]
    tgt = target.tolist()
    cap = [int(b.capacity_items) for b in bins]
    inv_c = [1.0 / c if c > 0 else 0.0 for c in cap]
    rank = [TIERS.index(b.kind) for b in bins]
    acc = [0.0] * m
    used = [0] * m
    # one entry per segment (a run of sorted positions given to one bin): its bin
    # and, only where it is not a whole pool, (segment number, length)
    seg_bin: list[int] = []
    odd: list[tuple[int, int]] = []

    def heap_for(phase: int) -> list[tuple[float, int, int]]:
        if phase < len(TIERS):
            js = [j for j in range(m) if rank[j] == phase and used[j] < cap[j] and acc[j] < tgt[j]]
        else:
            js = [j for j in range(m) if used[j] < cap[j]]
        hp = [(acc[j] * inv_t[j] + used[j] * inv_c[j], rank[j], j) for j in js]
        heapq.heapify(hp)
        return hp

    n_tiers = len(TIERS)
    phase = 0
    heap = heap_for(phase)
    heappop, heapreplace = heapq.heappop, heapq.heapreplace
    append = seg_bin.append
    p = 0  # next sorted position
    k = 0  # next pool
    n_full = n // pool  # pools of exactly `pool` items
    while p < n:
        while not heap:
            phase += 1
            heap = heap_for(phase)
        gated = phase < n_tiers
        if p == k * pool:
            # the common case, kept tight (10⁶ pools at 10⁸ items): whole pools
            # to bins with room for a whole pool
            while k < n_full:
                _, r, j = heap[0]
                u = used[j] + pool
                if u > cap[j]:
                    break
                a_j = acc[j] + pool_sum[k]
                acc[j] = a_j
                used[j] = u
                append(j)
                k += 1
                if u < cap[j] and (a_j < tgt[j] or not gated):
                    heapreplace(heap, (a_j * inv_t[j] + u * inv_c[j], r, j))
                else:
                    heappop(heap)
                    if not heap:
                        break
            p = k * pool
            if p >= n or not heap:
                continue
        # a bin with less room than a pool, or the short last pool: split
        _, r, j = heap[0]
        u = used[j]
        pool_end = min((k + 1) * pool, n)
        take = min(pool_end - p, cap[j] - u)
        got = float(h[order[p : p + take]].sum(dtype=np.float64))
        odd.append((len(seg_bin), take))
        append(j)
        p += take
        if p == pool_end:
            k += 1
        a_j = acc[j] + got
        acc[j] = a_j
        u += take
        used[j] = u
        if u < cap[j] and (phase >= n_tiers or a_j < tgt[j]):
            heapreplace(heap, (a_j * inv_t[j] + u * inv_c[j], r, j))
        else:
            heappop(heap)

    del pool_sum  # 32 bytes a pool (Python floats), not needed for the outputs
    report(progress, "ddak", 2, 3)
    sb = np.array(seg_bin, dtype=np.int32)
    del seg_bin
    seg_len = np.full(sb.shape[0], pool, dtype=np.int64)
    for i, take in odd:
        seg_len[i] = take
    seg_start = np.cumsum(seg_len) - seg_len
    seg_row = np.empty_like(seg_len)
    for j in range(m):  # rows of a bin: its segments' lengths, accumulated
        mine = sb == j
        ln = seg_len[mine]
        seg_row[mine] = np.cumsum(ln) - ln
    traffic = np.array(acc, dtype=np.float64)
    packed, bits, items = _codes(n, order, seg_start, seg_len, sb, seg_row, m)
    del order  # before bin_of is allocated: the peak stays at 12n bytes
    bin_of = _split_codes(packed, bits)
    report(progress, "ddak", 3, 3)
    return DdakResult(bin_of, packed, traffic, target, items, _deviation(traffic, target))


def _traffic(h: np.ndarray, bin_of: np.ndarray, m: int) -> np.ndarray:
    out = np.zeros(m, dtype=np.float64)
    for a in range(0, h.shape[0], _CHUNK_ITEMS):
        out += np.bincount(
            bin_of[a : a + _CHUNK_ITEMS], weights=h[a : a + _CHUNK_ITEMS], minlength=m
        )
    return out


def _from_bins(h: np.ndarray, bins: Sequence[DdakBin], bin_of: np.ndarray) -> DdakResult:
    """Rows in id order within each bin, traffic and deviation, for a given ``bin_of``."""
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


def hash_placement(hotness: np.ndarray, bins: Sequence[DdakBin]) -> DdakResult:
    """Baseline: item ``i`` in bin ``i mod m``; what overflows a full bin fills the others.

    Items whose bin is full (the highest ids of that residue) go, in id
    order, to the bins with room left, listed order. Rows are in id order.

    >>> import numpy as np
    >>> bins = [DdakBin("a", "cpu", 2, 1.0), DdakBin("b", "ssd", 5, 1.0)]
    >>> hash_placement(np.ones(6), bins).bin_of.tolist()
    [0, 1, 0, 1, 1, 1]
    """
    h = _check(hotness, bins)
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
    return _from_bins(h, bins, bin_of)


def hot_first_placement(hotness: np.ndarray, bins: Sequence[DdakBin]) -> DdakResult:
    """Baseline: fill bins hottest items first, fastest tier first, bins of a tier in listed order.

    With in-degree as hotness this is "degree-hot-first". Targets are ignored.

    >>> import numpy as np
    >>> bins = [DdakBin("s", "ssd", 9, 1.0), DdakBin("g", "gpu", 1, 1.0)]
    >>> hot_first_placement(np.array([1.0, 3.0, 2.0]), bins).bin_of.tolist()
    [0, 1, 0]
    """
    h = _check(hotness, bins)
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
    del order
    bin_of = _split_codes(packed, bits)
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
    h = _check(hotness, bins)
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
    return _from_bins(h, bins, bin_of)
