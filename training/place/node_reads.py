"""What each node's tiers and locality cache are chosen by when the rows follow a partition.

Under ``moment place --nodes N --partition OUT`` node ``k``'s ranks train on its
partition's training seeds (:mod:`training.distsample`), so the reads a node's
rows get are not the dataset's hotness: they are the reads its own ranks make
of them plus the reads it serves to the other nodes, less what those nodes find
in their locality caches. :func:`node_hotness` measures that by pre-sampling
every node's own seeds (:func:`training.sampler.count_accesses`, the hotness
spec's fan-outs, batch size and seed, at least :data:`MIN_EPOCHS` epochs):

* ``reads[k]`` (``[V]``, per epoch): the rows node ``k``'s batches gather;
* ``halo[k]``: the rows node ``k`` does not hold, the most read by its own
  batches first (ties by id), then the partition's halo rows its pre-sample
  did not reach (the in-neighbours its rows list, :mod:`training.partition`):
  what its locality cache is filled from, the first ``budget`` of them;
* ``hotness[k]`` (over the node's rows, increasing global id: its local ids):
  ``reads[k]`` plus, for every other node ``j``, ``reads[j]`` of the rows ``k``
  serves ``j`` (:meth:`iostack.shards.ShardLayout.server_of`) that ``j``'s
  cache of ``cache_rows`` rows does not hold. DDAK places the node's rows by it.

Memory: ``reads`` is float32 ``[N, V]``, 4 N bytes a vertex (1.8 GB for 1.1e8
vertices over 4 nodes), plus each node's hotness over its rows once.

>>> import numpy as np
>>> from iostack.shards import partition_rows
>>> lay = partition_rows(np.array([0, 0, 1, 1]))
>>> reads = np.array([[3., 1., 2., 0.], [0., 5., 1., 4.]], np.float32)
>>> [h.tolist() for h in served_hotness(reads, lay, [np.empty(0, np.int64)] * 2)]
[[3.0, 6.0], [3.0, 4.0]]
>>> halo_ranking(reads[0], lay.holds(0), np.array([3])).tolist()
[2, 3]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from iostack.shards import ShardLayout
from planner.progress import Progress, report
from training.data import Dataset
from training.hotness import HotnessSpec

#: the fewest epochs of its seeds a node's pre-sample covers (unless the spec counts batches): one epoch's counts
#: rank the remote rows too noisily for the cache (tools/bench_partition_place.py --presample-epochs 1: the halo
#: cache then leaves 0.5-1.4 points more remote than a cache of the dataset's hottest rows on the skewed graphs; at
#: 3 it leaves fewer on every graph measured)
MIN_EPOCHS = 3.0


@dataclass(frozen=True)
class NodeHotness:
    """Per node: ``hotness`` over its rows (local ids), ``halo`` (global ids, its cache's order), ``reads`` [N, V].

    ``epochs``: the epochs of each node's seeds the pre-sample covered (the reads are per epoch).
    """

    hotness: tuple[np.ndarray, ...]
    halo: tuple[np.ndarray, ...]
    reads: np.ndarray
    epochs: float


def node_seeds(train_idx: np.ndarray, layout: ShardLayout) -> list[np.ndarray]:
    """Each node's training seeds: those its partition owns (``layout.owner``), increasing.

    >>> from iostack.shards import partition_rows
    >>> [s.tolist() for s in node_seeds(np.array([0, 1, 3]), partition_rows(np.array([1, 0, 0, 1])))]
    [[1], [0, 3]]
    """
    t = np.sort(np.asarray(train_idx, np.int64))
    owner = layout.owner[t]
    return [t[owner == k] for k in range(layout.num_nodes)]


def node_reads(ds: Dataset, layout: ShardLayout, spec: HotnessSpec, *, train_idx: np.ndarray | None = None,
               progress: Progress | None = None) -> tuple[np.ndarray, float]:
    """Every node's reads of every row, per epoch of its own seeds (float32 ``[N, V]``), and the epochs covered.

    Each node's seeds (of ``train_idx``, default the dataset's) are
    pre-sampled as the dataset's are for its hotness
    (:func:`training.hotness.presample_counts`), with ``spec.seed`` plus the
    node's number, so no two nodes draw alike.
    """
    import torch

    from training.sampler import NeighborSampler, count_accesses

    seeds = node_seeds(np.asarray(ds.train_idx if train_idx is None else train_idx), layout)
    out = np.zeros((layout.num_nodes, layout.num_vertices), np.float32)
    epochs = spec.epochs
    for k, mine in enumerate(seeds):
        if not mine.size:
            continue
        report(progress, f"node {k}: pre-sampling its {mine.size:,} seeds")
        sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=spec.fanouts, seed=spec.seed + k)
        per_epoch = -(-mine.size // spec.batch_size)
        batches = spec.num_batches if spec.num_batches is not None else None
        counts = count_accesses(sampler, mine, spec.batch_size, num_batches=batches, epochs=spec.epochs,
                                shuffle_seed=spec.seed + k)
        c = counts.numpy() if isinstance(counts, torch.Tensor) else np.asarray(counts)
        covered = (batches / per_epoch) if batches is not None else spec.epochs
        out[k] = c / max(covered, 1e-12)
        epochs = covered
    return out, float(epochs)


def halo_ranking(reads: np.ndarray, held: np.ndarray, halo: np.ndarray | None = None) -> np.ndarray:
    """Rows not ``held``: those ``reads`` reaches, most read first (ties by id), then unread ``halo`` rows by id."""
    reads = np.asarray(reads)
    cand = np.flatnonzero((reads > 0) & ~np.asarray(held, bool))
    ranked = cand[np.lexsort((cand, -reads[cand].astype(np.float64)))]
    if halo is None or not np.size(halo):
        return ranked.astype(np.int64)
    h = np.unique(np.asarray(halo, np.int64))
    rest = h[~np.asarray(held, bool)[h] & (reads[h] <= 0)]
    return np.concatenate([ranked, rest]).astype(np.int64)


def served_hotness(reads: np.ndarray, layout: ShardLayout, cached: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per node, over its rows (local ids): its own reads plus the reads it serves that no cache absorbs.

    ``cached[j]``: the global ids node ``j``'s locality cache holds. Memory: the nodes' rows once (float64), no
    ``[N, V]`` copy of ``reads``.
    """
    rows = [layout.rows_of(k) for k in range(layout.num_nodes)]
    total = [np.asarray(reads[k], np.float64)[rows[k]] for k in range(layout.num_nodes)]
    for j in range(layout.num_nodes):
        miss = (reads[j] > 0) & ~layout.holds(j)
        miss[np.asarray(cached[j], np.int64)] = False
        ids = np.flatnonzero(miss)
        if not ids.size:
            continue
        srv = layout.server_of(ids, j)
        for s in np.unique(srv):
            got = ids[srv == s]
            total[s][np.searchsorted(rows[s], got)] += reads[j, got]  # rows_of is increasing: local id by search
    return total


