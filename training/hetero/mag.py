"""OGB's heterogeneous raw layout (ogbn-mag) to a heterogeneous dataset directory.

Layout (OGB's ``read_csv_heterograph_raw``)::

    <dir>/raw/num-node-dict.csv.gz        header: the node types; one row: their counts
    <dir>/raw/triplet-type-list.csv.gz    rows "src,rel,dst"
    <dir>/raw/relations/<src>___<rel>___<dst>/edge.csv.gz     rows "src_id,dst_id" (local ids)
    <dir>/raw/node-feat/<type>/node-feat.csv.gz               rows of F numbers (paper only in MAG)
    <dir>/raw/nodetype-has-label.csv.gz   header: the node types; one row: True/False
    <dir>/raw/node-label/<type>/node-label.csv.gz             one class id per row
    <dir>/split/<scheme>/<type>/{train,valid,test}.csv.gz     local ids of the labelled type

Node types keep ``num-node-dict``'s column order as id ranges. ``reverse`` adds PyG's
``rev_<rel>`` relations (what PyG's ``OGB_MAG(transform=ToUndirected())`` trains on). Edge
and feature files are read in blocks of text as the streamed writer asks for them (an edge file
twice: counting, then placing); only the target type's labels and splits are held whole.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np

from planner.progress import Progress
from training.data import DEFAULT_CHUNK_EDGES, DatasetError
from training.hetero.schema import EdgeType
from training.hetero.store import FeatureBlocks
from training.hetero.stream import EdgeChunks, HeteroSource, add_reverse_chunks, write_hetero_stream
from training.importers._text import DEFAULT_CHUNK_BYTES, iter_rows, open_binary
from training.importers.ogb_splits import raw_file, read_splits


def _csv_rows(path: Path) -> list[list[str]]:
    with open_binary(path) as f:
        return [r for r in csv.reader(io.TextIOWrapper(f, encoding="utf-8")) if r]


def _header_table(raw: Path, stem: str) -> dict[str, str]:
    p = raw_file(raw, stem)
    if p is None:
        raise DatasetError(f"{raw}: {stem}.csv.gz is missing; not OGB's heterogeneous raw layout")
    rows = _csv_rows(p)
    if len(rows) < 2 or len(rows[0]) != len(rows[1]):
        raise DatasetError(f"{p}: expected a header of node types and one row of values")
    return dict(zip(rows[0], rows[1], strict=True))


def _table(path: Path, dtype, chunk_bytes: int) -> np.ndarray:
    """A whole small table (labels: one value a node of one type)."""
    parts = list(iter_rows(path, ncols=_ncols(path), dtype=dtype, delimiter=",", chunk_bytes=chunk_bytes))
    return np.concatenate(parts) if parts else np.zeros((0, 1), dtype)


def _ncols(path: Path) -> int:
    with open_binary(path) as f:
        first = f.readline().decode().strip()
    return len(first.split(",")) if first else 1


def _edges(path: Path, chunk_bytes: int) -> EdgeChunks:
    """``edge.csv.gz``'s ``src,dst`` rows as chunks of one block of text each (read afresh per call)."""
    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for b in iter_rows(path, ncols=2, dtype=np.int64, delimiter=",", chunk_bytes=chunk_bytes):
            yield b[:, 0], b[:, 1]
    return gen


