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

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np

from planner.progress import Progress
from training.data import DEFAULT_CHUNK_EDGES, DatasetError
from training.hetero.schema import EdgeType
from training.hetero.store import FeatureBlocks, array_blocks
from training.hetero.stream import EdgeChunks, HeteroSource, add_reverse_chunks, write_hetero_stream
from training.importers.igb import IGB_FEATURE_DIM, _array, _labels

#: IGB's label files by the ``classes`` option (as the homogeneous importer spells it): (class count, file)
LABEL_FILES = {"19": (19, "node_label_19.npy"), "2K": (2983, "node_label_2K.npy")}


def _processed(src: Path) -> Path:
    for cand in (src, src / "processed"):
        if (cand / "paper" / "node_feat.npy").exists():
            return cand
    raise DatasetError(f"{src}: no processed/paper/node_feat.npy; not IGB's heterogeneous layout")


def detect(src: Path) -> bool:
    """IGB's heterogeneous layout: ``paper/node_feat.npy`` and another type's ``node_feat.npy`` under
    ``processed`` (the homogeneous IGB has papers only)."""
    for cand in (src, src / "processed"):
        if (cand / "paper" / "node_feat.npy").exists():
            return any((d / "node_feat.npy").exists() for d in cand.iterdir() if d.name != "paper")
    return False


def _edges(e: np.ndarray, chunk_edges: int) -> EdgeChunks:
    """A memory-mapped ``[E, 2]`` edge array as chunks of ``chunk_edges`` rows."""
    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for a in range(0, e.shape[0], chunk_edges):
            b = np.asarray(e[a:a + chunk_edges])
            yield b[:, 0], b[:, 1]
    return gen


def igbh_source(src: str | Path, *, classes: str = "19", reverse: bool = True, feature_dtype: str | None = None,
                chunk_edges: int = DEFAULT_CHUNK_EDGES) -> HeteroSource:
    """IGB's heterogeneous directory ``src`` as a streamed :class:`HeteroSource` (features and edges memory-mapped,
    read in blocks when the writer asks; the paper labels converted in blocks).

    Raises
    ------
    DatasetError
        ``src`` is not the layout, ``classes`` is not 19 or 2K, a relation names a type
        without ``node_feat.npy``, or an edge file is not ``[E, 2]``.
    """
    if classes not in LABEL_FILES:
        raise DatasetError(f"`classes` is {classes!r}; IGB labels papers with 19 or 2K classes")
    num_classes, label_file = LABEL_FILES[classes]
    proc = _processed(Path(src))
    arrays = {d.name: _array(d / "node_feat.npy", f"{d.name} features", raw_dtype="float32",
                             raw_cols=IGB_FEATURE_DIM)
              for d in sorted(proc.iterdir(), key=lambda d: (d.name != "paper", d.name))
              if (d / "node_feat.npy").exists()}
    counts = {t: int(x.shape[0]) for t, x in arrays.items()}
    features: dict[str, np.ndarray | FeatureBlocks] = dict(arrays)
    if feature_dtype is not None:  # cast block by block as the writer copies them
        features = {t: FeatureBlocks(int(x.shape[1]), feature_dtype, partial(array_blocks, x))
                    for t, x in arrays.items()}
    edges: dict[EdgeType, EdgeChunks] = {}
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
        edges[(parts[0], parts[1], parts[2])] = _edges(e, chunk_edges)
    n = counts["paper"]
    labels = _labels(_array(proc / "paper" / label_file, "paper labels", raw_dtype="float32"), n, None)
    a, b = int(n * 0.6), int(n * 0.6) + int(n * 0.2)
    splits = {"train_idx": np.arange(a), "valid_idx": np.arange(a, b), "test_idx": np.arange(b, n)}
    return HeteroSource(counts, add_reverse_chunks(edges) if reverse else edges, features, "paper", labels,
                        num_classes, splits)


def import_igbh(src: str | Path, dst: str | Path, *, name: str | None = None, classes: str = "19",
                reverse: bool = True, feature_dtype: str | None = None, overwrite: bool = False,
                progress: Progress | None = None, chunk_edges: int = DEFAULT_CHUNK_EDGES) -> Path:
    """Convert IGB's heterogeneous directory ``src`` into the heterogeneous dataset ``dst``; returns ``dst``.

    Streamed (:func:`training.hetero.stream.write_hetero_stream`): no relation is held whole.

    Raises
    ------
    DatasetError
        As :func:`igbh_source` and :func:`training.hetero.stream.write_hetero_stream` list.
    """
    source = igbh_source(src, classes=classes, reverse=reverse, feature_dtype=feature_dtype, chunk_edges=chunk_edges)
    return write_hetero_stream(dst, source, name=name or Path(src).name, overwrite=overwrite, progress=progress,
                               chunk_edges=chunk_edges,
                               meta_source={"format": "igb-hetero", "path": str(src), "classes": classes,
                                            "reverse": reverse})


__all__ = ["LABEL_FILES", "detect", "igbh_source", "import_igbh"]
