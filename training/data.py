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

Writing goes through :class:`training.writer.DatasetWriter`, which builds the directory in a
temporary sibling and renames it into place only when every file is complete,
and which turns edge lists into CSR in chunks with memory bounded by the chunk
size (plus two ``int64`` arrays of ``num_nodes``)::

    >>> import tempfile, numpy as np
    >>> from training.writer import DatasetWriter
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
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from iostack.checksums import BlockSums, bad_blocks
from momentbase.jsontypes import JsonObject, JsonValue
from momentbase.space import reserve
from planner.progress import Progress
from training.errors import TrainingError
from training.vocab import DATASET_FEATURE_DTYPES

SCHEMA = "moment.dataset"
VERSION = 1

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
    meta: Mapping[str, JsonValue]
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
    # Exception: np.load's header parser raises assorted errors on a damaged header (ValueError,
    # SyntaxError, tokenize.TokenError, MemoryError ...; tests/test_fuzz_files.py)
    except Exception as exc:
        if "mmap length is greater than file size" in str(exc):
            raise DatasetError(f"{path}: shorter than its .npy header says (cut short); "
                               "re-import the dataset") from None
        raise DatasetError(f"{path}: not a readable .npy file ({exc}); re-import the dataset") from None


def read_meta(path: str | os.PathLike) -> dict:
    """``meta.json`` of a dataset directory, with its schema and version checked."""
    meta_path = Path(path) / "meta.json"
    if not Path(path).is_dir():
        raise DatasetError(
            f"{path}: no such dataset directory (create one with `moment data import` or `moment data synth`)"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        if (Path(path) / "partition.json").is_file():
            raise DatasetError(f"{path}: a partitioned dataset (partition.json), not one dataset; open it with "
                               "`training.partition.read.open_partition`, or give its source dataset") from None
        raise DatasetError(f"{meta_path}: missing; {path} is not a dataset directory (re-import it)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{meta_path}: not valid JSON ({exc}); re-import the dataset") from None
    if isinstance(meta, dict) and meta.get("format") == "moment.partition-part":
        raise DatasetError(f"{path}: partition {meta.get('part')} of the partitioned dataset {Path(path).parent}, "
                           "not a dataset of its own (its indices are global ids); open the parent with "
                           "`training.partition.read.open_partition`")
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        raise DatasetError(
            f"{meta_path}: schema is {meta.get('schema') if isinstance(meta, dict) else None!r}, expected {SCHEMA!r}"
        )
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
            f"{p / 'indptr.npy'}: must run from 0 to num_edges={e}, runs from {int(ip[0])} to {int(ip[-1])}; "
            "re-import the dataset"
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


def verify_checksums(root: Path, meta: Mapping[str, JsonValue], mode: str = "sample",
                     progress: Progress | None = None, *, keys: Iterable[str] | None = None) -> str:
    """Check the dataset files against the CRC-32s ``meta.json`` records; say what was checked.

    ``mode`` ``"sample"`` reads, of every file, its first and last block and
    :data:`SAMPLE_BLOCKS` others at random (all of a file of at most
    ``SAMPLE_BLOCKS + 2`` blocks): at most 32 MiB per file, whatever its size.
    ``"full"`` reads every block; ``"none"`` reads nothing. Every file's size
    is checked in all modes but ``"none"``. Raises :class:`DatasetError` naming
    the file and the first bad block. A dataset written before checksums
    existed has none: it is accepted and the sentence says so. ``keys``: only
    these files (``meta.json`` keys such as ``"indptr"``); all when None.
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
    keep = None if keys is None else set(keys)
    wanted = [k for k in meta["files"] if keep is None or k in keep]
    for key in wanted:
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
        bad = []
        # 64 blocks (256 MiB) at a time, so that a full check of a large file shows its progress
        for at in range(0, len(which), 64):
            bad += bad_blocks(fpath, sums, which[at:at + 64])
            if progress is not None:
                progress(f"verifying {key}", min(len(which), at + 64), len(which))
        if bad:
            a, b = sums.span(bad[0])
            more = f" and {len(bad) - 1} more of the {len(which)} checked" if len(bad) > 1 else ""
            raise DatasetError(
                f"{fpath}: block {bad[0]} of {n} (bytes {a:,} to {b:,}){more} does not match the CRC-32 "
                "meta.json recorded when the dataset was written: the file is corrupt; re-import or "
                "regenerate the dataset")
        checked += len(set(which))
        total += n
    files = len([k for k in wanted if k in entries])
    if checked == total:
        return f"CRC-32 verified: all {total:,} block(s) of {files} file(s)"
    return (f"CRC-32 verified: {checked:,} of {total:,} blocks of {files} file(s) (each file's first, last "
            f"and {SAMPLE_BLOCKS} random blocks); `moment data info --verify` reads them all")


def open_dataset(path: str | os.PathLike, *, validate: bool = True, verify: str = "sample",
                 progress: Progress | None = None) -> Dataset:
    """Open a dataset directory read-only, memory-mapped, and check it.

    Checks the schema and version, that every file in ``meta["files"]`` exists with
    the declared dtype and shape, the files' bytes against the checksums
    ``meta.json`` records (``verify``: ``"sample"`` of blocks, ``"full"``,
    ``"none"``; see :func:`verify_checksums`), and (unless ``validate=False``)
    the value ranges of :func:`validate_dataset`. Raises :class:`DatasetError`
    naming the file (and the block). ``progress`` follows the checksum reads.
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
    if "features" in arrays and str(arrays["features"].dtype) not in DATASET_FEATURE_DTYPES:
        raise DatasetError(
            f"{root / 'features.npy'}: dtype {arrays['features'].dtype} is not one of {DATASET_FEATURE_DTYPES}"
        )
    for s in SPLITS:
        if s in arrays and arrays[s].ndim != 1:
            raise DatasetError(f"{root / f'{s}.npy'}: must be one-dimensional, has shape {list(arrays[s].shape)}")
    integrity = verify_checksums(root, meta, verify, progress)
    ds = Dataset(path=root, meta=meta, **arrays, integrity=integrity)
    if validate:
        validate_dataset(ds)
    return ds


#: where a feature file's rows start, and what its length is rounded up to (O_DIRECT's alignment)
FEATURE_PAGE = 4096


def paged_header_bytes(row_bytes: int) -> int:
    """The ``.npy`` header size of a features file with rows of ``row_bytes``: one page, or one row when
    rows are whole pages of up to 8 KiB (np.load refuses headers above 10000 bytes)."""
    return row_bytes if row_bytes % FEATURE_PAGE == 0 and row_bytes <= 2 * FEATURE_PAGE else FEATURE_PAGE


def open_paged_npy(path: str | os.PathLike[str], dtype: np.dtype, shape: tuple[int, ...]) -> np.memmap:
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
        reserve(path, fd=f.fileno())  # a full disk fails here in one line, not with SIGBUS at a store
    return np.memmap(path, dtype=dt, mode="r+", offset=total, shape=tuple(shape))


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
    # sum(i * d) by blocks: whole-array temporaries would be two more float64 arrays per vertex
    weighted = sum(float(np.dot(np.arange(a + 1, min(d.size, a + (1 << 22)) + 1, dtype=np.float64),
                                d[a:a + (1 << 22)])) for a in range(0, d.size, 1 << 22))
    gini = float((2 * weighted / (d.size * total)) - (d.size + 1) / d.size)
    return share, gini


def count_ids(read: Callable[[int, int], np.ndarray], total: int, num_nodes: int, *, chunk: int = DEFAULT_CHUNK_EDGES,
              progress: Progress | None = None, stage: str = "counting") -> np.ndarray:
    """How often each id in ``[0, num_nodes)`` occurs among the ``total`` ids ``read(a, b)`` returns by slices.

    int64 ``[num_nodes]``. Slices are at least ``num_nodes / 4`` long: one
    ``np.bincount(..., minlength=num_nodes)`` costs O(num_nodes) whatever its input, so
    counting by small chunks is O(total / chunk * num_nodes) (400 passes over a 0.9 GB
    array for papers100M's 1.6e9 edges in 4 M-edge chunks); this is O(total + num_nodes).
    Memory: the counts, one bincount, one slice.

    >>> ids = np.array([2, 0, 2, 2])
    >>> count_ids(lambda a, b: ids[a:b], 4, 3, chunk=1).tolist()
    [1, 0, 3]
    """
    step = max(chunk, num_nodes // 4, 1)
    counts = np.zeros(num_nodes, dtype=np.int64)
    for a in range(0, total, step):
        b = min(total, a + step)
        np.add(counts, np.bincount(np.asarray(read(a, b)), minlength=num_nodes), out=counts)
        if progress is not None:
            progress(stage, b, total)
    return counts


def dataset_info(ds: Dataset, *, chunk: int = DEFAULT_CHUNK_EDGES, progress: Progress | None = None) -> DatasetInfo:
    """Counts, degree distribution, skew and sizes of an opened dataset (chunked over edges)."""
    indeg = ds.degree()
    if ds.directed:
        endpoints = count_ids(lambda a, b: ds.indices[a:b], ds.num_edges, ds.num_nodes, chunk=chunk,
                              progress=progress, stage="counting out-degrees")
        endpoints += indeg
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


def fingerprint(ds: Dataset, sample_bytes: int = 1 << 16) -> JsonObject:
    """A cheap identity of a dataset: its counts and a CRC-32 of the first and last ``sample_bytes``
    of its feature rows (reads at most ``2 * sample_bytes``). Two datasets with the same counts
    but different features almost surely differ; a placement records it to refuse the wrong one.
    """
    out: JsonObject = {"num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
                           "feature_dim": ds.feature_dim, "feature_dtype": ds.feature_dtype}
    if ds.features is not None and ds.features.size:
        flat = np.asarray(ds.features).reshape(-1).view(np.uint8)
        k = min(sample_bytes, flat.size)
        out["features_crc32"] = zlib.crc32(flat[-k:].tobytes(), zlib.crc32(flat[:k].tobytes()))
    return out

