"""Plain edge lists (SNAP text, optionally gzipped) to a dataset directory.

One edge ``u v`` per line, whitespace-separated (extra columns ignored), ``#``
and ``%`` comments (SNAP, KONECT), ``\\r\\n`` tolerated, gzip detected by its magic bytes. A line ``u v``
is the edge ``u -> v``: ``v`` aggregates from ``u``; ``undirected=True`` stores
both directions. Node ids are relabelled densely in increasing order of the
original id (ids that are already ``0..n-1`` keep their values), and the map is
kept as ``node_ids.npy`` (int64, original id per node) when it is not the identity.

Memory: the text is parsed once, in blocks, into a temporary binary file of id
pairs beside ``dst``; the CSR is built from that file in chunks. What stays in
memory is one block, the sorted set of distinct ids, and two arrays per node.

No features or labels come with an edge list: ``features="random"`` writes
standard-normal features of width ``feature_dim`` (seeded), ``"degree"`` a one-hot
of the log2 in-degree bucket, ``"none"`` (default) writes none.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from planner.progress import Progress
from training.data import DEFAULT_CHUNK_EDGES, DatasetError
from training.importers._text import DEFAULT_CHUNK_BYTES, iter_rows, open_binary
from training.writer import DatasetWriter

FEATURE_BLOCK_ROWS = 1 << 16


def detect(src: Path) -> bool:
    """A file whose first non-comment line holds two integers."""
    if not src.is_file():
        return False
    try:
        with open_binary(src) as f:
            head = f.read(1 << 16)
    except (DatasetError, OSError, EOFError):
        return False
    for line in head.splitlines()[:-1] or head.splitlines():
        text = line.split(b"#", 1)[0].split(b"%", 1)[0].strip()
        if text:
            fields = text.split()
            return len(fields) >= 2 and all(x.lstrip(b"-").isdigit() for x in fields[:2])
    return False


def _sorted_unique(x: np.ndarray, *, kind: str | None = None) -> np.ndarray:
    """``np.unique`` by sorting (numpy 2's hash-based unique is several times slower on ids)."""
    x = np.sort(x, kind=kind)
    keep = np.ones(x.size, dtype=bool)
    keep[1:] = x[1:] != x[:-1]
    return x[keep]


def _relabel_in_place(pairs: np.ndarray, ids: np.ndarray, chunk_edges: int) -> None:
    """Replace each original id in ``pairs`` by its rank in the sorted ``ids``, chunk by chunk.

    A lookup table over the id range is one gather per id; binary search (``searchsorted``)
    into a large table is a cache miss per step and ~50x slower, so the table is used whenever
    the id range is at most a few times the number of ids.
    """
    lo, span = int(ids[0]), int(ids[-1]) - int(ids[0]) + 1
    lut = None
    if span <= max(4 * ids.size, 1 << 24):
        lut = np.full(span, -1, dtype=np.int32 if ids.size < 2**31 else np.int64)
        lut[ids - lo] = np.arange(ids.size)
    for a in range(0, pairs.shape[0], chunk_edges):
        blk = np.asarray(pairs[a : a + chunk_edges])
        pairs[a : a + chunk_edges] = lut[blk - lo] if lut is not None else np.searchsorted(ids, blk)
    pairs.flush()


def degree_features(in_degree: np.ndarray, dim: int) -> np.ndarray:
    """One-hot of ``min(floor(log2(deg + 1)), dim - 1)``, float32 [n, dim].

    >>> degree_features(np.array([0, 1, 3, 100]), 4).argmax(1).tolist()
    [0, 1, 2, 3]
    """
    bucket = np.minimum(np.floor(np.log2(in_degree.astype(np.float64) + 1)).astype(np.int64), dim - 1)
    out = np.zeros((in_degree.size, dim), dtype=np.float32)
    out[np.arange(in_degree.size), bucket] = 1.0
    return out


def import_edgelist(
    src: str | Path,
    dst: str | Path,
    *,
    name: str | None = None,
    undirected: bool = False,
    relabel: bool = True,
    features: str = "none",
    feature_dim: int = 0,
    feature_dtype: str | None = None,
    seed: int = 0,
    overwrite: bool = False,
    progress: Progress | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    chunk_edges: int = DEFAULT_CHUNK_EDGES,
) -> Path:
    """Convert the edge-list file ``src`` into the dataset directory ``dst``. Returns ``dst``.

    ``relabel=False`` keeps ids as they are (``num_nodes = max id + 1``; ids must be >= 0).
    Self-loops and repeated edges are dropped.
    """
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise DatasetError(f"{src}: no such file")
    if features not in ("none", "random", "degree"):
        raise DatasetError(f"`features` {features!r}: expected none, random or degree")
    if features != "none" and feature_dim <= 0:
        raise DatasetError(f"`features` {features} needs `feature_dim` > 0")
    if dst.exists() and not overwrite:
        raise DatasetError(f"{dst}: already exists; remove it or pass `overwrite=True` to replace it")
    if not dst.parent.is_dir():
        raise DatasetError(f"{dst.parent}: no such directory to write the dataset into")
    with tempfile.TemporaryDirectory(prefix=f".{dst.name}.parse-", dir=dst.parent) as tmp:
        pairs_path = Path(tmp) / "pairs.bin"
        rows, self_loops, ids, identity = _parse(src, pairs_path, relabel, chunk_bytes, progress)
        n = int(ids.size) if relabel else int(ids[0]) + 1
        pairs = np.memmap(pairs_path, dtype=np.int64, mode="r+", shape=(rows, 2))
        if not identity:
            _relabel_in_place(pairs, ids, chunk_edges)

        def chunks():
            for a in range(0, rows, chunk_edges):
                blk = np.asarray(pairs[a : a + chunk_edges])
                yield blk[:, 0], blk[:, 1]

        source = {
            "format": "edgelist", "path": str(src.resolve()), "bytes": os.path.getsize(src), "rows": rows,
            "self_loops_dropped": self_loops, "relabelled": not identity, "undirected": undirected,
            "features": features if features == "none" else f"{features} ({feature_dim})",
        }
        with DatasetWriter(dst, num_nodes=n, name=name or src.name.split(".")[0], source=source,
                           overwrite=overwrite, progress=progress, chunk_edges=chunk_edges) as w:
            edges = w.write_edges(chunks, undirected=undirected, drop_self_loops=True, dedup=True)
            w.set_meta(source={**source, "duplicates_dropped": (rows - self_loops) * (2 if undirected else 1) - edges})
            if not identity:
                np.save(w.tmp_dir / "node_ids.npy", ids)
                w.set_meta(node_ids="node_ids.npy")
            _write_features(w, features, feature_dim, feature_dtype, seed)
    return dst


def _parse(src: Path, pairs_path: Path, relabel: bool, chunk_bytes: int, progress: Progress | None
           ) -> tuple[int, int, np.ndarray, bool]:
    """One pass over the text: the pairs to ``pairs_path`` (int64), and what they hold.

    Returns the rows, the self-loops among them, the ids (sorted distinct ids
    with ``relabel``; else ``[max id]``) and whether the ids are ``0..n-1``
    already (no relabelling needed).
    """
    rows = self_loops = lo = 0
    ids = np.zeros(0, dtype=np.int64)
    with open(pairs_path, "wb") as out:
        for arr in iter_rows(src, ncols=2, dtype=np.int64, comments=("#", "%"), chunk_bytes=chunk_bytes):
            out.write(np.ascontiguousarray(arr).tobytes())
            rows += arr.shape[0]
            self_loops += int((arr[:, 0] == arr[:, 1]).sum())
            lo = min(lo, int(arr.min()))
            if relabel:
                # two sorted runs: timsort ("stable") merges them in linear time, where the default
                # quicksort re-sorts all ids seen so far for every block (40x slower at 2e7 ids,
                # quadratic in the file over a billion-edge list)
                ids = _sorted_unique(np.concatenate([ids, _sorted_unique(arr.ravel())]), kind="stable")
            else:
                ids = np.array([max(int(ids.max()) if ids.size else -1, int(arr.max()))])
            if progress:
                progress("parsing", rows, None)
    if rows == 0:
        raise DatasetError(f"{src}: no edges (only comments or blank lines)")
    if relabel:
        return rows, self_loops, ids, bool(ids[0] == 0 and ids[-1] == ids.size - 1)
    if lo < 0:
        raise DatasetError(f"{src}: node id {lo} is negative; import with relabelling")
    return rows, self_loops, ids, True


def _write_features(w: DatasetWriter, features: str, feature_dim: int, feature_dtype: str | None, seed: int) -> None:
    """Made-up features for a graph without any: one-hot log-degree buckets, or seeded Gaussian noise."""
    n = w.num_nodes
    if features == "degree":
        w.write_features(degree_features(np.diff(w.indptr), feature_dim), dtype=feature_dtype)
    elif features == "random":
        rng = np.random.default_rng(seed)
        w.write_features(
            (rng.standard_normal((min(FEATURE_BLOCK_ROWS, n - a), feature_dim), dtype=np.float32)
             for a in range(0, n, FEATURE_BLOCK_ROWS)),
            dtype=feature_dtype or "float32",
        )
