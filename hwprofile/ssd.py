"""Random reads of an SSD: a self-checking test file, Moment's own reader (iostack's) and fio.

:func:`ssd_random_read` writes a test file (or takes an existing file or
block device) and measures random aligned reads of ``block_bytes`` with fio
(:mod:`planner.fio`) and with the reader the feature store itself uses for
its SSD bins, :class:`iostack.backends.posix.PosixBackend` (``moment-posix``:
io_uring or native AIO for O_DIRECT files, else worker processes issuing
``os.preadv``): the figure is then what the store can get from the device.

A test file written by :func:`write_test_file` carries its own byte offset
in the first 8 bytes of every 512-byte sector (XOR :data:`MAGIC`), so each
block read can be checked against the offset it was asked for: a reader
that returned the wrong block, or zeros, is caught.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     m = ssd_random_read(d, file_bytes=64 * 1024, seconds=0.05, use_fio=False, processes=1,
...                         queue_depth=2)
>>> [r.tool for r in m.results], m.created, m.verified
(['moment-posix'], True, True)
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hwprofile._common import _now
from iostack.backends.base import aligned_empty
from iostack.backends.posix import PosixBackend, probe_direct
from iostack.bins import PAGE, BinFile, layout
from iostack.errors import StoreError
from momentbase.units import format_size
from planner.capacities import ReadMeasurement
from planner.errors import ProfileError
from planner.fio import run_fio
from planner.progress import Progress, report

__all__ = [
    "SsdMeasurement", "ssd_random_read", "write_test_file", "posix_random_read", "read_blocks",
    "DEFAULT_FILE_BYTES", "MAGIC", "SECTOR",
]

#: XORed with a sector's byte offset to make the header of every 512-byte sector
MAGIC = 0x4D4F4D454E542121  # b"MOMENT!!"

#: granularity of the offset headers, bytes (the smallest O_DIRECT alignment)
SECTOR = 512

#: test file written when a directory is given, bytes
DEFAULT_FILE_BYTES = 1 << 30


#: sizes, depths and durations accepted (typo protection)
MAX_BLOCK_BYTES = 64 << 20


MAX_QUEUE_DEPTH = 4096


MAX_SECONDS = 3600.0


#: room left free on the file system beside a test file
_FREE_MARGIN = 256 << 20



# ---------------------------------------------------------------------------
# test files


def write_test_file(directory: str | os.PathLike[str], file_bytes: int = DEFAULT_FILE_BYTES,
                    progress: Progress | None = None) -> Path:
    """Create a test file of ``file_bytes`` bytes in ``directory``, fully written.

    The data is pseudo-random (a random 4 MiB pattern, offset per chunk), so
    the device stores and returns real blocks: a sparse or fallocated file
    reads zeros without touching the device and gives meaningless figures.
    The first 8 bytes of every 512-byte sector hold the sector's byte offset
    XOR :data:`planner.MAGIC`, which lets the reader check every
    block it gets back. The file is flushed to the device and its pages are
    dropped from the page cache. ``file_bytes`` is rounded up to 512 bytes.
    """
    import numpy as np

    d = Path(directory)
    file_bytes = -(-int(file_bytes) // SECTOR) * SECTOR
    _check_room(d, file_bytes)
    try:
        fd, name = tempfile.mkstemp(prefix=".moment-profile-", suffix=".dat", dir=d)
    except OSError as exc:
        raise ProfileError(f"cannot create a test file in {d}: {exc.strerror or exc}") from None
    path = Path(name)
    chunk = 4 << 20
    rng = np.random.default_rng()
    pad = rng.integers(0, 2**63, chunk // 8, dtype=np.uint64)
    sector_words = SECTOR // 8
    try:
        written = 0
        while written < file_bytes:
            n = min(chunk, file_bytes - written)
            # a different pattern per chunk, so that no two blocks of the file are equal
            shift = np.uint64((0x9E3779B97F4A7C15 * (written // chunk + 1)) % 2**64)
            words = (pad[: n // 8] + shift).reshape(-1, sector_words)
            words[:, 0] = (np.arange(written, written + n, SECTOR, dtype=np.uint64)
                           ^ np.uint64(MAGIC))
            view = memoryview(words.tobytes())
            while view:
                k = os.write(fd, view)
                view = view[k:]
            written += n
            report(progress, f"writing the test file ({format_size(file_bytes)})", written, file_bytes)
        os.fsync(fd)
        _drop_cache(fd, file_bytes)
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        raise ProfileError(f"cannot write a test file in {d}: {exc.strerror or exc}") from None
    os.close(fd)
    return path


def _check_room(d: Path, file_bytes: int) -> None:
    if not d.exists():
        raise ProfileError(f"{d}: no such directory")
    if not d.is_dir():
        raise ProfileError(f"{d}: not a directory")
    if not os.access(d, os.W_OK | os.X_OK):
        raise ProfileError(f"{d}: not writable (a test file is written there)")
    try:
        free = shutil.disk_usage(d).free
    except OSError as exc:
        raise ProfileError(f"{d}: cannot tell the free space: {exc.strerror or exc}") from None
    if free < file_bytes + _FREE_MARGIN:
        raise ProfileError(
            f"{d}: only {format_size(free)} free; a {format_size(file_bytes)} test file needs "
            f"{format_size(file_bytes + _FREE_MARGIN)} (use a smaller `file_bytes`)")


def _drop_cache(fd: int, length: int) -> None:
    # Buffered reads of pages still cached from writing would measure memory
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, 0, length, os.POSIX_FADV_DONTNEED)


def _probe_direct(path: Path, block_bytes: int, want: bool | None) -> tuple[bool, str | None]:
    """Whether O_DIRECT reads of ``block_bytes`` work on ``path`` (and why not): iostack's probe."""
    if want is False:
        return False, "buffered reads were asked for"
    ok, why = probe_direct(str(path), block_bytes)
    if ok:
        return True, None
    why = (why or "O_DIRECT reads fail here").removesuffix(": buffered reads")
    if want:
        raise ProfileError(f"{path}: {why}")
    return False, why


