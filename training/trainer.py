"""The data-parallel training loop: sampled batches, tiered features, pipelined, checkpointed.

:func:`train` runs :class:`TrainConfig` in this process. Under ``torchrun``
(``WORLD_SIZE > 1``) every process is one rank of a ``torch.distributed`` group
(``gloo`` on CPU, ``nccl`` on CUDA; :mod:`training.distributed`); without it a
single process trains alone. The jobs around the loop live beside it: the
features (:mod:`training.features`), the batch pipeline
(:mod:`training.pipeline`), checkpoints (:mod:`training.checkpoint`) and the
records (:mod:`training.metrics`).

Semantics (see :mod:`training.batches`): at step ``s`` the world trains on the
global batch a single process would; rank ``r`` takes part ``r`` of it. The model
is wrapped in :class:`~torch.nn.parallel.DistributedDataParallel` (bucketed
all-reduce overlapped with backward); every rank scales its summed loss by
``world size / global batch size``, so DDP's average over the ranks is the global
batch's mean-loss gradient, and a rank with an empty part still runs its step over
zero rows (see :func:`_step`): ``N`` ranks train on exactly the seeds one process
would. With full neighbourhoods (fan-outs ``-1``) they reproduce one process up to
float rounding; with sampled fan-outs each rank draws its own neighbour samples
(its sampler stream is seeded per rank), so runs agree in distribution, not bit
for bit.

Pipelining: a background thread samples the next batches and gathers their
feature rows (from a :class:`~iostack.store.FeatureStore` or an in-memory
tensor) into a bounded queue of ``prefetch`` batches while the current batch
trains. Each step's time is split into sample, gather (rows and bytes per tier,
from the store's counter deltas), compute (forward, backward with the gradients'
all-reduce overlapped, the update), the all-reduce of the loss and hits, and I/O
wait (the time the trainer blocked on the queue).

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

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from iostack.backends import BACKENDS
from iostack.transfer import DeviceMemory, Transfer, memory_for
from training.batches import BatchSource, _mix, epoch_seeds
from training.checkpoint import (
    Resumed,
    checkpoint_path,
    resume,
    rng_state,
    save_checkpoint,
)
from training.data import Dataset, open_dataset
from training.devices import SAMPLE_ON
from training.distributed import World, data_parallel, open_world, param_spread, peer_errors
from training.errors import TrainError
from training.exchange import PeerLostError
from training.features import (
    FeatureSource,
    feature_dtype_of,
    open_features,
    open_store,
    share_key_of,
)
from training.hostmem import keep_freed_host_memory
from training.memplan import check_host_memory
from training.metrics import JsonlWriter, Predictor, Sums, add_step, epoch_record, moved_since
from training.models import build_model
from training.nodereads import setup_node_shared_reads, ssd_reads
from training.pipeline import (
    Prefetcher,
    Prepared,
    csr_on,
    open_source,
    prefetch_workers,
    preparer,
    sampling,
)
from training.sampler import NeighborSampler, SampledBatch

__all__ = ["TrainConfig", "TrainResult", "train"]

Progress = Callable[[dict], None]


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
    ``node_shared_reads``: the ranks of a node read each SSD page of a training
    step once, for all of them (:mod:`training.nodereads`; where it applies).
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
    node_shared_reads: bool = True

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


def _check_dataset(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    if ds.labels is None or ds.num_classes < 1:
        raise TrainError(f"{ds.path}: the dataset has no labels.npy; import one with labels to train on it")
    if ds.train_idx is None or ds.train_idx.shape[0] == 0:
        raise TrainError(f"{ds.path}: the dataset has no training split (train_idx.npy); import it with a split")
    train_idx = np.asarray(ds.train_idx, dtype=np.int64)
    if (np.asarray(ds.labels)[train_idx] < 0).any():
        raise TrainError(f"{ds.path}: some training vertices are unlabelled (label -1); fix the split")
    return train_idx, np.asarray(ds.labels)


def train(config: TrainConfig, progress: Progress | None = None, *, memory: DeviceMemory | None = None
          ) -> TrainResult:
    """Train ``config`` in this process (one rank under ``torchrun``); see the module doc.

    ``memory``: the device memory to train on instead of this rank's CUDA
    device or the host (tests pass a fake accelerator).
    """
    ds = open_dataset(config.dataset, validate=False)
    train_idx, labels = _check_dataset(ds)
    world = open_world(config.placement, memory, config.timeout_s)
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


def _open_sharded(config: TrainConfig, ds: Dataset, world: World, memory: DeviceMemory) -> FeatureSource:
    """This node's shard of a placement sharded across nodes (:mod:`training.sharded`)."""
    from training.sharded import Peers, ShardedOptions, open_sharded

    options = ShardedOptions(config.exchange, config.timeout_s, int(config.remote_cache), config.remote_cache_dir)
    peers = Peers.from_env(world.rank, world.size, world.local_rank, world.local_size)
    return open_sharded(ds, config.placement, peers, options, transfer=Transfer(memory), open_store=open_store,
                        share_key=lambda d: share_key_of(ds, str(d)),
                        local_gpu_bins=world.gpu_bins if world.size > 1 else None, backend=config.backend,
                        capacities=config.capacities)


