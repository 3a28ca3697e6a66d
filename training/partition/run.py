"""``moment data partition``'s work: choose a partitioner, partition, write the format, measure the remote share.

:func:`partition_dataset` is the call the command makes (and a library user):
it opens nothing itself beyond what it is given and returns a
:class:`PartitionResult` with the manifest, the seconds each stage took and,
when asked, the remote share of a short pre-sampling under partition, hash and
random ownership (:mod:`training.partition.quality`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from momentbase.jsontypes import JsonObject
from planner.progress import Progress
from training.data import Dataset
from training.partition import PARTITIONERS, default_method
from training.partition.common import check_parts
from training.partition.quality import RemoteShare, hash_layout, random_layout, remote_share
from training.partition.write import write_partition


@dataclass(frozen=True)
class PartitionResult:
    """The manifest written, ``part_of`` (old id → partition), seconds partitioning and writing, the remote share."""

    manifest: JsonObject
    part_of: np.ndarray
    partition_s: float
    write_s: float
    remote: RemoteShare | None = None


def partition_dataset(ds: Dataset, out: str | os.PathLike[str], parts: int, *, method: str | None = None,
                      overwrite: bool = False, seed: int = 0, presample_batches: int = 4,
                      fanouts: tuple[int, ...] = (10, 5), batch_size: int = 1024,
                      progress: Progress | None = None) -> PartitionResult:
    """Partition ``ds`` into ``parts`` with ``method`` (None: :func:`~training.partition.default_method`) and write
    ``out``; with ``presample_batches`` > 0, the remote share of that many batches a rank.

    Raises
    ------
    PartitionError
        ``parts`` out of range, an unknown ``method``, ``out`` not empty without ``overwrite``.
    """
    p = check_parts(ds, parts)
    name = method or default_method(ds.num_edges)
    fn = PARTITIONERS.get(name)
    t0 = time.perf_counter()
    part_of = fn(ds, p, seed=seed, progress=progress)
    t1 = time.perf_counter()
    man = write_partition(ds, part_of, p, out, method=name, overwrite=overwrite, progress=progress)
    t2 = time.perf_counter()
    remote = None
    if presample_batches > 0 and ds.train_idx is not None and ds.train_idx.shape[0] and p > 1:
        if progress is not None:
            progress("pre-sampling the remote share", 0, None)
        from iostack.shards import partition_rows

        layouts = {"partition": partition_rows(part_of, num_nodes=p), "hash": hash_layout(ds.num_nodes, p),
                   "random": random_layout(ds.num_nodes, p, seed)}
        remote = remote_share(ds, part_of, layouts, fanouts=fanouts, batch_size=batch_size,
                              batches_per_rank=presample_batches, seed=seed)
    return PartitionResult(man, part_of, t1 - t0, t2 - t1, remote)


__all__ = ["PartitionResult", "partition_dataset"]
