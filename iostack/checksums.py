"""CRC-32 checksums of files, whole or per block: what SSD bins and dataset files carry.

One routine reads a byte range of a file in bounded chunks and folds it into a
CRC-32 (``zlib.crc32``, the checksum of gzip and zip); :func:`block_sums`
records one CRC per fixed-size block, so that a reader can check any sample of
blocks without reading the rest, and :func:`bad_blocks` checks them. Bin files
(:mod:`iostack.bins`) keep a whole-file CRC and that of their first block;
datasets (:mod:`training.data`) keep a CRC per block of every array file.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "f.bin")
>>> _ = open(path, "wb").write(bytes(range(256)) * 40)        # 10240 bytes
>>> sums = block_sums(path, block_bytes=4096)
>>> sums.blocks, sums.size_bytes, crc32_of(path) == zlib.crc32(bytes(range(256)) * 40)
(3, 10240, True)
>>> with open(path, "r+b") as f:
...     _ = f.seek(5000); _ = f.write(b"x" * 64)
>>> bad_blocks(path, sums, range(sums.blocks))
[1]
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from momentbase.jsontypes import JsonObject, JsonValue

__all__ = ["READ_CHUNK_BYTES", "BlockCrcs", "BlockSums", "bad_blocks", "block_sums", "crc32_of"]

#: bytes read at a time: bounds memory whatever the block or file size
READ_CHUNK_BYTES = 4 << 20


def crc32_of(path: str | Path, start: int = 0, stop: int | None = None, crc: int = 0) -> int:
    """CRC-32 of bytes ``[start, stop)`` of ``path`` (to the end when ``stop`` is None).

    Reads :data:`READ_CHUNK_BYTES` at a time; ``crc`` continues a running value.
    Raises ``OSError`` as ``open`` and ``read`` do.
    """
    with open(path, "rb") as f:
        f.seek(start)
        left = None if stop is None else max(0, stop - start)
        while left is None or left > 0:
            chunk = f.read(READ_CHUNK_BYTES if left is None else min(READ_CHUNK_BYTES, left))
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            if left is not None:
                left -= len(chunk)
    return crc


@dataclass(frozen=True)
class BlockSums:
    """The CRC-32 of each ``block_bytes`` block of a file of ``size_bytes`` bytes (the last may be short)."""

    size_bytes: int
    block_bytes: int
    crcs: tuple[int, ...]

    @property
    def blocks(self) -> int:
        return len(self.crcs)

    def span(self, i: int) -> tuple[int, int]:
        """Byte range ``[start, stop)`` of block ``i``."""
        start = i * self.block_bytes
        return start, min(self.size_bytes, start + self.block_bytes)

    def to_json(self) -> JsonObject:
        """``{"bytes", "block_bytes", "crc32"}``, the CRCs as one string of 8 hex digits each (compact)."""
        return {"bytes": self.size_bytes, "block_bytes": self.block_bytes,
                "crc32": "".join(f"{c:08x}" for c in self.crcs)}

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> BlockSums:
        """The inverse of :meth:`to_json`; ``ValueError`` when ``data`` is malformed."""
        try:
            size, block, text = int(data["bytes"]), int(data["block_bytes"]), str(data["crc32"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"checksum entry without a valid {exc}") from None
        if size < 0 or block <= 0 or len(text) % 8:
            raise ValueError("checksum entry with a negative size, a block of no bytes or a cut CRC list")
        try:  # 8 hex digits a CRC, big-endian: one conversion for the lot (a 100 GB bin has 100k of them)
            crcs = tuple(np.frombuffer(bytes.fromhex(text), ">u4").tolist())
        except ValueError:
            raise ValueError("checksum entry with a CRC list that is not hexadecimal") from None
        if len(crcs) != -(-size // block):
            raise ValueError(f"checksum entry with {len(crcs)} CRCs for {-(-size // block)} blocks")
        return cls(size, block, crcs)


class BlockCrcs:
    """The CRC-32 of each ``block_bytes`` block of a byte stream fed in pieces of any size (as it is written).

    >>> acc = BlockCrcs(4)
    >>> for piece in (b"abc", b"defgh", b"ij"):
    ...     acc.feed(piece)
    >>> acc.sums().crcs == tuple(zlib.crc32(x) for x in (b"abcd", b"efgh", b"ij"))
    True
    """

    def __init__(self, block_bytes: int) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        self.block_bytes = block_bytes
        self.crcs: list[int] = []
        self.size_bytes = 0
        self._crc = 0  # of the bytes of the block being filled
        self._fill = 0

    def feed(self, data: bytes | memoryview) -> None:
        """Add ``data``, the next bytes of the stream."""
        mv = memoryview(data).cast("B")
        at = 0
        while at < len(mv):
            take = min(len(mv) - at, self.block_bytes - self._fill)
            self._crc = zlib.crc32(mv[at:at + take], self._crc)
            self._fill += take
            at += take
            if self._fill == self.block_bytes:
                self.crcs.append(self._crc)
                self._crc = self._fill = 0
        self.size_bytes += len(mv)

    def sums(self) -> BlockSums:
        """The :class:`BlockSums` of everything fed (the last block short if the stream ends mid-block)."""
        tail = [self._crc] if self._fill else []
        return BlockSums(self.size_bytes, self.block_bytes, (*self.crcs, *tail))


def block_sums(path: str | Path, block_bytes: int) -> BlockSums:
    """Read ``path`` once and return the CRC-32 of each of its ``block_bytes`` blocks."""
    size = Path(path).stat().st_size
    crcs = tuple(crc32_of(path, a, min(size, a + block_bytes)) for a in range(0, size, block_bytes))
    return BlockSums(size, block_bytes, crcs)


def bad_blocks(path: str | Path, sums: BlockSums, which: Iterable[int]) -> list[int]:
    """The blocks among ``which`` whose bytes no longer match ``sums``, in order.

    The caller checks the file's size first: a block past the end reads as
    short and so as bad.
    """
    return [i for i in sorted(set(which)) if crc32_of(path, *sums.span(i)) != sums.crcs[i]]
