"""The data-parallel training loop: sampled batches, tiered features, pipelined, checkpointed.

(Over 600 lines: features, pipeline, devices and checkpoints still live here
until the planned split into modules and the move to DDP.)

:func:`train` runs :class:`TrainConfig` in this process. Under ``torchrun``
(``WORLD_SIZE > 1``) every process is one rank of a ``torch.distributed`` group
(``gloo`` on CPU, ``nccl`` on CUDA); without it a single process trains alone.

Semantics (see :mod:`training.batches`): at step ``s`` the world trains on the
global batch a single process would; rank ``r`` takes part ``r`` of it. Every rank
scales its summed loss by the *global* batch size and the gradients are
all-reduced by sum, by hand, in one flat buffer (a rank with an empty part still
joins with zeros), so ``N`` ranks train on exactly the seeds one process would.
With full neighbourhoods (fan-outs ``-1``) they reproduce one process up to float
rounding; with sampled fan-outs each rank draws its own neighbour samples (its
sampler stream is seeded per rank), so runs agree in distribution, not bit for bit.

Pipelining: a background thread samples the next batches and gathers their
feature rows (from a :class:`~iostack.store.FeatureStore` or an in-memory
tensor) into a bounded queue of ``prefetch`` batches while the current batch
trains. Each step's time is split into sample, gather (rows and bytes per tier,
from the store's counter deltas), compute, all-reduce and I/O wait (the time the
trainer blocked on the queue).

Devices (see :mod:`training.devices`): a rank trains on ``cuda:LOCAL_RANK``
(``cuda:0`` when the launcher shows it one GPU), or on the GPU at the PCI bus
address its partition of a partitioned GPU cache was planned for; it holds
only its own partition. Everything a batch needs reaches that device through
one :class:`~iostack.transfer.Transfer`: the prefetch thread makes the device
current and runs on its own copy stream (sampling, gathers, uploads from
pinned staging, the fp32 cast on the device), and the training step waits on
the batch's landings before using it. The graph is sampled on the GPU when it
fits there (``sample_on``), else on the host; the start record says which, and
why. Epoch records count the host→device copies by source memory
(``transfers``).

Evaluation: validation and test vertices are sampled with ``eval_fanouts``
(default: the training fan-outs; ``-1`` = full neighbourhoods), split over the
ranks, counts all-reduced. Train accuracy is measured on the training steps'
own outputs (dropout on).

Records (dicts) go to ``progress`` on every rank and, from rank 0, as JSON lines
to ``metrics_path``: ``kind`` ``"start"``, ``"step"``, ``"epoch"``. Times are
seconds, sizes bytes.

Checkpoints (``checkpoint_dir/checkpoint.pt``, written by rank 0 to a temporary
file then renamed) hold the model, the optimizer, the position (epoch, step),
the epoch's running sums, every rank's own RNG states (gathered to rank 0) and
the config; with ``resume`` a run continues from there exactly: batches depend
only on ``(seed, epoch, step)`` and each rank's dropout stream is its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from iostack.backends import BACKENDS
from iostack.transfer import (
    Batch,
    CudaMemory,
    DeviceMemory,
    Gathered,
    HostMemory,
    Landing,
    RowBuffers,
    Transfer,
    TransferCounts,
    memory_for,
)
from momentbase.errors import MomentError
from training.batches import BatchSource, LocalBatchSource, _mix, epoch_seeds
from training.data import Dataset, open_dataset
from training.devices import (
    SAMPLE_ON,
    bus_address_in,
    partition_of_rank,
    rank_device,
    sampling_device,
)
from training.errors import TrainingError
from training.exchange import PeerLostError
from training.models import build_model
from training.sampler import NeighborSampler, SampledBatch

__all__ = ["TrainConfig", "TrainError", "TrainResult", "train", "MemoryFeatures", "StoreFeatures",
           "Prefetcher", "CHECKPOINT_NAME"]

CHECKPOINT_NAME = "checkpoint.pt"

#: config fields a resumed run must share with the checkpoint (the rest may change, e.g. epochs)
_IDENTITY = ("model", "fanouts", "batch_size", "seed", "hidden", "heads", "out_heads", "gcn_norm",
             "normalize_features")

Progress = Callable[[dict], None]


class TrainError(TrainingError):
    """A training run that cannot start or continue: bad config, dataset, placement or checkpoint."""


@dataclass(frozen=True)
class TrainConfig:
    """What to train and how. Paths are strings; ``None`` means "not used".

    ``fanouts``: neighbours per hop, hop 1 first (``-1`` = all); one model layer per
    fan-out. ``hidden``/``heads``: ``None`` takes the model's default (SAGE/GCN 256,
    GAT 64 × 8). ``prefetch``: batches prepared ahead (0 = sample and gather inline).
    ``eval_every_epochs``: 0 = only after the last epoch. ``checkpoint_every_steps``:
    0 = only at epoch ends. ``backend``: the SSD read backend of the feature store
    (``auto``: chosen by the measurements in ``capacities``, a ``moment profile``
    file; see :func:`iostack.backends.choose_backend`). ``sample_on``: ``auto``
    samples on the GPU when the graph fits there, else on the host; ``cpu``;
    ``gpu`` (an error when it cannot). ``timeout_s``: how long a rank waits on
    the others in a step's collectives (and the feature exchange) before it
    stops with an error. ``exchange``, ``remote_cache`` (bytes; 0 = none),
    ``remote_cache_dir`` (an SSD directory for it instead of host memory): a
    placement sharded across nodes (see :mod:`training.sharded`).
    """

    dataset: str
    placement: str | None = None
    model: str = "sage"
    fanouts: tuple[int, ...] = (25, 10)
    eval_fanouts: tuple[int, ...] | None = None
    batch_size: int = 1024
    eval_batch_size: int = 4096
    epochs: int = 1
    lr: float = 0.003
    weight_decay: float = 0.0
    dropout: float = 0.5
    attn_dropout: float = 0.0
    hidden: int | None = None
    heads: int | None = None
    out_heads: int | None = None
    gcn_norm: str = "local"
    normalize_features: bool = False
    seed: int = 0
    prefetch: int = 2
    eval_every_epochs: int = 1
    metrics_path: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int = 0
    resume: bool = False
    server: str | None = None
    backend: str = "auto"
    server_timeout_s: float = 30.0
    sample_on: str = "auto"
    capacities: str | None = None
    timeout_s: float = 30.0
    exchange: str = "alltoall"
    remote_cache: int = 0
    remote_cache_dir: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fanouts", tuple(int(f) for f in self.fanouts))
        if self.eval_fanouts is not None:
            object.__setattr__(self, "eval_fanouts", tuple(int(f) for f in self.eval_fanouts))
        for fo, what in ((self.fanouts, "fanouts"), (self.eval_fanouts, "eval_fanouts")):
            if fo is not None and (not fo or any(f < -1 or f == 0 for f in fo)):
                raise TrainError(f"{what}: expected positive integers or -1 (all neighbours), got {list(fo)}")
        if self.eval_fanouts is not None and len(self.eval_fanouts) != len(self.fanouts):
            raise TrainError(f"eval_fanouts: need one per layer ({len(self.fanouts)}), got {list(self.eval_fanouts)}")
        for name in ("hidden", "heads", "out_heads"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise TrainError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        for name in ("batch_size", "eval_batch_size", "epochs"):
            if int(getattr(self, name)) < 1:
                raise TrainError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        for name in ("prefetch", "eval_every_epochs", "checkpoint_every_steps"):
            if int(getattr(self, name)) < 0:
                raise TrainError(f"{name}: expected a non-negative integer, got {getattr(self, name)}")
        if not 0 < self.lr < math.inf or not 0 <= self.weight_decay < math.inf:  # nan fails too
            raise TrainError(f"lr must be > 0 and weight_decay >= 0, got {self.lr} and {self.weight_decay}")
        if self.gcn_norm not in ("local", "global"):
            raise TrainError(f"gcn_norm: expected 'local' or 'global', got {self.gcn_norm!r}")
        if self.sample_on not in SAMPLE_ON:
            raise TrainError(f"sample_on: expected one of {', '.join(SAMPLE_ON)}, got {self.sample_on!r}")
        if self.backend not in BACKENDS:
            raise TrainError(f"backend: expected one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not 0 < self.timeout_s < math.inf:
            raise TrainError(f"timeout_s: expected a positive number of seconds, got {self.timeout_s}")
        if self.exchange not in ("alltoall", "rpc"):
            raise TrainError(f"exchange: expected 'alltoall' or 'rpc', got {self.exchange!r}")
        if int(self.remote_cache) < 0:
            raise TrainError(f"remote_cache: expected a size in bytes >= 0, got {self.remote_cache}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["fanouts"] = list(self.fanouts)
        d["eval_fanouts"] = None if self.eval_fanouts is None else list(self.eval_fanouts)
        return d


@dataclass(frozen=True)
class TrainResult:
    """What a run did: the trained model, this run's epoch records, where it resumed from."""

    model: torch.nn.Module
    epochs: tuple[dict, ...]
    resumed_from: tuple[int, int] | None
    world_size: int
    rank: int

    @property
    def final(self) -> dict | None:
        """The last epoch record of this run (``None`` if it ran no epoch)."""
        return self.epochs[-1] if self.epochs else None


