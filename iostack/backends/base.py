"""The read-backend interface: read rows of a bin file into a host or device buffer."""

from __future__ import annotations

import ctypes
import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from iostack.bins import PAGE, BinFile


def aligned_empty(rows: int, row_bytes: int) -> np.ndarray:
    """An uninitialised ``(rows, row_bytes)`` uint8 array starting on a page boundary (O_DIRECT can read into it)."""
    raw = np.empty(rows * row_bytes + PAGE, np.uint8)
    a = (-raw.ctypes.data) % PAGE
    return raw[a:a + rows * row_bytes].reshape(rows, row_bytes)



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
    says whether it actually does, on its file system).
    """

    name: str = "?"
    direct: bool = True

    @abstractmethod
    def open(self, info: BinFile) -> BinHandle:
        """Open a bin file for reading."""

    @abstractmethod
    def read_rows(self, handle: BinHandle, rows: np.ndarray, out: np.ndarray) -> int:
        """Read ``rows`` (int64, any order, duplicates allowed) into ``out`` (uint8, ``(n, row_bytes)``).

        ``out[i]`` receives row ``rows[i]``. Returns the number of read requests
        issued to the device (after sorting, de-duplication and coalescing).
        """

    def read_rows_at(self, handle: BinHandle, rows: np.ndarray, out: np.ndarray, positions: np.ndarray) -> int:
        """Like :meth:`read_rows`, but row ``rows[i]`` goes to ``out[positions[i]]`` (``out`` may be larger).

        Lets a gather drop SSD rows straight into its result. This default
        reads to a scratch array and scatters; a backend may read in place.
        """
        buf = aligned_empty(len(rows), out.shape[1])
        requests = self.read_rows(handle, rows, buf)
        out[positions] = buf
        return requests

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
