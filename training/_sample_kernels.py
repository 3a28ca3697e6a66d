"""The numba loops behind :mod:`training.compiled_sampler` (imported only through it: importing compiles).

Each kernel does one *part* ``c`` of ``parts`` of one step of a hop; the caller runs the
parts on its threads (``nogil=True``: they run at once) and waits between steps. The
result does not depend on ``parts``: per-row work is independent, and where several edges
meet one vertex (the relabelling) each vertex belongs to one part (its *owner*, from a
multiplicative hash), which visits its edges in edge order, so "first appearance" means the
same for any thread count. ``cache=True`` keeps the machine code on disk.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def _span(n, parts, c):
    return n * c // parts, n * (c + 1) // parts


@njit(cache=True, inline="always")
def _owner(v, parts):
    # a multiply and a shift where ``v % parts`` would divide (~10 ns an edge)
    return np.int64((((np.uint64(v) * _GOLDEN) >> np.uint64(32)) * np.uint64(parts)) >> np.uint64(32))


@njit(cache=True, inline="always")
def _owner_slot(v, parts, mask):
    # owner from the hash's top bits (as _owner), slot from bits 16 and up: no division
    return _owner(v, parts), np.int64(((np.uint64(v) * _GOLDEN) >> np.uint64(16)) & np.uint64(mask))


@njit(cache=True, nogil=True)
def hop_plan(c, parts, indptr, nodes, fanout, replace, start, deg, count, drawn, sums):  # pragma: no cover
    """Rows of part ``c``: CSR ``start``, ``deg``, edge ``count``, whether ``drawn`` (random
    numbers); ``sums[c + 1]`` = (edges, drawing rows) of the part."""
    lo, hi = _span(nodes.size, parts, c)
    total = 0
    drawing = 0
    for r in range(lo, hi):
        v = nodes[r]
        s = indptr[v]
        d = indptr[v + 1] - s
        start[r] = s
        deg[r] = d
        draw = 0
        if fanout < 0:
            cnt = d
        elif replace:
            cnt = fanout if d > 0 else 0
            draw = 1 if d > 0 else 0
        else:
            cnt = min(d, fanout)
            draw = 1 if d > fanout else 0
        count[r] = cnt
        drawn[r] = draw
        total += cnt
        drawing += draw
    sums[c + 1, 0] = total
    sums[c + 1, 1] = drawing


@njit(cache=True, nogil=True)
def hop_fill(c, parts, indices, start, deg, count, drawn, sums, fanout, replace, u, row_base, nbr,
             target):  # pragma: no cover
    """Edges of part ``c``'s rows (``sums[c]``: where they begin, cumulative): ``target`` =
    ``row_base + row``, ``nbr`` = the sampled neighbour's id.

    Drawn rows use the uniforms ``u`` exactly as the torch path does: without replacement
    Floyd's steps read ``u[i, p]`` (step-major ``[k, P]``), with replacement ``u[p, j]``
    (``[P, k]``), scaled in float64 and truncated, so the picks are the same numbers.
    """
    lo, hi = _span(start.size, parts, c)
    e0, p = sums[c, 0], sums[c, 1]
    for r in range(lo, hi):
        e1 = e0 + count[r]
        s, d = start[r], deg[r]
        for e in range(e0, e1):
            target[e] = row_base + r
        if not drawn[r]:
            for e in range(e0, e1):
                nbr[e] = indices[s + e - e0]
        elif replace:
            for j in range(fanout):
                nbr[e0 + j] = indices[s + np.int64(u[p, j] * d)]
            p += 1
        else:
            # Floyd: step i draws t on [0, d-k+i]; a t already chosen becomes d-k+i itself.
            # The chosen offsets sit in the row's own output slots until all k are known.
            for i in range(fanout):
                j = d - fanout + i
                t = np.int64(u[i, p] * (j + 1))
                for q in range(i):
                    if nbr[e0 + q] == t:
                        t = j
                        break
                nbr[e0 + i] = t
            for i in range(fanout):
                nbr[e0 + i] = indices[s + nbr[e0 + i]]
            p += 1
        e0 = e1


@njit(cache=True, nogil=True)
def scan_map(t, parts, nbr, node_map, base, local, counts):  # pragma: no cover
    """Owner ``t``'s edges, in edge order, through the stamped vertex map: ``local`` = the
    local id of a vertex already in the batch, -2 at a first appearance in this hop (the map
    then holds ``-1 - e``), ``-3 - e`` at a repeat of the vertex first seen at edge ``e``;
    ``counts[t, c]``: first appearances in run ``c`` of the edges."""
    n = nbr.size
    for c in range(parts):
        lo, hi = _span(n, parts, c)
        found = 0
        for e in range(lo, hi):
            v = nbr[e]
            if parts > 1 and _owner(v, parts) != t:
                continue
            m = node_map[v]
            if m >= base:
                local[e] = m - base
            elif m < 0:
                local[e] = -2 + m
            else:
                node_map[v] = -1 - e
                local[e] = -2
                found += 1
        counts[t, c] = found


@njit(cache=True, nogil=True)
def scan_table(t, parts, table, tag, insert, insert_from, nbr, local, where, counts):  # pragma: no cover
    """:func:`scan_map` through a hash table of the batch's vertices instead of the map:
    ``table[t, s] = (tag | v, local id)``, one segment of ``2**b`` slots per owner ``t``; an entry
    is live iff its high bits are ``tag`` (``epoch << 40``), so the table is never cleared.
    ``insert`` (local ids from ``insert_from``) are entered first; ``where[e]``: the slot a
    first appearance took."""
    mask = table.shape[1] - 1
    for i in range(insert.size):
        o, s = _owner_slot(insert[i], parts, mask)
        if o == t:
            while table[t, s, 0] >= tag:  # a live entry (older tags are smaller)
                s = (s + 1) & mask
            table[t, s, 0] = tag | insert[i]
            table[t, s, 1] = insert_from + i
    n = nbr.size
    for c in range(parts):
        lo, hi = _span(n, parts, c)
        found = 0
        for e in range(lo, hi):
            v = nbr[e]
            o, s = _owner_slot(v, parts, mask)
            if o != t:
                continue
            key = tag | v
            while table[t, s, 0] >= tag and table[t, s, 0] != key:
                s = (s + 1) & mask
            if table[t, s, 0] == key:
                m = table[t, s, 1]
                local[e] = m if m >= 0 else -2 + m
            else:
                table[t, s, 0] = key
                table[t, s, 1] = -1 - e
                local[e] = -2
                where[e] = t * (mask + 1) + s
                found += 1
        counts[t, c] = found


@njit(cache=True, nogil=True)
def number(c, parts, nbr, local, begin, num_nodes, new, at):  # pragma: no cover
    """First appearances in run ``c`` of the edges (``local == -2``) take ``num_nodes + k`` for
    ``k`` from ``begin[c]`` up, in edge order; ``new[k]`` their vertices, ``at[k]`` their edges."""
    lo, hi = _span(nbr.size, parts, c)
    k = begin[c]
    for e in range(lo, hi):
        if local[e] == -2:
            new[k] = nbr[e]
            at[k] = e
            local[e] = num_nodes + k
            k += 1


@njit(cache=True, inline="always")
def _repeats(c, parts, local):
    # run c of the edges: a repeat (-3 - e) takes the id its first appearance e got
    lo, hi = _span(local.size, parts, c)
    for e in range(lo, hi):
        if local[e] < 0:
            local[e] = local[-3 - local[e]]


@njit(cache=True, nogil=True)
def finish_map(c, parts, nbr, local, new, node_map, base, num_nodes):  # pragma: no cover
    """Run ``c``: repeats take their first appearance's id; new vertices enter the map."""
    _repeats(c, parts, local)
    lo, hi = _span(new.size, parts, c)
    for r in range(lo, hi):
        node_map[new[r]] = base + num_nodes + r


@njit(cache=True, nogil=True)
def finish_table(c, parts, nbr, local, at, where, table, num_nodes):  # pragma: no cover
    """:func:`finish_map` for the hash table: new vertices' entries get their ids."""
    _repeats(c, parts, local)
    lo, hi = _span(at.size, parts, c)
    flat = table.reshape(-1, 2)
    for r in range(lo, hi):
        flat[where[at[r]], 1] = num_nodes + r
