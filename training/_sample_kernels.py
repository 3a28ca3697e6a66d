"""The numba loops behind :mod:`training.compiled_sampler` (imported only through it: importing compiles).

Each kernel does one *part* ``c`` of ``parts`` of one step of a hop; the caller runs the
parts on its threads (``nogil=True``: they run at once) and waits between steps. The
result does not depend on ``parts``: per-row work is independent, and where several edges
meet one vertex (the relabelling) the vertex's entry (in the vertex map or the hash table)
keeps the *smallest* edge index written to it (an atomic min, as DGL's concurrent id map
claims a slot with compare-and-swap), so "first appearance" means the same for any thread
count although each part scans only its own run of the edges. One part (``parts == 1``)
relabels in a single pass with plain loads and stores. ``cache=True`` keeps the machine
code on disk.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from training._intrinsics import atomic_add, atomic_min, compare_and_swap, prefetch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
#: a candidate ``e + _CAND`` (edge ``e`` may be a vertex's first appearance) sits below every
#: stamped entry of the vertex map (>= 0) and grows with ``e``: the atomic min keeps the first
_CAND = np.int64(-(1 << 62))
#: in the hash table's values, bit 40 marks a candidate (an edge index), clear: a local id
_PENDING = np.int64(1 << 40)
#: iterations a prefetch runs ahead of its loop (16-64 measured alike)
_AHEAD = 16


@njit(cache=True, inline="always")
def _span(n, parts, c):
    return n * c // parts, n * (c + 1) // parts


@njit(cache=True, inline="always")
def _slot(v, mask):
    # Fibonacci hashing: a multiply and a shift, no division
    return np.int64(((np.uint64(v) * _GOLDEN) >> np.uint64(16)) & np.uint64(mask))


@njit(cache=True, nogil=True)
def hop_plan(c, parts, indptr, nodes, fanout, replace, start, deg, count, drawn, sums):  # pragma: no cover
    """Rows of part ``c``'s chunks (``j = c, c + parts, ...`` of the ``len(sums) - 1``): CSR
    ``start``, ``deg``, edge ``count``, whether ``drawn`` (random numbers); ``sums[j + 1]`` =
    (edges, drawing rows) of chunk ``j``."""
    chunks = sums.shape[0] - 1
    for j in range(c, chunks, parts):
        lo, hi = _span(nodes.size, chunks, j)
        sums[j + 1, 0], sums[j + 1, 1] = _plan_rows(lo, hi, indptr, nodes, fanout, replace, start, deg, count, drawn)


@njit(cache=True, inline="always")
def _plan_rows(lo, hi, indptr, nodes, fanout, replace, start, deg, count, drawn):
    total = 0
    drawing = 0
    for r in range(lo, hi):
        prefetch(indptr, nodes[min(r + _AHEAD, hi - 1)])
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
    return total, drawing


@njit(cache=True, nogil=True)
def hop_fill(c, parts, indices, start, deg, count, drawn, sums, fanout, replace, u, row_base, nbr,
             target):  # pragma: no cover
    """Edges of part ``c``'s chunks (as :func:`hop_plan`'s; ``sums`` cumulative now)."""
    chunks = sums.shape[0] - 1
    for j in range(c, chunks, parts):
        _fill_chunk(j, indices, start, deg, count, drawn, sums, fanout, replace, u, row_base, nbr, target)


@njit(cache=True, inline="always")
def _fill_chunk(j, indices, start, deg, count, drawn, sums, fanout, replace, u, row_base, nbr, target):
    """Edges of chunk ``j``'s rows (``sums[j]``: where they begin): ``target`` =
    ``row_base + row``, ``nbr`` = the sampled neighbour's id.

    Drawn rows use the uniforms ``u`` exactly as the torch path does: without replacement
    Floyd's steps read ``u[i, p]`` (step-major ``[k, P]``), with replacement ``u[p, j]``
    (``[P, k]``), scaled in float64 and truncated, so the picks are the same numbers.
    """
    lo, hi = _span(start.size, sums.shape[0] - 1, j)
    e0, p = sums[j, 0], sums[j, 1]
    for r in range(lo, hi):
        prefetch(indices, start[min(r + _AHEAD, hi - 1)])
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
def fill_claimed(todo, done, indices, start, deg, count, drawn, sums, fanout, replace, u, row_base, nbr,
                 target):  # pragma: no cover
    """A helper of :func:`relabel_map_piped`: fills the chunks it claims (``todo[0]``, the next
    unclaimed, taken atomically) and marks each ``done``, until none is left."""
    while True:
        j = atomic_add(todo, 0, 1)
        if j >= sums.shape[0] - 1:
            return
        _fill_chunk(j, indices, start, deg, count, drawn, sums, fanout, replace, u, row_base, nbr, target)
        atomic_add(done, j, 1)  # a locked instruction: the chunk's stores are seen before the mark


@njit(cache=True, inline="always")
def _await_chunk(j, todo, done, indices, start, deg, count, drawn, sums, fanout, replace, u, row_base, nbr,
                 target):
    # until chunk j is filled, fill the next unclaimed chunk (the relabelling thread is a
    # filler as well); False when none is left and j is still a helper's: the caller then
    # sleeps until the helpers end instead of spinning (a helper may have lost its core)
    while atomic_add(done, j, 0) == 0:
        i = atomic_add(todo, 0, 1)
        if i >= sums.shape[0] - 1:
            return False
        _fill_chunk(i, indices, start, deg, count, drawn, sums, fanout, replace, u, row_base, nbr, target)
        atomic_add(done, i, 1)
    return True


@njit(cache=True, nogil=True)
def relabel_piped(todo, done, progress, indices, start, deg, count, drawn, sums, fanout, replace, u, row_base, nbr,
                  target, table, store, a, b, num_nodes, local, new):  # pragma: no cover
    """Fill a hop's chunks with :func:`fill_claimed`'s helpers and relabel them in order, each
    as soon as it is filled (one pass, chunk by chunk: through the hash table ``store`` with
    tags ``a, b`` when ``table``, else :func:`relabel_map_serial`'s, ``store`` the map and ``a``
    its base), from chunk ``progress[0]`` with ``progress[1]`` vertices new so far; stops early
    (``progress`` says where) at a chunk a helper is still filling when no other is left."""
    k = progress[1]
    for j in range(progress[0], sums.shape[0] - 1):
        if not _await_chunk(j, todo, done, indices, start, deg, count, drawn, sums, fanout, replace, u, row_base,
                            nbr, target):
            progress[0], progress[1] = j, k
            return
        if table:
            k = _relabel_table_range(store, a, b, nbr, sums[j, 0], sums[j + 1, 0], num_nodes, local, new, k)
        else:
            k = _relabel_map_range(nbr, sums[j, 0], sums[j + 1, 0], store, a, num_nodes, local, new, k)
    progress[0], progress[1] = sums.shape[0] - 1, k


@njit(cache=True, nogil=True)
def relabel_map_serial(nbr, node_map, base, num_nodes, local, new):  # pragma: no cover
    """One part, one pass through the stamped vertex map: ``local`` = the edge's local id, a
    vertex not in the batch yet takes the next (``new``, in order of first appearance);
    returns how many are new."""
    return _relabel_map_range(nbr, 0, nbr.size, node_map, base, num_nodes, local, new, 0)


@njit(cache=True, inline="always")
def _relabel_map_range(nbr, lo, n, node_map, base, num_nodes, local, new, k):
    # edges lo..n-1, ``k`` new so far; returns the new count
    for e in range(lo, n):
        prefetch(node_map, nbr[min(e + _AHEAD, n - 1)])
        v = nbr[e]
        m = node_map[v]
        if m >= base:
            local[e] = m - base
        else:
            node_map[v] = base + num_nodes + k
            new[k] = v
            local[e] = num_nodes + k
            k += 1
    return k


@njit(cache=True, nogil=True)
def scan_map(c, parts, nbr, node_map, base, local, claims, counts):  # pragma: no cover
    """Part ``c``'s run of the edges through the stamped vertex map: ``local`` = the local id
    of a vertex in the batch already, else -1 and the candidate ``e + _CAND`` min-ed into the
    map; ``claims[lo:lo + counts[c]]``: the edges that lowered their vertex's entry."""
    lo, hi = _span(nbr.size, parts, c)
    k = lo
    for e in range(lo, hi):
        prefetch(node_map, nbr[min(e + _AHEAD, hi - 1)])
        v = nbr[e]
        m = node_map[v]
        if m >= base:
            local[e] = m - base
            continue
        local[e] = -1
        ce = e + _CAND
        # an entry only falls while the parts scan: one at or below ``ce`` means a repeat
        if m > ce and atomic_min(node_map, v, ce) > ce:
            claims[k] = e
            k += 1
    counts[c] = k - lo


