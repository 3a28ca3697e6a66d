"""Linux native AIO (``io_submit``/``io_getevents``) through ``ctypes``: many reads in flight from one thread.

Plain Python threads issuing one ``preadv`` each are limited by per-call
overhead and the GIL to roughly 60% of what the device gives
(``shared/notes/io-baseline.md``). Native AIO with O_DIRECT keeps
``queue_depth`` reads in flight from one thread with two system calls per
batch of completions, and the bookkeeping is vectorised with numpy, so the
Python cost per read is a few array elements (what fio's ``libaio`` engine
does). The queue is refilled right after each reap, before any bookkeeping.
It only runs asynchronously with O_DIRECT; buffered files use the thread
engine. What a completion means (done, short, failed) is
:class:`iostack.backends._inflight.Reads`'s, shared with the io_uring engine. ``ctypes`` drops the GIL during each
system call, so other
threads (a training step, another gather) keep running while it waits.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
from collections.abc import Callable

import numpy as np

from iostack.backends._inflight import Reads
from iostack.backends.base import CompletedPrefix, libc_syscall

#: (io_setup, io_destroy, io_submit, io_getevents) per architecture
_NR = {"x86_64": (206, 207, 209, 208), "aarch64": (0, 1, 2, 4)}

IOCB = np.dtype([("data", "<u8"), ("key", "<u4"), ("rw_flags", "<i4"), ("opcode", "<u2"),
                 ("reqprio", "<i2"), ("fildes", "<u4"), ("buf", "<u8"), ("nbytes", "<u8"),
                 ("offset", "<i8"), ("reserved2", "<u8"), ("flags", "<u4"), ("resfd", "<u4")])
EVENT = np.dtype([("data", "<u8"), ("obj", "<u8"), ("res", "<i8"), ("res2", "<i8")])
assert IOCB.itemsize == 64 and EVENT.itemsize == 32


@functools.cache
def available() -> str | None:
    """None when native AIO can be used here, else why not."""
    if platform.machine() not in _NR or os.name != "posix":
        return f"no native AIO system call numbers for {platform.machine()}"
    try:
        ctx = AioContext(1)
    except OSError as exc:
        return f"io_setup failed ({exc.strerror or exc})"
    ctx.close()
    return None


class AioContext:
    """One kernel AIO context keeping up to ``depth`` reads in flight.

    The control blocks of a whole call are written in one vectorised step
    into a preallocated array; the loop then only passes slices of a
    precomputed pointer array to ``io_submit`` and refills the queue as soon
    as ``io_getevents`` returns any completion (``min_nr=1``), so the queue
    stays at ``depth`` until the last reads are out. Python work per loop turn
    is two system calls and a few numpy operations on the completed events,
    whatever their number.
    """

    def __init__(self, depth: int) -> None:
        self._sys = libc_syscall()
        self._nr = _NR[platform.machine()]
        self.depth = int(depth)
        self._ctx = ctypes.c_ulong(0)
        if self._sys(ctypes.c_long(self._nr[0]), ctypes.c_long(self.depth), ctypes.byref(self._ctx)) < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        self.events = np.zeros(self.depth, EVENT)
        self._cap = 0
        self._grow(max(self.depth, 1024))
        # a one-entry pointer array for resubmitting a short read
        self._one = np.zeros(1, np.uint64)
        #: most reads per ``io_submit``. The kernel plugs a multi-read submission and dispatches
        #: it to the device only when the call returns; completions arrive in bursts of tens on
        #: a virtual disk, so refilling 8 at a time gets the first reads out sooner (measured
        #: here: ours/fio 1.02 and 0.87 with 8 against 0.92 and 0.80 with 64, same runs)
        self.submit_batch = min(self.depth, 8)

    def _grow(self, m: int) -> None:
        """Room for ``m`` control blocks (and their pointers), allocated once and reused."""
        if m <= self._cap:
            return
        cap = max(m, 2 * self._cap)
        self.iocbs = np.zeros(cap, IOCB)
        self.ptrs = np.uint64(self.iocbs.ctypes.data) + np.arange(cap, dtype=np.uint64) * np.uint64(IOCB.itemsize)
        self._cap = cap

    @property
    def buffer_bytes(self) -> int:
        """Host memory of the control blocks, pointers and events, bytes."""
        return self._cap * (IOCB.itemsize + 8) + self.depth * EVENT.itemsize

    def _submit(self, addr: int, k: int) -> int:
        """``io_submit`` of ``k`` pointers at ``addr``; how many the kernel took (0 on EAGAIN)."""
        while True:
            r = self._sys(ctypes.c_long(self._nr[2]), self._ctx, ctypes.c_long(k), ctypes.c_void_p(addr))
            if r >= 0:
                return r
            e = ctypes.get_errno()
            if e == errno.EINTR:
                continue
            if e == errno.EAGAIN:
                return 0
            raise OSError(e, f"io_submit: {os.strerror(e)}")

    def run(self, fd: int | np.ndarray, offsets: np.ndarray, nbytes: np.ndarray, buf_addrs: np.ndarray,
            progress: Callable[[int], None] | None = None, every: int = 512) -> None:
        """Read ``nbytes[i]`` at ``offsets[i]`` of ``fd`` (or of ``fd[i]``, one file per read: the control
        blocks name their file each) to address ``buf_addrs[i]``, for every ``i``.

        Reads are issued in index order. ``progress(p)``, when given, is
        called whenever reads ``0..p-1`` have all completed and ``p`` grew by
        at least ``every`` since the last call (and once with ``p = len``
        at the end): the caller copies finished data out there, while the
        remaining reads are in flight. Short reads are continued from where
        they stopped; an error or a read at the end of the file raises OSError.
        """
        m = int(np.size(offsets))
        if m == 0:
            if progress is not None:
                progress(0)
            return
        self._grow(m)
        cb = self.iocbs[:m]
        cb["data"] = np.arange(m, dtype=np.uint64)
        cb["opcode"] = 0  # IOCB_CMD_PREAD
        cb["fildes"] = fd
        cb["buf"] = buf_addrs
        cb["nbytes"] = nbytes
        cb["offset"] = offsets
        reads = Reads(offsets, nbytes, buf_addrs)
        ptr0 = self.ptrs.ctypes.data
        events = self.events
        ev_addr = events.ctypes.data
        ev_data, ev_res = events["data"].view(np.int64), events["res"]
        sys_, nr_get, ctx, depth = self._sys, ctypes.c_long(self._nr[3]), self._ctx, ctypes.c_long(self.depth)
        one = ctypes.c_long(1)
        sb = self.submit_batch
        tracker = CompletedPrefix(m, progress, every)
        nxt = inflight = 0
        retry: list[int] = []  # short reads to continue
        while nxt < m or inflight or retry:
            while retry and inflight < self.depth:
                i = retry[-1]
                self._one[0] = self.ptrs[i]
                if not self._submit(self._one.ctypes.data, 1):
                    break
                retry.pop()
                inflight += 1
            k = min(self.depth - inflight, m - nxt)
            while k > 0:
                r = self._submit(ptr0 + 8 * nxt, min(k, sb))
                nxt += r
                inflight += r
                k -= r
                if r == 0:
                    break  # EAGAIN: reap first (or try again if nothing is in flight)
            if not inflight:
                continue
            r = sys_(nr_get, ctx, one, depth, ctypes.c_void_p(ev_addr), None)
            if r < 0:
                e = ctypes.get_errno()
                if e == errno.EINTR:
                    continue
                raise OSError(e, f"io_getevents: {os.strerror(e)}")
            inflight -= r
            # refill the queue before any bookkeeping: completions come in bursts (tens at a
            # time on a virtual disk), and every microsecond spent here leaves those slots empty
            k = min(self.depth - inflight, m - nxt)
            if k > 0 and not retry:
                got = self._submit(ptr0 + 8 * nxt, min(k, sb))
                nxt += got
                inflight += got
            done, again = reads.settle(ev_data[:r].copy(), ev_res[:r].copy())
            if again.size:  # continue the short reads from where they stopped
                cb["offset"][again] = reads.off[again].astype(np.int64)
                cb["buf"][again] = reads.addr[again]
                cb["nbytes"][again] = reads.left[again].astype(np.uint64)
                retry.extend(again.tolist())
            tracker.completed(done)
        tracker.finish()

    def close(self) -> None:
        if self._ctx.value:
            self._sys(ctypes.c_long(self._nr[1]), self._ctx)
            self._ctx = ctypes.c_ulong(0)

    def __del__(self) -> None:
        self.close()
