"""Link batches for your own training loop: seed edges, both endpoints' sampled subgraph, gathered rows.

:class:`LinkLoader` is :class:`training.loader.MomentLoader` for link prediction, what PyG's
``LinkNeighborLoader`` yields with ``neg_sampling="binary"``, over an edge-split dataset
(``moment data split-edges``) and the placement ``moment place`` wrote for it. Each step takes
this rank's part of the epoch's training edges (:mod:`training.link.batches`: every edge once
per epoch across the ranks, the same steps on each) and ``neg_ratio`` fresh negatives per
positive from the rank's own stream, samples the endpoints' neighbourhoods together
(:class:`~training.link.sampler.LinkSampler`) and gathers their rows from the placement's tiered
store on a background thread while your step computes (:class:`training.pipeline.Prefetcher`), as
the node loader does. A batch is a :class:`LinkPrepared`, on the rank's device when yielded:

- ``b.x``: float32 ``[num_nodes, dim]``, the rows of ``b.batch.n_id`` (global vertex ids);
- ``b.batch.edge_index``: int64 ``[2, num_edges]`` local ids (PyG's layout), ``edge_index_per_layer``;
- ``b.edge_label_index``: int64 ``[2, k]``, each pair's endpoints as local ids (rows of ``b.x``,
  among the first ``b.batch.batch_size``), positives first;
- ``b.edge_label``: float32 ``[k]``, 1 for an edge, 0 for a negative.

:meth:`LinkLoader.evaluation` yields the stored validation or test pairs (this rank's contiguous
share, ``eval_fanouts``; test over the training graph plus the validation edges, as PyG's split);
:meth:`LinkLoader.link_metrics` gathers every rank's scores in order and returns AUC, MRR and
Hits@K as :mod:`training.link.metrics` computes them, the same numbers as one process.
:meth:`LinkLoader.metrics` reports the per-tier rows and bytes, times and copies
(:class:`training.loader.BatchMeter`). Each rank gathers its own rows (no node-shared SSD reads yet).
Under DDP a mean loss per rank weighs the ranks' parts equally; ``moment train --task link``
all-reduces the step's pair count to take the world's mean exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from iostack.transfer import DeviceMemory, memory_for
from training.data import open_dataset
from training.distributed import open_world
from training.errors import TrainError
from training.features import FeatureSource
from training.feed import open_run_features
from training.link.batches import LinkSteps
from training.link.edges import with_edges
from training.link.edgeset import EdgeSet
from training.link.metrics import link_metrics
from training.link.negatives import NegativeSampler
from training.link.sampler import LinkSampler
from training.link.store import open_link_data
from training.loader import BatchMeter, LoaderFront, loader_spec
from training.pipeline import Lookups, Prefetcher, Prepared, preparer
from training.sampler import NeighborSampler, SampledBatch
from training.specs import TrainSpec

__all__ = ["LinkLoader", "LinkPrepared", "LinkSampled", "open_link_loader"]

Progress = Callable[[dict], None]


@dataclass(frozen=True)
class LinkSampled(SampledBatch):
    """A sampled batch of pairs: ``pair_index`` int64 ``[2, k]`` local ids, the first ``positives`` edges."""

    pair_index: Tensor
    positives: int


@dataclass
class LinkPrepared(Prepared):
    """A link batch ready to train (see the module doc); ``y`` holds the seeds' node labels."""

    edge_label_index: Tensor | None = None
    edge_label: Tensor | None = None


