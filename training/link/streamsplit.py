"""The edge split in chunks: :func:`~training.link.edges.split_edges`'s output, reading the CSR a chunk at a time.

:func:`split_edges_streamed` returns exactly what :func:`~training.link.edges.split_edges` returns
for the same graph and seed (the same ``rng`` calls in the same order, the same membership answers),
without holding the edge list: the graph is read in chunks of ``chunk_edges`` edges (a memory-mapped
CSR stays on disk), the training graph's ``indices`` and the training pairs are written into
memory-mapped ``.npy`` files under ``scratch``, and the negatives are checked against the CSR's rows
(:class:`CsrEdges`) instead of a sorted key per edge. What it holds in memory:

- the inverse of the candidates' permutation, 4 bytes per candidate edge (8 beyond 2**31 candidates;
  the permutation itself, 8 bytes per candidate, only while the inverse is filled): the split must
  draw the same permutation as the in-memory split, and numpy draws it whole;
- the held-out pairs and their keys, about 48 bytes per validation or test edge;
- per-vertex counts (16 bytes per vertex) and a chunk's work arrays (about 60 bytes per chunk edge).

So its memory still grows with the graph, through the permutation (about 15 bytes per CSR edge on an
undirected graph with the default shares), where the in-memory split holds the edge list several
times over (about 105 bytes per CSR edge): measured by ``tools/bench_split_edges.py`` at 1e7 and 3e7
edges, anonymous peak 17.4 and 15.0 against 103.7 and 106.9 bytes per CSR edge, the same output.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from training.link.edges import LinkSplit, split_count
from training.link.edgeset import EdgeSet, LinkSplitError
from training.link.negatives import NegativeSampler

__all__ = ["CsrEdges", "split_edges_streamed"]


def _chunks(indptr: np.ndarray, indices: np.ndarray, chunk_edges: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """``(first edge, src, dst)`` int64 of each run of ``chunk_edges`` CSR edges, in edge order."""
    total = int(indptr[-1])
    for a in range(0, total, chunk_edges):
        b = min(a + chunk_edges, total)
        dst = np.searchsorted(indptr, np.arange(a, b, dtype=np.int64), side="right") - 1
        yield a, np.asarray(indices[a:b], np.int64), dst.astype(np.int64)


class CsrEdges:
    """Membership of directed pairs ``u -> v`` in a CSR (row ``v`` lists its sources), by scanning the rows asked
    about, a block of rows of at most ``chunk_edges`` edges at a time: what :class:`EdgeSet` answers, without a
    key per edge."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, chunk_edges: int = 1 << 22) -> None:
        self.indptr, self.indices = np.asarray(indptr, np.int64), indices
        self.num_nodes = self.indptr.shape[0] - 1
        self.chunk_edges = int(chunk_edges)

    def contains(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """bool ``[len(src)]``: whether each ``src[i] -> dst[i]`` is an edge."""
        src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        out = np.zeros(src.shape, bool)
        deg = self.indptr[dst + 1] - self.indptr[dst]
        ends = np.cumsum(deg)
        a = 0
        while a < src.size:  # queries whose rows hold at most chunk_edges edges together (at least one query)
            b = max(a + 1, int(np.searchsorted(ends, (ends[a - 1] if a else 0) + self.chunk_edges, side="right")))
            d, s, k = dst[a:b], src[a:b], deg[a:b]
            if k.sum():
                starts = np.repeat(self.indptr[d] - np.concatenate([[0], np.cumsum(k)[:-1]]), k)
                flat = starts + np.arange(int(k.sum()))  # the edge positions of every row asked about
                hit = np.asarray(self.indices[flat], np.int64) == np.repeat(s, k)
                owner = np.repeat(np.arange(b - a), k)
                out[a:b] = np.bincount(owner[hit], minlength=b - a) > 0
            a = b
        return out


def _inverse_permutation(rng: np.random.Generator, n: int, chunk: int) -> np.ndarray:
    """The inverse of ``rng.permutation(n)`` (int32 when it fits): each candidate's position in the permutation."""
    perm = rng.permutation(n)
    inv = np.empty(n, np.int32 if n < 2**31 else np.int64)
    for a in range(0, n, chunk):
        inv[perm[a:a + chunk]] = np.arange(a, min(a + chunk, n), dtype=inv.dtype)
    return inv


def split_edges_streamed(indptr: np.ndarray, indices: np.ndarray, scratch: str | Path, *, undirected: bool,
                         num_val: float | int = 0.05, num_test: float | int = 0.1, seed: int = 0,
                         negatives: str = "uniform", neg_ratio: float = 1.0, chunk_edges: int = 1 << 22) -> LinkSplit:
    """:func:`~training.link.edges.split_edges` read in chunks (see the module doc); the training pairs and the
    training graph's ``indices`` are memory-mapped files in the directory ``scratch``.

    Raises
    ------
    LinkSplitError
        Shares outside ``[0, 1)``, or too few edges left to train on.
    """
    indptr = np.asarray(indptr, np.int64)
    n, chunk = indptr.shape[0] - 1, max(1, int(chunk_edges))
    ncand = sum(int((s <= d).sum()) for _, s, d in _chunks(indptr, indices, chunk)) if undirected \
        else int(indptr[-1])
    rng = np.random.default_rng(seed)
    inv = _inverse_permutation(rng, ncand, chunk)
    n_val, n_test = split_count(num_val, ncand, "num_val"), split_count(num_test, ncand, "num_test")
    n_train = ncand - n_val - n_test
    if n_train <= 0:
        raise LinkSplitError(f"{ncand} candidate edges leave none to train on after {n_val} validation "
                             f"and {n_test} test edges; lower `num_val` or `num_test`")
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    train = np.lib.format.open_memmap(scratch / "train_pos.npy", "w+", np.int64, (2, n_train))
    held = np.empty((2, n_val + n_test), np.int64)
    degree = np.zeros(n, np.int64)
    c0 = 0
    for _, s, d in _chunks(indptr, indices, chunk):
        degree += np.bincount(s, minlength=n) + np.bincount(d, minlength=n)
        cand = np.flatnonzero(s <= d) if undirected else np.arange(s.size)
        p = inv[c0:c0 + cand.size].astype(np.int64)
        c0 += cand.size
        t = p < n_train
        train[:, p[t]] = np.stack([s[cand[t]], d[cand[t]]])
        held[:, p[~t] - n_train] = np.stack([s[cand[~t]], d[cand[~t]]])
    del inv
    train.flush()
    both = np.concatenate([held, held[::-1]], axis=1) if undirected else held
    out_ptr, out_idx = _drop_streamed(indptr, indices, EdgeSet.from_pairs(both[0], both[1], n), scratch, chunk)
    sampler = NegativeSampler(CsrEdges(indptr, indices, chunk), method=negatives, degree=degree)
    n_neg_val, n_neg_test = int(n_val * neg_ratio), int(n_test * neg_ratio)
    neg = sampler.sample(n_neg_val + n_neg_test, rng)
    return LinkSplit(num_nodes=n, undirected=undirected, train_pos=train, valid_pos=held[:, :n_val],
                     test_pos=held[:, n_val:], valid_neg=neg[:, :n_neg_val], test_neg=neg[:, n_neg_val:],
                     indptr=out_ptr, indices=out_idx)


def _drop_streamed(indptr: np.ndarray, indices: np.ndarray, held: EdgeSet, scratch: Path, chunk: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The CSR without the edges ``held`` names, its ``indices`` written to ``scratch`` (rows keep their order)."""
    n = indptr.shape[0] - 1
    kept = np.zeros(n, np.int64)
    for _, s, d in _chunks(indptr, indices, chunk):  # a first pass counts what each row keeps
        kept += np.bincount(d[~held.contains(s, d)], minlength=n)
    out = np.lib.format.open_memmap(scratch / "train_indices.npy", "w+", np.asarray(indices[:0]).dtype,
                                    (int(kept.sum()),))
    at = 0
    for _, s, d in _chunks(indptr, indices, chunk):
        keep = s[~held.contains(s, d)]
        out[at:at + keep.size] = keep
        at += keep.size
    out.flush()
    out_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(kept, out=out_ptr[1:])
    return out_ptr, out
