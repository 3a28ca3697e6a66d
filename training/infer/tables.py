"""What layer-wise inference reads and writes: feature tables behind the tiered store, and the output arrays.

Every layer reads its input rows through a :class:`~iostack.store.FeatureStore`
``gather``, whatever holds them:

- layer 0, the dataset's features: the placement's store (GPU, CPU and SSD bins
  where ``moment place`` put them), or without a placement the dataset's
  ``features.npy`` through a :class:`MappedTier` (its memory map: pages read on
  demand, never the whole matrix copied in);
- layer ``l > 0``, the output of layer ``l - 1``: a new SSD bin file written
  while that layer ran (:func:`write_table`: :func:`iostack.bins.write_bin_file`,
  with its per-block CRCs, temporary name and rename), read back by the SSD tier
  (:func:`open_table`, direct I/O where the file system allows: the table's rows
  do not pile up in this process's memory or the page cache).

The results (logits, predictions, embeddings) are ``.npy`` files written front to
back under a temporary name and renamed into place together at the end
(:class:`NpyOut`): ``np.load(path, mmap_mode="r")`` maps them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from iostack.bins import BinFile, write_bin_file
from iostack.placement import simple_placement
from iostack.tiers import Tier
from iostack.transfer import Transfer
from momentbase.space import write_all
from training.data import open_paged_npy

__all__ = ["MappedTier", "NpyOut", "open_mapped", "open_table", "write_table"]

#: a chunk of a layer's output: rows ``start..stop-1`` as a host float32 array ``[stop - start, dim]``
Chunk = tuple[int, int, np.ndarray]


class MappedTier(Tier):
    """One bin served from a memory-mapped array (row ``r`` of the bin is ``array[r]``), read through the
    page cache: the dataset's ``features.npy`` when no placement is given."""

    held = "file"

    def __init__(self, bin_id: int, array: np.ndarray) -> None:
        super().__init__([bin_id])
        self.array = array
        self._row_bytes = int(array.shape[1]) * array.dtype.itemsize

    def read(self, bin_id: int, rows: torch.Tensor, out: torch.Tensor, positions: torch.Tensor | None) -> None:
        t0 = time.perf_counter()
        vals = torch.from_numpy(np.ascontiguousarray(self.array[rows.numpy()]))
        if positions is None:
            out.copy_(vals)
        else:
            out[positions] = vals
        c = rows.numel()
        self.counters[bin_id].add(c, c * self._row_bytes, 1, time.perf_counter() - t0)

    def row_type(self) -> tuple[np.dtype, int] | None:
        return np.dtype(self.array.dtype), int(self.array.shape[1])


def open_mapped(features: np.ndarray, transfer: Transfer):
    """A store over ``features`` (``[V, dim]``, a memory map) served by one :class:`MappedTier`."""
    from iostack.store import FeatureStore

    placement = simple_placement(int(features.shape[0]), [("ssd", int(features.shape[0]))])
    return FeatureStore(placement, None, memory=transfer.memory, tiers=[MappedTier(0, features)])


def write_table(path: Path, num_rows: int, dim: int, chunks: Iterator[Chunk]) -> BinFile:
    """Layer output ``chunks`` (in row order, covering ``0..num_rows-1``) as the SSD bin file ``path``.

    :func:`~iostack.bins.write_bin_file` asks for its blocks of rows (16 MiB at a time) and this feeds it
    from ``chunks`` as they come, holding at most one block and one chunk.
    """
    pending: list[np.ndarray] = []
    have = [0, 0]  # rows held in `pending` start at have[0], end at have[1]

    def block(start: int, stop: int) -> np.ndarray:
        while have[1] < stop:
            a, b, rows = next(chunks)
            if a != have[1]:
                raise AssertionError(f"layer chunks out of order: {a} after {have[1]}")
            pending.append(np.ascontiguousarray(rows, np.float32))
            have[1] = b
        rows = np.concatenate(pending) if len(pending) > 1 else pending[0]
        part, rest = rows[start - have[0]:stop - have[0]], rows[stop - have[0]:]
        pending[:] = [rest] if rest.shape[0] else []
        have[0] = stop
        return part.view(np.uint8).reshape(stop - start, dim * 4)

    # not fsynced: a scratch table, read back at once and removed after the next layer
    return write_bin_file(path, 0, np.dtype(np.float32), dim, num_rows, block, fsync=False)


def open_table(path: Path, num_rows: int, backend: str, transfer: Transfer):
    """The store over the SSD bin ``path`` (:func:`write_table`'s) of ``num_rows`` rows: vertex ``v`` is row ``v``."""
    from training.features import open_store

    placement = simple_placement(num_rows, [("ssd", num_rows)], ssd_paths=[path.name])
    return open_store(placement, path.parent, None, backend, transfer=transfer)


class NpyOut:
    """A ``.npy`` result of ``shape`` written front to back: :meth:`write` the rows in order, then :meth:`commit`
    renames it into place (``.<name>.tmp-<pid>`` until then; :meth:`discard` removes it)."""

    def __init__(self, path: Path, dtype: np.dtype | type, shape: tuple[int, ...]) -> None:
        self.path, self.shape, self.dtype = Path(path), shape, np.dtype(dtype)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        m = open_paged_npy(self.tmp, self.dtype, shape)  # header, length and disk space settled up front
        self._at, self._end = int(m.offset), int(m.offset) + int(np.prod(shape)) * self.dtype.itemsize
        del m
        self._fd = os.open(self.tmp, os.O_WRONLY)

    def write(self, rows: np.ndarray) -> None:
        """The next rows (in order).

        Raises
        ------
        AssertionError
            More rows than the shape holds (a bug of the caller).
        NoSpaceError
            The disk filled (naming the file).
        """
        data = np.ascontiguousarray(rows, self.dtype)
        if self._at + data.nbytes > self._end:
            raise AssertionError(f"{self.path}: more rows written than its shape {self.shape} holds")
        self._at += write_all(self._fd, data.data, self.tmp, at=self._at)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def commit(self) -> None:
        """Flush to disk and rename into place.

        Raises
        ------
        AssertionError
            Fewer rows were written than the shape holds (a bug of the caller).
        """
        if self._at != self._end:
            raise AssertionError(f"{self.path}: {self._end - self._at} bytes of its rows were never written")
        os.fsync(self._fd)
        self.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()


def drain(chunks: Iterator[Chunk], sinks: list[Callable[[Chunk], None]]) -> int:
    """Hand every chunk to every sink, in order; the rows seen."""
    n = 0
    for chunk in chunks:
        for sink in sinks:
            sink(chunk)
        n += chunk[1] - chunk[0]
    return n
