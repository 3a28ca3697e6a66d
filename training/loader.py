"""Moment's batches for your own training loop: sampled, gathered from the tiers, on your device, prefetched.

:class:`MomentLoader` opens a dataset and (optionally) the placement ``moment
place`` wrote for it, and yields this rank's mini-batches of the training split
for any ``torch.nn.Module``, in your own loop, under your own ``torchrun`` and
DDP. It runs the pipeline :func:`training.trainer.train` runs
(:mod:`training.feed`): the feature rows come from the placement's tiered store
(GPU, host and SSD bins where the plan put them; node-shared SSD reads between
the ranks of a node), a background thread samples and gathers the next
``io.prefetch`` batches and copies them to the device on its own stream while
your step computes, and the per-tier rows and bytes, the sample, gather and
I/O-wait times are reported (:meth:`MomentLoader.metrics`, and every step's
record to ``progress``).

A batch is a :class:`training.pipeline.Prepared`, on the rank's device when yielded:

- ``b.x``: float32 ``[num_nodes, dim]``, the features of ``b.batch.n_id`` (global vertex ids);
- ``b.batch.edge_index``: int64 ``[2, num_edges]`` local ids into ``n_id`` (row 0 the sampled
  neighbour, row 1 the vertex aggregating from it; PyG's ``NeighborLoader`` layout), and
  ``b.batch.edge_index_per_layer`` the prefixes each layer needs;
- ``b.y``: int64 ``[batch_size]``, the labels of the seeds, which are ``n_id[:b.batch.batch_size]``
  (``-1`` where the dataset has no labels).

Ranks and devices: under ``torchrun`` (``WORLD_SIZE > 1``) the rank and world
come from ``torch.distributed`` (initialised by you, or here with ``gloo`` on
CPU and ``nccl`` on CUDA when you have not); the device is ``cuda:LOCAL_RANK``
(or the GPU the plan put this rank's cache partition on), the host without
CUDA, or the ``device`` you pass. Global-batch semantics
(:mod:`training.batches`): at step ``s`` the ranks together take the
``batch_size`` seeds one process would, rank ``r`` its part, so every rank runs
the same number of steps and a rank's part of a short last step may be empty
(``b.batch.batch_size == 0``: run your step anyway, DDP waits for every rank).
Scale your summed loss by ``world_size / global batch`` to train on the global
batch's mean (:meth:`MomentLoader.global_batch`: on a socket-aware placement
each socket's ranks take their socket's part, :mod:`training.socket_batches`,
and the last steps' global batches are the sockets' parts summed). Iterate
whole epochs on every rank: with node-shared reads the ranks of a node gather
each step together.

:meth:`MomentLoader.set_epoch` re-shuffles, as with
:class:`torch.utils.data.DistributedSampler`: the epoch's order depends only on
``(seed, epoch)``. :meth:`MomentLoader.evaluation` gives a split's batches
(unshuffled, split over the ranks, sampled with ``eval_fanouts``), gathered
privately (never node-shared).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import numpy as np
import torch

from iostack.transfer import DeviceMemory, memory_for
from momentbase.jsontypes import JsonObject
from training.batches import global_batch
from training.data import open_dataset
from training.distributed import World, open_world
from training.errors import TrainError
from training.features import FeatureSource
from training.feed import eval_batches, open_feed
from training.metrics import Sums, add_step, moved_since
from training.nodeshare import ssd_reads
from training.pipeline import Prefetcher, Prepared
from training.sampler import NeighborSampler
from training.specs import IOSpec, RunSpec, SamplingSpec, TrainSpec

__all__ = ["BatchMeter", "LoaderFront", "MomentLoader", "loader_spec", "open_loader"]

Progress = Callable[[dict], None]
SPLITS = ("train", "valid", "test")
_Loader = TypeVar("_Loader", bound="LoaderFront")


class LoaderFront:
    """What the loaders share: the rank's world, where batches land, the cost of the batches, the progress
    records, closing what was opened (a context manager). A loader sets ``world``, ``_meter``, ``_progress``
    and ``_closed``, and says how its feature rows are reached and what else it closes."""

    world: World
    _meter: BatchMeter
    _progress: Progress | None
    _closed: bool
    _epoch: int

    @property
    def features(self) -> FeatureSource:
        """The feature rows batches are gathered from (a tiered store with a placement)."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        """Where the batches land."""
        return self.world.device

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def world_size(self) -> int:
        return self.world.size

    @property
    def num_features(self) -> int:
        """Width of a feature row."""
        return int(self.features.dim)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle the next iteration as epoch ``epoch`` (its order depends only on the seed and ``epoch``)."""
        self._epoch = int(epoch)

    def metrics(self, *, reset: bool = False) -> JsonObject:
        """What the batches cost since the loader opened (or the last ``reset``), on this rank
        (:meth:`BatchMeter.report`)."""
        return self._meter.report(reset=reset)

    def _emit(self, rec: dict) -> None:
        if self._progress is not None:
            self._progress({"rank": self.world.rank, "world_size": self.world.size, **rec})

    def _end_world(self) -> None:
        self.world.end()  # the heartbeat, and a group this loader started (you had not initialised one)

    def _close_own(self) -> None:
        """Close what the loader opened besides the process group."""
        raise NotImplementedError

    def close(self) -> None:
        """Close what the loader opened (the store, the batch source; the process group it started)."""
        if not self._closed:
            self._closed = True
            self._close_own()
            self._end_world()

    def __enter__(self: _Loader) -> _Loader:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:
        self.close()