@njit(cache=True, inline="always")
def _find_or_claim(table, key, tag, s, mask, shared):
    # the slot of ``key`` (probing on from ``s``), entering it in the first stale slot; with
    # ``shared`` the entry is claimed by compare-and-swap, as other threads probe too
    while True:
        k = table[2 * s]
        if k == key:
            return s
        if k < tag:  # stale (an older epoch's): free
            if not shared:
                table[2 * s] = key
                return s
            old = compare_and_swap(table, 2 * s, k, key)
            if old == k or old == key:  # noqa: SIM109 — numba compiles two compares, not a tuple
                return s
            continue  # another key took it meanwhile: look again
        s = (s + 1) & mask


@njit(cache=True, nogil=True)
def enter_table(c, parts, table, tag, vt, insert, insert_from):  # pragma: no cover
    """Part ``c``'s run of ``insert`` (distinct) enters the hash table with local ids from
    ``insert_from``: ``table[2s] = tag | v``, ``table[2s + 1] = vt | id``."""
    mask = table.size // 2 - 1
    lo, hi = _span(insert.size, parts, c)
    for i in range(lo, hi):
        v = insert[i]
        s = _find_or_claim(table, tag | v, tag, _slot(v, mask), mask, parts > 1)
        table[2 * s + 1] = vt | (insert_from + i)


