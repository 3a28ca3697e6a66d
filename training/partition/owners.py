"""Feature ownership that follows a partitioning: the :class:`~iostack.shards.ShardLayout` of ``moment place --nodes
N --partition OUT``.

:func:`partition_layout` opens ``OUT`` (a ``moment data partition`` output),
checks that it was made from this dataset (its fingerprint's digest) into as
many parts as there are nodes, and hands ``part_of`` (old id → partition) to
:func:`iostack.shards.partition_rows`, with the hottest rows replicated as
for hash ownership. Node ``k`` then holds its partition's rows (in the
dataset's own ids, increasing), and a rank training on its partition's seeds
finds most of its batches' rows at home (``tools/bench_partition.py``).
"""

from __future__ import annotations

import os

import numpy as np

from iostack.shards import ShardLayout, partition_rows
from training.data import Dataset, fingerprint
from training.partition import PartitionError
from training.partition.read import open_partition
from training.partition.write import digest_of


def partition_layout(ds: Dataset, path: str | os.PathLike[str], nodes: int, *, hotness: np.ndarray | None = None,
                     replicas: int = 1, hot_rows: int = 0, groups: int = 1) -> ShardLayout:
    """The layout whose owners are ``path``'s partitions of ``ds``; with ``groups`` replica groups, every group's
    ``nodes / groups`` nodes hold one partition each (the partitioned rows once per group).

    Raises
    ------
    PartitionError
        ``path`` is not a partitioning of ``ds`` (another dataset's, or of another vertex count), or has other than
        ``nodes / groups`` parts.
    """
    pt = open_partition(path)
    src = pt.manifest.get("source") or {}
    if src.get("digest") != digest_of(fingerprint(ds)):
        raise PartitionError(f"{path}: partitions {src.get('path')}, not {ds.path} (their fingerprints differ); "
                             "partition this dataset")
    per_group = int(nodes) // max(1, int(groups))
    if pt.parts != per_group:
        if int(groups) > 1:
            raise PartitionError(f"`partition` {path} has {pt.parts} parts, but `nodes` {nodes} over `groups` "
                                 f"{groups} gives each replica group {per_group} nodes (one partition a node): "
                                 f"place over {pt.parts * int(groups)} nodes or partition into {per_group}")
        raise PartitionError(f"`partition` {path} has {pt.parts} parts, `nodes` is {nodes}: place over "
                             f"{pt.parts} nodes or partition into {nodes}")
    return partition_rows(np.asarray(pt.part_of), hotness, replicas, hot_rows, num_nodes=int(nodes),
                          groups=int(groups))


__all__ = ["partition_layout"]
