"""OGB's binary node-property layout (ogbn-papers100M) to a dataset directory, streamed.

Layout, as ``ogb/io/save_dataset.py`` writes it and ``read_binary_graph_raw`` reads it
(both with ``np.savez_compressed``, so every member is deflated)::

    <dir>/raw/data.npz        edge_index.npy      [2, E] int64, row 0 sources, row 1 targets
                              num_nodes_list.npy  [1] int64 (one graph)
                              num_edges_list.npy  [1] int64
                              node_feat.npy       [N, F] float32             (optional)
                              node_year.npy       [N, 1] int64               (not imported)
    <dir>/raw/node-label.npz  node_label.npy      [N, 1] float, NaN = unlabelled
    <dir>/split/<scheme>/{train,valid,test}.csv.gz   node ids, one per line (papers100M: time)

For papers100M that is 2 x 1.6 B int64 edges (26 GB) and 111 M x 128 float32
features (57 GB) inside zip members, which ``np.load`` would decompress whole.
Here every member is read as a stream (:mod:`training.importers._npystream`):
the two rows of ``edge_index`` by two aligned streams over the member (one
from its start, one from its middle), features block by block into the
dataset's feature file with ``pwrite``, labels block by block. Memory: a few
chunks, plus the per-node arrays the CSR build needs (int64 x N each, see
:mod:`training.csr`) and the labels (int64 x N) -- none of it grows with the
number of edges. The CSR build reads the edges twice (a counting pass and a
filling pass), so a compressed ``edge_index`` is decompressed 1.5 times a pass
(the target stream decompresses the source row to get to its start).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.progress import Progress
from training.data import DEFAULT_CHUNK_EDGES, DatasetError
from training.importers._npystream import NpyMember, iter_items, members, read_whole
from training.importers._text import DEFAULT_CHUNK_BYTES
from training.importers.ogb_splits import read_splits
from training.writer import DatasetWriter

DATA_FILE = "data.npz"
LABEL_FILE = "node-label.npz"


def _member(found: dict[str, NpyMember], key: str, path: Path) -> NpyMember:
    if key not in found:
        raise DatasetError(f"{path}: no {key}.npy member (has: {', '.join(sorted(found)) or 'none'}); "
                           "not an OGB binary dataset file")
    return found[key]


def _edge_member(found: dict[str, NpyMember], path: Path) -> NpyMember:
    m = _member(found, "edge_index", path)
    if len(m.shape) != 2 or m.shape[0] != 2:
        raise DatasetError(f"{m.where}: shape {list(m.shape)}, expected [2, E] (OGB's edge_index)")
    if m.dtype.kind not in "iu":
        raise DatasetError(f"{m.where}: dtype {m.dtype}, expected integer node ids")
    counts = read_whole(_member(found, "num_edges_list", path)).ravel()
    if counts.size != 1 or int(counts[0]) != m.shape[1]:
        raise DatasetError(f"{path}: num_edges_list says {counts.tolist()}, edge_index has {m.shape[1]:,} "
                           "edges of one graph; the file is inconsistent, download it again")
    return m


def _num_nodes(found: dict[str, NpyMember], path: Path) -> int:
    counts = read_whole(_member(found, "num_nodes_list", path)).ravel()
    if counts.size != 1:
        raise DatasetError(f"{path}: num_nodes_list holds {counts.size} graphs; a node-property dataset has one")
    return int(counts[0])


def edge_chunks(m: NpyMember, n: int, chunk_edges: int):
    """A callable yielding ``(src, dst)`` chunks of ``edge_index`` afresh per call, ids checked against ``n``."""
    e = m.shape[1]

    def pairs():
        if m.fortran_order:  # [2, E] in Fortran order: (src, dst) pairs interleaved
            for flat in iter_items(m, chunk_items=2 * chunk_edges):
                two = flat.reshape(-1, 2)
                yield two[:, 0], two[:, 1]
        else:  # row 0 then row 1: one stream per row, kept in step
            yield from zip(iter_items(m, 0, e, chunk_items=chunk_edges),
                           iter_items(m, e, 2 * e, chunk_items=chunk_edges), strict=True)

    def chunks():
        done = 0
        for s, d in pairs():
            lo, hi = min(int(s.min()), int(d.min())), max(int(s.max()), int(d.max()))
            if lo < 0 or hi >= n:
                raise DatasetError(f"{m.where}: edges {done:,}..: node id {lo if lo < 0 else hi} outside "
                                   f"[0, {n:,}) (num_nodes_list says {n:,} nodes)")
            done += s.size
            yield s, d

    return chunks


def write_features(w: DatasetWriter, m: NpyMember, dtype: str | None, chunk_bytes: int,
                   progress: Progress | None) -> None:
    """``node_feat`` into the writer's feature file, block by block (``pwrite``: nothing stays resident).

    Raises
    ------
    DatasetError
        The features are not one row per node, or are Fortran-ordered.
    """
    n = w.num_nodes
    if len(m.shape) != 2 or m.shape[0] != n:
        raise DatasetError(f"{m.where}: shape {list(m.shape)}, expected [{n:,}, F] (one row per node)")
    if m.fortran_order:
        raise DatasetError(f"{m.where}: stored in Fortran (column) order; re-save it in C order "
                           "(np.ascontiguousarray) to import it in bounded memory")
    f = m.shape[1]
    w.open_features(f, dtype or m.dtype)
    rows = max(1, chunk_bytes // max(1, f * m.dtype.itemsize))
    row = 0
    for flat in iter_items(m, chunk_items=rows * f):
        block = flat.reshape(-1, f)
        w.write_feature_rows(row, block)
        row += block.shape[0]
        if progress is not None:
            progress("copying features", row, n)


def read_labels(path: Path, n: int, chunk_items: int, progress: Progress | None) -> np.ndarray:
    """``node-label.npz``'s ``node_label`` as int64 [n] (NaN or negative -> -1), read block by block.

    Raises
    ------
    DatasetError
        The labels are not one class per node.
    """
    m = _member(members(path), "node_label", path)
    if m.shape not in ((n,), (n, 1)):
        raise DatasetError(f"{m.where}: shape {list(m.shape)}, expected [{n:,}, 1] (one class per node)")
    out = np.empty(n, dtype=np.int64)
    row = 0
    for block in iter_items(m, chunk_items=chunk_items):
        lab = block.astype(np.float64, copy=False)
        out[row : row + block.size] = np.where(np.isfinite(lab) & (lab >= 0), lab, -1)
        row += block.size
        if progress is not None:
            progress("reading labels", row, n)
    return out


def import_ogb_binary(
    src: Path,
    dst: Path,
    *,
    name: str | None,
    undirected: bool,
    split_name: str | None,
    feature_dtype: str | None,
    overwrite: bool,
    progress: Progress | None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    chunk_edges: int = DEFAULT_CHUNK_EDGES,
) -> Path:
    """Convert the OGB binary directory ``src`` (``raw/data.npz``) into the dataset directory ``dst``."""

    data_path, label_path = src / "raw" / DATA_FILE, src / "raw" / LABEL_FILE
    found = members(data_path)
    edges = _edge_member(found, data_path)
    n = _num_nodes(found, data_path)
    feat = found.get("node_feat")
    split_name, splits = read_splits(src / "split", split_name, n, chunk_bytes)
    labels = read_labels(label_path, n, chunk_edges, progress) if label_path.exists() else None
    source = {"format": "ogb", "layout": "binary (raw/data.npz)", "path": str(src.resolve()),
              "undirected": bool(undirected), "split": split_name, "edge_rows": int(edges.shape[1]),
              "compressed": edges.file_offset is None,
              "not_imported": sorted(k for k in found if k not in
                                     ("edge_index", "num_nodes_list", "num_edges_list", "node_feat"))}
    with DatasetWriter(dst, num_nodes=n, name=name or src.resolve().name, source=source, overwrite=overwrite,
                       progress=progress, chunk_edges=chunk_edges) as w:
        w.write_edges(edge_chunks(edges, n, chunk_edges), undirected=bool(undirected), drop_self_loops=True,
                      dedup=True)
        if feat is not None:
            write_features(w, feat, feature_dtype, chunk_bytes, progress)
        if labels is not None:
            w.write_labels(labels, num_classes=int(labels.max()) + 1 if labels.size else 0)
        if splits:
            w.write_splits(train=splits["train_idx"], valid=splits["valid_idx"], test=splits["test_idx"])
    return dst


__all__ = ["edge_chunks", "import_ogb_binary", "read_labels", "write_features"]
