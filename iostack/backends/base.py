"""The read-backend interface: read rows of a bin file into a host or device buffer."""

from __future__ import annotations

import ctypes
import functools
import mmap
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from iostack.bins import PAGE, BinFile


def aligned_empty(rows: int, row_bytes: int) -> np.ndarray:
    """An uninitialised ``(rows, row_bytes)`` uint8 array starting on a page boundary (O_DIRECT can read into it)."""
    raw = np.empty(rows * row_bytes + PAGE, np.uint8)
    a = (-raw.ctypes.data) % PAGE
    return raw[a:a + rows * row_bytes].reshape(rows, row_bytes)


class AlignedPool:
    """Page-aligned host buffers for gather results, taken back and reused when a result is freed.

    A fresh buffer is page-faulted while the O_DIRECT reads land in it (inside
    ``io_submit``, with the device idle): 85 ms to over a second per 256 MiB on
    this machine (transparent huge pages compacting under load), where the reads
    themselves take ~0.8 s. fio, and the store on a GPU (its pinned staging),
    reuse their buffers; this gives the host gather the same. Each buffer is an
    anonymous ``mmap`` (page-aligned); a handed-out array and every view of it
    keep an exporting array alive, whose finalizer returns the mapping, so a
    buffer is reused only after the last tensor on it is gone. At most ``keep``
    idle buffers are held; capacities are powers of two (batches of a run vary
    in size), pages never touched stay unallocated.

    >>> pool = AlignedPool(keep=2)
    >>> a = pool.empty(3, 4096)
    >>> a.shape, a.ctypes.data % 4096
    ((3, 4096), 0)
    >>> del a
    >>> pool.idle
    1
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._idle: list[mmap.mmap] = []
        self._lock = threading.Lock()

    @property
    def idle(self) -> int:
        """Buffers held for reuse."""
        return len(self._idle)

    def empty(self, rows: int, row_bytes: int) -> np.ndarray:
        """An uninitialised page-aligned ``(rows, row_bytes)`` uint8 array, a reused buffer when one fits."""
        need = max(1, rows * row_bytes)
        with self._lock:
            fits = [m for m in self._idle if len(m) >= need]
            buf = min(fits, key=len) if fits else None
            if buf is not None:
                self._idle.remove(buf)
        if buf is None:
            buf = mmap.mmap(-1, max(PAGE, 1 << (need - 1).bit_length()))
        # the exporting array: every view's .base, so the buffer returns only when all are gone
        held = np.frombuffer(buf, np.uint8, count=need)
        weakref.finalize(held, self._give_back, buf)
        return held[:rows * row_bytes].reshape(rows, row_bytes)

    def _give_back(self, buf: mmap.mmap) -> None:
        with self._lock:
            self._idle.append(buf)
            if len(self._idle) > self.keep:  # the smallest goes: it fits the fewest requests
                self._idle.remove(min(self._idle, key=len))



@dataclass(frozen=True)
class Extents:
    """The distinct extents (pages or rows) a read asks for, sorted, and which request wants which.

    ``uniq``: the distinct extent indices, ascending. ``order``: the requests in
    extent order (stable: equal extents keep request order). ``sinv``: the index
    into ``uniq`` of each request in that order. ``first``: positions in
    ``order`` of each extent's first request (``first.size == uniq.size``).
    """

    uniq: np.ndarray
    order: np.ndarray
    sinv: np.ndarray
    first: np.ndarray


def sorted_extents(key: np.ndarray) -> Extents:
    """:class:`Extents` of ``key`` (int64 extent index per request, any order) from one stable argsort.

    What ``np.unique(key, return_inverse=True)`` then an argsort of the inverse
    give, for one sort instead of two and no search: 5 ms instead of 21 ms for
    65,536 requests, time during which the device has nothing to read.

    >>> e = sorted_extents(np.array([7, 2, 7, 5]))
    >>> e.uniq.tolist(), e.order.tolist(), e.sinv.tolist(), e.first.tolist()
    ([2, 5, 7], [1, 3, 0, 2], [0, 1, 2, 2], [0, 1, 2])
    """
    order = np.argsort(key, kind="stable")
    skey = key[order]
    new = np.empty(skey.size, np.bool_)
    new[:1] = True
    np.not_equal(skey[1:], skey[:-1], out=new[1:])
    first = np.flatnonzero(new)
    return Extents(skey[first], order, np.cumsum(new) - 1, first)


def coalesced_runs(brk: np.ndarray, size: int, per_read: int) -> tuple[np.ndarray, np.ndarray]:
    """Start index and length of each read: runs of ``0..size-1`` cut at ``brk`` and every ``per_read`` items."""
    starts = np.concatenate([[0], brk]).astype(np.int64)
    lens = np.diff(np.concatenate([starts, [size]]))
    if lens.max() > per_read:  # split runs longer than one read into pieces
        reps = -(-lens // per_read)
        piece = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
        run_start, run_len = np.repeat(starts, reps), np.repeat(lens, reps)
        starts = run_start + piece * per_read
        lens = np.minimum(run_len - piece * per_read, per_read)
    return starts, lens


def _int64(a, what: str) -> np.ndarray:
    """``a`` (numpy, torch on any device, sequence) as a flat int64 host array."""
    if isinstance(a, torch.Tensor):
        a = a.detach().to("cpu").numpy()
    arr = np.asarray(a)
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{what}: expected integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False).reshape(-1)


def _byte_rows(out, info: BinFile, on_device: bool = False):
    """``out`` as rows of bytes ``(n, row_bytes)``: a host numpy view (device None) or a device uint8 tensor
    (``on_device``: a host tensor that stands for device memory stays a tensor)."""
    rb = info.row_bytes
    if isinstance(out, torch.Tensor):
        if out.dim() != 2 or out.shape[1] * out.element_size() != rb or out.stride(1) != 1:
            raise ValueError(f"out must be a tensor of rows of {rb} bytes ((n, {rb}) uint8 or (n, dim) of the "
                             f"bin's dtype, contiguous rows), got {out.dtype} {tuple(out.shape)}")
        view = out if out.dtype == torch.uint8 else out.view(torch.uint8)
        if view.device.type == "cpu" and not on_device:
            return view.detach().numpy(), None
        return view, view.device
    if not isinstance(out, np.ndarray) or out.ndim != 2 or out.dtype != np.uint8 or out.shape[1] != rb:
        raise ValueError(f"out must be uint8 of shape (n, {rb}), got "
                         f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}")
    return out, None


@functools.cache
def libc_syscall():
    """libc's ``syscall`` through ctypes (errno kept, ``long`` result), loaded once per process:
    the native AIO and io_uring engines issue their system calls through it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall


