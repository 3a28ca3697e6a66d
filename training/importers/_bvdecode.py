"""Sequential decoding of a WebGraph BV (``BVGraph``) bit stream, compiled with numba.

The format is Boldi and Vigna's ("The WebGraph framework I", WWW 2004) as the
Java ``it.unimi.dsi.webgraph.BVGraph`` writes it and the Rust ``webgraph``
crate reads it (``graphs/bvgraph/sequential.rs``). For each node ``x``, in
order, a big-endian bit stream holds:

1. the outdegree ``d`` (outdegree code, gamma by default); nothing more when ``d = 0``;
2. when the window is not 0, the reference ``r`` (unary): ``r > 0`` copies
   part of the list of node ``x - r``: a block count ``b`` and ``b`` blocks
   (gamma) of alternate copy / skip runs over that list, the first as is,
   the later ones less one; the rest of the list is copied when ``b`` is even;
3. when successors are left and the minimum interval length ``L`` is not 0,
   an interval count, then intervals of consecutive ids: the first's start
   as ``int2nat(start - x)``, later ones as the gap after the previous one
   less one, each length less ``L`` (gamma);
4. the remaining successors ("residuals", zeta_k): the first as
   ``int2nat(y - x)``, later ones as the gap to the previous one less one.

The successors are the union of the three parts, sorted. Codes (dsiutils):
unary ``n`` is ``n`` zeros then a one; gamma ``n`` is unary of the bit length
of ``n + 1`` less one, then its low bits; delta the same with a gamma
length; zeta_k as ``InputBitStream.readZeta``.

``_decode_nodes`` decodes a run of nodes into flat buffers; the kernels
below are plain Python that numba compiles when it can be imported (the
project's JIT, as in :mod:`planner.compiled`); without it they run as Python,
correct and slow.
"""

from __future__ import annotations

import functools

UNARY, GAMMA, DELTA, ZETA = 0, 1, 2, 3

#: status codes the kernel returns besides ``>= 0`` (nodes decoded)
PAST_END, BAD_LIST, BAD_CODE, NEED_ROOM = -1, -2, -3, -4


def _read_bits(data, pos, n):
    v = 0
    while n > 0:
        i = pos >> 3
        if i >= data.size:
            return -1, pos
        off = pos & 7
        take = min(8 - off, n)
        v = (v << take) | ((int(data[i]) >> (8 - off - take)) & ((1 << take) - 1))
        pos += take
        n -= take
    return v, pos


def _read_unary(data, pos):
    n = 0
    while True:
        i = pos >> 3
        if i >= data.size:
            return -1, pos
        off = pos & 7
        byte = (int(data[i]) << off) & 0xFF
        if byte == 0:  # the rest of this byte is zeros
            n += 8 - off
            pos += 8 - off
            continue
        lead = 0
        while not byte & 0x80:
            byte <<= 1
            lead += 1
        return n + lead, pos + lead + 1


def _gamma_tail(data, pos, n):
    """A gamma code's value once its unary length ``n`` is read."""
    if n > 62:
        return -1, pos
    low, pos = _read_bits(data, pos, n)
    return (-1 if low < 0 else (1 << n) + low - 1), pos


def _read_code(data, pos, code, k):
    """One value of ``code`` at bit ``pos``: ``(value, new pos)``; value -1 past the end."""
    n, pos = _read_unary(data, pos)
    if code == UNARY or n < 0:
        return n, pos
    if code == ZETA:  # n is h: the value lies in [2^hk - 1, 2^(h+1)k - 1), minimal binary code
        if (n + 1) * k > 62:
            return -1, pos
        left = 1 << (n * k)
        m, pos = _read_bits(data, pos, n * k + k - 1)
        if m < 0:
            return -1, pos
        if m < left:
            return m + left - 1, pos
        bit, pos = _read_bits(data, pos, 1)
        return (-1 if bit < 0 else (m << 1) + bit - 1), pos
    if code == DELTA:  # the length is itself gamma-coded
        n, pos = _gamma_tail(data, pos, n)
        if n < 0:
            return -1, pos
    return _gamma_tail(data, pos, n)


def _nat2int(v):
    return v >> 1 if v & 1 == 0 else -((v + 1) >> 1)