def _train(config: TrainConfig, ds: Dataset, train_idx: np.ndarray, labels: np.ndarray, world: World,
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
        # before the caches fill: will they and training fit in the memory there is? (a warning, never a refusal)
        memory_note = check_host_memory(config, ds, gpu_bins_on_host=world.device.type == "cpu",
                                        ranks=world.local_size) if world.rank == 0 else None
        features = _open_run_features(config, ds, world, memory)
        predictor = Predictor.for_run(config, features, ds)
        sample_dev, sample_why, lookups = sampling(config, ds, labels, memory)
        csr = csr_on(ds, sample_dev)
        source = open_source(config, train_idx, world, csr)
        shared = setup_node_shared_reads(config.node_shared_reads, world, features, source.steps(0),
                                         config.timeout_s)
        if predictor is not None:  # the node's other ranks read the same SSDs in the same steps
            predictor.node(shared.ranks if shared.on else world.local_size, shared.on)
        model, params, optimizer = _model(config, features.dim, ds.num_classes, world.device)
        ckpt_path = checkpoint_path(config.checkpoint_dir, config.resume)
        resumed = None
        if config.resume and ckpt_path is not None and ckpt_path.exists():
            resumed = resume(ckpt_path, config.to_dict(), model, optimizer, world)
            if metrics_file is not None:
                metrics_file.rewind(resumed.epoch, resumed.step)
        ddp = data_parallel(model, world)  # after a resume: DDP starts every rank from rank 0's state
        workers = prefetch_workers(features, shared.on)
        run = _Run(config, ds, world, features, model, ddp, params, optimizer,
                   preparer(features, lookups, config.normalize_features, node_shared=shared.on, concurrent=workers > 1),
                   source, source.steps(0), int(train_idx.shape[0]), ckpt_path, emit, predictor,
                   NeighborSampler(*csr, config.eval_fanouts or config.fanouts, seed=config.seed),
                   preparer(features, lookups, config.normalize_features),  # evaluation reads privately
                   workers)
        start = run.start_record(resumed, "server" if config.server else str(sample_dev), sample_why)
        start["node_shared_reads"] = shared.to_dict()
        start["prefetch_workers"] = workers
        start["memory_check"] = memory_note
        # batches free and reallocate the same large host tensors every step (training.hostmem)
        start["host_malloc"] = keep_freed_host_memory()
        emit(start)
        world.barrier()  # everyone set up: the steps' short timeouts start from here
        records = []
        for epoch in range(resumed.epoch if resumed else 0, config.epochs):
            first = resumed.step if resumed is not None and epoch == resumed.epoch else 0
            records.append(run.epoch(epoch, first, Sums(resumed.sums if first else None)))
        return TrainResult(model=model, epochs=tuple(records), world_size=world.size, rank=world.rank,
                           resumed_from=(resumed.epoch, resumed.step) if resumed is not None else None)
    finally:
        if source is not None:
            source.close()
        if features is not None:
            features.close()
        if metrics_file is not None:
            metrics_file.close()


def _open_run_features(config: TrainConfig, ds: Dataset, world: World, memory: DeviceMemory) -> FeatureSource:
    """The run's features: a sharded placement's, a placement's store, or the dataset's in memory."""
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
    return features


def _model(config: TrainConfig, dim: int, num_classes: int, device: torch.device
           ) -> tuple[torch.nn.Module, list[Tensor], torch.optim.Optimizer]:
    """The model (the same initial parameters on every rank), its trained parameters, their optimizer."""
    if config.model != "gat" and config.attn_dropout:
        raise TrainError("attn_dropout applies to the GAT model only")
    torch.manual_seed(config.seed)  # identical initial parameters on every rank
    model = build_model(config.model, dim, num_classes, len(config.fanouts), hidden=config.hidden,
                        heads=config.heads, out_heads=config.out_heads, dropout=config.dropout,
                        attn_dropout=config.attn_dropout if config.model == "gat" else None,
                        norm=config.gcn_norm if config.model == "gcn" else None).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    return model, params, torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)


