"""The on-disk graph dataset: a versioned directory of memory-mapped ``.npy`` files.

A dataset directory (schema ``moment.dataset``, version 1; ``docs/dataset-format.md``)::

    meta.json        counts, dtypes, provenance, and the list of files with dtype and shape
    indptr.npy       int64 [num_nodes + 1]      CSR row pointers, 0 .. num_edges, non-decreasing
    indices.npy      int32 [num_edges]          (int64 when num_nodes >= 2**31)
    features.npy     [num_nodes, feature_dim]   float32 / float16 / float64 / uint8 / int8  (optional)
    labels.npy       int64 [num_nodes]          class id, -1 = unlabelled                   (optional)
    train_idx.npy, valid_idx.npy, test_idx.npy  int64 node ids, disjoint                    (optional)
    hotness.npy      float32 [num_nodes]        reserved: written later by the placement step

``indices[indptr[v]:indptr[v + 1]]`` are the vertices ``v`` aggregates from: its
in-neighbours (an edge ``u -> v`` is stored in row ``v``); undirected graphs hold
both directions. Everything is opened with ``np.load(mmap_mode="r")`` so a graph
larger than memory costs only the pages that are touched.

Writing goes through :class:`DatasetWriter`, which builds the directory in a
temporary sibling and renames it into place only when every file is complete,
and which turns edge lists into CSR in chunks with memory bounded by the chunk
size (plus two ``int64`` arrays of ``num_nodes``)::

    >>> import tempfile, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> with DatasetWriter(f"{d}/tri", num_nodes=3, name="triangle") as w:
    ...     num_edges = w.write_edges([(np.array([0, 1, 2]), np.array([1, 2, 0]))], undirected=True)
    ...     w.write_features(np.eye(3, dtype=np.float32))
    ...     w.write_labels(np.array([0, 1, -1]), num_classes=2)
    ...     w.write_splits(train=[0], valid=[1], test=[2])
    >>> ds = open_dataset(f"{d}/tri")
    >>> ds.num_nodes, ds.num_edges, ds.feature_dim, ds.num_classes
    (3, 6, 3, 2)
    >>> ds.neighbours(0).tolist(), ds.degree().tolist()
    ([1, 2], [2, 2, 2])
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from iostack.checksums import BlockSums, bad_blocks, block_sums
from planner.progress import Progress
from training.errors import TrainingError

SCHEMA = "moment.dataset"
VERSION = 1

#: dtypes a feature matrix may have (numpy names, as written in meta.json)
FEATURE_DTYPES = ("float32", "float16", "float64", "uint8", "int8")

#: edges handled per step by the chunked CSR builder and the validator; 2**22 edges of
#: int64 pairs is ~100 MB of temporaries, small next to any graph worth streaming
DEFAULT_CHUNK_EDGES = 1 << 22

#: files a dataset may hold, beyond the CSR pair that every dataset has
OPTIONAL_FILES = ("features", "labels", "train_idx", "valid_idx", "test_idx", "hotness")
SPLITS = ("train_idx", "valid_idx", "test_idx")

#: bytes per checksummed block of a dataset file (meta.json keeps one CRC-32 per block)
CHECKSUM_BLOCK_BYTES = 4 << 20
#: blocks of each file an ordinary open checks besides its first and last, picked at random
SAMPLE_BLOCKS = 6
#: what ``open_dataset(verify=...)`` accepts
VERIFY_MODES = ("sample", "full", "none")


class DatasetError(TrainingError):
    """A dataset directory or an import source that is missing, malformed or inconsistent.

    The message names the file (and line or field where there is one) and says how to fix it.
    """


def index_dtype(num_nodes: int) -> np.dtype:
    """The dtype of ``indices.npy`` for a graph of ``num_nodes`` vertices.

    >>> index_dtype(10), index_dtype(2**31)
    (dtype('int32'), dtype('int64'))
    """
    return np.dtype(np.int32) if num_nodes < 2**31 else np.dtype(np.int64)


# ----------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True, eq=False)  # memmaps: identity equality, hashable
class Dataset:
    """An opened dataset directory: read-only memory maps plus ``meta.json``.

    Shapes: ``indptr`` [num_nodes + 1] int64, ``indices`` [num_edges] int32/int64,
    ``features`` [num_nodes, feature_dim] or None, ``labels`` [num_nodes] int64 or None,
    split arrays int64 node ids or None, ``hotness`` [num_nodes] float32 or None.
    """

    path: Path
    meta: Mapping[str, Any]
    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray | None = None
    labels: np.ndarray | None = None
    train_idx: np.ndarray | None = None
    valid_idx: np.ndarray | None = None
    test_idx: np.ndarray | None = None
    hotness: np.ndarray | None = field(default=None, repr=False)
    #: what the checksums said on open (a sentence for ``moment data info``)
    integrity: str = field(default="", repr=False)

    @property
    def name(self) -> str:
        return str(self.meta.get("name", self.path.name))

    @property
    def num_nodes(self) -> int:
        return int(self.meta["num_nodes"])

    @property
    def num_edges(self) -> int:
        """Number of CSR entries (an undirected edge counts twice)."""
        return int(self.meta["num_edges"])

    @property
    def feature_dim(self) -> int:
        return int(self.meta.get("feature_dim", 0))

    @property
    def feature_dtype(self) -> str | None:
        return self.meta.get("feature_dtype")

    @property
    def num_classes(self) -> int:
        return int(self.meta.get("num_classes", 0))

    @property
    def directed(self) -> bool:
        return bool(self.meta.get("directed", True))

    @property
    def feature_bytes(self) -> int:
        """Size of the feature matrix in bytes (0 without features)."""
        return 0 if self.features is None else int(self.features.nbytes)

    @property
    def row_bytes(self) -> int:
        """Bytes of one vertex's feature row (0 without features)."""
        return 0 if self.features is None else int(self.features.shape[1] * self.features.itemsize)

    def degree(self) -> np.ndarray:
        """In-degree per vertex (row lengths of the CSR), int64 [num_nodes]."""
        return np.diff(self.indptr)

    def neighbours(self, v: int) -> np.ndarray:
        """The vertices ``v`` aggregates from (a view into ``indices``)."""
        return self.indices[self.indptr[v] : self.indptr[v + 1]]


