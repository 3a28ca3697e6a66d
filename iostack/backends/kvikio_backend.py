"""The ``kvikio`` backend: KvikIO ``CuFile.pread`` straight into device memory, coalesced and concurrent.

A read of rows becomes the sorted, de-duplicated extents that hold them (a
4 KiB page of packed rows, or one page-aligned row); neighbouring extents
merge into reads of up to ``max_read_bytes``. Every read of a round is issued
at once (``CuFile.pread`` returns an ``IOFuture``) into a staging buffer *on the
device of* ``out``, then the futures are waited on and one gather on that
device puts each row where it goes: the rows cross PCIe once, from the SSD
(GPUDirect Storage) or from KvikIO's bounce buffer (compatibility mode) into
device memory, and never come back to the host.

KvikIO's defaults would serialise this: its thread pool has 1 thread
(``KVIKIO_NTHREADS``), and a device read below ``gds_threshold`` (16 KiB)
bypasses the pool and runs synchronously in the caller. The backend therefore
sets, process-wide (KvikIO's settings are global), ``num_threads`` to at least
``threads``, ``gds_threshold`` to at most one page and ``task_size`` to at
least ``max_read_bytes`` (one task per read); ``configure=False`` leaves them.

Two more settings follow from that plan (issue 34):

* **Bounce buffers.** In compatibility mode KvikIO stages every device read
  through a pinned bounce buffer per in-flight task, ``bounce_buffer_size``
  each (16 MiB by default): with the pool at ``threads`` (64) that is 1 GiB of
  page-locked memory per rank. A task never exceeds ``max_read_bytes`` here, so
  the backend lowers ``bounce_buffer_size`` to it (64 MiB at the defaults) and
  reports the bound in :attr:`KvikioBackend.buffer_bytes`.
* **The default stream.** KvikIO's ``pread`` into device memory synchronises
  the CUDA default stream before its cuFile reads (``sync_default_stream``,
  not exposed to Python), and its compatibility mode copies on streams it
  creates blocking (``CU_STREAM_DEFAULT``, ``detail/stream.cpp``), which
  serialise with the legacy default stream the training compute runs on. So:
  with GDS the backend reads with ``raw_read_async`` on a non-blocking stream
  of its own (``cuFileReadAsync``, nothing waits for the default stream) and
  waits on that stream alone; in compatibility mode it does not read into
  device memory at all (``device_reads`` is False on the instance): KvikIO
  reads into the store's pinned staging on its threads (no CUDA stream) and the
  store copies up on its own copy stream, as with ``posix``. What this buys is
  measured on a GPU by ``tools/bench_gpu.py`` (gathers per second with the
  default stream idle and busy).

KvikIO versions differ (checked against its sources, rapidsai/kvikio):
up to 24.10 ``kvikio.defaults.compat_mode()`` returns a bool and settings
change through ``*_reset(value)``; 24.12 returns a ``kvikio.CompatMode`` enum
(``OFF``, ``ON``, ``AUTO``; ``AUTO`` is the default and means "cuFile if it
is available, else POSIX"); 25.04 adds ``kvikio.defaults.get/set`` and
``is_compat_mode_preferred()`` (what ``AUTO`` resolves to); 26.02 removes the
old getters. :func:`kvikio_option`, :func:`set_kvikio_option` and
:func:`gds_status` speak to all of them.

KvikIO loads libcuda even for host buffers, so a CUDA ``device`` needs
``torch.cuda.is_available()``; without it constructing this backend raises
:class:`StoreError` naming the missing CUDA. ``device="cpu"`` reads into host
memory through the same code (KvikIO supports host buffers), which is how the
tests drive it with a fake ``kvikio`` module. Not run against a real KvikIO in
this project (no GPU).
"""

from __future__ import annotations

import logging
import os
import threading
from types import ModuleType
from typing import Any

import numpy as np
import torch

from iostack.backends.base import BinHandle, ReadBackend, coalesced_runs, sorted_extents
from iostack.bins import PAGE, BinFile
from iostack.errors import StoreError

_log = logging.getLogger(__name__)

#: old (<= 25.02) getter names of the settings ``kvikio.defaults.get`` knows by the first name
_OLD_GETTERS = {"num_threads": ("num_threads", "get_num_threads"), "compat_mode": ("compat_mode",),
                "task_size": ("task_size",), "gds_threshold": ("gds_threshold",)}