@njit(cache=True, nogil=True)
def relabel_table_serial(nbr, table, tag, vt, num_nodes, local, new):  # pragma: no cover
    """:func:`relabel_map_serial` through the hash table; returns how many are new."""
    return _relabel_table_range(table, tag, vt, nbr, 0, nbr.size, num_nodes, local, new, 0)


@njit(cache=True, inline="always")
def _relabel_table_range(table, tag, vt, nbr, lo, n, num_nodes, local, new, k):
    mask = table.size // 2 - 1
    for e in range(lo, n):
        prefetch(table, 2 * _slot(nbr[min(e + _AHEAD, n - 1)], mask))
        v = nbr[e]
        key = tag | v
        s = _slot(v, mask)
        while True:
            m = table[2 * s]
            if m == key:
                local[e] = table[2 * s + 1] - vt
                break
            if m < tag:
                table[2 * s] = key
                table[2 * s + 1] = vt | (num_nodes + k)
                new[k] = v
                local[e] = num_nodes + k
                k += 1
                break
            s = (s + 1) & mask
    return k


@njit(cache=True, nogil=True)
def scan_table(c, parts, table, tag, vt, nbr, local, where, claims, counts):  # pragma: no cover
    """:func:`scan_map` through a hash table of the batch's vertices (``table[2s] = tag | v``,
    live iff ``>= tag``, so the table is never cleared; ``table[2s + 1] = vt | id``, or
    ``vt | _PENDING | e`` for a candidate edge, ``vt`` falling with the epoch so that an older
    epoch's value loses every min); ``where[e]``: the index of the value of a vertex not in
    the batch yet."""
    mask = table.size // 2 - 1
    lo, hi = _span(nbr.size, parts, c)
    k = lo
    for e in range(lo, hi):
        prefetch(table, 2 * _slot(nbr[min(e + _AHEAD, hi - 1)], mask))
        v = nbr[e]
        s = _find_or_claim(table, tag | v, tag, _slot(v, mask), mask, True)
        m = table[2 * s + 1]
        if vt <= m < (vt | _PENDING):
            local[e] = m - vt
            continue
        local[e] = -1
        where[e] = 2 * s + 1
        ce = vt | _PENDING | e
        if m > ce and atomic_min(table, 2 * s + 1, ce) > ce:
            claims[k] = e
            k += 1
    counts[c] = k - lo


# The steps after the scan, the same for the map and the table: ``entry[e]`` is the index in
# ``store`` of edge ``e``'s vertex (the map: ``nbr`` itself; the table: its value's slot),
# which holds ``off + local id`` once the vertex is numbered, ``cand + e`` for a candidate.


@njit(cache=True, nogil=True)
def verify(c, parts, entry, store, cand, claims, counts):  # pragma: no cover
    """Keep the claims of part ``c`` whose edge still holds its vertex's entry (first
    appearances). Part 0's all do: every edge before one of its edges is its own, scanned before."""
    if c == 0:
        return
    lo, _ = _span(entry.size, parts, c)
    k = lo
    end = lo + counts[c]
    for i in range(lo, end):
        prefetch(store, entry[claims[min(i + _AHEAD, end - 1)]])
        e = claims[i]
        if store[entry[e]] == cand + e:
            claims[k] = e
            k += 1
    counts[c] = k - lo


@njit(cache=True, nogil=True)
def number(c, parts, nbr, entry, store, off, claims, counts, begin, num_nodes, local, new):  # pragma: no cover
    """Part ``c``'s first appearances take ``num_nodes + k`` for ``k`` from ``begin[c]`` up, in
    edge order: into ``local``, ``new`` and their entries."""
    lo, _ = _span(nbr.size, parts, c)
    k = begin[c]
    end = lo + counts[c]
    for i in range(lo, end):
        prefetch(store, entry[claims[min(i + _AHEAD, end - 1)]])
        e = claims[i]
        new[k] = nbr[e]
        local[e] = num_nodes + k
        store[entry[e]] = off + num_nodes + k
        k += 1


@njit(cache=True, nogil=True)
def finish(c, parts, entry, store, off, local):  # pragma: no cover
    """Part ``c``'s repeats (``local == -1``) take their vertex's id from its entry."""
    lo, hi = _span(local.size, parts, c)
    for e in range(lo, hi):
        a = min(e + _AHEAD, hi - 1)
        if local[a] < 0:
            prefetch(store, entry[a])
        if local[e] < 0:
            local[e] = store[entry[e]] - off


@njit(cache=True, nogil=True)
def copy(c, parts, src, dst):  # pragma: no cover
    """Part ``c`` of ``dst[:] = src``."""
    lo, hi = _span(src.size, parts, c)
    dst[lo:hi] = src[lo:hi]
