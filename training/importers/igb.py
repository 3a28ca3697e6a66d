"""IGB (Illinois Graph Benchmark, homogeneous paper graph) to a dataset directory.

Layout, as the IGB download scripts and ``igb/dataloader.py`` use it::

    <root>/<size>/processed/paper/node_feat.npy                [N, 1024] float32
    <root>/<size>/processed/paper/node_label_19.npy            [N] float (class id; 19 classes)
    <root>/<size>/processed/paper/node_label_2K.npy            [N] float (2,983 classes)
    <root>/<size>/processed/paper__cites__paper/edge_index.npy [E, 2] int64, rows (citing, cited)

``src`` may be ``<root>/<size>``, its ``processed`` directory, or ``<root>`` when
it holds one size. The large and full sizes ship ``node_feat.npy`` and the label
files as raw arrays without a ``.npy`` header; those are read as raw float32.
Arrays are memory-mapped and copied in blocks (features with ``pwrite``, so
neither side's pages stay in this process), so memory does not grow with the
edges: a chunk of edges, the labels (int64 x N) and the CSR build's per-node
arrays (:mod:`training.csr`).

Edges are kept as IGB's loader builds its DGL graph, ``edge_index[:, 0] ->
edge_index[:, 1]`` (``undirected=True`` adds the reverse). Labels that are NaN or
negative become -1. The split is IGB's: the first 60% of the labelled nodes
train, the next 20% valid, the rest test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.progress import Progress
from training.data import DEFAULT_CHUNK_EDGES, DatasetError
from training.writer import DatasetWriter

FEATURE_BLOCK_ROWS = 1 << 15
IGB_FEATURE_DIM = 1024


def _processed(src: Path) -> Path | None:
    for cand in (src, src / "processed"):
        if (cand / "paper__cites__paper" / "edge_index.npy").exists():
            return cand
    subs = (
        [p / "processed" for p in src.iterdir() if (p / "processed" / "paper__cites__paper").is_dir()]
        if src.is_dir()
        else []
    )
    return subs[0] if len(subs) == 1 else None


def detect(src: Path) -> bool:
    return src.is_dir() and _processed(src) is not None


def _array(path: Path, what: str, *, raw_dtype: str, raw_cols: int | None = None) -> np.ndarray:
    """``path`` memory-mapped: a ``.npy`` file, or a headerless raw array of ``raw_dtype``."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise DatasetError(f"{path}: {what} file is missing") from None
    except ValueError:
        pass  # no .npy header: IGB large/full ship raw arrays
    item = np.dtype(raw_dtype).itemsize * (raw_cols or 1)
    size = path.stat().st_size
    if size == 0 or size % item:
        raise DatasetError(
            f"{path}: neither a .npy file nor a raw {raw_dtype} array of {raw_cols or 1} column(s) ({size} bytes)"
        )
    shape = (size // item, raw_cols) if raw_cols else (size // item,)
    return np.memmap(path, dtype=raw_dtype, mode="r", shape=shape)


def _labels(lab: np.ndarray, n: int, progress: Progress | None) -> np.ndarray:
    """The first ``n`` float labels as int64 class ids (NaN or negative -> -1), converted block by block
    (a whole-array conversion would hold three float64/int64 copies of 269 M labels for IGB full)."""
    out = np.empty(n, dtype=np.int64)
    step = FEATURE_BLOCK_ROWS * 32
    for a in range(0, n, step):
        blk = np.asarray(lab[a : min(a + step, n)], dtype=np.float64)
        out[a : a + blk.size] = np.where(np.isfinite(blk) & (blk >= 0), blk, -1)
        if progress is not None:
            progress("reading labels", a + blk.size, n)
    return out


def _feature_blocks(feat: np.ndarray, progress: Progress | None):
    """Row blocks of the memory-mapped features, with progress."""
    n = feat.shape[0]
    for a in range(0, n, FEATURE_BLOCK_ROWS):
        yield feat[a : a + FEATURE_BLOCK_ROWS]
        if progress is not None:
            progress("copying features", min(n, a + FEATURE_BLOCK_ROWS), n)


def import_igb(
    src: str | Path,
    dst: str | Path,
    *,
    name: str | None = None,
    classes: str = "19",
    undirected: bool = False,
    feature_dtype: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    chunk_edges: int = DEFAULT_CHUNK_EDGES,
) -> Path:
    """Convert the IGB directory ``src`` into the dataset directory ``dst``; ``classes`` is "19" or "2K"."""
    src, dst = Path(src), Path(dst)
    proc = _processed(src) if src.is_dir() else None
    if proc is None:
        raise DatasetError(f"{src}: no processed/paper__cites__paper/edge_index.npy; not an IGB dataset directory")
    if classes not in ("19", "2K"):
        raise DatasetError(f"`classes` {classes!r}: expected 19 or 2K")
    edge_path = proc / "paper__cites__paper" / "edge_index.npy"
    edges = _array(edge_path, "edge", raw_dtype="int64", raw_cols=2)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise DatasetError(f"{edge_path}: shape {list(edges.shape)}, expected [E, 2]")
    if edges.dtype.kind not in "iu":
        raise DatasetError(f"{edge_path}: dtype {edges.dtype}, expected integer node ids")
    feat = _array(proc / "paper" / "node_feat.npy", "feature", raw_dtype="float32", raw_cols=IGB_FEATURE_DIM)
    if feat.ndim != 2:
        raise DatasetError(f"{proc / 'paper' / 'node_feat.npy'}: shape {list(feat.shape)}, expected [N, F]")
    n = feat.shape[0]
    label_path = proc / "paper" / f"node_label_{classes}.npy"
    labels = None
    if label_path.exists():
        lab = _array(label_path, "label", raw_dtype="float32")
        if lab.shape[0] < n:
            raise DatasetError(f"{label_path}: {lab.shape[0]} labels, the features have {n} rows")
        labels = _labels(lab, n, progress)

    def chunks():
        for a in range(0, edges.shape[0], chunk_edges):
            blk = np.asarray(edges[a : a + chunk_edges]).astype(np.int64)
            if blk.size and (blk.min() < 0 or blk.max() >= n):
                raise DatasetError(f"{edge_path}: rows {a}..: node id outside [0, {n}) (node_feat.npy has {n} rows)")
            yield blk[:, 0], blk[:, 1]

    source = {"format": "igb", "path": str(proc.resolve()), "edge_rows": int(edges.shape[0]),
              "label_file": label_path.name if labels is not None else None, "undirected": undirected}
    train = valid = test = None
    if labels is not None:
        labelled = np.flatnonzero(labels >= 0)
        n_train, n_valid = int(labelled.size * 0.6), int(labelled.size * 0.2)
        train, valid, test = labelled[:n_train], labelled[n_train : n_train + n_valid], labelled[n_train + n_valid :]
        source["split"] = "IGB: first 60% of labelled nodes train, next 20% valid, rest test"
    with DatasetWriter(dst, num_nodes=n, name=name or f"igb-{proc.parent.name}", source=source,
                       overwrite=overwrite, progress=progress, chunk_edges=chunk_edges) as w:
        w.write_edges(chunks, undirected=undirected, drop_self_loops=True, dedup=True)
        w.write_features(_feature_blocks(feat, progress),
                         dtype=feature_dtype or feat.dtype)
        if labels is not None:
            w.write_labels(labels, num_classes=int(labels.max()) + 1 if (labels >= 0).any() else 0)
            w.write_splits(train=train, valid=valid, test=test)
    return dst
