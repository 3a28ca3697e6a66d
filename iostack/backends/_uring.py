"""Linux io_uring through raw system calls and ``ctypes``: no liburing, no compiled code.

Like :mod:`iostack.backends._aio` it keeps ``depth`` reads in flight from one
thread; ``io_uring_enter`` submits and waits, and completions are read from the
mapped completion ring with numpy slices instead of being copied out by a
system call (fio's ``io_uring`` engine takes the same path). Measured on this
project's machines it reads as fast as the AIO engine, both within noise of fio
(``tools/bench_io.py``; docs/benchmarks.md). Reads are ``IORING_OP_READ``
(kernel 5.6+); :func:`available` says why not when the kernel lacks it or
forbids io_uring (``kernel.io_uring_disabled``, seccomp in containers).

Why no maintained binding: the PyPI ``liburing`` package (2026.3.30, a prebuilt wheel)
installs here, but its ``io_uring_prep_read`` takes a ``bytearray`` only (an ``mmap``,
``memoryview`` or numpy array is refused with TypeError, and an SQE's ``addr`` cannot be set),
whose memory is not block-aligned: O_DIRECT reads, this engine's only use, cannot be expressed.
Where it works (buffered reads, each into a ``bytearray`` of a pool, then copied out) it costs
Python calls per entry where this module handles a whole burst in a few numpy operations.
Measured in the same runs, 6 alternating each (``tools/bench_io.py --skip-raw --skip-gather
--binding --runs 6 --seconds 3``, load 4.8-5.8 on 2 cores, 2026-11-25): page cache dropped
(the device's rate) ours 66.4 k, binding 60.6 k reads/s, paired ours/binding 1.10
(0.61..1.21); every read a page-cache hit (engine cost only) ours 424 k, binding 248 k,
1.67 (1.49..1.95). So the binding is no optional fast path here.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import mmap
import os
import platform
from collections.abc import Callable

import numpy as np

from iostack.backends._inflight import Reads
from iostack.backends.base import CompletedPrefix, libc_syscall

_NR_SETUP, _NR_ENTER, _NR_REGISTER = 425, 426, 427  # the same on x86_64 and aarch64
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
_ENTER_GETEVENTS = 1
_OP_READ = 22
_SQE_FIXED_FILE = 1
_SETUP_COOP_TASKRUN = 1 << 8
_REGISTER_FILES, _REGISTER_FILES_UPDATE = 2, 6

SQE = np.dtype([("opcode", "u1"), ("flags", "u1"), ("ioprio", "<u2"), ("fd", "<i4"), ("off", "<u8"),
                ("addr", "<u8"), ("len", "<u4"), ("rw_flags", "<u4"), ("user_data", "<u8"),
                ("buf_index", "<u2"), ("personality", "<u2"), ("splice_fd_in", "<i4"),
                ("addr3", "<u8"), ("pad", "<u8")])
CQE = np.dtype([("user_data", "<u8"), ("res", "<i4"), ("flags", "<u4")])
assert SQE.itemsize == 64 and CQE.itemsize == 16


class _Params(ctypes.Structure):
    _fields_ = [("sq_entries", ctypes.c_uint32), ("cq_entries", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("sq_thread_cpu", ctypes.c_uint32), ("sq_thread_idle", ctypes.c_uint32),
                ("features", ctypes.c_uint32), ("wq_fd", ctypes.c_uint32), ("resv", ctypes.c_uint32 * 3),
                # io_sqring_offsets
                ("sq_head", ctypes.c_uint32), ("sq_tail", ctypes.c_uint32), ("sq_ring_mask", ctypes.c_uint32),
                ("sq_ring_entries", ctypes.c_uint32), ("sq_flags", ctypes.c_uint32),
                ("sq_dropped", ctypes.c_uint32), ("sq_array", ctypes.c_uint32), ("sq_resv1", ctypes.c_uint32),
                ("sq_user_addr", ctypes.c_uint64),
                # io_cqring_offsets
                ("cq_head", ctypes.c_uint32), ("cq_tail", ctypes.c_uint32), ("cq_ring_mask", ctypes.c_uint32),
                ("cq_ring_entries", ctypes.c_uint32), ("cq_overflow", ctypes.c_uint32),
                ("cq_cqes", ctypes.c_uint32), ("cq_flags", ctypes.c_uint32), ("cq_resv1", ctypes.c_uint32),
                ("cq_user_addr", ctypes.c_uint64)]


assert ctypes.sizeof(_Params) == 120


@functools.cache
def available() -> str | None:
    """None when io_uring reads work here, else why not."""
    if platform.machine() not in ("x86_64", "aarch64") or os.name != "posix":
        return f"no io_uring system call numbers for {platform.machine()}"
    try:
        ring = Uring(2)
    except OSError as exc:
        return f"io_uring_setup failed ({exc.strerror or exc})"
    try:
        r, w = os.pipe()
        try:
            os.write(w, b"x" * 8)
            buf = np.zeros(8, np.uint8)
            # a 1-byte pipe read checks that IORING_OP_READ exists (older kernels answer EINVAL)
            ring.run(r, np.array([0]), np.array([8]), np.array([buf.ctypes.data], np.uint64), offset_ignored=True)
        finally:
            os.close(r)
            os.close(w)
    except OSError as exc:
        return f"io_uring reads fail ({exc.strerror or exc})"
    finally:
        ring.close()
    return None


class Uring:
    """One io_uring with ``depth`` submission entries, for reads only.

    ``submit_batch``: most reads per ``io_uring_enter``. The kernel plugs a submission
    of more than two reads and hands it to the device only when the call returns; on
    this machine's virtual disk completions come in bursts, and refilling in small
    batches gets the first reads out sooner. Measured with a prototype of this loop,
    6 runs each paired with fio io_uring: median 0.84x fio with 64 per call, 0.99x with 8.
    ``register_files``: the file goes in the ring's registered-file table (one entry,
    swapped when the descriptor changes), so the kernel skips a file lookup per read.
    """

    def __init__(self, depth: int, *, submit_batch: int = 8, register_files: bool = True) -> None:
        self._sys = libc_syscall()
        self.depth = int(depth)
        self.submit_batch = max(1, min(int(submit_batch), self.depth))
        # COOP_TASKRUN (5.19+): completions are posted when this thread next enters the kernel,
        # which it does at every turn, instead of interrupting it (an IPI) as each one arrives
        for flags in (_SETUP_COOP_TASKRUN, 0):
            p = _Params()
            p.flags = flags
            fd = self._sys(ctypes.c_long(_NR_SETUP), ctypes.c_long(self.depth), ctypes.byref(p))
            if fd >= 0 or ctypes.get_errno() != errno.EINVAL:
                break
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        self.fd = int(fd)
        self.setup_flags = int(p.flags)
        self._maps: list[mmap.mmap] = []
        try:
            sq = mmap.mmap(self.fd, p.sq_array + 4 * p.sq_entries, offset=_OFF_SQ_RING)
            self._maps.append(sq)
            cq = mmap.mmap(self.fd, p.cq_cqes + CQE.itemsize * p.cq_entries, offset=_OFF_CQ_RING)
            self._maps.append(cq)
            sqes = mmap.mmap(self.fd, SQE.itemsize * p.sq_entries, offset=_OFF_SQES)
            self._maps.append(sqes)
        except OSError:
            self.close()
            raise
        self.entries = int(p.sq_entries)
        self._sq32 = np.frombuffer(sq, np.uint32)
        self._cq32 = np.frombuffer(cq, np.uint32)
        self._sq = (p.sq_head // 4, p.sq_tail // 4)
        self._sq_mask = int(self._sq32[p.sq_ring_mask // 4])
        self._cq = (p.cq_head // 4, p.cq_tail // 4)
        self._cq_mask = int(self._cq32[p.cq_ring_mask // 4])
        self.cq_entries = int(p.cq_entries)
        self.cqes = np.frombuffer(cq, CQE, count=p.cq_entries, offset=p.cq_cqes)
        self.sqes = np.frombuffer(sqes, SQE)
        # the indirection array maps ring slot i to SQE i, once and for all
        np.frombuffer(sq, np.uint32, count=p.sq_entries, offset=p.sq_array)[:] = np.arange(p.sq_entries)
        self._prep = np.zeros(0, SQE)
        self._registered: int | None = None  # the descriptor in the registered-file table
        self._register_files = bool(register_files)

    @property
    def buffer_bytes(self) -> int:
        return sum(len(m) for m in self._maps) + self._prep.nbytes

    def _register(self, fd: int) -> bool:
        """Put ``fd`` in the one-entry registered-file table; False if the kernel refuses (then plain fds)."""
        if self._registered == fd:
            return True
        arr = (ctypes.c_int32 * 1)(fd)
        if self._registered is None:
            r = self._sys(ctypes.c_long(_NR_REGISTER), ctypes.c_long(self.fd), ctypes.c_long(_REGISTER_FILES),
                          arr, ctypes.c_long(1))
        else:  # swap the entry: struct io_uring_files_update {u32 offset; u32 resv; u64 fds}
            upd = (ctypes.c_uint64 * 2)(0, ctypes.addressof(arr))
            r = self._sys(ctypes.c_long(_NR_REGISTER), ctypes.c_long(self.fd),
                          ctypes.c_long(_REGISTER_FILES_UPDATE), upd, ctypes.c_long(1))
        if r < 0:
            self._register_files = False
            return False
        self._registered = fd
        return True

    def forget(self, fd: int) -> None:
        """Drop ``fd`` from the registered-file table (call before closing it: the table holds the file open)."""
        if self._registered == fd and self.fd >= 0:
            arr = (ctypes.c_int32 * 1)(-1)
            upd = (ctypes.c_uint64 * 2)(0, ctypes.addressof(arr))
            self._sys(ctypes.c_long(_NR_REGISTER), ctypes.c_long(self.fd), ctypes.c_long(_REGISTER_FILES_UPDATE),
                      upd, ctypes.c_long(1))
            self._registered = -1

    def _prepare(self, fd: int | np.ndarray, reads: Reads) -> np.ndarray:
        """The submission entries of every read of the call, built at once (copied into the ring in slices);
        ``fd`` one file, or one per read (plain file descriptors then: the registered table holds one)."""
        m = len(reads)
        if self._prep.size < m:
            self._prep = np.zeros(max(m, 2 * self._prep.size), SQE)
        pre = self._prep[:m]
        pre["opcode"] = _OP_READ
        if self._register_files and np.ndim(fd) == 0 and fd >= 0 and self._register(int(fd)):
            pre["fd"], pre["flags"] = 0, _SQE_FIXED_FILE
        else:
            pre["fd"], pre["flags"] = fd, 0
        pre["off"] = reads.off
        pre["addr"] = reads.addr
        pre["len"] = reads.left
        pre["user_data"] = np.arange(m, dtype=np.uint64)
        return pre

    def run(self, fd: int | np.ndarray, offsets: np.ndarray, nbytes: np.ndarray, buf_addrs: np.ndarray,
            progress: Callable[[int], None] | None = None, every: int = 512,
            offset_ignored: bool = False) -> None:
        """Read ``nbytes[i]`` at ``offsets[i]`` of ``fd`` (or of ``fd[i]``, one file per read) to address
        ``buf_addrs[i]``, for every ``i``.

        Same contract as :meth:`iostack.backends._aio.AioContext.run`: reads
        are issued in index order with up to ``depth`` in flight,
        ``progress(p)`` is called when reads ``0..p-1`` are complete (every
        ``every`` more, and at the end), short reads are continued, errors and
        reads past the end of the file raise OSError.

        Each turn refills the ring, submits it in back-to-back ``io_uring_enter`` calls of
        ``submit_batch`` entries (the last one waits for a completion), settles the
        completions of the turn before while the device works, and reaps new ones straight
        from the mapped ring: a whole burst with a few numpy slices, no call per entry.
        """
        m = int(np.size(offsets))
        if m == 0:
            if progress is not None:
                progress(0)
            return
        reads = Reads(offsets, nbytes, buf_addrs, offset_ignored)
        pre = self._prepare(fd, reads)
        cap = min(self.depth, self.entries)
        tracker = CompletedPrefix(m, progress, every)
        nxt = inflight = completed = 0  # inflight: written to the ring, not yet reaped
        retry = np.zeros(0, np.intp)
        got: tuple[np.ndarray, np.ndarray] | None = None  # reaped, not yet settled
        tail = int(self._sq32[self._sq[1]])
        while completed < m:
            # 1. refill the ring: continued short reads first (rare), then new reads in order
            k, retry, nxt = self._refill(pre, reads, retry, nxt, tail, cap - inflight)
            if k:
                tail = (tail + k) & 0xFFFFFFFF
                self._sq32[self._sq[1]] = tail  # publish (a system call follows: the kernel sees it)
                inflight += k
            # 2. submit; wait for a completion unless reaped ones are waiting to be settled
            self._submit(tail, 1 if got is None and inflight else 0)
            # 3. settle what the last turn reaped, while the device works on the new reads
            if got is not None:
                done, again = reads.settle(*got)
                got = None
                if again.size:
                    retry = np.concatenate([retry, again])
                completed += done.size
                tracker.completed(done)
            # 4. reap from the mapped completion ring, no system call
            got = self._reap()
            if got is not None:
                inflight -= got[0].size
        tracker.finish()

    def _refill(self, pre: np.ndarray, reads: Reads, retry: np.ndarray, nxt: int, tail: int, room: int
                ) -> tuple[int, np.ndarray, int]:
        """Write up to ``room`` entries into the submission ring at ``tail``: continued reads, else the next new ones.

        Returns how many were written, the continued reads still waiting, the next new read.
        """
        sqes, smask = self.sqes, self._sq_mask
        if room > 0 and retry.size:
            take, retry = retry[:room], retry[room:]
            pre["off"][take], pre["addr"][take], pre["len"][take] = reads.off[take], reads.addr[take], reads.left[take]
            sqes[(tail + np.arange(take.size)) & smask] = pre[take]
            return take.size, retry, nxt
        m = len(reads)
        if room <= 0 or nxt >= m:
            return 0, retry, nxt
        k = min(room, m - nxt)
        s = tail & smask
        a = min(k, self.entries - s)
        sqes[s:s + a] = pre[nxt:nxt + a]
        if a < k:
            sqes[:k - a] = pre[nxt + a:nxt + k]
        return k, retry, nxt + k

    def _submit(self, tail: int, wait: int) -> None:
        """Submit the ring's unsubmitted entries in back-to-back ``io_uring_enter`` calls of ``submit_batch``.

        The last call waits for ``wait`` completions; an interrupted or busy
        call leaves the rest in the ring for the next turn.
        """
        sq32, head_i = self._sq32, self._sq[0]
        sys_, nr_enter, ring_fd = self._sys, ctypes.c_long(_NR_ENTER), ctypes.c_long(self.fd)
        getev, zero = ctypes.c_long(_ENTER_GETEVENTS), ctypes.c_long(0)
        pending = (tail - int(sq32[head_i])) & 0xFFFFFFFF
        while pending or wait:
            n = min(pending, self.submit_batch)
            last = n == pending
            r = sys_(nr_enter, ring_fd, ctypes.c_long(n), ctypes.c_long(wait if last else 0),
                     getev if last else zero, None, ctypes.c_long(0))
            if r < 0:
                e = ctypes.get_errno()
                if e in (errno.EINTR, errno.EAGAIN, errno.EBUSY):
                    return  # the unsubmitted entries stay in the ring for the next turn
                raise OSError(e, f"io_uring_enter: {os.strerror(e)}")
            pending = (tail - int(sq32[head_i])) & 0xFFFFFFFF
            if last:
                return

    def _reap(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The completions in the mapped ring as ``(read index, result)`` arrays (None: none), handed back."""
        cq32, (head_i, tail_i) = self._cq32, self._cq
        h, t = int(cq32[head_i]), int(cq32[tail_i])
        n = (t - h) & 0xFFFFFFFF
        if not n:
            return None
        c_ud, c_res = self.cqes["user_data"], self.cqes["res"]
        s = h & self._cq_mask
        a = min(n, self.cq_entries - s)
        if a == n:
            got = c_ud[s:s + n].astype(np.intp), c_res[s:s + n].astype(np.int64)
        else:
            got = (np.concatenate([c_ud[s:], c_ud[:n - a]]).astype(np.intp),
                   np.concatenate([c_res[s:], c_res[:n - a]]).astype(np.int64))
        cq32[head_i] = t  # the entries are copied: hand them back
        return got

    def close(self) -> None:
        for mp in self._maps:
            with contextlib.suppress(BufferError):  # numpy views still alive: the mapping goes with them
                mp.close()
        self._maps = []
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)  # also drops the registered-file table
            self.fd = -1

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()
