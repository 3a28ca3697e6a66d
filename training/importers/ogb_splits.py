"""OGB's ``split/<scheme>/{train,valid,test}.csv.gz`` id lists and its raw file names, for both OGB readers.

The CSV reader (:mod:`training.importers.ogb`) and the binary one
(:mod:`training.importers.ogb_binary`) share them; kept apart so that neither
importer imports the other's module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from training.data import DatasetError
from training.importers._text import iter_rows


def raw_file(raw: Path, stem: str) -> Path | None:
    """``raw/<stem>.csv.gz`` or ``raw/<stem>.csv``, whichever exists, else None."""
    for ext in (".csv.gz", ".csv"):
        if (raw / f"{stem}{ext}").exists():
            return raw / f"{stem}{ext}"
    return None


def split_ids(path: Path, n: int, what: str, chunk_bytes: int) -> np.ndarray:
    """The node ids of one split file, int64, checked against ``n`` nodes.

    Raises
    ------
    DatasetError
        An id lies outside ``[0, n)``.
    """
    parts = [a[:, 0] for a in iter_rows(path, ncols=1, dtype=np.int64, delimiter=",", chunk_bytes=chunk_bytes)]
    ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise DatasetError(f"{path}: {what} node id {bad} outside [0, {n})")
    return ids


def read_splits(split_dir: Path, split_name: str | None, n: int, chunk_bytes: int, *, node_type: str | None = None
            ) -> tuple[str | None, dict[str, np.ndarray]]:
    """The split scheme used (the only one, or ``split_name``) and its train/valid/test ids.

    ``node_type``: a heterogeneous layout's, whose files sit one level deeper
    (``<scheme>/<node_type>/train.csv.gz``, ids local to that type).

    Raises
    ------
    DatasetError
        Several schemes and no ``split_name``, an unknown scheme, a missing part or an id out of range.
    """
    schemes = sorted(p.name for p in split_dir.iterdir() if p.is_dir()) if split_dir.is_dir() else []
    if split_name is None and len(schemes) > 1:
        raise DatasetError(f"{split_dir}: several split schemes ({', '.join(schemes)}); pass `split_name`")
    split_name = split_name or (schemes[0] if schemes else None)
    splits = {}
    if split_name is not None:
        sdir = split_dir / split_name
        if not sdir.is_dir():
            raise DatasetError(f"{sdir}: no such split scheme (have: {', '.join(schemes) or 'none'})")
        if node_type is not None:
            sdir = sdir / node_type
        for part, key in (("train", "train_idx"), ("valid", "valid_idx"), ("test", "test_idx")):
            f = raw_file(sdir, part)
            if f is None:
                raise DatasetError(f"{sdir}: {part}.csv.gz is missing")
            splits[key] = split_ids(f, n, part, chunk_bytes)
    return split_name, splits
