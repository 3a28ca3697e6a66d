"""METIS through pymetis: a multilevel partitioning of the whole graph in memory, balanced on three counts.

DistDGL's recipe: METIS (Karypis & Kumar) on the symmetrised graph with one
weight per vertex for each count to balance (``ncon = 3``: the vertex itself,
whether it is a training seed, its CSR row length), so that each partition
holds about ``1/P`` of the vertices, of the seeds and of the edges, each
within METIS's default tolerance. pymetis's ``part_graph`` passes ``ncon = 1``
to METIS whatever it is given (``src/wrapper/wrapper.cpp``), so the call goes
to the METIS that pymetis ships (its extension exports ``METIS_PartGraphKway``
and ``METIS_PartGraphRecursive``, 64-bit ``idx_t``) through :mod:`ctypes`;
where that is not possible the three counts are blended into one weight,
``1 + N/S * seed + N/E * degree``, for ``part_graph`` (balanced in sum, not
each). METIS needs the whole symmetrised graph in memory (scipy's ``A + A.T``
with int64 ids, then METIS's own copy: about 140 bytes a CSR entry, measured
at 10^7 entries), so it is for graphs
that fit; :func:`training.partition.default_method` hands larger ones to the
streaming ``ldg``. pymetis (a maintained binding of METIS 5) is imported only here.
"""

from __future__ import annotations

import numpy as np

from planner.progress import Progress
from training.data import Dataset
from training.partition import PartitionError
from training.partition.common import check_parts, seed_mask


def _symmetric(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The CSR of ``A + A^T`` without self loops (METIS's input): int64 row pointers, int64 ids."""
    import scipy.sparse as sp

    n = ds.num_nodes
    a = sp.csr_matrix((np.ones(ds.num_edges, np.int8), np.asarray(ds.indices), np.asarray(ds.indptr)),
                      shape=(n, n))
    s = (a + a.T).tocsr()
    s.setdiag(0)
    s.eliminate_zeros()
    return s.indptr.astype(np.int64), s.indices.astype(np.int64)


def metis_partition(ds: Dataset, parts: int, *, seed: int = 0, progress: Progress | None = None) -> np.ndarray:
    """``part_of`` (int16 ``[N]``) by METIS (k-way above 8 parts, recursive bisection up to 8, as pymetis).

    Raises
    ------
    PartitionError
        ``parts`` out of range, or pymetis not installed (the message says to install it or use ``ldg``).
    """
    p = check_parts(ds, parts)
    try:
        import pymetis
    except ImportError:
        raise PartitionError("`method` metis needs pymetis (pip install pymetis); `method` ldg needs nothing"
                             ) from None
    n = ds.num_nodes
    if p == 1:
        return np.zeros(n, np.int16)
    if progress is not None:
        progress("symmetrising the graph for METIS", 0, None)
    xadj, adjncy = _symmetric(ds)
    deg = np.diff(np.asarray(ds.indptr)).astype(np.int64)
    seeds = seed_mask(ds)
    counts = np.stack([np.ones(n, np.int64), seeds.astype(np.int64), deg], axis=1)
    counts = np.ascontiguousarray(counts[:, counts.sum(axis=0) > 0])  # METIS refuses a constraint of total 0
    if progress is not None:
        progress(f"METIS into {p} parts", 0, None)
    part = _metis_ncon(xadj, adjncy, counts, p, int(seed))
    if part is not None:
        return part
    s_total, e_total = max(int(seeds.sum()), 1), max(ds.num_edges, 1)
    # one blended weight (part_graph is ncon = 1): each count weighs N in total; x4 keeps the rounding small
    vweights = np.rint(4.0 * (1.0 + n / s_total * seeds + n / e_total * deg)).astype(np.int64)
    res = pymetis.part_graph(p, pymetis.CSRAdjacency(xadj, adjncy), vweights=vweights,
                             options=pymetis.Options(seed=int(seed)))
    return np.asarray(res.vertex_part, np.int16)


#: METIS's option slots (``metis.h``'s ``moptions_et``) and its success code
_NOPTIONS, _OPTION_SEED, _OPTION_NUMBERING, _METIS_OK = 40, 9, 18, 1


def _metis_ncon(xadj: np.ndarray, adjncy: np.ndarray, counts: np.ndarray, parts: int, seed: int
                ) -> np.ndarray | None:
    """METIS with one weight a vertex per column of ``counts`` (int64 ``[N, ncon]``): recursive bisection up to 8
    parts, k-way above (as pymetis chooses); None where pymetis's METIS cannot be called so."""
    import ctypes

    from pymetis import _internal

    if _internal._idx_type_width() != 64:
        return None
    try:
        lib = ctypes.CDLL(_internal.__file__)
        fn = lib.METIS_PartGraphRecursive if parts <= 8 else lib.METIS_PartGraphKway
        set_default = lib.METIS_SetDefaultOptions
    except (OSError, AttributeError):
        return None
    i64 = ctypes.POINTER(ctypes.c_int64)

    def ptr(a: np.ndarray):
        return a.ctypes.data_as(i64)

    options = np.zeros(_NOPTIONS, np.int64)
    set_default(ptr(options))
    options[_OPTION_SEED], options[_OPTION_NUMBERING] = seed, 0
    n, ncon = counts.shape
    nv, nc, npart, objval = (np.array([x], np.int64) for x in (n, ncon, parts, 0))
    part = np.zeros(n, np.int64)
    xadj, adjncy = np.ascontiguousarray(xadj, np.int64), np.ascontiguousarray(adjncy, np.int64)
    vwgt = np.ascontiguousarray(counts, np.int64).reshape(-1)
    rc = fn(ptr(nv), ptr(nc), ptr(xadj), ptr(adjncy), ptr(vwgt), None, None, ptr(npart), None, None,
            ptr(options), ptr(objval), ptr(part))
    if rc != _METIS_OK:
        raise PartitionError(f"METIS failed (status {rc}) partitioning into {parts} parts with {ncon} balance "
                             "counts; try `method` ldg")
    return part.astype(np.int16)
