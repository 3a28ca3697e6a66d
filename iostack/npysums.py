"""A ``.npy`` file's per-block CRC-32s kept beside it, and the check of the blocks some of its rows lie in.

A node of a sharded placement keeps its rows of the feature matrix in
``rows.npy`` (:mod:`training.place.nodes`), from which its cache tiers are
filled when training starts. :func:`write_sums` records a CRC-32 of every
:data:`iostack.bins.SUM_BLOCK_BYTES` block (1 MiB) of such a file in
``<file>.sums.json`` once the file is whole; :func:`check_rows` verifies the
blocks that given rows occupy before they are read, and :func:`bad_blocks_of`
every block (``moment place --verify``). A file without sums (written before
they existed) is reported as such, never refused.

>>> import numpy as np, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "rows.npy")
>>> np.save(path, np.arange(40_000, dtype=np.float32).reshape(10_000, 4))
>>> _ = write_sums(path, block_bytes=4096)
>>> check_rows(path, np.array([0, 9_999]))
>>> with open(path, "r+b") as f:               # row 6242 is at bytes 100,000-100,015 (a 128-byte header)
...     _ = f.seek(100_000); _ = f.write(b"xx")
>>> check_rows(path, np.array([0, 9_999]))  # their blocks are whole
>>> check_rows(path, np.array([6_242]))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
iostack.errors.StoreError: ...rows.npy: block 24 of 40 (bytes 98,304 to 102,400) does not match its CRC-32 ...
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from iostack.bins import SUM_BLOCK_BYTES
from iostack.checksums import BlockSums, bad_blocks, block_sums
from iostack.errors import StoreError
from iostack.placement import save_json

__all__ = ["bad_blocks_of", "check_rows", "read_sums", "sums_path", "write_sums"]

_FIX = "place again (`moment place --force`)"


def sums_path(path: str | os.PathLike[str]) -> Path:
    """Where the sums of ``path`` live: ``<file>.sums.json`` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".sums.json")


def write_sums(path: str | os.PathLike[str], block_bytes: int = SUM_BLOCK_BYTES) -> BlockSums:
    """Read the whole file ``path`` once and save the CRC-32 of each block beside it (renamed into place)."""
    sums = block_sums(Path(path), block_bytes)
    save_json(sums_path(path), {"format": "moment-npy-sums", "version": 1, "block_sums": sums.to_json()})
    return sums


def read_sums(path: str | os.PathLike[str]) -> BlockSums | None:
    """The sums of ``path``, or None when it has none.

    Raises
    ------
    StoreError
        When the sums file is there but malformed.
    """
    where = sums_path(path)
    try:
        data = json.loads(where.read_text())
        return BlockSums.from_json(data["block_sums"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{where}: not a checksum file this Moment reads ({exc}); {_FIX}") from None


def _header(path: Path) -> tuple[int, int]:
    """Bytes before the first row, bytes per row of the .npy file ``path`` (2-D, C order)."""
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: not a readable .npy file ({exc}); {_FIX}") from None
    if arr.ndim != 2 or not arr.flags.c_contiguous:
        raise StoreError(f"{path}: expected a 2-D C-ordered array of rows, got shape {arr.shape}; {_FIX}")
    return int(arr.offset), int(arr.shape[1] * arr.dtype.itemsize)


def _check_size(path: Path, sums: BlockSums) -> None:
    size = path.stat().st_size
    if size != sums.size_bytes:
        raise StoreError(f"{path}: {size:,} bytes, its sums ({sums_path(path).name}) were taken of "
                         f"{sums.size_bytes:,}: the file was cut or replaced; {_FIX}")


def _bad(path: Path, sums: BlockSums, which: np.ndarray) -> None:
    _check_size(path, sums)
    bad = bad_blocks(path, sums, which.tolist())
    if bad:
        a, b = sums.span(bad[0])
        raise StoreError(f"{path}: block {bad[0]} of {sums.blocks} (bytes {a:,} to {b:,}) does not match its CRC-32 "
                         f"({sums_path(path).name}): the file is corrupt; {_FIX}")


def check_rows(path: str | os.PathLike[str], rows: np.ndarray) -> None:
    """Verify the blocks of the .npy file ``path`` that ``rows`` (int, any order) lie in; nothing without sums.

    Raises
    ------
    StoreError
        Naming the file and the first bad block, or a file whose size changed.
    """
    path = Path(path)
    sums = read_sums(path)
    rows = np.asarray(rows, np.int64)
    if sums is None or rows.size == 0:
        return
    offset, row_bytes = _header(path)
    first = (offset + rows * row_bytes) // sums.block_bytes
    last = (offset + (rows + 1) * row_bytes - 1) // sums.block_bytes
    # every block from a row's first to its last (more than two when a row is longer than a block)
    span = last - first + 1
    covered = np.repeat(first, span) + (np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span))
    _bad(path, sums, np.unique(np.concatenate([covered, [0]])))  # block 0 holds the header the reader parses


def bad_blocks_of(path: str | os.PathLike[str]) -> tuple[int, list[int]] | None:
    """``(blocks, bad blocks)`` of the whole file ``path``; None when it has no sums.

    Raises
    ------
    StoreError
        When the file's size is not the one its sums were taken of.
    """
    path = Path(path)
    sums = read_sums(path)
    if sums is None:
        return None
    _check_size(path, sums)
    return sums.blocks, bad_blocks(path, sums, range(sums.blocks))
