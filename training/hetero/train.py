"""``moment train`` on a heterogeneous dataset: HeteroSAGE or R-GCN, features through the tiered store.

:func:`train_hetero` trains node classification on the target type (:mod:`training.hetero.model`)
with batches from :class:`training.hetero.sampler.HeteroNeighborSampler`, every featured type's
rows gathered from the placement ``moment place`` wrote (:class:`training.hetero.tiered.HeteroFeatureStore`:
GPU, host and SSD tiers) or, without one, from the dataset's memory maps. Integer-typed tables
(ogbn-mag-like uint8 features) are standardised per column (:class:`TypeNorm`): fed as raw
0..255 floats they dominate the first layer, and the first epochs' loss with it. Records, the
metrics file and the checkpoint follow the homogeneous trainer's: a ``start`` record, one per
step, one per epoch (loss, accuracy, seeds/s, rows and bytes per tier), ``checkpoint.pt``
at every epoch end, ``resume`` from it. Under ``torchrun`` the ranks train data-parallel, the
global batch one process's (:mod:`training.hetero.ranks`). ``prefetch`` batches are sampled and
gathered ahead on a background thread (:mod:`training.hetero.prefetch`; the same batches).
``precision`` (``bf16-mixed``, ``16-mixed``): the forward and evaluation under CPU autocast, the rows
gathered as float32 (autocast narrows them in the first matrix product). Not yet: a GPU (the model
and the gathers stay on the CPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.data import HeteroData

from iostack.transfer import memory_for
from training.batches import num_steps
from training.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint
from training.distributed import World, open_world, param_spread
from training.errors import TrainError
from training.hetero.model import build_model, split_ids, to_hetero_data
from training.hetero.prefetch import ahead, worker
from training.hetero.ranks import global_batch, rank_parts, rank_seed, reduced_accuracy, summed_tiers, train_step, wrap
from training.hetero.sampler import HeteroNeighborSampler
from training.hetero.store import HeteroDataset, open_hetero
from training.hetero.tiered import HeteroFeatureStore
from training.metrics import RankRecords
from training.precision import Precision, StepScaler
from training.specs import TrainSpec
from training.trainer import TrainResult
from training.vocab import HETERO_MODEL_NAMES

#: ``moment train --model`` names of heterogeneous models -> :data:`training.hetero.model.MODELS` keys
HETERO_MODELS = dict(zip(HETERO_MODEL_NAMES, ("sage", "rgcn"), strict=True))

#: rows read per type to fit a :class:`TypeNorm` (evenly spaced)
_NORM_ROWS = 1 << 16


@dataclass(frozen=True)
class TypeNorm:
    """Per-column mean and 1/std (float32, ``[width]``) of one integer-typed feature table."""

    mean: Tensor
    inv_std: Tensor

    @classmethod
    def fit(cls, table: np.ndarray) -> TypeNorm:
        """From at most :data:`_NORM_ROWS` evenly spaced rows of ``table`` (a memory map is read that much)."""
        step = max(1, table.shape[0] // _NORM_ROWS)
        x = torch.from_numpy(np.asarray(table[::step], dtype=np.float32))
        std = x.std(0, unbiased=False)
        return cls(x.mean(0), torch.where(std > 0, 1.0 / std, torch.ones_like(std)))

    def __call__(self, x: Tensor) -> Tensor:
        return (x - self.mean) * self.inv_std


class FeatureRows:
    """Float32 rows of each type by local id: from a :class:`HeteroFeatureStore`, or the memory maps.

    ``norms``: a :class:`TypeNorm` per integer-typed table (fitted here); other tables pass as
    float32.
    """

    def __init__(self, data: HeteroDataset, store: HeteroFeatureStore | None = None) -> None:
        self.data, self.store = data, store
        self.norms = {t: TypeNorm.fit(f) for t, f in data.features.items() if f.dtype.kind in "iu"}
        self.seconds = 0.0

    def __call__(self, node_type: str, ids: Tensor) -> Tensor:
        t0 = time.perf_counter()
        if self.store is not None:
            x = self.store.gather(node_type, ids).to(torch.float32)
        else:
            order = torch.argsort(ids)  # the memory map's pages in order, then back to ids' order
            rows = np.asarray(self.data.features[node_type][ids[order].numpy()], dtype=np.float32)
            x = torch.empty(rows.shape, dtype=torch.float32)
            x[order] = torch.from_numpy(rows)
        norm = self.norms.get(node_type)
        self.seconds += time.perf_counter() - t0
        return norm(x) if norm is not None else x

    def tiers(self) -> dict[str, dict[str, float]]:
        return self.store.tier_stats() if self.store is not None else {}


def train_hetero(spec: TrainSpec, *, progress: Callable[[dict], None] | None = None) -> TrainResult:
    """Train ``spec.model.arch`` (:data:`HETERO_MODELS`) on the heterogeneous dataset ``spec.dataset``.

    ``spec.io.placement``: a placement ``moment place`` wrote for this dataset (features from
    its tiers); without one the rows come from the dataset's files. Under ``torchrun`` the ranks
    train data-parallel on the CPU (gloo), each its part of every global batch
    (:mod:`training.hetero.ranks`); rank 0 writes the metrics and the checkpoint.

    Raises
    ------
    TrainError
        A model that is not heterogeneous, a `resume` without a checkpoint.
    DatasetError
        Not a heterogeneous dataset, or one without a target type and splits.
    PlacingError
        A placement of another dataset.
    """
    model = spec.model.arch
    if model not in HETERO_MODELS:
        raise TrainError(f"`arch` {model!r}: a heterogeneous dataset trains {', '.join(HETERO_MODELS)}")
    data = open_hetero(spec.dataset)
    # the model and the gathers stay on the CPU: a CPU world (gloo) whatever accelerator the host has
    world = open_world(None, memory_for("cpu"), spec.distributed.timeout_s)
    store = HeteroFeatureStore(data, spec.io.placement, backend=spec.io.backend) if spec.io.placement else None
    emit = RankRecords(spec.run.metrics_path, rank=world.rank, world_size=world.size, task="hetero",
                       progress=progress)
    try:
        return _run(spec, model, data, FeatureRows(data, store), world, emit)
    finally:
        if store is not None:
            store.close()
        emit.close()
        world.end()  # the heartbeat, and a group this run started


def _run(spec: TrainSpec, model_name: str, data: HeteroDataset, rows: FeatureRows, world: World,
         emit: Callable[[dict], None]) -> TrainResult:
    run, bs = spec.run, spec.sampling.batch_size
    torch.manual_seed(run.seed)  # the same initial parameters on every rank (DDP broadcasts rank 0's anyway)
    sampler = HeteroNeighborSampler(data, spec.sampling.fanouts, seed=rank_seed(run.seed, world.rank))
    model = build_model(data, sampler, kind=HETERO_MODELS[model_name], hidden=spec.model.hidden or 64,
                        layers=len(spec.sampling.fanouts), rows=rows)  # its forward sets the lazy widths
    opt = torch.optim.Adam(model.parameters(), lr=run.lr, weight_decay=run.weight_decay)
    ckpt = checkpoint_path(run.checkpoint_dir, run.resume)
    start = 0
    if run.resume and ckpt is not None:
        if not ckpt.exists():
            raise TrainError(f"`resume`: no checkpoint at {ckpt}; train without `resume` first")
        state = load_checkpoint(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["epoch"]) + 1
    ddp = wrap(model, world)
    amp = StepScaler(Precision.of(run.precision, "cpu"))  # autocast to bfloat16 or float16 on the CPU
    train = split_ids(data, "train_idx")
    steps = num_steps(len(train), bs)
    emit({"kind": "start", "config": spec.to_dict(), "model": model_name, "steps_per_epoch": steps,
          "num_train": len(train), "device": "cpu", "features": "tiered" if rows.store else "memory",
          "parameters": sum(p.numel() for p in model.parameters()), "start_epoch": start, "start_step": 0})
    eval_sampler = sampler if spec.sampling.eval_fanouts is None else HeteroNeighborSampler(
        data, spec.sampling.eval_fanouts, seed=rank_seed(run.seed, world.rank))
    world.barrier()  # everyone set up: the steps' short timeouts start from here
    with worker() as pool:
        records = [_epoch_and_eval(spec, model_name, (model, ddp, opt, amp, pool), data, (sampler, eval_sampler),
                                   rows, train, world, ckpt, epoch, emit) for epoch in range(start, run.epochs)]
    return TrainResult(model=model, epochs=tuple(records), resumed_from=(start, 0) if run.resume else None,
                       world_size=world.size, rank=world.rank)


def _epoch_and_eval(spec: TrainSpec, model_name: str,
                    parts: tuple[nn.Module, nn.Module, torch.optim.Optimizer, StepScaler, Executor],
                    data: HeteroDataset,
                    samplers: tuple[HeteroNeighborSampler, HeteroNeighborSampler], rows: FeatureRows, train: Tensor,
                    world: World, ckpt: Path | None, epoch: int, emit: Callable[[dict], None]) -> dict:
    """Epoch ``epoch``, its evaluation when due, the checkpoint; its record (emitted).

    ``parts``: the bare model, its DDP wrapper, the optimiser, the precision's step scaler, the prefetch thread.
    """
    run, bs = spec.run, spec.sampling.batch_size
    model, ddp, opt, amp, pool = parts
    sampler, eval_sampler = samplers
    rec = _epoch(ddp, opt, data, sampler, rows, train, bs, (world, run.seed, spec.io.prefetch, amp, pool), epoch,
                 emit)
    if epoch == run.epochs - 1 or (run.eval_every_epochs and (epoch + 1) % run.eval_every_epochs == 0):
        for split in ("valid", "test"):
            if data.split(f"{split}_idx") is not None:
                rec[f"{split}_acc"] = reduced_accuracy(model, data, eval_sampler, split_ids(data, f"{split}_idx"),
                                                       spec.sampling.eval_batch_size, rows, world,
                                                       amp.precision)
    if world.size > 1:
        rec["param_spread"] = param_spread(list(model.parameters()), world, epoch)
    if ckpt is not None:
        if world.rank == 0:
            save_checkpoint(ckpt, {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch,
                                   "arch": model_name}, whole=world.whole)
        world.barrier()  # no rank runs ahead of the checkpoint it could resume from
        rec["checkpoint"] = str(ckpt)
    emit(rec)
    return rec


def _epoch(model: nn.Module, opt: torch.optim.Optimizer, data: HeteroDataset, sampler: HeteroNeighborSampler,
           rows: FeatureRows, train: Tensor, bs: int, how: tuple[World, int, int, StepScaler, Executor], epoch: int,
           emit: Callable[[dict], None]) -> dict:
    """One epoch over the target type's training nodes, this rank's part of each global batch; its record.

    ``how``: the world, the run's seed, how many batches are made ahead (``prefetch``), the precision, the
    prefetch thread.
    """
    world, seed, prefetch, amp, pool = how
    target = str(data.schema.target)
    t_epoch = time.perf_counter()
    parts = rank_parts(train, epoch, bs, world, seed)
    before = rows.tiers()
    rows.seconds = 0.0
    loss_sum = seeds = 0.0
    model.train()
    timing = {"sample_s": 0.0}

    def make(step: int) -> HeteroData:  # on the prefetch thread when `prefetch` > 0, in step order
        t0 = time.perf_counter()
        b = sampler.sample(target, parts[step])
        timing["sample_s"] += time.perf_counter() - t0
        return to_hetero_data(b, data, rows)

    t0 = time.perf_counter()
    for step, batch in enumerate(ahead(make, len(parts), prefetch, pool)):
        global_bs = global_batch(train, step, bs)
        loss, n = train_step(model, opt, world, batch, target, global_bs, f"epoch {epoch}, step {step}", amp)
        loss_sum += loss
        seeds += n
        emit({"kind": "step", "epoch": epoch, "step": step, "steps": len(parts), "seeds": int(n),
              "loss": loss / max(n, 1.0), "step_s": time.perf_counter() - t0})
        t0 = time.perf_counter()
    after = rows.tiers()
    tiers = {k: {"rows": int(v["rows"] - before.get(k, {}).get("rows", 0)),
                 "bytes": int(v["bytes"] - before.get(k, {}).get("bytes", 0))} for k, v in after.items()}
    epoch_s = time.perf_counter() - t_epoch
    return {"kind": "epoch", "epoch": epoch, "steps": len(parts), "loss": loss_sum / max(seeds, 1.0),
            "seeds": int(seeds), "epoch_s": epoch_s, "seeds_per_s": seeds / epoch_s if epoch_s > 0 else 0.0,
            "tiers": summed_tiers(tiers, world) if world.size > 1 else tiers, "sample_s": timing["sample_s"],
            "gather_s": rows.seconds}


__all__ = ["HETERO_MODELS", "TypeNorm", "FeatureRows", "train_hetero"]
