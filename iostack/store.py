"""The tiered feature store: ``gather(ids)`` from GPU caches, CPU caches and SSD bins, on the trainer's device.

A :class:`FeatureStore` is a router over tiers (:mod:`iostack.tiers`): it
groups a gather's ids by bin (the placement index, one stable sort) and hands
each group to the tier serving that bin, which writes the rows into the result
(``read(bin_id, rows, out, positions)``). Given a placement and the features,
it composes the usual tiers itself: a :class:`~iostack.tiers.DeviceTier`
(GPU bins on this GPU), :class:`~iostack.tiers.HostTier` s (CPU bins, other
GPUs' partitions; :mod:`iostack.caches` fills them) and an
:class:`~iostack.ssdreads.SsdTier` (SSD bins over a read backend); tiers passed
in ``tiers=`` serve their bins instead, and :meth:`FeatureStore.with_tiers`
composes a store that reads some bins another way (node-shared SSD reads:
:func:`iostack.nodeshare.with_node_shared_reads`).

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

>>> import numpy as np, tempfile, torch
>>> from iostack.bins import write_bins
>>> from iostack.placement import simple_placement
>>> feats = np.arange(20, dtype=np.float32).reshape(10, 2)
>>> p = simple_placement(10, [("gpu", 2), ("cpu", 3), ("ssd", 5)])
>>> with tempfile.TemporaryDirectory() as d:
...     _ = write_bins(feats, p, d)
...     with FeatureStore(p, d, features=feats, backend_options={"processes": 0}) as s:
...         s.gather(torch.tensor([9, 0, 4, 9]))[:, 0].tolist(), s.tiers
([18.0, 0.0, 8.0, 18.0], [HostTier(bins 0), HostTier(bins 1), SsdTier(posix, bins 2)])
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from iostack.backends import get_backend
from iostack.backends.base import AlignedPool, ReadBackend
from iostack.binstats import BinStats, bin_stats, tier_rows, tier_stats
from iostack.caches import RowFormat, cache_tiers
from iostack.errors import StoreError
from iostack.nodeshare import NodeSharedReads, NodeSharedSsdTier
from iostack.placement import Placement
from iostack.ssdreads import open_ssd_tier
from iostack.tiers import INTO_DEVICE, ON_DEVICE, Tier, check_tiers
from iostack.transfer import Batch, DeviceMemory, Gathered, Transfer, memory_for

#: device-timed latencies waiting for their events, per bin, before the oldest are resolved
_PENDING = 64


class FeatureStore:
    """Feature rows of ``placement``'s vertices, served by its tiers, gathered on ``device``.

    ``bin_dir``: where the SSD bin files are (relative bin paths resolve there).
    ``features`` (``(V, dim)`` array or memmap): source of the GPU and CPU tiers,
    copied in once; needed only when the placement has such bins.
    ``device`` (``cpu``, ``cuda:N``) or ``memory`` (a
    :class:`~iostack.transfer.DeviceMemory`; tests pass a fake): where GPU bins
    and gather results live. ``local_gpu_bins``: the GPU bins held on this
    device (default: all); a GPU bin not listed (another rank's partition) is
    served from host memory, as peer reads over NVLink are not implemented.
    GPU bins must fit in :data:`~iostack.caches.GPU_BIN_SHARE` of the device's
    free memory. ``share_key``: host-resident bins go to node-shared memory
    under this key (one copy per node; it must change when the contents would).
    SSD bins are read by ``backend`` (``"auto"``, ``"posix"``, ``"kvikio"``, or a
    :class:`~iostack.backends.ReadBackend`). ``tiers``: tiers of your own
    (:class:`~iostack.tiers.Tier`), each serving its bins instead of the tier
    the store would build for them. Safe to call from several threads.

    Rows are held as the placement's codec says (:attr:`Placement.codec`:
    float16, bfloat16, int8; :mod:`iostack.codec`) and decoded where they land
    (on the device, after the copy), so ``gather`` returns float32 whatever the
    bins hold; ``row_bytes`` is the stored row's size (what the tiers hold and
    move), ``dtype`` the gather's result type, ``storage_dtype`` the bins'.
    ``feature_dtype`` (a :data:`~iostack.vocab.STORAGE_DTYPES` name): the
    storage type the caller expects; another is refused. ``transfer``: the
    :class:`~iostack.transfer.Transfer` to reach the device through (a store that
    replaces another shares its copy stream and counts), instead of a new one.
    """

    def __init__(self, placement: Placement, bin_dir: str | os.PathLike[str] | None = None, *,
                 features: np.ndarray | None = None, backend: str | ReadBackend = "auto",
                 backend_options: dict[str, Any] | None = None, device: str | torch.device = "cpu",
                 memory: DeviceMemory | None = None, local_gpu_bins: Sequence[int] | None = None,
                 share_key: str | None = None, full_check: bool = False,
                 feature_dtype: str | None = None, tiers: Sequence[Tier] = (),
                 transfer: Transfer | None = None) -> None:
        self.placement = placement
        self.codec = placement.codec
        self.transfer = transfer if transfer is not None else Transfer(memory if memory is not None
                                                                       else memory_for(device))
        self.memory = self.transfer.memory
        self.device = self.memory.device
        # numpy, not torch: grouping a gather's ids by bin is a 16-bit radix sort on one thread
        # (see _groups)
        top = max((b.id for b in placement.bins), default=0)
        self._bin_of = np.ascontiguousarray(placement.bin_of).astype(
            np.int16 if top <= np.iinfo(np.int16).max else np.int64)
        self._row_of = np.ascontiguousarray(placement.row_of, np.int64)
        self._results = AlignedPool()
        self.notes: list[str] = []
        self.backend = None
        self.tiers: list[Tier] = []
        self._owned: list[Tier] = []  # every tier composed into this store or one composed from it (closed once)
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None
        try:
            self._compose(list(tiers), bin_dir, features, backend, backend_options, local_gpu_bins, share_key,
                          full_check, feature_dtype)
        except BaseException:
            self.close()
            raise

    # -- composition -------------------------------------------------------------------------------
    def _compose(self, given: list[Tier], bin_dir, features, backend, options, local_gpu_bins, share_key,
                 full_check, feature_dtype) -> None:
        """The tiers ``given``, then the usual ones for the bins they leave (and the rows' type and width)."""
        self._owned.extend(given)
        claimed = {b for t in given for b in t.bins}
        left = {b.kind for b in self.placement.bins if b.id not in claimed}
        dtype, dim = None, None
        if features is not None:
            dtype, dim = np.dtype(features.dtype), int(features.shape[1]) if features.ndim == 2 else 1
        elif left & {"gpu", "cpu"}:
            raise StoreError("the placement has GPU or CPU bins: pass features= to fill them")
        self.feature_dtype = self._check_codec(dtype, dim, feature_dtype)
        if self.codec is not None:
            dtype, dim = self.codec.storage_np, self.codec.dim
        ssd: list[Tier] = []
        if "ssd" in left:
            self.backend = self._backend(backend, options)
            try:
                tier, dtype, dim = open_ssd_tier(self.placement, bin_dir, self.backend, dtype=dtype, dim=dim,
                                                 full_check=full_check, transfer=self.transfer, notes=self.notes,
                                                 skip=claimed)
            except BaseException:
                self.backend.close()
                raise
            self._owned.append(tier)
            ssd.append(tier)
        if dtype is None:
            dtype, dim = next((rt for t in [*ssd, *given] if (rt := t.row_type()) is not None), (None, None))
        if dtype is None:
            raise StoreError("no features, no SSD bins and no tier that knows its rows: nothing says the rows' "
                             "dtype and width")
        self.dtype_np, self.dim = dtype, dim
        self.storage_dtype = (self.codec.storage_torch if self.codec is not None
                              else torch.from_numpy(np.empty(0, dtype)).dtype)
        self.dtype = torch.float32 if self.codec is not None else self.storage_dtype
        self.row_bytes = dim * dtype.itemsize
        if self.feature_dtype is None:  # no codec, no features: the SSD bins' type
            self.feature_dtype = str(self.storage_dtype).removeprefix("torch.")
            self._check_codec(None, None, feature_dtype, self.feature_dtype)
        if left & {"gpu", "cpu"}:
            feats = features.reshape(-1, 1) if features.ndim == 1 else features
            kind = self.codec.dtype if self.codec is not None else self.dtype_np.str.lstrip('<>|=')
            caches = cache_tiers(self.placement, feats, RowFormat(self.dim, self.storage_dtype, kind, self._encoded),
                                 self.transfer, share_key=share_key, skip=claimed,
                                 local_gpu_bins=None if local_gpu_bins is None else {int(i) for i in local_gpu_bins})
            self._owned.extend(caches.tiers)
            self.notes += caches.notes
            ssd = caches.tiers + ssd
        self._route([*ssd, *given])
        if self.codec is not None:
            self._tables = self._device_tables()
            self.notes.append(f"feature rows stored as {self.codec.dtype} ({self.row_bytes} bytes a row), "
                              f"decoded on {self.device} (to float32, or the type the caller asks for)")

    # Any: keyword options of whichever backend class is chosen (each takes its own)
    def _backend(self, backend: str | ReadBackend, options: dict[str, Any] | None) -> ReadBackend:
        if not isinstance(backend, str):
            return backend
        options = dict(options or {})
        if self.memory.accelerated:
            options.setdefault("device", self.device)  # taken by a backend with device reads only
        return get_backend(backend, **options)

    def _route(self, tiers: list[Tier]) -> None:
        """Serve each bin by its tier in ``tiers`` (every bin by exactly one)."""
        self._tier_at = check_tiers([b.id for b in self.placement.bins], tiers)
        self.tiers = tiers
        self._sessions = [t for t in tiers if t.per_gather]

    def with_tiers(self, *tiers: Tier) -> FeatureStore:
        """A store over the same rows with ``tiers`` serving their bins in place of the tiers that did.

        It shares everything else with this one (the other tiers, counters,
        transfer, buffers): closing either closes both. A tier replaced must
        have all its bins served by ``tiers``.
        """
        view = copy.copy(self)
        mine = {b for t in tiers for b in t.bins}
        view._route([t for t in self.tiers if not mine & set(t.bins)] + list(tiers))
        self._owned.extend(tiers)
        return view

    def tier_of(self, bin_id: int) -> Tier:
        """The tier serving bin ``bin_id``."""
        return self._tier_at[bin_id]

    @property
    def held(self) -> dict[int, str]:
        """Per bin, where its rows are served from: ``device``, ``host`` or ``file``."""
        return {b.id: self._tier_at[b.id].held for b in self.placement.bins}

    @property
    def node_shared_reads(self) -> NodeSharedReads | None:
        """The node-shared reads of this store's SSD tier when it was composed with them (their ``off`` says if
        they fell back, ``wait_s`` the waits), else None."""
        return next((t.shared for t in self.tiers if isinstance(t, NodeSharedSsdTier)), None)

    # -- the rows' format --------------------------------------------------------------------------
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

    # -- figures -----------------------------------------------------------------------------------
    @property
    def num_vertices(self) -> int:
        return self.placement.num_vertices

    def stats(self) -> list[BinStats]:
        """Counters per bin since the store opened (or :meth:`reset_stats`); waits for pending device timings."""
        return bin_stats(self.placement, self._tier_at, self.memory)

    def tier_stats(self) -> dict[str, dict[str, float]]:
        """Counters summed per tier (``gpu``, ``cpu``, ``ssd``): rows, bytes, requests, seconds of the
        calls that read them, share of rows. Rows of another GPU's partition served from host memory count
        as ``gpu-peer``."""
        return tier_stats(self.placement, self._tier_at)

    def tier_rows(self, ids: torch.Tensor | np.ndarray) -> dict[str, tuple[int, int]]:
        """Rows and bytes a gather of ``ids`` (host ids) adds to each tier of :meth:`tier_stats`, counted
        from the placement alone: a batch's own figures while other threads gather too."""
        return tier_rows(self.placement, self._tier_at, self._bin_of, np.asarray(ids), self.row_bytes)

    def totals(self) -> dict[str, tuple[int, int]]:
        """Rows and bytes served so far, per tier of :meth:`tier_stats` (a feature source's figures)."""
        return {k: (int(v["rows"]), int(v["bytes"])) for k, v in self.tier_stats().items()}

    def reset_stats(self) -> None:
        """Start every bin's counts again from zero."""
        for t in self.tiers:
            t.reset_counts()

    def direct_io(self) -> dict[int, tuple[bool, str | None]]:
        """Per SSD bin: whether reads bypass the page cache (O_DIRECT, or GPUDirect Storage), and why not."""
        return {b: d for t in self.tiers for b, d in t.direct_io().items()}

    def memory_bytes(self) -> dict[str, int]:
        """Memory the store holds, bytes: on the ``device``, in ``host`` memory (caches), ``buffers`` (reads).

        ``gpu`` and ``cpu`` are the bytes of each tier's bins wherever held.
        """
        out = {"gpu": 0, "cpu": 0, "device": 0, "host": 0,
               "buffers": sum(t.buffer_bytes() for t in _distinct(self._owned))}
        for b in self.placement.bins:
            tier = self._tier_at[b.id]
            n = tier.held_bytes(b.id)
            out[b.kind] = out.get(b.kind, 0) + n
            out["device" if tier.held == "device" and self.memory.accelerated else "host"] += n
        return out

    def concurrent_gathers(self) -> bool:
        """Whether gathers may run on several threads at once: host gathers."""
        return not self.memory.accelerated

    def unlink_shared(self) -> None:
        """Remove the names of this store's node-shared segments; the memory stays mapped here and elsewhere.

        Call it once every process of the node that shares them has opened its
        store: nothing is left in ``/dev/shm`` from then on, however the
        processes end (see :mod:`iostack.hostshare`).
        """
        for t in self.tiers:
            t.unlink_shared()

    # -- gathering ---------------------------------------------------------------------------------
    def gather(self, ids: torch.Tensor | np.ndarray, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        """Rows of ``ids`` (1-D int, any order, duplicates fine), shape ``(len(ids), dim)``, on ``device``.

        ``out[i]`` is the feature row of vertex ``ids[i]``; ``device`` is the
        store's (default) or the host; ``dtype`` casts there after the copy.
        Safe to use on the calling thread's current stream when it returns.
        """
        return self.gather_landing(ids, device, dtype).wait()

    def gather_landing(self, ids: torch.Tensor | np.ndarray, device: str | torch.device | None = None,
                       dtype: torch.dtype | None = None) -> Gathered:
        """:meth:`gather` without waiting: the consumer calls ``.wait()`` where it starts to use the rows."""
        dev = torch.device(device) if device is not None else self.device
        if dev != self.device and dev.type != "cpu":
            raise StoreError(f"this store gathers to {self.device} or the host, not {dev}")
        if dev != self.device or not self.memory.accelerated:
            return Gathered(self._decoded(self._gather_host(self._host_ids(ids)), dtype), None)
        return self._gather_device(ids, dtype)

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

    @contextlib.contextmanager
    def _readers(self, groups: list) -> Iterator[Callable[[int], Tier]]:
        """Who reads each bin in this gather: its tier, or the tier's reader for this gather (tiers with
        ``per_gather``: every one is asked on every gather, with its groups, maybe none)."""
        if not self._sessions:
            yield self._tier_at.__getitem__
            return
        with contextlib.ExitStack() as stack:
            swap = {t: stack.enter_context(t.gathering([(b, r) for b, _, r in groups if self._tier_at[b] is t]))
                    for t in self._sessions}
            yield lambda b: swap.get(self._tier_at[b]) or self._tier_at[b]

    def _gather_host(self, ids_t: torch.Tensor) -> torch.Tensor:
        """Host result as stored, page-aligned, so that O_DIRECT reads of SSD rows land in it."""
        n = ids_t.numel()
        out_np = self._results.empty(n, self.row_bytes)  # a freed result's pages, already faulted in
        out = torch.from_numpy(out_np.view(self.dtype_np).reshape(n, self.dim)).view(self.storage_dtype)
        groups = list(self._groups(ids_t))
        with self._readers(groups) as reader:
            for t, mine in _by_tier([(reader(b), (b, r, out, pos)) for b, pos, r in groups]):
                t.read_many(mine)  # one call per tier: an SSD tier reads all its bins at once
        return out

    def _gather_device(self, ids: torch.Tensor | np.ndarray, dtype: torch.dtype | None) -> Gathered:
        """Assemble on the device (see the module docstring): index metadata up once, host rows up once."""
        mem = self.memory
        with self.transfer.batch() as tb:
            ids_t = self._host_ids(ids, tb)
            n = ids_t.numel()
            out = tb.empty((n, self.dim), self.storage_dtype)
            groups = list(self._groups(ids_t))
            with self._readers(groups) as reader:  # a per-gather reader ends once its rows are in the staging
                lands: dict[str, list] = {ON_DEVICE: [], INTO_DEVICE: []}
                staged: list = []
                for b, pos, r in groups:
                    t = reader(b)
                    lands.get(t.lands, staged).append((t, b, pos, r))
                on_dev = lands[ON_DEVICE]
                n_host = sum(p.numel() for _, _, p, _ in staged)
                # one pinned index buffer up: device groups' positions and rows, then the staged rows' positions
                parts = [x for _, _, p, r in on_dev for x in (p, r)] + [p for _, _, p, _ in staged]
                idx = None
                if parts:
                    ibuf = tb.staging("index", (sum(x.numel() for x in parts),), torch.int64)
                    torch.cat(parts, out=ibuf)
                    idx = tb.to_device(ibuf)
                at = 0
                for t, b, pos, _ in on_dev:  # launched first: the device works while the host gathers
                    c = pos.numel()
                    t.read(b, idx[at + c:at + 2 * c], out, idx[at:at + c])
                    at += 2 * c
                if n_host:
                    hbuf = tb.staging("rows", (n_host, self.dim), self.storage_dtype)
                    h, calls = 0, []
                    for t, b, pos, r in staged:
                        c = pos.numel()
                        calls.append((t, (b, r, hbuf[h:h + c], None)))
                        h += c
                    for t, mine in _by_tier(calls):  # an SSD tier reads all its bins at once
                        t.read_many(mine)
                    out.index_copy_(0, idx[at:at + n_host], tb.to_device(hbuf))
                for t, b, pos, r in lands[INTO_DEVICE]:  # reads into device memory, scattered there
                    t.read(b, r, out, pos)
            # decoded here, on the device: the rows crossed PCIe in their stored (smaller) type
            result = tb.cast(out, dtype) if self.codec is None else tb.keep(mem.adopt(self._decoded(out, dtype)))
        for t in self.tiers:
            for c in t.counters.values():
                if len(c.pending) > _PENDING:
                    c.resolve(mem, keep=_PENDING // 2)
        return Gathered(result, tb.landing)

    def close(self) -> None:
        """Close every tier (this store's and those of stores composed from it or it from); idempotent."""
        owned = _distinct(self._owned)
        self._owned.clear()
        for t in owned:
            t.close()

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _by_tier(calls: list) -> list[tuple[Tier, list]]:
    """``(tier, group)`` pairs gathered per tier, tiers in first-seen order."""
    per: dict[int, tuple[Tier, list]] = {}
    for t, g in calls:
        per.setdefault(id(t), (t, []))[1].append(g)
    return list(per.values())


def _distinct(tiers: list[Tier]) -> list[Tier]:
    seen: set[int] = set()
    return [t for t in tiers if not (id(t) in seen or seen.add(id(t)))]


__all__ = ["FeatureStore"]
