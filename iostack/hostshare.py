"""Host memory shared by the processes of one node: a cache tier built once, mapped by every rank.

``torch.Tensor.share_memory_()`` shares a tensor only with the children a
process starts itself; ``torchrun`` ranks are siblings, so each would build
(and pin) its own copy of the CPU cache. :func:`shared_host_tensor` instead
names a file in ``/dev/shm`` after a key that says what the tensor holds: the
first process to take the key's lock fills a temporary file and renames it into
place, the others wait on the lock and map the finished file. Every user
holds a shared ``flock`` on the segment while it is mapped; the last one to
close it (an exclusive lock succeeds) removes it. A segment left by a killed
run is reused by the next run with the same key (its contents are complete:
it was renamed into place only after being filled).

Space is reserved with ``posix_fallocate`` before anything is written, so a
full ``/dev/shm`` (small in containers) is a clean ``None`` (the caller keeps
private memory) instead of a ``SIGBUS`` on the first write.

>>> import tempfile, torch
>>> with tempfile.TemporaryDirectory() as d:
...     a = shared_host_tensor("k", (2, 3), torch.float32, lambda t: t.fill_(7), directory=d)
...     b = shared_host_tensor("k", (2, 3), torch.float32, lambda t: t.fill_(0), directory=d)
...     print(a.built, b.built, float(b.tensor.sum()))
...     b.close(); a.close()
True False 42.0
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

#: where segments live (a tmpfs on Linux)
SHM_DIR = "/dev/shm"
_HEADER = 4096  # the data starts page-aligned (cudaHostRegister and O_DIRECT like that)
_MAGIC = b"moment-shm-1\n"
_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")


@dataclass(eq=False)
class SharedHostTensor:
    """A tensor over a node-shared segment; ``built``: this process filled it. :meth:`close` when done."""

    tensor: torch.Tensor
    path: Path
    built: bool
    _fd: int = field(repr=False, default=-1)
    _map: mmap.mmap | None = field(repr=False, default=None)

    def close(self) -> None:
        """Unmap; remove the segment if no other process maps it any more."""
        if self._fd < 0:
            return
        self.tensor = torch.empty(0)
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view still alive elsewhere keeps the mapping
                self._map.close()
            self._map = None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # another process still maps it
        else:
            for p in (self.path, _lock_path(self.path)):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
        os.close(self._fd)
        self._fd = -1


def _lock_path(seg: Path) -> Path:
    return seg.with_suffix(".lock")


def _header(shape: tuple[int, ...], dtype: torch.dtype) -> bytes:
    meta = json.dumps({"shape": list(shape), "dtype": str(dtype)}).encode()
    return _MAGIC + meta + b"\n"


def shared_host_tensor(key: str, shape: tuple[int, ...], dtype: torch.dtype,
                       fill: Callable[[torch.Tensor], object], *,
                       directory: str | os.PathLike[str] = SHM_DIR) -> SharedHostTensor | None:
    """A ``shape``/``dtype`` host tensor named ``key``, filled by ``fill(tensor)`` in the first process only.

    ``key`` (letters, digits, ``_.-``) must change whenever the contents
    would: a segment with the key is trusted to hold them. Returns None when
    ``directory`` is missing or has no room (use private memory then).
    """
    if not _KEY.match(key):
        raise ValueError(f"shared segment key {key!r}: use letters, digits, '_', '.', '-' (at most 120)")
    d = Path(directory)
    if not d.is_dir() or not os.access(d, os.W_OK):
        return None
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    total = _HEADER + max(nbytes, 1)
    seg = d / f"moment-{key}.seg"
    header = _header(tuple(shape), dtype)
    lfd = os.open(_lock_path(seg), os.O_RDWR | os.O_CREAT, 0o600)
    fd = -1
    try:
        fcntl.flock(lfd, fcntl.LOCK_EX)
        built = False
        try:
            fd = os.open(seg, os.O_RDWR)
            if os.fstat(fd).st_size != total or os.pread(fd, len(header), 0) != header:
                os.close(fd)
                fd = -1
        except FileNotFoundError:
            fd = -1
        if fd < 0:
            fd = _build(seg, total, header, shape, dtype, nbytes, fill)
            if fd < 0:
                return None
            built = True
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        fcntl.flock(lfd, fcntl.LOCK_UN)
        os.close(lfd)
    mm = mmap.mmap(fd, total)
    t = _view(mm, shape, dtype, nbytes)
    return SharedHostTensor(t, seg, built, fd, mm)


def _view(mm: mmap.mmap, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    raw = np.frombuffer(mm, np.uint8, count=nbytes, offset=_HEADER)
    return torch.from_numpy(raw).view(dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype)


def _build(seg: Path, total: int, header: bytes, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int,
           fill: Callable[[torch.Tensor], object]) -> int:
    """Fill a temporary file and rename it to ``seg``; its descriptor, or -1 when there is no room."""
    tmp = seg.with_name(f"{seg.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, total)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EOPNOTSUPP, errno.EINVAL):
                os.close(fd)
                tmp.unlink(missing_ok=True)
                return -1
            raise
        mm = mmap.mmap(fd, total)
        try:
            t = _view(mm, shape, dtype, nbytes)
            fill(t)
            del t
            mm[:len(header)] = header
            mm.flush()
        finally:
            with contextlib.suppress(BufferError):
                mm.close()
        os.rename(tmp, seg)
        return fd
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
