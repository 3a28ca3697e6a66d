"""Compiled kernels for placements at 10⁸-10⁹ items: the hot-first sort, DDAK's loop, the output scatter.

A placement needs every item's rank in hotness order (hottest first, ties by
id) and then each item's ``row << bits | bin`` code written back in id
order. numpy has no fast way to do either at this scale: its uint64 sort is
a single-threaded comparison sort (75-100 ns an item at 10⁹ items here,
three quarters of the whole placement), the radix sort behind
``argsort(kind="stable")`` on 16-bit keys returns int64 positions (8 bytes an
item, twice the uint32 order) and runs on one core, and a fancy-index
scatter runs on one core too. So these few loops are compiled with numba
(the field's JIT compiler for numpy code; imported only when a placement is
large enough to use it, see :func:`available`) and run over all cores.

The sort (:func:`hot_sort`) is a most-significant-digit radix sort on the
32-bit key ``0xFFFFFFFF - bits(h)`` (non-negative float32 bits order like
the values, so a smaller key is a hotter item; -0.0 counts as 0.0):

1. the ids are counted and scattered by the key's top 16 bits, each thread
   its own contiguous range of ids (per-thread histograms, so equal digits
   keep id order), together with the key's low 16 bits;
2. each of the 65,536 buckets is then sorted by the low 16 bits with a
   stable counting sort (two byte passes, one when the bucket's digits span
   under 256, insertion sort below 32 items, nothing when the bucket holds
   one key), the buckets split over the threads in groups of about equal size.

Both passes are stable, so ties keep id order: the order is exactly
``np.argsort(-h, kind="stable")``. The sorted keys stay as the bucket starts
and the low digits (:class:`HotSort`): with the uint32 order, 6 bytes an
item, from which the pool sums and, when wanted, the sorted hotness are
made in parallel. Arrays the kernels fill are allocated by numpy, which
asks the kernel for huge pages (the scatters' random writes need them).

Every kernel splits its work over the threads (the sort: per-thread id
ranges, then groups of buckets; the pool sums, the sorted hotness, the
scatter and the split: ranges of positions). What stays serial is DDAK's
whole-pool loop (:func:`whole_pools`: each pool's bin depends on where the
pools before it went) and the segment bookkeeping around it in
:mod:`planner.ddak`, both O(n / pool): about 3 % of a placement's CPU time.

Compiling the kernels takes 10-15 s of CPU. numba caches the machine code
on disk (``cache=True``): in ``__pycache__`` beside ``_kernels.py`` where that
is writable, else in the user's cache directory (``~/.cache/numba``), or in
``NUMBA_CACHE_DIR`` when set. So only the first placement on a machine (or
after an upgrade) compiles, and :func:`prepare` says so through the progress
callback before it does; later ones load the code in well under a second.
To compile ahead, e.g. while building a container image:
``python -c "from planner.compiled import prepare; prepare()"``.

Measured (``tools/bench_ddak.py``, 10⁸ items, load 14 on 2 cores): the
placement's CPU time spread over the threads 1.85 (CPU time over the
busiest thread's; 2.0 is an even split), hash placement's 1.00; a first
run on an empty cache 16.5 s of CPU against 4.5 s cached. On a busy
machine the threads wait for the cores (there 21 s over a 14 s run), so
CPU/wall falls to what the machine lends, whatever the split.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass

import numpy as np

from planner.progress import Progress, report

log = logging.getLogger(__name__)

__all__ = ["KERNELS", "HotSort", "available", "cache_state", "hot_sort", "prepare", "scatter_codes",
           "split_codes", "whole_pools"]

#: the kernels a placement calls (the helpers they call are compiled and cached with them)
KERNELS = ("top_scatter", "sort_buckets", "pool_sums", "scatter", "split", "whole_pools")

# numba's pip wheels run parallel loops on its "workqueue" layer, which aborts the process when two
# threads launch parallel kernels at once: callers on several threads take turns instead
_LOCK = threading.Lock()


@functools.cache
def _kernels():
    """The compiled kernels, or None when numba cannot be imported (the numpy path runs then)."""
    try:
        from planner import _kernels
    except ImportError as e:  # a platform without numba wheels: slower, same results
        log.info("numba is not importable (%s); large placements use numpy's sort", e)
        return None
    except RuntimeError as e:  # numba found no writable directory for its cache
        log.warning("numba cannot cache its kernels (%s); set NUMBA_CACHE_DIR to a writable directory. "
                    "Large placements use numpy's sort meanwhile (about 10x slower)", e)
        return None
    return _kernels


_prepared = False


def cache_state() -> str:
    """``"warm"`` when numba's disk cache holds every kernel of :data:`KERNELS` for this machine,
    ``"cold"`` when some must be compiled first, ``"unknown"`` when numba's cache could not be
    read, ``"unavailable"`` without numba."""
    k = _kernels()
    if k is None:
        return "unavailable"
    try:
        for name in KERNELS:
            d = getattr(k, name)
            # numba has no public way to ask whether a call will compile: its cache's index (the
            # overloads saved for the source as it is now, keyed by signature and this CPU's target)
            magic = d.targetctx.codegen().magic_tuple()
            if not any(key[1] == magic for key in d._cache._cache_file._load_index()):
                return "cold"
    except (AttributeError, OSError, TypeError, IndexError) as e:  # another numba version's internals
        log.debug("numba's cache index not readable: %s", e)
        return "unknown"
    return "warm"


def prepare(progress: Progress | None = None) -> None:
    """Compile the kernels a placement uses, or load them from numba's disk cache.

    When they are not cached (:func:`cache_state`), ``progress`` hears
    ``("compiling kernels (first run; cached on disk after)", done, 5)`` as
    each step compiles on a few items (10-15 s of CPU in all). Needs
    :func:`available`.
    """
    global _prepared
    if _prepared or cache_state() == "warm":
        _prepared = True  # compiled or cached: no need to read numba's index again in this process
        return
    stage = "compiling kernels (first run; cached on disk after)"
    h = np.arange(64, dtype=np.float32)
    srt: list[HotSort] = []
    codes = np.empty(64, dtype=np.int64)
    # each step calls a kernel with the argument types of a placement's call, so the code it
    # compiles is the code the placement runs
    steps = [lambda: srt.append(hot_sort(h, codes.view(np.uint16)[:64])),
             lambda: srt[0].pool_sums(10),
             lambda: whole_pools(np.ones(6), 0, 6, 10, [0.0], [0], [100], [1.0], [1.0], [0.01], [0], [0], -1,
                                 True),
             lambda: scatter_codes(srt[0].order, np.array([0]), np.array([64]), np.array([0]), 1, codes),
             lambda: split_codes(codes, 1, srt[0].order.view(np.int32))]
    for i, step in enumerate(steps):
        report(progress, stage, i, len(steps))
        step()
    report(progress, stage, len(steps), len(steps))
    _prepared = True


def available() -> bool:
    """Whether the compiled kernels can run here (numba importable)."""
    return _kernels() is not None


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def _threads() -> int:
    return min(64, usable_cores())


@dataclass(frozen=True)
class HotSort:
    """Items sorted hottest first, ties by id: ``order`` (uint32, ``(n,)``) the ids; the sorted
    keys are held as the bucket starts ``start`` (int64, ``(65537,)``: positions where each value of
    the key's top 16 bits begins) and the low 16 bits ``low`` (uint16, ``(n,)``), 6 bytes an item
    where the float32 hotness would take 4 more."""

    order: np.ndarray
    start: np.ndarray
    low: np.ndarray

    def pool_sums(self, pool: int) -> np.ndarray:
        """Hotness of each run of ``pool`` sorted items (float64, the last may be short), summed
        left to right: the same numbers as :func:`planner.ddak._pool_sums` on the sorted hotness."""
        with _LOCK:
            return _kernels().pool_sums(self.start, self.low, pool, _threads())

    def hotness(self) -> np.ndarray:
        """The float32 hotness in sorted order (a new array, 4 bytes an item)."""
        out = np.empty(self.low.shape[0], dtype=np.uint32)
        with _LOCK:
            _kernels().sorted_bits(self.start, self.low, out, _threads())
        return out.view(np.float32)


def hot_sort(h: np.ndarray, low: np.ndarray | None = None) -> HotSort:
    """Sort float32 hotness ``h`` (non-negative, ``n < 2**32``) hottest first, ties by id.

    ``hot_sort(h).order`` equals ``np.argsort(-h, kind="stable")`` and
    ``.hotness()`` equals ``h[that]``. ``low``: a uint16 ``(n,)`` array to hold the low digits
    (e.g. a view of memory the caller fills later: fresh memory is dear, see
    :func:`planner.ddak.ddak`). Needs :func:`available`.

    >>> import numpy as np
    >>> if available():
    ...     s = hot_sort(np.array([1, 3, 3, 0, 2], dtype=np.float32))
    ...     print(s.order.tolist(), s.hotness().tolist(), s.pool_sums(2).tolist())
    ... else:
    ...     print([1, 2, 4, 0, 3], [3.0, 3.0, 2.0, 1.0, 0.0], [6.0, 3.0, 0.0])
    [1, 2, 4, 0, 3] [3.0, 3.0, 2.0, 1.0, 0.0] [6.0, 3.0, 0.0]
    """
    k = _kernels()
    bits = np.ascontiguousarray(h, dtype=np.float32).view(np.uint32)
    t = _threads()
    order = np.empty(bits.shape[0], dtype=np.uint32)
    if low is None:
        low = np.empty(bits.shape[0], dtype=np.uint16)
    with _LOCK:
        start = k.top_scatter(bits, t, order, low)
        k.sort_buckets(order, low, start, _groups(start, 4 * t))
    return HotSort(order, start, low)


def _groups(start: np.ndarray, parts: int) -> np.ndarray:
    """Bucket boundaries (int64) splitting the buckets into ``parts`` runs of about equal items."""
    n = int(start[-1])
    cuts = np.searchsorted(start, (np.arange(1, parts) * n) // parts)
    return np.unique(np.concatenate(([0], cuts, [start.shape[0] - 1]))).astype(np.int64)


def scatter_codes(order: np.ndarray, seg_start: np.ndarray, seg_len: np.ndarray,
                  code: np.ndarray, bits: int, out: np.ndarray | None = None) -> np.ndarray:
    """``packed[order[p]] = code[k] + (p << bits)`` for each position ``p`` of segment ``k`` (int64, ``(n,)``).

    Segments are consecutive runs of sorted positions (``seg_start`` ascending,
    ``seg_len`` ≥ 0, covering ``0 .. n - 1``); written into ``out`` (int64, ``(n,)``) if given.
    Needs :func:`available`.
    """
    n = order.shape[0]
    packed = np.empty(n, dtype=np.int64) if out is None else out
    with _LOCK:
        _kernels().scatter(order, seg_start.astype(np.int64), seg_len.astype(np.int64),
                           code.astype(np.int64), np.int64(bits), packed)
    return packed


def split_codes(packed: np.ndarray, bits: int, out: np.ndarray | None = None) -> np.ndarray:
    """``bin_of`` (int32, into ``out`` if given) out of ``packed`` codes; ``packed`` becomes ``row_of``
    in place."""
    bin_of = np.empty(packed.shape[0], dtype=np.int32) if out is None else out
    with _LOCK:
        _kernels().split(packed, np.int64(bits), bin_of)
    return bin_of


def whole_pools(pool_sum: np.ndarray, k: int, n_full: int, pool: int, acc: list[float], used: list[int],
                cap: list[int], tgt: list[float], inv_t: list[float], inv_c: list[float],
                rank: list[int], open_bins: list[int], solo: int,
                gated: bool) -> tuple[int, np.ndarray, list[int]]:
    """DDAK's whole-pool loop, compiled: pools ``k, k+1, ...`` (sums ``pool_sum``, float64) each to the
    open bin of least ``(acc/tgt + used/cap, rank, index)``, while that bin has room for a whole
    pool (and, for the ``solo`` bin, the pool does not overshoot its target).

    Pools ``k .. n_full - 1`` are whole (``pool`` items). ``acc`` and ``used`` are updated in
    place (Python lists of the caller's state); returns the next pool, the bins given (int32, one
    per pool) and the bins still open (ascending). Same choices as the Python loop in
    :func:`planner.ddak._fill_bins`: the heap there and the scan here pick the same least tuple.
    """
    acc_a = np.array(acc, dtype=np.float64)
    used_a = np.array(used, dtype=np.int64)
    is_open = np.zeros(len(acc), dtype=np.uint8)
    is_open[list(open_bins)] = 1
    out = np.empty(max(0, n_full - k), dtype=np.int32)
    k2, nseg = _kernels().whole_pools(
        pool_sum, k, n_full, pool, acc_a, used_a, np.array(cap, dtype=np.int64),
        np.array(tgt, dtype=np.float64), np.array(inv_t, dtype=np.float64),
        np.array(inv_c, dtype=np.float64), np.array(rank, dtype=np.int64), is_open, solo, gated, out)
    acc[:] = acc_a.tolist()
    used[:] = used_a.tolist()
    return int(k2), out[:nseg], np.flatnonzero(is_open).tolist()
