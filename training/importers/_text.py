"""Chunked readers of numeric text (edge lists, OGB ``.csv.gz``) with bounded memory.

The file is read ``chunk_bytes`` at a time (gzip decompressed on the fly), cut at
the last complete line, and each block is parsed by ``np.loadtxt`` (numpy's C
parser). Memory is bounded by the block, not the file. A line that does not
parse is reported with its 1-based line number in the file.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from training.data import DatasetError

#: bytes of text parsed per block: 32 MiB of text is ~2-3 M edge lines, a few tens of MB parsed
DEFAULT_CHUNK_BYTES = 32 << 20


def is_gzip(path: Path) -> bool:
    """Whether ``path`` starts with the gzip magic bytes (regardless of its name)."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def open_binary(path: Path):
    """``path`` opened for binary reading, decompressing gzip transparently."""
    try:
        return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DatasetError(f"{path}: is a directory, expected a file") from None


def _read(f, n: int, path: Path) -> bytes:
    try:
        return f.read(n)
    except EOFError:
        raise DatasetError(
            f"{path}: the gzip stream ends early (the file is truncated); download it again"
        ) from None
    except (gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise DatasetError(f"{path}: corrupt gzip data ({exc}); download it again") from None


def iter_line_blocks(path: Path, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """Blocks of whole lines: ``(number of lines before the block, block bytes)``."""
    lines_before = 0
    rest = b""
    with open_binary(path) as f:
        while True:
            data = _read(f, chunk_bytes, path)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n")
            if cut < 0:  # a single line longer than the block: keep accumulating
                rest = data
                continue
            block, rest = data[: cut + 1], data[cut + 1 :]
            yield lines_before, block
            lines_before += block.count(b"\n")
    if rest.strip():
        yield lines_before, rest + b"\n"


def _locate_bad_line(path: Path, first_line: int, block: str, ncols: int, dtype, delimiter, comments,
                     exact: bool = False) -> DatasetError:
    """The first line of ``block`` that does not parse, as an error naming its line number."""
    kind = "integers" if np.dtype(dtype).kind in "iu" else "numbers"
    sep = "comma-separated" if delimiter == "," else "whitespace-separated"
    for i, line in enumerate(block.splitlines()):
        text = line
        for c in (comments,) if isinstance(comments, str) else (comments or ()):
            text = text.split(c, 1)[0]
        text = text.strip()
        if not text:
            continue
        fields = text.split(delimiter) if delimiter else text.split()
        ok = len(fields) == ncols if exact else len(fields) >= ncols
        if ok:
            try:
                for x in fields[:ncols]:
                    float(x) if kind == "numbers" else int(x)
            except ValueError:
                ok = False
        if not ok:
            return DatasetError(
                f"{path}:{first_line + i + 1}: expected {ncols} {sep} {kind}, found {line.strip()[:80]!r}"
            )
    return DatasetError(f"{path}: lines {first_line + 1}..: could not be parsed as {ncols} {sep} {kind}")


def iter_rows(
    path: Path,
    *,
    ncols: int,
    dtype=np.int64,
    delimiter: str | None = None,
    comments: str | tuple[str, ...] | None = "#",
    exact_cols: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[np.ndarray]:
    """Parse a numeric text file into [rows, ncols] arrays, one per block of lines.

    ``delimiter`` None means any whitespace; extra columns are ignored unless
    ``exact_cols``. Blank lines and ``comments`` are skipped; ``\\r\\n`` is fine.

    >>> import tempfile, os
    >>> p = Path(tempfile.mkdtemp()) / "e.txt"
    >>> _ = p.write_text("# a comment\\n0 1\\n1\\t2\\r\\n")
    >>> [a.tolist() for a in iter_rows(p, ncols=2)]
    [[[0, 1], [1, 2]]]
    """
    usecols = None if exact_cols else tuple(range(ncols))
    # numpy's C parser handles one single-character comment marker; several are mapped onto the
    # first one in the raw bytes (a marker never occurs inside a number), which keeps parsing in C
    markers = (comments,) if isinstance(comments, str) else tuple(comments or ())
    single = markers and all(len(c) == 1 for c in markers)
    for first, raw in iter_line_blocks(path, chunk_bytes):
        if single and len(markers) > 1:
            for c in markers[1:]:
                raw = raw.replace(c.encode(), markers[0].encode())
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = first + raw[: exc.start].count(b"\n") + 1
            raise DatasetError(f"{path}:{line}: not text (undecodable byte); is this the right file?") from None
        try:
            arr = np.loadtxt(io.StringIO(text), dtype=dtype, delimiter=delimiter,
                             comments=markers[0] if single else comments,
                             usecols=usecols, ndmin=2)
        except ValueError:
            raise _locate_bad_line(path, first, text, ncols, dtype, delimiter, comments, exact_cols) from None
        if arr.size == 0:
            continue
        if arr.shape[1] != ncols:
            raise _locate_bad_line(path, first, text, ncols, dtype, delimiter, comments, exact_cols)
        yield arr