# ---------------------------------------------------------------------------
# Moment's own reader


def posix_random_read(path: str | os.PathLike[str], *, block_bytes: int, queue_depth: int,
                      seconds: float, direct: bool, verify: bool = False,
                      processes: int | None = None, file_bytes: int | None = None
                      ) -> ReadMeasurement:
    """Random reads of ``path`` with the feature store's own reader (``moment-posix``).

    The reader is :class:`iostack.backends.posix.PosixBackend`, the one
    :class:`~iostack.store.FeatureStore` uses for its SSD bins, over the file
    seen as a bin of ``block_bytes`` rows: with O_DIRECT it keeps
    ``queue_depth`` reads in flight through io_uring or native AIO; buffered,
    ``processes`` worker processes (default: the CPUs this process may run
    on, at most ``queue_depth``) each run ``ceil(queue_depth / processes)``
    threads issuing ``os.preadv``. Each call reads a batch of distinct random
    blocks, one read each (no coalescing), until ``seconds`` have passed.
    ``verify`` checks every block against the offset header of a file from
    :func:`write_test_file`. ``block_bytes`` must be a multiple of the store's
    4 KiB page (the store reads nothing smaller).
    """
    p = str(path)
    if block_bytes % PAGE:
        raise ProfileError(f"block size {block_bytes}: the store's reader reads whole "
                           f"{PAGE}-byte pages; measure a multiple of {PAGE} bytes")
    try:
        os.close(os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
    except OSError as exc:
        raise ProfileError(f"{p}: cannot open {p}: {exc.strerror or exc}") from None
    size = file_bytes if file_bytes is not None else _file_size(Path(p))
    nblocks = size // block_bytes
    if nblocks < 1:
        raise ProfileError(f"{p}: smaller than one block of {block_bytes} bytes")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    procs = max(1, min(processes or cpus, queue_depth))
    info = _as_bin(p, block_bytes, nblocks)
    try:
        with PosixBackend(processes=procs, threads=-(-queue_depth // procs), direct=direct,
                          max_read_bytes=block_bytes) as backend:
            handle = backend.open(info)
            reads, elapsed = _timed_reads(backend, handle, nblocks, seconds, verify)
            engine = backend.engine_of(handle)
            qd, threads = backend.queue_depth, backend.threads
    except StoreError as exc:
        raise ProfileError(f"{p}: {exc}") from None
    iops = reads / elapsed if elapsed > 0 else 0.0
    how = (f"{procs} processes x {threads} threads, os.preadv" if engine == "threads"
           else f"{engine}, {qd} reads in flight")
    return ReadMeasurement(
        read_bytes_per_s=iops * block_bytes, read_iops=iops, block_bytes=block_bytes,
        queue_depth=qd, tool="moment-posix", mode="direct" if direct else "buffered",
        file_bytes=nblocks * block_bytes, seconds=round(elapsed, 3),
        jobs=f"iostack posix backend: {how}" + (", every block checked" if verify else ""),
        date=_now(), host=socket.gethostname())


def _as_bin(path: str, block_bytes: int, nblocks: int) -> BinFile:
    """The file seen as an SSD bin of ``nblocks`` rows of ``block_bytes`` (a multiple of the page)."""
    stride, rows_per_page = layout(block_bytes)
    return BinFile(path=path, bin_id=0, dtype="uint8", dim=block_bytes, row_bytes=block_bytes,
                   row_stride_bytes=stride, rows_per_page=rows_per_page, rows=nblocks,
                   file_bytes=nblocks * block_bytes, crc32=0, crc32_first_block=0)


def read_blocks(path: str | os.PathLike[str], offsets: list[int], block_bytes: int,
                direct: bool) -> list[bytes]:
    """The ``block_bytes`` bytes at each of ``offsets`` (multiples of ``block_bytes``), read as the profiler reads.

    The same reader and layout as :func:`posix_random_read`'s timed loop, so
    that tests can check what it returns. Raises :class:`ProfileError` when
    the file cannot be read (or not with O_DIRECT, when ``direct``).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = os.path.join(d, "f")
    ...     _ = open(p, "wb").write(bytes(range(256)) * 32)
    ...     [b[:4] for b in read_blocks(p, [0, 4096], 4096, direct=False)]
    [b'\\x00\\x01\\x02\\x03', b'\\x00\\x01\\x02\\x03']
    """
    import numpy as np

    p = str(path)
    info = _as_bin(p, block_bytes, _file_size(Path(p)) // block_bytes)
    rows = np.asarray(offsets, np.int64) // block_bytes
    out = aligned_empty(rows.size, block_bytes)
    try:
        with PosixBackend(processes=1, threads=1, direct=direct, max_read_bytes=block_bytes) as backend:
            backend.read_rows(backend.open(info), rows, out)
    except StoreError as exc:
        raise ProfileError(f"{p}: {exc}") from None
    return [bytes(r) for r in out]


def _timed_reads(backend: PosixBackend, handle, nblocks: int, seconds: float,
                 verify: bool) -> tuple[int, float]:
    """``(blocks read, elapsed s)``: batches of distinct random blocks until ``seconds`` have passed."""
    import numpy as np

    block = handle.info.row_bytes
    # big enough batches that the per-call work (sorting, messages to workers) is small beside the
    # reads; distinct blocks, so that each counts as one read of the device
    batch = min(nblocks, max(256, backend.queue_depth * 32))
    out = aligned_empty(batch, block)  # page-aligned, as FeatureStore.gather passes it
    rng = np.random.default_rng()
    reads, t0 = 0, time.perf_counter()
    deadline = t0 + seconds
    while True:
        rows = np.unique(rng.integers(0, nblocks, batch))
        backend.read_rows(handle, rows, out[:rows.size])
        reads += int(rows.size)
        if verify:
            offsets = rows * block
            heads = out[:rows.size, :8].copy().view(np.uint64)[:, 0] ^ np.uint64(MAGIC)
            bad = np.flatnonzero(heads != offsets.astype(np.uint64))
            if bad.size:
                raise ProfileError(f"{handle.info.path}: the block read at offset {int(offsets[bad[0]])} "
                                   "is not the one written there")
        if time.perf_counter() >= deadline:
            return reads, time.perf_counter() - t0


def _file_size(p: Path) -> int:
    st = p.stat()
    if stat.S_ISBLK(st.st_mode):
        fd = os.open(p, os.O_RDONLY)
        try:
            return os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)
    return st.st_size



# ---------------------------------------------------------------------------
# SSD random reads


@dataclass(frozen=True)
class SsdMeasurement:
    """Random-read results for one file: one :class:`ReadMeasurement` per tool that ran.

    ``created`` says the test file was written for the test (and ``verified``
    that Moment's reader checked every block it read against it); ``kept``
    that it was left in place; ``mode`` is ``"direct"`` or ``"buffered"``,
    with ``mode_note`` saying why when buffered. ``not_measured`` lists
    tools that did not run, and why.
    """

    path: str
    file_bytes: int
    block_bytes: int
    queue_depth: int
    mode: str
    created: bool
    results: tuple[ReadMeasurement, ...]
    not_measured: tuple[str, ...] = ()
    verified: bool = False
    kept: bool = False
    mode_note: str | None = None

    @property
    def best(self) -> ReadMeasurement:
        """The result with the most reads per second."""
        return max(self.results, key=lambda r: r.read_iops or 0.0)

    def result(self, tool_prefix: str) -> ReadMeasurement | None:
        return next((r for r in self.results if r.tool and r.tool.startswith(tool_prefix)), None)


def _validate(block_bytes: int, queue_depth: int, seconds: float, file_bytes: int | None) -> None:
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes <= 0 \
            or block_bytes % SECTOR or block_bytes > MAX_BLOCK_BYTES:
        raise ProfileError(f"block size {block_bytes!r}: expected a multiple of 512 bytes, "
                           f"at most {format_size(MAX_BLOCK_BYTES)}")
    if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) \
            or not 1 <= queue_depth <= MAX_QUEUE_DEPTH:
        raise ProfileError(f"queue depth {queue_depth!r}: expected 1 to {MAX_QUEUE_DEPTH}")
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or not 0 < seconds <= MAX_SECONDS:
        raise ProfileError(f"duration {seconds!r} s: expected more than 0 and at most {MAX_SECONDS:g} s")
    if file_bytes is not None and (not isinstance(file_bytes, int) or file_bytes < block_bytes):
        raise ProfileError(f"file size {file_bytes!r}: expected at least one block ({block_bytes} bytes)")


def ssd_random_read(
    path_or_dir: str | os.PathLike[str],
    block_bytes: int = 4096,
    queue_depth: int = 64,
    seconds: float = 5.0,
    file_bytes: int = DEFAULT_FILE_BYTES,
    *,
    use_fio: bool = True,
    use_own: bool = True,
    direct: bool | None = None,
    keep_file: bool = False,
    processes: int | None = None,
    progress: Progress | None = None,
) -> SsdMeasurement:
    """Random aligned reads of ``block_bytes`` from a file, ``queue_depth`` in flight, for ``seconds``.

    ``path_or_dir`` is a directory (a test file of ``file_bytes`` bytes is
    written there with :func:`write_test_file` and removed afterwards unless
    ``keep_file``), or an existing file or block device (read only, never
    written; ``file_bytes`` is then its size). ``direct=None`` uses O_DIRECT
    when the file system allows it and buffered reads otherwise (say which:
    ``mode``, ``mode_note``); ``True`` requires it, ``False`` refuses it.

    fio runs when ``use_fio`` and it is installed; Moment's own reader when
    ``use_own``. Each runs for ``seconds``; the test file is written first
    (at the device's write speed). Raises :class:`ProfileError` on a bad
    path or parameter, or when no tool could measure.
    """
    _validate(block_bytes, queue_depth, seconds, file_bytes)
    target, file_bytes, created = _target(Path(path_or_dir), block_bytes, file_bytes, progress)
    try:
        is_direct, mode_note = _probe_direct(target, block_bytes, direct)
        if not is_direct:
            mode_note = (f"{mode_note}; buffered reads may be served from the page cache, "
                         "so the figures are an upper bound unless the file is much larger than memory")
        results, skipped, verified = _measure(target, block_bytes, queue_depth, seconds, file_bytes, is_direct,
                                              created, use_fio=use_fio, use_own=use_own, processes=processes,
                                              progress=progress)
    finally:
        if created and not keep_file:
            with contextlib.suppress(OSError):
                target.unlink()
    return SsdMeasurement(str(target), file_bytes, block_bytes, queue_depth, "direct" if is_direct else "buffered",
                          created, tuple(results), tuple(skipped), verified, created and keep_file, mode_note)


def _target(p: Path, block_bytes: int, file_bytes: int, progress: Progress | None) -> tuple[Path, int, bool]:
    """What to read: a test file written in directory ``p``, or ``p`` itself; its usable size; whether written."""
    if p.is_dir():
        report(progress, f"writing a {format_size(file_bytes)} test file in {p}")
        return write_test_file(p, file_bytes, progress), file_bytes, True
    if not p.exists():
        raise ProfileError(f"{p}: no such directory or file")
    try:
        st = p.stat()
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise ProfileError(f"{p}: not a directory, regular file or block device")
        file_bytes = _file_size(p)
        with open(p, "rb"):
            pass
    except PermissionError:
        raise ProfileError(f"{p}: not readable") from None
    except OSError as exc:
        raise ProfileError(f"{p}: {exc.strerror or exc}") from None
    if file_bytes < block_bytes:
        raise ProfileError(f"{p}: {file_bytes} bytes, smaller than one block of {block_bytes}")
    return p, file_bytes - file_bytes % block_bytes, False


def _measure(target: Path, block_bytes: int, queue_depth: int, seconds: float, file_bytes: int, is_direct: bool,
             created: bool, *, use_fio: bool, use_own: bool, processes: int | None, progress: Progress | None
             ) -> tuple[list[ReadMeasurement], list[str], bool]:
    """fio's and Moment's own measurements of ``target`` (what ran), why the others did not, whether verified."""
    results: list[ReadMeasurement] = []
    skipped: list[str] = []
    verified = False
    if use_fio:
        try:
            m, failed = run_fio(target, block_bytes=block_bytes, queue_depth=queue_depth, seconds=seconds,
                                file_bytes=file_bytes, direct=is_direct, progress=progress)
            results.append(m)
            skipped.extend(failed)
        except ProfileError as exc:
            skipped.append(f"fio: {exc}")
    else:
        skipped.append("fio: not run (asked not to)")
    if use_own:
        _drop_file_cache(target, file_bytes)
        report(progress, f"moment-posix: {format_size(block_bytes)} random reads, "
                         f"queue depth {queue_depth}, {seconds:g} s")
        try:
            results.append(posix_random_read(
                target, block_bytes=block_bytes, queue_depth=queue_depth, seconds=seconds,
                direct=is_direct, verify=created, processes=processes, file_bytes=file_bytes))
            verified = created
        except ProfileError as exc:
            if "not the one written" in str(exc):
                raise  # wrong data is a failure, not a figure to skip
            skipped.append(f"moment-posix: {exc}")
    if not results:
        raise ProfileError(f"{target}: nothing could be measured: " + "; ".join(skipped))
    return results, skipped, verified


def _drop_file_cache(path: Path, length: int) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        _drop_cache(fd, length)
    finally:
        os.close(fd)

