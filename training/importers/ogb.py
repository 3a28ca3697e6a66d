"""OGB node-property-prediction directories (``ogbn-*``) to a dataset directory.

Layout (OGB's ``ogb/io/README.md``)::

    <dir>/raw/edge.csv.gz           E rows "src,dst" (one direction per pair for undirected graphs)
    <dir>/raw/num-node-list.csv.gz  the node count (one line)
    <dir>/raw/node-feat.csv.gz      N rows of F floats                 (optional)
    <dir>/raw/node-label.csv.gz     N rows of one class id ("nan" = unlabelled)
    <dir>/split/<scheme>/{train,valid,test}.csv[.gz]   node ids, one per line

Every file is parsed in blocks (``training.importers._text``), so memory is
bounded by the block and the per-node arrays, not the edge count. An edge
``src,dst`` means ``dst`` aggregates from ``src`` (as PyG's ``edge_index``).
OGB adds the reverse edges itself for the datasets whose ``master.csv`` says
``add_inverse_edge`` (ogbn-products, ogbn-proteins); ``undirected=None`` does the
same by the directory name, ``True``/``False`` decide explicitly.
Heterogeneous datasets (ogbn-mag) are not supported.

The binary layout OGB ships for ogbn-papers100M (``raw/data.npz``,
``raw/node-label.npz``) is read by :mod:`training.importers.ogb_binary`, as
streams, when the directory has no ``raw/edge.csv.gz``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.progress import Progress
from training.data import DEFAULT_CHUNK_EDGES, DatasetError
from training.importers._text import DEFAULT_CHUNK_BYTES, iter_rows
from training.importers.ogb_splits import raw_file, read_splits
from training.writer import DatasetWriter

#: ogbn datasets whose raw edge list holds one direction per pair (OGB master.csv, add_inverse_edge)
INVERSE_EDGE_DATASETS = ("ogbn_products", "ogbn_proteins")



def detect(src: Path) -> bool:
    return src.is_dir() and (raw_file(src / "raw", "edge") is not None or (src / "raw" / "data.npz").is_file())



def import_ogb(
    src: str | Path,
    dst: str | Path,
    *,
    name: str | None = None,
    undirected: bool | None = None,
    split_name: str | None = None,
    feature_dtype: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    chunk_edges: int = DEFAULT_CHUNK_EDGES,
) -> Path:
    """Convert the OGB node-property directory ``src`` into the dataset directory ``dst``. Returns ``dst``."""
    src, dst = Path(src), Path(dst)
    raw = src / "raw"
    edge_file = raw_file(raw, "edge")
    if (raw / "relations").is_dir() or raw_file(raw, "triplet-type-list") is not None:
        raise DatasetError(f"{src}: a heterogeneous OGB dataset (e.g. ogbn-mag); only homogeneous graphs are supported")
    if undirected is None:
        undirected = src.resolve().name.replace("-", "_") in INVERSE_EDGE_DATASETS
    if edge_file is None and (raw / "data.npz").is_file():
        from training.importers.ogb_binary import import_ogb_binary

        return import_ogb_binary(src, dst, name=name, undirected=undirected, split_name=split_name,
                                 feature_dtype=feature_dtype, overwrite=overwrite, progress=progress,
                                 chunk_bytes=chunk_bytes, chunk_edges=chunk_edges)
    if edge_file is None:
        raise DatasetError(f"{src}: neither raw/edge.csv.gz nor raw/data.npz; not an OGB node-property "
                           "dataset directory (point at the directory that holds raw/ and split/)")
    feat_file, label_file = raw_file(raw, "node-feat"), raw_file(raw, "node-label")
    n = _num_nodes(raw, edge_file, feat_file or label_file, chunk_bytes)
    rows = [0]

    def edge_chunks():
        rows[0] = 0
        for a in iter_rows(edge_file, ncols=2, dtype=np.int64, delimiter=",", exact_cols=True, chunk_bytes=chunk_bytes):
            if a.min() < 0 or a.max() >= n:
                raise DatasetError(
                    f"{edge_file}: node id {int(a.max() if a.max() >= n else a.min())} outside [0, {n}) "
                    f"(num-node-list says {n} nodes)"
                )
            rows[0] += a.shape[0]
            yield a[:, 0], a[:, 1]

    split_name, splits = read_splits(src / "split", split_name, n, chunk_bytes)
    source = {"format": "ogb", "path": str(src.resolve()), "undirected": bool(undirected), "split": split_name}
    with DatasetWriter(dst, num_nodes=n, name=name or src.resolve().name, source=source, overwrite=overwrite,
                       progress=progress) as w:
        w.write_edges(edge_chunks, undirected=bool(undirected), drop_self_loops=True, dedup=True)
        w.set_meta(source={**source, "edge_rows": rows[0]})
        if feat_file is not None:
            _write_features(w, feat_file, feature_dtype, chunk_bytes)
        if label_file is not None:
            parts = list(iter_rows(label_file, ncols=1, dtype=np.float64, delimiter=",", chunk_bytes=chunk_bytes))
            lab = np.concatenate(parts)[:, 0] if parts else np.zeros(0)
            if lab.size != n:
                raise DatasetError(f"{label_file}: {lab.size} rows, expected one per node ({n})")
            labels = np.where(np.isfinite(lab), lab, -1).astype(np.int64)
            w.write_labels(labels, num_classes=int(labels.max()) + 1 if labels.size else 0)
        if splits:
            w.write_splits(train=splits["train_idx"], valid=splits["valid_idx"], test=splits["test_idx"])
    return dst


def _feature_blocks(path: Path, chunk_bytes: int):
    """Feature rows in blocks; the width is the number of fields on the first line."""
    from training.importers._text import iter_line_blocks

    first = next(iter_line_blocks(path, chunk_bytes), None)
    if first is None:
        return
    width = len(first[1].split(b"\n", 1)[0].split(b","))
    yield from iter_rows(path, ncols=width, dtype=np.float32, delimiter=",", exact_cols=True, chunk_bytes=chunk_bytes)


def _num_nodes(raw: Path, edge_file: Path, per_node: Path | None, chunk_bytes: int) -> int:
    """``raw/num-node-list``'s one count; else the rows of a per-node file, else the largest endpoint + 1."""
    num_file = raw_file(raw, "num-node-list")
    if num_file is not None:
        counts = [int(x) for a in iter_rows(num_file, ncols=1, delimiter=",") for x in a[:, 0]]
        if len(counts) != 1:
            raise DatasetError(f"{num_file}: {len(counts)} graphs; a node-property dataset has exactly one")
        return counts[0]
    if per_node is not None:
        return sum(a.shape[0] for a in iter_rows(per_node, ncols=1, dtype=np.float64, delimiter=",",
                                                 chunk_bytes=chunk_bytes))
    return 1 + max(int(a.max()) for a in iter_rows(edge_file, ncols=2, delimiter=",", chunk_bytes=chunk_bytes))



def _write_features(w: DatasetWriter, feat_file: Path, feature_dtype: str | None, chunk_bytes: int) -> None:
    """The feature rows of ``feat_file`` into the writer, block by block (one row per node)."""
    n, out, row = w.num_nodes, None, 0
    for a in _feature_blocks(feat_file, chunk_bytes):
        if out is None:
            out = w.open_features(a.shape[1], feature_dtype or "float32")
        if a.shape[1] != out.shape[1] or row + a.shape[0] > n:
            raise DatasetError(f"{feat_file}: rows must have {out.shape[1]} values and there must be {n} rows")
        out[row : row + a.shape[0]] = a
        row += a.shape[0]
    if row != n:
        raise DatasetError(f"{feat_file}: {row} rows, expected one per node ({n})")