# ----------------------------------------------------------------------------------------------
# features


class FeatureSource(Protocol):
    """Rows of the feature matrix by vertex id, with cumulative per-tier counters.

    ``transfer`` is the :class:`~iostack.transfer.Transfer` its rows (and the
    batch's other tensors) reach the training device through.
    """

    dim: int
    transfer: Transfer

    def gather(self, ids: Tensor) -> Tensor:
        """``[len(ids), dim]`` rows of ``ids`` (int64), in order."""
        ...

    def gather_landing(self, ids: Tensor, dtype: torch.dtype | None = None) -> Gathered:
        """The rows on the training device (cast to ``dtype`` there), to wait on where they are used."""
        ...

    def totals(self) -> dict[str, tuple[int, int]]:
        """Rows and bytes served so far, per tier."""
        ...

    def close(self) -> None: ...


class MemoryFeatures:
    """The whole feature matrix in host memory (tier ``"memory"``), indexed directly.

    On an accelerator the rows of a batch are gathered into pinned staging and
    copied up once, cast on the device.
    """

    def __init__(self, features: np.ndarray, transfer: Transfer | None = None) -> None:
        self._x = torch.from_numpy(np.array(features))  # a copy: the memmap's pages read once
        self.transfer = transfer if transfer is not None else Transfer()
        self.dim = int(self._x.shape[1])
        self._row_bytes = self.dim * self._x.element_size()
        self._rows = 0
        self._rows_out = RowBuffers(self.dim, self._x.dtype)

    def gather(self, ids: Tensor) -> Tensor:
        return self.gather_landing(ids).wait()

    def gather_landing(self, ids: Tensor, dtype: torch.dtype | None = None) -> Gathered:
        with self.transfer.batch() as tb:
            ids = tb.to_host(torch.as_tensor(ids)).to(torch.int64)
            self._rows += int(ids.numel())
            if self.transfer.accelerated:
                stage = tb.staging("rows", (ids.numel(), self.dim), self._x.dtype)
                x = tb.to_device(torch.index_select(self._x, 0, ids, out=stage), dtype)
            else:
                x = tb.cast(torch.index_select(self._x, 0, ids, out=self._rows_out.take(ids.numel())), dtype)
        return Gathered(x, tb.landing)

    def totals(self) -> dict[str, tuple[int, int]]:
        return {"memory": (self._rows, self._rows * self._row_bytes)}

    def memory_bytes(self) -> dict[str, int]:
        return {"host": self._x.numel() * self._x.element_size()}

    def close(self) -> None:
        pass


