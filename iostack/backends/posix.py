"""The ``posix`` backend: sorted, de-duplicated, coalesced ``os.preadv`` reads from worker processes.

A call to :meth:`PosixBackend.read_rows` turns the rows into the set of
distinct pages (packed rows) or page-aligned row extents that hold them,
sorted by offset; neighbouring extents merge into one read of up to
``max_read_bytes``. The reads go, in rounds that fit the staging buffer, to
``processes`` worker processes with ``threads`` threads each (``processes *
threads`` reads in flight), which read straight into a shared page-aligned
staging buffer; the rows are then copied to ``out`` in the caller's order.
With ``processes=0`` the threads run in the calling process (fewer IOPS: the
GIL; no extra processes).

O_DIRECT needs the offset, length and buffer aligned to the logical block size
(4096 covers every device here): the layout of :mod:`iostack.bins` and the
mmap-allocated staging buffer give that. File systems without O_DIRECT
(tmpfs) get buffered reads; the handle says so in ``direct`` and ``note``.

>>> import numpy as np, tempfile
>>> from iostack.bins import write_bins, open_bin
>>> from iostack.placement import simple_placement
>>> feats = np.arange(40, dtype=np.int64).reshape(10, 4)
>>> p = simple_placement(10, [("ssd", 10)])
>>> with tempfile.TemporaryDirectory() as d, PosixBackend(processes=0, threads=2) as be:
...     h = be.open(write_bins(feats, p, d)[0])
...     out = np.empty((3, 32), np.uint8)
...     _ = be.read_rows(h, np.array([7, 2, 7]), out)
...     out.view(np.int64)[:, 0].tolist()
[28, 8, 28]
"""

from __future__ import annotations

import contextlib
import itertools
import json
import mmap
import os
import selectors
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from iostack.backends import _aio, _engine, _manybins, _uring, choice
from iostack.backends.base import BinHandle, Extents, ReadBackend, sorted_extents
from iostack.backends.base import coalesced_runs as _runs
from iostack.bins import PAGE, BinFile
from iostack.errors import StoreError
from iostack.vocab import ENGINES


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def probe_direct(path: str, nbytes: int = PAGE) -> tuple[bool, str | None]:
    """Whether an O_DIRECT read of ``nbytes`` at offset 0 of ``path`` works, and why not."""
    try:
        fd = _engine.open_for_read(path, True)
    except OSError as exc:
        return False, f"O_DIRECT is not available on this file system ({exc.strerror or exc}): buffered reads"
    try:
        buf = mmap.mmap(-1, max(PAGE, nbytes))
        try:
            os.preadv(fd, [buf], 0)
        finally:
            buf.close()
        return True, None
    except OSError as exc:
        return False, f"O_DIRECT reads fail here ({exc.strerror or exc}): buffered reads"
    finally:
        os.close(fd)


_ASYNC = {"uring": _uring, "aio": _aio}
__all__ = ["PosixBackend", "probe_direct"]


#: reads in flight by default with an asynchronous engine (O_DIRECT): one thread keeps them all, so a
#: deep queue costs only ring entries. Measured here (virtio disk, 4 KiB random reads, ``moment train``
#: out of core, docs/benchmarks.md): 64 in flight left the device idle between completions
ASYNC_QUEUE_DEPTH = 256
#: ... with the thread engine (buffered files): one thread per read in flight
THREAD_QUEUE_DEPTH = 64
#: set to ``1`` to read a gather's SSD bins one after another (as before concurrent bin reads): the
#: side-by-side measurement of tools/bench_emulated_ssds.py sets it in one of its two ``moment train`` runs
SEQUENTIAL_BINS_ENV = "MOMENT_SEQUENTIAL_BINS"


class _CopyOut:
    """Copies rows from staging slots to their places in ``out``, in slot order, as the slots fill."""

    def __init__(self, out: np.ndarray, pos: np.ndarray, slot: np.ndarray, stg: np.ndarray, info: BinFile,
                 within: np.ndarray | None) -> None:
        self.out, self.pos, self.slot, self.within = out, pos, slot, within
        self.rb = info.row_bytes
        if within is None:
            self.src = stg
        else:  # packed rows: (slot, row within the page, bytes)
            k = info.rows_per_page
            self.src = stg[:, :k * info.row_bytes].reshape(stg.shape[0], k, info.row_bytes)
        self.copied = 0

    def __call__(self, slot_end: int) -> None:
        """Copy the rows whose staging slot is below ``slot_end`` (the slots before it are complete)."""
        a, e = self.copied, int(np.searchsorted(self.slot, slot_end))
        if e > a:
            if self.within is None:
                self.out[self.pos[a:e]] = self.src[self.slot[a:e], :self.rb]
            else:
                self.out[self.pos[a:e]] = self.src[self.slot[a:e], self.within[a:e]]
            self.copied = e


