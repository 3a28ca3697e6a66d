"""HDF5 files (h5py) to a dataset directory.

Scientific users keep graphs in HDF5. The layout read here (``docs/dataset-format.md``,
"HDF5 input") is one file with these datasets; every name can be remapped with
``keys`` (``moment data import --hdf5-key features=/node/x``):

================== ========================= ==============================================
key                dataset (default path)    contents
================== ========================= ==============================================
``indptr``         ``/graph/indptr``         CSR row pointers, ``(N + 1,)`` integers
``indices``        ``/graph/indices``        CSR column ids, ``(E,)``: row ``v`` lists the
                                             vertices ``v`` aggregates from
``edge_index``     ``/graph/edge_index``     or an edge list ``(2, E)``: ``src -> dst``
``src``, ``dst``   ``/graph/src``, ``/dst``  or the same as two ``(E,)`` datasets
``features``       ``/features``             ``(N, F)`` numbers (optional)
``labels``         ``/labels``               ``(N,)`` integer class ids, ``-1`` unlabelled
                                             (optional)
``train``, ...     ``/split/train``,         node ids, or boolean masks of shape ``(N,)``
                   ``/split/valid``,         (optional)
                   ``/split/test``
================== ========================= ==============================================

The graph is a CSR (``indptr`` + ``indices``) or an edge list, never both. ``N`` is
the root attribute ``num_nodes`` if present, else the length of a per-node dataset
(``indptr`` - 1, ``features``, ``labels``), else ``max id + 1`` of the edges. The
root attribute ``undirected`` (or ``undirected=True``) stores every edge in both
directions; self-loops and repeated edges are dropped, as for every format.

Memory: every dataset is read in row blocks aligned to its HDF5 chunks (a whole
dataset is never read at once), so memory is bounded by a block and the per-node
arrays (``indptr``, labels, split ids).

>>> import tempfile, h5py, numpy as np
>>> from training.data import open_dataset
>>> with tempfile.TemporaryDirectory() as d:
...     with h5py.File(f"{d}/g.h5", "w") as f:
...         _ = f.create_dataset("graph/edge_index", data=np.array([[0, 1, 2], [1, 2, 0]]))
...         _ = f.create_dataset("features", data=np.eye(3, dtype=np.float32), chunks=(2, 3))
...     ds = open_dataset(import_hdf5(f"{d}/g.h5", f"{d}/out"))
...     ds.num_nodes, ds.num_edges, ds.feature_dim, ds.indices.tolist()
(3, 3, 3, [2, 0, 1])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from planner.progress import Progress
from training.data import DEFAULT_CHUNK_EDGES, DatasetError
from training.writer import DatasetWriter

#: the default dataset path of every key
DEFAULT_KEYS: dict[str, str] = {
    "indptr": "/graph/indptr",
    "indices": "/graph/indices",
    "edge_index": "/graph/edge_index",
    "src": "/graph/src",
    "dst": "/graph/dst",
    "features": "/features",
    "labels": "/labels",
    "train": "/split/train",
    "valid": "/split/valid",
    "test": "/split/test",
}

#: bytes of one dataset read at a time (rounded to whole HDF5 chunks)
BLOCK_BYTES = 64 << 20

_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def detect(src: Path) -> bool:
    """An HDF5 file: its signature at offset 0, 512, 1024, ... (after a user block)."""
    if not src.is_file():
        return False
    try:
        with open(src, "rb") as f:
            for offset in (0, 512, 1024, 2048, 4096):
                f.seek(offset)
                if f.read(8) == _SIGNATURE:
                    return True
    except OSError:
        return False
    return False


def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a dependency
        raise DatasetError("reading HDF5 needs h5py: pip install h5py") from None
    return h5py


def _keys(overrides: Mapping[str, str] | None) -> dict[str, str]:
    keys = dict(DEFAULT_KEYS)
    for k, v in (overrides or {}).items():
        if k not in DEFAULT_KEYS:
            raise DatasetError(f"`keys={k}={v}`: unknown key {k!r}; expected one of {', '.join(DEFAULT_KEYS)}")
        keys[k] = v if v.startswith("/") else "/" + v
    return keys


def _dataset_paths(f: Any, limit: int = 12) -> str:  # Any: an h5py.File (h5py ships no types)
    """The first ``limit`` dataset paths in the file, for an error message (``...`` when there are more)."""
    h5py, found = _h5py(), []

    def visit(name: str, obj: Any) -> bool | None:  # Any: an h5py group or dataset (untyped)
        if isinstance(obj, h5py.Dataset):
            found.append("/" + name)
        return True if len(found) > limit else None  # a true value stops h5py's walk

    f.visititems(visit)
    return ", ".join(found[:limit]) + (", ..." if len(found) > limit else "") if found else "none"


class _File:
    """The open file with its key map; looks datasets up with errors that name the file and the path.

    ``named`` are the keys the caller mapped explicitly: a dataset named that way
    must exist (an optional dataset is skipped silently only at its default path).
    """

    def __init__(self, f: Any, src: Path, keys: dict[str, str],  # Any: an h5py.File (h5py ships no types)
                 named: frozenset[str] = frozenset()) -> None:
        self.f, self.src, self.keys, self.named = f, src, keys, named

    def get(self, key: str):
        path = self.keys[key]
        obj = self.f.get(path)
        if obj is None:
            if key in self.named:
                raise DatasetError(f"{self.src}: no dataset {path} (`keys={key}={path}`); "
                                   f"the file's datasets are: {_dataset_paths(self.f)}")
            return None
        if not isinstance(obj, _h5py().Dataset):
            raise DatasetError(f"{self.src}: {path} ({key}) is a group, expected a dataset; "
                               f"name the dataset with `keys={key}=PATH`")
        return obj

    def need(self, key: str, *, ndim: int, kinds: str, what: str):
        d = self.get(key)
        if d is None:
            raise DatasetError(f"{self.src}: no dataset {self.keys[key]} ({what}); "
                               f"name it with `keys={key}=PATH`")
        return self.check(key, d, ndim=ndim, kinds=kinds, what=what)

    def check(self, key: str, d, *, ndim: int, kinds: str, what: str):
        if d.ndim != ndim or d.dtype.kind not in kinds:
            kind = {"iu": "integer", "iub": "integer or boolean", "fiub": "numeric"}.get(kinds, kinds)
            raise DatasetError(f"{self.src}: {d.name} ({key}) has shape {d.shape} and dtype {d.dtype}; "
                               f"expected {what}: {ndim}-d, {kind}")
        return d


def _block_rows(d, target_bytes: int = BLOCK_BYTES) -> int:
    """Rows per read: about ``target_bytes``, a whole number of HDF5 chunks along axis 0."""
    row_bytes = max(1, int(np.prod(d.shape[1:], dtype=np.int64)) * d.dtype.itemsize)
    rows = max(1, target_bytes // row_bytes)
    chunk = d.chunks[0] if d.chunks else 1
    return max(chunk, rows // chunk * chunk)


def _blocks(d, *, axis_len: int | None = None, target_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, rows)`` of ``d`` along axis 0 in chunk-aligned blocks."""
    n = d.shape[0] if axis_len is None else axis_len
    step = _block_rows(d, target_bytes)
    for a in range(0, n, step):
        yield a, d[a : min(n, a + step)]


