"""IGB's heterogeneous layout (IGBH: paper, author, institute, fos, ...) to a heterogeneous dataset.

Layout, as IGB's ``IGBHeteroDGLDataset`` reads it::

    <root>/<size>/processed/<type>/node_feat.npy                 [count, 1024] float32, one per node type
    <root>/<size>/processed/paper/node_label_19.npy              [papers] float (or node_label_2K.npy)
    <root>/<size>/processed/<src>__<rel>__<dst>/edge_index.npy   [E, 2] int64, rows (src, dst) local ids

``src`` may be ``<root>/<size>`` or its ``processed`` directory. Every ``a__b__c`` directory
with an ``edge_index.npy`` is a relation ``(a, b, c)``; every directory with a ``node_feat.npy``
a node type (its row count is the node count). ``reverse`` adds ``rev_<rel>`` relations, as
IGB's DGL examples do with ``dgl.AddReverse``. The split is IGB's: the first 60% of the papers
train, the next 20% valid, the rest test. The large and full sizes' headerless raw arrays are
read as IGB's homogeneous importer reads them (:mod:`training.importers.igb`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from training.data import DatasetError
from training.hetero.graph import HeteroGraph, add_reverse
from training.hetero.store import write_hetero
from training.importers.igb import IGB_FEATURE_DIM, _array, _labels

#: IGB's label files by class count
LABEL_FILES = {19: "node_label_19.npy", 2983: "node_label_2K.npy"}


def _processed(src: Path) -> Path:
    for cand in (src, src / "processed"):
        if (cand / "paper" / "node_feat.npy").exists():
            return cand
    raise DatasetError(f"{src}: no processed/paper/node_feat.npy; not IGB's heterogeneous layout")


def read_igbh(src: str | Path, *, num_classes: int = 19, reverse: bool = True) -> HeteroGraph:
    """Read IGB's heterogeneous directory ``src`` into a :class:`HeteroGraph` (features memory-mapped).

    Raises
    ------
    DatasetError
        ``src`` is not the layout, ``num_classes`` is not 19 or 2983, a relation names a type
        without ``node_feat.npy``, or an edge file is not ``[E, 2]``.
    """
    if num_classes not in LABEL_FILES:
        raise DatasetError(f"`num_classes` is {num_classes}; IGB labels papers with 19 or 2983 classes")
    proc = _processed(Path(src))
    features = {d.name: _array(d / "node_feat.npy", f"{d.name} features", raw_dtype="float32",
                               raw_cols=IGB_FEATURE_DIM)
                for d in sorted(proc.iterdir(), key=lambda d: (d.name != "paper", d.name))
                if (d / "node_feat.npy").exists()}
    counts = {t: int(x.shape[0]) for t, x in features.items()}
    edges = {}
    for d in sorted(proc.iterdir()):
        parts = d.name.split("__")
        if len(parts) != 3 or not (d / "edge_index.npy").exists():
            continue
        for end in (parts[0], parts[2]):
            if end not in counts:
                raise DatasetError(f"{d}: names node type {end!r}, which has no {proc / end / 'node_feat.npy'}")
        e = np.load(d / "edge_index.npy", mmap_mode="r", allow_pickle=False)
        if e.ndim != 2 or e.shape[1] != 2:
            raise DatasetError(f"{d / 'edge_index.npy'}: shape {list(e.shape)}, expected [E, 2]")
        edges[(parts[0], parts[1], parts[2])] = np.ascontiguousarray(e.T, dtype=np.int64)
    n = counts["paper"]
    labels = _labels(_array(proc / "paper" / LABEL_FILES[num_classes], "paper labels", raw_dtype="float32"), n, None)
    a, b = int(n * 0.6), int(n * 0.6) + int(n * 0.2)
    splits = {"train_idx": np.arange(a), "valid_idx": np.arange(a, b), "test_idx": np.arange(b, n)}
    graph = HeteroGraph(counts, edges, features, "paper", labels, num_classes, splits)
    return add_reverse(graph) if reverse else graph


def import_igbh(src: str | Path, dst: str | Path, *, num_classes: int = 19, reverse: bool = True,
                overwrite: bool = False) -> Path:
    """Convert IGB's heterogeneous directory ``src`` into the heterogeneous dataset ``dst``; returns ``dst``.

    Raises
    ------
    DatasetError
        As :func:`read_igbh` and :func:`training.hetero.store.write_hetero` list.
    """
    graph = read_igbh(src, num_classes=num_classes, reverse=reverse)
    return write_hetero(dst, graph, name=Path(src).name, overwrite=overwrite,
                        source={"format": "igb-hetero", "path": str(src), "num_classes": num_classes,
                                "reverse": reverse})


__all__ = ["LABEL_FILES", "import_igbh", "read_igbh"]