def remote_shares(reads: np.ndarray, layout: ShardLayout, cached: Sequence[np.ndarray]) -> tuple[float, float]:
    """The share of every node's reads (``[N, V]``) that its node does not hold, and of those its cache does not hold
    either (``cached[k]``: global ids): what ``moment plan --nodes N --remote-share`` takes.

    >>> from iostack.shards import partition_rows
    >>> remote_shares(np.array([[3., 1., 2., 0.], [0., 5., 1., 4.]]), partition_rows(np.array([0, 0, 1, 1])),
    ...               [np.array([2]), np.empty(0, np.int64)])
    (0.4375, 0.3125)
    """
    total = float(np.asarray(reads, np.float64).sum())
    remote = cache = 0.0
    for k in range(layout.num_nodes):
        remote += float(reads[k][~layout.holds(k)].sum())
        cache += float(reads[k][np.asarray(cached[k], np.int64)].sum())
    return (remote / total, (remote - cache) / total) if total else (0.0, 0.0)


def node_hotness(ds: Dataset, layout: ShardLayout, spec: HotnessSpec, *, cache_rows: int = 0,
                 halos: Sequence[np.ndarray] | None = None, progress: Progress | None = None) -> NodeHotness:
    """Each node's hotness over its rows and its locality cache's order (see the module docstring).

    The pre-sample covers at least :data:`MIN_EPOCHS` epochs of every node's seeds.
    ``cache_rows``: the rows each node's locality cache will hold (its byte
    budget over a row's bytes; 0: none); ``halos[k]``: partition ``k``'s halo
    rows in the dataset's ids (None: the pre-sample's alone).
    """
    if spec.num_batches is None and spec.epochs < MIN_EPOCHS:
        spec = replace(spec, epochs=MIN_EPOCHS)
    reads, epochs = node_reads(ds, layout, spec, progress=progress)
    halo = tuple(halo_ranking(reads[k], layout.holds(k), None if halos is None else halos[k])
                 for k in range(layout.num_nodes))
    hot = served_hotness(reads, layout, [h[:max(0, int(cache_rows))] for h in halo])
    return NodeHotness(tuple(h.astype(np.float32) for h in hot), halo, reads, epochs)


def partition_halos(path: str, parts: int) -> list[np.ndarray]:
    """Every partition's halo rows of a ``moment data partition`` output, in the dataset's own ids."""
    from training.partition.read import open_partition

    pt = open_partition(path)
    old = np.asarray(pt.old_ids)
    return [old[np.asarray(pt.part(k).halo, np.int64)] for k in range(parts)]


__all__ = ["MIN_EPOCHS", "NodeHotness", "halo_ranking", "node_hotness", "node_reads", "node_seeds", "partition_halos",
           "remote_shares", "served_hotness"]