class PosixBackend(ReadBackend):
    """``os.preadv`` from ``processes`` × ``threads`` readers, or an asynchronous engine (``queue_depth`` in flight).

    ``queue_depth``: reads in flight (default :data:`ASYNC_QUEUE_DEPTH` for the
    asynchronous engines, :data:`THREAD_QUEUE_DEPTH` threads for the thread engine;
    with ``threads`` given and no depth, ``processes * threads`` for both).

    ``direct``: ``"auto"`` (O_DIRECT where the file system allows it), True
    (required: :class:`StoreError` otherwise) or False. ``staging_bytes`` bounds
    the host memory of one round of reads; ``max_read_bytes`` bounds a
    coalesced read.

    ``concurrent_bins``: :meth:`read_rows_many` keeps every O_DIRECT bin's reads
    in flight together (one engine call, :mod:`iostack.backends._manybins`);
    False reads the bins one after another. None: True unless the environment
    sets :data:`SEQUENTIAL_BINS_ENV` to ``1``.
    """

    name = "posix"

    def __init__(self, *, queue_depth: int | None = None, processes: int | None = None,
                 threads: int | None = None, direct: bool | str = "auto",
                 staging_bytes: int = 32 << 20, max_read_bytes: int = 128 << 10,
                 engine: str = "auto", concurrent_bins: bool | None = None) -> None:
        if engine not in ENGINES:
            raise StoreError(f"posix backend: engine {engine!r} is not one of {', '.join(ENGINES)}")
        self.processes = _cpus() if processes is None else int(processes)
        n = max(1, self.processes)
        thread_depth = THREAD_QUEUE_DEPTH if queue_depth is None else int(queue_depth)
        self.threads = int(threads) if threads is not None else max(1, -(-thread_depth // n))
        # threads given without a depth (hwprofile's measurement): that many reads in flight either way
        self.async_depth = (max(1, int(queue_depth)) if queue_depth is not None
                            else n * self.threads if threads is not None else ASYNC_QUEUE_DEPTH)
        self.direct_mode = direct
        self.concurrent_bins = (os.environ.get(SEQUENTIAL_BINS_ENV) != "1" if concurrent_bins is None
                                else bool(concurrent_bins))
        self.direct = direct is not False
        self.max_read_bytes = max(PAGE, int(max_read_bytes) // PAGE * PAGE)
        self.staging_bytes = max(self.max_read_bytes, int(staging_bytes) // PAGE * PAGE)
        #: AIO engine: copy finished rows out after this many more reads completed (in order)
        self.copy_every = 512
        self._lock = threading.Lock()
        self._fids = itertools.count()
        self._procs: list[subprocess.Popen[str]] = []
        self._local_fds: dict[int, int] = {}
        self._closed = False
        # shared buffers: memfds, so that worker processes map the same pages
        self._ctl_len = max(1, self.staging_bytes // PAGE) * 3  # int64 triples: at most one read per page
        self._ctl_fd = os.memfd_create("moment-ctl", 0)
        self._stg_fd = os.memfd_create("moment-staging", 0)
        os.ftruncate(self._ctl_fd, self._ctl_len * 8)
        os.ftruncate(self._stg_fd, self.staging_bytes)
        self._ctl_map = mmap.mmap(self._ctl_fd, self._ctl_len * 8)
        self._stg_map = mmap.mmap(self._stg_fd, self.staging_bytes)
        self._ctl = np.frombuffer(self._ctl_map, np.int64)
        self._stg = np.frombuffer(self._stg_map, np.uint8)
        self._reader: _engine.ThreadReader | None = None
        self._aio: _aio.AioContext | _uring.Uring | None = None
        self._aio_fds: dict[int, int] = {}
        # the asynchronous engine for O_DIRECT files (one serves every bin): named, or for "auto"
        # the one measured fastest on the first bin's device, else the first of DEFAULT_ORDER that works
        self.engine = engine
        self._async: str | None = None
        if engine in _ASYNC:
            why = _ASYNC[engine].available()
            if why is not None:
                raise StoreError(f"posix backend: engine {engine} is not available here: {why}")
            self._async = engine
        self._aio_ok = engine != "threads"
        if self.processes == 0:
            self._ctl_mv = memoryview(self._ctl_map).cast("q")
            self._stg_mv = memoryview(self._stg_map)
            self._reader = _engine.ThreadReader(self.threads)

    @property
    def queue_depth(self) -> int:
        """Reads in flight: the asynchronous engine's depth once a bin uses one, else the reader threads."""
        return self.async_depth if self._aio is not None else max(1, self.processes) * self.threads

    def engine_of(self, handle: BinHandle) -> str:
        """``"uring"`` (io_uring) or ``"aio"`` (native AIO) for O_DIRECT files, else ``"threads"`` (preadv)."""
        return (self._async or "?") if handle.fid in self._aio_fds else "threads"

    def _pick_async(self, path: str) -> str | None:
        """For ``auto``: the engine recorded for ``path``'s device if it works here, else the first that works."""
        recorded = choice.recorded_engine(path)
        for name in ((recorded,) if recorded else ()) + choice.DEFAULT_ORDER:
            if _ASYNC[name].available() is None:
                return name
        return None

    # -- workers -----------------------------------------------------------
    def _start_workers(self) -> None:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the workers import this very package
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cfg = {"ctl_fd": self._ctl_fd, "ctl_bytes": self._ctl_len * 8, "staging_fd": self._stg_fd,
               "staging_bytes": self.staging_bytes, "threads": self.threads}
        try:
            for _ in range(self.processes):
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-m", "iostack.backends._engine", json.dumps(cfg)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    env=env, pass_fds=(self._ctl_fd, self._stg_fd)))
        except OSError as exc:
            self.close()
            raise StoreError(f"posix backend: cannot start reader processes: {exc.strerror or exc}") from None

    def _ask(self, msgs: list[dict]) -> list[dict]:
        """Send one message to each worker (``msgs[i]`` to worker ``i``; None skips) and collect the answers."""
        sent = []
        for p, m in zip(self._procs, msgs, strict=True):
            if m is None:
                continue
            assert p.stdin is not None
            try:
                p.stdin.write(json.dumps(m) + "\n")
                p.stdin.flush()
            except OSError:
                raise StoreError(f"posix backend: a reader process exited ({self._stderr(p)})") from None
            sent.append(p)
        answers = []
        for p in sent:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                raise StoreError(f"posix backend: a reader process exited ({self._stderr(p)})")
            answers.append(json.loads(line))
        return answers

    @staticmethod
    def _stderr(p: subprocess.Popen[str]) -> str:
        with contextlib.suppress(Exception):
            p.wait(timeout=2)
            sel = selectors.DefaultSelector()
            if p.stderr is not None:
                sel.register(p.stderr, selectors.EVENT_READ)
                if sel.select(0):
                    tail = p.stderr.read().strip().splitlines()[-1:]
                    return f"status {p.returncode}" + (f": {tail[0]}" if tail else "")
        return f"status {p.returncode}"

    # -- interface ---------------------------------------------------------
    def open(self, info: BinFile) -> BinHandle:
        path = info.path
        if not os.path.exists(path):
            raise StoreError(f"{path}: bin {info.bin_id} is missing")
        if self.direct_mode is False:
            direct, note = False, "buffered reads (asked for)"
        else:
            direct, note = probe_direct(path) if info.file_bytes else (False, "empty bin")
            if self.direct_mode is True and not direct:
                raise StoreError(f"{path}: {note}; pass direct='auto' to allow buffered reads")
        with self._lock:
            fid = next(self._fids)
            if direct and self._aio_ok and self._async is None:
                self._async = self._pick_async(path)
                self._aio_ok = self._async is not None
            if direct and self._aio_ok:
                # the engines are asynchronous only with O_DIRECT; one ring / context serves every bin
                if self._aio is None:
                    self._aio = (_uring.Uring(self.async_depth) if self._async == "uring"
                                 else _aio.AioContext(self.async_depth))
                try:
                    self._aio_fds[fid] = _engine.open_for_read(path, True)
                except OSError as exc:
                    raise StoreError(f"{path}: cannot open bin {info.bin_id}: {exc.strerror or exc}") from None
            elif self._reader is not None:
                try:
                    self._local_fds[fid] = _engine.open_for_read(path, direct)
                except OSError as exc:
                    raise StoreError(f"{path}: cannot open bin {info.bin_id}: {exc.strerror or exc}") from None
            else:
                if not self._procs:
                    self._start_workers()
                for a in self._ask([{"op": "open", "fid": fid, "path": path, "direct": direct}] * len(self._procs)):
                    if not a.get("ok"):
                        raise StoreError(f"{path}: bin {info.bin_id}: {a.get('error')}")
        return BinHandle(info=info, fid=fid, direct=direct, note=note)

    def close_handle(self, handle: BinHandle) -> None:
        with self._lock:
            if handle.fid in self._aio_fds:
                fd = self._aio_fds.pop(handle.fid)
                if isinstance(self._aio, _uring.Uring):
                    self._aio.forget(fd)  # the ring's file table would keep the file open
                os.close(fd)
            elif self._reader is not None:
                fd = self._local_fds.pop(handle.fid, None)
                if fd is not None:
                    os.close(fd)
            elif not self._closed:
                for p in self._procs:
                    with contextlib.suppress(OSError):
                        assert p.stdin is not None
                        p.stdin.write(json.dumps({"op": "close", "fid": handle.fid}) + "\n")
                        p.stdin.flush()

    @property
    def buffer_bytes(self) -> int:
        return self.staging_bytes + self._ctl_len * 8

    def _read(self, handle: BinHandle, rows: np.ndarray, out: np.ndarray, positions: np.ndarray | None) -> int:
        """Row ``rows[i]`` to ``out[i]`` (``positions`` None) or to ``out[positions[i]]``."""
        info = handle.info  # rows and positions were validated by ReadBackend.read_rows
        packed = info.rows_per_page > 1
        ext = PAGE if packed else info.row_stride_bytes  # bytes of one extent: a page or a whole row
        key = rows // info.rows_per_page if packed else rows  # extent index in the file
        ex = sorted_extents(key)  # sorted, de-duplicated
        uniq, order, sinv = ex.uniq, ex.order, ex.sinv  # sinv: extent index of each row, in extent order
        fd = self._aio_fds.get(handle.fid)
        if (fd is not None and not packed and info.row_bytes == ext and out.flags.c_contiguous
                and out.ctypes.data % PAGE == 0):
            return self._read_into(handle, fd, ex, out, positions)
        per_round = max(1, self.staging_bytes // ext)
        requests = 0
        with self._lock:
            if self._closed:
                raise StoreError("posix backend: used after close()")
            for a in range(0, uniq.size, per_round):
                u = uniq[a:a + per_round]
                # rows whose extent is in this round, in extent order, and their staging slots
                lo, hi = np.searchsorted(sinv, [a, a + u.size])
                pos, slot = order[lo:hi], sinv[lo:hi] - a
                stg = self._stg[:u.size * ext].reshape(u.size, ext)
                copy_out = _CopyOut(
                    out,
                    pos if positions is None else positions[pos],
                    slot,
                    stg,
                    info,
                    rows[pos] % info.rows_per_page if packed else None,
                )
                requests += self._read_round(handle, u, ext, copy_out)
                copy_out(u.size)
        return requests

    def read_rows_many(self, items, *, transfer=None) -> list[int]:
        """:meth:`~iostack.backends.base.ReadBackend.read_rows_many`: the O_DIRECT items' reads all in flight
        together in one call of the asynchronous engine (with ``concurrent_bins``); others one by one.

        Raises
        ------
        StoreError
            When a read fails or the backend is closed (nothing is then known about ``out``).
        """
        items = list(items)
        counts = [0] * len(items)
        together: list[tuple[int, _manybins.Item]] = []
        for i, (h, rows, out, positions) in enumerate(items):
            checked = self._checked(h, rows, out, positions, transfer)
            if checked is None:
                continue
            r, view, dev, pos = checked
            fd = self._aio_fds.get(h.fid)
            if self.concurrent_bins and dev is None and fd is not None:
                together.append((i, _manybins.plan_item(h, fd, r, view, pos)))
            else:
                counts[i] = self.read_rows(h, rows, out, positions, transfer=transfer)
        if len(together) == 1:
            i, it = together[0]
            counts[i] = self._read(it.handle, it.rows, it.out, it.positions)
        elif together:
            with self._lock:
                if self._closed:
                    raise StoreError("posix backend: used after close()")
                try:
                    done = _manybins.read_many([it for _, it in together], self._aio, self._stg, self.max_read_bytes)
                except OSError as exc:
                    paths = ", ".join(it.handle.info.path for _, it in together)
                    raise StoreError(f"reading {paths}: {exc.strerror or exc}") from None
            for i, it in together:
                counts[i] = it.requests if done else self._read(it.handle, it.rows, it.out, it.positions)
        return counts

    def _read_into(self, handle: BinHandle, fd: int, ex: Extents, out: np.ndarray,
                   positions: np.ndarray | None) -> int:
        """Whole, page-sized rows with a page-aligned ``out``: O_DIRECT reads land in ``out`` itself.

        No staging buffer and no copy: each distinct row is read to the first
        position that asks for it (reads coalesce where both the file rows
        and those positions are consecutive), then duplicates are copied.
        """
        ext = out.shape[1]
        uniq = ex.uniq
        first = ex.order[ex.first]  # the first request of each distinct row
        if positions is not None:
            first = positions[first]  # ... and the out row it goes to
        brk = np.flatnonzero((np.diff(uniq) != 1) | (np.diff(first) != 1)) + 1
        starts, lens = _runs(brk, uniq.size, max(1, self.max_read_bytes // ext))
        with self._lock:
            if self._closed:
                raise StoreError("posix backend: used after close()")
            assert self._aio is not None
            try:
                self._aio.run(fd, uniq[starts] * ext, lens * ext,
                              np.uint64(out.ctypes.data) + (first[starts] * ext).astype(np.uint64))
            except OSError as exc:
                raise StoreError(f"{handle.info.path}: {exc.strerror or exc}") from None
        if uniq.size < ex.order.size:  # duplicates: copy from the row that was read
            dup = np.ones(ex.order.size, np.bool_)
            dup[ex.first] = False  # positions in extent order
            d = ex.order[dup]
            out[d if positions is None else positions[d]] = out[first[ex.sinv[dup]]]
        return int(starts.size)

    def _read_round(self, handle: BinHandle, u: np.ndarray, ext: int,
                    copy_out: Callable[[int], None] | None = None) -> int:
        """Read extents ``u`` (sorted extent indices) to staging slots ``0..len(u)-1``; returns reads issued.

        ``copy_out(s)`` is called while later reads are still in flight, once
        slots ``0..s-1`` hold their data (AIO engine only), so the copy to the
        caller's buffer overlaps the device's work.
        """
        # coalesce: a new read starts where the extents stop being contiguous or the read is full
        starts, lens = _runs(np.flatnonzero(np.diff(u) != 1) + 1, u.size, max(1, self.max_read_bytes // ext))
        m = starts.size
        fd = self._aio_fds.get(handle.fid)
        if fd is not None:
            assert self._aio is not None
            slot_ends = np.append(starts[1:], u.size)
            progress = None if copy_out is None else (lambda p: copy_out(int(slot_ends[p - 1])) if p else None)
            try:
                self._aio.run(fd, u[starts] * ext, lens * ext, np.uint64(self._stg.ctypes.data)
                              + (starts * ext).astype(np.uint64), progress=progress, every=self.copy_every)
            except OSError as exc:
                raise StoreError(f"{handle.info.path}: {exc.strerror or exc}") from None
            return m
        ctl = self._ctl[:3 * m].reshape(m, 3)
        ctl[:, 0] = u[starts] * ext
        ctl[:, 1] = lens * ext
        ctl[:, 2] = starts * ext
        if self._reader is not None:
            err = self._reader.run(self._local_fds[handle.fid], self._ctl_mv, self._stg_mv, 0, m)
            if err:
                raise StoreError(f"{handle.info.path}: {err}")
            return m
        k = len(self._procs)
        bounds = [m * i // k for i in range(k + 1)]
        msgs = [{"op": "read", "fid": handle.fid, "start": bounds[i], "end": bounds[i + 1]}
                if bounds[i + 1] > bounds[i] else None for i in range(k)]
        for a in self._ask(msgs):
            if not a.get("ok"):
                raise StoreError(f"{handle.info.path}: {a.get('error')}")
        return m

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._reader is not None:
            self._reader.close()
            self._ctl_mv.release()
            self._stg_mv.release()
        for fd in [*self._local_fds.values(), *self._aio_fds.values()]:
            os.close(fd)
        self._local_fds.clear()
        self._aio_fds.clear()
        if self._aio is not None:
            self._aio.close()
        for p in self._procs:
            with contextlib.suppress(OSError):
                if p.stdin is not None:
                    p.stdin.close()
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for f in (p.stdout, p.stderr):
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()
        self._procs.clear()
        del self._ctl, self._stg
        with contextlib.suppress(BufferError):
            self._ctl_map.close()
            self._stg_map.close()
        for fd in (self._ctl_fd, self._stg_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
