"""The data-parallel training loop: sampled batches, tiered features, pipelined, checkpointed.

:func:`train` runs a :class:`~training.specs.TrainSpec` in this process. Under ``torchrun``
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
ranks, counts all-reduced; over a partitioned graph (``partition``, no placement:
:mod:`training.partition.rank`) each rank evaluates its own partition's vertices.
Train accuracy is measured on the training steps' own outputs (dropout on).

Records (dicts) go to ``progress`` on every rank and, from rank 0, as JSON lines
to ``metrics_path``: ``kind`` ``"start"``, ``"step"``, ``"epoch"``. Times are
seconds, sizes bytes. An epoch record's ``divergence`` says whether the loss is
rising or stuck at chance (:mod:`training.divergence`; ``None`` when neither; the
signs look at this run's epochs only, from its start or resume).

Checkpoints (``checkpoint_dir/checkpoint.pt``, written by rank 0 to a temporary
file then renamed) hold the model, the optimizer, the position (epoch, step),
the epoch's running sums, every rank's own RNG states (gathered to rank 0) and
the config; with ``resume`` a run continues from there exactly: batches depend
only on ``(seed, epoch, step)`` and each rank's dropout stream is its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from iostack.transfer import DeviceMemory, Transfer, memory_for
from training.background_verify import DatasetWatch
from training.batches import BatchSource, global_batch
from training.checkpoint import (
    Resumed,
    checkpoint_bytes,
    checkpoint_lock,
    checkpoint_path,
    resume,
    rng_state,
    save_checkpoint,
)
from training.contention import adjust as contention_adjust
from training.contention import contention_between
from training.contention import sample as sample_contention
from training.data import Dataset, open_dataset
from training.distributed import World, data_parallel, open_world, param_spread, peer_errors
from training.divergence import check as check_divergence
from training.errors import TrainError
from training.features import (
    FeatureSource,
    feature_dtype_of,
)
from training.feed import Feed, eval_batches, open_feed
from training.hostmem import keep_freed_host_memory
from training.memplan import check_host_memory
from training.metrics import JsonlWriter, Predictor, Sums, add_step, epoch_record, moved_since
from training.models import build_model
from training.nodeshare import ssd_reads
from training.partition.rank import RankView, open_rank_view
from training.pipeline import (
    Prefetcher,
    Prepared,
)
from training.precision import Precision, StepScaler
from training.sampler import NeighborSampler, SampledBatch
from training.sharded.exchange import PeerLostError
from training.socket_batches import bin_rows, rows_since
from training.specs import ModelSpec, RunSpec, TrainSpec

__all__ = ["TrainResult", "train"]

Progress = Callable[[dict], None]


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


def train(spec: TrainSpec, *, source: BatchSource | None = None, features: FeatureSource | None = None,
          progress: Progress | None = None, memory: DeviceMemory | None = None) -> TrainResult:
    """Train ``spec`` in this process (one rank under ``torchrun``); see the module doc.

    Parameters
    ----------
    spec : TrainSpec
        The run (:mod:`training.specs`).
    source : BatchSource, optional
        This rank's training batches (:class:`training.batches.BatchSource`) instead of the ones
        ``spec.sampling`` names (its server, else the neighbour sampler here). Step ``s`` must
        hold this rank's part of global batch ``s``: ``spec.sampling.batch_size`` seeds of the
        dataset's training split (the last step may be short), the same number of steps on every
        rank, since the loss is scaled by the global batch's size. Evaluation still samples with
        the spec's fan-outs. The caller closes it.
    features : FeatureSource, optional
        The feature rows (:class:`training.features.FeatureSource`) instead of the spec's
        placement or the dataset's ``features.npy``; its ``transfer`` must reach the training
        device (the host without CUDA). The caller closes it.
    progress : callable, optional
        Called with every record (``start``, ``step``, ``epoch``) on every rank.
    memory : DeviceMemory, optional
        The device memory to train on instead of this rank's CUDA device or the host (tests
        pass a fake accelerator).

    Returns
    -------
    TrainResult

    Raises
    ------
    TrainError
        A dataset without labels or a training split, a checkpoint of other settings, a loss
        that is not finite, a batch source that ends early.
    DatasetError
        Another run is writing checkpoints into ``spec.run.checkpoint_dir`` (naming it).
    """
    # a partitioned graph without a placement trains in the partition's ids, on the rank's share alone
    in_view = bool(spec.sampling.partition) and spec.io.placement is None and source is None and features is None
    if not in_view:
        ds = open_dataset(spec.dataset, validate=False)
        train_idx, labels = _check_dataset(ds)
    world = open_world(spec.io.placement, memory, spec.distributed.timeout_s)
    if memory is None:
        memory = memory_for(world.device)
    watch, view = None, None
    try:
        if in_view:  # which share is this rank's is known once the world is
            view = open_rank_view(spec.dataset, str(spec.sampling.partition), world.rank, world.size)
            ds, train_idx, labels = view.dataset, view.train_order, np.asarray(view.dataset.labels)
        else:
            watch = _dataset_watch(spec, ds, world, features)
        with checkpoint_lock(spec.run.checkpoint_dir, world.rank):  # one run writes a checkpoint directory
            return _train(spec, ds, train_idx, labels, world, memory, _Given(source, features, watch, view), progress)
    finally:
        if watch is not None:
            watch.close()
        world.end()


@dataclass(frozen=True)
class _Given:
    """The objects a caller handed :func:`train` (theirs to close), ``None`` where the spec's are built."""

    source: BatchSource | None = None
    features: FeatureSource | None = None
    #: the background check of the dataset's arrays (None: not this rank's, or not asked for)
    watch: DatasetWatch | None = None
    #: a partitioned job's rank view (training.partition.rank), or None
    view: RankView | None = None