class MomentLoader(LoaderFront):
    """This rank's training batches of ``spec`` (see the module doc); a context manager and an iterable.

    Of ``spec`` it reads the dataset, ``sampling`` (fan-outs, batch sizes, where to sample),
    ``io`` (the placement, the read backend, ``prefetch`` depth, node-shared reads),
    ``distributed.timeout_s``, ``run.seed`` and ``model.normalize_features``; the rest is your loop's.

    Parameters
    ----------
    spec : TrainSpec
        What to load (:mod:`training.specs`).
    progress : callable, optional
        Called with a ``start`` record once and a ``step`` record per batch (times in seconds, rows and
        bytes per tier).
    memory : DeviceMemory, optional
        The device memory the batches land in (default: this rank's device, see the module doc).

    Raises
    ------
    TrainError
        A dataset without a training split.
    """

    def __init__(self, spec: TrainSpec, *, progress: Progress | None = None,
                 memory: DeviceMemory | None = None) -> None:
        self.spec, self._progress = spec, progress
        self.dataset = ds = open_dataset(spec.dataset, validate=False)
        if ds.train_idx is None or len(ds.train_idx) == 0:
            raise TrainError(f"{ds.path}: the dataset has no training split (train_idx.npy); import it with a split")
        labels = np.asarray(ds.labels) if ds.labels is not None else np.full(ds.num_nodes, -1, np.int64)
        self.world = open_world(spec.io.placement, memory, spec.distributed.timeout_s)
        try:
            self._feed = open_feed(spec, ds, labels, np.asarray(ds.train_idx, np.int64), self.world,
                                   memory or memory_for(self.world.device))
        except BaseException:
            self._end_world()
            raise
        self._closed = False
        try:
            self._prepare, self._workers = self._feed.training_prepare(spec.model.normalize_features)
            self._epoch, self._meter = 0, BatchMeter(self.features)
            self._emit({"kind": "start", "device": str(self.world.device), "features": type(self.features).__name__,
                        "sampling": {"device": str(self._feed.sample_dev), "why": self._feed.why},
                        "node_shared_reads": self._feed.shared.to_dict(), "prefetch_workers": self._workers,
                        "steps_per_epoch": len(self)})
        except BaseException:
            self.close()
            raise

    @property
    def features(self) -> FeatureSource:
        """The feature rows batches are gathered from (a tiered store with a placement)."""
        return self._feed.features

    @property
    def num_classes(self) -> int:
        """Classes of the dataset's labels (0 without labels)."""
        return self.dataset.num_classes

    def __len__(self) -> int:
        """Steps of an epoch: the same on every rank."""
        return int(self._feed.source.steps(self._epoch))

    def global_batch(self, step: int) -> int:
        """The world's seeds at ``step`` of the current epoch: what to scale the summed loss by."""
        n_train = 0 if self.dataset.train_idx is None else len(self.dataset.train_idx)  # refused at opening
        return global_batch(self._feed.source, self._epoch, step, n_train, self.spec.sampling.batch_size)

    def __iter__(self) -> Iterator[Prepared]:
        """This rank's batches of the current epoch, in step order, on the device."""
        epoch, steps = self._epoch, len(self)
        pre = Prefetcher(self._feed.source.batches(epoch), self._prepare, self.spec.io.prefetch,
                         self.features.transfer, self._workers)
        try:
            for step in range(steps):
                item, waited = pre.get()
                if item is None:
                    raise TrainError(f"the batch source ended before step {step} of epoch {epoch}")
                item.wait()  # sync-point: loader-landing
                self._record(epoch, step, steps, item, waited)
                yield item
        finally:
            pre.close()

    def evaluation(self, split: str = "valid") -> Iterator[Prepared]:
        """This rank's batches of ``split`` (``valid``, ``test`` or ``train``): unshuffled, the same sample
        every time, ``sampling.eval_batch_size`` seeds a batch over all ranks, ``eval_fanouts``.

        Raises
        ------
        TrainError
            A split the dataset does not have.
        """
        idx = getattr(self.dataset, f"{split}_idx", None) if split in SPLITS else None
        if idx is None or len(idx) == 0:
            raise TrainError(f"`split` {split!r}: the dataset has no such split; expected one of "
                             f"{', '.join(s for s in SPLITS if getattr(self.dataset, f'{s}_idx') is not None)}")
        sampling = self.spec.sampling
        sampler = NeighborSampler(*self._feed.csr, sampling.evaluation_fanouts, seed=self.spec.run.seed)
        _, batches = eval_batches(sampler, np.asarray(idx, np.int64), sampling.eval_batch_size,
                                  self.spec.run.seed, self.world)
        pre = Prefetcher(batches, self._feed.eval_prepare(self.spec.model.normalize_features),
                         self.spec.io.prefetch, self.features.transfer)
        try:
            while True:
                item, _ = pre.get()
                if item is None:
                    return
                yield item.wait()  # sync-point: loader-eval-landing
        finally:
            pre.close()

    def _record(self, epoch: int, step: int, steps: int, item: Prepared, waited: float) -> None:
        self._emit(self._meter.record(epoch, step, steps, item, waited))

    def _close_own(self) -> None:
        self._feed.close()



