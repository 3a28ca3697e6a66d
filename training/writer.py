"""Writing a dataset directory: :class:`DatasetWriter` builds it in a temporary sibling, renamed into place.

The format is :mod:`training.data`'s (``docs/dataset-format.md``); the
chunked CSR builder behind :meth:`DatasetWriter.write_edges` is
:mod:`training.csr`.

>>> import tempfile, numpy as np
>>> from training.data import open_dataset
>>> d = tempfile.mkdtemp()
>>> with DatasetWriter(f"{d}/path", num_nodes=3) as w:
...     w.write_edges(np.array([[0, 1], [1, 2]]))
2
>>> open_dataset(f"{d}/path").neighbours(2).tolist()
[1]
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

import training.data as _data
from iostack.checksums import block_sums
from momentbase.jsontypes import JsonObject, JsonValue
from momentbase.space import reserve, write_all
from planner.progress import Progress
from training.data import (
    DEFAULT_CHUNK_EDGES,
    SCHEMA,
    VERSION,
    DatasetError,
    index_dtype,
    open_dataset,
    open_paged_npy,
)
from training.vocab import DATASET_FEATURE_DTYPES


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


log = logging.getLogger(__name__)

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's, and running
    return True


def sweep_leftovers(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary directories (or files) that killed writers of ``path`` left beside it; the ones removed.

    A writer's directory is ``.<name>.tmp-<pid>-*`` (:class:`DatasetWriter`; a checkpoint's file is
    ``.<name>.tmp-<pid>``); it is a leftover when no process ``<pid>`` runs (a writer running now
    keeps its own). Directories named without a pid (written before the pid was part of the name)
    are left alone: nothing tells whether their writer still runs.
    """
    p = Path(path)
    prefix = f".{p.name}.tmp-"
    swept = []
    if not p.parent.is_dir():
        return swept
    for d in p.parent.iterdir():
        pid = d.name[len(prefix):].split("-", 1)[0] if d.name.startswith(prefix) else ""
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            if d.is_dir():
                shutil.rmtree(d, ignore_errors=True)
            else:
                d.unlink(missing_ok=True)
            swept.append(d)
    return sorted(swept)


def _lock(path: Path) -> int:
    """Take the writer's lock on ``path`` (``.<name>.lock`` beside it, holding ``pid time host``); its fd.

    :class:`DatasetError` naming the holder when another writer of ``path`` has it. The lock is
    ``flock``'s: the kernel drops it when its process dies, so a killed writer never blocks the next.
    """
    lock = path.parent / f".{path.name}.lock"
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DatasetError(f"{path.parent}: cannot create a lock file there ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").split()
            os.close(fd)
            pid, since, host = (holder + ["?", "?", "?"])[:3]
            raise DatasetError(f"{path}: another writer has it (process {pid}, since {since}, on host "
                               f"{host}); wait for it to finish or write elsewhere") from None
        try:  # the file we locked may have been unlinked by a writer finishing meanwhile: lock the new one
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {socket.gethostname()}\n"
              .encode(), 0)
    return fd


def _unlock(path: Path, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path.parent / f".{path.name}.lock")  # unlinked while held: the next locker checks samestat
    os.close(fd)


