"""An edge-split dataset on disk: a dataset directory whose graph is the training graph, with its edge splits.

``moment data split-edges SRC OUT`` writes it (:func:`write_link_dataset`, reading ``SRC``'s CSR in
chunks): an ordinary dataset (``docs/dataset-format.md``; the features, labels and node splits copied
from ``SRC``) whose CSR is the training graph of :func:`training.link.edges.split_edges` (held-out edges removed in both
directions), so the sampler, the hotness and ``moment place`` work on it unchanged. Beside it, in the
same directory and under the same checksums, the pairs (int64 ``[2, k]``, row 0 sources)::

    link_train_pos.npy   link_valid_pos.npy   link_valid_neg.npy   link_test_pos.npy   link_test_neg.npy

and ``meta.json``'s ``"link"`` record (the split's parameters and counts). The validation and test
negatives are drawn once and stored, so every run and every model is scored on the same pairs.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import numpy as np

from planner.progress import Progress
from training.data import Dataset, open_dataset
from training.link.edges import LinkSplit
from training.link.edgeset import LinkSplitError
from training.link.streamsplit import split_edges_streamed
from training.writer import DatasetWriter

__all__ = ["LINK_FILES", "LinkData", "is_link_dataset", "open_link_data", "write_link_dataset"]

#: the pair files of an edge-split dataset, by split
LINK_FILES = ("train_pos", "valid_pos", "valid_neg", "test_pos", "test_neg")


def is_link_dataset(ds: Dataset) -> bool:
    """Whether ``ds`` was written by :func:`write_link_dataset`."""
    return isinstance(ds.meta.get("link"), dict)


@dataclass(frozen=True, eq=False)
class LinkData:
    """An opened edge-split dataset: the dataset (its CSR the training graph) and its pairs ``[2, k]`` int64."""

    ds: Dataset
    undirected: bool
    train_pos: np.ndarray
    valid_pos: np.ndarray
    valid_neg: np.ndarray
    test_pos: np.ndarray
    test_neg: np.ndarray

    def pairs(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The ``(positives, negatives)`` of ``"valid"`` or ``"test"``."""
        return getattr(self, f"{split}_pos"), getattr(self, f"{split}_neg")


def open_link_data(ds: Dataset) -> LinkData:
    """The edge splits of an opened dataset.

    Raises
    ------
    LinkSplitError
        ``ds`` has no edge splits (naming how to make them), or a pair file of the wrong shape.
    """
    if not is_link_dataset(ds):
        raise LinkSplitError(f"{ds.path}: not an edge-split dataset; make one with "
                             "`training.link.store.write_link_dataset`")
    arrays = {}
    files = ds.meta["files"]
    for key in LINK_FILES:
        path = ds.path / f"link_{key}.npy"
        if f"link_{key}" not in files or not path.exists():
            raise LinkSplitError(f"{path}: missing; split the edges again")
        arr = np.load(path, allow_pickle=False)
        if arr.ndim != 2 or arr.shape[0] != 2 or arr.dtype != np.int64 or \
                (arr.size and (arr.min() < 0 or arr.max() >= ds.num_nodes)):
            raise LinkSplitError(f"{path}: expected int64 [2, k] vertex ids below {ds.num_nodes}, got "
                                 f"{arr.dtype} {list(arr.shape)}; split the edges again")
        arrays[key] = arr
    link = ds.meta["link"]
    assert isinstance(link, dict)
    return LinkData(ds=ds, undirected=bool(link.get("undirected", not ds.directed)), **arrays)


def write_link_dataset(source: str | os.PathLike[str], out: str | os.PathLike[str], *, num_val: float | int = 0.05,
                       num_test: float | int = 0.1, seed: int = 0, negatives: str = "uniform",
                       neg_ratio: float = 1.0, overwrite: bool = False, chunk_edges: int = 1 << 22,
                       progress: Progress | None = None) -> tuple[Dataset, LinkSplit]:
    """Split ``source``'s edges and write the edge-split dataset ``out``.

    The split is :func:`~training.link.edges.split_edges`'s, read in chunks of ``chunk_edges`` edges
    (:func:`~training.link.streamsplit.split_edges_streamed`: the same output, without the edge list in
    memory; its large arrays are files in the output's temporary directory until written). Undirected
    datasets keep both directions of an edge in one split. Returns the dataset written and the split's
    counts (:class:`LinkSplit` with its pair arrays; the large ones read from ``out``).

    Raises
    ------
    LinkSplitError
        Shares that leave no training edges.
    DatasetError
        ``source`` is not a dataset, or ``out`` exists and ``overwrite`` is not set.
    """
    src = open_dataset(source, validate=False)
    with DatasetWriter(out, num_nodes=src.num_nodes, name=f"{src.name}-links", overwrite=overwrite,
                       progress=progress) as w:
        scratch = w.tmp_dir / ".split-scratch"
        split = split_edges_streamed(src.indptr, src.indices, scratch, undirected=not src.directed,
                                     num_val=num_val, num_test=num_test, seed=seed, negatives=negatives,
                                     neg_ratio=neg_ratio, chunk_edges=chunk_edges)
        w.write_csr(split.indptr, split.indices, directed=src.directed)
        if src.features is not None:
            w.write_features(src.features)
        if src.labels is not None:
            w.write_labels(src.labels, num_classes=src.num_classes)
        w.write_splits(train=src.train_idx, valid=src.valid_idx, test=src.test_idx)
        for key in LINK_FILES:
            arr = np.ascontiguousarray(getattr(split, key), dtype=np.int64)
            np.save(w.tmp_dir / f"link_{key}.npy", arr, allow_pickle=False)
            w.record_file(f"link_{key}", arr.dtype, arr.shape)
        w.set_meta(link={"source": str(src.path), "undirected": split.undirected, "seed": int(seed),
                         "num_val": num_val, "num_test": num_test, "negatives": negatives,
                         "neg_ratio": float(neg_ratio),
                         "counts": {k: int(getattr(split, k).shape[1]) for k in LINK_FILES}})
        del split  # its memory maps of the scratch files
        shutil.rmtree(scratch)
    ds = open_dataset(out, validate=False)
    data = open_link_data(ds)
    return ds, LinkSplit(num_nodes=ds.num_nodes, undirected=data.undirected, train_pos=data.train_pos,
                         valid_pos=data.valid_pos, test_pos=data.test_pos, valid_neg=data.valid_neg,
                         test_neg=data.test_neg, indptr=np.asarray(ds.indptr), indices=np.asarray(ds.indices))
