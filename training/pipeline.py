"""Batches ready to train: sampled, their feature rows gathered and on the training device, prefetched.

A background thread (:class:`Prefetcher`) samples the next batches and gathers
their rows into a bounded queue while the current batch trains;
:func:`preparer` turns a :class:`~training.sampler.SampledBatch` into a
:class:`Prepared` (features cast to the model's type on the device, labels and
degrees looked up where the batch was sampled). :func:`sampling` decides
where the graph is sampled (:func:`training.devices.sampling_device`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from iostack.transfer import Batch, CudaMemory, DeviceMemory, Landing, Transfer
from momentbase.units import format_size
from training.batches import BATCH_SOURCES, BatchSource, SourceRequest
from training.data import Dataset
from training.devices import sampling_device
from training.diskcsr import DiskNeighbours, open_disk_csr
from training.errors import TrainError
from training.features import FeatureSource
from training.sampler import SampledBatch
from training.specs import SamplingSpec
from training.vocab import GRAPH_ON

if TYPE_CHECKING:
    from training.distributed import World




@dataclass
class Prepared:
    """A batch ready to train: sampled, features gathered (the model's type), labels and degrees looked up.

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
    """Samples and gathers the batches of ``batches`` ``depth`` ahead on background threads.

    ``get()`` returns the next :class:`Prepared` (``None`` after the last) and how many
    seconds it blocked. ``depth == 0`` prepares inline in ``get()``. Errors in a
    thread are raised by ``get()``. Always ``close()`` (joins the threads; they stay
    until then, after the last batch too). With a ``transfer`` on a GPU the thread
    makes the training device current (a new thread starts on device 0) and runs
    all its device work on its own copy stream.

    ``workers > 1`` threads prepare batches side by side (``prepare`` must allow
    it; host gathers only): worker ``k`` takes batches ``k, k + workers, ...``,
    draws them from ``batches`` in turn (the sampler's stream stays one
    sequence, the same batches as one worker) and hands them over in order, so
    one batch's gather can wait on the disk or on other ranks while the next
    is sampled and assembled. Up to ``depth + workers`` batches are then held
    besides the one training.
    """

    _END = object()

    def __init__(self, batches: Iterator[SampledBatch], prepare: Callable[[SampledBatch, float], Prepared],
                 depth: int, transfer: Transfer | None = None, workers: int = 1) -> None:
        self._it = batches
        self._prepare = prepare
        self._depth = depth
        self._transfer = transfer
        #: the device memory the batches land in (None: no transfer given)
        self.memory = None if transfer is None else transfer.memory
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []  # none: prepared inline in get()
        self._turn = threading.Condition()
        self._sampled = self._delivered = 0  # batches drawn from ``batches``, and put on the queue, so far
        self._ended = False
        if int(workers) < 1 or (int(workers) > 1 and transfer is not None and transfer.accelerated):
            raise ValueError(f"prefetch workers: {workers}; expected 1, or more for host gathers only")
        if depth > 0:
            self._q: queue.Queue = queue.Queue(maxsize=depth)
            n = int(workers)
            for k in range(n):
                name = "moment-prefetch" if k == 0 else f"moment-prefetch-{k}"
                t = threading.Thread(target=self._run, args=(k, n), name=name, daemon=True)
                self._workers.append(t)
            for t in self._workers:
                t.start()

    def _next(self) -> Prepared | object:
        t0 = time.perf_counter()
        try:
            b = next(self._it)
        except StopIteration:
            return self._END
        return self._prepare(b, time.perf_counter() - t0)

    def _wait_turn(self, attr: str, s: int) -> bool:
        """Under ``self._turn``: wait until counter ``attr`` reaches ``s``; False when stopped or ended."""
        while getattr(self, attr) != s:
            if self._stop.is_set() or (self._ended and attr == "_sampled"):
                return False
            self._turn.wait(0.1)
        return not self._stop.is_set()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, k: int = 0, n: int = 1) -> None:
        self._work(k, n)
        # Held until close(), not ended with the batches: a thread's exit frees its OpenMP team, and
        # libgomp then counts no more busy threads than cores and lets the training thread's team
        # spin-wait at every barrier instead of sleeping (GOMP_SPINCOUNT's full count, not the throttled
        # one). On cores shared with other work each barrier then waits out a preempted spinner: the
        # epoch's last `depth` steps took 0.8 s (0.2-1.2) against 0.1 s for the others and with this wait
        # (docs/design-notes.md, "The epoch's slow tail").
        self._stop.wait()

    def _work(self, k: int, n: int) -> None:
        """Worker ``k`` of ``n``: its batches prepared and handed over, or its error."""
        try:
            if self._transfer is None:
                self._loop(k, n)
            else:
                self._transfer.memory.set_device()
                with self._transfer.on_thread_stream():
                    try:
                        self._loop(k, n)
                    finally:
                        self._transfer.finish_thread()  # a later thread's stream must not overtake this one's work
        except BaseException as exc:  # handed to the trainer, which raises it
            self._put(exc)

    def _loop(self, k: int = 0, n: int = 1) -> None:
        s = k
        while not self._stop.is_set():
            with self._turn:  # batches are drawn in order: the sampler's stream is one sequence
                if not self._wait_turn("_sampled", s) or self._ended:
                    return
            # this worker's turn until it counts the draw: the others wait for their own turns
            t0 = time.perf_counter()
            try:
                b = next(self._it)
            except StopIteration:
                b = self._END
            except BaseException as exc:
                b = exc
            sample_s = time.perf_counter() - t0
            last = b is self._END or isinstance(b, BaseException)
            with self._turn:
                self._ended = self._ended or last
                self._sampled += 1
                self._turn.notify_all()
            item = b
            if not last:  # (not self._ended: a later worker may have drawn the end meanwhile)
                try:
                    item = self._prepare(b, sample_s)
                except BaseException as exc:
                    item = exc
            with self._turn:  # and handed over in order
                if not self._wait_turn("_delivered", s):
                    return
            ok = self._put(item)
            with self._turn:
                self._delivered += 1
                self._turn.notify_all()
            if not ok or item is self._END or isinstance(item, BaseException):
                return
            s += n

    def get(self) -> tuple[Prepared | None, float]:
        t0 = time.perf_counter()
        if not self._workers:
            item = self._next()
            return (None if item is self._END else item), 0.0
        item = self._q.get()
        waited = time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise item
        return (None if item is self._END else item), waited

    def close(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join()
        self._workers = []
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


def prefetch_workers(features: FeatureSource, node_shared: bool) -> int:
    """Threads that prepare a run's training batches: 2 where the node's ranks share their SSD reads and the
    gathers run on the host (a placement's store), else 1.

    With node-shared reads a step's gather waits twice for the node's other
    ranks (the exchange of row ids, the barrier after the reads). A second
    thread samples, copies and assembles the next batch during those waits,
    and the disk gets the next step's reads sooner. Measured on one disk
    (``docs/design-notes.md``, "Pipelined prefetch"): two ranks with shared
    reads 1.16x faster with two threads than with one (median of 6
    interleaved runs); one rank, whose gather never waits on a peer, no
    faster, so it keeps one thread and one batch less in memory. Device
    gathers keep one thread: a second stream per thread has not run on a GPU.
    """
    ok = getattr(features, "concurrent_gathers", None)
    return 2 if node_shared and ok is not None and ok() else 1


def preparer(features: FeatureSource, lookups: Lookups, normalize: bool, *,
             concurrent: bool = False, dtype: torch.dtype = torch.float32) -> Callable[[SampledBatch, float], Prepared]:
    """A batch's preparation: its rows gathered (as ``dtype``, on the device), labels and degrees looked up.

    ``dtype``: the rows' type for the model, cast (or decoded) where they land: float32, or under mixed
    precision the rows' stored type (:meth:`training.precision.Precision.rows_dtype`).

    ``features`` composed with node-shared SSD reads (the training steps'
    store, :mod:`training.nodeshare`): every rank of the node must then
    prepare the same number of batches, and each batch says how long its
    gather waited for the others.
    ``concurrent``: it runs on several threads at once (a :class:`Prefetcher`
    with ``workers > 1``; ``features`` must allow it, see
    :func:`prefetch_workers`), so a batch's tier figures are counted from its
    ids, not from the store's running totals, which the other thread moves too.
    """
    transfer = features.transfer
    shared = getattr(features, "node_shared_reads", None)

    def prepare(b: SampledBatch, sample_s: float) -> Prepared:
        t0 = time.perf_counter()
        before = {} if concurrent else features.totals()
        gathered = features.gather_landing(b.n_id, dtype=dtype)  # cast on the device, after the copy
        after = features.tier_rows(b.n_id) if concurrent else features.totals()
        gather_s = time.perf_counter() - t0
        waited = shared.last_wait_s if shared is not None else 0.0
        with transfer.batch() as tb:
            x = tb.keep(gathered.rows)
            if normalize:  # row-normalised features (Kipf & Welling's preprocessing), per gathered row
                # summed in float32: a float16 row's sum may pass 65504, a bfloat16 one keeps 8 bits
                xs = x.float()
                x = tb.keep(transfer.memory.adopt((xs / xs.sum(1, keepdim=True).clamp(min=1.0)).to(x.dtype)))
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
    """``t`` on the training device: a host tensor through pinned staging (one asynchronous copy), one on
    another GPU (a batch a sampling worker served from its own) copied across."""
    mem = tb.memory
    if not mem.accelerated or mem.is_local(t):
        return tb.keep(t) if mem.accelerated else t
    if mem.kind_of(t) == "device":
        return tb.to_device(t)
    stage = tb.staging(name, tuple(t.shape), t.dtype)
    return tb.to_device(stage.copy_(t))


def sampling(spec: SamplingSpec, ds: Dataset, labels: np.ndarray, memory: DeviceMemory, *,
             global_degrees: bool = False) -> tuple[torch.device, str, Lookups]:
    """Where this rank samples (see :func:`training.devices.sampling_device`) and its per-vertex lookups.

    ``global_degrees``: the model reads every vertex's whole-graph degree
    (:attr:`training.specs.ModelSpec.global_degrees`), so the lookups hold the CSR's ``indptr``.
    """
    indptr = _readonly_tensor(np.asarray(ds.indptr, np.int64))
    labels_t = _readonly_tensor(np.asarray(labels, np.int64))
    gcn_global = global_degrees
    if spec.server:
        return torch.device("cpu"), "in the sampling server", Lookups(labels_t, indptr if gcn_global else None)
    if spec.graph_on == "disk":  # the lists are read into host memory: sampled there
        why = f"--graph-on disk: the graph's neighbour lists are read from disk, adjacency cache " \
              f"{format_size(spec.graph_cache_bytes)}"
        return torch.device("cpu"), why, Lookups(labels_t, indptr if gcn_global else None)
    dev = memory.device if isinstance(memory, CudaMemory) else torch.device("cpu")
    # the CSR, the vertex maps of the training and the evaluation sampler, the labels (int64 each)
    need = indptr.numel() * 8 + int(np.asarray(ds.indices[:1]).itemsize) * ds.num_edges + 3 * 8 * ds.num_nodes
    free = memory.free_bytes() if dev.type == "cuda" else None
    where, why = sampling_device(spec.sample_on, dev, need, free)
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


def csr_on(ds: Dataset, device: torch.device, graph_on: str = "memory", cache_bytes: int = 0
           ) -> tuple[Tensor, Tensor | DiskNeighbours]:
    """The graph's CSR as tensors on ``device`` (copied up once when that is a GPU).

    ``graph_on="disk"``: ``indices`` is a :class:`training.diskcsr.DiskNeighbours`
    reading the lists from ``indices.npy`` (host sampling), with an adjacency
    cache of ``cache_bytes``; the caller closes it.

    Raises
    ------
    TrainError
        ``graph_on`` is not one of ``GRAPH_ON``.
    """
    if graph_on not in GRAPH_ON:
        raise TrainError(f"graph_on: expected one of {', '.join(GRAPH_ON)}, got {graph_on!r}")
    if graph_on == "disk":
        return open_disk_csr(ds, cache_bytes=cache_bytes)
    indptr, indices = _readonly_tensor(np.asarray(ds.indptr)), _readonly_tensor(np.asarray(ds.indices))
    if device.type == "cpu":
        return indptr, indices
    return indptr.to(device, torch.int64), indices.to(device)


def open_source(spec: SamplingSpec, seed: int, train_idx: np.ndarray, world: World,
                csr: tuple[Tensor, Tensor | DiskNeighbours], *, name: str | None = None) -> BatchSource:
    """This rank's batches from the source called ``name`` (:data:`~training.batches.BATCH_SOURCES`).

    Default: ``server`` when ``spec`` names a sampling server, else ``local`` (sampled here on ``csr``).
    ``seed``: the run's (:attr:`training.specs.RunSpec.seed`); batches depend on ``(seed, epoch, step)``.
    """
    request = SourceRequest(train_idx, csr, spec.batch_size, tuple(spec.fanouts), seed, world.rank, world.size,
                            spec.server, spec.server_timeout_s)
    return BATCH_SOURCES.get(name or ("server" if spec.server else "local"))(request)


__all__ = ["Lookups", "Prefetcher", "Prepared", "csr_on", "open_source", "prefetch_workers", "preparer", "sampling"]