def _load(path: Path, what: str, mmap: bool = True) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise DatasetError(f"{path}: {what} file is missing; re-import the dataset") from None
    except (ValueError, OSError, EOFError) as exc:
        if "mmap length is greater than file size" in str(exc):
            raise DatasetError(f"{path}: shorter than its .npy header says (cut short); "
                               "re-import the dataset") from None
        raise DatasetError(f"{path}: not a readable .npy file ({exc}); re-import the dataset") from None


def read_meta(path: str | os.PathLike) -> dict:
    """``meta.json`` of a dataset directory, with its schema and version checked."""
    meta_path = Path(path) / "meta.json"
    if not Path(path).is_dir():
        raise DatasetError(f"{path}: no such dataset directory (create one with `moment data import` or `moment data synth`)")
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{meta_path}: missing; {path} is not a dataset directory (re-import it)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{meta_path}: not valid JSON ({exc}); re-import the dataset") from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        raise DatasetError(f"{meta_path}: schema is {meta.get('schema') if isinstance(meta, dict) else None!r}, expected {SCHEMA!r}")
    if meta.get("version") != VERSION:
        raise DatasetError(
            f"{meta_path}: dataset format version {meta.get('version')!r}, this Moment reads version {VERSION}; "
            "re-import the dataset with this version"
        )
    for key in ("num_nodes", "num_edges", "files"):
        if key not in meta:
            raise DatasetError(f"{meta_path}: field {key!r} is missing; re-import the dataset")
    return meta


def _check_range(arr: np.ndarray, lo: int, hi: int, where: str, what: str, chunk: int) -> None:
    """Every value of ``arr`` in ``[lo, hi)``, checked ``chunk`` elements at a time."""
    for a in range(0, arr.shape[0], chunk):
        block = np.asarray(arr[a : a + chunk])
        if block.size == 0:
            continue
        bad = (block < lo) | (block >= hi)
        if bad.any():
            i = a + int(np.argmax(bad))
            raise DatasetError(
                f"{where}: {what} at position {i} is {int(arr[i])}, outside [{lo}, {hi}); re-import the dataset"
            )


def validate_dataset(ds: Dataset, *, chunk: int = DEFAULT_CHUNK_EDGES) -> None:
    """Check ranges and invariants that dtypes and shapes alone do not prove.

    indptr starts at 0, ends at num_edges and never decreases; indices lie in
    ``[0, num_nodes)``; labels in ``[-1, num_classes)``; split ids in range and the
    three splits disjoint. Raises :class:`DatasetError` naming the file. Runs in
    chunks of ``chunk`` elements, so a graph larger than memory can be checked.
    """
    p = ds.path
    n, e = ds.num_nodes, ds.num_edges
    ip = ds.indptr
    if int(ip[0]) != 0 or int(ip[-1]) != e:
        raise DatasetError(
            f"{p / 'indptr.npy'}: must run from 0 to num_edges={e}, runs from {int(ip[0])} to {int(ip[-1])}; re-import the dataset"
        )
    for a in range(0, n, chunk):
        block = np.asarray(ip[a : a + chunk + 1])
        d = np.diff(block)
        if (d < 0).any():
            v = a + int(np.argmax(d < 0))
            raise DatasetError(
                f"{p / 'indptr.npy'}: decreases at row {v} ({int(block[v - a])} -> {int(block[v - a + 1])}); "
                "the CSR is corrupt, re-import the dataset"
            )
    _check_range(ds.indices, 0, n, str(p / "indices.npy"), "neighbour id", chunk)
    if ds.labels is not None:
        _check_range(ds.labels, -1, max(ds.num_classes, 0), str(p / "labels.npy"), "label", chunk)
    seen = np.zeros(n, dtype=bool) if any(getattr(ds, s) is not None for s in SPLITS) else None
    for s in SPLITS:
        idx = getattr(ds, s)
        if idx is None:
            continue
        _check_range(idx, 0, n, str(p / f"{s}.npy"), "node id", chunk)
        for a in range(0, idx.shape[0], chunk):
            block = np.asarray(idx[a : a + chunk])
            # a duplicate inside one split is as wrong as an overlap between splits
            uniq, counts = np.unique(block, return_counts=True)
            clash = seen[uniq] | (counts > 1)
            if clash.any():
                v = int(uniq[np.argmax(clash)])
                raise DatasetError(
                    f"{p / f'{s}.npy'}: node {v} appears twice or also in another split; the splits must be disjoint"
                )
            seen[uniq] = True


