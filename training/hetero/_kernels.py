"""The numba loops of the typed sampler (:mod:`training.hetero.compiled`; importing compiles).

A hop is two calls over *all* relations: :func:`typed_plan` (every relation's frontier rows:
CSR start, degree, edge count, whether drawn) and, after the caller has drawn each relation's
uniforms from torch's generator in the torch path's order and shapes, :func:`typed_fill`
(every relation's picks, Floyd's subsets from those uniforms, and the relabelling into the
batch's per-type positions, relation after relation, in one serial pass). The per-row steps
are :mod:`training._sample_kernels`' own (the homogeneous compiled sampler's), so a relation's
picks are the numbers the torch path picks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from training._sample_kernels import _fill_chunk, _plan_rows


@njit(cache=True, nogil=True)
def typed_plan(indptrs, rel_dst, fanout, front, front_lo, row_lo, start, deg, count, drawn, sums):  # pragma: no cover
    """For relation ``r``, the rows ``row_lo[r]:row_lo[r + 1]`` of the plan arrays are its ``dst``
    type's frontier ``front[front_lo[t]:...]``; ``sums[r] = (edges, drawn rows)``."""
    for r in range(len(indptrs)):
        lo, hi = row_lo[r], row_lo[r + 1]
        t = rel_dst[r]
        f = front[front_lo[t]:front_lo[t] + hi - lo]
        sums[r, 0], sums[r, 1] = _plan_rows(0, hi - lo, indptrs[r], f, fanout[r], False, start[lo:hi], deg[lo:hi],
                                            count[lo:hi], drawn[lo:hi])


@njit(cache=True, nogil=True)
def typed_fill(indices, rel_src, fanout, u, u_lo, row_first, row_lo, edge_lo, start, deg, count, drawn, sums,
               type_off, pos, size, nbr, rows, cols, new_ids, new_type, new_lo):  # pragma: no cover
    """Fill relation after relation: ``cols`` = ``row_first[r] +`` the row (the ``dst`` position),
    ``nbr`` the picked ``src`` local id; a ``src`` not in the batch yet (``pos`` of its global id
    ``< 0``) takes the next position of its type (``size``) and is listed in ``new_ids`` /
    ``new_type`` in order of first appearance; ``rows`` = the ``src`` position. Relation ``r``'s
    uniforms are ``u[u_lo[r]:u_lo[r + 1]]`` as ``[fanout, rows drawn]``. Then ``new_ids`` is
    grouped by type, in order inside each (type ``t``'s: ``new_ids[new_lo[t]:new_lo[t + 1]]``).
    Returns how many are new."""
    k = 0
    one = np.zeros((2, 2), np.int64)
    for r in range(len(indices)):
        lo, hi, e0, e1 = row_lo[r], row_lo[r + 1], edge_lo[r], edge_lo[r + 1]
        one[1, 0], one[1, 1] = sums[r, 0], sums[r, 1]
        ur = u[u_lo[r]:u_lo[r + 1]].reshape((max(fanout[r], 0), sums[r, 1] if u_lo[r + 1] > u_lo[r] else 0))
        _fill_chunk(0, indices[r], start[lo:hi], deg[lo:hi], count[lo:hi], drawn[lo:hi], one, fanout[r], False,
                    ur, row_first[r], nbr[e0:e1], cols[e0:e1])
        t = rel_src[r]
        off = type_off[t]
        for e in range(e0, e1):
            g = off + nbr[e]
            p = pos[g]
            if p < 0:
                p = size[t]
                size[t] += 1
                pos[g] = p
                new_ids[k] = nbr[e]
                new_type[k] = t
                k += 1
            rows[e] = p
    _group(new_ids, new_type, k, new_lo, nbr)
    return k


@njit(cache=True, inline="always")
def _group(ids, kind, n, lo, scratch):
    """Stable counting sort of ``ids[:n]`` by ``kind`` (``lo``: where each kind begins), via ``scratch``."""
    lo[:] = 0
    for i in range(n):
        lo[kind[i] + 1] += 1
    for t in range(1, lo.size):
        lo[t] += lo[t - 1]
    at = lo[:-1].copy()
    for i in range(n):
        scratch[at[kind[i]]] = ids[i]
        at[kind[i]] += 1
    ids[:n] = scratch[:n]