def _dataset_watch(spec: TrainSpec, ds: Dataset, world: World, features: FeatureSource | None) -> DatasetWatch | None:
    """The node's background check of every dataset array this run reads (its first rank checks for all)."""
    if spec.io.check_dataset != "background" or world.local_rank != 0:
        return None
    read = ["indptr", "indices", "labels", "train_idx", "valid_idx", "test_idx"]
    if spec.io.placement is None and features is None:  # else the rows come from the placement's bins
        read.append("features")
    return DatasetWatch(ds.path, read).start()


def _train(spec: TrainSpec, ds: Dataset, train_idx: np.ndarray, labels: np.ndarray, world: World,
           memory: DeviceMemory, given: _Given, progress: Progress | None) -> TrainResult:
    run_spec = spec.run
    metrics_file = JsonlWriter(run_spec.metrics_path) if world.rank == 0 and run_spec.metrics_path else None

    def emit(rec: dict) -> None:
        rec = {"rank": world.rank, "world_size": world.size, **rec}
        if metrics_file is not None:
            metrics_file.write(rec)
        if progress is not None:
            progress(rec)

    feed: Feed | None = None
    try:
        # before the caches fill: will they and training fit in the memory there is? (a warning, never a refusal)
        memory_note = check_host_memory(spec.io, spec.sampling, ds, hidden=spec.model.hidden,
                                        gpu_bins_on_host=world.device.type == "cpu",
                                        ranks=world.local_size) if world.rank == 0 and given.features is None else None
        feed = open_feed(spec, ds, labels, train_idx, world, memory, source=given.source, features=given.features,
                         view=given.view)
        shared = feed.shared
        predictor = Predictor.for_run(spec.io, feed.features, ds)
        if predictor is not None:  # the node's other ranks read the same SSDs in the same steps
            predictor.node(shared.ranks if shared.on else world.local_size, shared.on, world.local_rank)
        run, resumed = _set_up(spec, ds, world, feed, train_idx.shape[0], emit, predictor)
        run.watch = given.watch
        if resumed is not None and metrics_file is not None:
            metrics_file.rewind(resumed.epoch, resumed.step)
        start = run.start_record(resumed, *_sampled_where(spec, given, feed.sample_dev, feed.why))
        start["node_shared_reads"] = shared.to_dict()
        start["socket_split"] = feed.socket_split
        start["prefetch_workers"] = run.workers
        start["memory_check"] = memory_note
        # batches free and reallocate the same large host tensors every step (training.hostmem)
        start["host_malloc"] = keep_freed_host_memory()
        emit(start)
        world.barrier()  # everyone set up: the steps' short timeouts start from here
        records = []
        for epoch in range(resumed.epoch if resumed else 0, run_spec.epochs):
            first = resumed.step if resumed is not None and epoch == resumed.epoch else 0
            records.append(run.epoch(epoch, first, Sums(resumed.sums if first else None)))
        return TrainResult(model=run.model, epochs=tuple(records), world_size=world.size, rank=world.rank,
                           resumed_from=(resumed.epoch, resumed.step) if resumed is not None else None)
    finally:  # what the run opened itself; what the caller handed in stays open
        if feed is not None:
            feed.close()
        if metrics_file is not None:
            metrics_file.close()


