"""A rank's batch feed: the features, where it samples, the graph, its batch source and node-shared reads.

What :func:`training.trainer.train` and :class:`training.loader.MomentLoader`
(the user's own loop) both open before their first batch, in one place so the
two run the same pipeline: the run's feature rows (a sharded placement's, a
placement's tiered store, or the dataset's in memory; :func:`open_run_features`),
where the graph is sampled and the per-vertex lookups
(:func:`training.pipeline.sampling`), the CSR there
(:func:`training.pipeline.csr_on`), this rank's batch source
(:func:`training.pipeline.open_source`) and node-shared SSD reads
(:func:`training.nodeshare.setup_node_shared_reads`, a collective call on every
rank). :func:`eval_batches` is the evaluation batches both sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from iostack.transfer import DeviceMemory, Transfer
from momentbase.jsontypes import JsonObject
from training.batches import BatchSource, _mix, epoch_seeds
from training.data import Dataset
from training.diskcsr import DiskNeighbours
from training.distributed import World
from training.distsample import DistributedNeighbours
from training.features import FeatureSource, open_features, open_store, share_key_of
from training.nodeshare import NodeReads, setup_node_shared_reads
from training.partition.rank import RankView
from training.pipeline import Lookups, Prepared, csr_on, open_source, prefetch_workers, preparer, sampling
from training.sampler import NeighborSampler, SampledBatch
from training.specs import IOSpec, TrainSpec

__all__ = ["Feed", "eval_batches", "open_feed", "open_partition_feed", "open_run_features"]


@dataclass
class Feed:
    """What a rank samples and gathers its batches from; :meth:`close` closes what :func:`open_feed` opened.

    ``features``: the run's feature rows (evaluation gathers through them);
    ``shared.features``: what the training batches gather through (composed
    with node-shared SSD reads when ``shared.on``). ``csr``: ``(indptr,
    indices)`` on ``sample_dev`` (``indices`` a :class:`~training.diskcsr.DiskNeighbours`
    when the graph is read from disk). ``why``: why the graph is sampled on ``sample_dev``.
    """

    features: FeatureSource
    source: BatchSource
    shared: NodeReads
    lookups: Lookups
    csr: tuple[Tensor, Tensor | DiskNeighbours | DistributedNeighbours]
    sample_dev: torch.device
    why: str
    owns_features: bool
    owns_source: bool
    #: whether the training batches follow a socket-aware placement's split (training.socket_batches), or why not
    socket_split: JsonObject = field(default_factory=lambda: {"used": False, "why_not": "a batch source handed in"})
    #: a partitioned job's rank view (training.partition.rank): new ids, evaluation of the rank's own vertices
    view: RankView | None = None

    def eval_steps(self, split: str, batch_size: int) -> int | None:
        """Batches every rank evaluates ``split`` in when each evaluates its own partition's vertices, else None."""
        return None if self.view is None else self.view.eval_steps(split, batch_size)

    def training_prepare(self, normalize: bool, dtype: torch.dtype = torch.float32
                         ) -> tuple[Callable[[SampledBatch, float], Prepared], int]:
        """How training batches are prepared (gathering through ``shared.features``, rows as ``dtype``) and
        by how many threads (:func:`training.pipeline.prefetch_workers`)."""
        workers = prefetch_workers(self.features, self.shared.on)
        assert self.shared.features is not None  # setup_node_shared_reads always names what to gather through
        return preparer(self.shared.features, self.lookups, normalize, concurrent=workers > 1, dtype=dtype), workers

    def eval_prepare(self, normalize: bool, dtype: torch.dtype = torch.float32
                     ) -> Callable[[SampledBatch, float], Prepared]:
        """How evaluation batches are prepared: gathered privately, through ``features``, rows as ``dtype``."""
        return preparer(self.features, self.lookups, normalize, dtype=dtype)

    def close(self) -> None:
        """Close the source, the features and the on-disk neighbour lists this feed opened (not those handed in)."""
        if self.owns_source:
            self.source.close()
        if self.owns_features:
            self.features.close()
        if isinstance(self.csr[1], DiskNeighbours):
            self.csr[1].close()  # neighbour lists on disk: their file and reader


