"""Batches ready to train: sampled, their feature rows gathered and on the training device, prefetched.

A background thread (:class:`Prefetcher`) samples the next batches and gathers
their rows into a bounded queue while the current batch trains;
:func:`preparer` turns a :class:`~training.sampler.SampledBatch` into a
:class:`Prepared` (features cast to float32 on the device, labels and
degrees looked up where the batch was sampled). :func:`sampling` decides
where the graph is sampled (:func:`training.devices.sampling_device`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from iostack.transfer import Batch, CudaMemory, DeviceMemory, Landing, Transfer
from training.batches import BatchSource, LocalBatchSource
from training.data import Dataset
from training.devices import sampling_device
from training.features import FeatureSource
from training.sampler import NeighborSampler, SampledBatch

if TYPE_CHECKING:
    from training.distributed import World




@dataclass
class Prepared:
    """A batch ready to train: sampled, features gathered (float32), labels and degrees looked up.

    Its tensors are on the training device once :meth:`wait` has returned
    (on a GPU: the default stream waits for the copy stream's event).
    """

    batch: SampledBatch
    x: Tensor
    y: Tensor
    deg: Tensor | None
    sample_s: float
    gather_s: float
    tiers: dict[str, tuple[int, int]]
    landings: tuple[Landing | None, ...] = ()
    #: seconds the gather waited for the node's other ranks to read their share of its SSD pages
    share_wait_s: float = 0.0

    def wait(self) -> Prepared:
        for landing in self.landings:
            if landing is not None:
                landing.wait()
        return self


class Prefetcher:
    """Samples and gathers the batches of ``batches`` ``depth`` ahead on a background thread.

    ``get()`` returns the next :class:`Prepared` (``None`` after the last) and how many
    seconds it blocked. ``depth == 0`` prepares inline in ``get()``. Errors in the
    thread are raised by ``get()``. Always ``close()`` (joins the thread). With a
    ``transfer`` on a GPU the thread makes the training device current (a new
    thread starts on device 0) and runs all its device work on its own copy stream.
    """

    _END = object()

    def __init__(self, batches: Iterator[SampledBatch], prepare: Callable[[SampledBatch, float], Prepared],
                 depth: int, transfer: Transfer | None = None) -> None:
        self._it = batches
        self._prepare = prepare
        self._depth = depth
        self._transfer = transfer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._q: queue.Queue = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._run, name="moment-prefetch", daemon=True)
            self._thread.start()

    def _next(self) -> Prepared | object:
        t0 = time.perf_counter()
        try:
            b = next(self._it)
        except StopIteration:
            return self._END
        return self._prepare(b, time.perf_counter() - t0)

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            if self._transfer is None:
                self._loop()
                return
            self._transfer.memory.set_device()
            with self._transfer.on_thread_stream():
                try:
                    self._loop()
                finally:
                    self._transfer.finish_thread()  # a later thread's stream must not overtake this one's work
        except BaseException as exc:  # handed to the trainer, which raises it
            self._put(exc)

    def _loop(self) -> None:
        while not self._stop.is_set():
            item = self._next()
            if not self._put(item) or item is self._END:
                return

    def get(self) -> tuple[Prepared | None, float]:
        t0 = time.perf_counter()
        if self._thread is None:
            item = self._next()
            return (None if item is self._END else item), 0.0
        item = self._q.get()
        waited = time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise item
        return (None if item is self._END else item), waited

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


@dataclass(frozen=True)
class Lookups:
    """Per-vertex tables a batch needs besides features: labels, and degrees for global GCN norm.

    Host tensors always; device copies too when the graph is sampled on the
    device (then nothing of a batch goes back to the host for them).
    """

    labels: Tensor
    indptr: Tensor | None
    labels_dev: Tensor | None = None
    indptr_dev: Tensor | None = None


def preparer(features: FeatureSource, lookups: Lookups, normalize: bool, *, node_shared: bool = False
             ) -> Callable[[SampledBatch, float], Prepared]:
    """A batch's preparation: its rows gathered (float32, on the device), labels and degrees looked up.

    ``node_shared``: the training steps' preparation, whose SSD reads the
    store shares with the node's other ranks (:mod:`training.nodereads`);
    every rank of the node must then prepare the same number of batches.
    """
    transfer = features.transfer
    shared = getattr(getattr(features, "store", None), "node_shared_reads", None) if node_shared else None
    extra = {"node_shared": True} if shared is not None else {}

    def prepare(b: SampledBatch, sample_s: float) -> Prepared:
        t0 = time.perf_counter()
        before = features.totals()
        wait0 = shared.wait_s if shared is not None else 0.0
        gathered = features.gather_landing(b.n_id, dtype=torch.float32, **extra)  # cast on the device, after the copy
        after = features.totals()
        gather_s = time.perf_counter() - t0
        waited = shared.wait_s - wait0 if shared is not None else 0.0
        with transfer.batch() as tb:
            x = tb.keep(gathered.rows)
            if normalize:  # row-normalised features (Kipf & Welling's preprocessing), per gathered row
                x = tb.keep(transfer.memory.adopt(x / x.sum(1, keepdim=True).clamp(min=1.0)))
            mem = transfer.memory
            if lookups.labels_dev is not None and b.n_id.device == lookups.labels_dev.device:
                # sampled on the device: look up there too, nothing goes back to the host
                y = tb.keep(mem.adopt(lookups.labels_dev.index_select(0, b.n_id[: b.batch_size])))
                ptr = lookups.indptr_dev
                deg = None if ptr is None else tb.keep(mem.adopt((ptr[b.n_id + 1] - ptr[b.n_id]).float()))
            else:
                nid = tb.to_host(b.n_id)
                y = _up(tb, lookups.labels.index_select(0, nid[: b.batch_size]), "labels")
                ptr = lookups.indptr
                deg = None if ptr is None else _up(tb, (ptr[nid + 1] - ptr[nid]).float(), "deg")
            edge_index = _up(tb, b.edge_index, "edges")
        tiers = {k: (r - before.get(k, (0, 0))[0], n - before.get(k, (0, 0))[1]) for k, (r, n) in after.items()}
        batch = SampledBatch(b.n_id, b.batch_size, edge_index, b.num_sampled_nodes, b.num_sampled_edges)
        return Prepared(batch, x, y, deg, sample_s, gather_s, tiers, (gathered.landing, tb.landing), waited)

    return prepare


def _up(tb: Batch, t: Tensor, name: str) -> Tensor:
    """``t`` on the training device: a host tensor through pinned staging (one asynchronous copy)."""
    if not tb.memory.accelerated or tb.memory.kind_of(t) == "device":
        return tb.keep(t) if tb.memory.accelerated else t
    stage = tb.staging(name, tuple(t.shape), t.dtype)
    return tb.to_device(stage.copy_(t))


def sampling(config: Any, ds: Dataset, labels: np.ndarray, memory: DeviceMemory
             ) -> tuple[torch.device, str, Lookups]:
    """Where this rank samples (see :func:`training.devices.sampling_device`) and its per-vertex lookups."""
    indptr = _readonly_tensor(np.asarray(ds.indptr, np.int64))
    labels_t = _readonly_tensor(np.asarray(labels, np.int64))
    gcn_global = config.model == "gcn" and config.gcn_norm == "global"
    if config.server:
        return torch.device("cpu"), "in the sampling server", Lookups(labels_t, indptr if gcn_global else None)
    dev = memory.device if isinstance(memory, CudaMemory) else torch.device("cpu")
    # the CSR, the vertex maps of the training and the evaluation sampler, the labels (int64 each)
    need = indptr.numel() * 8 + int(np.asarray(ds.indices[:1]).itemsize) * ds.num_edges + 3 * 8 * ds.num_nodes
    free = memory.free_bytes() if dev.type == "cuda" else None
    where, why = sampling_device(config.sample_on, dev, need, free)
    lookups = Lookups(labels_t, indptr if gcn_global else None)
    if where.type == "cuda":
        lookups = Lookups(labels_t, lookups.indptr, labels_t.to(where),
                          indptr.to(where) if gcn_global else None)
    return where, why, lookups


def _readonly_tensor(a: np.ndarray) -> Tensor:
    """A tensor over a read-only array (a memory map): fine here, nothing writes to these tables."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def csr_on(ds: Dataset, device: torch.device) -> tuple[Tensor, Tensor]:
    """The graph's CSR as tensors on ``device`` (copied up once when that is a GPU)."""
    indptr, indices = _readonly_tensor(np.asarray(ds.indptr)), _readonly_tensor(np.asarray(ds.indices))
    if device.type == "cpu":
        return indptr, indices
    return indptr.to(device, torch.int64), indices.to(device)


def open_source(config: Any, train_idx: np.ndarray, world: World, csr: tuple[Tensor, Tensor]
                ) -> BatchSource:
    """This rank's batches: from the sampling server the config names, else sampled here on ``csr``."""
    if config.server:
        from training.serve import RemoteBatchSource  # only with a server: the module pulls in rpc

        return RemoteBatchSource(config.server, rank=world.rank, world_size=world.size,
                                 batch_size=config.batch_size, fanouts=config.fanouts, seed=config.seed,
                                 timeout_s=config.server_timeout_s)
    sampler = NeighborSampler(*csr, config.fanouts, seed=config.seed)
    return LocalBatchSource(sampler, train_idx, config.batch_size, rank=world.rank, world_size=world.size,
                            seed=config.seed)


__all__ = ["Lookups", "Prefetcher", "Prepared", "csr_on", "open_source", "preparer", "sampling"]
