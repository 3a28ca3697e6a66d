"""Checking SSD bin files against their per-block CRC-32s: on a block's first read, and all of a bin at once.

A bin's manifest records a CRC-32 per :data:`~iostack.bins.SUM_BLOCK_BYTES`
block (``block_sums``, :mod:`iostack.bins`). :class:`BlockChecker` is the read
path's check: before rows are read, the blocks they lie in that no read has
touched yet are read whole and checked (a bitmap of verified blocks, updated
with numpy), so every byte a trainer takes from a bin was checked once, and a
block verified stays so (the bins are read-only while training). A mismatch is a
:class:`~iostack.errors.StoreError` naming the file, the block, its bytes and
the fix, raised before the rows reach the caller: never wrong rows.

Why on first read rather than per page in the background: a background pass
lets rows be used before their page is checked (wrong rows for a while), and
once every block is verified the read-path check is one array lookup per gather
(``tools/bench_bin_integrity.py`` measures both costs against checks off).

:func:`check_bin` reads every block of one bin (``moment place --verify``) and
returns what it found instead of raising.

>>> import numpy as np, tempfile
>>> from iostack.bins import open_bin, write_bins
>>> from iostack.placement import simple_placement
>>> feats = np.arange(4096 * 8, dtype=np.float32).reshape(-1, 256)
>>> p = simple_placement(len(feats), [("ssd", len(feats))])
>>> d = tempfile.mkdtemp()
>>> _ = write_bins(feats, p, d, sum_block_bytes=8192)
>>> info = open_bin(d, p.bins[0])
>>> with open(info.path, "r+b") as f:
...     _ = f.seek(5 * 8192 + 100); _ = f.write(b"bad")
>>> checker = BlockChecker(info)
>>> checker.check_rows(np.array([0, 1, 2]))   # rows in block 0: fine
>>> checker.check_rows(np.array([41]))   # doctest: +ELLIPSIS
Traceback (most recent call last):
...
iostack.errors.StoreError: ...: bin 0 is corrupt: block 5 of 16 (bytes 40,960 to 49,152) ...
>>> check_bin(info).bad_blocks
(5,)
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import zlib
from dataclasses import dataclass

import numpy as np

from iostack.bins import BinFile
from iostack.checksums import BlockSums
from iostack.errors import StoreError
from planner.progress import Progress

log = logging.getLogger(__name__)

#: the fix every corrupt-bin message names
FIX = "the file changed since it was placed: re-run `moment place` (`force=True` replaces the placement)"

#: bytes read at once when checking (a run of blocks is read in pieces of at most this)
MAX_READ_BYTES = 16 << 20

_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_unsummed(info: BinFile) -> None:
    """Warn once per directory that ``info``'s bin has no per-block sums (placed before bins carried them)."""
    where = os.path.dirname(info.path)
    with _warned_lock:
        if where in _warned:
            return
        _warned.add(where)
    log.warning("%s: bins placed before Moment recorded a checksum per block; reads past the first 16 MiB of a "
                "bin are not checked; re-run `moment place` to add them", where)


