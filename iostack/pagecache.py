"""A file's pages in the page cache: drop them (a cold read for that file alone) and say how many are resident.

A read figure of a buffered reader (KvikIO's compatibility mode, ``posix``
where O_DIRECT is refused) measures memory, not the SSD, once the file is in
the page cache; an O_DIRECT reader's does not. Figures that compare them are
taken cold: :func:`drop` before every timed batch, :func:`resident_share`
reported beside the figure. The machine may be shared, so no global
``drop_caches``: ``posix_fadvise(DONTNEED)`` of this file's clean pages.

>>> import tempfile, os
>>> with tempfile.NamedTemporaryFile() as f:
...     _ = f.write(b"x" * 8192); f.flush()
...     drop(f.name)
...     0.0 <= resident_share(f.name) <= 1.0
True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

_PAGE = mmap.PAGESIZE


def drop(path: str | os.PathLike[str]) -> None:
    """Evict ``path``'s clean pages from the page cache (its dirty ones are written first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_share(path: str | os.PathLike[str]) -> float | None:
    """Share of ``path``'s pages in the page cache now (``mincore`` of a mapping), None where it cannot be told."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    # ctypes' own mmap/mincore/munmap: Python's mmap object gives no address of a read-only mapping
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    pages = (size + _PAGE - 1) // _PAGE
    vec = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            if libc.mincore(addr, size, vec) != 0:
                return None
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec) / pages
