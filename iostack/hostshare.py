"""Host memory shared by the processes of one node: a cache tier built once, mapped by every rank.

``torch.Tensor.share_memory_()`` shares a tensor only with the children a
process starts itself; ``torchrun`` ranks are siblings, so each would build
(and pin) its own copy of the CPU cache. :func:`shared_host_tensor` instead
names a file in ``/dev/shm`` after a key that says what the tensor holds: the
first process to take the key's lock fills a temporary file and renames it into
place, the others wait on the lock and map the finished file. Every user
holds a shared ``flock`` on the segment while it is mapped.

No segment outlives its job:

* the last process to :meth:`~SharedHostTensor.close` it (an exclusive lock
  succeeds) removes it;
* once every process that needs it has mapped it (the trainer knows: a
  barrier), :meth:`~SharedHostTensor.unlink` removes its name while the
  mappings stay, so the kernel frees the memory when the last mapping goes,
  however the processes end (``kill -9`` included);
* a segment nobody maps any more (its job was killed before the unlink) is
  removed by :func:`sweep_stale`, which every :func:`shared_host_tensor` call
  runs first: a restart never finds, trusts or keeps one (``flock`` locks die
  with their process, so "nobody holds a lock on it" is exact).

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

#: where segments live (a tmpfs on Linux); ``MOMENT_SHM_DIR`` moves them (tests)
SHM_DIR = os.environ.get("MOMENT_SHM_DIR", "/dev/shm")
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

    def unlink(self) -> None:
        """Remove the segment's name; this process's mapping (and every other's) stays valid.

        Call it once every process that will map the segment has done so: from
        then on nothing is left in the directory, whatever happens to them.
        """
        if self._fd < 0 or not _names(self.path, self._fd):
            return
        lfd = _lock(self.path)
        try:
            _unlink_if_same(self.path, self._fd)
        finally:
            os.close(lfd)

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
            if _names(self.path, self._fd):  # else unlinked already: nothing left to remove
                lfd = _lock(self.path)  # no other process is between finding the segment and locking it
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    pass  # another process still maps it
                else:
                    _unlink_if_same(self.path, self._fd)
                finally:
                    os.close(lfd)
        finally:
            os.close(self._fd)
            self._fd = -1


def _names(seg: Path, fd: int) -> bool:
    """Whether ``seg`` still names the file open as ``fd``."""
    try:
        return os.stat(seg).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _lock_path(seg: Path) -> Path:
    return seg.with_suffix(".lock")


def _lock(seg: Path, block: bool = True) -> int:
    """The key's lock file, open and exclusively locked; -1 when ``block`` is False and it is busy.

    A lock taken on a file that another process unlinked meanwhile locks
    nothing: re-open until the locked file is the one the name points to.
    """
    lp = _lock_path(seg)
    while True:
        lfd = os.open(lp, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lfd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(lfd)
            return -1
        try:
            if os.stat(lp).st_ino == os.fstat(lfd).st_ino:
                return lfd
        except FileNotFoundError:
            pass
        os.close(lfd)


def _unlink_if_same(seg: Path, fd: int) -> None:
    """Remove ``seg`` and its lock file if ``seg`` still names the file open as ``fd`` (the key lock held)."""
    if seg.exists() and not _names(seg, fd):
        return  # a newer segment of the key: not ours to remove
    for p in (seg, _lock_path(seg)):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


_TMP = re.compile(r"^(moment-.+\.seg)\.tmp-\d+$")


def sweep_stale(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the segments (and half-built ones) of ``directory`` that no live process holds; the paths removed.

    A finished segment is held by a shared ``flock`` of every process mapping
    it, a segment being built by its key's lock: when neither lock is taken,
    the processes that made it are gone (``kill -9``) and it is garbage.
    """
    d = Path(directory if directory is not None else SHM_DIR)
    removed: list[Path] = []
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return removed
    for name in names:
        m = _TMP.match(name)
        if not (m or (name.startswith("moment-") and name.endswith((".seg", ".lock")))):
            continue
        path = d / name
        seg = d / m.group(1) if m else path.with_suffix(".seg")
        lfd = _lock(seg, block=False)
        if lfd < 0:
            continue  # being built, mapped or removed right now
        try:
            if m or name.endswith(".lock"):  # a dead builder's file, or a lock without its segment
                for p in ([path] if m else []) + ([_lock_path(seg)] if not seg.exists() else []):
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
                        removed.append(p)
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # mapped by a live process
            else:
                _unlink_if_same(path, fd)
                removed.append(path)
            finally:
                os.close(fd)
        finally:
            os.close(lfd)
    return removed


def _header(shape: tuple[int, ...], dtype: torch.dtype) -> bytes:
    meta = json.dumps({"shape": list(shape), "dtype": str(dtype)}).encode()
    return _MAGIC + meta + b"\n"


def shared_host_tensor(key: str, shape: tuple[int, ...], dtype: torch.dtype,
                       fill: Callable[[torch.Tensor], object], *,
                       directory: str | os.PathLike[str] | None = None) -> SharedHostTensor | None:
    """A ``shape``/``dtype`` host tensor named ``key``, filled by ``fill(tensor)`` in the first process only.

    ``key`` (letters, digits, ``_.-``) must change whenever the contents
    would: a live segment with the key is trusted to hold them. Returns None
    when ``directory`` (default :data:`SHM_DIR`) is missing or has no room
    (use private memory then). Stale segments there are swept first
    (:func:`sweep_stale`).
    """
    if not _KEY.match(key):
        raise ValueError(f"shared segment key {key!r}: use letters, digits, '_', '.', '-' (at most 120)")
    d = Path(directory if directory is not None else SHM_DIR)
    if not d.is_dir() or not os.access(d, os.W_OK):
        return None
    sweep_stale(d)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    total = _HEADER + max(nbytes, 1)
    seg = d / f"moment-{key}.seg"
    header = _header(tuple(shape), dtype)
    lfd = _lock(seg)
    fd = -1
    try:
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
