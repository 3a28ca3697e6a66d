"""The numba loops behind :mod:`planner.compiled` (imported only through it: importing compiles).

Each kernel is plain loops over arrays; ``cache=True`` keeps the machine code
beside this file, so only the first large placement on a machine pays the
compilation (a few seconds).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_TOP = 1 << 16
_SMALL = 32  # buckets up to this many items are insertion-sorted
_0 = np.int64(0)
_8 = np.int64(8)


@njit(cache=True, inline="always")
def _key(b):  # pragma: no cover - compiled
    """The sort key of float32 bits ``b``: hotter is smaller; -0.0 (sign bit, nothing else) counts as 0."""
    if b == 0x80000000:
        b = 0
    return np.int64(0xFFFFFFFF) - np.int64(b)


@njit(parallel=True, cache=True)
def top_scatter(bits, threads, order, low):  # pragma: no cover - compiled
    """Stable counting sort of ids by the key's top 16 bits into ``order``, the key's low 16 bits
    (uint16) into ``low`` (both allocated by the caller: numpy asks for huge pages, which the
    scatter's 65,536 write streams need); returns the bucket starts."""
    n = bits.shape[0]
    chunk = (n + threads - 1) // threads
    hist = np.zeros((threads, _TOP), np.int64)
    for t in prange(threads):
        a = t * chunk
        b = min(n, a + chunk)
        for i in range(a, b):
            k = _key(bits[i])
            hist[t, k >> 16] += 1
    off = np.empty((threads, _TOP), np.int64)
    start = np.empty(_TOP + 1, np.int64)
    s = 0
    for d in range(_TOP):
        start[d] = s
        for t in range(threads):
            off[t, d] = s
            s += hist[t, d]
    start[_TOP] = s
    for t in prange(threads):
        a = t * chunk
        b = min(n, a + chunk)
        for i in range(a, b):
            k = _key(bits[i])
            d = k >> 16
            p = off[t, d]
            order[p] = i
            low[p] = k & 0xFFFF
            off[t, d] = p + 1
    return start


@njit(cache=True)
def _counting_pass(src_id, src_low, dst_id, dst_low, s, e, d, shift, base, count):  # pragma: no cover
    """One stable counting-sort pass of ``src[s:e]`` into ``dst[d:]`` by the byte of ``low - base``
    at ``shift``."""
    count[:] = 0
    for j in range(s, e):
        count[((np.int64(src_low[j]) - base) >> shift) & 0xFF] += 1
    acc = d
    for c in range(256):
        v = count[c]
        count[c] = acc
        acc += v
    for j in range(s, e):
        c = ((np.int64(src_low[j]) - base) >> shift) & 0xFF
        p = count[c]
        dst_id[p] = src_id[j]
        dst_low[p] = src_low[j]
        count[c] = p + 1


@njit(cache=True)
def _sort_bucket(order, low, s, e, tmp_id, tmp_low, count):  # pragma: no cover - compiled
    """Stable sort of ``order[s:e]`` by ``low[s:e]``, both in place: insertion sort for a few
    items, one counting pass when the low digits span less than 256, else two (into the scratch
    and back)."""
    lo = low[s]
    hi = low[s]
    for j in range(s + 1, e):
        v = low[j]
        if v < lo:
            lo = v
        elif v > hi:
            hi = v
    if lo == hi:
        return
    if e - s <= _SMALL:
        for j in range(s + 1, e):
            v = low[j]
            o = order[j]
            i = j - 1
            while i >= s and low[i] > v:
                low[i + 1] = low[i]
                order[i + 1] = order[i]
                i -= 1
            low[i + 1] = v
            order[i + 1] = o
    # every argument an int64 (not a literal 0 or 8): one compiled _counting_pass, not three
    elif np.int64(hi) - np.int64(lo) < 256:
        _counting_pass(order, low, tmp_id, tmp_low, s, e, _0, _0, np.int64(lo), count)
        order[s:e] = tmp_id[: e - s]
        low[s:e] = tmp_low[: e - s]
    else:
        _counting_pass(order, low, tmp_id, tmp_low, s, e, _0, _0, _0, count)
        _counting_pass(tmp_id, tmp_low, order, low, _0, e - s, s, _8, _0, count)


@njit(parallel=True, cache=True)
def sort_buckets(order, low, start, groups):  # pragma: no cover - compiled
    """Sort every bucket by its low 16 bits; groups of buckets in parallel."""
    for g in prange(groups.shape[0] - 1):
        b0 = groups[g]
        b1 = groups[g + 1]
        big = 0
        for d in range(b0, b1):
            big = max(big, start[d + 1] - start[d])
        tmp_id = np.empty(big, np.uint32)
        tmp_low = np.empty(big, np.uint16)
        count = np.empty(256, np.int64)
        for d in range(b0, b1):
            s = start[d]
            e = start[d + 1]
            if e - s > 1:
                _sort_bucket(order, low, s, e, tmp_id, tmp_low, count)


@njit(cache=True)
def _sorted_bits(start, low, a, b, out):  # pragma: no cover - compiled
    """The float32 bits of the sorted hotness at positions ``a .. b - 1`` into ``out[: b - a]``."""
    d = np.searchsorted(start, a, side="right") - 1
    for p in range(a, b):
        while start[d + 1] <= p:
            d += 1
        out[p - a] = np.uint32(0xFFFFFFFF) - ((np.uint32(d) << np.uint32(16)) | np.uint32(low[p]))


@njit(parallel=True, cache=True)
def pool_sums(start, low, pool, threads):  # pragma: no cover - compiled
    """Each pool's hotness, summed left to right in float64 (as ``cumsum`` does), pools in parallel."""
    n = low.shape[0]
    pools = (n + pool - 1) // pool
    out = np.empty(pools, np.float64)
    per = (pools + threads - 1) // threads
    for t in prange(threads):
        bits = np.empty(pool, np.uint32)
        f = bits.view(np.float32)
        for k in range(t * per, min(pools, (t + 1) * per)):
            a = k * pool
            b = min(n, a + pool)
            _sorted_bits(start, low, a, b, bits)
            acc = 0.0
            for i in range(b - a):
                acc += np.float64(f[i])
            out[k] = acc
    return out


@njit(parallel=True, cache=True)
def sorted_bits(start, low, out, threads):  # pragma: no cover - compiled
    """The float32 bits of the whole sorted hotness into ``out`` (uint32, ``n``), blocks in parallel."""
    n = low.shape[0]
    per = (n + threads - 1) // threads
    for t in prange(threads):
        a = t * per
        b = min(n, a + per)
        if a < b:
            _sorted_bits(start, low, a, b, out[a:b])


@njit(parallel=True, cache=True)
def scatter(order, seg_start, seg_len, code, bits, packed):  # pragma: no cover - compiled
    """``packed[order[p]] = code[k] + (p << bits)`` over the segments, blocks of positions in parallel."""
    n = order.shape[0]
    step = 1 << 16
    blocks = (n + step - 1) // step
    ends = seg_start + seg_len
    for blk in prange(blocks):
        a = blk * step
        b = min(n, a + step)
        k = np.searchsorted(ends, a, side="right")
        p = a
        while p < b:
            e = min(b, ends[k])
            c = code[k]
            for q in range(p, e):
                packed[order[q]] = c + (np.int64(q) << bits)
            p = e
            k += 1


@njit(parallel=True, cache=True)
def split(packed, bits, bin_of):  # pragma: no cover - compiled
    """``bin_of = packed & mask`` and ``packed >>= bits`` in place."""
    mask = (np.int64(1) << bits) - 1
    for i in prange(packed.shape[0]):
        v = packed[i]
        bin_of[i] = v & mask
        packed[i] = v >> bits


@njit(cache=True)
def whole_pools(pool_sum, k, n_full, pool, acc, used, cap, tgt, inv_t, inv_c, rank, is_open, solo,
                gated, seg_out):  # pragma: no cover - compiled
    """DDAK's common case (:func:`planner.ddak._fill_bins`): whole pools to the open bin of least
    ``(score, tier rank, index)`` while it has room for a whole pool; returns (next pool, segments)."""
    m = acc.shape[0]
    nseg = 0
    while k < n_full:
        j = -1
        best = 0.0
        best_rank = 0
        for i in range(m):
            if is_open[i]:
                s = acc[i] * inv_t[i] + used[i] * inv_c[i]
                if j < 0 or s < best or (s == best and rank[i] < best_rank):
                    j = i
                    best = s
                    best_rank = rank[i]
        if j < 0:
            break
        u = used[j] + pool
        if u > cap[j]:
            break
        a_j = acc[j] + pool_sum[k]
        if j == solo and a_j > tgt[j]:
            break
        acc[j] = a_j
        used[j] = u
        seg_out[nseg] = j
        nseg += 1
        k += 1
        if not (u < cap[j] and (a_j < tgt[j] or not gated)):
            is_open[j] = 0
    return k, nseg
