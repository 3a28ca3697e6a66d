"""Heterogeneous training over several ranks: DDP over a ``to_hetero`` model, a global-batch step, a reduced accuracy.

The split of the seeds is the homogeneous trainer's (:func:`training.batches.epoch_seeds`): at each
step the world trains on the ``batch_size`` target seeds one process would, rank ``r`` of ``W``
on part ``r`` of them, so every seed is trained once an epoch and every rank runs the same number
of steps (a part may be empty on a short last step: the model then runs over zero rows, every
parameter still takes part in DDP's all-reduce). Each rank sums its part's loss and scales it by
``W / global batch``: DDP's average of the gradients is then the gradient of the global batch's
mean loss, what one process computes. With full neighbourhoods (fan-out ``-1``) the batches'
outputs per seed are the one process's, so the losses agree to float rounding (in float32); with sampled
fan-outs each rank draws from its own stream (the expectation agrees, the draws do not).

The models hold lazy input widths (``Linear(-1, ...)``, ``SAGEConv((-1, -1), ...)``): they are set
by one forward pass before the model is wrapped (:func:`training.hetero.model.build_model` runs it),
as PyG's documentation of lazy modules asks of ``DistributedDataParallel``. ``to_hetero`` makes one
convolution per relation and layer, some of whose outputs never reach the target type's loss (the
last layer's relations into other types): DDP is told so (``find_unused_parameters``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.data import HeteroData

from training.batches import epoch_seeds
from training.distributed import World, peer_errors
from training.hetero.model import Rows, to_hetero_data
from training.hetero.sampler import HeteroNeighborSampler
from training.hetero.store import HeteroDataset
from training.precision import Precision, StepScaler


def wrap(model: nn.Module, world: World) -> nn.Module:
    """``model`` under DistributedDataParallel on the world's step group (several ranks), else itself.

    DDP broadcasts rank 0's parameters on construction; call it after a checkpoint is loaded and
    after the lazy widths are set.
    """
    if world.size <= 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    with peer_errors("setting up DistributedDataParallel over the heterogeneous model"):
        return DistributedDataParallel(model, process_group=world.group, find_unused_parameters=True)


def rank_parts(train: Tensor, epoch: int, batch_size: int, world: World, seed: int) -> list[Tensor]:
    """This rank's target seeds (local ids) at every step of ``epoch`` (:func:`training.batches.epoch_seeds`)."""
    return epoch_seeds(train, epoch, batch_size, rank=world.rank, world_size=world.size, seed=seed)


def global_batch(train: Tensor, step: int, batch_size: int) -> int:
    """The world's seeds at ``step``: ``batch_size``, the last step short."""
    return min(batch_size, len(train) - step * batch_size)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, world: World, batch: HeteroData, target: str,
               global_bs: int, during: str, amp: StepScaler | None = None) -> tuple[float, float]:
    """One step on this rank's part ``batch``; the global batch's summed loss and the world's seeds.

    ``model``: the DDP wrapper under several ranks. ``amp``: the run's precision (the forward under
    autocast, the loss in float32, float16's loss scaling); default float32.
    """
    amp = amp if amp is not None else StepScaler(Precision())
    n = batch[target].batch_size
    with amp.precision.autocast():
        out = model(batch)[target][:n]
    loss = nn.functional.cross_entropy(out.float(), batch[target].y[:n], reduction="sum")
    opt.zero_grad()
    with peer_errors(during):  # DDP's bucketed all-reduce runs inside backward
        amp.backward(loss * (world.size / global_bs))
    stats = world.all_reduce(torch.stack([loss.detach().double(), torch.tensor(float(n), dtype=torch.float64)]),
                             during=during)
    amp.step(opt)
    return float(stats[0]), float(stats[1])


@torch.no_grad()
def reduced_accuracy(model: nn.Module, data: HeteroDataset, sampler: HeteroNeighborSampler, ids: Tensor,
                     batch_size: int, rows: Rows | None, world: World, precision: Precision | None = None) -> float:
    """Share of ``ids`` (target local ids) classified right, each rank classifying its part of them.

    The hits and counts are summed across ranks exactly (integers in float64), so the answer is
    one process's on the same batches. ``model``: the bare model (no DDP: evaluation has no
    gradients to reduce, and the ranks' batch counts may differ).
    """
    target = str(data.schema.target)
    mine = torch.tensor_split(ids, world.size)[world.rank]
    right = 0
    model.eval()
    for at in range(0, len(mine), batch_size):
        batch = to_hetero_data(sampler.sample(target, mine[at:at + batch_size]), data, rows)
        n = batch[target].batch_size
        with (precision or Precision()).autocast():
            out = model(batch)[target][:n]
        right += int((out.argmax(1) == batch[target].y[:n]).sum())
    hits = world.all_reduce(torch.tensor([right, len(mine)], dtype=torch.float64), during="evaluation")
    return float(hits[0] / hits[1]) if hits[1] else 0.0


def summed_tiers(tiers: dict[str, dict[str, int]], world: World) -> dict[str, dict[str, int]]:
    """Rows and bytes read per tier, summed over the ranks (every rank calls it)."""
    out: dict[str, dict[str, int]] = {}
    for part in world.gather_objects(tiers, "summing the ranks' reads per tier"):
        for k, v in part.items():
            acc = out.setdefault(k, {"rows": 0, "bytes": 0})
            acc["rows"] += int(v["rows"])
            acc["bytes"] += int(v["bytes"])
    return out


def rank_seed(seed: int, rank: int) -> int:
    """The sampler seed of ``rank``: ``seed`` on rank 0 (one process samples as before), its own stream elsewhere."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, rank]).generate_state(1, np.uint64)[0] >> np.uint64(1))


__all__ = ["global_batch", "rank_parts", "rank_seed", "reduced_accuracy", "summed_tiers", "train_step", "wrap"]
