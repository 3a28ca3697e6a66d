"""SSD bin files: one file per SSD bin, rows at fixed offsets, with a JSON sidecar manifest.

Layout of a bin file (``PAGE`` = 4096 bytes, what O_DIRECT needs on the
devices this runs on):

* rows of ``row_bytes >= PAGE`` start on page boundaries, each padded to a
  whole number of pages (``row_stride_bytes`` = ``row_bytes`` rounded up to
  ``PAGE``); 4 KiB rows are therefore exactly page-aligned, one page each;
* rows of at most ``PAGE / 2`` bytes are packed ``PAGE // row_bytes`` to a page and never straddle
  two pages (the end of each page is padding), so any row is one page read.

Row ``r`` is at byte ``(r // rows_per_page) * PAGE + (r % rows_per_page) *
row_bytes`` (packed) or ``r * row_stride_bytes`` (page-aligned). The file is
written to ``<name>.tmp`` and renamed into place together with its manifest
``<name>.json`` (dtype, dim, row sizes, count, CRC-32 of the whole file, CRC-32
of its first block, and a CRC-32 per :data:`SUM_BLOCK_BYTES` block: ``block_sums``),
so a crash never leaves a half-written bin under the real name. :func:`open_bin`
checks file and manifest before training starts; the SSD tier checks each block
against ``block_sums`` the first time a read touches it (:mod:`iostack.binverify`).

>>> import numpy as np, tempfile
>>> from iostack.placement import simple_placement
>>> feats = np.arange(12, dtype=np.float32).reshape(6, 2)
>>> p = simple_placement(6, [("cpu", 2), ("ssd", 4)])
>>> with tempfile.TemporaryDirectory() as d:
...     info = write_bins(feats, p, d)[1]
...     (info.rows, info.row_bytes, info.rows_per_page, open_bin(d, p.bins[1]).rows)
(4, 8, 512, 4)
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from iostack.checksums import BlockCrcs, BlockSums, crc32_of
from iostack.errors import StoreError
from iostack.placement import Bin, Placement
from planner.progress import Progress

#: alignment of offsets, lengths and buffers for O_DIRECT, bytes
PAGE = 4096

#: bytes written per block (and the span of ``crc32_first_block``)
BLOCK_BYTES = 16 << 20

#: bytes per checksummed block (``block_sums``): what a reader verifies, once, on a block's first read;
#: 1 MiB keeps the sums of a 100 GB bin at 100k CRCs (tools/bench_bin_integrity.py measures the choice)
SUM_BLOCK_BYTES = 1 << 20


#: the suffix of a bin written beside the file it will replace (:func:`write_bins` ``staged``)
STAGED_SUFFIX = ".new"


@dataclass(frozen=True)
class BinFile:
    """An SSD bin's file and how its rows are laid out (what the manifest records)."""

    path: str
    bin_id: int
    dtype: str
    dim: int
    row_bytes: int
    row_stride_bytes: int
    rows_per_page: int
    rows: int
    file_bytes: int
    crc32: int
    crc32_first_block: int
    #: CRC-32 per block of the file (None: written before bins carried them)
    block_sums: BlockSums | None = None

    def offsets(self, rows: np.ndarray) -> np.ndarray:
        """Byte offset of each of ``rows`` (int64 array) in the file."""
        rows = np.asarray(rows, np.int64)
        if self.rows_per_page > 1:
            return (rows // self.rows_per_page) * PAGE + (rows % self.rows_per_page) * self.row_bytes
        return rows * self.row_stride_bytes


def layout(row_bytes: int) -> tuple[int, int]:
    """``(row_stride_bytes, rows_per_page)`` for rows of ``row_bytes``.

    >>> layout(4096), layout(100), layout(3000), layout(5000)
    ((4096, 1), (100, 40), (4096, 1), (8192, 1))
    """
    if row_bytes <= 0:
        raise StoreError(f"rows must have at least one byte, got {row_bytes}")
    if row_bytes <= PAGE // 2:  # two or more to a page: pack them
        return row_bytes, PAGE // row_bytes
    return -(-row_bytes // PAGE) * PAGE, 1


def file_bytes_for(rows: int, row_bytes: int) -> int:
    stride, rpp = layout(row_bytes)
    return -(-rows // rpp) * PAGE if rpp > 1 else rows * stride


def bin_path(directory: str | os.PathLike[str], b: Bin) -> Path:
    """Where bin ``b``'s file lives: its path, relative to ``directory`` unless absolute."""
    assert b.path is not None
    p = Path(b.path)
    return p if p.is_absolute() else Path(directory) / p


def _manifest_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def write_bins(features: np.ndarray, placement: Placement, directory: str | os.PathLike[str], *,
               block_bytes: int = BLOCK_BYTES, progress: Progress | None = None,
               fsync: bool = True, sum_block_bytes: int = SUM_BLOCK_BYTES,
               staged: bool = False) -> dict[int, BinFile]:
    """Write every SSD bin's file of ``placement`` from ``features`` (shape ``(V, dim)``, any dtype).

    ``features`` may be a memmap: it is read ``block_bytes`` at a time (in row
    order of the bin), so memory stays bounded whatever the size. Rows are
    stored as the placement's codec says (:attr:`Placement.codec`: float16,
    bfloat16, int8), else in the features' own type. Rows a vertex does not
    occupy are zeros. Each file carries a CRC-32 per ``sum_block_bytes`` block. Returns ``{bin id: BinFile}``.
    With ``staged`` each file goes under its staged name (:func:`staged_path`), leaving the
    files of the same names alone until :func:`publish_staged` (a placement replaced whole).
    """
    feats = np.asarray(features) if not isinstance(features, np.memmap) else features
    if feats.ndim == 1:
        feats = feats.reshape(-1, 1)
    if feats.ndim != 2 or feats.shape[0] != placement.num_vertices:
        raise StoreError(f"features of shape {tuple(feats.shape)} do not match the placement's "
                         f"{placement.num_vertices} vertices (want (num_vertices, dim))")
    codec = placement.codec
    if codec is not None and codec.dim != feats.shape[1]:
        raise StoreError(f"the placement's feature codec is for rows of dim {codec.dim}, the features have "
                         f"{feats.shape[1]}")
    dtype = codec.storage_np if codec is not None else feats.dtype
    row_bytes = feats.shape[1] * dtype.itemsize
    out: dict[int, BinFile] = {}
    Path(directory).mkdir(parents=True, exist_ok=True)
    for b in placement.bins:
        if b.kind != "ssd":
            continue
        verts = placement.vertices_of(b.id)
        rows = int(placement.row_of[verts[-1]]) + 1 if verts.size else 0
        vert_at = np.full(rows, -1, np.int64)  # row -> vertex, -1 for an unused row
        vert_at[placement.row_of[verts]] = verts

        def block(start: int, stop: int, vert_at: np.ndarray = vert_at) -> np.ndarray:
            v = vert_at[start:stop]
            blk = np.zeros((v.size, row_bytes), np.uint8)
            used = v >= 0
            if used.any():
                # vertices in row order: a memmap is read front to back when rows follow ids
                rows = feats[v[used]] if codec is None else codec.encode(feats[v[used]])
                blk[used] = np.ascontiguousarray(rows).view(np.uint8).reshape(-1, row_bytes)
            return blk

        final = bin_path(directory, b)
        out[b.id] = write_bin_file(staged_path(final) if staged else final, b.id, dtype, int(feats.shape[1]),
                                   rows, block, block_bytes=block_bytes, progress=progress, fsync=fsync,
                                   sum_block_bytes=sum_block_bytes, placement_dir=str(Path(directory).resolve()),
                                   final_path=final)
    return out


def staged_path(path: str | os.PathLike[str]) -> Path:
    """Where :func:`write_bins` with ``staged=True`` puts the file of ``path`` until it is published."""
    path = Path(path)
    return path.with_name(path.name + STAGED_SUFFIX)


def publish_staged(placement: Placement, directory: str | os.PathLike[str]) -> None:
    """Move every staged SSD bin of ``placement`` (and its manifest) over the file of its own name.

    Renames only (no copy): call it once the old placement's index is gone, since for a
    moment an old bin name holds a new file.
    """
    for b in placement.bins:
        if b.kind == "ssd":
            final = bin_path(directory, b)
            os.replace(staged_path(final), final)  # data first, manifest last, as write_bin_file
            os.replace(_manifest_path(staged_path(final)), _manifest_path(final))


def discard_staged(placement: Placement, directory: str | os.PathLike[str]) -> None:
    """Remove what :func:`write_bins` staged for ``placement`` (a replacement given up), if anything."""
    for b in placement.bins:
        if b.kind == "ssd":
            staged = staged_path(bin_path(directory, b))
            for f in (staged, _manifest_path(staged), staged.with_name(staged.name + ".tmp"),
                      _manifest_path(staged.with_name(staged.name + ".tmp"))):
                with contextlib.suppress(FileNotFoundError):
                    f.unlink()


def write_bin_file(path: str | os.PathLike[str], bin_id: int, dtype: np.dtype | str, dim: int, rows: int,
                   block: Callable[[int, int], np.ndarray], *, block_bytes: int = BLOCK_BYTES,
                   progress: Progress | None = None, fsync: bool = True,
                   sum_block_bytes: int = SUM_BLOCK_BYTES, placement_dir: str | None = None,
                   final_path: str | os.PathLike[str] | None = None) -> BinFile:
    """Write one bin file of ``rows`` rows, ``block(start, stop)`` giving rows ``start..stop-1``.

    ``block`` returns uint8 of shape ``(stop - start, dim * itemsize)``; it is
    called for ``block_bytes`` worth of rows at a time (bounded memory). The
    file and its manifest appear under their names only when complete; the
    manifest holds a CRC-32 of each ``sum_block_bytes`` block (``block_sums``)
    and ``placement_dir``, the placement it was written for (so that the next
    writer of that placement can tell a killed run's bins from another's).
    ``final_path``: the name the file will have once :func:`publish_staged` moves it
    there (its manifest records that name), when ``path`` is a staged one.
    """
    path = Path(path)
    dtype = np.dtype(dtype)
    row_bytes = dim * dtype.itemsize
    stride, rpp = layout(row_bytes)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    per_block = max(1, block_bytes // PAGE) * rpp if rpp > 1 else max(1, block_bytes // stride)
    crc = 0
    sums = BlockCrcs(sum_block_bytes)
    try:
        with open(tmp, "wb") as f:
            for start in range(0, rows, per_block):
                stop = min(rows, start + per_block)
                data = _pad(np.asarray(block(start, stop), np.uint8).reshape(stop - start, row_bytes),
                            stride, rpp)
                crc = zlib.crc32(data, crc)
                sums.feed(data)
                f.write(data)
                if progress is not None:  # once per block (16 MiB): cheap next to the write
                    progress(f"writing bin {bin_id}", stop, rows)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        first_crc = crc32_of(tmp, 0, BLOCK_BYTES)  # still in the page cache
        info = BinFile(path=str(final_path if final_path is not None else path), bin_id=bin_id, dtype=dtype.str,
                       dim=dim, row_bytes=row_bytes,
                       row_stride_bytes=stride, rows_per_page=rpp, rows=rows,
                       file_bytes=file_bytes_for(rows, row_bytes), crc32=crc, crc32_first_block=first_crc,
                       block_sums=sums.sums())
        mtmp = _manifest_path(tmp)
        mtmp.write_text(_manifest_text(info, **({"placement_dir": placement_dir} if placement_dir else {})))
        # data first, manifest last: a manifest under the real name always describes a whole file
        os.replace(tmp, path)
        os.replace(mtmp, _manifest_path(path))
        if fsync:  # what the rows of a bench read must come from is the device, not the cache
            with contextlib.suppress(OSError, AttributeError), open(path, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    except BaseException as exc:  # Ctrl-C too: no half-written bin left beside the placement
        with contextlib.suppress(OSError):
            tmp.unlink()
        with contextlib.suppress(OSError):
            _manifest_path(tmp).unlink()
        if isinstance(exc, OSError):
            raise StoreError(f"{path}: cannot write bin {bin_id}: {exc.strerror or exc}") from None
        raise
    return info


def _manifest_text(info: BinFile, **extra: str) -> str:
    """The manifest of ``info`` as JSON (its block sums compact: :meth:`BlockSums.to_json`)."""
    fields = {k: v for k, v in asdict(info).items() if k != "block_sums"}
    sums = None if info.block_sums is None else info.block_sums.to_json()
    return json.dumps({"format": "moment-bin", "version": 1, **fields, "block_sums": sums, **extra}, indent=1) + "\n"


def _parse_manifest(man: Path, data: object, fix: str) -> BinFile:
    """The :class:`BinFile` a manifest's JSON ``data`` describes; :class:`StoreError` naming ``man`` if malformed."""
    if not isinstance(data, dict) or data.get("format") != "moment-bin":
        raise StoreError(f"{man}: not a bin manifest; {fix}")
    try:
        fields = {k: data[k] for k in BinFile.__dataclass_fields__ if k != "block_sums"}
        sums = data.get("block_sums")
        info = BinFile(**fields, block_sums=None if sums is None else BlockSums.from_json(sums))
    except (KeyError, TypeError) as exc:
        raise StoreError(f"{man}: field {exc} is missing or malformed; {fix}") from None
    except ValueError as exc:
        raise StoreError(f"{man}: `block_sums`: {exc}; {fix}") from None
    if info.block_sums is not None and info.block_sums.size_bytes != info.file_bytes:
        raise StoreError(f"{man}: its block sums cover {info.block_sums.size_bytes} bytes, the file "
                         f"{info.file_bytes}; {fix}")
    return info


def _pad(block: np.ndarray, stride: int, rpp: int) -> bytes:
    """Rows of ``block`` laid out as in the file: pages of packed rows, or page-padded rows."""
    n, row_bytes = block.shape
    if rpp > 1:
        pages = -(-n // rpp)
        buf = np.zeros((pages, PAGE), np.uint8)
        full = np.zeros((pages * rpp, row_bytes), np.uint8)
        full[:n] = block
        buf[:, :rpp * row_bytes] = full.reshape(pages, rpp * row_bytes)
        return buf.tobytes()
    if stride == row_bytes:
        return block.tobytes()
    buf = np.zeros((n, stride), np.uint8)
    buf[:, :row_bytes] = block
    return buf.tobytes()


def open_bin(directory: str | os.PathLike[str], b: Bin, *, dtype: np.dtype | str | None = None,
             dim: int | None = None, min_rows: int | None = None, full_check: bool = False,
             first_block: bool = True) -> BinFile:
    """Check bin ``b``'s file against its manifest and return its :class:`BinFile`.

    Checks, each failing with a :class:`StoreError` naming the file and the fix:
    file and manifest exist, the manifest is one of ours for this bin, the file
    has exactly the bytes the manifest says, the CRC of the first block matches
    (``full_check``: of the whole file too, reading it all; ``first_block=False``:
    not even that, for a caller that checks every block itself), and dtype, dim
    and rows match what the caller expects.
    """
    path = bin_path(directory, b)
    man = _manifest_path(path)
    fix = "rewrite the bins (`write_bins`, or place again with `force=True`)"
    if not path.exists():
        raise StoreError(f"{path}: bin {b.id} is missing; {fix}")
    try:
        data = json.loads(man.read_text())
    except FileNotFoundError:
        raise StoreError(f"{man}: the manifest of bin {b.id} is missing; {fix}") from None
    except (OSError, ValueError) as exc:
        raise StoreError(f"{man}: cannot read the manifest of bin {b.id} ({exc}); {fix}") from None
    info = replace(_parse_manifest(man, data, fix), path=str(path))
    if info.bin_id != b.id:
        raise StoreError(f"{man}: describes bin {info.bin_id}, expected bin {b.id}; {fix}")
    size = path.stat().st_size
    if size != info.file_bytes:
        what = "truncated" if size < info.file_bytes else "longer than its manifest says"
        raise StoreError(f"{path}: bin {b.id} is {what} ({size} bytes, manifest says {info.file_bytes}); {fix}")
    if dtype is not None and np.dtype(info.dtype) != np.dtype(dtype):
        raise StoreError(f"{path}: bin {b.id} holds {np.dtype(info.dtype)}, the store expects {np.dtype(dtype)}; {fix}")
    if dim is not None and info.dim != dim:
        raise StoreError(f"{path}: bin {b.id} holds rows of dim {info.dim}, the store expects {dim}; {fix}")
    if min_rows is not None and info.rows < min_rows:
        raise StoreError(f"{path}: bin {b.id} holds {info.rows} rows, the placement needs {min_rows}; {fix}")
    if first_block and info.rows and crc32_of(path, 0, BLOCK_BYTES) != info.crc32_first_block:
        raise StoreError(f"{path}: bin {b.id} does not match its manifest (checksum of the first block); {fix}")
    if full_check:
        crc = crc32_of(path)
        if crc != info.crc32:
            raise StoreError(
                f"{path}: bin {b.id} is corrupt (CRC-32 {crc:#010x}, manifest says {info.crc32:#010x}); {fix}"
            )
    return info


# --- a feature file as a bin, in place -------------------------------------------------------


def in_place_shift(path: str | os.PathLike[str]) -> int:
    """Rows the ``.npy`` header of the feature file at ``path`` takes when the file serves as an SSD bin
    as it is: vertex ``v`` is then bin row ``v + shift``.

    Possible when the rows sit where a bin file would put them: data starting on a page
    boundary (:func:`training.data.open_paged_npy` writes such files), rows of a whole
    number of pages or packed a whole number to a page, the file a whole number of pages
    long. Raises :class:`StoreError` saying which condition fails and what to do.
    """
    path = Path(path)
    fix = "re-import or re-generate the dataset with this version (its features.npy is then page-aligned), " \
          "or place without `in_place` (the rows are copied into bin files)"
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            start = f.tell()
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: cannot read it as a .npy feature file ({exc}); {fix}") from None
    if len(shape) != 2 or fortran:
        raise StoreError(f"{path}: holds a {'Fortran-order ' if fortran else ''}array of shape {shape}, "
                         f"not C-order rows; {fix}")
    row_bytes = int(shape[1]) * np.dtype(dtype).itemsize
    stride, rpp = layout(row_bytes)
    if rpp > 1 and PAGE % row_bytes:
        raise StoreError(f"{path}: rows of {row_bytes} bytes do not divide a page, a bin would pad them; {fix}")
    if rpp == 1 and stride != row_bytes:
        raise StoreError(f"{path}: rows of {row_bytes} bytes are not whole pages, a bin would pad them; {fix}")
    if start % PAGE or start % row_bytes:
        raise StoreError(f"{path}: its rows start at byte {start}, not on a page and row boundary; {fix}")
    shift = start // row_bytes
    size = path.stat().st_size
    if size != file_bytes_for(shift + int(shape[0]), row_bytes):
        raise StoreError(f"{path}: {size} bytes, not a whole number of pages of rows; {fix}")
    return shift


def adopt_bin(features_path: str | os.PathLike[str], b: Bin, directory: str | os.PathLike[str], *,
              progress: Progress | None = None) -> BinFile:
    """Make the ``.npy`` feature file at ``features_path`` bin ``b``'s file without copying a row.

    ``bin_path(directory, b)`` becomes a symbolic link to the (absolute) feature file and
    its manifest describes the file as a bin of ``shift + V`` rows (:func:`in_place_shift`;
    the first ``shift`` rows are the header and belong to no vertex), so readers,
    :func:`open_bin` and its checks work unchanged. The CRC-32 of the whole file is taken
    by one sequential read (``progress`` hears ``("checking features", bytes, total)``).
    Removing the placement removes the link only; changing the dataset's features makes
    :func:`open_bin` refuse the bin (size or first-block CRC) — the placement refers to
    the dataset's file, so keep the dataset while the placement is used.
    """
    src = Path(features_path).resolve()
    shift = in_place_shift(src)
    arr = np.load(src, mmap_mode="r")
    dtype, dim = arr.dtype, int(arr.shape[1])
    rows = shift + int(arr.shape[0])
    del arr
    row_bytes = dim * dtype.itemsize
    stride, rpp = layout(row_bytes)
    size = src.stat().st_size
    crc = 0
    sums = BlockCrcs(SUM_BLOCK_BYTES)
    try:
        with open(src, "rb") as f:
            for a in range(0, size, BLOCK_BYTES):
                data = f.read(BLOCK_BYTES)
                crc = zlib.crc32(data, crc)
                sums.feed(data)
                if progress is not None:
                    progress("checking features", min(size, a + BLOCK_BYTES), size)
        path = bin_path(directory, b)
        path.parent.mkdir(parents=True, exist_ok=True)
        info = BinFile(path=str(path), bin_id=b.id, dtype=dtype.str, dim=dim, row_bytes=row_bytes,
                       row_stride_bytes=stride, rows_per_page=rpp, rows=rows, file_bytes=size, crc32=crc,
                       crc32_first_block=crc32_of(src, 0, BLOCK_BYTES), block_sums=sums.sums())
        tmp = path.with_name(path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(src, tmp)
        mtmp = _manifest_path(tmp)
        mtmp.write_text(_manifest_text(info, in_place_of=str(src), placement_dir=str(Path(directory).resolve())))
        os.replace(tmp, path)
        os.replace(mtmp, _manifest_path(path))
    except OSError as exc:
        raise StoreError(f"{features_path}: cannot make it bin {b.id} in place: {exc.strerror or exc}") from None
    return info
