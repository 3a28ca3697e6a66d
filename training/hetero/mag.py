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
files are read in memory (one relation at a time); features in blocks.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from training.data import DatasetError
from training.hetero.graph import HeteroGraph, add_reverse
from training.hetero.store import write_hetero
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
    with open_binary(path) as f:
        first = f.readline().decode().strip()
    ncols = len(first.split(",")) if first else 1
    parts = list(iter_rows(path, ncols=ncols, dtype=dtype, delimiter=",", chunk_bytes=chunk_bytes))
    return np.concatenate(parts) if parts else np.zeros((0, ncols), dtype)


def read_ogb_hetero(src: str | Path, *, split_name: str | None = None, reverse: bool = True,
                    chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> HeteroGraph:
    """Read OGB's heterogeneous raw directory ``src`` (see the module docstring) into a :class:`HeteroGraph`.

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
    edges = {}
    for row in _csv_rows(trip_file):
        if len(row) != 3:
            raise DatasetError(f"{trip_file}: row {row} is not 'src,rel,dst'")
        key = (row[0], row[1], row[2])
        efile = raw_file(raw / "relations" / "___".join(key), "edge")
        if efile is None:
            raise DatasetError(f"{raw / 'relations' / '___'.join(key)}: edge.csv.gz is missing")
        edges[key] = _table(efile, np.int64, chunk_bytes).T.reshape(2, -1)
    features = {}
    for t in counts:
        f = raw_file(raw / "node-feat" / t, "node-feat")
        if f is not None:
            x = _table(f, np.float32, chunk_bytes)
            features[t] = x
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
    graph = HeteroGraph(counts, edges, features, target, labels, num_classes, splits)
    return add_reverse(graph) if reverse else graph


def import_ogb_hetero(src: str | Path, dst: str | Path, *, split_name: str | None = None, reverse: bool = True,
                      overwrite: bool = False, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Path:
    """Convert OGB's heterogeneous raw directory ``src`` into the heterogeneous dataset ``dst``; returns ``dst``.

    Raises
    ------
    DatasetError
        As :func:`read_ogb_hetero` and :func:`training.hetero.store.write_hetero` list.
    """
    graph = read_ogb_hetero(src, split_name=split_name, reverse=reverse, chunk_bytes=chunk_bytes)
    return write_hetero(dst, graph, name=Path(src).name, overwrite=overwrite,
                        source={"format": "ogb-hetero", "path": str(src), "split": split_name, "reverse": reverse})


__all__ = ["import_ogb_hetero", "read_ogb_hetero"]