class StoreFeatures:
    """Rows through an :class:`iostack.store.FeatureStore` (tiers ``gpu``, ``cpu``, ``ssd``)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.transfer = store.transfer
        self.dim = int(store.dim)

    def gather(self, ids: Tensor) -> Tensor:
        return self.store.gather(ids)

    def gather_landing(self, ids: Tensor, dtype: torch.dtype | None = None) -> Gathered:
        return self.store.gather_landing(ids, dtype=dtype)

    def totals(self) -> dict[str, tuple[int, int]]:
        return {k: (int(v["rows"]), int(v["bytes"])) for k, v in self.store.tier_stats().items()}

    def unlink_shared(self) -> None:
        self.store.unlink_shared()

    def memory_bytes(self) -> dict[str, int]:
        return self.store.memory_bytes()

    def close(self) -> None:
        self.store.close()


def open_features(ds: Dataset, placement_dir: str | None, backend: str = "auto", *,
                  memory: DeviceMemory | None = None, local_gpu_bins: Sequence[int] | None = None,
                  share_key: str | None = None, capacities: str | None = None) -> FeatureSource:
    """The dataset's features: through the placement's store, else in memory, served on ``memory``'s device.

    ``backend`` ``auto`` is chosen by measurement (``capacities``: a file of
    ``moment profile``); ``local_gpu_bins`` and ``share_key`` go to the store.
    """
    transfer = Transfer(memory if memory is not None else HostMemory())
    if placement_dir is None:
        if ds.features is None:
            raise TrainError(f"{ds.path}: the dataset has no features.npy and no --placement was given; "
                             "import features or pass a placement with SSD bins")
        return MemoryFeatures(ds.features, transfer)
    from iostack.placement import load_placement

    if not Path(placement_dir).is_dir():
        raise TrainError(f"{placement_dir}: no such placement directory (write one with `moment place`)")
    from training.place_run import check_placement_is_for

    placement = load_placement(placement_dir)
    check_placement_is_for(placement, placement_dir, ds)
    if placement.num_vertices != ds.num_nodes:
        raise TrainError(f"{placement_dir}: the placement holds {placement.num_vertices} vertices but the dataset "
                         f"{ds.path} has {ds.num_nodes}; place this dataset's features")
    store = open_store(placement, placement_dir, ds.features, backend, transfer=transfer,
                       local_gpu_bins=local_gpu_bins, share_key=share_key, capacities=capacities)
    if ds.features is not None and store.dim != ds.feature_dim:
        store.close()
        raise TrainError(f"{placement_dir}: bins hold rows of dim {store.dim}, the dataset's features have "
                         f"{ds.feature_dim}; place this dataset's features")
    return StoreFeatures(store)


def _feature_dtype(features: Any, ds: Dataset) -> str | None:
    """The type the feature rows are held in: the placement's bins (e.g. ``int8``), else the dataset's."""
    store = getattr(features, "store", None)
    held = getattr(store, "feature_dtype", None)
    return held if held is not None else ds.feature_dtype


def open_store(placement: Any, placement_dir: str | os.PathLike[str], features: np.ndarray | None,
               backend: str = "auto", *, transfer: Transfer, local_gpu_bins: Sequence[int] | None = None,
               share_key: str | None = None, capacities: str | None = None) -> Any:
    """A :class:`~iostack.store.FeatureStore` of ``placement`` on ``transfer``'s device, its backend chosen.

    ``backend`` ``auto`` is chosen by measurement (``capacities``: a file of
    ``moment profile``); ``features`` fill the cache tiers.
    """
    from iostack.backends import choose_backend
    from iostack.bins import bin_path
    from iostack.store import FeatureStore

    caps = None
    if capacities is not None and backend == "auto":
        from planner.capacities import load_capacities

        caps = load_capacities(capacities)
    choice = choose_backend(backend, cuda=isinstance(transfer.memory, CudaMemory), capacities=caps,
                            paths=[str(bin_path(placement_dir, b)) for b in placement.bins if b.kind == "ssd"])
    store = FeatureStore(placement, placement_dir, features=features, backend=choice.name,
                         memory=transfer.memory, local_gpu_bins=local_gpu_bins, share_key=share_key)
    store.notes.insert(0, f"SSD reads: {choice.name} ({choice.reason})")
    return store


def share_key_of(ds: Dataset, placement_dir: str) -> str:
    """A name for the node-shared host tiers of a placement: changes whenever their contents could.

    The placement's directory and index files (path, size, mtime) and the
    dataset's fingerprint: ranks of one run agree on it, a re-placed or
    re-imported dataset gets another.
    """
    import hashlib

    from training.data import fingerprint

    h = hashlib.sha1(str(Path(placement_dir).resolve()).encode())
    for name in ("placement.json", "bin_of.npy", "row_of.npy"):
        try:
            st = (Path(placement_dir) / name).stat()
            h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            h.update(name.encode())
    h.update(json.dumps(fingerprint(ds), sort_keys=True).encode())
    return h.hexdigest()[:20]


# ----------------------------------------------------------------------------------------------
# the pipeline


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
class _Lookups:
    """Per-vertex tables a batch needs besides features: labels, and degrees for global GCN norm.

    Host tensors always; device copies too when the graph is sampled on the
    device (then nothing of a batch goes back to the host for them).
    """

    labels: Tensor
    indptr: Tensor | None
    labels_dev: Tensor | None = None
    indptr_dev: Tensor | None = None


def _preparer(features: FeatureSource, lookups: _Lookups, normalize: bool
              ) -> Callable[[SampledBatch, float], Prepared]:
    transfer = features.transfer

    def prepare(b: SampledBatch, sample_s: float) -> Prepared:
        t0 = time.perf_counter()
        before = features.totals()
        gathered = features.gather_landing(b.n_id, dtype=torch.float32)  # cast on the device, after the copy
        after = features.totals()
        gather_s = time.perf_counter() - t0
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
        return Prepared(batch, x, y, deg, sample_s, gather_s, tiers, (gathered.landing, tb.landing))

    return prepare


def _up(tb: Batch, t: Tensor, name: str) -> Tensor:
    """``t`` on the training device: a host tensor through pinned staging (one asynchronous copy)."""
    if not tb.memory.accelerated or tb.memory.kind_of(t) == "device":
        return tb.keep(t) if tb.memory.accelerated else t
    stage = tb.staging(name, tuple(t.shape), t.dtype)
    return tb.to_device(stage.copy_(t))


# ----------------------------------------------------------------------------------------------
# distributed helpers


@dataclass(frozen=True)
class _World:
    rank: int
    size: int
    device: torch.device
    owns_group: bool
    local_rank: int = 0
    local_size: int = 1
    #: the placement's GPU bins this rank holds on its device (None: all of them)
    gpu_bins: tuple[int, ...] | None = None
    #: the group of the per-step collectives (short timeout); None: the default group
    group: Any = None

    def all_reduce(self, t: Tensor, op: str = "sum", during: str = "an all-reduce") -> Tensor:
        if self.size > 1:
            import torch.distributed as dist

            with _peer_errors(during):
                dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                                       "min": dist.ReduceOp.MIN}[op], group=self.group)
        return t

    def barrier(self) -> None:
        """Every rank here (the default group: its long timeout covers slow start-ups)."""
        if self.size > 1:
            import torch.distributed as dist

            with _peer_errors("waiting for the other ranks"):
                dist.barrier()

    def gather_objects(self, obj: Any, during: str = "gathering from every rank") -> list[Any]:
        """``obj`` of every rank, in rank order (every rank calls it)."""
        if self.size <= 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        with _peer_errors(during):
            dist.all_gather_object(out, obj)
        return out


@contextlib.contextmanager
def _peer_errors(during: str) -> Iterator[None]:
    """A collective that fails (a peer died, or hung past the timeout) as one clear error."""
    try:
        yield
    except RuntimeError as exc:
        from training.exchange import PeerLostError

        raise PeerLostError.of(exc, during) from None


def _data_parallel(model: torch.nn.Module, world: _World) -> torch.nn.Module:
    """``model`` under :class:`~torch.nn.parallel.DistributedDataParallel` on several ranks, else itself.

    On the world's step group (its short timeout: a dead peer fails a step,
    not torch's 30 minutes). DDP broadcasts rank 0's parameters on
    construction. Buffers are not broadcast each step: the models hold none
    that training changes. Checkpoints keep saving ``model``'s own state
    (no ``module.`` prefix), so they resume with or without DDP.
    """
    if world.size <= 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    with _peer_errors("setting up DistributedDataParallel"):
        return DistributedDataParallel(model, device_ids=[world.device] if world.device.type == "cuda" else None,
                                       process_group=world.group, broadcast_buffers=False)


def _partition(placement_dir: str | None, local_rank: int, local_size: int
               ) -> tuple[tuple[int, ...] | None, str | None]:
    """The GPU bins a rank holds and, for one partition of a partitioned cache, its planned GPU's bus address."""
    if placement_dir is None:
        return None, None
    from iostack.placement import load_placement

    try:
        bins = [b for b in load_placement(placement_dir).bins if b.kind == "gpu"]
    except (OSError, MomentError):
        return None, None  # open_features reports what is wrong with the placement
    mine = partition_of_rank([b.device for b in bins], local_rank, local_size)
    if len(bins) < 2 or len(mine) != 1:
        return tuple(bins[i].id for i in mine), None
    try:  # the plan's GPU of this partition, from the report `moment place` wrote
        report = json.loads((Path(placement_dir) / "place.json").read_text())["bins"][bins[mine[0]].id]
        bus = next((a for a in map(bus_address_in, report.get("stores") or ()) if a), None)
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        bus = None
    return (bins[mine[0]].id,), bus


