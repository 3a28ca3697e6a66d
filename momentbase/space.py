"""Room on the disk reserved before a file is written through a memory map.

A store into a memory-mapped page the file system cannot back (a full disk, a full
``/dev/shm``) is not an error the program can catch: the kernel sends ``SIGBUS`` and the
process dies at once, printing nothing and leaving its temporary files (issue 28 item 7).
Every writer that maps a file it is about to fill calls :func:`reserve` first: the file's
blocks are allocated with ``posix_fallocate`` (one call; cheap on ext4, XFS and tmpfs, which
allocate extents without writing them), so a disk without room fails there, in one line
naming the file, the bytes it needs and the bytes free, while the writer can still clean up.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> p = os.path.join(d, "f.bin")
>>> with open(p, "wb") as f:
...     _ = f.truncate(1 << 16)                 # a sparse file: no blocks yet
>>> reserve(p)                                  # the file's own length
>>> os.stat(p).st_blocks * 512 >= 1 << 16
True
"""

from __future__ import annotations

import errno
import os

from momentbase.errors import MomentError
from momentbase.units import format_size

#: errors of ``posix_fallocate`` that mean "this file system cannot say": fall back to counting free space
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})
#: errors that mean "no room": the disk is full or the user's quota is spent
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class NoSpaceError(MomentError):
    """A file to be written through a memory map does not fit on its file system."""


def free_bytes(fd: int) -> int:
    """Bytes an unprivileged writer may still allocate on the file system of the open file ``fd``."""
    st = os.fstatvfs(fd)
    return int(st.f_bavail) * int(st.f_frsize)


def _refuse(path: str | os.PathLike[str], need: int, free: int) -> NoSpaceError:
    return NoSpaceError(f"{os.fspath(path)}: needs {format_size(need)} ({need} bytes) on its disk, which has "
                        f"{format_size(free)} ({free} bytes) free; free some space or write it elsewhere")


def reserve(path: str | os.PathLike[str], nbytes: int | None = None, *, fd: int | None = None) -> None:
    """Allocate the first ``nbytes`` of the file ``path`` (default: its length) on its disk.

    Call it after the file has its final length (``ftruncate``, ``open_memmap``) and before
    anything is stored through a map of it. Where the file system cannot allocate ahead
    (``posix_fallocate`` unsupported, or not on this platform), the free space is counted
    instead. The file's length is never shortened; a file that grew past ``nbytes`` keeps it.

    Parameters
    ----------
    path : path-like
        The file (it must exist); named in the error.
    nbytes : int, optional
        Bytes to allocate from offset 0; the file's length when omitted.
    fd : int, optional
        An open descriptor of ``path`` to use instead of opening it (left open).

    Raises
    ------
    NoSpaceError
        The disk has no room for the bytes not yet allocated: one line naming ``path``, the bytes
        it needs and the bytes free.
    """
    own = fd is None
    if fd is None:
        fd = os.open(path, os.O_RDWR)
    try:
        st = os.fstat(fd)
        want = st.st_size if nbytes is None else int(nbytes)
        if want <= 0:
            return
        # what the file does not hold yet (a sparse file holds nothing past its written pages)
        need = max(0, want - int(st.st_blocks) * 512)
        free = free_bytes(fd)
        if need == 0:
            return
        if need > free:  # refused before allocating: ext4's fallocate would fill the disk before it fails
            raise _refuse(path, need, free)
        try:
            fallocate = os.posix_fallocate
        except AttributeError:  # macOS: no posix_fallocate
            fallocate = None
        if fallocate is not None:
            try:
                fallocate(fd, 0, want)
                return
            except OSError as exc:
                if exc.errno in _NO_ROOM:
                    raise _refuse(path, need, free) from None
                if exc.errno not in _UNSUPPORTED:
                    raise
    finally:
        if own:
            os.close(fd)


def write_all(fd: int, data: memoryview | bytes, path: str | os.PathLike[str], at: int | None = None) -> int:
    """Write all of ``data`` to ``fd`` (at offset ``at`` with ``pwrite``, else where it stands); bytes written.

    The writers that fill a file by ``write``/``pwrite`` instead of a map use this, so a disk
    that fills meanwhile is the same one-line error as :func:`reserve`'s, naming ``path``
    (an ``OSError`` of ``write`` names no file).

    Raises
    ------
    NoSpaceError
        The disk filled: names ``path``, the bytes still to write and the bytes free.
    """
    view = memoryview(data).cast("B")
    done = 0
    try:
        while done < len(view):
            done += os.pwrite(fd, view[done:], at + done) if at is not None else os.write(fd, view[done:])
    except OSError as exc:
        if exc.errno in _NO_ROOM:
            raise _refuse(path, len(view) - done, free_bytes(fd)) from None
        raise
    return done


__all__ = ["NoSpaceError", "free_bytes", "reserve", "write_all"]
