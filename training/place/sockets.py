"""Each socket's reads, for a plan whose GPUs span sockets: what socket-aware placement keeps local.

A row read by the GPUs of one socket is best kept on that socket's bins (its memory, its SSDs):
reading it from the other socket's crosses the inter-socket link (QPI/UPI), which the paper's
§4.5 (Figure 17) counts. :func:`training.place.policy.place` takes the reads per socket
(``group_reads``) and keeps rows near their readers (:class:`planner.affinity.Affinity`).

Data-parallel ranks that each take a random part of every batch all read alike, and then no
placement can keep more reads local than another (every bin's reads reach every socket in the
same proportion). Reads differ by socket when each socket's GPUs train on their own part of the
training vertices: :func:`socket_seed_split` cuts the sorted training vertices into one
contiguous range per socket, sized by its GPUs (vertex ids of real graphs carry locality: a
crawl's, a partitioner's or a community's order), and :func:`socket_reads` pre-samples each
socket's part with its share of every batch. The cross-socket shares a placement made from them
reports hold for a run whose ranks keep to that split.

>>> import numpy as np
>>> [p.tolist() for p in socket_seed_split(np.array([9, 1, 5, 3, 7, 2]), [2, 1])]
[[1, 2, 3, 5], [7, 9]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.handoff import PlanTargets
from planner.progress import Progress
from training.data import Dataset
from training.hotness import HotnessSpec
from training.place.bins import BinPlan, reader_sockets

__all__ = ["SEED_SPLIT", "cross_socket_share", "gpus_per_socket", "socket_reads", "socket_seed_split",
           "spans_sockets"]

#: how :func:`socket_seed_split` splits the training vertices, as ``place.json`` records it
SEED_SPLIT = "contiguous ranges of the sorted training vertices, one per socket, sized by its GPUs"


def gpus_per_socket(targets: PlanTargets) -> list[int]:
    """The plan's GPUs on each of :func:`~training.place.bins.reader_sockets` (same order)."""
    return [sum(1 for _, s in targets.gpus if s == k) for k in reader_sockets(targets)]


def spans_sockets(targets: PlanTargets) -> bool:
    """Whether the plan's GPUs sit on two or more known sockets."""
    return len([s for s in reader_sockets(targets) if s is not None]) > 1


def socket_seed_split(train_idx: np.ndarray, gpus: Sequence[int]) -> list[np.ndarray]:
    """The training vertices, sorted, cut into one contiguous part per socket of ``gpus[k]`` GPUs, in
    proportion to them."""
    ids = np.sort(np.asarray(train_idx, dtype=np.int64))
    cuts = np.round(np.cumsum(gpus)[:-1] / float(sum(gpus)) * ids.size).astype(np.int64)
    return np.split(ids, cuts)


def socket_reads(ds: Dataset, spec: HotnessSpec, targets: PlanTargets, *,
                 progress: Progress | None = None) -> np.ndarray:
    """Each row's pre-sampled reads by each socket's GPUs: float32 ``[num_nodes, len(reader_sockets)]``.

    Socket ``k``'s GPUs train on part ``k`` of :func:`socket_seed_split` and take ``gpus[k] / GPUs`` of
    every batch of ``spec.batch_size`` seeds; each part is walked for ``spec.epochs`` epochs with the
    training fan-outs (:func:`training.sampler.count_accesses`, seeded like the hotness).

    Raises
    ------
    HotnessError
        When the dataset has no training vertices.
    """
    from training.hotness import HotnessError
    from training.sampler import NeighborSampler, count_accesses

    if ds.train_idx is None or ds.train_idx.shape[0] == 0:
        raise HotnessError(f"{ds.path}: no training vertices (train_idx.npy) to pre-sample each socket's reads "
                           "from; give the dataset a split")
    gpus = gpus_per_socket(targets)
    out = np.zeros((ds.num_nodes, len(gpus)), dtype=np.float32)
    for k, seeds in enumerate(socket_seed_split(np.asarray(ds.train_idx), gpus)):
        if seeds.size == 0:
            continue
        sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=spec.fanouts, seed=spec.seed + k)
        batch = max(1, round(spec.batch_size * gpus[k] / sum(gpus)))
        cb = None if progress is None else (lambda done, total, k=k: progress(f"socket {k}'s reads", done, total))
        counts = count_accesses(sampler, seeds, batch, epochs=spec.epochs, shuffle_seed=spec.seed + k, progress=cb)
        out[:, k] = np.asarray(counts, dtype=np.float32)
    return out


def cross_socket_share(bin_of: np.ndarray, reads: np.ndarray, bins: Sequence[BinPlan], targets: PlanTargets) -> float:
    """The share of ``reads`` (``[num_rows, len(reader_sockets)]``) that cross sockets for rows placed by ``bin_of``
    (a GPU cache is on its reader's socket), as :func:`training.place.report.report_for` counts it: with reads
    from an independent pre-sample, what a placement fitted to another sample does to reads it did not see.

    >>> from planner.handoff import PlanTargets
    >>> t = PlanTargets("toy", (("g0", "s0"), ("g1", "s1")), ())
    >>> bins = [BinPlan("ssd", 9, 0.5, "ssd0", "s0"), BinPlan("ssd", 9, 0.5, "ssd1", "s1")]
    >>> cross_socket_share(np.array([0, 1]), np.array([[3.0, 1.0], [0.0, 4.0]]), bins, t)
    0.125
    """
    r = np.asarray(reads, dtype=np.float64)
    total = float(r.sum())
    if total <= 0:
        return 0.0
    cross = 0.0
    for g, sock in enumerate(reader_sockets(targets)):
        per_bin = np.bincount(np.asarray(bin_of, np.int64), weights=r[:, g], minlength=len(bins))
        for j, b in enumerate(bins):
            where = sock if b.kind == "gpu" else b.socket
            if where is not None and sock is not None and where != sock:
                cross += float(per_bin[j])
    return cross / total