def verify_checksums(root: Path, meta: Mapping[str, Any], mode: str = "sample") -> str:
    """Check the dataset files against the CRC-32s ``meta.json`` records; say what was checked.

    ``mode`` ``"sample"`` reads, of every file, its first and last block and
    :data:`SAMPLE_BLOCKS` others at random (all of a file of at most
    ``SAMPLE_BLOCKS + 2`` blocks): at most 32 MiB per file, whatever its size.
    ``"full"`` reads every block; ``"none"`` reads nothing. Every file's size
    is checked in all modes but ``"none"``. Raises :class:`DatasetError` naming
    the file and the first bad block. A dataset written before checksums
    existed has none: it is accepted and the sentence says so.
    """
    if mode not in VERIFY_MODES:
        raise DatasetError(f"verify={mode!r}: expected one of {', '.join(VERIFY_MODES)}")
    sums_meta = meta.get("checksums")
    if not sums_meta:
        return ("no checksums: written before Moment recorded them (nothing to verify; "
                "re-import or regenerate the dataset to add them)")
    if mode == "none":
        return "checksums not checked"
    where = root / "meta.json"
    entries = sums_meta.get("files") if isinstance(sums_meta, Mapping) else None
    if sums_meta.get("algorithm") != "crc32" or not isinstance(entries, Mapping):
        raise DatasetError(f"{where}: 'checksums' is not a CRC-32 table this Moment reads; re-import the dataset")
    rng = np.random.default_rng()
    checked = total = 0
    for key in meta["files"]:
        if key not in entries:
            continue  # written after the checksums (hotness, say): its shape was checked above
        fpath = root / f"{key}.npy"
        try:
            sums = BlockSums.from_json(entries[key])
        except ValueError as exc:
            raise DatasetError(f"{where}: checksums of {key}: {exc}; re-import the dataset") from None
        size = fpath.stat().st_size
        if size != sums.size_bytes:
            raise DatasetError(f"{fpath}: {size:,} bytes, but meta.json recorded {sums.size_bytes:,}; "
                               "the file was cut or replaced: re-import or regenerate the dataset")
        n = sums.blocks
        if mode == "full" or n <= SAMPLE_BLOCKS + 2:
            which = list(range(n))
        else:
            which = [0, n - 1, *(1 + rng.choice(n - 2, size=SAMPLE_BLOCKS, replace=False)).tolist()]
        bad = bad_blocks(fpath, sums, which)
        if bad:
            a, b = sums.span(bad[0])
            more = f" and {len(bad) - 1} more of the {len(which)} checked" if len(bad) > 1 else ""
            raise DatasetError(
                f"{fpath}: block {bad[0]} of {n} (bytes {a:,} to {b:,}){more} does not match the CRC-32 "
                "meta.json recorded when the dataset was written: the file is corrupt; re-import or "
                "regenerate the dataset")
        checked += len(set(which))
        total += n
    files = len([k for k in meta["files"] if k in entries])
    if checked == total:
        return f"CRC-32 verified: all {total:,} block(s) of {files} file(s)"
    return (f"CRC-32 verified: {checked:,} of {total:,} blocks of {files} file(s) (each file's first, last "
            f"and {SAMPLE_BLOCKS} random blocks); `moment data info --verify` reads them all")


