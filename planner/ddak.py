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

A second departure, for cache tiers: when the cache bin with the most target
left needs (almost) all the hotness of the hottest items it has room for to
reach it (a *tight* bin: 95 %), it fills alone, pools split so that it lands
nearest its target, before the score shares the tier again. The score would
interleave the hottest pools between the tier's bins and leave a tight bin
short (measured: a host memory at 86 % of its target, 3 % more reads from the
SSDs). Tight targets are what a caller gets from capping each cache bin at
the hottest rows it can hold, in order of falling target
(:func:`training.place.bins.feasible_targets`); on a two-socket machine the
largest host-memory target is the memory local to the GPUs, so the hottest
rows are read without crossing sockets.

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

Items of several sizes (``item_size``)
-------------------------------------
Feature rows of a heterogeneous graph differ in width and type (a paper's
row of 128 float32, an institution's of 4 uint8), yet share one hotness and
one set of bins. With ``item_size`` (a row's bytes) the capacities count
bytes, a pool costs the sizes of its items, and a bin's traffic is the
bytes it serves (hotness × size, the unit of the flow model's
``store_bytes``). Items are still handed out by hotness, accesses per item:
that is the bytes read per byte held, the order a fractional knapsack of
read bytes under a byte budget takes. A pool split at a bin's edge gives it
the items whose sizes fit; when the next item does not fit at all the bin
counts as full (it loses less than one item's size). This path runs the
Python greedy whatever ``n`` (the compiled loop counts items).

Accuracy: when no bin fills up before its target is reached (capacities
with slack), every bin ends within one pool of its target: a bin that
reaches its target overshoots by less than the hottest pool ``P``, and the
bins short of target at the end are short by at most the sum of the others'
overshoots, so the max relative deviation is below ``(m - 1) · P / min_j T_j``
for ``m`` bins. With binding capacities no such bound holds for any
hot-first greedy (a target that wants the second-hottest item but not the
hottest cannot be met by handing out the hottest first).

Speed and memory: the work is a sort, a loop over pools and a scatter.
From 4M items on, with numba importable, all three run compiled
(:mod:`planner.compiled`): an MSD radix sort of the float32 keys over every
core (the ids as uint32, the sorted keys as bucket starts and uint16 low
digits, so the sorted hotness is never held), the pool sums from those in
parallel, the whole-pool loop below without a Python step per pool, and the
scatter of ``row << bits | bin`` codes from sorted order to id order
(:func:`planner.placement._codes`), again over every core; ``bin_of`` takes
over the spent order's memory. Below 4M items, or without numba, numpy
does the same work (a ``np.sort`` of packed 64-bit keys split over the
cores by hotness ranges, :func:`planner.placement._hot_keys`; the pool
loop in Python over a heap of at most ``m`` bins; a blocked scatter) with
the same results to the last bit (``tests/test_compiled.py``). Peak
memory beyond the input is about 12.7 bytes an item: the outputs
themselves are 12 (``row_of`` int64, ``bin_of`` int32).

Measured (``tools/bench_ddak.py``, 10 bins, Zipf 0.9; figures in
docs/benchmarks.md with their load): 10⁹ items took 401 s (174 s of CPU)
with numpy's sort, which is a single-threaded comparison sort here (75-100
ns an item, three quarters of the time); compiled, 29.6 s
(55.9 s of CPU) at load 0.8 and 12.9 GB beyond the input, max deviation
4.5e-5 (hash placement in the same run: 64.9 s); 10⁸ items 3.75 s (4.6 s of
CPU, load 2.4; 12.9 s of CPU before). Fresh
memory is a large part of what remains: the first touch of a page costs
about 1 s of CPU a GB on these VMs, and the outputs alone are 12 GB.
Everything but the pool loop and its segment bookkeeping splits over the
threads; those two are O(n / pool), about 3 % of the CPU time, and serial
because each pool's bin depends on where the pools before it went. At 10⁸
items the CPU time is spread 1.85 threads' worth (CPU over the busiest
thread's; hash placement 1.00), so a run whose wall time equals its CPU
time on a busy machine had its cores taken by others: the benchmark prints
the spread and the time the threads waited for a core (at load 14: 0.31
of 2 cores busy, 21 s of waiting in a 14 s run). 10⁹ items at load 15
(2026-11-29): 267 s, 68.8 s of CPU spread 1.95 threads' worth, 453 s of
waiting for a core; 12.88 GB, max deviation 4.5e-5 (hash: 285 s, 74.8 s of
CPU, spread 1.00).

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
from collections.abc import Callable, Sequence

import numpy as np

from planner import compiled
from planner.errors import PlannerError
from planner.placement import (
    _CHUNK_ITEMS,
    TIERS,
    DdakBin,
    DdakResult,
    _codes,
    _deviation,
    _hot_keys,
    _key_hotness,
    _split_codes,
    _targets,
    _use_compiled,
    check_inputs,
)
from planner.progress import Progress, report

#: a cache bin whose remaining target is at least this share of the hotness of
#: the hottest items it has room for fills alone (:func:`_tight_bin`)
_TIGHT = 0.95

def ddak(
    hotness: np.ndarray,
    bins: Sequence[DdakBin],
    pool: int = 100,
    order: np.ndarray | None = None,
    progress: Progress | None = None,
    *,
    item_size: np.ndarray | None = None,
) -> DdakResult:
    """Place items so each bin's traffic matches its target (see the module docstring).

    ``hotness`` (shape ``(n,)``, non-negative; float32 is fastest) is each
    item's expected accesses; ``bins`` the bins, any order (their index is the
    value of ``bin_of``); ``pool`` how many consecutive items (in hotness order)
    move together; ``order`` an optional precomputed hot-first order of the
    item ids (a permutation of ``0..n-1``), e.g. reused across calls.
    ``progress`` hears ``("ddak", done, 3)`` after the sort, the pool loop
    and the outputs (a call per pool would slow the loop), and before that,
    on a machine's first large placement, the kernels' compilation
    (:func:`planner.compiled.prepare`). Reads per
    consumer group: :func:`planner.affinity.ddak_affinity` (see "Consumer
    groups" in the module docstring). ``item_size`` (shape ``(n,)``, integers
    ≥ 1, optional): each item's size in the unit of the bins'
    ``capacity_items``, e.g. a feature row's bytes with capacities in bytes,
    so that rows of several widths share the bins (see "Items of several
    sizes" in the module docstring).

    Raises :class:`PlannerError` for an empty bin list, total capacity below
    ``n`` (below ``item_size.sum()``), negative or non-finite hotness, a
    target that is not positive, sizes that are not integers ≥ 1.

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
    h = check_inputs(hotness, bins, item_size)
    if pool < 1:
        raise PlannerError(f"pool: {pool} items; must be ≥ 1")
    n = h.shape[0]
    if order is not None and order.shape != (n,):
        raise PlannerError(f"order: expected shape ({n},), got {order.shape}")
    if item_size is not None:
        return _ddak_sized(h, bins, pool, order, np.asarray(item_size, dtype=np.int64), progress)
    if _use_compiled(n):  # the first placement on a machine compiles the kernels: say so
        compiled.prepare(progress)
    report(progress, "ddak", 0, 3)
    own_order = order is None
    # the codes' array first: the compiled sort keeps its low digits in it (2n of its 8n bytes), so
    # the placement touches no more fresh memory than its outputs (12n), a page fault per page
    packed = np.empty(n, dtype=np.int64) if _sorts_compiled(h, order) else None
    order, pool_sum = _hot_ids(h, pool, order, None if packed is None else packed.view(np.uint16)[:n])
    report(progress, "ddak", 1, 3)
    # a sequential sum (cumsum, as Python's sum of a list): the same total for a list or an array
    target = _targets(float(np.cumsum(pool_sum)[-1]) if len(pool_sum) else 0.0, bins)
    seg_bin, odd, acc = _fill_bins(h, order, pool_sum, pool, _Bins(bins, target, pool_sum, pool))
    del pool_sum  # 32 bytes a pool as Python floats (8 as an array), not needed for the outputs
    report(progress, "ddak", 2, 3)
    return _result(n, order, own_order, seg_bin, odd, acc, target, pool, packed, progress)


def _result(n: int, order: np.ndarray, own_order: bool, seg_bin: _Segs, odd: list[tuple[int, int]],
            acc: list[float], target: np.ndarray, pool: int, packed: np.ndarray | None,
            progress: Progress | None) -> DdakResult:
    """The greedy's segments as each item's bin and row (:func:`_codes`), with the bins' traffic."""
    sb, seg_start, seg_len, seg_row = _segments(seg_bin, odd, pool, len(acc))
    del seg_bin
    traffic = np.array(acc, dtype=np.float64)
    packed, bits, items = _codes(n, order, seg_start, seg_len, sb, seg_row, len(acc), packed)
    # bin_of takes over the order's memory (ours, not a caller's): the peak stays at 12n bytes
    bin_of = _split_codes(packed, bits, order if own_order else None)
    del order
    report(progress, "ddak", 3, 3)
    return DdakResult(bin_of, packed, traffic, target, items, _deviation(traffic, target))


def _ddak_sized(h: np.ndarray, bins: Sequence[DdakBin], pool: int, order: np.ndarray | None,
                size: np.ndarray, progress: Progress | None) -> DdakResult:
    """:func:`ddak` with items of several sizes: capacities in size units, traffic as hotness × size.

    The same sort, score, tier gate and pools, in the Python greedy (the
    compiled whole-pool loop counts items): a pool costs its items' sizes, and
    a pool split at a bin's edge gives it the items whose sizes fit.
    """
    n = h.shape[0]
    report(progress, "ddak", 0, 3)
    own_order = order is None
    order, _ = _hot_ids(h, pool, order)  # hottest first by accesses per item: bytes read per byte held
    hs = h.astype(np.float64) * size  # what a bin serves: the bytes its items are read for
    pool_sum = _pool_sums(hs[order], pool).tolist()
    state = _Bins(bins, _targets(float(np.cumsum(pool_sum)[-1]) if pool_sum else 0.0, bins), pool_sum, pool,
                  size[order])
    report(progress, "ddak", 1, 3)
    seg_bin, odd, acc = _fill_bins(hs, order, pool_sum, pool, state)
    report(progress, "ddak", 2, 3)
    return _result(n, order, own_order, seg_bin, odd, acc, np.array(state.tgt), pool, None, progress)


def _pool_sums(hs: np.ndarray, pool: int) -> np.ndarray:
    """Sums (float64) of consecutive pools of ``pool`` items of ``hs`` (the last may be short).

    Each summed left to right (``cumsum`` along a pool is sequential; ``add.reduceat`` is not),
    so the compiled path (:meth:`planner.compiled.HotSort.pool_sums`) gets the same numbers.
    """
    full = hs.shape[0] // pool * pool
    parts = []
    if full:
        parts.append(np.cumsum(hs[:full].astype(np.float64).reshape(-1, pool), axis=1)[:, -1])
    if full < hs.shape[0]:
        parts.append(np.cumsum(hs[full:].astype(np.float64))[-1:])
    return np.concatenate(parts) if parts else np.zeros(0)


def _sorts_compiled(h: np.ndarray, order: np.ndarray | None) -> bool:
    """Whether :func:`_hot_ids` sorts with :func:`planner.compiled.hot_sort` (no order given, float32)."""
    n = h.shape[0]
    return order is None and h.dtype == np.float32 and n < (1 << 32) and _use_compiled(n)


def _hot_ids(h: np.ndarray, pool: int, order: np.ndarray | None,
             scratch: np.ndarray | None = None) -> tuple[np.ndarray, list[float] | np.ndarray]:
    """The hot-first order of the ids (``order`` if given; uint32 on the fast path) and its pool sums.

    The pool sums are a list for the Python greedy and an array (8 bytes a
    pool, not 32) where the greedy runs compiled (:func:`_use_compiled`).
    The sorted hotness is held whole only by the compiled sort (4n bytes,
    freed here); otherwise the pool sums come out of the sorted keys, or out
    of ``h[order]``, a block of whole pools at a time, and the keys' ids go
    to a uint32 array (the keys' 8n bytes are freed after). ``scratch``: a
    uint16 ``(n,)`` array the compiled sort may keep its low digits in.
    """
    n = h.shape[0]
    step = max(1, _CHUNK_ITEMS // pool) * pool
    sums: list[np.ndarray] = []
    if _sorts_compiled(h, order):
        srt = compiled.hot_sort(h, scratch)
        order, sums = srt.order, [srt.pool_sums(pool)]
        del srt
    elif order is None and h.dtype == np.float32 and n < (1 << 32):
        key = _hot_keys(h)
        order = np.empty(n, dtype=np.uint32)
        for a in range(0, n, step):
            kc = key[a : a + step]
            sums.append(_pool_sums(_key_hotness(kc), pool))
            np.bitwise_and(kc, np.uint64(0xFFFFFFFF), out=order[a : a + step], casting="unsafe")
    else:
        if order is None:
            order = np.argsort(-h.astype(np.float64), kind="stable")
        sums = [_pool_sums(h[order[a : a + step]], pool) for a in range(0, n, step)]
    pool_sum = np.concatenate(sums) if sums else np.zeros(0)
    return order, pool_sum if _use_compiled(n) else pool_sum.tolist()


class _Bins:
    """The greedy's running state per bin: traffic so far (``acc``), items so far (``used``)."""

    def __init__(self, bins: Sequence[DdakBin], target: np.ndarray,
                 pool_sum: list[float] | np.ndarray, pool: int, size: np.ndarray | None = None) -> None:
        self.m = len(bins)
        self.tgt = target.tolist()
        self.inv_t = [1.0 / t if t > 0 else 0.0 for t in self.tgt]
        self.cap = [int(b.capacity_items) for b in bins]
        self.inv_c = [1.0 / c if c > 0 else 0.0 for c in self.cap]
        self.rank = [TIERS.index(b.kind) for b in bins]
        self.acc = [0.0] * self.m
        self.used = [0] * self.m
        self.pool = pool
        self.pool_sum = pool_sum
        self._pool_pref: np.ndarray | None = None
        #: items of several sizes (:func:`_ddak_sized`): each sorted item's size, each pool's, their prefix sums
        self.size = size
        self.cost: list[int] | None = None
        if size is not None:
            full = size.shape[0] // pool * pool
            cost = np.concatenate([size[:full].reshape(-1, pool).sum(axis=1), size[full:].sum(keepdims=True)
                                   if full < size.shape[0] else np.zeros(0, np.int64)])
            self.cost = cost.tolist()
            self.cost_pref = np.concatenate([[0], np.cumsum(cost)])

    def pools_in(self, k: int, room: int) -> int:
        """How many pools from pool ``k`` on take up ``room`` (the last one perhaps in part)."""
        if self.size is None:
            return -(-room // self.pool)
        return int(np.searchsorted(self.cost_pref, self.cost_pref[k] + room, side="left")) - k

    @property
    def pool_pref(self) -> np.ndarray:
        """Hotness before each pool; made the first time a cache tier has two bins to choose from."""
        if self._pool_pref is None:
            self._pool_pref = np.concatenate([[0.0], np.cumsum(self.pool_sum)])
        return self._pool_pref

    def heap_for(self, phase: int, at: int) -> tuple[list[tuple[float, int, int]], int]:
        """The eligible bins as a heap, and the one cache bin that must fill alone (or -1)."""
        acc, used, cap, tgt, rank = self.acc, self.used, self.cap, self.tgt, self.rank
        if phase < len(TIERS):
            js = [j for j in range(self.m)
                  if rank[j] == phase and used[j] < cap[j] and acc[j] < tgt[j]]
            lead = _tight_bin(js, tgt, acc, cap, used, self.pool_pref, at, self.pool, self.pools_in) \
                if TIERS[phase] != "ssd" and len(js) > 1 else -1
            if lead >= 0:
                js = [lead]
        else:
            js, lead = [j for j in range(self.m) if used[j] < cap[j]], -1
        return self.heap_of(js), lead

    def heap_of(self, js: list[int]) -> list[tuple[float, int, int]]:
        """Bins ``js`` as a heap of ``(score, tier rank, index)``."""
        hp = [(self.acc[j] * self.inv_t[j] + self.used[j] * self.inv_c[j], self.rank[j], j)
              for j in js]
        heapq.heapify(hp)
        return hp


class _Segs:
    """Each segment's bin, in order: a list the Python loop appends to, numpy chunks from the compiled one."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.done = 0
        self.tail: list[int] = []
        self.append = self.tail.append

    def __len__(self) -> int:
        return self.done + len(self.tail)

    def extend(self, bins: np.ndarray) -> None:
        if self.tail:
            self.parts.append(np.array(self.tail, dtype=np.int32))
            self.done += len(self.tail)
            self.tail.clear()
        self.parts.append(bins)
        self.done += bins.shape[0]

    def array(self) -> np.ndarray:
        return np.concatenate([*self.parts, np.array(self.tail, dtype=np.int32)])


def _fill_bins(h: np.ndarray, order: np.ndarray, pool_sum: list[float] | np.ndarray, pool: int,
               state: _Bins) -> tuple[_Segs, list[tuple[int, int]], list[float]]:
    """The pools, hottest first, each to the least-filled open bin: the greedy itself.

    Returns one entry per segment (a run of sorted positions given to one
    bin): its bin; only where it is not a whole pool, (segment number,
    length); and each bin's traffic. ``h[order]`` is the hotness in hot-first
    order. With ``pool_sum`` a numpy array (large placements) the run of
    whole pools goes through :func:`planner.compiled.whole_pools`, the same
    choices without a Python step per pool.
    """
    n = h.shape[0]
    acc, used, cap, tgt, inv_t, inv_c = (state.acc, state.used, state.cap, state.tgt,
                                         state.inv_t, state.inv_c)
    seg_bin = _Segs()
    odd: list[tuple[int, int]] = []
    n_tiers = len(TIERS)
    phase = 0
    heap, solo = state.heap_for(phase, 0)
    heappop, heapreplace = heapq.heappop, heapq.heapreplace
    append = seg_bin.append
    fast = isinstance(pool_sum, np.ndarray)
    p = 0  # next sorted position
    k = 0  # next pool
    n_full = n // pool  # pools of exactly `pool` items
    cost = state.cost  # a pool's size in capacity units: `pool`, or its items' sizes (_ddak_sized)
    while p < n:
        while not heap:
            heap, solo = state.heap_for(phase, p)  # the next bin of a cache tier filled one at a time
            if not heap:
                if phase > n_tiers:
                    raise PlannerError(f"bins: no bin has room for item {int(order[p])} (size "
                                       f"{int(state.size[p]) if state.size is not None else 1}): the sizes "
                                       "left gaps too small for it; raise the bins' capacity_items")
                phase += 1
                heap, solo = state.heap_for(phase, p)
        gated = phase < n_tiers
        if p == k * pool and fast:
            k, given, still = compiled.whole_pools(
                pool_sum, k, n_full, pool, acc, used, cap, tgt, inv_t, inv_c, state.rank,
                [j for _, _, j in heap], solo, gated)
            seg_bin.extend(given)
            heap = state.heap_of(still)
            p = k * pool
            if p >= n or not heap:
                continue
        elif p == k * pool:
            # the common case, kept tight (10⁶ pools at 10⁸ items): whole pools
            # to bins with room for a whole pool
            while k < n_full:
                _, r, j = heap[0]
                u = used[j] + (pool if cost is None else cost[k])
                if u > cap[j]:
                    break
                a_j = acc[j] + pool_sum[k]
                if j == solo and a_j > tgt[j]:
                    break  # the pool would overshoot the lone bin's target: split it below
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
        p, k = _split_pool(h, order, p, k, pool, heap, solo, gated, state, seg_bin, odd)
    return seg_bin, odd, acc


def _split_pool(h: np.ndarray, order: np.ndarray, p: int, k: int, pool: int, heap: list[tuple[float, int, int]],
                solo: int, gated: bool, state: _Bins, seg_bin: _Segs,
                odd: list[tuple[int, int]]) -> tuple[int, int]:
    """Part of pool ``k`` from position ``p`` to the heap's first bin: one with less room than a
    pool, the lone bin of a tier (the items nearest its target), or the short last pool."""
    acc, used, cap, tgt = state.acc, state.used, state.cap, state.tgt
    _, r, j = heap[0]
    u = used[j]
    pool_end = min((k + 1) * pool, h.shape[0])
    take = min(pool_end - p, cap[j] - u)
    sizes = None if state.size is None else np.cumsum(state.size[p:pool_end])
    if sizes is not None:  # items of several sizes: those that fit in the room left
        take = int(np.searchsorted(sizes, cap[j] - u, side="right"))
        if take == 0:  # the next item is larger than the room left: the bin is full
            cap[j] = u
            heapq.heappop(heap)
            return p, k
    if j == solo:  # the lone bin takes the items that bring it nearest its target
        take = _nearest_take(h[order[p : p + take]], tgt[j] - acc[j])
    got = float(h[order[p : p + take]].sum(dtype=np.float64))
    odd.append((len(seg_bin), take))
    seg_bin.append(j)
    p += take
    if p == pool_end:
        k += 1
    a_j = acc[j] + got
    acc[j] = a_j
    u += take if sizes is None else int(sizes[take - 1])
    used[j] = u
    if u < cap[j] and (not gated or a_j < tgt[j]):
        heapq.heapreplace(heap, (a_j * state.inv_t[j] + u * state.inv_c[j], r, j))
    else:
        heapq.heappop(heap)
    return p, k


def _segments(seg_bin: _Segs, odd: list[tuple[int, int]], pool: int,
              m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bin, first sorted position, length, first row in its bin) of every segment."""
    sb = seg_bin.array()
    seg_len = np.full(sb.shape[0], pool, dtype=np.int64)
    for i, take in odd:
        seg_len[i] = take
    seg_start = np.cumsum(seg_len) - seg_len
    seg_row = np.empty_like(seg_len)
    for j in range(m):  # rows of a bin: its segments' lengths, accumulated
        mine = sb == j
        ln = seg_len[mine]
        seg_row[mine] = np.cumsum(ln) - ln
    return sb, seg_start, seg_len, seg_row


def _tight_bin(js: list[int], tgt: list[float], acc: list[float], cap: list[int], used: list[int],
               pool_pref: np.ndarray, at: int, pool: int, pools_in: Callable[[int, int], int]) -> int:
    """The cache bin that must take the hottest items alone, or -1.

    Among the eligible bins of a cache tier, the one with the most target
    left is *tight* when that remainder is at least :data:`_TIGHT` of the
    hotness of the next items it has room for (from sorted position ``at``,
    at pool granularity): sharing those items with the tier's other bins, as
    the score would, leaves it short. This is how
    :func:`training.place.bins.feasible_targets` caps cache targets (bins in
    order of falling target, each capped at the hottest rows it can hold),
    and on a two-socket machine the flow model gives the largest host-memory
    target to the memory local to the GPUs, so its rows are the hottest.
    """
    if len(js) < 2:
        return -1
    lead = min(js, key=lambda j: (-(tgt[j] - acc[j]), j))
    k = at // pool
    k_end = min(len(pool_pref) - 1, k + pools_in(k, cap[lead] - used[lead]))
    room_hotness = float(pool_pref[k_end] - pool_pref[k])
    return lead if tgt[lead] - acc[lead] >= _TIGHT * room_hotness else -1


def _nearest_take(hs: np.ndarray, need: float) -> int:
    """How many of ``hs`` (≥ 1) to take so their sum comes nearest ``need``."""
    cum = np.cumsum(hs, dtype=np.float64)
    i = int(np.searchsorted(cum, need))
    if i < cum.shape[0] and (i == 0 or cum[i] - need < need - cum[i - 1]):
        i += 1
    return max(1, min(i, cum.shape[0]))