def _open_sharded(io: IOSpec, placement: str, timeout_s: float, ds: Dataset, world: World, memory: DeviceMemory
                  ) -> FeatureSource:
    """This node's shard of a placement sharded across nodes (:mod:`training.sharded.features`)."""
    from training.sharded.features import Peers, ShardedOptions, open_sharded

    options = ShardedOptions(io.exchange, timeout_s, int(io.remote_cache_bytes), io.remote_cache_dir,
                             io.cache_policy)  # a policy other than static: the remote cache fills on access
    peers = Peers.from_env(world.rank, world.size, world.local_rank, world.local_size)
    return open_sharded(ds, placement, peers, options, transfer=Transfer(memory), open_store=open_store,
                        share_key=lambda d: share_key_of(ds, str(d)),
                        local_gpu_bins=world.gpu_bins if world.size > 1 else None, backend=io.backend,
                        capacities=io.capacities)


def open_run_features(spec: TrainSpec, ds: Dataset, world: World, memory: DeviceMemory) -> FeatureSource:
    """The run's features: a sharded placement's, a placement's store, or the dataset's in memory."""
    from training.sharded.features import is_sharded

    io = spec.io
    if io.placement is not None and is_sharded(io.placement):
        features = _open_sharded(io, io.placement, spec.distributed.timeout_s, ds, world, memory)
    else:
        features = open_features(ds, io.placement, io.backend, memory=memory,
                                 local_gpu_bins=world.gpu_bins if world.size > 1 else None,
                                 share_key=share_key_of(ds, io.placement)
                                 if io.placement and world.local_size > 1 else None,
                                 capacities=io.capacities)
        if io.replace_every:
            from training.place.live import live_for_run

            features = live_for_run(features, io, ds, world.size)
        elif io.cache_policy != "static":
            from training.cached_features import CachedFeatures, static_fill

            features = CachedFeatures(features, ds.num_nodes, io.dynamic_cache_bytes, io.cache_policy,
                                      static_fill(io.placement), on=io.dynamic_cache_on)
    if world.size > 1 and world.local_size > 1 and hasattr(features, "unlink_shared"):
        world.barrier()  # every rank of the node has mapped the shared tiers: no name need stay
        features.unlink_shared()
    return features


def open_feed(spec: TrainSpec, ds: Dataset, labels: np.ndarray, seeds: np.ndarray, world: World,
              memory: DeviceMemory, *, source: BatchSource | None = None,
              features: FeatureSource | None = None, view: RankView | None = None) -> Feed:
    """This rank's feed for ``spec`` over the training vertices ``seeds`` (see the module doc).

    ``source`` / ``features``: the caller's, used instead of the spec's (the caller closes them).
    ``view``: a partitioned job's rank view (``ds`` is its dataset, ``seeds`` in its new ids): see
    :func:`open_partition_feed`. Every rank calls it at the same point: it makes collective calls
    when there are several.
    """
    if view is not None:
        return open_partition_feed(spec, view, labels, seeds, world, memory)
    owned: list = []  # what this call opened, closed again if a later part fails
    csr: tuple[Tensor, Tensor | DiskNeighbours] | None = None
    own_features, own_source = features is None, source is None
    try:
        if features is None:
            features = open_run_features(spec, ds, world, memory)
            owned.append(features)
        sample_dev, why, lookups = sampling(spec.sampling, ds, labels, memory,
                                            global_degrees=spec.model.global_degrees)
        csr = csr_on(ds, sample_dev, spec.sampling.graph_on, spec.sampling.graph_cache_bytes)
        split: JsonObject = {"used": False, "why_not": "a batch source handed in"}
        if source is None and spec.sampling.partition:
            from training.distsample import open_partitioned_source

            source = open_partitioned_source(spec.sampling.partition, ds.num_nodes, seeds, spec.sampling.batch_size,
                                             spec.sampling.fanouts, rank=world.rank, world_size=world.size,
                                             seed=spec.run.seed, timeout_s=spec.distributed.timeout_s)
            owned.append(source)
            split = {"used": False, "why_not": "the batches come from the partitioned sampler (`partition`)"}
        if source is None:
            from training.socket_batches import socket_source

            source, split = socket_source(spec, seeds, world, csr)  # None: the run's usual source
            if source is None:
                source = open_source(spec.sampling, spec.run.seed, seeds, world, csr)
            owned.append(source)
        shared = setup_node_shared_reads(spec.io.node_shared_reads, world, features, source.steps(0),
                                         spec.distributed.timeout_s)
    except BaseException:
        for obj in reversed(owned):
            obj.close()
        if csr is not None and not isinstance(csr[1], Tensor):
            csr[1].close()
        raise
    return Feed(features, source, shared, lookups, csr, sample_dev, why,
                owns_features=own_features, owns_source=own_source, socket_split=split)


