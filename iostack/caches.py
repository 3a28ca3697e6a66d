"""The cache tiers of a placement, filled from the feature matrix: GPU bins and CPU bins.

:func:`cache_tiers` copies the rows of a placement's GPU and CPU bins out of
the features (an array or a memmap) once, as the bins hold them (the
placement's codec), into a :class:`~iostack.tiers.DeviceTier` (GPU bins on this
store's GPU) and :class:`~iostack.tiers.HostTier` s (CPU bins; GPU bins of other
ranks' GPUs; GPU bins where the device is the host). Host-resident bins are one
copy per node when ``share_key`` is given (:mod:`iostack.hostshare`). They are
not page-locked: the store gathers their rows on the CPU into pinned staging
and copies that up (no GPU path reads a host bin in place), so registering
them only locked memory in every rank, and a refused ``cudaHostRegister``
(``ulimit -l``) stopped the run (issue 34).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import numpy as np
import torch

from iostack.errors import StoreError
from iostack.hostshare import shared_host_tensor
from iostack.placement import Placement
from iostack.tiers import DeviceTier, HostTier, Tier
from iostack.transfer import Transfer

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


@dataclass(frozen=True)
class RowFormat:
    """How the bins hold a row: ``dim`` values of ``storage`` (torch), ``kind`` naming it in segment keys;
    ``encode`` turns source feature rows into a host tensor of that type."""

    dim: int
    storage: torch.dtype
    kind: str
    encode: Callable[[np.ndarray], torch.Tensor]


@dataclass
class CacheBuild:
    """What :func:`cache_tiers` made: the tiers, and notes on where their bins went."""

    tiers: list[Tier]
    notes: list[str] = field(default_factory=list)


def _rows_of(placement: Placement, bin_id: int) -> tuple[np.ndarray, int]:
    verts = placement.vertices_of(bin_id)
    return verts, (int(placement.row_of[verts[-1]]) + 1 if verts.size else 0)


def cache_tiers(placement: Placement, features: np.ndarray | None, fmt: RowFormat, transfer: Transfer, *,
                local_gpu_bins: set[int] | None = None, share_key: str | None = None,
                skip: Collection[int] = ()) -> CacheBuild:
    """The tiers of ``placement``'s GPU and CPU bins (but those in ``skip``), filled from ``features`` (``(V, dim)``).

    ``local_gpu_bins``: GPU bins held on ``transfer``'s device (default: all); a
    GPU bin not listed (another rank's partition) is served from host memory, as
    peer reads over NVLink are not implemented. GPU bins must fit in
    :data:`GPU_BIN_SHARE` of the device's free memory. ``share_key``: host
    bins go to node-shared memory under this key (it must change when their
    contents would).
    """
    with _scattered_reads(features):
        return _cache_tiers(placement, features, fmt, transfer, local_gpu_bins, share_key, set(skip))


def _cache_tiers(placement: Placement, feats: np.ndarray | None, fmt: RowFormat, transfer: Transfer,
                 local: set[int] | None, share_key: str | None, skip: set[int]) -> CacheBuild:
    mem = transfer.memory
    cached = [b for b in placement.bins if b.kind != "ssd" and b.id not in skip]
    on_device = [b for b in cached if b.kind == "gpu" and mem.accelerated and (local is None or b.id in local)]
    row_bytes = fmt.dim * torch.empty((), dtype=fmt.storage).element_size()
    need = sum(_rows_of(placement, b.id)[1] for b in on_device) * row_bytes
    free = mem.free_bytes() if on_device else None
    if free is not None and need > GPU_BIN_SHARE * free:
        raise StoreError(f"the GPU cache bin(s) need {need / 2**30:.2f} GiB on {mem.device}, which has "
                         f"{free / 2**30:.2f} GiB free ({GPU_BIN_SHARE:.0%} may go to bins): place with a "
                         "smaller `gpu_cache_bytes`")
    if cached and feats is None:
        raise StoreError("the placement has GPU or CPU bins: pass features= to fill them")
    build = CacheBuild([])
    device: dict[int, torch.Tensor] = {}
    host: dict[str, _HostBins] = {}
    try:
        for b in cached:
            assert feats is not None
            verts, rows = _rows_of(placement, b.id)
            if b in on_device:
                device[b.id] = _device_bin(placement, verts, rows, feats, fmt, transfer)
                continue
            if b.kind == "gpu" and mem.accelerated:
                build.notes.append(f"GPU bin {b.id} ({b.device}) belongs to another GPU: served from host memory "
                                   "(peer reads over NVLink are not implemented)")
            held = "device" if not mem.accelerated and b.kind == "gpu" else "host"
            acc = host.setdefault(held, _HostBins())
            acc.tensors[b.id] = _host_bin(placement, b.id, verts, rows, feats, fmt, share_key, acc, build.notes)
    except BaseException:
        for acc in host.values():
            HostTier(acc.tensors, memory=mem, segments=acc.segments).close()
        raise
    if device:
        build.tiers.append(DeviceTier(device, mem))
    build.tiers += [HostTier(acc.tensors, held=held, memory=mem, segments=acc.segments)
                    for held, acc in sorted(host.items(), key=lambda kv: min(kv[1].tensors))]
    return build


@dataclass
class _HostBins:
    """One host tier's bins while they fill: tensors by bin, those page-locked, their node-shared segments."""

    tensors: dict[int, torch.Tensor] = field(default_factory=dict)
    segments: list = field(default_factory=list)


def _fill(placement: Placement, t: torch.Tensor, verts: np.ndarray, feats: np.ndarray, fmt: RowFormat) -> None:
    """Rows of ``verts`` into host tensor ``t`` at their bin rows, in bounded chunks out of a memmap."""
    for v, rows in _in_file_order(verts, feats):
        t[torch.from_numpy(placement.row_of[v])] = fmt.encode(rows)


def _host_bin(placement: Placement, bin_id: int, verts: np.ndarray, rows: int, feats: np.ndarray,
              fmt: RowFormat, share_key: str | None, acc: _HostBins, notes: list[str]
              ) -> torch.Tensor:
    shape = (rows, fmt.dim)
    t = None
    if share_key:
        seg = shared_host_tensor(f"{share_key}-b{bin_id}-{rows}x{fmt.dim}-{fmt.kind}",
                                 shape, fmt.storage, lambda x: _fill(placement, x, verts, feats, fmt))
        if seg is None:
            notes.append(f"bin {bin_id}: no room in /dev/shm for one copy per node; a private copy")
        else:
            acc.segments.append(seg)
            t = seg.tensor
            notes.append(f"bin {bin_id}: one copy per node in {seg.path} "
                         f"({'filled here' if seg.built else 'mapped, filled by another process'})")
    if t is None:
        t = torch.zeros(shape, dtype=fmt.storage)
        _fill(placement, t, verts, feats, fmt)
    return t


def _device_bin(placement: Placement, verts: np.ndarray, rows: int, feats: np.ndarray, fmt: RowFormat,
                transfer: Transfer) -> torch.Tensor:
    """A GPU bin filled chunk by chunk through pinned staging (never a whole host copy first)."""
    with transfer.batch() as tb:
        t = tb.empty((rows, fmt.dim), fmt.storage)
        for v, chunk in _in_file_order(verts, feats):
            stage = tb.staging("fill", (v.size, fmt.dim), fmt.storage)
            stage.copy_(fmt.encode(chunk))
            at = tb.to_device(torch.from_numpy(placement.row_of[v]))
            t.index_copy_(0, at, tb.to_device(stage))  # the ring waits before a slot comes round again
    assert tb.landing is not None  # set when the batch's block ends
    tb.landing.wait()
    transfer.reset_counts()
    return t


__all__ = ["GPU_BIN_SHARE", "CacheBuild", "RowFormat", "cache_tiers"]