def open_dataset(path: str | os.PathLike, *, validate: bool = True, verify: str = "sample") -> Dataset:
    """Open a dataset directory read-only, memory-mapped, and check it.

    Checks the schema and version, that every file in ``meta["files"]`` exists with
    the declared dtype and shape, the files' bytes against the checksums
    ``meta.json`` records (``verify``: ``"sample"`` of blocks, ``"full"``,
    ``"none"``; see :func:`verify_checksums`), and (unless ``validate=False``)
    the value ranges of :func:`validate_dataset`. Raises :class:`DatasetError`
    naming the file (and the block).
    """
    root = Path(path)
    meta = read_meta(root)
    files = meta["files"]
    n, e = int(meta["num_nodes"]), int(meta["num_edges"])
    expected = {
        "indptr": ("int64", [n + 1]),
        "indices": (None, [e]),
        "features": (None, [n, int(meta.get("feature_dim", 0))]),
        "labels": ("int64", [n]),
        "hotness": ("float32", [n]),
    }
    arrays: dict[str, np.ndarray] = {}
    for key in ("indptr", "indices", *OPTIONAL_FILES):
        if key not in files:
            if key in ("indptr", "indices"):
                raise DatasetError(f"{root / 'meta.json'}: files.{key} is missing; re-import the dataset")
            continue
        decl = files[key]
        fpath = root / f"{key}.npy"
        arr = _load(fpath, key)
        want_dtype, want_shape = expected.get(key, ("int64", None))
        if str(arr.dtype) != decl.get("dtype") or (want_dtype and str(arr.dtype) != want_dtype):
            raise DatasetError(
                f"{fpath}: dtype {arr.dtype}, meta.json declares {decl.get('dtype')}"
                + (f" and the format requires {want_dtype}" if want_dtype else "")
                + "; re-import the dataset"
            )
        if list(arr.shape) != list(decl.get("shape", [])) or (want_shape is not None and list(arr.shape) != want_shape):
            raise DatasetError(
                f"{fpath}: shape {list(arr.shape)}, meta.json declares {decl.get('shape')}"
                + (f" and the counts require {want_shape}" if want_shape is not None else "")
                + "; the file is truncated or stale, re-import the dataset"
            )
        arrays[key] = arr
    if arrays["indices"].dtype not in (np.int32, np.int64) or (n >= 2**31 and arrays["indices"].dtype != np.int64):
        raise DatasetError(f"{root / 'indices.npy'}: dtype {arrays['indices'].dtype} cannot hold ids of {n} nodes")
    if "features" in arrays and str(arrays["features"].dtype) not in FEATURE_DTYPES:
        raise DatasetError(f"{root / 'features.npy'}: dtype {arrays['features'].dtype} is not one of {FEATURE_DTYPES}")
    for s in SPLITS:
        if s in arrays and arrays[s].ndim != 1:
            raise DatasetError(f"{root / f'{s}.npy'}: must be one-dimensional, has shape {list(arrays[s].shape)}")
    integrity = verify_checksums(root, meta, verify)
    ds = Dataset(path=root, meta=meta, **arrays, integrity=integrity)
    if validate:
        validate_dataset(ds)
    return ds


# ----------------------------------------------------------------------------------------------
# writing


def _as_chunks(edges) -> Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]:
    """Normalise ``edges`` to a callable that yields (src, dst) chunks afresh on each call."""
    if callable(edges):
        return edges
    if isinstance(edges, tuple) and len(edges) == 2 and isinstance(edges[0], np.ndarray):
        return lambda: [edges]
    if isinstance(edges, np.ndarray):
        if edges.ndim != 2 or edges.shape[0] != 2:
            raise ValueError(f"an edge array must have shape [2, E], has {edges.shape}")
        return lambda: [(edges[0], edges[1])]
    if isinstance(edges, Sequence):
        return lambda: edges
    raise TypeError(
        "edges must be a [2, E] array, a (src, dst) pair, a list of (src, dst) chunks, "
        "or a callable returning an iterable of chunks (it is called twice)"
    )


#: where a feature file's rows start, and what its length is rounded up to (O_DIRECT's alignment)
FEATURE_PAGE = 4096


def paged_header_bytes(row_bytes: int) -> int:
    """The ``.npy`` header size of a features file with rows of ``row_bytes``: one page, or one row when
    rows are whole pages of up to 8 KiB (np.load refuses headers above 10000 bytes)."""
    return row_bytes if row_bytes % FEATURE_PAGE == 0 and row_bytes <= 2 * FEATURE_PAGE else FEATURE_PAGE