class BatchMeter:
    """What a loader's batches cost: steps, seeds, times, rows and bytes per tier, copies, SSD reads.

    ``features``: the rows the batches are gathered from.
    """

    def __init__(self, features: FeatureSource) -> None:
        self.features = features
        self._sums, self._steps, self._since = Sums(), 0, self._snapshot()

    def _snapshot(self) -> tuple:
        return self.features.transfer.counts(), ssd_reads(self.features), time.perf_counter()

    def record(self, epoch: int, step: int, steps: int, item: Prepared, waited: float) -> dict:
        """The step record of ``item`` (``waited``: seconds the loop waited for it), added to the sums."""
        rec = {"kind": "step", "epoch": epoch, "step": step, "steps": steps, "seeds": item.batch.batch_size,
               "sample_s": item.sample_s, "gather_s": item.gather_s, "io_wait_s": waited,
               "share_wait_s": item.share_wait_s,
               "tiers": {k: {"rows": r, "bytes": n} for k, (r, n) in item.tiers.items()}}
        add_step(self._sums, rec, item.tiers, 0.0, 0.0)  # the loss and hits are your loop's
        self._steps += 1
        return rec

    def report(self, *, reset: bool = False) -> JsonObject:
        """What the batches cost since the meter started (or the last ``reset``).

        ``steps``, ``seeds``; seconds spent sampling (``sample_s``), gathering (``gather_s``), waiting for
        the next batch (``io_wait_s``: the prefetch did not keep up) and waiting for the node's other ranks
        (``share_wait_s``); ``tiers``: rows and bytes gathered per tier (``gpu``, ``cpu``, ``ssd``, ...);
        ``transfers``: host→device copies and bytes by route; ``ssd_reads`` (pages, requests, rows read)
        with a placement's store; ``elapsed_s``.
        """
        moved, disk, t0 = self._since
        v = self._sums.v
        out: JsonObject = {"steps": self._steps, "seeds": int(v["seeds"]),
                           **{k: v[k] for k in ("sample_s", "gather_s", "io_wait_s", "share_wait_s")},
                           "tiers": {k: {"rows": r, "bytes": n} for k, (r, n) in self._sums.tiers.items()},
                           "transfers": moved_since(moved, self.features.transfer.counts()),
                           "elapsed_s": time.perf_counter() - t0}
        out.update(ssd_reads(self.features, disk or None))
        if reset:
            self._sums, self._steps, self._since = Sums(), 0, self._snapshot()
        return out