# Any: KvikIO has no stubs (CuFile handles, options, transfer hooks)
def kvikio_option(kvikio: ModuleType, name: str) -> Any:
    """KvikIO's setting ``name`` (``num_threads``, ``task_size``, ``gds_threshold``, ``compat_mode``), any version."""
    d = kvikio.defaults
    if hasattr(d, "get"):
        return d.get(name)
    for getter in _OLD_GETTERS.get(name, (name,)):
        fn = getattr(d, getter, None)
        if callable(fn):
            return fn()
    raise StoreError(f"this KvikIO ({getattr(kvikio, '__version__', '?')}) has no setting {name!r}")


# Any: KvikIO has no stubs (CuFile handles, options, transfer hooks)
def set_kvikio_option(kvikio: ModuleType, name: str, value: Any) -> None:
    """Set KvikIO's ``name`` process-wide: ``defaults.set`` (>= 25.04) or ``defaults.<name>_reset`` (older)."""
    d = kvikio.defaults
    if hasattr(d, "set"):
        d.set(name, value)  # sets on construction; the returned context manager only matters in a `with`
        return
    # before 25.04, set_<name>() is a context manager that changes nothing outside a `with`
    reset = getattr(d, f"{name}_reset", None)
    if not callable(reset):
        raise StoreError(f"this KvikIO ({getattr(kvikio, '__version__', '?')}) cannot set {name!r}")
    reset(value)


def gds_status(kvikio: ModuleType) -> tuple[bool, str | None]:
    """Whether KvikIO reads through cuFile (GPUDirect Storage) rather than POSIX, and why not.

    ``is_compat_mode_preferred()`` (>= 25.04) resolves ``AUTO``; older
    versions report the mode itself (a bool up to 24.10, a ``CompatMode``
    enum in 24.12, where ``AUTO`` cannot be resolved from Python and is
    reported as not known). Even with cuFile, the GDS driver decides on its
    own whether a file's reads go direct (``gdscheck -p`` tells).
    """
    d = kvikio.defaults
    preferred = getattr(d, "is_compat_mode_preferred", None)
    if callable(preferred):
        if preferred():
            return False, "KvikIO compatibility mode (POSIX reads through a bounce buffer, no GPUDirect Storage)"
        return True, None
    mode = kvikio_option(kvikio, "compat_mode")
    if isinstance(mode, bool):
        on = mode
    else:
        name = str(getattr(mode, "name", mode)).rsplit(".", 1)[-1].upper()
        if name == "AUTO":
            return False, "KvikIO compat mode AUTO: whether cuFile (GPUDirect Storage) is used is not known here"
        on = name != "OFF"
    if on:
        return False, "KvikIO compatibility mode (POSIX reads through a bounce buffer, no GPUDirect Storage)"
    return True, None