def _world(placement_dir: str | None = None, memory: DeviceMemory | None = None, timeout_s: float | None = None
           ) -> _World:
    """This process's rank, its device (see :mod:`training.devices`) and its process groups.

    ``timeout_s``: the timeout of the per-step collectives' group (the
    default group keeps torch's, for start-up and checkpoints).
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    gpu_bins, bus = _partition(placement_dir, local, local_size)
    cuda = memory is None and torch.cuda.is_available()
    if memory is not None:
        device = memory.device
    elif cuda:
        device = rank_device(local, bus=bus)
        torch.cuda.set_device(device)  # before NCCL starts, and for every allocation that says just "cuda"
    else:
        device = torch.device("cpu")
    if size <= 1:
        return _World(0, 1, device, False, 0, 1, None)
    import torch.distributed as dist

    owns = False
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
        owns = True
    if device.type == "cpu":  # ranks on one host share its cores; oversubscribed OpenMP pools crawl
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
    group = None
    if timeout_s is not None:  # a dead or hung peer fails a step within the timeout, not torch's 30 minutes
        from datetime import timedelta

        group = dist.new_group(timeout=timedelta(seconds=float(timeout_s)))
    return _World(dist.get_rank(), dist.get_world_size(), device, owns, local, local_size, gpu_bins, group)


# ----------------------------------------------------------------------------------------------
# checkpoints


def _rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random streams (dropout draws from torch's; CUDA's on a GPU)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if device.type == "cuda" and isinstance(cuda, torch.Tensor):
        torch.cuda.set_rng_state(cuda, device)


def _restore_rng(saved: Any, world: _World) -> str:
    """Each rank's own streams from a checkpoint's ``rng`` (a list, one per rank; older ones hold rank 0's).

    Returns how: ``per-rank``, or why not (another world size restarts every rank from rank 0's).
    """
    if isinstance(saved, list):
        if len(saved) == world.size:
            _set_rng_state(saved[world.rank], world.device)
            return "per-rank"
        _set_rng_state(saved[0], world.device)
        return f"the checkpoint has {len(saved)} rank(s), this run {world.size}: every rank took rank 0's streams"
    _set_rng_state(saved, world.device)
    return "per-rank" if world.size == 1 else "an older checkpoint with rank 0's streams only"


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` to a temporary sibling, fsync, rename: a crash never leaves half a checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise TrainError(f"{path}: not a readable checkpoint ({exc}); delete it to start over") from None


# ----------------------------------------------------------------------------------------------
# the loop


class JsonlWriter:
    """Appends one JSON object per line, flushed per line (a resumed run continues the file)."""

    def __init__(self, path: str | os.PathLike) -> None:
        p = Path(path)
        if not p.parent.is_dir():
            raise TrainError(f"{path}: directory {p.parent} does not exist; create it or pick another metrics file")
        try:
            self._f = open(p, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close(), lives for the run
        except OSError as exc:
            raise TrainError(f"{path}: cannot write metrics there ({exc.strerror})") from None

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def rewind(self, epoch: int, step: int) -> None:
        """Drop the step and epoch records at or after ``(epoch, step)``: a run resumed from a
        checkpoint there redoes them, and the file should hold each once (written atomically)."""
        path = Path(self._f.name)
        self._f.close()
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut short by the crash that made this a resume
            if r.get("kind") == "step" and (r.get("epoch", 0), r.get("step", 0)) >= (epoch, step):
                continue
            if r.get("kind") == "epoch" and r.get("epoch", 0) >= epoch:
                continue
            kept.append(line)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
        os.replace(tmp, path)
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close()

    def close(self) -> None:
        self._f.close()


def _open_source(config: TrainConfig, train_idx: np.ndarray, world: _World, csr: tuple[Tensor, Tensor]
                 ) -> BatchSource:
    if config.server:
        from training.serve import RemoteBatchSource  # only with a server: the module pulls in rpc

        return RemoteBatchSource(config.server, rank=world.rank, world_size=world.size,
                                 batch_size=config.batch_size, fanouts=config.fanouts, seed=config.seed,
                                 timeout_s=config.server_timeout_s)
    sampler = NeighborSampler(*csr, config.fanouts, seed=config.seed)
    return LocalBatchSource(sampler, train_idx, config.batch_size, rank=world.rank, world_size=world.size,
                            seed=config.seed)


def _check_dataset(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    if ds.labels is None or ds.num_classes < 1:
        raise TrainError(f"{ds.path}: the dataset has no labels.npy; import one with labels to train on it")
    if ds.train_idx is None or ds.train_idx.shape[0] == 0:
        raise TrainError(f"{ds.path}: the dataset has no training split (train_idx.npy); import it with a split")
    train_idx = np.asarray(ds.train_idx, dtype=np.int64)
    if (np.asarray(ds.labels)[train_idx] < 0).any():
        raise TrainError(f"{ds.path}: some training vertices are unlabelled (label -1); fix the split")
    return train_idx, np.asarray(ds.labels)


class _Sums:
    """Running sums of an epoch (saved in mid-epoch checkpoints)."""

    KEYS = ("seeds", "loss_sum", "correct", "sample_s", "gather_s", "compute_s", "allreduce_s", "io_wait_s",
            "step_s", "prior_s")  # prior_s: time the epoch ran before the checkpoint it resumed from

    def __init__(self, state: dict | None = None) -> None:
        self.v: dict[str, float] = {k: 0.0 for k in self.KEYS}
        self.tiers: dict[str, list[int]] = {}
        if state:
            self.v.update(state["v"])
            self.tiers = {k: list(x) for k, x in state["tiers"].items()}

    def state(self) -> dict:
        return {"v": dict(self.v), "tiers": {k: list(x) for k, x in self.tiers.items()}}


def train(config: TrainConfig, progress: Progress | None = None, *, memory: DeviceMemory | None = None
          ) -> TrainResult:
    """Train ``config`` in this process (one rank under ``torchrun``); see the module doc.

    ``memory``: the device memory to train on instead of this rank's CUDA
    device or the host (tests pass a fake accelerator).
    """
    ds = open_dataset(config.dataset, validate=False)
    train_idx, labels = _check_dataset(ds)
    world = _world(config.placement, memory, config.timeout_s)
    if memory is None:
        memory = memory_for(world.device)
    try:
        return _train(config, ds, train_idx, labels, world, memory, progress)
    finally:
        if world.owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()


def _sharded(placement_dir: str | None) -> bool:
    from training.sharded import is_sharded

    return is_sharded(placement_dir)


def _open_sharded(config: TrainConfig, ds: Dataset, world: _World, memory: DeviceMemory) -> FeatureSource:
    """This node's shard of a placement sharded across nodes (:mod:`training.sharded`)."""
    from training.sharded import Peers, ShardedOptions, open_sharded

    options = ShardedOptions(config.exchange, config.timeout_s, int(config.remote_cache), config.remote_cache_dir)
    peers = Peers.from_env(world.rank, world.size, world.local_rank, world.local_size)
    return open_sharded(ds, config.placement, peers, options, transfer=Transfer(memory), open_store=open_store,
                        share_key=lambda d: share_key_of(ds, str(d)),
                        local_gpu_bins=world.gpu_bins if world.size > 1 else None, backend=config.backend,
                        capacities=config.capacities)


def _sampling(config: TrainConfig, ds: Dataset, labels: np.ndarray, memory: DeviceMemory
              ) -> tuple[torch.device, str, _Lookups]:
    """Where this rank samples (see :func:`training.devices.sampling_device`) and its per-vertex lookups."""
    indptr = _readonly_tensor(np.asarray(ds.indptr, np.int64))
    labels_t = _readonly_tensor(np.asarray(labels, np.int64))
    gcn_global = config.model == "gcn" and config.gcn_norm == "global"
    if config.server:
        return torch.device("cpu"), "in the sampling server", _Lookups(labels_t, indptr if gcn_global else None)
    dev = memory.device if isinstance(memory, CudaMemory) else torch.device("cpu")
    # the CSR, the vertex maps of the training and the evaluation sampler, the labels (int64 each)
    need = indptr.numel() * 8 + int(np.asarray(ds.indices[:1]).itemsize) * ds.num_edges + 3 * 8 * ds.num_nodes
    free = memory.free_bytes() if dev.type == "cuda" else None
    where, why = sampling_device(config.sample_on, dev, need, free)
    lookups = _Lookups(labels_t, indptr if gcn_global else None)
    if where.type == "cuda":
        lookups = _Lookups(labels_t, lookups.indptr, labels_t.to(where),
                           indptr.to(where) if gcn_global else None)
    return where, why, lookups


def _readonly_tensor(a: np.ndarray) -> Tensor:
    """A tensor over a read-only array (a memory map): fine here, nothing writes to these tables."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def _csr_on(ds: Dataset, device: torch.device) -> tuple[Tensor, Tensor]:
    """The graph's CSR as tensors on ``device`` (copied up once when that is a GPU)."""
    indptr, indices = _readonly_tensor(np.asarray(ds.indptr)), _readonly_tensor(np.asarray(ds.indices))
    if device.type == "cpu":
        return indptr, indices
    return indptr.to(device, torch.int64), indices.to(device)


def _train(config: TrainConfig, ds: Dataset, train_idx: np.ndarray, labels: np.ndarray, world: _World,
           memory: DeviceMemory, progress: Progress | None) -> TrainResult:
    metrics_file = JsonlWriter(config.metrics_path) if world.rank == 0 and config.metrics_path else None

    def emit(rec: dict) -> None:
        rec = {"rank": world.rank, "world_size": world.size, **rec}
        if metrics_file is not None:
            metrics_file.write(rec)
        if progress is not None:
            progress(rec)

    features: FeatureSource | None = None
    source: BatchSource | None = None
    try:
        if _sharded(config.placement):
            features = _open_sharded(config, ds, world, memory)
        else:
            features = open_features(ds, config.placement, config.backend, memory=memory,
                                     local_gpu_bins=world.gpu_bins if world.size > 1 else None,
                                     share_key=share_key_of(ds, config.placement)
                                     if config.placement and world.local_size > 1 else None,
                                     capacities=config.capacities)
        if world.size > 1 and world.local_size > 1 and hasattr(features, "unlink_shared"):
            world.barrier()  # every rank of the node has mapped the shared tiers: no name need stay
            features.unlink_shared()
        predictor = _Predictor.for_run(config, features, ds)
        sample_dev, sample_why, lookups = _sampling(config, ds, labels, memory)
        csr = _csr_on(ds, sample_dev)
        source = _open_source(config, train_idx, world, csr)
        depth = config.prefetch
        if config.model != "gat" and config.attn_dropout:
            raise TrainError("attn_dropout applies to the GAT model only")
        torch.manual_seed(config.seed)  # identical initial parameters on every rank
        model = build_model(config.model, features.dim, ds.num_classes, len(config.fanouts), hidden=config.hidden,
                            heads=config.heads, out_heads=config.out_heads, dropout=config.dropout,
                            attn_dropout=config.attn_dropout if config.model == "gat" else None,
                            norm=config.gcn_norm if config.model == "gcn" else None).to(world.device)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
        start_epoch, start_step, sums_state, resumed, rng_note = 0, 0, None, None, None
        ckpt_path = Path(config.checkpoint_dir) / CHECKPOINT_NAME if config.checkpoint_dir else None
        if config.resume and ckpt_path is None:
            raise TrainError("resume needs a checkpoint directory (--checkpoint DIR)")
        if ckpt_path is not None:
            # a checkpoint directory that cannot be made fails now, not after the first epoch
            try:
                ckpt_path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TrainError(f"checkpoint directory {ckpt_path.parent}: cannot create it "
                                 f"({exc.strerror or exc}); choose another --checkpoint") from None
        if config.resume and ckpt_path.exists():
            ck = load_checkpoint(ckpt_path)
            if not isinstance(ck, dict) or not {"config", "model", "optimizer", "epoch", "step", "rng"} <= set(ck):
                raise TrainError(f"{ckpt_path}: not a Moment training checkpoint; delete it or choose another "
                                 "--checkpoint directory")
            for key in _IDENTITY:
                was = ck["config"].get(key)
                now = config.to_dict()[key]
                if was != now:
                    raise TrainError(f"{ckpt_path}: written by a run with {key}={was!r}, this run has {now!r}; "
                                     "use the same settings or another checkpoint directory")
            try:
                model.load_state_dict(ck["model"])
                optimizer.load_state_dict(ck["optimizer"])
            except (RuntimeError, ValueError, KeyError) as exc:
                why = next((ln.strip() for ln in str(exc).splitlines() if "mismatch" in ln or "Missing" in ln),
                           str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                raise TrainError(f"{ckpt_path}: does not fit this model and dataset ({why[:160]}); "
                                 "it was written for another dataset? use another --checkpoint directory") from None
            for group in optimizer.param_groups:  # what this run asks for, not what the checkpoint had
                group["lr"], group["weight_decay"] = config.lr, config.weight_decay
            start_epoch, start_step, sums_state = ck["epoch"], ck["step"], ck.get("sums")
            rng_note = _restore_rng(ck["rng"], world)
            resumed = (start_epoch, start_step)
            if metrics_file is not None:
                metrics_file.rewind(start_epoch, start_step)
        ddp = _data_parallel(model, world)  # after a resume: DDP starts every rank from rank 0's state
        prepare = _preparer(features, lookups, config.normalize_features)
        steps = source.steps(0)
        n_train = int(train_idx.shape[0])
        store = getattr(features, "store", None)
        emit({"kind": "start", "config": config.to_dict(), "steps_per_epoch": steps, "start_epoch": start_epoch,
              "start_step": start_step, "features": type(features).__name__, "num_train": n_train,
              "feature_dtype": _feature_dtype(features, ds),
              "parameters": sum(p.numel() for p in params), "device": str(world.device),
              "sampling": {"device": "server" if config.server else str(sample_dev), "why": sample_why},
              "store_notes": list(getattr(features, "notes", None) or (store.notes if store is not None else [])),
              "memory": features.memory_bytes() if hasattr(features, "memory_bytes") else None,
              "rng_restored": rng_note, "integrity": ds.integrity})

        def checkpoint(epoch: int, step: int, sums: _Sums | None) -> None:
            if ckpt_path is None:
                return
            # every rank's own streams, for exact resumes
            rngs = world.gather_objects(_rng_state(world.device), during=f"epoch {epoch}, step {step}: a checkpoint")
            if world.rank != 0:
                return
            save_checkpoint(ckpt_path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                        "epoch": epoch, "step": step, "sums": None if sums is None else sums.state(),
                                        "rng": rngs, "config": config.to_dict()})

        eval_sampler = NeighborSampler(*csr, config.eval_fanouts or config.fanouts, seed=config.seed)
        world.barrier()  # everyone set up: the steps' short timeouts start from here
        records: list[dict] = []
        for epoch in range(start_epoch, config.epochs):
            first = start_step if epoch == start_epoch else 0
            sums = _Sums(sums_state if epoch == start_epoch and first else None)
            prior_s = sums.v["prior_s"]
            t_epoch = time.perf_counter()
            moved = features.transfer.counts()
            if predictor is not None:
                predictor.start()
            pre = Prefetcher(source.batches(epoch, first), prepare, depth, features.transfer)
            try:
                for step in range(first, steps):
                    rec = _step(ddp, params, optimizer, pre, world, n_train, config.batch_size, step, sums,
                                epoch=epoch)
                    rec.update(kind="step", epoch=epoch, step=step, steps=steps)
                    emit(rec)
                    if config.checkpoint_every_steps and (step + 1) % config.checkpoint_every_steps == 0 \
                            and step + 1 < steps:
                        sums.v["prior_s"] = prior_s + time.perf_counter() - t_epoch
                        checkpoint(epoch, step + 1, sums)
            finally:
                pre.close()
            epoch_s = prior_s + time.perf_counter() - t_epoch
            rec = _epoch_record(epoch, steps, sums, epoch_s)
            rec["prefetch"] = depth
            if predictor is not None:
                rec["prediction"] = predictor.finish(epoch, steps - first).to_dict()
            rec["transfers"] = _moved_since(moved, features.transfer.counts())
            last = epoch == config.epochs - 1
            if last or (config.eval_every_epochs and (epoch + 1) % config.eval_every_epochs == 0):
                t_eval = time.perf_counter()
                for split in ("valid", "test"):
                    idx = getattr(ds, f"{split}_idx")
                    if idx is not None and len(idx):
                        rec[f"{split}_acc"] = _evaluate(model, np.asarray(idx, np.int64), eval_sampler, prepare,
                                                        world, config, features.transfer)
                rec["eval_s"] = time.perf_counter() - t_eval
            if world.size > 1:
                rec["param_spread"] = _param_spread(params, world, epoch)
            if hasattr(features, "epoch_record"):  # a sharded store: what crossed between nodes
                try:
                    rec.update(features.epoch_record())
                except PeerLostError as exc:
                    raise PeerLostError(f"epoch {epoch}: {exc}") from None
            checkpoint(epoch + 1, 0, None)
            emit(rec)
            records.append(rec)
        return TrainResult(model=model, epochs=tuple(records), resumed_from=resumed, world_size=world.size,
                           rank=world.rank)
    finally:
        if source is not None:
            source.close()
        if features is not None:
            features.close()
        if metrics_file is not None:
            metrics_file.close()


def _step(model: torch.nn.Module, params: Sequence[Tensor], optimizer: torch.optim.Optimizer, pre: Prefetcher,
          world: _World, n_train: int, batch_size: int, step: int, sums: _Sums, *, epoch: int = 0) -> dict:
    """One training step of ``model`` (the DDP wrapper under several ranks); its step record.

    DDP averages the gradients over the ranks: the summed loss scaled by
    ``world.size / global_bs`` makes that average the gradient of the global
    batch's mean loss, what one process computes. A rank whose part is empty
    (the short last step over more ranks than seeds) runs the model over zero
    rows: every parameter gets a zero gradient, so DDP's all-reduce sees every
    rank. (DDP's ``join()`` would do it too, but costs every rank an extra
    all-reduce per forward on every step to learn who joined; an empty part
    happens at most once an epoch and a forward over zero rows is free.)
    """
    t0 = time.perf_counter()
    try:
        item, waited = pre.get()
    except PeerLostError as exc:  # the prefetch thread's feature exchange lost a peer: say when
        raise PeerLostError(f"epoch {epoch}, step {step}: {exc}") from None
    if item is None:
        raise TrainError(f"the batch source ended before step {step}; it must yield every step of the epoch")
    item.wait()  # its copies were issued on the prefetch thread's stream
    global_bs = min(batch_size, n_train - step * batch_size)
    during = f"epoch {epoch}, step {step}"
    t1 = time.perf_counter()
    model.train()
    optimizer.zero_grad(set_to_none=True)
    b = item.batch
    out = model(item.x, b.edge_index_per_layer, b.batch_size, deg=item.deg)
    loss = F.cross_entropy(out, item.y, reduction="sum")
    with _peer_errors(during):  # DDP's bucketed all-reduce runs inside backward
        (loss * (world.size / global_bs)).backward()
    stats = torch.stack([loss.detach().float(), (out.detach().argmax(1) == item.y).sum().float()])
    if world.device.type == "cuda":
        torch.cuda.synchronize(world.device)
    t2 = time.perf_counter()
    world.all_reduce(stats, during=during)  # the global batch's summed loss and hits, on every rank
    t3 = time.perf_counter()
    _refuse_non_finite(torch.cat([_non_finite_flag(params, world.device), stats]), epoch, step)
    optimizer.step()
    loss_total, hits = float(stats[0]), float(stats[1])
    t4 = time.perf_counter()
    # compute_s holds the gradients' all-reduce too (overlapped with backward); allreduce_s the loss and hits
    rec = {"seeds": global_bs, "loss": loss_total / global_bs, "train_acc": hits / global_bs,
           "sample_s": item.sample_s, "gather_s": item.gather_s, "compute_s": (t2 - t1) + (t4 - t3),
           "allreduce_s": t3 - t2, "io_wait_s": waited, "step_s": t4 - t0,
           "tiers": {k: {"rows": r, "bytes": n} for k, (r, n) in item.tiers.items()}}
    rec["seeds_per_s"] = global_bs / rec["step_s"] if rec["step_s"] > 0 else 0.0
    _add_step(sums, rec, item.tiers, loss_total, hits)
    return rec


def _add_step(sums: _Sums, rec: dict, tiers: dict[str, tuple[int, int]], loss_total: float, hits: float) -> None:
    """A step record (and its summed loss and hits) into the epoch's running sums."""
    v = sums.v
    v["seeds"] += rec["seeds"]
    v["loss_sum"] += loss_total
    v["correct"] += hits
    for k in ("sample_s", "gather_s", "compute_s", "allreduce_s", "io_wait_s", "step_s"):
        v[k] += rec[k]
    for k, (r, n) in tiers.items():
        acc = sums.tiers.setdefault(k, [0, 0])
        acc[0] += r
        acc[1] += n


def _non_finite_flag(params: Sequence[Tensor], device: torch.device) -> Tensor:
    """``[inf]`` when any gradient holds a NaN or an infinity, else ``[0]``.

    The gradients are DDP's all-reduced ones, the same on every rank: every
    rank reaches the same verdict at the same step.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(1, device=device)
    bad = torch.stack([~torch.isfinite(g).all() for g in grads]).any()
    return torch.where(bad, float("inf"), 0.0).reshape(1).to(device)


def _moved_since(before: TransferCounts, now: TransferCounts) -> dict[str, list[int]]:
    """Copies and bytes per route (``pinned->device``, ...) between two counts of a transfer."""
    out = {}
    for (src, dst), (n, b) in now.by_route.items():
        n0, b0 = before.by_route.get((src, dst), (0, 0))
        if n > n0:
            out[f"{src}->{dst}"] = [n - n0, b - b0]
    return out


def _refuse_non_finite(flat: Tensor, epoch: int, step: int) -> None:
    """Stop before the update when the summed loss or any gradient is NaN or infinite.

    ``flat``: gradient values or flags, then the summed loss and hits (its
    last two), the same on every rank, so every rank stops at the same step
    (none waits in a collective). Raising here leaves
    the model as the last good step made it and writes no checkpoint: the one
    on disk stays the last good one.
    """
    if bool(torch.isfinite(flat).all()):
        return
    loss = float(flat[-2])
    what = f"the loss is {loss}" if not math.isfinite(loss) else "a gradient is NaN or infinite"
    raise TrainError(
        f"epoch {epoch}, step {step}: {what}; training stopped before updating the model, and the last "
        "checkpoint is left as it was. Corrupt features (check them with `moment data info --verify "
        "DATASET`) or too high a learning rate (--lr) are the usual causes")


class _Predictor:
    """Per epoch: the placement's predicted I/O against the store's counters (:mod:`training.prediction`)."""

    def __init__(self, store: Any, shares: dict[str, float], row_bytes: int, rates: dict,
                 ssd_bins: list[tuple[float, int]]) -> None:
        self.store, self.shares, self.row_bytes, self.rates = store, shares, row_bytes, rates
        self.ssd_bins = ssd_bins
        self._before: dict[str, dict[str, float]] = {}

    @classmethod
    def for_run(cls, config: TrainConfig, features: FeatureSource, ds: Dataset) -> _Predictor | None:
        """One where the features come through a placement that ``moment place`` reported on."""
        from training.prediction import (
            load_place_report,
            rates_from_capacities,
            shares_from_place_report,
            ssd_bins_from_place_report,
        )

        store = getattr(features, "store", None)
        report = load_place_report(config.placement) if config.placement else None
        if store is None or report is None or not hasattr(store, "tier_stats"):
            return None
        rates = {}
        if config.capacities:
            from planner.capacities import load_capacities

            rates = rates_from_capacities(load_capacities(config.capacities))
        return cls(store, shares_from_place_report(report), int(report.get("row_bytes") or ds.row_bytes), rates,
                   ssd_bins_from_place_report(report))

    def start(self) -> None:
        self._before = self.store.tier_stats()

    def finish(self, epoch: int, steps: int):
        from training.prediction import predict_epoch

        now = self.store.tier_stats()
        keys = ("rows", "bytes", "requests", "seconds")
        measured = {t: {k: v[k] - self._before.get(t, {}).get(k, 0) for k in keys} for t, v in now.items()}
        return predict_epoch(epoch, self.shares, measured, row_bytes=self.row_bytes, rates=self.rates,
                             steps=steps, ssd_bins=self.ssd_bins)


def _epoch_record(epoch: int, steps: int, sums: _Sums, epoch_s: float) -> dict:
    v = sums.v
    seeds = v["seeds"] or 1
    return {"kind": "epoch", "epoch": epoch, "steps": steps, "seeds": int(v["seeds"]), "epoch_s": epoch_s,
            "seeds_per_s": v["seeds"] / epoch_s if epoch_s > 0 else 0.0, "loss": v["loss_sum"] / seeds,
            "train_acc": v["correct"] / seeds, "io_wait_share": v["io_wait_s"] / epoch_s if epoch_s > 0 else 0.0,
            **{k: v[k] for k in ("sample_s", "gather_s", "compute_s", "allreduce_s", "io_wait_s")},
            "tiers": {k: {"rows": r, "bytes": n} for k, (r, n) in sums.tiers.items()}}


@torch.no_grad()
def _evaluate(model: torch.nn.Module, idx: np.ndarray, sampler: NeighborSampler,
              prepare: Callable[[SampledBatch, float], Prepared], world: _World, config: TrainConfig,
              transfer: Transfer) -> float:
    """Accuracy on ``idx``, every rank evaluating its share; the same sample whatever the epoch."""
    model.eval()
    parts = epoch_seeds(idx, 0, config.eval_batch_size, rank=world.rank, world_size=world.size, shuffle=False)

    def batches() -> Iterator[SampledBatch]:
        for i, part in enumerate(parts):
            sampler.reseed(_mix(config.seed, 0x5EED, world.rank, i))
            yield sampler.sample(part)

    hits = torch.zeros(2, dtype=torch.float64, device=world.device)
    pre = Prefetcher(batches(), prepare, config.prefetch, transfer)
    try:
        while True:
            item, _ = pre.get()
            if item is None:
                break
            item.wait()
            if item.batch.batch_size:
                out = model(item.x, item.batch.edge_index_per_layer, item.batch.batch_size, deg=item.deg)
                hits[0] += float((out.argmax(1) == item.y).sum())
                hits[1] += item.batch.batch_size
    finally:
        pre.close()
    world.all_reduce(hits)
    return float(hits[0] / hits[1]) if hits[1] else 0.0


def _param_spread(params: Sequence[Tensor], world: _World, epoch: int = 0) -> float:
    """Largest difference between ranks of any parameter tensor's sum (0.0: the ranks agree)."""
    fp = torch.stack([p.detach().double().sum() for p in params])
    during = f"epoch {epoch}: comparing the ranks' parameters"
    hi, lo = world.all_reduce(fp.clone(), "max", during), world.all_reduce(fp.clone(), "min", during)
    return float((hi - lo).abs().max())