def open_loader(dataset_dir: str | Path, placement_dir: str | Path | None = None, *,
                fanouts: Sequence[int] = (25, 10), batch_size: int = 1024, device: str | torch.device | None = None,
                seed: int = 0, prefetch: int = 2, backend: str = "auto", eval_fanouts: Sequence[int] | None = None,
                eval_batch_size: int = 4096, progress: Progress | None = None) -> MomentLoader:
    """A :class:`MomentLoader` over ``dataset_dir`` (``moment data import``/``synth``) and the placement in
    ``placement_dir`` (``moment place``; ``None``: the dataset's features in host memory).

    The rank and world size come from ``torch.distributed`` / ``torchrun`` (see the module doc), never
    from arguments, so they cannot disagree with your DDP. ``device``: where batches land (default: this
    rank's). For the other settings build a :class:`~training.specs.TrainSpec` and call
    :class:`MomentLoader`.

    Raises
    ------
    TrainError
        A bad setting (named), or a dataset without a training split.
    """
    spec = loader_spec(dataset_dir, placement_dir, fanouts=fanouts, batch_size=batch_size, seed=seed,
                       prefetch=prefetch, backend=backend, eval_fanouts=eval_fanouts, eval_batch_size=eval_batch_size)
    return MomentLoader(spec, progress=progress, memory=memory_for(device) if device is not None else None)


def loader_spec(dataset_dir: str | Path, placement_dir: str | Path | None, *, fanouts: Sequence[int],
                batch_size: int, seed: int, prefetch: int, backend: str, eval_fanouts: Sequence[int] | None,
                eval_batch_size: int) -> TrainSpec:
    """The :class:`~training.specs.TrainSpec` of a loader opened with these settings (the rest defaults).

    Raises
    ------
    TrainError
        A bad setting (named).
    """
    sampling = SamplingSpec(fanouts=tuple(fanouts), batch_size=batch_size, eval_batch_size=eval_batch_size,
                            eval_fanouts=tuple(eval_fanouts) if eval_fanouts is not None else None)
    return TrainSpec(str(dataset_dir), sampling=sampling,
                     io=IOSpec(placement=str(placement_dir) if placement_dir is not None else None, backend=backend,
                               prefetch=prefetch),
                     run=RunSpec(seed=seed))