def o_direct_opens(path: str) -> bool:
    """Whether ``path`` opens with O_DIRECT (what cuFile needs to register a file for GPUDirect Storage)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        return False
    os.close(fd)
    return hasattr(os, "O_DIRECT")


def _import_kvikio() -> ModuleType:
    try:
        import kvikio  # lazily: it loads libcuda
    except ImportError:
        raise StoreError("the kvikio backend needs KvikIO: pip install kvikio-cu12 (or use backend='posix')") from None
    return kvikio


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` with an explicit index: ``cuda`` alone is the calling thread's current device, now.

    Storing ``cuda`` unresolved would make every later allocation land on
    whatever device the allocating thread has current (a prefetch thread:
    device 0).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise StoreError("the kvikio backend needs CUDA for device reads, and torch.cuda.is_available() is "
                             "False here (no NVIDIA GPU or driver): use backend='posix' or 'auto'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise StoreError(f"the kvikio backend: device {dev} is not visible "
                             f"({torch.cuda.device_count()} CUDA device(s))")
    elif dev.type != "cpu":
        raise StoreError(f"the kvikio backend reads into cuda or cpu memory, not {dev}")
    return dev


#: what a bin read through cuFile is told (the store's notes)
_CUFILE_NOTE = "KvikIO through cuFile (GPUDirect Storage where the driver allows it: `gdscheck -p` tells)"


class _StreamRead:
    """A ``raw_read_async`` future with ``get()``: waits on its own stream and returns the bytes read."""

    # Any: KvikIO has no stubs (CuFile handles, options, transfer hooks)
    def __init__(self, fut: Any) -> None:
        self.fut = fut  # kept alive until done: KvikIO writes the byte count into it

    def get(self) -> int:
        return int(self.fut.check_bytes_done())


class KvikioBackend(ReadBackend):
    """``CuFile.pread`` of coalesced extents, all of a round in flight, into a staging buffer on ``out``'s device.

    ``device``: where :meth:`open`'s default reads go and the device checked
    at construction (``cuda`` alone is resolved to the current device now).
    ``threads``: KvikIO thread-pool size to ensure (default ``queue_depth``).
    ``max_read_bytes``: bound of a coalesced read. ``staging_bytes``: bound of
    one round's staging buffer (per thread and device).
    """

    name = "kvikio"
    device_reads = True

    def __init__(self, *, device: str | torch.device = "cuda", threads: int | None = None, queue_depth: int = 64,
                 max_read_bytes: int = 1 << 20, staging_bytes: int = 64 << 20, configure: bool = True,
                 # Any: KvikIO has no stubs (CuFile handles, options, transfer hooks)
                 **_ignored: Any) -> None:
        self.device = resolve_device(device)
        self._kvikio = _import_kvikio()
        self.threads = max(1, int(threads if threads is not None else queue_depth))
        self.max_read_bytes = max(PAGE, int(max_read_bytes) // PAGE * PAGE)
        self.staging_bytes = max(self.max_read_bytes, int(staging_bytes) // PAGE * PAGE)
        if configure:
            k = self._kvikio
            if int(kvikio_option(k, "num_threads")) < self.threads:
                set_kvikio_option(k, "num_threads", self.threads)
            if int(kvikio_option(k, "gds_threshold")) > PAGE:
                set_kvikio_option(k, "gds_threshold", PAGE)
            if int(kvikio_option(k, "task_size")) < self.max_read_bytes:
                set_kvikio_option(k, "task_size", self.max_read_bytes)
        self.gds, self.gds_note = gds_status(self._kvikio)
        self.direct = self.gds
        # compatibility mode: KvikIO's device reads would copy on blocking streams through bounce
        # buffers; reading into the store's pinned staging instead keeps its own copy stream
        self.device_reads = self.gds
        self.bounce_bytes: int | None = None
        if configure:
            self.bounce_bytes = self._size_bounce_buffers()
        self._async_ok = True
        self._streams: dict[int, torch.cuda.Stream] = {}
        # Any: KvikIO has no stubs (CuFile handles, options, transfer hooks)
        self._files: dict[int, Any] = {}
        self._direct: dict[int, bool] = {}  # per file: does cuFile read it (GDS)?
        self._lock = threading.Lock()
        self._local = threading.local()
        self._next = 0

    def _size_bounce_buffers(self) -> int | None:
        """Lower KvikIO's ``bounce_buffer_size`` to the largest read a task makes; the bytes it may pin, or None."""
        k = self._kvikio
        try:
            size = int(kvikio_option(k, "bounce_buffer_size"))
            if size > self.max_read_bytes:
                set_kvikio_option(k, "bounce_buffer_size", self.max_read_bytes)
                size = self.max_read_bytes
        except Exception as exc:  # noqa: BLE001 - KvikIO raises assorted errors; the default stays, said
            _log.warning("KvikIO bounce buffers not sized (%s): up to %d threads x its default size may be pinned",
                         exc, self.threads)
            return None
        return size * max(self.threads, int(kvikio_option(k, "num_threads")))

    @property
    def buffer_bytes(self) -> int:
        """Page-locked bytes KvikIO may hold in bounce buffers for this backend's reads (0 when not known)."""
        return self.bounce_bytes or 0

    # Any: KvikIO has no stubs (CuFile handles, options, transfer hooks)
    def _issue(self, f: Any, view: Any, nbytes: int, offset: int, stream: int | None) -> Any:
        """Start one read of ``nbytes`` at ``offset`` into ``view``; the returned object's ``get()`` waits for it.

        ``stream`` (a raw CUDA stream handle, with GDS): ``raw_read_async`` on it, whose wait
        synchronises that stream only; KvikIO's ``pread`` would first synchronise the default
        stream (the training compute). Where the async API refuses (a cuFile without stream
        support), the backend falls back to ``pread`` for good, logged.
        """
        if stream is not None and self._async_ok:
            try:
                return _StreamRead(f.raw_read_async(view, stream, nbytes, offset))
            except (RuntimeError, AttributeError) as exc:
                self._async_ok = False
                _log.warning("KvikIO raw_read_async refused (%s): reads go through pread, which first "
                             "synchronises the default stream", exc)
        return f.pread(view, nbytes, offset)

    def _read_stream(self, dev: torch.device) -> int | None:
        """The raw handle of this backend's non-blocking read stream on ``dev`` (GDS on a GPU only)."""
        if dev.type != "cuda" or not self.gds or not self._async_ok:
            return None
        stream = self._streams.get(dev.index or 0)
        if stream is None:
            # torch's pool streams are created cudaStreamNonBlocking: no implicit wait on the default stream
            stream = self._streams[dev.index or 0] = torch.cuda.Stream(dev)
        return int(stream.cuda_stream)

    def open(self, info: BinFile) -> BinHandle:
        """Open ``info``'s file; whether its reads go through cuFile is decided for this file.

        KvikIO's compatibility setting is process-wide, but cuFile registers each file on
        its own (an O_DIRECT descriptor; in ``AUTO`` a file cuFile refuses, e.g. on tmpfs or
        overlayfs, falls back to POSIX reads alone). So a file O_DIRECT cannot open is
        reported (and read) as not direct even when the process has GDS.

        Raises
        ------
        StoreError
            KvikIO cannot open the file.
        """
        try:
            f = self._kvikio.CuFile(info.path, "r")
        except (OSError, RuntimeError) as exc:
            raise StoreError(f"{info.path}: KvikIO cannot open bin {info.bin_id}: {exc}") from None
        direct, note = self.gds, self.gds_note or _CUFILE_NOTE
        if direct and not o_direct_opens(info.path):
            direct, note = False, ("KvikIO through POSIX for this file: its file system refuses O_DIRECT, so cuFile "
                                   "cannot register it (no GPUDirect Storage)")
        with self._lock:
            fid = self._next
            self._next += 1
            self._files[fid] = f
            self._direct[fid] = direct
        return BinHandle(info=info, fid=fid, direct=direct, note=note)

    def _read(self, handle: BinHandle, rows: np.ndarray, out: np.ndarray, positions: np.ndarray | None) -> int:
        return self._read_into(handle, rows, torch.from_numpy(out), positions, None, None)

    def _read_device(self, handle: BinHandle, rows: np.ndarray, out: torch.Tensor, positions: np.ndarray | None,
                     # Any: KvikIO has no stubs (CuFile handles, options, transfer hooks)
                     transfer: Any) -> int:
        from iostack.transfer import CudaMemory

        mem = transfer.memory if transfer is not None else CudaMemory(out.device)
        with mem.stream_context(mem.current_stream()):  # the device current, the stream as it is
            return self._read_into(handle, rows, out, positions, transfer, mem)

    def _host_staging(self, nbytes: int) -> torch.Tensor:
        """This thread's host staging buffer (the reads of a round are waited for before the next one)."""
        buf = getattr(self._local, "host_buf", None)
        if buf is None or buf.numel() < nbytes:
            buf = self._local.host_buf = torch.empty(max(int(nbytes), PAGE), dtype=torch.uint8)
        return buf

    # Any: a DeviceMemory (iostack.transfer sits above the backends)
    def _staging(self, nbytes: int, device: torch.device, mem: Any) -> tuple[torch.Tensor, dict]:
        """This thread's staging buffer on ``device`` (grown to ``nbytes``), once its last reader is done."""
        cache = getattr(self._local, "staging", None)
        if cache is None:
            cache = self._local.staging = {}
        entry = cache.setdefault(str(device), {"buf": None, "done": None, "index": None})
        if entry["done"] is not None:
            # the gather that read it last (and the index upload before it) has finished: KvikIO may overwrite it
            mem.host_wait(entry["done"])  # sync-point: kvikio-staging-reuse
            entry["done"] = None
        if entry["buf"] is None or entry["buf"].numel() < nbytes:
            entry["buf"] = None
            entry["buf"] = mem.empty((max(int(nbytes), PAGE),), torch.uint8)
            # KvikIO writes outside any stream: work still queued on this memory's previous life must end
            mem.host_wait(mem.mark())  # sync-point: kvikio-new-staging
        return entry["buf"], entry

    def _read_into(self, handle: BinHandle, rows: np.ndarray, out: torch.Tensor, positions: np.ndarray | None,
                   # Any: KvikIO has no stubs (CuFile handles, options, transfer hooks)
                   transfer: Any, mem: Any) -> int:
        info = handle.info
        f = self._files.get(handle.fid)
        if f is None:
            raise StoreError(f"{info.path}: bin {info.bin_id} is not open in the kvikio backend")
        packed = info.rows_per_page > 1
        ext = PAGE if packed else info.row_stride_bytes
        key = rows // info.rows_per_page if packed else rows
        ex = sorted_extents(key)
        uniq, order, sinv = ex.uniq, ex.order, ex.sinv
        per_round = max(1, self.staging_bytes // ext)
        dev = out.device if mem is None else mem.device
        host = mem is None
        requests = 0
        for a in range(0, uniq.size, per_round):
            u = uniq[a:a + per_round]
            entry: dict[str, Any] = {}  # Any: a staging buffer, a Mark and a pinned index buffer
            if host:
                buf = self._host_staging(u.size * ext)
            else:
                buf, entry = self._staging(u.size * ext, dev, mem)
            starts, lens = coalesced_runs(np.flatnonzero(np.diff(u) != 1) + 1, u.size,
                                          max(1, self.max_read_bytes // ext))
            # (a device that torch calls the CPU is the tests' fake accelerator: no raw CUDA stream there)
            direct = not host and dev.type == "cuda" and self._direct.get(handle.fid, False)
            stream = self._read_stream(dev) if direct else None
            futures = []
            for s, n in zip(starts.tolist(), lens.tolist(), strict=True):
                view = buf[s * ext:(s + n) * ext]
                futures.append((self._issue(f, view.numpy() if host else view, n * ext, int(u[s]) * ext, stream),
                                n * ext))
            for fut, want in futures:
                got = int(fut.get())
                if got != want:
                    raise StoreError(f"{info.path}: short read from bin {info.bin_id} ({got} of {want} bytes); "
                                     "is the bin file truncated?")
            requests += len(futures)
            lo, hi = np.searchsorted(sinv, [a, a + u.size])
            pos, slot = order[lo:hi], sinv[lo:hi] - a
            src = buf[:u.size * ext].view(u.size, ext)
            dst = pos if positions is None else positions[pos]
            # one upload of every index this round needs: staging slot, row within the page, destination
            table = np.stack([slot, rows[pos] % info.rows_per_page if packed else slot, dst])
            index = torch.from_numpy(table) if host else self._upload(table, entry, mem, transfer)
            if packed:
                k = info.rows_per_page
                vals = src[:, :k * info.row_bytes].reshape(u.size, k, info.row_bytes)[index[0], index[1]]
            else:
                vals = src.index_select(0, index[0])[:, :info.row_bytes]
            out.index_copy_(0, index[2], vals)
            if not host:
                entry["done"] = mem.mark()
        return requests

    @staticmethod
    # Any: a DeviceMemory and a Transfer (iostack.transfer sits above the backends)
    def _upload(index: np.ndarray, entry: dict, mem: Any, transfer: Any) -> torch.Tensor:
        """``index`` on the device, copied from this thread's pinned index buffer (asynchronously: from pageable
        memory the copy would be staged and the host would wait). The buffer is refilled only after
        ``entry["done"]``, which follows this copy on the stream."""
        nbytes = index.size * 8
        if entry["index"] is None or entry["index"].numel() < nbytes:
            entry["index"] = None
            entry["index"] = mem.empty_pinned(max(nbytes, PAGE))
        pinned = entry["index"][:nbytes].view(torch.int64).view(index.shape)
        pinned.copy_(torch.from_numpy(np.ascontiguousarray(index, dtype=np.int64)))
        if transfer is not None:
            transfer.count(pinned, "device")
        return mem.copy(mem.empty(tuple(index.shape), torch.int64), pinned)

    def close_handle(self, handle: BinHandle) -> None:
        with self._lock:
            f = self._files.pop(handle.fid, None)
            self._direct.pop(handle.fid, None)
        if f is not None:
            f.close()

    def close(self) -> None:
        with self._lock:
            files, self._files = list(self._files.values()), {}
        for f in files:
            f.close()