def ogb_hetero_source(src: str | Path, *, split_name: str | None = None, reverse: bool = True,
                      feature_dtype: str | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> HeteroSource:
    """OGB's heterogeneous raw directory ``src`` (see the module docstring) as a streamed :class:`HeteroSource`:
    edges and features are read in blocks of text when the writer asks; labels and splits whole.

    Raises
    ------
    DatasetError
        A required file is missing or malformed, or several split schemes exist and
        ``split_name`` picks none.
    """
    src = Path(src)
    raw = src / "raw"
    try:
        counts = {t: int(n) for t, n in _header_table(raw, "num-node-dict").items()}
    except ValueError:
        raise DatasetError(f"{raw}/num-node-dict.csv.gz: counts must be integers") from None
    trip_file = raw_file(raw, "triplet-type-list")
    if trip_file is None:
        raise DatasetError(f"{raw}: triplet-type-list.csv.gz is missing; not OGB's heterogeneous raw layout")
    edges: dict[EdgeType, EdgeChunks] = {}
    for row in _csv_rows(trip_file):
        if len(row) != 3:
            raise DatasetError(f"{trip_file}: row {row} is not 'src,rel,dst'")
        key = (row[0], row[1], row[2])
        efile = raw_file(raw / "relations" / "___".join(key), "edge")
        if efile is None:
            raise DatasetError(f"{raw / 'relations' / '___'.join(key)}: edge.csv.gz is missing")
        edges[key] = _edges(efile, chunk_bytes)
    features: dict[str, np.ndarray | FeatureBlocks] = {}
    for t in counts:
        f = raw_file(raw / "node-feat" / t, "node-feat")
        if f is not None:
            ncols = _ncols(f)
            features[t] = FeatureBlocks(ncols, feature_dtype or "float32", partial(
                iter_rows, f, ncols=ncols, dtype=np.float32, delimiter=",", chunk_bytes=chunk_bytes))
    has_label = raw_file(raw, "nodetype-has-label")
    labelled = [t for t, v in _header_table(raw, "nodetype-has-label").items() if v.strip().lower() == "true"] \
        if has_label is not None else []
    target = labelled[0] if labelled else None
    labels, num_classes = None, 0
    splits: dict[str, np.ndarray] = {}
    if target is not None:
        lfile = raw_file(raw / "node-label" / target, "node-label")
        if lfile is None:
            raise DatasetError(f"{raw / 'node-label' / target}: node-label.csv.gz is missing")
        labels = _table(lfile, np.float64, chunk_bytes)[:, 0]
        labels = np.where(np.isnan(labels), -1, labels).astype(np.int64)
        num_classes = int(labels.max()) + 1 if labels.size else 0
        _, splits = read_splits(src / "split", split_name, counts[target], chunk_bytes, node_type=target)
    return HeteroSource(counts, add_reverse_chunks(edges) if reverse else edges, features, target, labels,
                        num_classes, splits)


def detect(src: Path) -> bool:
    """OGB's heterogeneous raw layout: ``raw/num-node-dict.csv(.gz)`` and ``raw/triplet-type-list.csv(.gz)``."""
    raw = src / "raw"
    return src.is_dir() and raw_file(raw, "num-node-dict") is not None and raw_file(
        raw, "triplet-type-list") is not None


def import_ogb_hetero(src: str | Path, dst: str | Path, *, name: str | None = None, split_name: str | None = None,
                      reverse: bool = True, feature_dtype: str | None = None, overwrite: bool = False,
                      progress: Progress | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                      chunk_edges: int = DEFAULT_CHUNK_EDGES) -> Path:
    """Convert OGB's heterogeneous raw directory ``src`` into the heterogeneous dataset ``dst``; returns ``dst``.

    Streamed (:func:`training.hetero.stream.write_hetero_stream`): every edge file is read twice
    in blocks, never whole.

    Raises
    ------
    DatasetError
        As :func:`ogb_hetero_source` and :func:`training.hetero.stream.write_hetero_stream` list.
    """
    source = ogb_hetero_source(src, split_name=split_name, reverse=reverse, feature_dtype=feature_dtype,
                               chunk_bytes=chunk_bytes)
    return write_hetero_stream(dst, source, name=name or Path(src).name, overwrite=overwrite, progress=progress,
                               chunk_edges=chunk_edges,
                               meta_source={"format": "ogb-hetero", "path": str(src), "split": split_name,
                                            "reverse": reverse})


__all__ = ["detect", "import_ogb_hetero", "ogb_hetero_source"]
