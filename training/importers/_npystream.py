"""The ``.npy`` members of an ``.npz`` (zip) file, read in chunks without loading a member whole.

``np.load`` of an ``.npz`` reads a member completely into memory (a zip member
cannot be memory-mapped by numpy), which for OGB papers100M's ``data.npz`` is
26 GB of ``edge_index`` and 57 GB of ``node_feat``. Here each member's
``.npy`` header is parsed with numpy's own reader (``np.lib.format``) and its
data then read from the zip stream in bounded chunks:

- a *stored* member (``np.savez``) is contiguous bytes of the zip file, so it
  is memory-mapped at its offset (:func:`memmap`);
- a *deflated* member (``np.savez_compressed``, what OGB writes) is
  decompressed as a stream by :mod:`zipfile` (:func:`iter_items`); a read
  starting past the beginning decompresses and drops what lies before it.

zipfile checks each member's CRC-32 when a stream reaches its end, so a
corrupt or truncated member is reported (as :class:`DatasetError` naming the
file, the member and the fix) by whichever read finishes it.

>>> import io, tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "a.npz"
>>> np.savez_compressed(p, x=np.arange(10))
>>> m = members(p)["x"]
>>> m.shape, [c.tolist() for c in iter_items(m, 2, 7, chunk_items=2)]
((10,), [[2, 3], [4, 5], [6]])
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data import DatasetError

#: zip local file header: signature, ..., name length at byte 26, extra length at byte 28
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_LOCAL_SIGNATURE = 0x04034B50


@dataclass(frozen=True)
class NpyMember:
    """One ``.npy`` member of an ``.npz``: where it is and what its header says."""

    path: Path
    #: the member's name in the zip (``edge_index.npy``)
    member: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    #: bytes of the ``.npy`` header before the data, inside the member
    header_bytes: int
    #: where the data begins in the zip file itself, for a stored member; None when compressed
    file_offset: int | None

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def where(self) -> str:
        return f"{self.path} (member {self.member})"


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise DatasetError(
            f"{path}: not a readable .npz (zip) file ({exc}); it is truncated or damaged, download it again"
        ) from None


def _corrupt(m: NpyMember | str, exc: BaseException) -> DatasetError:
    where = m.where if isinstance(m, NpyMember) else m
    return DatasetError(f"{where}: truncated or corrupt compressed data ({exc}); download the file again")


def _header(zf: zipfile.ZipFile, path: Path, info: zipfile.ZipInfo) -> NpyMember:
    where = f"{path} (member {info.filename})"
    try:
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f, max_header_size=1 << 20)
            header = f.tell()
    except ValueError as exc:
        raise DatasetError(f"{where}: not a .npy array ({exc}); is this the right file?") from None
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
        raise _corrupt(where, exc) from None
    if dtype.hasobject:
        raise DatasetError(f"{where}: holds Python objects (a pickle), not numbers; refusing to load it")
    offset = None
    if info.compress_type == zipfile.ZIP_STORED:
        with open(path, "rb") as raw:
            raw.seek(info.header_offset)
            fields = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
        if fields[0] != _LOCAL_SIGNATURE:
            raise DatasetError(f"{where}: bad local zip header; the file is damaged, download it again")
        offset = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10] + header
    need = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if info.file_size != need:
        raise DatasetError(
            f"{where}: holds {info.file_size:,} bytes but its header ({list(shape)} {dtype}) needs {need:,}; "
            "the file is truncated or damaged, download it again"
        )
    return NpyMember(path, info.filename, tuple(int(s) for s in shape), np.dtype(dtype), bool(fortran), header, offset)


def members(path: str | Path) -> dict[str, NpyMember]:
    """The ``.npy`` members of the ``.npz`` at ``path``, by key (the name without ``.npy``)."""
    path = Path(path)
    with _open_zip(path) as zf:
        return {info.filename[: -len(".npy")]: _header(zf, path, info)
                for info in zf.infolist() if info.filename.endswith(".npy")}


def memmap(m: NpyMember) -> np.memmap:
    """A read-only memory map of a stored (uncompressed) member's data."""
    if m.file_offset is None:
        raise ValueError(f"{m.where} is compressed; read it with iter_items")
    return np.memmap(m.path, dtype=m.dtype, mode="r", offset=m.file_offset, shape=m.shape,
                     order="F" if m.fortran_order else "C")


