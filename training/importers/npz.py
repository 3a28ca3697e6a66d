"""gnn-benchmark ``.npz`` (Shchur et al. 2018) to a dataset directory.

Two layouts are read (``SHCHUR_NPZ_FORMAT.md`` in the fixtures): the original flat
one (``adj_data, adj_indices, adj_indptr, adj_shape``, ``attr_*``, ``labels``; no
pickles) and the GraphGallery re-packaging (``adj_matrix``, ``node_attr``,
``node_label`` as pickled scipy matrices, read with the restricted unpickler).

By default the graph is standardised as in the Shchur protocol: undirected,
unweighted, without self-loops (``directed=True`` keeps the raw direction).
``lcc=True`` keeps only the largest connected component. The split is random and
seeded: ``train_per_class`` and ``valid_per_class`` labelled nodes of every class,
all other labelled nodes are test (20 / 30 / rest by default).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from planner.progress import Progress
from training.data import DatasetError
from training.importers._safepickle import list_npz_keys, npz_member
from training.writer import DatasetWriter

#: rows of the feature matrix densified at a time
FEATURE_BLOCK_ROWS = 1 << 14


def detect(src: Path) -> bool:
    if not (src.is_file() and zipfile.is_zipfile(src)):
        return False
    with zipfile.ZipFile(src) as zf:
        keys = set(list_npz_keys(zf))
    return bool({"adj_data", "adj_matrix"} & keys)


def _sparse(zf: zipfile.ZipFile, src: Path, prefix: str, packed: str) -> sp.csr_matrix | None:
    keys = set(list_npz_keys(zf))
    if f"{prefix}_data" in keys:
        parts = [npz_member(zf, f"{prefix}_{k}", src) for k in ("data", "indices", "indptr", "shape")]
        try:
            return sp.csr_matrix(tuple(parts[:3]), shape=tuple(int(x) for x in parts[3]))
        except (ValueError, TypeError) as exc:
            raise DatasetError(
                f"{src}: {prefix}_data/indices/indptr/shape do not form a sparse matrix ({exc})"
            ) from None
    if f"{prefix}_matrix" in keys and prefix == "attr":  # dense attributes in some gnn-benchmark files
        return sp.csr_matrix(np.asarray(npz_member(zf, "attr_matrix", src)))
    if packed in keys:
        obj = npz_member(zf, packed, src)
        if hasattr(obj, "tocsr"):
            return obj.tocsr()
        if isinstance(obj, np.ndarray) and obj.ndim == 2:
            return sp.csr_matrix(obj)
        raise DatasetError(f"{src}: key {packed!r} holds a {type(obj).__name__}, expected a sparse matrix")
    return None


def _random_split(labels: np.ndarray, train_per_class: int, valid_per_class: int, seed: int, src: Path):
    if train_per_class < 0 or valid_per_class < 0:
        raise DatasetError(f"`train_per_class` {train_per_class} / `valid_per_class` {valid_per_class}: "
                           "expected 0 or more nodes per class")
    rng = np.random.default_rng(seed)
    train, valid = [], []
    for c in range(int(labels.max()) + 1 if labels.size else 0):
        members = np.flatnonzero(labels == c)
        need = train_per_class + valid_per_class
        if members.size < need:
            raise DatasetError(
                f"{src}: class {c} has {members.size} nodes, fewer than the {need} a "
                f"{train_per_class}/{valid_per_class} split needs; lower `train_per_class`/`valid_per_class`"
            )
        pick = rng.choice(members, size=need, replace=False)
        train.append(pick[:train_per_class])
        valid.append(pick[train_per_class:])
    train = np.sort(np.concatenate(train)) if train else np.zeros(0, np.int64)
    valid = np.sort(np.concatenate(valid)) if valid else np.zeros(0, np.int64)
    taken = np.zeros(labels.size, dtype=bool)
    taken[train] = taken[valid] = True
    test = np.flatnonzero(~taken & (labels >= 0))
    return train.astype(np.int64), valid.astype(np.int64), test.astype(np.int64)


def import_npz(
    src: str | Path,
    dst: str | Path,
    *,
    name: str | None = None,
    directed: bool = False,
    lcc: bool = False,
    split: str = "random",
    train_per_class: int = 20,
    valid_per_class: int = 30,
    seed: int = 0,
    feature_dtype: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Convert a gnn-benchmark ``.npz`` file ``src`` into the dataset directory ``dst``.

    ``split`` is ``"random"`` (seeded per-class split) or ``"none"``. Returns ``dst``.
    """
    src, dst = Path(src), Path(dst)
    adj, attr, labels, keys = _read(src)
    n = adj.shape[0]
    adj = adj.tocoo()
    row, col = adj.row.astype(np.int64), adj.col.astype(np.int64)
    if lcc:
        row, col, attr, labels, n = _largest_component(row, col, attr, labels, n)
    source = {
        "format": "npz", "path": str(src.resolve()), "layout": "flat" if "adj_data" in keys else "graphgallery",
        "raw_adjacency_entries": int(adj.nnz), "standardised": not directed,
        "largest_connected_component": bool(lcc), "nodes_before_lcc": int(adj.shape[0]),
    }
    if labels is not None and split == "random":
        train, valid, test = _random_split(labels, train_per_class, valid_per_class, seed, src)
        source["split"] = {"kind": "random per class", "train_per_class": train_per_class,
                           "valid_per_class": valid_per_class, "seed": seed}
    elif split not in ("random", "none"):
        raise DatasetError(f"`split` {split!r}: expected 'random' or 'none'")
    else:
        train = valid = test = None
    with DatasetWriter(dst, num_nodes=n, name=name or src.stem, source=source, overwrite=overwrite,
                       progress=progress) as w:
        # the adjacency entry (i, j) is an edge i -> j: j aggregates from i (as in PyG)
        w.write_edges((row, col), undirected=not directed, drop_self_loops=True, dedup=True)
        if attr is not None:
            attr = attr.tocsr()
            w.write_features(
                (attr[a : a + FEATURE_BLOCK_ROWS].toarray() for a in range(0, n, FEATURE_BLOCK_ROWS)),
                dtype=feature_dtype or ("float32" if attr.dtype.kind == "f" else attr.dtype),
            )
        if labels is not None:
            w.write_labels(labels, num_classes=int(labels.max()) + 1 if labels.size else 0)
        if train is not None:
            w.write_splits(train=train, valid=valid, test=test)
    return dst


