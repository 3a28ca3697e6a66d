"""Planetoid (``ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}``) to a dataset directory.

The graph is assembled as Kipf's ``gcn/utils.py::load_data`` and PyG's
``read_planetoid_data`` do (``PLANETOID_FORMAT.md`` in the fixtures): features
and labels are ``allx``/``ally`` followed by ``tx``/``ty`` put at the node ids of
``test.index``; the adjacency is made undirected, without duplicates or
self-loops. CiteSeer's test ids have gaps (isolated nodes with no features in
``tx``): the gaps become zero feature rows with label -1 (PyG gives them zero
rows and class 0; -1 keeps them out of every loss). The split is the public one:
train = ``range(len(y))``, valid = the next 500 ids, test = ``test.index``.

The pickles are read by a restricted unpickler (numpy / scipy / containers only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.progress import Progress
from training.data import DatasetError
from training.importers._safepickle import safe_load
from training.writer import DatasetWriter

PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")
NUM_VALID = 500


def find_name(src: Path) -> str | None:
    """The ``<name>`` of the ``ind.<name>.graph`` file in ``src``, None when there is none."""
    names = sorted(p.name[len("ind."):-len(".graph")] for p in src.glob("ind.*.graph"))
    if len(names) > 1:
        raise DatasetError(f"{src}: holds several Planetoid datasets ({', '.join(names)}); pass `dataset=NAME`")
    return names[0] if names else None


def detect(src: Path) -> bool:
    return src.is_dir() and any(src.glob("ind.*.graph"))


def _read(src: Path, name: str, part: str):
    path = src / f"ind.{name}.{part}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing; a Planetoid dataset needs "
                           f"ind.{name}.{{{','.join(PARTS)},test.index}}") from None
    obj = safe_load(data, path, encoding="latin1")
    if part == "graph":
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}: holds a {type(obj).__name__}, expected a dict of adjacency lists")
        return obj
    if part in ("y", "ty", "ally"):
        if not isinstance(obj, np.ndarray) or obj.ndim != 2:
            raise DatasetError(f"{path}: holds a {type(obj).__name__}, expected a one-hot label matrix (2-d ndarray)")
        return obj
    if not (hasattr(obj, "tocsr") or (isinstance(obj, np.ndarray) and obj.ndim == 2)):
        raise DatasetError(f"{path}: holds a {type(obj).__name__}, expected a sparse feature matrix")
    if not hasattr(obj, "tocsr"):
        return obj
    try:
        # a damaged pickle can hold index arrays that disagree with the shape: scipy's C code
        # (tocsr, toarray) then reads out of bounds and crashes the process, so check them all first
        if hasattr(obj, "check_format"):
            obj.check_format(full_check=True)
        m = obj.tocsr()
        m.check_format(full_check=True)
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        raise DatasetError(f"{path}: a damaged sparse feature matrix ({exc}); fetch the file again") from None
    return m


def _test_index(src: Path, name: str) -> np.ndarray:
    path = src / f"ind.{name}.test.index"
    try:
        lines = path.read_text().split()
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing") from None
    except UnicodeDecodeError:
        raise DatasetError(f"{path}: not text; expected one node id per line") from None
    out = []
    for i, tok in enumerate(lines):
        try:
            out.append(int(tok))
        except ValueError:
            raise DatasetError(f"{path}: entry {i + 1} is {tok!r}, expected a node id") from None
    return np.asarray(out, dtype=np.int64)


def _labels(onehot: np.ndarray) -> np.ndarray:
    lab = onehot.argmax(axis=1).astype(np.int64)
    lab[onehot.max(axis=1) <= 0] = -1  # all-zero rows carry no label
    return lab


def import_planetoid(
    src: str | Path,
    dst: str | Path,
    *,
    dataset: str | None = None,
    name: str | None = None,
    feature_dtype: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Convert the Planetoid files in directory ``src`` into the dataset directory ``dst``.

    ``dataset`` picks ``ind.<dataset>.*`` when ``src`` holds several. Returns ``dst``.
    """
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise DatasetError(f"{src}: not a directory of Planetoid files (ind.<name>.*)")
    dataset = dataset or find_name(src)
    if dataset is None:
        raise DatasetError(f"{src}: no ind.<name>.graph file; not a Planetoid dataset")
    parts = {p: _read(src, dataset, p) for p in PARTS}
    test_index = _test_index(src, dataset)
    allx, tx, ally, ty, y = parts["allx"], parts["tx"], parts["ally"], parts["ty"], parts["y"]
    feat_dim = allx.shape[1]
    for p in ("x", "tx"):
        if parts[p].shape[1] != feat_dim:
            raise DatasetError(f"{src / f'ind.{dataset}.{p}'}: {parts[p].shape[1]} feature columns, "
                               f"allx has {feat_dim}")
    if tx.shape[0] != len(test_index) or ty.shape[0] != len(test_index):
        raise DatasetError(f"{src / f'ind.{dataset}.test.index'}: {len(test_index)} ids, "
                           f"but tx has {tx.shape[0]} rows and ty {ty.shape[0]}")
    n_all = allx.shape[0]
    lo, hi = int(test_index.min()), int(test_index.max())
    if lo < n_all:
        raise DatasetError(f"{src / f'ind.{dataset}.test.index'}: test id {lo} falls among the {n_all} allx rows")
    # test ids may have gaps (CiteSeer): extend tx / ty to the whole id range with empty rows
    span = hi - lo + 1
    order = np.sort(test_index)
    tx_ext = np.zeros((span, feat_dim), dtype=np.float32)
    tx_ext[order - lo] = tx.toarray() if hasattr(tx, "toarray") else tx
    ty_ext = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
    ty_ext[order - lo] = ty
    features = np.vstack([allx.toarray() if hasattr(allx, "toarray") else allx, tx_ext]).astype(np.float32)
    onehot = np.vstack([ally, ty_ext])
    # tx rows are in sorted-id order; put each at its node id (Kipf's reorder step)
    features[test_index] = features[order]
    onehot[test_index] = onehot[order]
    labels = _labels(onehot)
    n = features.shape[0]

    graph = parts["graph"]
    try:
        keys = np.fromiter(graph.keys(), dtype=np.int64, count=len(graph))
        lens = np.fromiter((len(v) for v in graph.values()), dtype=np.int64, count=len(graph))
        nbrs = np.fromiter((int(u) for v in graph.values() for u in v), dtype=np.int64, count=int(lens.sum()))
    except (TypeError, ValueError):
        raise DatasetError(f"{src / f'ind.{dataset}.graph'}: "
                           "adjacency lists must map node ids to lists of node ids") from None
    srcs = np.repeat(keys, lens)
    ids = np.concatenate([keys, nbrs])
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise DatasetError(
            f"{src / f'ind.{dataset}.graph'}: node id {int(ids.max() if ids.max() >= n else ids.min())} outside the "
            f"{n} nodes that features and labels describe"
        )
    n_train = y.shape[0]
    train = np.arange(n_train, dtype=np.int64)
    valid = np.arange(n_train, min(n_train + NUM_VALID, n), dtype=np.int64)
    source = {
        "format": "planetoid", "path": str(src.resolve()), "dataset": dataset, "adjacency_entries": int(lens.sum()),
        "split": "public (Planetoid): train range(len(y)), valid next 500, test test.index",
        "isolated_test_gaps": int(span - len(test_index)),
    }
    with DatasetWriter(dst, num_nodes=n, name=name or dataset, source=source, overwrite=overwrite,
                       progress=progress) as w:
        w.write_edges((srcs, nbrs), undirected=True, drop_self_loops=True, dedup=True)
        w.write_features(features, dtype=feature_dtype)
        w.write_labels(labels, num_classes=onehot.shape[1])
        w.write_splits(train=train, valid=valid, test=np.sort(test_index))
    return dst