def _sampled_where(spec: TrainSpec, given: _Given, sample_dev: torch.device, why: str) -> tuple[str, str]:
    """Where the training batches are sampled, and why, for the start record."""
    if given.source is not None:
        return (type(given.source).__name__,
                f"training batches from the source handed in; evaluation samples on {sample_dev} ({why})")
    return ("server" if spec.sampling.server else str(sample_dev)), why


def _set_up(spec: TrainSpec, ds: Dataset, world: World, feed: Feed, n_train: int,
            emit: Callable[[dict], None], predictor: Predictor | None) -> tuple[_Run, Resumed | None]:
    """The model, its optimizer (resumed from the checkpoint when asked), DDP, and the run around them.

    The training steps gather through ``feed.shared.features`` (the store composed with node-shared SSD
    reads when they are on), evaluation through ``feed.features``.
    """
    model, params, optimizer = _model(spec.model, spec.sampling.layers, spec.run, feed.features.dim,
                                      ds.num_classes, world.device)
    ckpt_path = checkpoint_path(spec.run.checkpoint_dir, spec.run.resume, checkpoint_bytes(params))
    resumed = None
    if spec.run.resume and ckpt_path is not None and ckpt_path.exists():
        resumed = resume(ckpt_path, spec.to_dict(), model, optimizer, world)
    ddp = data_parallel(model, world)  # after a resume: DDP starts every rank from rank 0's state
    normalize = spec.model.normalize_features
    precision = Precision.of(spec.run.precision, world.device.type)
    rows = precision.rows_dtype(feature_dtype_of(feed.features, ds))  # float32, or the stored type (mixed)
    prepare, workers = feed.training_prepare(normalize, rows)
    assert feed.shared.features is not None
    run = _Run(spec, ds, world, feed.shared.features, model, ddp, params, optimizer, prepare,
               feed.source, feed.source.steps(0), int(n_train), ckpt_path, emit, predictor,
               NeighborSampler(*feed.csr, spec.sampling.evaluation_fanouts, seed=spec.run.seed),
               feed.eval_prepare(normalize, rows),  # evaluation reads privately
               workers, StepScaler(precision), eval_steps=feed.eval_steps)
    return run, resumed


def _model(spec: ModelSpec, layers: int, run: RunSpec, dim: int, num_classes: int, device: torch.device
           ) -> tuple[torch.nn.Module, list[Tensor], torch.optim.Optimizer]:
    """The model (the same initial parameters on every rank), its trained parameters, their optimizer."""
    torch.manual_seed(run.seed)  # identical initial parameters on every rank
    model = build_model(spec.arch, dim, num_classes, layers, hidden=spec.hidden,
                        heads=spec.heads, out_heads=spec.out_heads, dropout=spec.dropout,
                        attn_dropout=spec.attn_dropout if spec.arch == "gat" else None,
                        norm=spec.gcn_norm if spec.arch == "gcn" else None).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    return model, params, torch.optim.Adam(params, lr=run.lr, weight_decay=run.weight_decay)