@dataclass
class _Run:
    """A run's parts once set up: what its epochs, steps and checkpoints use.

    ``model`` is the module itself (evaluation, checkpoints: its own
    ``state_dict``); ``ddp`` is what the steps call (DDP under several ranks,
    else the module).
    """

    config: TrainConfig
    ds: Dataset
    world: World
    features: FeatureSource
    model: torch.nn.Module
    ddp: torch.nn.Module
    params: list[Tensor]
    optimizer: torch.optim.Optimizer
    prepare: Callable[[SampledBatch, float], Prepared]
    source: BatchSource
    steps: int
    n_train: int
    ckpt_path: Path | None
    emit: Callable[[dict], None]
    predictor: Predictor | None
    eval_sampler: NeighborSampler
    eval_prepare: Callable[[SampledBatch, float], Prepared]
    workers: int = 1  # threads preparing training batches (training.pipeline.prefetch_workers)

    def start_record(self, resumed: Resumed | None, sampled_on: str, why: str) -> dict:
        features, store = self.features, getattr(self.features, "store", None)
        return {"kind": "start", "config": self.config.to_dict(), "steps_per_epoch": self.steps,
                "start_epoch": resumed.epoch if resumed else 0, "start_step": resumed.step if resumed else 0,
                "features": type(features).__name__, "num_train": self.n_train,
                "feature_dtype": feature_dtype_of(features, self.ds),
                "parameters": sum(p.numel() for p in self.params), "device": str(self.world.device),
                "sampling": {"device": sampled_on, "why": why},
                "store_notes": list(getattr(features, "notes", None) or (store.notes if store is not None else [])),
                "memory": features.memory_bytes() if hasattr(features, "memory_bytes") else None,
                "rng_restored": resumed.rng_note if resumed else None, "integrity": self.ds.integrity}

    def checkpoint(self, epoch: int, step: int, sums: Sums | None) -> None:
        if self.ckpt_path is None:
            return
        # every rank's own streams, for exact resumes
        rngs = self.world.gather_objects(rng_state(self.world.device),
                                         during=f"epoch {epoch}, step {step}: a checkpoint")
        if self.world.rank != 0:
            return
        save_checkpoint(self.ckpt_path, {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                                         "epoch": epoch, "step": step,
                                         "sums": None if sums is None else sums.state(), "rng": rngs,
                                         "config": self.config.to_dict()})

    def epoch(self, epoch: int, first: int, sums: Sums) -> dict:
        """Train steps ``first..`` of ``epoch``, evaluate when due, checkpoint; the epoch record (emitted)."""
        config, every = self.config, self.config.checkpoint_every_steps
        prior_s = sums.v["prior_s"]
        t_epoch, cpu_epoch = time.perf_counter(), time.process_time()
        moved = self.features.transfer.counts()
        disk = ssd_reads(self.features)
        if self.predictor is not None:
            self.predictor.start()
        pre = Prefetcher(self.source.batches(epoch, first), self.prepare, config.prefetch, self.features.transfer,
                         self.workers)
        try:
            for step in range(first, self.steps):
                rec = _step(self.ddp, self.params, self.optimizer, pre, self.world, self.n_train, config.batch_size,
                            step, sums, epoch=epoch)
                rec.update(kind="step", epoch=epoch, step=step, steps=self.steps)
                self.emit(rec)
                if every and (step + 1) % every == 0 and step + 1 < self.steps:
                    sums.v["prior_s"] = prior_s + time.perf_counter() - t_epoch
                    self.checkpoint(epoch, step + 1, sums)
        finally:
            pre.close()
        rec = epoch_record(epoch, self.steps, sums, prior_s + time.perf_counter() - t_epoch)
        # CPU seconds of every thread of this process over this run's steps of the epoch: the work a
        # step costs, which a loaded machine's time slicing stretches less than the wall clock
        rec["cpu_s"] = time.process_time() - cpu_epoch
        rec["prefetch"] = config.prefetch
        if self.predictor is not None:
            rec["prediction"] = self.predictor.finish(epoch, self.steps - first).to_dict()
        rec["transfers"] = moved_since(moved, self.features.transfer.counts())
        rec.update(ssd_reads(self.features, disk))
        self.epoch_end(epoch, rec)
        self.checkpoint(epoch + 1, 0, None)
        self.emit(rec)
        return rec

    def epoch_end(self, epoch: int, rec: dict) -> None:
        """Evaluation when due, the ranks' parameter spread, what crossed between nodes: into ``rec``."""
        config, world = self.config, self.world
        if epoch == config.epochs - 1 or (config.eval_every_epochs and (epoch + 1) % config.eval_every_epochs == 0):
            t_eval = time.perf_counter()
            for split in ("valid", "test"):
                idx = getattr(self.ds, f"{split}_idx")
                if idx is not None and len(idx):
                    rec[f"{split}_acc"] = _evaluate(self.model, np.asarray(idx, np.int64), self.eval_sampler,
                                                    self.eval_prepare, world, config, self.features.transfer)
            rec["eval_s"] = time.perf_counter() - t_eval
        if world.size > 1:
            rec["param_spread"] = param_spread(self.params, world, epoch)
        if hasattr(self.features, "epoch_record"):  # a sharded store: what crossed between nodes
            try:
                rec.update(self.features.epoch_record())
            except PeerLostError as exc:
                raise PeerLostError(f"epoch {epoch}: {exc}") from None


def _step(model: torch.nn.Module, params: Sequence[Tensor], optimizer: torch.optim.Optimizer, pre: Prefetcher,
          world: World, n_train: int, batch_size: int, step: int, sums: Sums, *, epoch: int = 0) -> dict:
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
    with peer_errors(during):  # DDP's bucketed all-reduce runs inside backward
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
           "allreduce_s": t3 - t2, "io_wait_s": waited, "step_s": t4 - t0, "share_wait_s": item.share_wait_s,
           "tiers": {k: {"rows": r, "bytes": n} for k, (r, n) in item.tiers.items()}}
    rec["seeds_per_s"] = global_bs / rec["step_s"] if rec["step_s"] > 0 else 0.0
    add_step(sums, rec, item.tiers, loss_total, hits)
    return rec


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
        "checkpoint is left as it was. Corrupt features (check them with "
        "`training.data.open_dataset(verify='full')`) or too high a learning rate (`lr`) are the usual causes")


@torch.no_grad()
def _evaluate(model: torch.nn.Module, idx: np.ndarray, sampler: NeighborSampler,
              prepare: Callable[[SampledBatch, float], Prepared], world: World, config: TrainConfig,
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


