"""Random reads of any file by pages, through the read backends' engines (O_DIRECT where allowed).

The feature store reads rows of its own bin files; other large files (a CSR's
``indices.npy``, any ``.npy`` array too large to keep in memory) need the same
batched, sorted, coalesced direct reads at arbitrary byte offsets.
:class:`PagedFile` views a file as a bin of page-sized rows, so every
:class:`~iostack.backends.base.ReadBackend` serves it unchanged: the distinct
pages a call needs are read once each, in file order, neighbouring pages
coalesced into one request (up to the backend's ``max_read_bytes``), with
O_DIRECT and an asynchronous engine where the file system allows it (buffered
``preadv`` elsewhere, e.g. tmpfs); ``max_gap_pages`` also reads the pages of
short gaps between needed ones, trading bytes for fewer requests. A file's last partial page cannot be read
with O_DIRECT (the read comes back short, and its continuation is unaligned),
so those few bytes are read once, buffered, when the file is opened.

:meth:`PagedFile.gather` reads fixed-size items (``int32``, ``int64``, ...)
at byte offsets: the general form of ``array[positions]`` for an array file
on disk. It reads at most ``max_buffer_bytes`` of pages per round, so its
memory does not grow with the request.

>>> import numpy as np, tempfile, os
>>> from iostack.backends.posix import PosixBackend
>>> with tempfile.TemporaryDirectory() as d:
...     path = os.path.join(d, "a.bin")
...     np.arange(5000, dtype=np.int32).tofile(path)   # 20000 bytes: 4 whole pages and a tail
...     with PosixBackend(processes=0, threads=2) as be, PagedFile(path, be) as f:
...         values, reads = f.gather(np.array([4999, 0, 1500, 1501]) * 4, np.int32)
...     values.tolist(), reads.pages, reads.requests   # pages 0 and 1 in one request; the tail kept
([4999, 0, 1500, 1501], 3, 1)
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from iostack.backends.base import AlignedPool, ReadBackend, sorted_extents
from iostack.bins import PAGE, BinFile
from iostack.errors import StoreError

#: pages read per round of a gather by default: 16 MiB of buffer
DEFAULT_BUFFER_BYTES = 16 << 20

__all__ = ["DEFAULT_BUFFER_BYTES", "PageReads", "PagedFile"]


@dataclass(frozen=True)
class PageReads:
    """What one call read: distinct pages (``pages``), requests to the device after coalescing
    (``requests``; the buffered tail page is not one), bytes read, and seconds inside the reads."""

    pages: int = 0
    requests: int = 0
    bytes_read: int = 0
    read_s: float = 0.0

    def __add__(self, other: PageReads) -> PageReads:
        return PageReads(self.pages + other.pages, self.requests + other.requests,
                         self.bytes_read + other.bytes_read, self.read_s + other.read_s)


def _with_gaps(pages: np.ndarray, max_gap: int) -> np.ndarray:
    """``pages`` (distinct, ascending) and every page of a gap of at most ``max_gap`` pages between two of them.

    On a device that caps requests per second rather than bytes, one read over
    a short gap costs less than two reads around it.

    >>> _with_gaps(np.array([1, 3, 9, 10]), 1).tolist(), _with_gaps(np.array([1, 3, 9]), 0).tolist()
    ([1, 2, 3, 9, 10], [1, 3, 9])
    """
    if max_gap <= 0 or pages.size < 2:
        return pages
    brk = np.flatnonzero(np.diff(pages) > max_gap + 1) + 1
    first = pages[np.concatenate([[0], brk])]
    lens = pages[np.concatenate([brk - 1, [pages.size - 1]])] - first + 1
    return np.repeat(first - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))


class PagedFile:
    """One file opened for page reads through ``backend`` (its engines, O_DIRECT where allowed).

    The backend is the caller's (one may serve several files); :meth:`close`
    forgets this file's handle, not the backend. Thread-safe as the backend is.
    """

    def __init__(self, path: str | os.PathLike[str], backend: ReadBackend, *,
                 max_buffer_bytes: int = DEFAULT_BUFFER_BYTES, max_gap_pages: int = 0) -> None:
        self.path = str(path)
        try:
            self.file_bytes = os.path.getsize(self.path)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open it for page reads ({exc.strerror or exc})") from None
        self.backend = backend
        self.full_pages = self.file_bytes // PAGE
        self.pages_per_round = max(1, int(max_buffer_bytes) // PAGE)
        self.max_gap_pages = int(max_gap_pages)
        if self.max_gap_pages < 0:
            raise StoreError(f"max_gap_pages must be >= 0, got {max_gap_pages}")
        # the file as a bin of page rows: what every backend reads (no manifest, so no checksums)
        self.info = BinFile(path=self.path, bin_id=-1, dtype="uint8", dim=PAGE, row_bytes=PAGE,
                            row_stride_bytes=PAGE, rows_per_page=1, rows=self.full_pages,
                            file_bytes=self.full_pages * PAGE, crc32=0, crc32_first_block=0)
        self.handle = backend.open(self.info) if self.full_pages else None
        self._tail = np.zeros(PAGE, np.uint8)  # the last partial page, zero-padded
        tail_bytes = self.file_bytes - self.full_pages * PAGE
        if tail_bytes:
            with open(self.path, "rb", buffering=0) as f:
                got = os.pread(f.fileno(), tail_bytes, self.full_pages * PAGE)
            self._tail[:len(got)] = np.frombuffer(got, np.uint8)
        self._pool = AlignedPool(keep=1)
        self._lock = threading.Lock()

    @property
    def direct(self) -> bool:
        """Whether the reads bypass the page cache (O_DIRECT)."""
        return bool(self.handle is not None and self.handle.direct)

    @property
    def note(self) -> str | None:
        """Why the reads are buffered, when they are (the backend's word)."""
        return None if self.handle is None else self.handle.note

    def read_pages(self, pages: np.ndarray) -> tuple[np.ndarray, PageReads]:
        """Pages ``pages`` (distinct, ascending int64 page indices) as a ``(len(pages), PAGE)`` uint8 array.

        The array is a page-aligned buffer of the file's pool: keep it only
        while you use it (the next call may reuse it once it is freed).

        Raises
        ------
        StoreError
            A page lies outside the file, or the file was closed.
        """
        pages = np.asarray(pages, np.int64)
        if pages.size and (pages[0] < 0 or pages[-1] > self.full_pages or pages[-1] * PAGE >= self.file_bytes):
            bad = int(pages[0] if pages[0] < 0 else pages[-1])
            raise StoreError(f"{self.path}: page {bad} is outside the file ({self.file_bytes} bytes)")
        out = self._pool.empty(pages.size, PAGE)
        whole = pages.size - int(pages.size > 0 and pages[-1] == self.full_pages)
        t0 = time.perf_counter()
        requests = 0
        if whole:
            if self.handle is None:
                raise StoreError(f"{self.path}: read after close; open the page file again")
            requests = self.backend.read_rows(self.handle, pages[:whole], out[:whole])
        read_s = time.perf_counter() - t0
        if whole < pages.size:
            out[whole] = self._tail
        return out, PageReads(int(pages.size), int(requests), int(pages.size) * PAGE, read_s)

    def gather(self, offsets: np.ndarray, dtype: np.dtype | str) -> tuple[np.ndarray, PageReads]:
        """The item of ``dtype`` at each byte offset of ``offsets`` (int64, any order, repeats allowed).

        Every item must lie within one page (true of any ``.npy`` array of a
        numeric dtype: its data start is 64-byte aligned). Pages are read in
        rounds of at most ``max_buffer_bytes``, each sorted and coalesced.
        Returns the values (in the order of ``offsets``) and what was read.

        Raises
        ------
        StoreError
            An offset lies outside the file, or is not aligned to the item size.
        """
        dtype = np.dtype(dtype)
        offsets = np.asarray(offsets, np.int64).reshape(-1)
        out = np.empty(offsets.size, dtype)
        if offsets.size == 0:
            return out, PageReads()
        within = offsets % PAGE
        if offsets.min() < 0 or offsets.max() + dtype.itemsize > self.file_bytes:
            raise StoreError(f"{self.path}: an item at byte {int(offsets.max())} is outside the file "
                             f"({self.file_bytes} bytes)")
        if (within % dtype.itemsize).any() or PAGE % dtype.itemsize:
            raise StoreError(f"{self.path}: items of {dtype.itemsize} bytes must sit at offsets aligned to "
                             "their size, so that none straddles two pages")
        ex = sorted_extents(offsets // PAGE)  # distinct pages ascending; requests in page order
        slot = within[ex.order] // dtype.itemsize  # each request's item within its page, in page order
        read = _with_gaps(ex.uniq, self.max_gap_pages)
        at = np.searchsorted(read, ex.uniq)[ex.sinv]  # each request's page among those read, in page order
        total = PageReads()
        for a in range(0, read.size, self.pages_per_round):
            b = min(a + self.pages_per_round, read.size)
            data, reads = self.read_pages(read[a:b])
            total += reads
            lo, hi = np.searchsorted(at, [a, b])  # the requests whose page is in this round
            items = data.view(dtype)  # (pages, PAGE // itemsize)
            out[ex.order[lo:hi]] = items[at[lo:hi] - a, slot[lo:hi]]
            del data, items
        return out, total

    def close(self) -> None:
        """Forget this file's handle (the backend stays open: it is the caller's)."""
        with self._lock:
            if self.handle is not None:
                self.backend.close_handle(self.handle)
                self.handle = None

    def __enter__(self) -> PagedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