class CompletedPrefix:
    """Tracks reads completing out of order and reports how many leading ones are all done.

    ``progress(p)`` (if given) is called when reads ``0..p-1`` have all
    completed and at least ``every`` completions arrived since the last call,
    and once more with ``p = m`` by :meth:`finish`: the caller copies finished
    data out there while later reads are still in flight.
    """

    def __init__(self, m: int, progress, every: int) -> None:
        self.m, self.progress, self.every = m, progress, every
        self.done = np.zeros(m, np.bool_) if progress is not None else None
        self.prefix = self.since = 0

    def completed(self, idx: np.ndarray) -> None:
        if self.done is None:
            return
        self.done[idx] = True
        self.since += idx.size
        if self.since >= self.every:
            self.since = 0
            if self.prefix < self.m and self.done[self.prefix]:
                rest = self.done[self.prefix:]
                z = int(np.argmin(rest))
                self.prefix = self.m if rest[z] else self.prefix + z
                self.progress(self.prefix)

    def finish(self) -> None:
        if self.progress is not None and self.prefix < self.m:
            self.progress(self.m)


@dataclass(frozen=True)
class BinHandle:
    """An open bin: its layout, whether reads bypass the page cache, and why not if they do not."""

    info: BinFile
    fid: int
    direct: bool
    note: str | None = None


