"""A bin file with some rows replaced, written whole beside the live one: the live file never changes.

A re-placement (:mod:`training.place.replace`) moves rows into an SSD bin while
a store may still read that bin through the old placement. Writing the arrivals
into the live file would change blocks whose CRC-32s the readers check against
(:mod:`iostack.binverify`), and a crash halfway would leave a file its manifest
does not describe. :func:`write_moved_bin` instead copies the live file block by
block to its staged name (:func:`iostack.bins.staged_path`), every block checked
against the live manifest's sums as it is read, the arrivals written into their
rows of the copy, and the copy's manifest (block sums, CRC-32) computed from the
bytes written. The live file stays as it was until a commit renames the copy over
it (:mod:`iostack.commit`); a store that opened it keeps reading it (its open file)
until it closes. The copy costs one sequential read and write of the bin, in the
background of training; a copy on a file system that shares extents (XFS, btrfs
``copy_file_range``) would cost less, but would not check the blocks.

>>> import numpy as np, tempfile
>>> from iostack.bins import open_bin, staged_path, write_bins
>>> from iostack.placement import simple_placement
>>> feats = np.arange(12, dtype=np.float32).reshape(6, 2)
>>> p = simple_placement(6, [("ssd", 8)])
>>> d = tempfile.mkdtemp()
>>> _ = write_bins(feats, p, d)
>>> info = write_moved_bin(d, p.bins[0], np.array([6]), np.float32([[7, 7]]).view(np.uint8))
>>> (info.rows, open_bin(d, p.bins[0]).rows, info.path == str(open_bin(d, p.bins[0]).path))
(7, 6, True)
>>> np.fromfile(staged_path(info.path), np.float32)[:14].reshape(7, 2)[[0, 6]].tolist()
[[0.0, 1.0], [7.0, 7.0]]
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from iostack.bins import PAGE, SUM_BLOCK_BYTES, BinFile, bin_path, open_bin, staged_path, write_bin_file
from iostack.binverify import BlockChecker
from iostack.errors import StoreError
from iostack.placement import Bin

__all__ = ["write_moved_bin"]


def _rows_reader(info: BinFile):
    """``read(start, stop)``: rows ``start..stop-1`` of the file ``info`` describes, as ``(n, row_bytes)`` uint8
    (``start`` on a page boundary of packed rows: :func:`iostack.bins.write_bin_file` asks in whole pages)."""
    mm = np.memmap(info.path, np.uint8, "r", shape=(info.file_bytes,)) if info.file_bytes else None
    rb, rpp, stride = info.row_bytes, info.rows_per_page, info.row_stride_bytes

    def read(start: int, stop: int) -> np.ndarray:
        assert mm is not None
        if rpp > 1:
            p0, p1 = start // rpp, -(-stop // rpp)
            pages = np.asarray(mm[p0 * PAGE:p1 * PAGE]).reshape(-1, PAGE)[:, :rpp * rb]
            return pages.reshape(-1, rb)[start - p0 * rpp:stop - p0 * rpp]
        return np.asarray(mm[start * stride:stop * stride]).reshape(-1, stride)[:, :rb]

    return read


def write_moved_bin(directory: str | os.PathLike[str], b: Bin, rows: np.ndarray, data: np.ndarray, *,
                    fsync: bool = True) -> BinFile:
    """Bin ``b``'s file with rows ``rows`` holding ``data`` (``(n, row_bytes)`` uint8, stored rows), written
    whole under its staged name; the live file and its manifest are untouched. Returns the copy's
    :class:`~iostack.bins.BinFile` (its ``path`` the final name, where a commit will put it).

    Raises
    ------
    StoreError
        The live bin is missing, damaged (a block that fails its CRC-32: nothing is staged), in place
        (a dataset's feature file, :func:`iostack.bins.adopt_bin`), or ``data`` is not rows of its width.
    """
    info = open_bin(directory, b)
    final = bin_path(directory, b)
    if final.is_symlink():
        raise StoreError(f"{final}: bin {b.id} is the dataset's feature file in place; a re-placement would "
                         "copy it whole: place without `in_place` to re-place")
    rows = np.asarray(rows, np.int64)
    data = np.ascontiguousarray(data, np.uint8)
    if data.shape != (rows.size, info.row_bytes):
        raise StoreError(f"bin {b.id}: {data.shape} bytes to write, expected ({rows.size}, {info.row_bytes})")
    if rows.size and (rows.min() < 0 or rows.max() >= b.capacity_rows):
        raise StoreError(f"bin {b.id}: a row outside 0..{b.capacity_rows - 1}")
    order = np.argsort(rows, kind="stable")
    srows, sdata = rows[order], data[order]
    n_rows = max(info.rows, int(srows[-1]) + 1 if srows.size else 0)
    checker = BlockChecker(info) if info.block_sums is not None else None
    read = _rows_reader(info)

    def block(start: int, stop: int) -> np.ndarray:
        out = np.zeros((stop - start, info.row_bytes), np.uint8)
        have = min(stop, info.rows)
        if have > start:
            out[:have - start] = read(start, have)  # from the device into the page cache...
            if checker is not None:  # ...where the check reads the same bytes (then drops them): raised, no commit
                checker.check_rows(np.arange(start, have, dtype=np.int64))
        a, e = np.searchsorted(srows, [start, stop])
        out[srows[a:e] - start] = sdata[a:e]
        return out

    sums = info.block_sums.block_bytes if info.block_sums is not None else SUM_BLOCK_BYTES
    try:
        return write_bin_file(staged_path(final), b.id, info.dtype, info.dim, n_rows, block, fsync=fsync,
                              sum_block_bytes=sums, placement_dir=str(Path(directory).resolve()), final_path=final)
    finally:
        if checker is not None:
            checker.close()