@dataclass
class _Run:
    """A run's parts once set up: what its epochs, steps and checkpoints use.

    ``model`` is the module itself (evaluation, checkpoints: its own
    ``state_dict``); ``ddp`` is what the steps call (DDP under several ranks,
    else the module).
    """

    spec: TrainSpec
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
    amp: StepScaler = field(default_factory=lambda: StepScaler(Precision()))  # autocast, loss scaling
    losses: list[float] = field(default_factory=list)  # this run's epochs' mean losses (training.divergence)
    watch: DatasetWatch | None = None  # the background check of the dataset's arrays
    #: (split, batch size) -> batches every rank evaluates its own vertices in (a partitioned job), else None
    eval_steps: Callable[[str, int], int | None] = lambda split, bs: None

    def start_record(self, resumed: Resumed | None, sampled_on: str, why: str) -> dict:
        features, store = self.features, getattr(self.features, "store", None)
        return {"kind": "start", "config": self.spec.to_dict(), "steps_per_epoch": self.steps,
                "start_epoch": resumed.epoch if resumed else 0, "start_step": resumed.step if resumed else 0,
                "features": type(features).__name__, "num_train": self.n_train,
                "feature_dtype": feature_dtype_of(features, self.ds),
                "precision": self.amp.precision.name,  # and the type the rows reach the model in
                "model_rows_dtype": str(self.amp.precision.rows_dtype(feature_dtype_of(features, self.ds))),
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
        # a job whose launcher was killed is not whole: its ranks are about to stop, and no checkpoint
        # of theirs may replace the last one the job wrote while it was
        save_checkpoint(self.ckpt_path, {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                                         "epoch": epoch, "step": step,
                                         "sums": None if sums is None else sums.state(), "rng": rngs,
                                         "config": self.spec.to_dict()}, whole=self.world.whole)

    def epoch(self, epoch: int, first: int, sums: Sums) -> dict:
        """Train steps ``first..`` of ``epoch``, evaluate when due, checkpoint; the epoch record (emitted)."""
        io, every = self.spec.io, self.spec.run.checkpoint_every_steps
        prior_s = sums.v["prior_s"]
        t_epoch, cpu_epoch = time.perf_counter(), time.process_time()
        moved = self.features.transfer.counts()
        disk, bins0 = ssd_reads(self.features), bin_rows(self.features)
        load0 = sample_contention(self.spec.io.placement or self.spec.dataset)
        if self.predictor is not None:
            self.predictor.start()
        pre = Prefetcher(self.source.batches(epoch, first), self.prepare, io.prefetch, self.features.transfer,
                         self.workers)
        try:
            for step in range(first, self.steps):
                rec = _step(self.ddp, self.params, self.optimizer, pre, self.world,
                            global_batch(self.source, epoch, step, self.n_train, self.spec.sampling.batch_size),
                            step, sums, epoch=epoch, amp=self.amp)
                rec.update(kind="step", epoch=epoch, step=step, steps=self.steps)
                self.emit(rec)
                if every and (step + 1) % every == 0 and step + 1 < self.steps:
                    sums.v["prior_s"] = prior_s + time.perf_counter() - t_epoch
                    self.checkpoint(epoch, step + 1, sums)
            # before the prefetcher's threads end: their time waiting for a core is in their schedstat
            contention = contention_between(load0, sample_contention(self.spec.io.placement or self.spec.dataset))
        finally:
            pre.close()
        rec = epoch_record(epoch, self.steps, sums, prior_s + time.perf_counter() - t_epoch)
        # CPU seconds of every thread of this process over this run's steps of the epoch: the work a
        # step costs, which a loaded machine's time slicing stretches less than the wall clock
        rec["cpu_s"] = time.process_time() - cpu_epoch
        rec["prefetch"] = io.prefetch
        if self.predictor is not None:
            # a batch reads each SSD bin in one call (the store's gather, bin by bin)
            calls = (self.steps - first) * sum(1 for _, rows in self.predictor.ssd_bins if rows)
            pred = self.predictor.finish(epoch, self.steps - first)
            rec["prediction"] = contention_adjust(pred.to_dict(), contention, calls)
            rec["throughput"] = self.predictor.throughput(rec, pred, calls)  # the paper's terms
        rec["contention"] = contention.to_dict()
        rec["transfers"] = moved_since(moved, self.features.transfer.counts())
        rec.update(ssd_reads(self.features, disk))
        rec["bin_rows"] = rows_since(bins0, bin_rows(self.features))  # per bin: its socket's share (socket_batches)
        self.epoch_end(epoch, rec)
        if self.watch is not None:  # before the epoch's checkpoint: none comes from damaged arrays
            self.watch.raise_if_bad()
            if epoch == self.spec.run.epochs - 1:  # the run's results are final only once all is checked
                rec["dataset_check"] = self.watch.finish()
        self.losses.append(rec["loss"])
        rec["divergence"] = check_divergence(self.losses, self.ds.num_classes, lr=self.spec.run.lr)
        self.checkpoint(epoch + 1, 0, None)
        self.emit(rec)
        return rec

    def epoch_end(self, epoch: int, rec: dict) -> None:
        """Evaluation when due, the ranks' parameter spread, what crossed between nodes: into ``rec``."""
        run, world = self.spec.run, self.world
        if epoch == run.epochs - 1 or (run.eval_every_epochs and (epoch + 1) % run.eval_every_epochs == 0):
            t_eval = time.perf_counter()
            for split in ("valid", "test"):
                idx = getattr(self.ds, f"{split}_idx")
                steps = self.eval_steps(split, self.spec.sampling.eval_batch_size)  # None: idx split over ranks
                if idx is not None and (len(idx) if steps is None else steps):
                    rec[f"{split}_acc"] = _evaluate(self.model, np.asarray(idx, np.int64), self.eval_sampler,
                                                    self.eval_prepare, world, self.spec, self.features.transfer,
                                                    self.amp.precision, steps)
            rec["eval_s"] = time.perf_counter() - t_eval
        if world.size > 1:
            rec["param_spread"] = param_spread(self.params, world, epoch)
        if hasattr(self.features, "epoch_record"):  # a sharded store: what crossed between nodes
            try:
                rec.update(self.features.epoch_record())
            except PeerLostError as exc:
                raise PeerLostError(f"epoch {epoch}: {exc}") from None


def _step(model: torch.nn.Module, params: Sequence[Tensor], optimizer: torch.optim.Optimizer, pre: Prefetcher,
          world: World, global_bs: int, step: int, sums: Sums, *, epoch: int = 0,
          amp: StepScaler | None = None) -> dict:
    """One training step of ``model`` (the DDP wrapper under several ranks); its step record.

    DDP averages the gradients over the ranks: the summed loss scaled by
    ``world.size / global_bs`` (the world's seeds at this step, :func:`training.batches.global_batch`)
    makes that average the gradient of the global
    batch's mean loss, what one process computes. A rank whose part is empty
    (the short last step over more ranks than seeds) runs the model over zero
    rows: every parameter gets a zero gradient, so DDP's all-reduce sees every
    rank. (DDP's ``join()`` would do it too, but costs every rank an extra
    all-reduce per forward on every step to learn who joined; an empty part
    happens at most once an epoch and a forward over zero rows is free.)
    ``amp``: the run's precision (autocast around the forward, loss scaling for float16); default float32.
    """
    amp = amp if amp is not None else StepScaler(Precision())
    t0 = time.perf_counter()
    try:
        item, waited = pre.get()
    except PeerLostError as exc:  # the prefetch thread's feature exchange lost a peer: say when
        raise PeerLostError(f"epoch {epoch}, step {step}: {exc}") from None
    if item is None:
        raise TrainError(f"the batch source ended before step {step}; it must yield every step of the epoch")
    item.wait()  # its copies were issued on the prefetch thread's stream  # sync-point: step-landing
    during = f"epoch {epoch}, step {step}"
    t1 = time.perf_counter()
    model.train()
    optimizer.zero_grad(set_to_none=True)
    b = item.batch
    with amp.precision.autocast():
        out = model(item.x, b.edge_index_per_layer, b.batch_size, deg=item.deg)
        loss = F.cross_entropy(out, item.y, reduction="sum")  # float32 under autocast
    with peer_errors(during):  # DDP's bucketed all-reduce runs inside backward
        amp.backward(loss * (world.size / global_bs))
    stats = torch.stack([loss.detach().float(), (out.detach().argmax(1) == item.y).sum().float()])
    mem = pre.memory
    if mem is not None and mem.accelerated:
        # the step's own work, for compute_s; torch.cuda.synchronize would wait for the prefetch
        # thread's copy stream too, folding the next batch's copies into every step
        mem.host_wait(mem.mark())  # sync-point: step-end
    t2 = time.perf_counter()
    world.all_reduce(stats, during=during)  # the global batch's summed loss and hits, on every rank
    t3 = time.perf_counter()
    # with loss scaling an overflowing gradient skips the step (the scaler's job): only the loss is refused
    grads = torch.zeros(1, device=world.device) if amp.skips_overflow else _non_finite_flag(params, world.device)
    _refuse_non_finite(torch.cat([grads, stats]), epoch, step)
    amp.step(optimizer)
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
              prepare: Callable[[SampledBatch, float], Prepared], world: World, spec: TrainSpec,
              transfer: Transfer, precision: Precision | None = None, steps: int | None = None) -> float:
    """Accuracy on ``idx``, every rank evaluating its share (``steps``: ``idx`` is its own, in that many batches:
    :func:`training.feed.eval_batches`), hits and counts summed exactly; the same sample whatever the epoch."""
    model.eval()
    _, batches = eval_batches(sampler, idx, spec.sampling.eval_batch_size, spec.run.seed, world, steps=steps)
    hits = torch.zeros(2, dtype=torch.float64, device=world.device)
    pre = Prefetcher(batches, prepare, spec.io.prefetch, transfer)
    try:
        while True:
            item, _ = pre.get()
            if item is None:
                break
            item.wait()  # sync-point: eval-landing
            if item.batch.batch_size:
                with (precision or Precision()).autocast():
                    out = model(item.x, item.batch.edge_index_per_layer, item.batch.batch_size, deg=item.deg)
                # summed where the model ran: float() here would make the host wait for every batch
                hits[0] += (out.argmax(1) == item.y).sum().to(hits.device, hits.dtype)
                hits[1] += item.batch.batch_size
    finally:
        pre.close()
    world.all_reduce(hits)
    return float(hits[0] / hits[1]) if hits[1] else 0.0


