"""What every partitioner shares: the checks of its inputs and the weights it balances.

Partitions are balanced on three counts at once, as DistDGL asks METIS to:
vertices, training seeds (``train_idx``: each rank trains on its own seeds, so
seeds set the step time) and CSR entries (the edges a rank samples from and
stores). :func:`seed_mask` gives the seeds as one byte a vertex.
"""

from __future__ import annotations

import numpy as np

from training.data import Dataset
from training.partition import PartitionError

#: partitions are numbered in int16 (as a shard layout's owners)
MAX_PARTS = 1 << 15


def check_parts(ds: Dataset, parts: int) -> int:
    """``parts`` as an int once it is a count the dataset can be split into.

    Raises
    ------
    PartitionError
        ``parts`` below 1, above the vertex count or above :data:`MAX_PARTS`.
    """
    p = int(parts)
    if p < 1:
        raise PartitionError(f"`parts` {parts}: expected at least 1")
    if p > ds.num_nodes:
        raise PartitionError(f"`parts` {parts}: more partitions than the {ds.num_nodes:,} vertices of {ds.path}; "
                             "ask for fewer")
    if p > MAX_PARTS:
        raise PartitionError(f"`parts` {parts}: at most {MAX_PARTS} partitions")
    return p


def seed_mask(ds: Dataset) -> np.ndarray:
    """int8 ``[N]``: 1 at the training seeds (``train_idx``), 0 elsewhere (all 0 without a split)."""
    mask = np.zeros(ds.num_nodes, np.int8)
    if ds.train_idx is not None:
        mask[np.asarray(ds.train_idx)] = 1
    return mask