class ReadBackend(ABC):
    """Reads rows of SSD bin files. Thread-safe: several gathers may call :meth:`read_rows` at once.

    ``name`` is the backend's name (``"posix"``, ``"kvikio"``); ``direct`` says
    whether it was asked to bypass the page cache (each :class:`BinHandle`
    says whether it actually does, on its file system); ``device_reads``
    whether its reads land in device memory themselves (KvikIO) rather than
    in host memory that is then copied up.

    :meth:`read_rows` is the validated public front; a backend implements the
    host core :meth:`_read` (and, with ``device_reads``, :meth:`_read_device`).
    """

    name: str = "?"
    direct: bool = True
    device_reads: bool = False

    @abstractmethod
    def open(self, info: BinFile) -> BinHandle:
        """Open a bin file for reading."""

    def read_rows(self, handle: BinHandle, rows, out, positions=None, *, transfer=None) -> int:
        """Read ``rows`` (int, any order, duplicates allowed) of ``handle``'s bin into ``out``.

        Row ``rows[i]`` goes to ``out[i]``, or to ``out[positions[i]]`` when
        ``positions`` is given (``out`` may then be larger). ``out`` is a numpy
        uint8 array ``(n, row_bytes)`` or a torch tensor on any device, either
        uint8 ``(n, row_bytes)`` or ``(n, dim)`` of the bin's dtype, with
        contiguous rows. A device ``out`` is filled by the backend's device
        reads when it has them (no host copy), else from one host read and one
        copy up. ``transfer`` (an :class:`iostack.transfer.Transfer`) counts the
        copies a device read makes. Returns the number of read requests issued
        to the device (after sorting, de-duplication and coalescing).

        Raises
        ------
        ValueError
            When ``rows``/``positions`` are not integers or ``out`` does not fit them.
        IndexError
            When a row is outside the bin or a position outside ``out``.
        """
        checked = self._checked(handle, rows, out, positions, transfer)
        if checked is None:
            return 0
        rows, view, dev, positions = checked
        if dev is None:
            return self._read(handle, rows, view, positions)
        if self.device_reads:
            return self._read_device(handle, rows, view, positions, transfer)
        # a host-only backend: one host read, one copy up (the store stages in pinned memory instead)
        buf = torch.from_numpy(aligned_empty(rows.size, handle.info.row_bytes))
        requests = self._read(handle, rows, buf.numpy(), None)
        if transfer is not None:
            transfer.count(buf, "device")
        if positions is None:
            view.copy_(buf)
        else:
            view[torch.from_numpy(positions).to(view.device)] = buf.to(view.device)
        return requests

    def read_rows_many(self, items: Sequence[tuple[BinHandle, object, object, object]], *, transfer=None) -> list[int]:
        """:meth:`read_rows` of several bins, one ``(handle, rows, out, positions)`` per item; requests per item.

        The items' ``out`` (or the rows of one ``out`` that their ``positions``
        name) must not overlap. This default reads the items one after another;
        a backend that can keep several files' reads in flight at once
        (:class:`~iostack.backends.posix.PosixBackend` with an asynchronous
        engine) overrides it, so that several SSDs work at the same time and the
        busiest one, not the sum of all, sets the time of a gather.
        """
        return [self.read_rows(h, rows, out, positions, transfer=transfer) for h, rows, out, positions in items]

    def _checked(self, handle: BinHandle, rows, out, positions, transfer):
        """:meth:`read_rows`'s arguments validated: ``(rows, view, device, positions)``, None when no rows."""
        info = handle.info
        rows = _int64(rows, "rows")
        # device memory that torch calls the host's (the tests' fake accelerator)
        labelled = transfer is not None and transfer.accelerated and isinstance(out, torch.Tensor) \
            and out.device.type == "cpu" and transfer.memory.kind_of(out) == "device"
        view, dev = _byte_rows(out, info, labelled)
        if labelled:
            dev = transfer.device
        if positions is None:
            if view.shape[0] != rows.size:
                raise ValueError(f"out has {view.shape[0]} rows for {rows.size} requested rows (pass positions= "
                                 "to scatter into a larger out)")
        else:
            positions = _int64(positions, "positions")
            if positions.size != rows.size:
                raise ValueError(f"positions has {positions.size} entries for {rows.size} rows")
            if positions.size and (positions.min() < 0 or positions.max() >= view.shape[0]):
                raise IndexError(f"positions must lie in 0..{view.shape[0] - 1}")
        if rows.size == 0:
            return None
        if rows.min() < 0 or rows.max() >= info.rows:
            bad = int(rows[(rows < 0) | (rows >= info.rows)][0])
            raise IndexError(f"row {bad} is outside bin {info.bin_id} ({info.rows} rows)")
        return rows, view, dev, positions

    @abstractmethod
    def _read(self, handle: BinHandle, rows: np.ndarray, out: np.ndarray, positions: np.ndarray | None) -> int:
        """The host core: validated int64 ``rows`` into host uint8 ``out`` (at ``positions`` if given)."""

    def _read_device(self, handle: BinHandle, rows: np.ndarray, out: torch.Tensor, positions: np.ndarray | None,
                     transfer) -> int:
        """The device core (backends with ``device_reads``): into a device uint8 ``out``."""
        raise NotImplementedError(f"the {self.name} backend does not read into device memory")

    def close_handle(self, handle: BinHandle) -> None:  # noqa: B027 - optional
        """Forget ``handle``."""

    @abstractmethod
    def close(self) -> None:
        """Release buffers, workers and files."""

    @property
    def buffer_bytes(self) -> int:
        """Host memory the backend holds for its buffers, bytes."""
        return 0

    def __enter__(self) -> ReadBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