@contextlib.contextmanager
def output_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold the writer's lock on ``path`` for a whole job that prepares files before its
    :class:`DatasetWriter` (made with ``lock=False`` inside); :class:`DatasetError` naming the holder."""
    fd = _lock(Path(path))
    try:
        yield
    finally:
        _unlock(Path(path), fd)


class DatasetWriter:
    """Build a dataset directory atomically: nothing appears at ``path`` until every file is written.

    Use as a context manager. Files go into a temporary sibling directory
    (``.<name>.tmp-*``); on a clean exit ``meta.json`` is written, the directory
    is validated and renamed to ``path``. On an exception the temporary directory
    is removed and ``path`` is left as it was; a writer that was killed leaves it, and
    the next writer of ``path`` removes it (:func:`sweep_leftovers`, named in ``swept``).

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
        source: Mapping[str, JsonValue] | None = None,
        overwrite: bool = False,
        chunk_edges: int = DEFAULT_CHUNK_EDGES,
        progress: Progress | None = None,
        work_dir: str | os.PathLike | None = None,
        lock: bool = True,
    ) -> None:
        self.path = Path(path)
        #: a fixed directory to build in that outlives a failed run (a resumable writer's); the
        #: default is a fresh temporary sibling, removed on failure
        self.work_dir = None if work_dir is None else Path(work_dir)
        #: take the output's lock on entry (False: the caller holds it, :func:`output_lock`)
        self.lock = lock
        if num_nodes < 0:
            raise DatasetError(f"num_nodes must be >= 0, got {num_nodes}")
        self.num_nodes = int(num_nodes)
        self.name = name or self.path.name
        self.source = dict(source or {})
        self.overwrite = overwrite
        self.chunk_edges = int(chunk_edges)
        self.progress = progress
        self.meta: JsonObject = {}
        self.files: dict[str, JsonObject] = {}
        self.num_edges: int | None = None
        #: the CSR row pointers once a graph is written (in-degree = np.diff(indptr))
        self.indptr: np.ndarray | None = None
        self.directed: bool = True
        self.feature_dim = 0
        self.feature_dtype: str | None = None
        self.num_classes = 0
        self._tmp: Path | None = None
        self.swept: list[Path] = []  #: killed writers' temporary directories removed on entry
        self._features: np.memmap | None = None
        if self.path.exists() and not overwrite:
            raise DatasetError(f"{self.path}: already exists; remove it or pass `overwrite=True` to replace it")
        if not self.path.parent.is_dir():
            raise DatasetError(f"{self.path.parent}: no such directory to write the dataset into")

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> DatasetWriter:
        self._lock_fd = _lock(self.path) if self.lock else None
        try:
            return self._enter()
        except BaseException:
            if self._lock_fd is not None:
                _unlock(self.path, self._lock_fd)
            raise

    def _enter(self) -> DatasetWriter:
        if self.path.exists() and not self.overwrite:  # again, under the lock: a writer may have finished
            raise DatasetError(f"{self.path}: already exists; remove it or pass `overwrite=True` to replace it")
        self.swept = sweep_leftovers(self.path)
        for d in self.swept:  # shown on stderr by logging's last-resort handler when nothing is configured
            log.warning("removed %s, the leftover of a writer of %s that was killed", d, self.path)
        try:
            if self.work_dir is not None:
                self.work_dir.mkdir(exist_ok=True)
                self._tmp = self.work_dir
                return self
            # the writer's pid in the name: a later run can tell a killed writer's leftovers from a live one's
            self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.tmp-{os.getpid()}-", dir=self.path.parent))
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
            # a work_dir is kept for the next run to resume from (a commit has renamed it away)
            if tmp.exists() and self.work_dir is None:
                shutil.rmtree(tmp, ignore_errors=True)
            self._tmp = None
            if self._lock_fd is not None:
                _unlock(self.path, self._lock_fd)

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

    def record_file(self, key: str, dtype: DTypeLike, shape: Sequence[int]) -> None:
        """Declare ``<key>.npy``, written into :attr:`tmp_dir` by the caller, with its dtype and shape."""
        self.files[key] = {"dtype": str(np.dtype(dtype)), "shape": [int(s) for s in shape]}

    def record_csr(self, num_edges: int, idt: np.dtype, *, directed: bool) -> None:
        """Declare ``indptr.npy`` and ``indices.npy``, written into :attr:`tmp_dir` by the caller."""
        self.record_file("indptr", np.int64, [self.num_nodes + 1])
        self.record_file("indices", idt, [num_edges])
        self.num_edges = int(num_edges)
        self.directed = directed

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
        from training.csr import count_rows, edge_chunks, place_edges, sort_rows

        tmp = self.tmp_dir
        chunks = edge_chunks(_as_chunks(edges), self.num_nodes, self.chunk_edges, undirected=undirected,
                             drop_self_loops=drop_self_loops)
        indptr = count_rows(chunks, self.num_nodes, self._report)
        idt = index_dtype(self.num_nodes)
        raw_path = tmp / "indices.unsorted.npy"
        place_edges(chunks, indptr, raw_path, idt, self._report)
        if not dedup:
            os.replace(raw_path, tmp / "indices.npy")
            self._record_csr(indptr, int(indptr[-1]), idt, undirected)
            return int(indptr[-1])
        new_indptr = sort_rows(raw_path, indptr, tmp / "indices.npy", self.chunk_edges, self._report)
        raw_path.unlink()
        self._record_csr(new_indptr, int(new_indptr[-1]), idt, undirected)
        return int(new_indptr[-1])

    def _record_csr(self, indptr: np.ndarray, total: int, idt: np.dtype, undirected: bool) -> None:
        self._save("indptr", indptr)
        self.indptr = indptr
        self.files["indices"] = {"dtype": str(np.dtype(idt)), "shape": [total]}
        self.num_edges = total
        self.directed = not undirected

    # -- node data -----------------------------------------------------------------------------
    def open_features(self, feature_dim: int, dtype: str | np.dtype = "float32", *,
                      reuse: bool = False) -> np.memmap:
        """A writable [num_nodes, feature_dim] memmap of ``features.npy`` to fill by row blocks.

        ``reuse``: keep a ``features.npy`` of that dtype and shape already in :attr:`tmp_dir`
        (a resumed run's), rows and all, instead of making a fresh one.
        """
        dt = np.dtype(dtype)
        if dt.name not in DATASET_FEATURE_DTYPES:
            raise DatasetError(f"feature dtype {dt.name} is not one of {', '.join(DATASET_FEATURE_DTYPES)}")
        shape = (self.num_nodes, int(feature_dim))
        fpath = self.tmp_dir / "features.npy"
        old = None
        if reuse and fpath.exists():
            try:
                old = np.load(fpath, mmap_mode="r+")
            except (ValueError, OSError):
                old = None
        if old is not None and old.dtype == dt and old.shape == shape:
            reserve(fpath)  # a resumed file may hold holes a store would fill: room first, not SIGBUS
            self._features = old
        else:
            self._features = open_paged_npy(fpath, dt, shape)
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
            raise DatasetError(
                f"feature rows of shape {rows.shape} at row {start} do not fit [{f.shape[0]}, {f.shape[1]}]"
            )
        at = f.offset + start * f.shape[1] * f.dtype.itemsize
        fd = os.open(f.filename, os.O_WRONLY)
        try:
            write_all(fd, memoryview(rows), f.filename, at)
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
            self.write_feature_rows(row, block)  # pwrite: the written pages never count in this RSS
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
    def _checksums(self, tmp: Path) -> JsonObject:
        """One CRC-32 per block of every file written (read back once, mostly from the page cache)."""
        block = _data.CHECKSUM_BLOCK_BYTES  # read at the call: a test sets small blocks there
        out: JsonObject = {}
        total = sum((tmp / f"{k}.npy").stat().st_size for k in self.files)
        done = 0
        for key in self.files:
            sums = block_sums(tmp / f"{key}.npy", block)
            out[key] = sums.to_json()
            done += sums.size_bytes
            self._report("checksumming", done, total)
        return {"algorithm": "crc32", "block_bytes": block, "files": out}

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


__all__ = ["DatasetWriter", "output_lock", "sweep_leftovers"]