class BlockChecker:
    """Checks the blocks of one bin file the first time a read touches them.

    Thread-safe in effect: two threads may verify one block at once (both read
    it; the bitmap only ever goes from unchecked to checked).
    """

    def __init__(self, info: BinFile) -> None:
        if info.block_sums is None:
            raise ValueError(f"{info.path}: no block sums to check against")
        self.info, self.sums = info, info.block_sums
        # the file as opened now, as the reads' handles opened it: a re-placement may rename a new bin over
        # this name (training.place.replace), and its blocks are not the ones these sums describe
        try:
            self._fd: int | None = os.open(info.path, os.O_RDONLY)
        except OSError:
            self._fd = None  # said when a check reads it
        self.verified = np.zeros(self.sums.blocks, np.bool_)
        self.left = self.sums.blocks  #: blocks not verified yet (0: every read is free)
        bb = self.sums.block_bytes
        # rows per block when rows never straddle a block boundary (then a row's block is rows // that)
        if info.rows_per_page > 1 and bb % 4096 == 0:
            self._rows_per_block = (bb // 4096) * info.rows_per_page
        elif info.rows_per_page == 1 and bb % info.row_stride_bytes == 0:
            self._rows_per_block = bb // info.row_stride_bytes
        else:
            self._rows_per_block = 0

    def blocks_of(self, rows: np.ndarray) -> np.ndarray:
        """The distinct blocks ``rows`` (int64) lie in, sorted (a row across a block boundary: all its blocks)."""
        if self._rows_per_block:
            return np.unique(rows // self._rows_per_block)
        bb = self.sums.block_bytes
        start = self.info.offsets(rows)
        first, last = start // bb, (start + self.info.row_bytes - 1) // bb
        if np.array_equal(first, last):
            return np.unique(first)
        span = last - first + 1
        ends = np.cumsum(span)
        all_blocks = np.repeat(first - (ends - span), span) + np.arange(int(ends[-1]))
        return np.unique(all_blocks)

    def check_rows(self, rows: np.ndarray) -> None:
        """Verify the blocks of ``rows`` (int64 array) not verified before; :class:`StoreError` on a mismatch.

        Raises
        ------
        StoreError
            When a block's bytes do not match its CRC-32 (naming file, block, bytes and the fix), or
            the file cannot be read.
        """
        if self.left == 0 or rows.size == 0:
            return
        if self._rows_per_block:  # the common case: a lookup, no sort, when every block is known good
            blk = rows // self._rows_per_block
            need = blk[~self.verified[blk]]
            if need.size == 0:
                return
            todo = np.unique(need)
        else:
            todo = self.blocks_of(rows)
            todo = todo[~self.verified[todo]]
        if todo.size:
            self._verify(todo)

    def close(self) -> None:
        """Close the file it checks (idempotent; a check after it reads the file by its name)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def _verify(self, blocks: np.ndarray) -> None:
        bad = read_bad_blocks(self.info.path, self.sums, blocks, fd=self._fd)
        if bad:
            raise StoreError(corrupt_message(self.info, bad))
        self.verified[blocks] = True
        self.left = int(self.sums.blocks - np.count_nonzero(self.verified))


def read_bad_blocks(path: str, sums: BlockSums, blocks: np.ndarray, *, fd: int | None = None) -> list[int]:
    """The blocks among ``blocks`` (sorted, distinct) whose bytes in ``path`` (read through ``fd`` when given,
    an open file of it) do not match ``sums``.

    Runs of consecutive blocks are read in one sequential pass each, then dropped
    from the page cache (what a direct-I/O backend reads next must come from the
    device, as it would have without the check).

    Raises
    ------
    StoreError
        When the file cannot be read.
    """
    bad = []
    per = max(1, MAX_READ_BYTES // sums.block_bytes)  # blocks per read: bounded memory whatever the run
    own = fd is None
    try:
        if fd is None:
            fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise StoreError(f"{path}: cannot read it to check its blocks ({exc.strerror or exc})") from None
    try:
        cuts = np.flatnonzero(np.diff(blocks) != 1) + 1
        for run in np.split(np.asarray(blocks, np.int64), cuts):
            for k in range(0, run.size, per):
                piece = run[k:k + per].tolist()
                start, stop = sums.span(piece[0])[0], sums.span(piece[-1])[1]
                data = memoryview(os.pread(fd, stop - start, start))
                for i in piece:
                    a, b = sums.span(i)
                    # a short read (the file shrank) is a bad block too
                    if len(data) < b - start or zlib.crc32(data[a - start:b - start]) != sums.crcs[i]:
                        bad.append(i)
                with contextlib.suppress(OSError, AttributeError):
                    os.posix_fadvise(fd, start, stop - start, os.POSIX_FADV_DONTNEED)
    except OSError as exc:
        raise StoreError(f"{path}: cannot read it to check its blocks ({exc.strerror or exc})") from None
    finally:
        if own:
            os.close(fd)
    return bad


def corrupt_message(info: BinFile, bad: list[int]) -> str:
    """One line: which bin file is corrupt, its first bad block with its bytes, how many more, the fix."""
    assert info.block_sums is not None
    a, b = info.block_sums.span(bad[0])
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    return (f"{info.path}: bin {info.bin_id} is corrupt: block {bad[0]} of {info.block_sums.blocks} "
            f"(bytes {a:,} to {b:,}){more} does not match the CRC-32 recorded when it was placed; {FIX}")


@dataclass(frozen=True)
class BinCheck:
    """What reading a whole bin found: ``bad_blocks`` (empty: good), or, for a bin without block sums,
    whether its whole-file CRC-32 matched (``whole_file_ok``; then ``bad_blocks`` is empty)."""

    path: str
    bin_id: int
    blocks: int
    bad_blocks: tuple[int, ...] = ()
    whole_file_ok: bool | None = None

    @property
    def ok(self) -> bool:
        return not self.bad_blocks and self.whole_file_ok is not False


def check_bin(info: BinFile, progress: Progress | None = None, *, every_blocks: int = 256) -> BinCheck:
    """Read every block of ``info``'s file and check it (its whole-file CRC-32 when it has no block sums).

    ``progress`` hears ``("verifying <file>", bytes, total)`` every ``every_blocks`` blocks.

    Raises
    ------
    StoreError
        When the file cannot be read.
    """
    total = info.file_bytes
    name = f"verifying {os.path.basename(info.path)}"
    if info.block_sums is None:
        crc = 0
        try:
            with open(info.path, "rb") as f:
                for at in range(0, total, MAX_READ_BYTES):
                    crc = zlib.crc32(f.read(MAX_READ_BYTES), crc)
                    if progress is not None:
                        progress(name, min(total, at + MAX_READ_BYTES), total)
        except OSError as exc:
            raise StoreError(f"{info.path}: cannot read it to check it ({exc.strerror or exc})") from None
        return BinCheck(info.path, info.bin_id, 0, whole_file_ok=crc == info.crc32)
    sums = info.block_sums
    bad: list[int] = []
    for first in range(0, sums.blocks, every_blocks):
        run = np.arange(first, min(sums.blocks, first + every_blocks))
        bad += read_bad_blocks(info.path, sums, run)
        if progress is not None:
            progress(name, sums.span(int(run[-1]))[1], total)
    return BinCheck(info.path, info.bin_id, sums.blocks, tuple(bad))


__all__ = ["FIX", "BinCheck", "BlockChecker", "check_bin", "corrupt_message", "read_bad_blocks", "warn_unsummed"]