class LinkLoader(LoaderFront):
    """This rank's link batches of ``spec.dataset``, an edge-split dataset (see the module doc).

    Of ``spec`` it reads the dataset, ``sampling`` (fan-outs, batch sizes: positives per step over all
    ranks), ``io`` (placement, backend, prefetch), ``distributed.timeout_s``, ``run.seed`` and
    ``model.normalize_features``.

    Parameters
    ----------
    spec : TrainSpec
        What to load.
    negatives : str
        ``"uniform"`` or ``"degree"`` negatives (:data:`training.vocab.NEGATIVE_METHODS`).
    neg_ratio : float
        Negatives per positive.
    progress : callable, optional
        Called with a ``step`` record per batch.
    memory : DeviceMemory, optional
        Where batches land (default: this rank's device).

    Raises
    ------
    LinkSplitError
        The dataset has no edge splits, or an unknown ``negatives``.
    TrainError
        ``neg_ratio`` not positive.
    """

    def __init__(self, spec: TrainSpec, *, negatives: str = "uniform", neg_ratio: float = 1.0,
                 progress: Progress | None = None, memory: DeviceMemory | None = None) -> None:
        self.spec, self._progress = spec, progress
        if not neg_ratio > 0:
            raise TrainError(f"`neg_ratio` {neg_ratio}: expected a positive number of negatives per positive")
        self.data = open_link_data(open_dataset(spec.dataset, validate=False))
        ds = self.dataset = self.data.ds
        self._graphs = {"train": (np.asarray(ds.indptr), np.asarray(ds.indices))}
        self._graphs["test"] = with_edges(*self._graphs["train"], self.data.valid_pos, self.data.undirected)
        negative_sampler = NegativeSampler(EdgeSet.from_csr(ds.indptr, ds.indices, ds.num_nodes), method=negatives,
                                           degree=np.diff(self._graphs["train"][0]))
        labels = torch.from_numpy(np.array(ds.labels, np.int64) if ds.labels is not None
                                  else np.full(ds.num_nodes, -1, np.int64))
        self._lookups = {g: Lookups(labels, torch.from_numpy(np.array(ptr, np.int64)))
                         for g, (ptr, _) in self._graphs.items()}
        self.world = open_world(spec.io.placement, memory, spec.distributed.timeout_s)
        try:
            self._features = open_run_features(spec, ds, self.world, memory or memory_for(self.world.device))
        except BaseException:
            self._end_world()
            raise
        self._closed, self._epoch = False, 0
        self._steps = LinkSteps(self.data.train_pos, negative_sampler, spec.sampling.batch_size, neg_ratio,
                                seed=spec.run.seed, rank=self.world.rank, world_size=self.world.size)
        self._sampler = LinkSampler(NeighborSampler(*self._graphs["train"], spec.sampling.fanouts,
                                                    seed=spec.run.seed + self.world.rank))
        self._meter = BatchMeter(self.features)

    @property
    def features(self) -> FeatureSource:
        """The feature rows batches are gathered from (a tiered store with a placement)."""
        return self._features

    def __len__(self) -> int:
        """Steps of an epoch: the same on every rank."""
        return len(self._steps)

    def _prepare(self, graph: str) -> Callable[[SampledBatch, float], Prepared]:
        prepare = preparer(self.features, self._lookups[graph], self.spec.model.normalize_features)
        device = self.world.device

        def link_prepare(b: SampledBatch, sample_s: float) -> Prepared:
            assert isinstance(b, LinkSampled)  # what _sampled yields
            p = prepare(b, sample_s)
            label = torch.zeros(b.pair_index.shape[1])
            label[: b.positives] = 1.0
            return LinkPrepared(**{f.name: getattr(p, f.name) for f in fields(p)},
                                edge_label_index=b.pair_index.to(device), edge_label=label.to(device))

        return link_prepare

    @staticmethod
    def _sampled(sampler: LinkSampler, pairs: Iterator[tuple[np.ndarray, np.ndarray]]) -> Iterator[LinkSampled]:
        for pos, neg in pairs:
            lb = sampler.sample(np.concatenate([pos, neg], axis=1))
            b = lb.batch
            yield LinkSampled(b.n_id, b.batch_size, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges,
                              lb.pair_index, int(pos.shape[1]))

    def _batches(self, pairs: Iterator[tuple[np.ndarray, np.ndarray]], sampler: LinkSampler, graph: str
                 ) -> Iterator[tuple[LinkPrepared, float]]:
        pre = Prefetcher(self._sampled(sampler, pairs), self._prepare(graph), self.spec.io.prefetch,
                         self.features.transfer)
        try:
            while True:
                item, waited = pre.get()
                if item is None:
                    return
                assert isinstance(item, LinkPrepared)  # what _prepare returns
                item.wait()  # the copies have landed (the node loader's loader-landing point)
                yield item, waited
        finally:
            pre.close()

    def __iter__(self) -> Iterator[LinkPrepared]:
        """This rank's link batches of the current epoch, in step order, on the device."""
        epoch, steps = self._epoch, len(self)
        for step, (item, waited) in enumerate(self._batches(self._steps.epoch(epoch), self._sampler, "train")):
            self._emit(self._meter.record(epoch, step, steps, item, waited))
            yield item

    def evaluation(self, split: str = "valid") -> Iterator[LinkPrepared]:
        """This rank's contiguous share of the stored pairs of ``split`` (``valid`` or ``test``), positives then
        negatives, ``sampling.eval_batch_size`` pairs a batch, ``eval_fanouts``, the same sample every time.

        Raises
        ------
        TrainError
            A split other than ``valid`` and ``test``.
        """
        if split not in ("valid", "test"):
            raise TrainError(f"`split` {split!r}: expected valid or test")
        pos, neg = self.data.pairs(split)
        labels = np.concatenate([np.ones(pos.shape[1], bool), np.zeros(neg.shape[1], bool)])
        pairs = np.concatenate([pos, neg], axis=1)
        share = np.array_split(np.arange(pairs.shape[1]), self.world.size)[self.world.rank]
        bs = self.spec.sampling.eval_batch_size
        # each batch's pairs ordered positives first, so a batch says how many it holds
        chunks = [share[a:a + bs] for a in range(0, share.size, bs)]
        parts = ((pairs[:, c[labels[c]]], pairs[:, c[~labels[c]]]) for c in chunks)
        graph = "train" if split == "valid" else "test"
        sampler = LinkSampler(NeighborSampler(*self._graphs[graph], self.spec.sampling.evaluation_fanouts,
                                              seed=self.spec.run.seed))
        for item, _ in self._batches(parts, sampler, graph):
            yield item

    def link_metrics(self, scores: Tensor, labels: Tensor, ks: tuple[int, ...] = (10, 50, 100)) -> dict[str, float]:
        """AUC, MRR and Hits@K of this rank's ``scores`` ``[k]`` with ``labels`` ``[k]`` (1 edge, 0 not) and every
        other rank's (each rank calls it): gathered in rank order, the metrics of the whole split."""
        mine = (scores.detach().float().cpu().numpy(), labels.detach().cpu().numpy() > 0.5)
        both = self.world.gather_objects(mine, "gathering the evaluation scores")
        s = np.concatenate([a for a, _ in both])
        y = np.concatenate([b for _, b in both])
        return link_metrics(s[y], s[~y], ks)

    def _close_own(self) -> None:
        self._features.close()

def open_link_loader(dataset_dir: str | Path, placement_dir: str | Path | None = None, *,
                     fanouts: Sequence[int] = (25, 10), batch_size: int = 1024, neg_ratio: float = 1.0,
                     negatives: str = "uniform", device: str | torch.device | None = None, seed: int = 0,
                     prefetch: int = 2, backend: str = "auto", eval_fanouts: Sequence[int] | None = None,
                     eval_batch_size: int = 4096, progress: Progress | None = None) -> LinkLoader:
    """A :class:`LinkLoader` over the edge-split dataset ``dataset_dir`` and the placement in ``placement_dir``
    (``None``: the dataset's rows in host memory); ``batch_size`` positives per step over all ranks.

    Raises
    ------
    TrainError
        A bad setting (named).
    LinkSplitError
        The dataset has no edge splits.
    """
    spec = loader_spec(dataset_dir, placement_dir, fanouts=fanouts, batch_size=batch_size, seed=seed,
                       prefetch=prefetch, backend=backend, eval_fanouts=eval_fanouts, eval_batch_size=eval_batch_size)
    return LinkLoader(spec, negatives=negatives, neg_ratio=neg_ratio, progress=progress,
                      memory=memory_for(device) if device is not None else None)
