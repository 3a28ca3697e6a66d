"""One hotness over the rows of every node type: access counts from typed pre-sampling.

The ids are global (types are ranges of one id space, :mod:`training.hetero.schema`), so the
result has the shape DDAK's placement takes, ``[num_nodes]``, and a paper row and an author row
compete for the same fast tiers by how often training reads them (the issue's "one hotness,
bins shared across types"). Counting follows :func:`training.sampler.count_accesses`: every node
of every sampled batch counts one read of its feature row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from training.data import DatasetError
from training.hetero.sampler import HeteroNeighborSampler
from training.hetero.schema import EdgeType
from training.hetero.store import HeteroDataset


def hetero_presample_counts(data: HeteroDataset, fanouts: Sequence[int] | Mapping[EdgeType, Sequence[int]], *,
                            batch_size: int, epochs: float = 1.0, seed: int = 0) -> np.ndarray:
    """int64 ``[num_nodes]`` (global ids): how often ``epochs`` of typed batches from the training split read each row.

    Raises
    ------
    DatasetError
        The dataset has no target type or no training split.
    """
    target = data.schema.target
    train = data.split("train_idx") if target is not None else None
    if target is None or train is None or len(train) == 0:
        raise DatasetError(f"{data.base.path}: no training nodes of a target type to pre-sample from")
    if batch_size <= 0 or epochs <= 0:
        raise DatasetError(f"`batch_size` ({batch_size}) and `epochs` ({epochs}) must be above 0")
    sampler = HeteroNeighborSampler(data, fanouts, seed=seed)
    offset = {t.name: t.offset for t in data.schema.node_types}
    counts = torch.zeros(data.schema.num_nodes, dtype=torch.int64)
    ids = torch.from_numpy(np.asarray(train, dtype=np.int64))
    per_epoch = math.ceil(len(ids) / batch_size)
    g = torch.Generator().manual_seed(seed)
    order = ids[torch.randperm(len(ids), generator=g)]
    for step in range(math.ceil(per_epoch * epochs)):
        if step and step % per_epoch == 0:
            order = ids[torch.randperm(len(ids), generator=g)]
        at = (step % per_epoch) * batch_size
        batch = sampler.sample(target, order[at:at + batch_size])
        for t, n_id in batch.n_id.items():
            counts.index_add_(0, n_id + offset[t], torch.ones_like(n_id))
    return counts.numpy()


__all__ = ["hetero_presample_counts"]