def eval_batches(sampler: NeighborSampler, idx: np.ndarray, batch_size: int, seed: int, world: World, *,
                 steps: int | None = None) -> tuple[int, Iterator[SampledBatch]]:
    """This rank's evaluation batches of ``idx`` (in order, unshuffled): their number and the batches.

    ``steps``: ``idx`` is this rank's own (a partitioned job's vertices), cut into ``steps`` batches of
    ``batch_size``, the last ones empty where this rank has fewer (every rank joins as many
    exchanges); None: ``idx`` is the whole split, divided over the ranks.
    The sampler is reseeded per batch from ``(seed, rank, batch)``: the same sample whatever the epoch.
    """
    if steps is None:
        parts = epoch_seeds(idx, 0, batch_size, rank=world.rank, world_size=world.size, shuffle=False)
    else:
        own = torch.as_tensor(np.asarray(idx), dtype=torch.int64).view(-1)
        parts = [own[i * batch_size:(i + 1) * batch_size] for i in range(steps)]

    def batches() -> Iterator[SampledBatch]:
        for i, part in enumerate(parts):
            sampler.reseed(_mix(seed, 0x5EED, world.rank, i))
            yield sampler.sample(part)

    return len(parts), batches()


def open_partition_feed(spec: TrainSpec, view: RankView, labels: np.ndarray, seeds: np.ndarray, world: World,
                        memory: DeviceMemory) -> Feed:
    """A partitioned job's feed in the partition's new ids (:mod:`training.partition.rank`): this partition's
    feature rows and the feature exchange, the distributed sampler over its neighbour lists, sampled on the host.

    The evaluation sampler (``csr``) reads through the same :class:`~training.distsample.DistributedNeighbours`
    as the training batches (one after the other: the training prefetcher is closed before evaluation starts).
    """
    from training.distsample import open_partitioned_source
    from training.partition.features import open_partition_features
    from training.pipeline import _readonly_tensor

    timeout_s = spec.distributed.timeout_s
    assert view.part.features is not None  # open_rank_view refuses a partition without feature rows
    owned: list = []
    try:
        features = open_partition_features(view.part.features, view.node_offsets, world.rank, world.size,
                                           timeout_s=timeout_s, transfer=Transfer(memory))
        owned.append(features)
        source = open_partitioned_source(view.whole.path, view.dataset.num_nodes, seeds, spec.sampling.batch_size,
                                         spec.sampling.fanouts, rank=world.rank, world_size=world.size,
                                         seed=spec.run.seed, timeout_s=timeout_s, new_ids=True)
        owned.append(source)
        indptr = _readonly_tensor(np.asarray(view.whole.indptr, np.int64))
        lookups = Lookups(_readonly_tensor(labels), indptr if spec.model.global_degrees else None)
        shared = setup_node_shared_reads(spec.io.node_shared_reads, world, features, source.steps(0), timeout_s)
    except BaseException:
        for obj in reversed(owned):
            obj.close()
        raise
    why = "a partitioned graph (`partition`): sampled on the host over the ranks' neighbour lists"
    return Feed(features, source, shared, lookups, (indptr, source.indices), torch.device("cpu"), why,
                owns_features=True, owns_source=True,
                socket_split={"used": False, "why_not": "the batches come from the partitioned sampler (`partition`)"},
                view=view)