def _read(src: Path) -> tuple[Any, Any, np.ndarray | None, set[str]]:
    """The file's adjacency (scipy sparse), attributes (sparse or None), labels (int64 or None) and its keys."""
    try:
        zf = zipfile.ZipFile(src)
    except FileNotFoundError:
        raise DatasetError(f"{src}: no such file") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise DatasetError(f"{src}: not an .npz (zip) file ({exc}); the file is truncated or not this format") from None
    with zf:
        adj = _sparse(zf, src, "adj", "adj_matrix")
        if adj is None:
            raise DatasetError(
                f"{src}: no adjacency (expected keys adj_data/adj_indices/adj_indptr/adj_shape or adj_matrix; "
                f"found {', '.join(list_npz_keys(zf))})"
            )
        attr = _sparse(zf, src, "attr", "node_attr")
        keys = set(list_npz_keys(zf))
        if "labels_data" in keys:
            raise DatasetError(f"{src}: multi-label (sparse) labels are not supported; only one class per node")
        lab_key = "labels" if "labels" in keys else "node_label" if "node_label" in keys else None
        labels = None if lab_key is None else np.asarray(npz_member(zf, lab_key, src)).astype(np.int64).ravel()
    n = adj.shape[0]
    if adj.shape[0] != adj.shape[1]:
        raise DatasetError(f"{src}: adjacency is {adj.shape[0]}x{adj.shape[1]}, expected square")
    if attr is not None and attr.shape[0] != n:
        raise DatasetError(f"{src}: attributes have {attr.shape[0]} rows, the graph {n} nodes")
    if labels is not None and labels.shape[0] != n:
        raise DatasetError(f"{src}: {lab_key} has {labels.shape[0]} entries, the graph {n} nodes")
    return adj, attr, labels, keys


def _largest_component(row: np.ndarray, col: np.ndarray, attr: Any, labels: np.ndarray | None, n: int):
    """The edges, attributes and labels of the largest weakly connected component, renumbered; its size."""
    from scipy.sparse.csgraph import connected_components

    sym = sp.csr_matrix((np.ones(row.size), (row, col)), shape=(n, n))
    _, comp = connected_components(sym, directed=True, connection="weak")
    keep = np.flatnonzero(comp == np.bincount(comp).argmax())
    new_id = np.full(n, -1, dtype=np.int64)
    new_id[keep] = np.arange(keep.size)
    m = (new_id[row] >= 0) & (new_id[col] >= 0)
    return (new_id[row[m]], new_id[col[m]], None if attr is None else attr[keep],
            None if labels is None else labels[keep], int(keep.size))