def _copy_blocks(data, pos, c_blk, k, out, a, b, at, d):
    """The copied part of a list: blocks alternately copy and skip ``out[a:b]`` (the reference's list)
    into ``out[at:]``; ``(new pos, successors copied)``, or a status < 0."""
    blocks, pos = _read_code(data, pos, c_blk, k)
    if blocks < 0:
        return pos, PAST_END
    idx, got, copy = 0, 0, True
    for i in range(blocks):
        length, pos = _read_code(data, pos, c_blk, k)
        if length < 0:
            return pos, PAST_END
        length += 0 if i == 0 else 1  # blocks after the first are never empty, so stored less one
        if idx + length > b - a or (copy and got + length > d):
            return pos, BAD_CODE
        if copy:
            out[at + got : at + got + length] = out[a + idx : a + idx + length]
            got += length
        idx += length
        copy = not copy
    if copy:  # an even number of blocks: the rest of the list is copied
        if got + (b - a - idx) > d:
            return pos, BAD_CODE
        out[at + got : at + got + (b - a - idx)] = out[a + idx : b]
        got += b - a - idx
    return pos, got


def _decode_list(data, pos, x, params, out, offs, first, at, need):
    """The successors of node ``x`` into ``out[at:]``: ``(new pos, count)``; a count < 0 is a status.

    ``params`` = (window, min interval, k, outdegree, reference, block, interval, residual codes, n);
    ``out[offs[j]:offs[j + 1]]`` is the list of node ``first + j`` (the nodes before ``x``).
    A list that does not fit in ``out`` returns NEED_ROOM with its length in ``need[0]``.
    """
    window, min_int, k, c_deg, c_ref, c_blk, c_int, c_res, n = params
    d, pos = _read_code(data, pos, c_deg, k)
    if d < 0:
        return pos, PAST_END
    if at + d > out.size:
        need[0] = d
        return pos, NEED_ROOM
    got = 0
    if window > 0 and d > 0:
        r, pos = _read_code(data, pos, c_ref, k)
        if r < 0:
            return pos, PAST_END
        if r > window or x - r < first:
            return pos, BAD_CODE
        if r > 0:
            pos, got = _copy_blocks(data, pos, c_blk, k, out, offs[x - r - first], offs[x - r - first + 1], at, d)
            if got < 0:
                return pos, got
    if got < d and min_int > 0:
        count, pos = _read_code(data, pos, c_int, k)
        if count < 0:
            return pos, PAST_END
        prev = x
        for i in range(count):
            start, pos = _read_code(data, pos, c_int, k)
            length, pos = _read_code(data, pos, c_int, k)
            if start < 0 or length < 0:
                return pos, PAST_END
            prev = x + _nat2int(start) if i == 0 else prev + 1 + start
            length += min_int
            if prev < 0 or got + length > d:
                return pos, BAD_CODE
            for t in range(length):
                out[at + got + t] = prev + t
            got += length
            prev += length
    if got < d:
        v, pos = _read_code(data, pos, c_res, k)
        if v < 0:
            return pos, PAST_END
        y = x + _nat2int(v)
        out[at + got] = y
        got += 1
        while got < d:
            v, pos = _read_code(data, pos, c_res, k)
            if v < 0:
                return pos, PAST_END
            y += 1 + v
            out[at + got] = y
            got += 1
    lst = out[at : at + d]
    lst.sort()
    if d and (lst[0] < 0 or lst[d - 1] >= n):
        return pos, BAD_LIST
    for i in range(1, d):
        if lst[i] == lst[i - 1]:
            return pos, BAD_LIST
    return pos, d


def _decode_nodes(data, pos, x0, x1, params, out, offs, nh, need):
    """Nodes ``x0 .. x1 - 1``, appended to the ``nh`` lists of the nodes before ``x0`` in ``out``.

    ``out[offs[j]:offs[j + 1]]`` holds the list of node ``x0 - nh + j`` for ``j < nh``
    (the window's history) and receives those of the new nodes; ``offs`` must
    have room for ``nh + x1 - x0 + 1`` entries. Returns ``(nodes decoded, bit position
    after them, status)``: status 0, or NEED_ROOM when the next list does not fit in
    ``out`` (its length in ``need[0]``; that node is left for the next call), or an error.
    """
    first = x0 - nh
    for x in range(x0, x1):
        j = x - first
        new_pos, got = _decode_list(data, pos, x, params, out, offs, first, offs[j], need)
        if got < 0:
            return x - x0, pos, got
        offs[j + 1] = offs[j] + got
        pos = new_pos
    return x1 - x0, pos, 0


@functools.cache
def kernels():
    """``decode_nodes`` compiled by numba, or the Python function when numba cannot be imported."""
    try:
        import numba
    except ImportError:  # slower, same results
        return _decode_nodes
    jit = functools.partial(numba.njit, cache=True, nogil=True)
    g = globals()
    for name in ("_read_bits", "_read_unary", "_gamma_tail", "_read_code", "_nat2int", "_copy_blocks", "_decode_list"):
        g[name] = jit(g[name])
    return jit(_decode_nodes)


__all__ = ["BAD_CODE", "BAD_LIST", "DELTA", "GAMMA", "NEED_ROOM", "PAST_END", "UNARY", "ZETA", "kernels"]
