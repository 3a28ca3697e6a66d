"""The tiered feature store: ``gather(ids)`` from GPU caches, CPU caches and SSD bins, on the trainer's device.

A store has one device (``device``; its :class:`~iostack.transfer.DeviceMemory`
says how memory there works). On a CUDA device a gather assembles its result
there, so every row crosses PCIe at most once:

* GPU-cache rows never leave the GPU (a gather on the device);
* CPU-cache rows are gathered on the host straight into a pinned staging
  buffer (``index_select(out=pinned)``: a plain ``index_select`` would return
  pageable memory) and copied up in one asynchronous copy with the SSD rows
  read into that same buffer, or
* SSD rows land in the result on the device when the backend reads into
  device memory itself (KvikIO);

all on the :class:`~iostack.transfer.Transfer`'s copy stream, handed to the
consumer as a landing it waits on (:meth:`FeatureStore.gather_landing`), or
waited for before :meth:`FeatureStore.gather` returns. Without an accelerator
(this machine) the device is the host: a "gpu" bin is a host tensor and the
result is a page-aligned host array that O_DIRECT reads fill in place (a buffer
of an earlier, freed result when one fits: :class:`~iostack.backends.base.AlignedPool`).

Host-resident tiers (CPU bins; GPU partitions that belong to other ranks'
GPUs) are one copy per node when ``share_key`` is given (see
:mod:`iostack.hostshare`), and page-locked where they are
(``cudaHostRegister``) on a CUDA device, never copied again by
``pin_memory()``.

>>> import numpy as np, tempfile, torch
>>> from iostack.bins import write_bins
>>> from iostack.placement import simple_placement
>>> feats = np.arange(20, dtype=np.float32).reshape(10, 2)
>>> p = simple_placement(10, [("gpu", 2), ("cpu", 3), ("ssd", 5)])
>>> with tempfile.TemporaryDirectory() as d:
...     _ = write_bins(feats, p, d)
...     with FeatureStore(p, d, features=feats, backend_options={"processes": 0}) as s:
...         s.gather(torch.tensor([9, 0, 4, 9]))[:, 0].tolist()
[18.0, 0.0, 8.0, 18.0]
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from iostack.backends import get_backend
from iostack.backends.base import AlignedPool
from iostack.bins import open_bin
from iostack.binstats import Counter, StoreStats
from iostack.errors import StoreError
from iostack.hostshare import SharedHostTensor, shared_host_tensor
from iostack.nodeshare import NodeSharedReads
from iostack.placement import Placement
from iostack.ssdreads import SsdReads
from iostack.transfer import Batch, DeviceMemory, Gathered, Transfer, memory_for

#: device-timed latencies waiting for their events, per bin, before the oldest are resolved
_PENDING = 64

#: share of free GPU memory the GPU bins may take (the rest is the model's and the batches')
GPU_BIN_SHARE = 0.9


_MADV_NORMAL, _MADV_RANDOM, _MADV_WILLNEED, _MADV_DONTNEED = 0, 1, 3, 4
#: cache rows copied per step
_FILL_ROWS = 1 << 16


@contextlib.contextmanager
def _scattered_reads(arr: np.ndarray | None):
    """While the caches copy their rows out of a memory-mapped feature file: no read-ahead, and the
    mapping's pages let go afterwards.

    The cache rows are scattered over the file; with the kernel's default read-ahead every
    4 KiB row faulted in tens of its neighbours, so filling a 512 MiB cache from a 5.7 GiB
    file mapped (and charged to the process) 4.7 GiB. ``madvise(MADV_RANDOM)`` reads what is
    touched; ``MADV_DONTNEED`` afterwards unmaps the pages (they stay in the page cache,
    reclaimable, not in this process's resident set). A plain in-memory array is left alone.
    """
    if not isinstance(arr, np.memmap) or arr.size == 0:
        yield
        return
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    start = arr.ctypes.data - arr.ctypes.data % mmap.PAGESIZE
    length = ctypes.c_size_t(arr.ctypes.data + arr.nbytes - start)
    addr = ctypes.c_void_p(start)
    libc.madvise(addr, length, _MADV_RANDOM)  # advice only: a failure changes nothing but speed
    try:
        yield
    finally:
        libc.madvise(addr, length, _MADV_DONTNEED)
        libc.madvise(addr, length, _MADV_NORMAL)


def _madvise(arr: np.ndarray, first_byte: int, end_byte: int, advice: int) -> None:
    """``madvise`` bytes ``[first_byte, end_byte)`` of ``arr``'s data (widened to whole pages); advice
    only, so a failure changes nothing but speed."""
    import ctypes
    import mmap

    start = arr.ctypes.data + first_byte
    start -= start % mmap.PAGESIZE
    ctypes.CDLL(None, use_errno=True).madvise(ctypes.c_void_p(start),
                                              ctypes.c_size_t(arr.ctypes.data + end_byte - start), advice)


def _in_file_order(verts: np.ndarray, feats: np.ndarray):
    """``(vertices, their feature rows)`` in chunks of ascending id: the feature file read front to back.

    A cache's rows are scattered over the file (hot rows, by id at random). Copied in row
    order, every page fault read one 4 KiB page somewhere in the file: filling a 2 GiB cache
    from papers100M's 28 GB file took minutes of single-page reads (14.5 GB of pages). In id
    order the reads go front to back; where a chunk's rows touch at least a quarter of the
    pages of the span they lie in, the span is asked for at once (``MADV_WILLNEED``: the
    kernel reads it in large sequential requests), and every span is let go once copied.
    """
    order = np.argsort(verts, kind="stable")
    mapped = isinstance(feats, np.memmap) and feats.ndim == 2 and feats.size > 0
    row_bytes = feats.shape[1] * feats.dtype.itemsize if feats.ndim == 2 else 0
    for a in range(0, verts.size, _FILL_ROWS):
        v = verts[order[a:a + _FILL_ROWS]]
        if not mapped or not v.size:
            yield v, feats[v]
            continue
        lo, hi = int(v[0]) * row_bytes, (int(v[-1]) + 1) * row_bytes
        base = feats.ctypes.data % 4096
        touched = np.unique((base + v * row_bytes) // 4096).size
        if 4 * touched >= (base + hi) // 4096 - (base + lo) // 4096 + 1:
            _madvise(feats, lo, hi, _MADV_WILLNEED)
        rows = feats[v]
        _madvise(feats, lo, hi, _MADV_DONTNEED)
        yield v, rows


class FeatureStore(SsdReads, StoreStats):
    """Feature rows of ``placement``'s vertices, served from its bins, gathered on ``device``.

    ``bin_dir``: where the SSD bin files are (relative bin paths resolve there).
    ``features`` (``(V, dim)`` array or memmap): source of the GPU and CPU tiers,
    copied in once; needed only when the placement has such bins.
    ``device`` (``cpu``, ``cuda:N``) or ``memory`` (a
    :class:`~iostack.transfer.DeviceMemory`; tests pass a fake): where GPU bins
    and gather results live. ``local_gpu_bins``: the GPU bins held on this
    device (default: all); a GPU bin not listed (another rank's partition) is
    served from host memory, as peer reads over NVLink are not implemented.
    GPU bins must fit in :data:`GPU_BIN_SHARE` of the device's free memory.
    ``share_key``: host-resident bins go to node-shared memory under this key
    (one copy per node; it must change when the contents would). SSD bins are
    read by ``backend`` (``"auto"``, ``"posix"``, ``"kvikio"``, or a
    :class:`~iostack.backends.ReadBackend`). Safe to call from several threads.

    Rows are held as the placement's codec says (:attr:`Placement.codec`:
    float16, bfloat16, int8; :mod:`iostack.codec`) and decoded where they land
    (on the device, after the copy), so ``gather`` returns float32 whatever the
    bins hold; ``row_bytes`` is the stored row's size (what the tiers hold and
    move), ``dtype`` the gather's result type, ``storage_dtype`` the bins'.
    ``feature_dtype`` (a :data:`~iostack.codec.STORAGE_DTYPES` name): the
    storage type the caller expects; another is refused.
    """

    def __init__(self, placement: Placement, bin_dir: str | os.PathLike[str] | None = None, *,
                 features: np.ndarray | None = None, backend: Any = "auto",
                 backend_options: dict[str, Any] | None = None, device: str | torch.device = "cpu",
                 memory: DeviceMemory | None = None, local_gpu_bins: Sequence[int] | None = None,
                 share_key: str | None = None, full_check: bool = False,
                 feature_dtype: str | None = None) -> None:
        self.placement = placement
        self.codec = placement.codec
        self.transfer = Transfer(memory if memory is not None else memory_for(device))
        self.memory = self.transfer.memory
        self.device = self.memory.device
        kinds = {b.kind for b in placement.bins}
        # numpy, not torch: grouping a gather's ids by bin is a 16-bit radix sort on one thread
        # (see _groups)
        top = max((b.id for b in placement.bins), default=0)
        self._bin_of = np.ascontiguousarray(placement.bin_of).astype(
            np.int16 if top <= np.iinfo(np.int16).max else np.int64)
        self._row_of = np.ascontiguousarray(placement.row_of, np.int64)
        self._tensors: dict[int, torch.Tensor] = {}
        self._held: dict[int, str] = {b.id: "file" for b in placement.bins}
        self._shared: list[SharedHostTensor] = []
        self._pinned: list[torch.Tensor] = []
        self._handles: dict[int, Any] = {}
        self._counters = {b.id: Counter() for b in placement.bins}
        self._results = AlignedPool()
        self._node_reads: NodeSharedReads | None = None
        self.notes: list[str] = []
        dtype, dim = None, None
        if features is not None:
            dtype, dim = np.dtype(features.dtype), int(features.shape[1]) if features.ndim == 2 else 1
        elif kinds & {"gpu", "cpu"}:
            raise StoreError("the placement has GPU or CPU bins: pass features= to fill them")
        self.backend = None
        self.feature_dtype = self._check_codec(dtype, dim, feature_dtype)
        if self.codec is not None:
            dtype, dim = self.codec.storage_np, self.codec.dim
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None
        try:
            if "ssd" in kinds:
                dtype, dim = self._open_ssd(bin_dir, backend, backend_options, dtype, dim, full_check)
            if dtype is None:
                raise StoreError("no features and no SSD bins: nothing says the rows' dtype and width")
            self.dtype_np, self.dim = dtype, dim
            self.storage_dtype = (self.codec.storage_torch if self.codec is not None
                                  else torch.from_numpy(np.empty(0, dtype)).dtype)
            self.dtype = torch.float32 if self.codec is not None else self.storage_dtype
            self.row_bytes = dim * dtype.itemsize
            if self.feature_dtype is None:  # no codec, no features: the SSD bins' type
                self.feature_dtype = str(self.storage_dtype).removeprefix("torch.")
                self._check_codec(None, None, feature_dtype, self.feature_dtype)
            feats = None if features is None else (features.reshape(-1, 1) if features.ndim == 1 else features)
            local = None if local_gpu_bins is None else {int(i) for i in local_gpu_bins}
            self._build_caches(feats, local, share_key)
            if self.codec is not None:
                self._tables = self._device_tables()
                self.notes.append(f"feature rows stored as {self.codec.dtype} ({self.row_bytes} bytes a row), "
                                  f"decoded to float32 on {self.device}")
        except BaseException:
            self.close()
            raise

    # -- construction ----------------------------------------------------------------------------
    def _check_codec(self, dtype: np.dtype | None, dim: int | None, expect: str | None,
                     have: str | None = None) -> str | None:
        """The placement's storage type name (``have`` if known), checked against the features and what
        the caller expects."""
        c = self.codec
        if expect is not None:
            from iostack.codec import check_feature_dtype

            check_feature_dtype(expect, "feature_dtype")
        if have is None:
            have = c.dtype if c is not None else (None if dtype is None else np.dtype(dtype).name)
        if expect is not None and have is not None and have != expect:
            raise StoreError(f"the placement stores its feature rows as {have}, this code expects {expect}; "
                             f"open it expecting {have}, or place again with `feature_dtype={expect}`")
        if c is not None and dim is not None and c.dim != dim:
            raise StoreError(f"the placement's rows have {c.dim} features, the features given have {dim}; "
                             "place these features again")
        if c is not None and dtype is not None and np.dtype(dtype).str != c.source_dtype:
            raise StoreError(f"the placement was made from {np.dtype(c.source_dtype)} features, these are "
                             f"{np.dtype(dtype)}; place these features again")
        return have

    def _device_tables(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The codec's decoding tables on the device, copied up once (int8 only)."""
        assert self.codec is not None
        with self.transfer.batch() as tb:
            tables = self.codec.tables(tb.to_device)
        tb.landing.wait()
        self.transfer.reset_counts()
        return tables

    def _encoded(self, rows: np.ndarray) -> torch.Tensor:
        """Source feature rows as the bins hold them (a host tensor of :attr:`storage_dtype`)."""
        if self.codec is None:
            return torch.from_numpy(np.ascontiguousarray(rows))
        return self.codec.encode_torch(rows)

    def _decoded(self, rows: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        """Stored rows as the gather's result (``dtype``, default :attr:`dtype`), where they are."""
        if self.codec is None:
            return rows if dtype is None or rows.dtype == dtype else rows.to(dtype)
        tables = self._tables if self._tables is not None and self._tables[0].device == rows.device else None
        return self.codec.decode(rows, dtype, tables)

    def _open_ssd(self, bin_dir, backend, options, dtype, dim, full_check):
        if bin_dir is None:
            raise StoreError("the placement has SSD bins: pass bin_dir, the directory of the bin files")
        if isinstance(backend, str):
            options = dict(options or {})
            if self.memory.accelerated:
                options.setdefault("device", self.device)  # taken by a backend with device reads only
            self.backend = get_backend(backend, **options)
        else:
            self.backend = backend
        p = self.placement
        for b in p.bins:
            if b.kind != "ssd":
                continue
            used = p.row_of[p.bin_of == b.id]
            info = open_bin(bin_dir, b, dtype=dtype, dim=dim, full_check=full_check,
                            min_rows=int(used.max()) + 1 if used.size else 0)
            dtype, dim = np.dtype(info.dtype), info.dim
            if not used.size:
                # nothing to read (a hot-first placement leaves all but one SSD bin empty): no handle, so
                # no buffered-read worker processes started for it in the memory the caches could use
                continue
            h = self._handles[b.id] = self.backend.open(info)
            if h.note:
                self.notes.append(f"SSD bin {b.id}: {h.note}")
        return dtype, dim

    def _rows_of(self, bin_id: int) -> tuple[np.ndarray, int]:
        verts = self.placement.vertices_of(bin_id)
        return verts, (int(self.placement.row_of[verts[-1]]) + 1 if verts.size else 0)

    def _fill(self, t: torch.Tensor, verts: np.ndarray, feats: np.ndarray) -> None:
        """Rows of ``verts`` into host tensor ``t`` at their bin rows, in bounded chunks out of a memmap."""
        for v, rows in _in_file_order(verts, feats):
            t[torch.from_numpy(self.placement.row_of[v])] = self._encoded(rows)

    def _build_caches(self, feats: np.ndarray | None, local: set[int] | None, share_key: str | None) -> None:
        with _scattered_reads(feats):
            self._build_caches_from(feats, local, share_key)

    def _build_caches_from(self, feats: np.ndarray | None, local: set[int] | None, share_key: str | None) -> None:
        mem = self.memory
        on_device = [b for b in self.placement.bins if b.kind == "gpu" and mem.accelerated
                     and (local is None or b.id in local)]
        need = sum(self._rows_of(b.id)[1] for b in on_device) * self.row_bytes
        free = mem.free_bytes() if on_device else None
        if free is not None and need > GPU_BIN_SHARE * free:
            raise StoreError(f"the GPU cache bin(s) need {need / 2**30:.2f} GiB on {self.device}, which has "
                             f"{free / 2**30:.2f} GiB free ({GPU_BIN_SHARE:.0%} may go to bins): place with a "
                             "smaller `gpu_cache_bytes`")
        for b in self.placement.bins:
            if b.kind == "ssd":
                continue
            verts, rows = self._rows_of(b.id)
            if b in on_device:
                self._tensors[b.id] = self._device_bin(verts, rows, feats)
                self._held[b.id] = "device"
                continue
            if b.kind == "gpu" and mem.accelerated:
                self.notes.append(f"GPU bin {b.id} ({b.device}) belongs to another GPU: served from host memory "
                                  "(peer reads over NVLink are not implemented)")
            self._tensors[b.id] = self._host_bin(b.id, verts, rows, feats, share_key)
            self._held[b.id] = "device" if not mem.accelerated and b.kind == "gpu" else "host"

    def _host_bin(self, bin_id: int, verts: np.ndarray, rows: int, feats: np.ndarray,
                  share_key: str | None) -> torch.Tensor:
        shape = (rows, self.dim)
        t = None
        if share_key:
            kind = self.codec.dtype if self.codec is not None else self.dtype_np.str.lstrip('<>|=')
            seg = shared_host_tensor(f"{share_key}-b{bin_id}-{rows}x{self.dim}-{kind}",
                                     shape, self.storage_dtype, lambda x: self._fill(x, verts, feats))
            if seg is None:
                self.notes.append(f"bin {bin_id}: no room in /dev/shm for one copy per node; a private copy")
            else:
                self._shared.append(seg)
                t = seg.tensor
                self.notes.append(f"bin {bin_id}: one copy per node in {seg.path} "
                                  f"({'filled here' if seg.built else 'mapped, filled by another process'})")
        if t is None:
            t = torch.zeros(shape, dtype=self.storage_dtype)
            self._fill(t, verts, feats)
        if self.memory.pin_in_place(t):  # page-locked where it is: no pin_memory() copy
            self._pinned.append(t)
        return t

    def _device_bin(self, verts: np.ndarray, rows: int, feats: np.ndarray) -> torch.Tensor:
        """A GPU bin filled chunk by chunk through pinned staging (never a whole host copy first)."""
        with self.transfer.batch() as tb:
            t = tb.empty((rows, self.dim), self.storage_dtype)
            for v, rows in _in_file_order(verts, feats):
                stage = tb.staging("fill", (v.size, self.dim), self.storage_dtype)
                stage.copy_(self._encoded(rows))
                at = tb.to_device(torch.from_numpy(self.placement.row_of[v]))
                t.index_copy_(0, at, tb.to_device(stage))
                self.memory.host_wait(self.memory.mark())  # the staging slot is reused by the next chunk
        tb.landing.wait()
        self.transfer.reset_counts()
        return t

    # ------------------------------------------------------------------
    @property
    def num_vertices(self) -> int:
        return self.placement.num_vertices

    def direct_io(self) -> dict[int, tuple[bool, str | None]]:
        """Per SSD bin: whether reads bypass the page cache (O_DIRECT, or GPUDirect Storage), and why not."""
        return {i: (h.direct, h.note) for i, h in self._handles.items()}

    def memory_bytes(self) -> dict[str, int]:
        """Memory the store holds, bytes: on the ``device``, in ``host`` memory (caches), ``buffers`` (backend).

        ``gpu`` and ``cpu`` are the bytes of each tier's bins wherever held.
        """
        out = {"gpu": 0, "cpu": 0, "device": 0, "host": 0,
               "buffers": (self.backend.buffer_bytes if self.backend else 0)
               + (self._node_reads.buffer_bytes() if self._node_reads is not None else 0)}
        for i, t in self._tensors.items():
            n = t.numel() * t.element_size()
            out[self.placement.bins[i].kind] += n
            out["device" if self._held[i] == "device" and self.memory.accelerated else "host"] += n
        return out

    def unlink_shared(self) -> None:
        """Remove the names of this store's node-shared segments; the memory stays mapped here and elsewhere.

        Call it once every process of the node that shares them has opened its
        store: nothing is left in ``/dev/shm`` from then on, however the
        processes end (see :mod:`iostack.hostshare`).
        """
        for seg in self._shared:
            seg.unlink()

    def gather(self, ids: torch.Tensor | np.ndarray, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None, *, node_shared: bool = False) -> torch.Tensor:
        """Rows of ``ids`` (1-D int, any order, duplicates fine), shape ``(len(ids), dim)``, on ``device``.

        ``out[i]`` is the feature row of vertex ``ids[i]``; ``device`` is the
        store's (default) or the host; ``dtype`` casts there after the copy.
        Safe to use on the calling thread's current stream when it returns.
        """
        return self.gather_landing(ids, device, dtype, node_shared=node_shared).wait()

    def gather_landing(self, ids: torch.Tensor | np.ndarray, device: str | torch.device | None = None,
                       dtype: torch.dtype | None = None, *, node_shared: bool = False) -> Gathered:
        """:meth:`gather` without waiting: the consumer calls ``.wait()`` where it starts to use the rows.

        ``node_shared``: a training step's gather, whose SSD rows are read
        together with the node's other ranks when :meth:`enable_node_shared_reads`
        was called (the same rows either way).
        """
        dev = torch.device(device) if device is not None else self.device
        if dev != self.device and dev.type != "cpu":
            raise StoreError(f"this store gathers to {self.device} or the host, not {dev}")
        if dev != self.device or not self.memory.accelerated:
            return Gathered(self._decoded(self._gather_host(self._host_ids(ids), node_shared), dtype), None)
        return self._gather_device(ids, dtype, node_shared)

    def _host_ids(self, ids: torch.Tensor | np.ndarray, batch: Batch | None = None) -> torch.Tensor:
        t = torch.as_tensor(ids).reshape(-1)
        if t.device.type != "cpu":
            t = batch.to_host(t) if batch is not None else t.to("cpu")
        t = t.to(torch.int64)
        a = t.numpy()
        if a.size and (a.min() < 0 or a.max() >= self.num_vertices):
            bad = int(a[(a < 0) | (a >= self.num_vertices)][0])
            raise IndexError(f"vertex {bad} is not in the store ({self.num_vertices} vertices)")
        return t

    def _groups(self, ids_t: torch.Tensor):
        """``(bin, positions, rows)`` per bin present in ``ids_t`` (int64 host tensors), by one stable sort.

        In numpy on the calling thread: torch's parallel argsort spin-waits for its
        OpenMP threads, and on a loaded machine (or beside a training step's own
        threads) one 65,536-id sort took 130-165 ms instead of 3 ms (profiled,
        docs/emulate.md); numpy's stable sort of 16-bit bin numbers is a radix sort.
        """
        ids = ids_t.numpy()
        if ids.size == 0:
            return
        bins, rows = self._bin_of[ids], self._row_of[ids]
        lo, hi = int(bins.min()), int(bins.max())
        if lo == hi:  # one bin (a single-bin store, or a batch that hits one tier): no sort
            yield lo, torch.from_numpy(np.arange(ids.size)), torch.from_numpy(rows)
            return
        order = np.argsort(bins, kind="stable")
        sb = bins[order]
        cuts = np.flatnonzero(sb[1:] != sb[:-1]) + 1
        for a, e in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [ids.size]]).tolist(),
                        strict=True):
            pos = order[a:e]
            yield int(sb[a]), torch.from_numpy(pos), torch.from_numpy(rows[pos])

    def _gather_host(self, ids_t: torch.Tensor, node_shared: bool = False) -> torch.Tensor:
        """Host result as stored, page-aligned, so that O_DIRECT reads of SSD rows land in it."""
        n = ids_t.numel()
        out_np = self._results.empty(n, self.row_bytes)  # a freed result's pages, already faulted in
        out = torch.from_numpy(out_np.view(self.dtype_np).reshape(n, self.dim)).view(self.storage_dtype)
        groups = list(self._groups(ids_t))
        with self._shared_reads(groups, node_shared) as shared:
            for b, pos, r in groups:
                t0 = time.perf_counter()
                c = pos.numel()
                tensor = self._tensors.get(b)
                if tensor is None:
                    self._read_ssd(b, pos, r, out_np, shared)
                    continue
                if tensor.device.type != "cpu":  # a GPU bin gathered to the host: one copy down
                    out[pos] = tensor.index_select(0, r.to(tensor.device)).cpu()
                else:
                    out[pos] = tensor.index_select(0, r)
                self._counters[b].add(c, c * self.row_bytes, 1, time.perf_counter() - t0)
        return out

    def _gather_device(self, ids: torch.Tensor | np.ndarray, dtype: torch.dtype | None,
                       node_shared: bool = False) -> Gathered:
        """Assemble on the device (see the module docstring): index metadata up once, host rows up once."""
        mem = self.memory
        with self.transfer.batch() as tb:
            ids_t = self._host_ids(ids, tb)
            n = ids_t.numel()
            out = tb.empty((n, self.dim), self.storage_dtype)
            dev_g, host_g, file_host, file_dev = [], [], [], []
            groups = list(self._groups(ids_t))
            with self._shared_reads(groups, node_shared) as shared:  # released once its rows are in the staging
                for b, pos, r in groups:
                    if b in self._tensors:
                        (dev_g if self._held[b] == "device" else host_g).append((b, pos, r))
                    elif self.backend.device_reads:
                        file_dev.append((b, pos, r))
                    else:
                        file_host.append((b, pos, r))
                staged = host_g + file_host
                n_host = sum(p.numel() for _, p, _ in staged)
                # one pinned index buffer up: device groups' positions and rows, then the staged rows' positions
                parts = [x for _, p, r in dev_g for x in (p, r)] + [p for _, p, _ in staged]
                idx = None
                if parts:
                    total = sum(x.numel() for x in parts)
                    ibuf = tb.staging("index", (total,), torch.int64)
                    torch.cat(parts, out=ibuf)
                    idx = tb.to_device(ibuf)
                at = 0
                for b, pos, _ in dev_g:  # launched first: the device works while the host gathers
                    c = pos.numel()
                    m0 = mem.mark()
                    vals = self._tensors[b].index_select(0, idx[at + c:at + 2 * c])
                    out.index_copy_(0, idx[at:at + c], vals)
                    self._counters[b].add(c, c * self.row_bytes, 1, None, (m0, mem.mark()))
                    at += 2 * c
                if n_host:
                    hbuf = tb.staging("rows", (n_host, self.dim), self.storage_dtype)
                    h = 0
                    for b, pos, r in staged:
                        c = pos.numel()
                        t0 = time.perf_counter()
                        if b in self._tensors:  # into pinned memory: index_select alone would return pageable
                            torch.index_select(self._tensors[b], 0, r, out=hbuf[h:h + c])
                            self._counters[b].add(c, c * self.row_bytes, 1, time.perf_counter() - t0)
                        else:
                            self._read_ssd(b, None, r, hbuf[h:h + c], shared)
                        h += c
                    out.index_copy_(0, idx[at:at + n_host], tb.to_device(hbuf))
            for b, pos, r in file_dev:  # the backend reads into device memory and scatters there
                t0 = time.perf_counter()
                requests = self.backend.read_rows(self._handles[b], r, out, pos, transfer=self.transfer)
                c = pos.numel()
                self._counters[b].add(c, c * self.row_bytes, requests, time.perf_counter() - t0)
            # decoded here, on the device: the rows crossed PCIe in their stored (smaller) type
            result = tb.cast(out, dtype) if self.codec is None else tb.keep(mem.adopt(self._decoded(out, dtype)))
        for c in self._counters.values():
            if len(c.pending) > _PENDING:
                c.resolve(mem, keep=_PENDING // 2)
        return Gathered(result, tb.landing)

    def close(self) -> None:
        if self._node_reads is not None:
            self._node_reads.close()
            self._node_reads = None
        if self.backend is not None:
            for h in self._handles.values():
                self.backend.close_handle(h)
            self.backend.close()
            self._handles.clear()
        for t in self._pinned:  # unregistered before the memory goes away
            self.memory.unpin(t)
        self._pinned.clear()
        self._tensors.clear()
        for seg in self._shared:
            seg.close()
        self._shared.clear()

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