#: bytes asked of the zip stream at a time: zipfile builds each answer by concatenating
#: decompressed pieces, so one large read holds about twice its size in short-lived bytes
READ_PIECE_BYTES = 4 << 20


def _read_into(f, out: memoryview, m: NpyMember) -> None:
    """Fill ``out`` from the stream ``f`` in pieces of READ_PIECE_BYTES."""
    done = 0
    while done < len(out):
        try:
            data = f.read(min(READ_PIECE_BYTES, len(out) - done))
        except (zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
            raise _corrupt(m, exc) from None
        if not data:
            raise DatasetError(f"{m.where}: the data ends early; download the file again")
        out[done : done + len(data)] = data
        done += len(data)


def iter_items(m: NpyMember, start: int = 0, stop: int | None = None, *,
               chunk_items: int = 1 << 22) -> Iterator[np.ndarray]:
    """Elements ``start:stop`` of the member in file order (flat), at most ``chunk_items`` at a time.

    A stored member is sliced from its memory map; a compressed one is
    decompressed from the beginning (what lies before ``start`` is dropped
    in chunks). Reading up to the member's end checks its CRC-32.
    """
    stop = m.size if stop is None else stop
    if not 0 <= start <= stop <= m.size:
        raise ValueError(f"items {start}:{stop} outside {m.where}'s {m.size}")
    if m.file_offset is not None:
        flat = memmap(m).reshape(-1, order="F" if m.fortran_order else "C")
        for a in range(start, stop, chunk_items):
            yield np.asarray(flat[a : min(a + chunk_items, stop)])
        return
    item = m.dtype.itemsize
    with _open_zip(m.path) as zf:
        try:
            f = zf.open(m.member)
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise _corrupt(m, exc) from None
        with f:
            skip = m.header_bytes + start * item
            # skipped in pieces no larger than a chunk, so that the chunk bounds memory here too
            scratch = np.empty(min(skip, READ_PIECE_BYTES, chunk_items * item), dtype=np.uint8)
            while skip:
                piece = min(skip, scratch.size)
                _read_into(f, scratch.data[:piece], m)
                skip -= piece
            for a in range(start, stop, chunk_items):
                block = np.empty(min(chunk_items, stop - a), dtype=m.dtype)
                _read_into(f, block.view(np.uint8).data, m)
                yield block
            if stop == m.size:  # zipfile verifies the CRC-32 once the stream is read to its end
                try:
                    extra = f.read(1)
                except (zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
                    raise _corrupt(m, exc) from None
                if extra:
                    raise DatasetError(f"{m.where}: more data than its header says; download the file again")


def read_whole(m: NpyMember, limit_items: int = 1 << 16) -> np.ndarray:
    """A small member (a count list) whole, shaped as its header says."""
    if m.size > limit_items:
        raise DatasetError(f"{m.where}: {m.size:,} elements, expected a short list")
    flat = np.concatenate(list(iter_items(m))) if m.size else np.zeros(0, m.dtype)
    return flat.reshape(m.shape, order="F" if m.fortran_order else "C")


def write_member(zf: zipfile.ZipFile, key: str, shape: tuple[int, ...], dtype, blocks) -> None:
    """Write ``key.npy`` of ``shape`` into the open zip ``zf`` from an iterable of C-order blocks.

    The inverse of :func:`iter_items`, for inputs larger than memory (tests and
    benchmarks make papers100M-shaped files with it); zip64 is forced so a
    member may pass 4 GiB.
    """
    dtype = np.dtype(dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    written = 0
    with zf.open(f"{key}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_2_0(f, header)
        for block in blocks:
            data = np.ascontiguousarray(block, dtype=dtype).tobytes()
            f.write(data)
            written += len(data)
    if written != need:
        raise ValueError(f"{key}: {written} bytes written, shape {shape} needs {need}")


__all__ = ["NpyMember", "iter_items", "members", "memmap", "read_whole", "write_member"]
