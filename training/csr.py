"""A CSR built from edge chunks larger than memory: count the rows, place the edges, sort and de-duplicate.

Three passes, each over chunks of at most ``chunk_edges`` edges, with memory
bounded by the chunk plus two int64 arrays of ``num_nodes``
(:meth:`training.writer.DatasetWriter.write_edges` runs them). Row ``v`` of
the CSR holds the sources of the edges ``src -> v`` (the vertices ``v``
aggregates from). scipy.sparse builds a CSR in memory only; this one writes
its indices to a memory-mapped ``.npy`` file.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> chunks = edge_chunks(lambda: [(np.array([0, 2, 2, 1]), np.array([1, 1, 1, 0]))], 3, 2)
>>> indptr = count_rows(chunks, 3)
>>> place_edges(chunks, indptr, d / "raw.npy", np.int32)
>>> sort_rows(d / "raw.npy", indptr, d / "indices.npy", 2).tolist(), np.load(d / "indices.npy").tolist()
([0, 1, 3, 3], [1, 0, 2])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from momentbase.space import reserve

#: ``report(stage, done, total)``, as :mod:`planner.progress`
Report = Callable[[str, int, "int | None"], None]
EdgeChunks = Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]


def _quiet(stage: str, done: int, total: int | None) -> None:
    pass


def edge_chunks(chunks: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]], num_nodes: int, chunk_edges: int, *,
                undirected: bool = False, drop_self_loops: bool = True, num_src: int | None = None,
                where: str = "") -> EdgeChunks:
    """The checked ``(src, dst)`` int64 chunks of ``chunks()``, each of at most ``chunk_edges`` edges, afresh per call.

    Ids must lie in ``[0, num_nodes)`` (a :class:`~training.data.DatasetError`
    names the first that does not, after ``where``); sources in ``[0, num_src)`` when given (a
    bipartite relation's, :mod:`training.hetero.stream`). ``undirected`` yields every edge in both
    directions, ``drop_self_loops`` drops ``v -> v``.
    """
    from training.data import DatasetError

    n = num_nodes
    ns = n if num_src is None else num_src

    def directed() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for src, dst in chunks():
            src = np.asarray(src).astype(np.int64, copy=False).ravel()
            dst = np.asarray(dst).astype(np.int64, copy=False).ravel()
            if src.shape != dst.shape:
                raise DatasetError(f"{where}edge chunk with {src.size} sources but {dst.size} targets")
            if src.size and (min(src.min(), dst.min()) < 0 or src.max() >= ns or dst.max() >= n):
                bad, m = next((int(x), m) for x, m in ((src.min(), ns), (src.max(), ns), (dst.min(), n),
                                                       (dst.max(), n)) if x < 0 or x >= m)
                raise DatasetError(f"{where}edge endpoint {bad} is outside [0, {m}) (num_nodes={m})")
            if drop_self_loops:
                keep = src != dst
                src, dst = src[keep], dst[keep]
            # the chunk may be long; bound the temporaries by re-chunking
            for a in range(0, src.size, chunk_edges):
                s, d = src[a : a + chunk_edges], dst[a : a + chunk_edges]
                yield s, d
                if undirected:
                    yield d, s

    return directed


def count_rows(chunks: EdgeChunks, num_nodes: int, report: Report = _quiet) -> np.ndarray:
    """Pass 1: the row pointers (int64 ``[num_nodes + 1]``) from the in-degrees."""
    counts = np.zeros(num_nodes, dtype=np.int64)
    seen = 0
    # targets are pooled to at least num_nodes / 4 before a bincount: each bincount costs
    # O(num_nodes), so one per small chunk would be O(edges / chunk * num_nodes)
    pool: list[np.ndarray] = []
    pooled = 0
    for s, d in chunks():
        pool.append(d)
        pooled += d.size
        seen += s.size
        if pooled >= num_nodes // 4:
            np.add(counts, np.bincount(np.concatenate(pool), minlength=num_nodes), out=counts)
            pool, pooled = [], 0
        report("counting edges", seen, None)
    if pool:
        np.add(counts, np.bincount(np.concatenate(pool), minlength=num_nodes), out=counts)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr


def place_edges(chunks: EdgeChunks, indptr: np.ndarray, path: Path, idt: np.dtype,
                report: Report = _quiet) -> None:
    """Pass 2: every source at its row's next free slot of ``path`` (a ``.npy`` of ``indptr[-1]`` ids; a counting
    sort)."""
    n, total = indptr.size - 1, int(indptr[-1])
    raw = np.lib.format.open_memmap(path, mode="w+", dtype=idt, shape=(total,))
    reserve(path)  # before the first store: a full disk is a one-line error, not SIGBUS
    cursor = indptr[:-1].copy()
    done = 0
    for s, d in chunks():
        # any order inside a row will do (sort_rows sorts them), so no stable sort needed;
        # int32 keys sort faster when the ids fit
        order = np.argsort(d.astype(np.int32) if n < 2**31 else d)
        d_sorted = d[order]
        # run boundaries of the sorted targets (cheaper than np.unique, which would hash)
        start = np.flatnonzero(np.r_[True, d_sorted[1:] != d_sorted[:-1]]) if d_sorted.size else d_sorted
        uniq = d_sorted[start]
        cnt = np.diff(np.r_[start, d_sorted.size])
        rank = np.arange(d_sorted.size, dtype=np.int64) - np.repeat(start, cnt)
        raw[cursor[d_sorted] + rank] = s[order]
        cursor[uniq] += cnt
        done += s.size
        report("placing edges", done, total)
    raw.flush()


def sort_rows(raw_path: Path, indptr: np.ndarray, out: Path, chunk_edges: int, report: Report = _quiet, *,
              num_cols: int | None = None) -> np.ndarray:
    """Pass 3: sort and de-duplicate every row of ``raw_path``, written to ``out``; the new row pointers.

    Rows are compacted leftwards in place (the write position never passes
    the read position) in row blocks of about ``chunk_edges``, then copied to
    a file of the final size. ``num_cols``: the bound of the column ids when it is not the
    row count (a bipartite relation's CSR, :mod:`training.hetero.stream`).
    """
    raw = np.load(raw_path, mmap_mode="r+")
    n, total = indptr.size - 1, int(indptr[-1])
    m = max(n, num_cols or 0, 1)  # the packed key's radix: above every column id
    new_indptr = np.zeros(n + 1, dtype=np.int64)
    write = v = 0
    while v < n:
        # the largest row block that fits in a chunk (at least one row)
        hi = min(max(int(np.searchsorted(indptr, indptr[v] + chunk_edges, side="right")) - 1, v + 1), n)
        a, b = int(indptr[v]), int(indptr[hi])
        cols = np.asarray(raw[a:b]).astype(np.int64)
        rows = np.repeat(np.arange(hi - v, dtype=np.int64), np.diff(indptr[v : hi + 1]))
        if m < 2**31:  # one int64 key per entry: (row, col) packed, one sort
            key = rows * m + cols
            key.sort()
            rows, cols = key // m, key % m
        else:  # row * n could overflow int64
            order = np.lexsort((cols, rows))
            rows, cols = rows[order], cols[order]
        keep = np.ones(cols.size, dtype=bool)
        keep[1:] = (cols[1:] != cols[:-1]) | (rows[1:] != rows[:-1])
        rows, cols = rows[keep], cols[keep]
        new_indptr[v + 1 : hi + 1] = np.bincount(rows, minlength=hi - v)
        raw[write : write + cols.size] = cols.astype(raw.dtype)
        write += cols.size
        v = hi
        report("sorting rows", a, total)
    np.cumsum(new_indptr, out=new_indptr)
    final = np.lib.format.open_memmap(out, mode="w+", dtype=raw.dtype, shape=(write,))
    reserve(out)
    for a in range(0, write, chunk_edges):
        final[a : min(a + chunk_edges, write)] = raw[a : min(a + chunk_edges, write)]
    final.flush()
    raw.flush()
    del final, raw
    return new_indptr


__all__ = ["count_rows", "edge_chunks", "place_edges", "sort_rows"]
