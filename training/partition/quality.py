"""How good a partitioning is for training: the remote share of sampled rows, by a short pre-sampling.

A rank trains on its partition's training seeds; every feature row its
mini-batches gather (the sampled ``n_id``, :func:`training.sampler.count_accesses`'s
unit) that its node does not hold is read from another node. The *remote share*
is that count over all the rows gathered, every rank summed. It is measured
here for any set of row layouts (:class:`iostack.shards.ShardLayout`: who holds
each row) on the same batches, so partition ownership, hash ownership
(``v mod P``), random ownership and today's deal by hotness
(:func:`iostack.shards.shard_rows`) are compared side by side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from iostack.shards import ShardLayout
from training.data import Dataset
from training.partition import PartitionError


@dataclass(frozen=True)
class RemoteShare:
    """Rows gathered by every rank's batches (``rows``) and, per layout name, how many of them were remote."""

    rows: int
    remote: dict[str, int]
    batches: int

    def share(self, name: str) -> float:
        return self.remote[name] / self.rows if self.rows else 0.0


def hash_layout(num_vertices: int, parts: int) -> ShardLayout:
    """Ownership by ``v mod parts`` (what hashing the ids gives), one holder a row."""
    owner = (np.arange(num_vertices, dtype=np.int64) % parts).astype(np.int16)
    return ShardLayout(parts, 1, owner, np.ones(num_vertices, np.uint8))


def random_layout(num_vertices: int, parts: int, seed: int = 0) -> ShardLayout:
    """Ownership drawn uniformly at random (DistDGL's "random partition" baseline), one holder a row."""
    owner = np.random.default_rng(seed).integers(0, parts, num_vertices).astype(np.int16)
    return ShardLayout(parts, 1, owner, np.ones(num_vertices, np.uint8))


def remote_share(ds: Dataset, part_of: np.ndarray, layouts: Mapping[str, ShardLayout], *,
                 fanouts: tuple[int, ...] = (10, 5), batch_size: int = 1024, batches_per_rank: int = 4,
                 seed: int = 0) -> RemoteShare:
    """Sample ``batches_per_rank`` batches of every rank's seeds (its partition's ``train_idx``, by ``part_of``) and
    count the gathered rows each layout holds elsewhere.

    Ranks without seeds sample nothing. Ids are the dataset's own (``part_of``
    and the layouts over ``ds``'s vertices, old ids).

    Raises
    ------
    PartitionError
        The dataset has no training seeds, or a layout covers another vertex count.
    """
    from training.sampler import NeighborSampler

    if ds.train_idx is None or ds.train_idx.shape[0] == 0:
        raise PartitionError(f"{ds.path}: no training seeds (train_idx.npy) to pre-sample the remote share from")
    for name, lay in layouts.items():
        if lay.num_vertices != ds.num_nodes:
            raise PartitionError(f"layout {name!r} covers {lay.num_vertices:,} rows, the dataset {ds.num_nodes:,}")
    po = np.asarray(part_of)
    parts = int(po.max()) + 1
    train = np.asarray(ds.train_idx, np.int64)
    rng = np.random.default_rng(seed)
    sampler = NeighborSampler(np.asarray(ds.indptr), np.asarray(ds.indices), fanouts=fanouts, seed=seed)
    remote = dict.fromkeys(layouts, 0)
    holds = {name: [lay.holds(k) for k in range(lay.num_nodes)] for name, lay in layouts.items()}
    rows = batches = 0
    for k in range(parts):
        mine = rng.permutation(train[po[train] == k])
        for b in range(min(batches_per_rank, math.ceil(mine.size / batch_size))):
            n_id = sampler.sample(mine[b * batch_size:(b + 1) * batch_size]).n_id.numpy()
            rows += int(n_id.size)
            batches += 1
            for name, lay in layouts.items():
                node = k % lay.num_nodes
                remote[name] += int(n_id.size - holds[name][node][n_id].sum())
    return RemoteShare(rows, remote, batches)


__all__ = ["RemoteShare", "hash_layout", "random_layout", "remote_share"]