def _columns(d, target_bytes: int = BLOCK_BYTES) -> Iterator[np.ndarray]:
    """Column blocks ``d[:, a:b]`` of a ``(2, E)`` edge list, aligned to its chunks along axis 1."""
    e = d.shape[1]
    chunk = d.chunks[1] if d.chunks else 1
    step = max(chunk, max(1, target_bytes // (2 * d.dtype.itemsize)) // chunk * chunk)
    for a in range(0, e, step):
        yield d[:, a : min(e, a + step)]


def _num_nodes(h: _File, attrs: Mapping[str, Any], indptr, edges: list) -> int:
    if "num_nodes" in attrs:
        n = int(np.asarray(attrs["num_nodes"]).item())
        if n < 0:
            raise DatasetError(f"{h.src}: root attribute num_nodes is {n}; expected >= 0")
        return n
    if indptr is not None:
        return int(indptr.shape[0]) - 1
    for key in ("features", "labels"):
        d = h.get(key)
        if d is not None and d.ndim >= 1:
            return int(d.shape[0])
    hi = -1
    for blocks in edges:
        for blk in blocks():
            if blk.size:
                hi = max(hi, int(blk.max()))
    return hi + 1


def _split(h: _File, key: str, n: int) -> np.ndarray | None:
    d = h.get(key)
    if d is None:
        return None
    h.check(key, d, ndim=1, kinds="iub", what="node ids or a boolean mask")
    if d.dtype.kind == "b":
        if d.shape[0] != n:
            raise DatasetError(
                f"{h.src}: {d.name} ({key}) is a mask of {d.shape[0]} entries; expected one per node ({n})"
            )
        return np.concatenate([np.flatnonzero(b) + a for a, b in _blocks(d)]).astype(np.int64) if n else \
            np.zeros(0, np.int64)
    ids = np.concatenate([np.asarray(b, np.int64) for _, b in _blocks(d)]) if d.shape[0] else np.zeros(0, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise DatasetError(f"{h.src}: {d.name} ({key}) holds node id {bad}, outside [0, {n})")
    return ids


def import_hdf5(
    src: str | Path,
    dst: str | Path,
    *,
    name: str | None = None,
    keys: Mapping[str, str] | None = None,
    undirected: bool | None = None,
    feature_dtype: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    chunk_edges: int = DEFAULT_CHUNK_EDGES,
    block_bytes: int = BLOCK_BYTES,
) -> Path:
    """Convert the HDF5 file ``src`` (layout in the module docstring) into the dataset directory ``dst``.

    ``keys`` maps layout keys to dataset paths in the file (the rest keep their
    defaults); ``undirected`` overrides the file's ``undirected`` attribute;
    ``feature_dtype`` converts the features (default: as stored, float64 → float32
    kept as float64). Returns ``dst``. Raises :class:`~training.data.DatasetError`
    naming the file and dataset for a missing, mis-shaped or out-of-range dataset.
    """
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise DatasetError(f"{src}: no such file")
    h5py = _h5py()
    km = _keys(keys)
    try:
        f = h5py.File(src, "r")
    except OSError as exc:
        raise DatasetError(f"{src}: not a readable HDF5 file ({exc})") from None
    try:
        with f:
            _import_open(f, src, dst, km, keys, name, undirected, feature_dtype, overwrite, progress,
                         chunk_edges, block_bytes)
    except DatasetError:
        raise
    # a damaged file fails inside h5py wherever the damage is first read: an HDF5 library error
    # (OSError without an errno; a disk-full write of ours has one), KeyError, RuntimeError, ValueError
    except (OSError, KeyError, RuntimeError, ValueError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DatasetError(f"{src}: a damaged HDF5 file ({why}); copy or export it again") from None
    return dst


def _import_open(f: Any, src: Path, dst: Path, km: dict[str, str], keys: Mapping[str, str] | None,  # Any: h5py.File
                 name: str | None, undirected: bool | None, feature_dtype: str | None, overwrite: bool,
                 progress: Progress | None, chunk_edges: int, block_bytes: int) -> None:
    """:func:`import_hdf5` once the file is open."""
    h = _File(f, src, km, frozenset(keys or ()))
    attrs = dict(f.attrs)
    indptr, edge_chunks, edge_sources = _graph(h, block_bytes)
    n = _num_nodes(h, attrs, indptr, edge_sources)
    if indptr is not None and indptr.size - 1 != n:
        raise DatasetError(f"{src}: {km['indptr']} describes {indptr.size - 1} rows, num_nodes is {n}")
    if undirected is None:
        undirected = bool(np.asarray(attrs.get("undirected", False)).item())
    feats = h.get("features")
    if feats is not None:
        h.check("features", feats, ndim=2, kinds="fiub", what="features (N, F)")
        if feats.shape[0] != n:
            raise DatasetError(f"{src}: {feats.name} has {feats.shape[0]} rows; expected one per node ({n})")
    labels = h.get("labels")
    if labels is not None:
        h.check("labels", labels, ndim=1, kinds="iu", what="class ids (N,)")
        if labels.shape[0] != n:
            raise DatasetError(f"{src}: {labels.name} has {labels.shape[0]} entries; expected one per node ({n})")
    splits = {k: _split(h, k, n) for k in ("train", "valid", "test")}
    source = {"format": "hdf5", "path": str(src.resolve()), "undirected": undirected,
              "graph": "csr" if indptr is not None else "edge list",
              "datasets": {k: km[k] for k in DEFAULT_KEYS if h.get(k) is not None}}
    with DatasetWriter(dst, num_nodes=n, name=name or src.stem, source=source, overwrite=overwrite,
                       progress=progress, chunk_edges=chunk_edges) as w:
        w.write_edges(edge_chunks, undirected=undirected, drop_self_loops=True, dedup=True)
        _write_node_data(w, h, feats, labels, splits, feature_dtype, block_bytes, progress)


def _graph(
    h: _File, block_bytes: int
) -> tuple[np.ndarray | None, Callable[[], Iterator], list[Callable[[], Iterator]]]:
    """The file's graph: its CSR row pointers (None for an edge list), its edge chunks, the id arrays' blocks.

    The edge chunks are ``(src, dst)`` int64 pairs, read ``block_bytes`` at a
    time; the id blocks feed :func:`_num_nodes` when the file does not say.
    """
    src, km = h.src, h.keys
    csr = h.get("indptr") is not None or h.get("indices") is not None
    listed = any(h.get(k) is not None for k in ("edge_index", "src", "dst"))
    if csr and listed:
        raise DatasetError(f"{src}: holds both a CSR ({km['indptr']}, {km['indices']}) and an edge list; "
                           "remap one away with `keys` or remove it")
    if not csr and not listed:
        raise DatasetError(f"{src}: no graph: expected {km['indptr']} + {km['indices']} (CSR) or "
                           f"{km['edge_index']} (2 x E) or {km['src']} + {km['dst']}; name yours with `keys`")
    step = max(1, block_bytes // 8)
    if csr:
        ip = h.need("indptr", ndim=1, kinds="iu", what="CSR row pointers (N + 1,)")
        ix = h.need("indices", ndim=1, kinds="iu", what="CSR column ids (E,)")
        indptr = np.asarray(ip[...], dtype=np.int64)  # N + 1 integers: kept, like the writer's own
        if indptr.size == 0 or indptr[0] != 0 or (np.diff(indptr) < 0).any() or indptr[-1] != ix.shape[0]:
            raise DatasetError(f"{src}: {ip.name} is not a CSR row pointer for {ix.name} ({ix.shape[0]} entries): "
                               "it must start at 0, never decrease and end at the number of indices")

        def csr_chunks():
            for a in range(0, ix.shape[0], step):
                cols = np.asarray(ix[a : a + step], np.int64)
                rows = np.searchsorted(indptr, np.arange(a, a + cols.size), side="right") - 1
                yield cols, rows  # row v aggregates from cols: edges cols -> v

        return indptr, csr_chunks, [lambda: (b for _, b in _blocks(ix, target_bytes=block_bytes))]
    if h.get("edge_index") is not None:
        ei = h.need("edge_index", ndim=2, kinds="iu", what="an edge list (2, E)")
        if ei.shape[0] != 2:
            raise DatasetError(f"{src}: {ei.name} has shape {ei.shape}; expected (2, E): sources, then targets")

        def pair_chunks():
            for blk in _columns(ei, block_bytes):
                blk = np.asarray(blk, np.int64)
                yield blk[0], blk[1]

        return None, pair_chunks, [lambda: (b for b in _columns(ei, block_bytes))]
    s = h.need("src", ndim=1, kinds="iu", what="edge sources (E,)")
    t = h.need("dst", ndim=1, kinds="iu", what="edge targets (E,)")
    if s.shape != t.shape:
        raise DatasetError(f"{src}: {s.name} has {s.shape[0]} entries and {t.name} {t.shape[0]}; they must pair up")

    def list_chunks():
        for a in range(0, s.shape[0], step):
            yield np.asarray(s[a : a + step], np.int64), np.asarray(t[a : a + step], np.int64)

    return None, list_chunks, [lambda: (b for _, b in _blocks(s, target_bytes=block_bytes)),
                               lambda: (b for _, b in _blocks(t, target_bytes=block_bytes))]


def _write_node_data(w: DatasetWriter, h: _File, feats: Any, labels: Any, splits: dict, feature_dtype: str | None,
                     block_bytes: int, progress: Progress | None) -> None:
    """Features (block by block), labels and splits of the file into the writer."""
    n = w.num_nodes
    if feats is not None:
        dt = feature_dtype or (feats.dtype.name if feats.dtype.kind == "f" else "float32")
        out = w.open_features(feats.shape[1], dt)
        for a, blk in _blocks(feats, target_bytes=block_bytes):
            out[a : a + blk.shape[0]] = blk
            if progress:
                progress("reading features", a + blk.shape[0], n)
    if labels is not None:
        lab = np.concatenate([np.asarray(b, np.int64) for _, b in _blocks(labels)]) if n else np.zeros(0, np.int64)
        if lab.size and lab.min() < -1:
            raise DatasetError(f"{h.src}: {labels.name} holds label {int(lab.min())}; use -1 for unlabelled")
        w.write_labels(lab)
    if any(v is not None for v in splits.values()):
        w.write_splits(**splits)