def open_paged_npy(path: str | os.PathLike[str], dtype: np.dtype, shape: tuple[int, int]) -> np.memmap:
    """A new ``.npy`` file of ``shape`` opened as a writable memmap, its data starting on a page boundary
    and its length a whole number of pages (zeros after the data).

    An ordinary ``.npy`` (``np.load`` reads it), laid out so that the file can serve as an SSD bin
    as it is (``moment place --in-place``): O_DIRECT reads need page-aligned offsets. The header
    is padded with spaces, as the format allows, to :func:`paged_header_bytes`.
    """
    import struct

    dt = np.dtype(dtype)
    header = repr({"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False,
                   "shape": tuple(int(x) for x in shape)}).encode("latin1")
    total = paged_header_bytes(int(shape[1]) * dt.itemsize if len(shape) > 1 else dt.itemsize)
    lead = len(np.lib.format.magic(1, 0)) + 2  # magic, version, uint16 header length
    if lead + len(header) + 1 > total:
        total = -(-(lead + len(header) + 1) // FEATURE_PAGE) * FEATURE_PAGE
    header += b" " * (total - lead - len(header) - 1) + b"\n"
    data = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    with open(path, "wb") as f:
        f.write(np.lib.format.magic(1, 0) + struct.pack("<H", len(header)) + header)
        f.truncate(total + -(-data // FEATURE_PAGE) * FEATURE_PAGE)
    return np.memmap(path, dtype=dt, mode="r+", offset=total, shape=tuple(shape))


class DatasetWriter:
    """Build a dataset directory atomically: nothing appears at ``path`` until every file is written.

    Use as a context manager. Files go into a temporary sibling directory
    (``.<name>.tmp-*``); on a clean exit ``meta.json`` is written, the directory
    is validated and renamed to ``path``. On an exception the temporary directory
    is removed and ``path`` is left as it was.

    Methods (each at most once; all but a graph are optional):

    - :meth:`write_edges` — CSR from (src, dst) edge chunks, bounded memory;
      or :meth:`write_csr` for a CSR already at hand.
    - :meth:`write_features` (whole array or row blocks), or :meth:`open_features`
      for a writable memmap to fill yourself.
    - :meth:`write_labels`, :meth:`write_splits`.
    - ``meta`` extras: ``directed`` (set by ``write_edges``), ``source`` (provenance
      dict), ``name``; :meth:`set_meta` adds more keys.

    ``num_nodes`` is fixed up front because the counting sort needs it.
    ``overwrite=True`` replaces an existing dataset (still atomically, via a rename).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        num_nodes: int,
        name: str | None = None,
        source: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        chunk_edges: int = DEFAULT_CHUNK_EDGES,
        progress: Progress | None = None,
    ) -> None:
        self.path = Path(path)
        if num_nodes < 0:
            raise DatasetError(f"num_nodes must be >= 0, got {num_nodes}")
        self.num_nodes = int(num_nodes)
        self.name = name or self.path.name
        self.source = dict(source or {})
        self.overwrite = overwrite
        self.chunk_edges = int(chunk_edges)
        self.progress = progress
        self.meta: dict[str, Any] = {}
        self.files: dict[str, dict[str, Any]] = {}
        self.num_edges: int | None = None
        #: the CSR row pointers once a graph is written (in-degree = np.diff(indptr))
        self.indptr: np.ndarray | None = None
        self.directed: bool = True
        self.feature_dim = 0
        self.feature_dtype: str | None = None
        self.num_classes = 0
        self._tmp: Path | None = None
        self._features: np.memmap | None = None
        if self.path.exists() and not overwrite:
            raise DatasetError(f"{self.path}: already exists; remove it or pass --force to replace it")
        if not self.path.parent.is_dir():
            raise DatasetError(f"{self.path.parent}: no such directory to write the dataset into")

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> DatasetWriter:
        try:
            self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.tmp-", dir=self.path.parent))
        except OSError as exc:
            raise DatasetError(f"{self.path.parent}: cannot create a directory there ({exc})") from None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        tmp = self._tmp
        if tmp is None:
            return
        try:
            if exc_type is None:
                self._commit(tmp)
        finally:
            self._features = None
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            self._tmp = None

    @property
    def tmp_dir(self) -> Path:
        """The temporary directory files go to (valid inside the ``with`` block)."""
        if self._tmp is None:
            raise RuntimeError("DatasetWriter used outside its `with` block")
        return self._tmp

    def _report(self, stage: str, done: int, total: int | None) -> None:
        if self.progress is not None:
            self.progress(stage, done, total)

    def _record(self, key: str, arr: np.ndarray) -> None:
        self.files[key] = {"dtype": str(arr.dtype), "shape": [int(s) for s in arr.shape]}

    def _save(self, key: str, arr: np.ndarray) -> None:
        np.save(self.tmp_dir / f"{key}.npy", arr, allow_pickle=False)
        self._record(key, arr)

    def set_meta(self, **extra: Any) -> None:
        """Add JSON-able keys to ``meta.json`` (not the reserved ones the writer computes)."""
        self.meta.update(extra)

    # -- graph ---------------------------------------------------------------------------------
    def write_csr(self, indptr: np.ndarray, indices: np.ndarray, *, directed: bool = True) -> None:
        """Write a CSR at hand (row ``v`` = the vertices ``v`` aggregates from)."""
        indptr = np.asarray(indptr, dtype=np.int64)
        if indptr.shape != (self.num_nodes + 1,):
            raise DatasetError(f"indptr has shape {indptr.shape}, expected ({self.num_nodes + 1},)")
        self._save("indptr", indptr)
        self._save("indices", np.asarray(indices, dtype=index_dtype(self.num_nodes)))
        self.indptr = indptr
        self.num_edges = int(indptr[-1])
        self.directed = directed

    def write_edges(
        self,
        edges,
        *,
        undirected: bool = False,
        drop_self_loops: bool = True,
        dedup: bool = True,
    ) -> int:
        """Build the CSR from edges ``src -> dst`` (``dst`` aggregates from ``src``), in chunks.

        ``edges`` is a [2, E] array, a ``(src, dst)`` pair of arrays, a list of such
        pairs, or — for graphs larger than memory — a callable returning a fresh
        iterable of ``(src, dst)`` chunks each time it is called (it is called twice:
        a counting pass and a filling pass). Ids must lie in ``[0, num_nodes)``.

        ``undirected`` stores each edge in both directions; ``drop_self_loops``
        removes ``v -> v``; ``dedup`` removes repeated edges and sorts every row
        (one more pass over the CSR, in row blocks). Memory: the chunk being
        processed plus two int64 arrays of ``num_nodes``. Returns ``num_edges``.
        """
        chunks = _as_chunks(edges)
        n = self.num_nodes
        tmp = self.tmp_dir

        def directed_chunks():
            for src, dst in chunks():
                src = np.asarray(src).astype(np.int64, copy=False).ravel()
                dst = np.asarray(dst).astype(np.int64, copy=False).ravel()
                if src.shape != dst.shape:
                    raise DatasetError(f"edge chunk with {src.size} sources but {dst.size} targets")
                if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
                    bad = next(int(x) for x in (src.min(), src.max(), dst.min(), dst.max()) if x < 0 or x >= n)
                    raise DatasetError(f"edge endpoint {bad} is outside [0, {n}) (num_nodes={n})")
                if drop_self_loops:
                    keep = src != dst
                    src, dst = src[keep], dst[keep]
                # the chunk may be long; bound the temporaries by re-chunking
                for a in range(0, src.size, self.chunk_edges):
                    s, d = src[a : a + self.chunk_edges], dst[a : a + self.chunk_edges]
                    yield s, d
                    if undirected:
                        yield d, s

        # pass 1: in-degrees
        counts = np.zeros(n, dtype=np.int64)
        seen = 0
        for s, d in directed_chunks():
            counts += np.bincount(d, minlength=n)
            seen += s.size
            self._report("counting edges", seen, None)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        total = int(indptr[-1])
        del counts

        # pass 2: place each source at its row's next free slot (a counting sort)
        idt = index_dtype(n)
        raw_path = tmp / "indices.unsorted.npy"
        raw = np.lib.format.open_memmap(raw_path, mode="w+", dtype=idt, shape=(total,))
        cursor = indptr[:-1].copy()
        done = 0
        for s, d in directed_chunks():
            # any order inside a row will do (dedup sorts rows later), so no stable sort needed;
            # int32 keys sort faster when the ids fit
            order = np.argsort(d.astype(np.int32) if n < 2**31 else d)
            d_sorted = d[order]
            # run boundaries of the sorted targets (cheaper than np.unique, which would hash)
            start = np.flatnonzero(np.r_[True, d_sorted[1:] != d_sorted[:-1]]) if d_sorted.size else d_sorted
            uniq = d_sorted[start]
            cnt = np.diff(np.r_[start, d_sorted.size])
            rank = np.arange(d_sorted.size, dtype=np.int64) - np.repeat(start, cnt)
            pos = cursor[d_sorted] + rank
            raw[pos] = s[order]
            cursor[uniq] += cnt
            done += s.size
            self._report("placing edges", done, total)
        del cursor
        raw.flush()

        if not dedup:
            del raw
            os.replace(raw_path, tmp / "indices.npy")
            self._record_csr(indptr, total, idt, undirected)
            return total

        # pass 3: sort and de-duplicate each row, compacting leftwards in place (the write
        # position never passes the read position), then copy to a file of the final size
        new_indptr = np.zeros(n + 1, dtype=np.int64)
        write = 0
        v = 0
        while v < n:
            # the largest row block that fits in a chunk (at least one row)
            hi = int(np.searchsorted(indptr, indptr[v] + self.chunk_edges, side="right")) - 1
            hi = min(max(hi, v + 1), n)
            a, b = int(indptr[v]), int(indptr[hi])
            cols = np.asarray(raw[a:b]).astype(np.int64)
            rows = np.repeat(np.arange(hi - v, dtype=np.int64), np.diff(indptr[v : hi + 1]))
            if n < 2**31:  # one int64 key per entry: (row, col) packed, one sort
                key = rows * n + cols
                key.sort()
                rows, cols = key // n, key % n
            else:  # row * n could overflow int64
                order = np.lexsort((cols, rows))
                rows, cols = rows[order], cols[order]
            keep = np.ones(cols.size, dtype=bool)
            keep[1:] = (cols[1:] != cols[:-1]) | (rows[1:] != rows[:-1])
            rows, cols = rows[keep], cols[keep]
            new_indptr[v + 1 : hi + 1] = np.bincount(rows, minlength=hi - v)
            raw[write : write + cols.size] = cols.astype(idt)
            write += cols.size
            v = hi
            self._report("sorting rows", a, total)
        np.cumsum(new_indptr, out=new_indptr)
        final = np.lib.format.open_memmap(tmp / "indices.npy", mode="w+", dtype=idt, shape=(write,))
        for a in range(0, write, self.chunk_edges):
            b = min(a + self.chunk_edges, write)
            final[a:b] = raw[a:b]
        final.flush()
        del final, raw
        raw_path.unlink()
        self._record_csr(new_indptr, write, idt, undirected)
        return write

    def _record_csr(self, indptr: np.ndarray, total: int, idt: np.dtype, undirected: bool) -> None:
        self._save("indptr", indptr)
        self.indptr = indptr
        self.files["indices"] = {"dtype": str(np.dtype(idt)), "shape": [total]}
        self.num_edges = total
        self.directed = not undirected

    # -- node data -----------------------------------------------------------------------------
    def open_features(self, feature_dim: int, dtype: str | np.dtype = "float32") -> np.memmap:
        """A writable [num_nodes, feature_dim] memmap of ``features.npy`` to fill by row blocks."""
        dt = np.dtype(dtype)
        if dt.name not in FEATURE_DTYPES:
            raise DatasetError(f"feature dtype {dt.name} is not one of {', '.join(FEATURE_DTYPES)}")
        self._features = open_paged_npy(self.tmp_dir / "features.npy", dt, (self.num_nodes, int(feature_dim)))
        self.feature_dim, self.feature_dtype = int(feature_dim), dt.name
        self._record("features", self._features)
        return self._features

    def write_feature_rows(self, start: int, rows: np.ndarray) -> None:
        """Write rows ``start : start + len(rows)`` of the features :meth:`open_features` made, with ``pwrite``.

        Unlike assigning into the memmap, written pages never count in this process's RSS,
        so features larger than memory are written in bounded memory (the kernel writes the
        page cache back at its own pace).
        """
        f = self._features
        if f is None:
            raise DatasetError("write_feature_rows: call open_features first")
        rows = np.ascontiguousarray(rows, dtype=f.dtype)
        if rows.ndim != 2 or rows.shape[1] != f.shape[1] or not 0 <= start <= f.shape[0] - rows.shape[0]:
            raise DatasetError(f"feature rows of shape {rows.shape} at row {start} do not fit [{f.shape[0]}, {f.shape[1]}]")
        data = memoryview(rows).cast("B")
        at = f.offset + start * f.shape[1] * f.dtype.itemsize
        fd = os.open(f.filename, os.O_WRONLY)
        try:
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], at + done)
        finally:
            os.close(fd)

    def write_features(self, features, *, dtype: str | np.dtype | None = None) -> None:
        """Write features from a [num_nodes, F] array or an iterable of row blocks (in row order)."""
        if isinstance(features, np.ndarray) or hasattr(features, "toarray"):
            arr = features.toarray() if hasattr(features, "toarray") else features
            if arr.ndim != 2 or arr.shape[0] != self.num_nodes:
                raise DatasetError(f"features have shape {arr.shape}, expected ({self.num_nodes}, F)")
            out = self.open_features(arr.shape[1], dtype or arr.dtype)
            out[:] = arr
            out.flush()
            return
        out = None
        row = 0
        for block in features:
            block = block.toarray() if hasattr(block, "toarray") else np.asarray(block)
            if out is None:
                out = self.open_features(block.shape[1], dtype or block.dtype)
            if row + block.shape[0] > self.num_nodes:
                raise DatasetError(f"feature blocks hold more than num_nodes={self.num_nodes} rows")
            out[row : row + block.shape[0]] = block
            row += block.shape[0]
        if out is None or row != self.num_nodes:
            raise DatasetError(f"feature blocks hold {row} rows, expected num_nodes={self.num_nodes}")
        out.flush()

    def write_labels(self, labels, *, num_classes: int | None = None) -> None:
        """Class id per node (int64 [num_nodes], -1 = unlabelled); ``num_classes`` defaults to max + 1."""
        arr = np.asarray(labels).astype(np.int64, copy=False)
        if arr.shape != (self.num_nodes,):
            raise DatasetError(f"labels have shape {arr.shape}, expected ({self.num_nodes},)")
        self.num_classes = int(num_classes if num_classes is not None else (arr.max() + 1 if arr.size else 0))
        self._save("labels", arr)

    def write_splits(self, *, train=None, valid=None, test=None) -> None:
        """Node ids of the train / validation / test sets (int64; any may be None)."""
        for key, ids in (("train_idx", train), ("valid_idx", valid), ("test_idx", test)):
            if ids is not None:
                self._save(key, np.asarray(ids, dtype=np.int64).ravel())

    # -- commit --------------------------------------------------------------------------------
    def _checksums(self, tmp: Path) -> dict[str, Any]:
        """One CRC-32 per block of every file written (read back once, mostly from the page cache)."""
        out: dict[str, Any] = {}
        total = sum((tmp / f"{k}.npy").stat().st_size for k in self.files)
        done = 0
        for key in self.files:
            sums = block_sums(tmp / f"{key}.npy", CHECKSUM_BLOCK_BYTES)
            out[key] = sums.to_json()
            done += sums.size_bytes
            self._report("checksumming", done, total)
        return {"algorithm": "crc32", "block_bytes": CHECKSUM_BLOCK_BYTES, "files": out}

    def _commit(self, tmp: Path) -> None:
        if self.num_edges is None:
            raise DatasetError(f"{self.path}: no graph was written (call write_edges or write_csr)")
        if self._features is not None:
            self._features.flush()
            self._features = None
        meta = {
            "schema": SCHEMA,
            "version": VERSION,
            "name": self.name,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "feature_dim": self.feature_dim,
            "feature_dtype": self.feature_dtype,
            "num_classes": self.num_classes,
            "directed": self.directed,
            "source": self.source,
            "files": self.files,
        }
        for k, v in self.meta.items():
            if k not in meta or k == "source":
                meta[k] = v
        meta["checksums"] = self._checksums(tmp)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")
        open_dataset(tmp)  # never publish a directory that would not open
        old = None
        if self.path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.old-", dir=self.path.parent))
            os.replace(self.path, old / "d")
        os.replace(tmp, self.path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# summary


@dataclass(frozen=True)
class DegreeSummary:
    """Distribution of one degree array (vertices, not edges)."""

    min: int
    median: float
    mean: float
    p99: float
    max: int


@dataclass(frozen=True)
class DatasetInfo:
    """What ``moment data info`` prints: counts, degrees, skew and sizes.

    ``in_degree`` is the row length of the CSR. ``endpoint_degree`` counts the
    edge endpoints at each vertex (in + out; for undirected graphs, whose CSR
    holds both directions, it equals the in-degree). ``top1pct_endpoint_share``
    is the share of endpoints held by the 1% of vertices with most of them,
    ``gini`` the Gini coefficient of the endpoint degree (0 = all equal, → 1 =
    one vertex holds everything).
    """

    name: str
    num_nodes: int
    num_edges: int
    directed: bool
    feature_dim: int
    feature_dtype: str | None
    feature_bytes: int
    graph_bytes: int
    num_classes: int
    labelled_nodes: int
    split_sizes: dict
    in_degree: DegreeSummary
    isolated_nodes: int
    top1pct_endpoint_share: float
    gini: float
    source: dict
    integrity: str = ""

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def _summary(deg: np.ndarray) -> DegreeSummary:
    if deg.size == 0:
        return DegreeSummary(0, 0.0, 0.0, 0.0, 0)
    return DegreeSummary(int(deg.min()), float(np.median(deg)), float(deg.mean()),
                         float(np.percentile(deg, 99)), int(deg.max()))


def skew(endpoint_degree: np.ndarray) -> tuple[float, float]:
    """(share of endpoints held by the top 1% of vertices, Gini coefficient).

    >>> skew(np.ones(100))
    (0.01, 0.0)
    >>> share, gini = skew(np.r_[np.zeros(99), 100.0]); (share, round(gini, 2))
    (1.0, 0.99)
    """
    d = np.sort(np.asarray(endpoint_degree, dtype=np.float64))
    total = d.sum()
    if d.size == 0 or total == 0:
        return 0.0, 0.0
    top = max(1, d.size // 100)  # whole vertices; as the fixtures' SOURCE.md counts them
    share = float(d[-top:].sum() / total)
    # Gini from the sorted values: 1 - 2 * (area under the Lorenz curve), the discrete form
    i = np.arange(1, d.size + 1, dtype=np.float64)
    gini = float((2 * (i * d).sum() / (d.size * total)) - (d.size + 1) / d.size)
    return share, gini


def dataset_info(ds: Dataset, *, chunk: int = DEFAULT_CHUNK_EDGES) -> DatasetInfo:
    """Counts, degree distribution, skew and sizes of an opened dataset (chunked over edges)."""
    indeg = ds.degree()
    if ds.directed:
        endpoints = indeg.copy()
        for a in range(0, ds.num_edges, chunk):
            endpoints += np.bincount(np.asarray(ds.indices[a : a + chunk]), minlength=ds.num_nodes)
    else:
        endpoints = indeg
    share, gini = skew(endpoints)
    splits = {s[: -len("_idx")]: int(getattr(ds, s).shape[0]) for s in SPLITS if getattr(ds, s) is not None}
    labelled = 0
    if ds.labels is not None:
        labelled = sum(int((np.asarray(ds.labels[a : a + chunk]) >= 0).sum()) for a in range(0, ds.num_nodes, chunk))
    return DatasetInfo(
        name=ds.name, num_nodes=ds.num_nodes, num_edges=ds.num_edges, directed=ds.directed,
        feature_dim=ds.feature_dim, feature_dtype=ds.feature_dtype, feature_bytes=ds.feature_bytes,
        graph_bytes=int(ds.indptr.nbytes + ds.indices.nbytes), num_classes=ds.num_classes,
        labelled_nodes=labelled, split_sizes=splits, in_degree=_summary(indeg),
        isolated_nodes=int((endpoints == 0).sum()), top1pct_endpoint_share=share, gini=gini,
        source=dict(ds.meta.get("source", {})), integrity=ds.integrity,
    )


def fingerprint(ds: Dataset, sample_bytes: int = 1 << 16) -> dict[str, Any]:
    """A cheap identity of a dataset: its counts and a CRC-32 of the first and last ``sample_bytes``
    of its feature rows (reads at most ``2 * sample_bytes``). Two datasets with the same counts
    but different features almost surely differ; a placement records it to refuse the wrong one.
    """
    out: dict[str, Any] = {"num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
                           "feature_dim": ds.feature_dim, "feature_dtype": ds.feature_dtype}
    if ds.features is not None and ds.features.size:
        flat = np.asarray(ds.features).reshape(-1).view(np.uint8)
        k = min(sample_bytes, flat.size)
        out["features_crc32"] = zlib.crc32(flat[-k:].tobytes(), zlib.crc32(flat[:k].tobytes()))
    return out
