"""The placement index: which bin, and which row of it, holds each vertex's feature row.

A :class:`Placement` is what the placement step (DDAK or a baseline) writes:
``bin_of[v]`` is the index into ``bins`` of the bin that holds vertex ``v``,
``row_of[v]`` its row inside that bin. Bins are GPU caches, CPU caches and SSD
files; each has a capacity in rows.

>>> import numpy as np
>>> bins = (Bin(0, "cpu", capacity_rows=2), Bin(1, "ssd", capacity_rows=4, path="bin1.dat"))
>>> p = Placement(bins, bin_of=np.array([1, 0, 1], np.int16), row_of=np.array([0, 0, 3]))
>>> p.num_vertices, p.rows_per_bin().tolist()
(3, [1, 2])
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from iostack.commit import finish as finish_commit
from iostack.errors import StoreError
from momentbase.jsontypes import JsonValue

if TYPE_CHECKING:
    from iostack.codec import FeatureCodec

#: bin kinds, fastest first
KINDS = ("gpu", "cpu", "ssd")

MANIFEST = "placement.json"


#: vertices per step of the duplicate-row check
_CHECK_CHUNK = 1 << 22


def _check_rows_distinct(bin_of: np.ndarray, row_of: np.ndarray, caps: np.ndarray) -> None:
    """Raise :class:`StoreError` naming two vertices placed on one row of one bin.

    One key per (bin, row), checked against a bitmap of every row of every bin (1 byte a
    row) a chunk of vertices at a time: sorting all the keys at once took about 32 bytes a
    vertex of temporaries (3.5 GB at papers100M's 111 M vertices).
    """
    start = np.concatenate([[0], np.cumsum(caps)[:-1]])
    seen = np.zeros(int(caps.sum()), dtype=bool)
    for a in range(0, bin_of.shape[0], _CHECK_CHUNK):
        key = start[bin_of[a:a + _CHECK_CHUNK]] + row_of[a:a + _CHECK_CHUNK]
        order = np.argsort(key, kind="stable")
        inner = np.flatnonzero(key[order][1:] == key[order][:-1])
        clash = np.flatnonzero(seen[key])
        if inner.size or clash.size:
            # the first vertex, in id order, whose row an earlier vertex took; then that earlier one
            takers = [int(order[inner + 1].min())] if inner.size else []
            second = a + min(takers + ([int(clash[0])] if clash.size else []))
            k = int(start[bin_of[second]] + row_of[second])
            first = int(np.flatnonzero(start[bin_of[:second]] + row_of[:second] == k)[0])
            raise StoreError(f"vertices {first} and {second} are both on row {int(row_of[first])} "
                             f"of bin {int(bin_of[first])}")
        seen[key] = True


@dataclass(frozen=True)
class Bin:
    """One place that holds feature rows.

    ``id`` is the bin's index in :attr:`Placement.bins`; ``kind`` is ``gpu``,
    ``cpu`` or ``ssd``; ``capacity_rows`` bounds the rows it may hold; ``path``
    is the SSD bin's file (relative paths are resolved against the directory
    the bins are written to); ``device`` names the GPU (``"cuda:1"``), the NUMA
    node (``"numa0"``) or the SSD (``"nvme0n1"``) it lives on, free text.
    """

    id: int
    kind: str
    capacity_rows: int
    path: str | None = None
    device: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise StoreError(f"bin {self.id}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if int(self.capacity_rows) < 0:
            raise StoreError(f"bin {self.id}: capacity_rows must be >= 0, got {self.capacity_rows}")
        if self.kind == "ssd" and not self.path:
            raise StoreError(f"bin {self.id}: an ssd bin needs a path (its file)")


@dataclass(frozen=True, eq=False)
class Placement:
    """Bins plus, per vertex, its bin (``bin_of``, int16/int32) and row (``row_of``, int64).

    Validated on construction: every vertex is placed exactly once, rows lie
    within their bin's capacity, and no two vertices share a row of a bin.
    ``codec``: how the bins hold the rows (:class:`iostack.codec.FeatureCodec`,
    e.g. int8 with a scale per column); ``None``: in the features' own type.
    ``dataset_fingerprint``: the identity of the dataset the rows were placed
    from (``training.data.fingerprint``: counts and a CRC of feature bytes),
    as the manifest records it; ``None`` for placements written without one.
    The reader compares it with its dataset; this package does not interpret it.
    """

    bins: tuple[Bin, ...]
    bin_of: np.ndarray
    row_of: np.ndarray
    codec: FeatureCodec | None = None
    dataset_fingerprint: Mapping[str, JsonValue] | None = None

    def __post_init__(self) -> None:
        bins = tuple(self.bins)
        object.__setattr__(self, "bins", bins)
        for i, b in enumerate(bins):
            if b.id != i:
                raise StoreError(f"bin at position {i} has id {b.id}: bins must be numbered 0..{len(bins) - 1}")
        bin_of = np.asarray(self.bin_of)
        row_of = np.asarray(self.row_of)
        if bin_of.ndim != 1 or row_of.ndim != 1 or bin_of.shape != row_of.shape:
            raise StoreError(f"bin_of {bin_of.shape} and row_of {row_of.shape} must be 1-D and of one length")
        if bin_of.dtype.kind not in "iu" or row_of.dtype.kind not in "iu":
            raise StoreError(f"bin_of ({bin_of.dtype}) and row_of ({row_of.dtype}) must be integers")
        dt = np.int16 if len(bins) <= np.iinfo(np.int16).max else np.int32
        if bin_of.size and (bin_of.min() < 0 or bin_of.max() >= len(bins)):
            bad = int(np.flatnonzero((bin_of < 0) | (bin_of >= len(bins)))[0])
            raise StoreError(f"vertex {bad} is placed in bin {int(bin_of[bad])}, but there are {len(bins)} bins")
        bin_of = bin_of.astype(dt, copy=False)
        row_of = row_of.astype(np.int64, copy=False)
        caps = np.array([b.capacity_rows for b in bins], np.int64)
        if row_of.size:
            over = (row_of < 0) | (row_of >= caps[bin_of])
            if over.any():
                v = int(np.flatnonzero(over)[0])
                raise StoreError(f"vertex {v}: row {int(row_of[v])} is outside bin {int(bin_of[v])} "
                                 f"(capacity {int(caps[bin_of[v]])} rows)")
            _check_rows_distinct(bin_of, row_of, caps)
        bin_of.setflags(write=False)
        row_of.setflags(write=False)
        object.__setattr__(self, "bin_of", bin_of)
        object.__setattr__(self, "row_of", row_of)

    @property
    def num_vertices(self) -> int:
        return int(self.bin_of.shape[0])

    def rows_per_bin(self) -> np.ndarray:
        """Rows used in each bin, shape ``(len(bins),)``, int64."""
        return np.bincount(self.bin_of, minlength=len(self.bins)).astype(np.int64)

    def vertices_of(self, bin_id: int) -> np.ndarray:
        """Vertices held by ``bin_id``, ordered by their row there (int64)."""
        v = np.flatnonzero(self.bin_of == bin_id)
        return v[np.argsort(self.row_of[v], kind="stable")]

    def save(self, directory: str | os.PathLike[str], *,
             dataset_fingerprint: Mapping[str, JsonValue] | None = None) -> Path:
        """Write ``bin_of.npy``, ``row_of.npy`` and ``placement.json`` to ``directory``; returns the manifest path.

        ``dataset_fingerprint`` (default: the placement's own) goes into the
        manifest, so that a reader can refuse the placement for another dataset.
        """
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        for name, arr in (("bin_of", self.bin_of), ("row_of", self.row_of)):
            save_npy(d / f"{name}.npy", arr)
        manifest = {"format": "moment-placement", "version": 1, "num_vertices": self.num_vertices,
                    "bins": [asdict(b) for b in self.bins]}
        if self.codec is not None:
            manifest["features"] = self.codec.to_manifest()
        fp = dataset_fingerprint if dataset_fingerprint is not None else self.dataset_fingerprint
        if fp is not None:
            manifest["dataset_fingerprint"] = dict(fp)
        save_json(d / MANIFEST, manifest)
        return d / MANIFEST


def save_npy(path: Path, arr: np.ndarray) -> None:
    """``np.save`` to a temporary sibling, renamed into place: readers never see half an array."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, arr)
    os.replace(tmp, path)


def save_json(path: Path, data: object) -> None:
    """JSON to a temporary sibling, renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def load_placement(directory: str | os.PathLike[str]) -> Placement:
    """The placement :meth:`Placement.save` wrote to ``directory`` (:class:`StoreError` if unreadable).

    A re-placement a crash interrupted after its commit (:mod:`iostack.commit`) is finished first, so the
    index read matches the bins.
    """
    d = Path(directory)
    finish_commit(d)
    man = d / MANIFEST
    try:
        data = json.loads(man.read_text())
    except FileNotFoundError:
        raise StoreError(f"{man}: no placement manifest (write one with Placement.save or `moment place`)") from None
    except (OSError, ValueError) as exc:
        raise StoreError(f"{man}: cannot read the placement manifest: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != "moment-placement":
        raise StoreError(f"{man}: not a placement manifest (no \"format\": \"moment-placement\")")
    try:
        bins = tuple(Bin(**b) for b in data["bins"])
    except (KeyError, TypeError) as exc:
        raise StoreError(f"{man}: field 'bins' is malformed ({exc})") from None
    arrays = []
    for name in ("bin_of", "row_of"):
        try:
            arrays.append(np.load(d / f"{name}.npy", allow_pickle=False))
        except (OSError, ValueError) as exc:
            raise StoreError(f"{d / (name + '.npy')}: cannot read ({exc}); rewrite the placement") from None
    codec = None
    if "features" in data:
        from iostack.codec import FeatureCodec

        codec = FeatureCodec.from_manifest(data["features"], str(man))
    fp = data.get("dataset_fingerprint")
    if fp is not None and not isinstance(fp, dict):
        raise StoreError(f"{man}: field 'dataset_fingerprint' is not an object; rewrite the placement")
    p = Placement(bins, *arrays, codec=codec, dataset_fingerprint=fp)
    if p.num_vertices != data.get("num_vertices"):
        raise StoreError(f"{man}: says {data.get('num_vertices')} vertices, the arrays hold {p.num_vertices}")
    return p


def simple_placement(num_vertices: int, kinds_rows: Sequence[tuple[str, int]], *,
                     ssd_paths: Sequence[str] = (), order: np.ndarray | None = None) -> Placement:
    """Fill bins in order: the first ``rows`` vertices of ``order`` (default ``0..n-1``) to the first bin, ...

    ``kinds_rows`` lists ``(kind, capacity_rows)``; SSD bins take their paths
    from ``ssd_paths`` in turn (default ``bin<id>.dat``). For tests, benches and
    baselines ("degree-hot-first" is ``order`` = vertices by degree, descending).

    >>> p = simple_placement(5, [("cpu", 2), ("ssd", 10)])
    >>> p.bin_of.tolist(), p.row_of.tolist(), p.bins[1].path
    ([0, 0, 1, 1, 1], [0, 1, 0, 1, 2], 'bin1.dat')
    """
    order = np.arange(num_vertices) if order is None else np.asarray(order, np.int64)
    if sum(r for _, r in kinds_rows) < num_vertices:
        raise StoreError(f"the bins hold {sum(r for _, r in kinds_rows)} rows, fewer than {num_vertices} vertices")
    bins, paths = [], list(ssd_paths)
    bin_of = np.empty(num_vertices, np.int32)
    row_of = np.empty(num_vertices, np.int64)
    start = 0
    for i, (kind, rows) in enumerate(kinds_rows):
        path = (paths.pop(0) if paths else f"bin{i}.dat") if kind == "ssd" else None
        bins.append(Bin(i, kind, int(rows), path=path))
        take = order[start:start + rows]
        bin_of[take] = i
        row_of[take] = np.arange(take.size)
        start += take.size
    return Placement(tuple(bins), bin_of, row_of)
