"""One rank's share of a partitioned dataset, in the partition's vertex ids: what partitioned training opens.

``moment train --partition OUT`` without a placement trains in the *new* ids of ``OUT``
(:mod:`training.partition`'s format): rank ``r`` opens the shared index every rank holds (the
relabelled global ``indptr``, ``old_ids``), partition ``r``'s directory (its slice of ``indices``,
its feature rows, labels and seeds) and, of the source dataset, only ``meta.json`` and
``train_idx.npy`` (the training split's order, which the epochs' global batches follow so that
they are the single process's). The global ``features.npy``, ``indices.npy`` and ``labels.npy``
are never opened: rows of other partitions come through the feature exchange
(:class:`training.partition.features.PartitionFeatures`), neighbour lists through the sampler's
(:class:`training.distsample.DistributedNeighbours`).

:attr:`RankView.dataset` is a :class:`~training.data.Dataset` the trainer reads as it reads any:
new ids throughout, ``indptr`` the global relabelled one, but ``indices`` only this rank's edge
slice, ``features`` None, ``labels`` ``[N]`` with this partition's labels in its id range and -1
elsewhere (a rank looks up labels only of its own seeds, training and evaluation alike), and the
splits this partition's (new ids, increasing). Held per rank: ``16 N`` bytes of shared index plus
``8 N`` of labels, and ``1/P`` of the indices and features.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data import Dataset, read_meta
from training.errors import TrainError
from training.partition.read import PartData, Partitioned, open_partition

__all__ = ["RankView", "open_rank_view"]


@dataclass(frozen=True, eq=False)
class RankView:
    """What rank ``part.part`` of a partitioned job holds (see the module doc)."""

    whole: Partitioned
    part: PartData
    dataset: Dataset
    #: the dataset's training split in its own order, new ids (int64): the walk of every epoch's global batches
    train_order: np.ndarray

    @property
    def node_offsets(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.whole.node_offsets)

    def eval_steps(self, split: str, batch_size: int) -> int:
        """Batches every rank evaluates ``split`` (``valid``/``test``) in: the most any partition needs.

        Every rank runs as many, the short ones over empty batches, because each batch's sampling
        and feature exchange is a collective of all ranks.
        """
        counts = [int(p["seeds"].get(split, 0)) for p in self.whole.manifest["parts_detail"]]
        return max((math.ceil(c / int(batch_size)) for c in counts), default=0)


def _check_fits(whole: Partitioned, meta: dict, dataset: str | os.PathLike[str], path: str | os.PathLike[str],
                world_size: int) -> None:
    if whole.parts != world_size:
        raise TrainError(f"`partition` {path}: {whole.parts} partitions for {world_size} ranks; start one rank "
                         "per partition")
    for key in ("num_nodes", "num_edges"):
        if int(whole.manifest[key]) != int(meta[key]):
            raise TrainError(f"`partition` {path}: a graph of {whole.manifest[key]} {key[4:]}, the dataset {dataset} "
                             f"has {meta[key]}: partition this dataset (`moment data partition`)")


def open_rank_view(dataset: str | os.PathLike[str], path: str | os.PathLike[str], rank: int,
                   world_size: int) -> RankView:
    """Rank ``rank``'s :class:`RankView` of the partitioning ``path`` of ``dataset``.

    Raises
    ------
    TrainError
        Another number of partitions than ranks, a partitioning of another graph, a partition
        written without features or labels, a dataset without a training split.
    PartitionError
        ``path`` is not a readable ``moment data partition`` output.
    DatasetError
        ``dataset`` has no readable ``meta.json``.
    """
    meta = read_meta(dataset)
    whole = open_partition(path)
    _check_fits(whole, meta, dataset, path, world_size)
    part = whole.part(rank)
    if part.features is None or part.labels is None or int(meta.get("num_classes", 0)) < 1:
        raise TrainError(f"`partition` {path}: partition {rank} has no feature rows or labels; partition a dataset "
                         "with features and labels")
    train_file = Path(dataset) / "train_idx.npy"
    if "train_idx" not in meta["files"] or part.train_idx is None:
        raise TrainError(f"{dataset}: the dataset has no training split (train_idx.npy); import it with a split")
    n = int(meta["num_nodes"])
    new_of_old = np.empty(n, np.int64)
    new_of_old[np.asarray(whole.old_ids)] = np.arange(n, dtype=np.int64)
    train_order = new_of_old[np.asarray(np.load(train_file, mmap_mode="r"), np.int64)]
    lo, hi = part.node_range
    labels = np.full(n, -1, np.int64)
    labels[lo:hi] = part.labels
    if (labels[np.asarray(part.train_idx)] < 0).any():
        raise TrainError(f"{dataset}: some training vertices are unlabelled (label -1); fix the split")
    ds = Dataset(path=Path(dataset), meta=meta, indptr=whole.indptr, indices=part.indices, features=None,
                 labels=labels, train_idx=part.train_idx, valid_idx=part.valid_idx, test_idx=part.test_idx)
    return RankView(whole, part, ds, train_order)
