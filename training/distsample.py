"""Neighbour sampling over a graph partitioned across ranks: each rank holds one slice of ``indices``.

The partition format (``moment data partition``'s output, the contract with its writer):
vertices are relabelled so that partition ``k`` owns the new ids ``[node_offsets[k], node_offsets[k+1])``
and the edge positions ``[edge_offsets[k], edge_offsets[k+1])`` of the relabelled global CSR.
``OUT/indptr.npy`` is that CSR's global ``indptr`` (int64 ``[N + 1]``, held by every rank),
``OUT/part-K/indices.npy`` partition ``K``'s slice of ``indices`` (new ids), ``OUT/partition.json``
the offsets. A rank needs the first two and the offsets (:class:`PartitionLayout`).

:class:`training.sampler.NeighborSampler` draws the positions it samples from ``indptr`` alone and
looks up a whole hop's at once through its :class:`~training.sampler.NeighbourSource`.
:class:`DistributedNeighbours` is such a source: ``take(pos)`` groups the positions by the
partition that holds them and trades them in one batched exchange per hop, three
``torch.distributed.all_to_all_single`` calls (how many positions, which, their neighbour ids
back), each rank answering its peers from its slice in between. The sampler over this source
draws exactly what it draws over the whole graph from the same generator state, so a rank's
batches *equal* the single-machine sampler's for the same seeds and sampler seed, by
construction (tests/test_distsample.py checks it, with and without replacement, both relabel
modes); only the sampled neighbours' ids cross the wire, never a neighbour list. A source is not
a tensor, so the sampler takes its torch path (:func:`training.compiled_sampler.applies`), which
is bit-identical to the compiled one.

The exchange is a collective: every rank of the group calls ``take`` the same number of times.
A rank with no seeds still samples (an empty batch asks for nothing and still joins each hop's
exchange). A rank that has run out of batches before its peers calls :meth:`DistributedNeighbours.finish`:
it keeps answering its peers' hops until every rank has finished. The "finished" mark rides in the
counts of the exchange (a count of ``-1``), so uneven batch counts cost nothing per hop; torch's
``torch.distributed.algorithms.Join`` does the same job with an extra all-reduce per step and hooks
per collective, which a three-call exchange does not need. :func:`sample_batches` samples a list of
seed batches and finishes, optionally on a background thread ``prefetch`` batches ahead, so that
the exchanges of batch ``i + 1`` run while the caller computes on batch ``i`` (gloo releases the
GIL while it waits on the wire).

A peer that dies fails the exchange with one :class:`~training.sharded.exchange.PeerLostError` line
naming the rank: every rank beats a heartbeat into the group's store (:class:`Heartbeats`), and the
survivors name the ranks whose beats stopped (:meth:`Heartbeats.for_job` has every lost-peer error
of the job name them: the gradient all-reduce often meets the death first).

>>> import torch
>>> layout = PartitionLayout((0, 2, 4), (0, 3, 6))
>>> layout.owner_of_positions(torch.tensor([0, 2, 3, 5])).tolist()
[0, 0, 1, 1]
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from training.batches import LocalBatchSource, _mix, epoch_seeds
from training.errors import TrainError
from training.heartbeats import Heartbeats, job_heartbeats
from training.sampler import NeighborSampler, SampledBatch, SamplerError
from training.sharded.exchange import PeerLostError

__all__ = ["DistributedNeighbours", "ExchangeStats", "PartitionLayout", "PartitionedBatchSource",
           "open_partitioned_source", "sample_batches"]

#: the count a finished rank sends every peer (see :meth:`DistributedNeighbours.finish`)
_DONE = -1


@dataclass(frozen=True)
class PartitionLayout:
    """Which rank holds which vertices and edge positions of the relabelled global CSR.

    ``node_offsets``/``edge_offsets``: ``parts + 1`` non-decreasing entries each, from 0 to
    the number of vertices/edges; partition ``k`` owns ``[offsets[k], offsets[k + 1])``.
    """

    node_offsets: tuple[int, ...]
    edge_offsets: tuple[int, ...]

    def __post_init__(self) -> None:
        for name, off in (("node_offsets", self.node_offsets), ("edge_offsets", self.edge_offsets)):
            if len(off) < 2 or off[0] != 0 or any(b < a for a, b in zip(off, off[1:], strict=False)):
                raise SamplerError(f"{name}: expected non-decreasing offsets from 0, one more than the "
                                     f"partitions, got {list(off)[:8]}")
        if len(self.node_offsets) != len(self.edge_offsets):
            raise SamplerError(f"node_offsets and edge_offsets: {len(self.node_offsets) - 1} against "
                                 f"{len(self.edge_offsets) - 1} partitions")

    @property
    def parts(self) -> int:
        """Number of partitions."""
        return len(self.edge_offsets) - 1

    @property
    def num_edges(self) -> int:
        """Edges of the whole graph."""
        return self.edge_offsets[-1]

    def owner_of_positions(self, pos: Tensor) -> Tensor:
        """int64 partition of every edge position in ``pos`` (int64, each in ``[0, num_edges)``)."""
        # the interior bounds, right-sided: a position equal to a bound belongs to the next non-empty part
        bounds = torch.tensor(self.edge_offsets[1:-1], dtype=torch.int64)
        return torch.searchsorted(bounds, pos, right=True)

    @classmethod
    def of_indptr(cls, indptr: np.ndarray | Tensor, node_offsets: Sequence[int]) -> PartitionLayout:
        """The layout of vertex ranges ``node_offsets`` over the CSR ``indptr``.

        ``edge_offsets`` are ``indptr[node_offsets]``.
        """
        ptr = np.asarray(indptr)
        return cls(tuple(int(x) for x in node_offsets), tuple(int(ptr[int(x)]) for x in node_offsets))


@dataclass
class ExchangeStats:
    """What the exchanges of a :class:`DistributedNeighbours` moved so far (this rank's side).

    ``bytes_out``/``bytes_in``: positions sent plus neighbour ids served, and positions
    received plus ids received, to and from *other* ranks (the part that crosses the
    wire; counts excluded, ``8 × ranks`` bytes a round). ``local_positions``: looked up
    in this rank's own slice. ``idle_rounds``: rounds served after :meth:`finish`.
    """

    rounds: int = 0
    idle_rounds: int = 0
    positions_asked: int = 0
    local_positions: int = 0
    positions_served: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    seconds: float = 0.0
    #: bytes this rank sent in the last round (positions asked + ids served): summed over the
    #: ranks, a round's bytes on the wire
    last_round_bytes: int = 0

    def as_dict(self) -> dict[str, float]:
        """The figures as a dict."""
        return dict(self.__dict__)


class DistributedNeighbours:
    """The global ``indices`` as a :class:`~training.sampler.NeighbourSource`, this rank holding one slice.

    Args:
        local: ``indices[edge_offsets[rank]:edge_offsets[rank + 1]]`` (int32/int64, CPU; a
            memory map is fine).
        layout: the partition (its ``parts`` equals the group's size; partition ``k``
            lives on group rank ``k``).
        group: the process group of the exchange (``None``: the default group). Give the
            sampler a group of its own when the trainer runs other collectives on another
            thread (two threads never interleave calls on one group).
        heartbeats: names a dead peer in the error (see :class:`Heartbeats`); ``None``:
            the error says "another rank".

    Every rank calls :meth:`take` the same number of times, then :meth:`finish` (see the
    module docstring). Gloo: the tensors exchanged are on the host (``device`` is the CPU).
    """

    def __init__(self, local: Tensor | np.ndarray, layout: PartitionLayout, *,
                 group: Any = None,  # Any: a torch ProcessGroup (typed loosely by torch itself)
                 heartbeats: Heartbeats | None = None) -> None:
        import torch.distributed as dist

        self._dist, self.group, self.layout, self.heartbeats = dist, group, layout, heartbeats
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        if layout.parts != self.size:
            raise SamplerError(f"layout: {layout.parts} partitions for {self.size} ranks; start one rank per "
                                 "partition")
        if isinstance(local, np.ndarray):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # a read-only memory map: never written
                local = torch.from_numpy(local)
        lo, hi = layout.edge_offsets[self.rank], layout.edge_offsets[self.rank + 1]
        if local.dim() != 1 or local.numel() != hi - lo:
            raise SamplerError(f"local: rank {self.rank} holds edge positions [{lo}, {hi}), {hi - lo} ids, "
                                 f"got shape {tuple(local.shape)}")
        self.local, self.lo = local, lo
        self._agree(layout)
        self.num_edges = layout.num_edges
        self.dtype = local.dtype
        self.device = torch.device("cpu")
        self.stats = ExchangeStats()

    def _agree(self, layout: PartitionLayout) -> None:
        """Every rank was given the same partition (one gather at construction, not a wrong answer later)."""
        mine = (layout.node_offsets, layout.edge_offsets)
        every: list[Any] = [None] * self.size  # Any: each rank's (node_offsets, edge_offsets)
        try:
            self._dist.all_gather_object(every, mine, group=self.group)
        except RuntimeError as exc:
            raise PeerLostError.of(exc, "the sampler's start") from None
        other = [r for r, x in enumerate(every) if x != mine]
        if other:
            raise SamplerError(f"layout: rank {self.rank} and rank {other[0]} were given different partitions; "
                               "start every rank on the same `moment data partition` output")

    def _a2a(self, out: Tensor, inp: Tensor, out_splits: list[int] | None = None,
             in_splits: list[int] | None = None) -> None:
        try:
            self._dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group)
        except RuntimeError as exc:
            dead = self.heartbeats.stopped() if self.heartbeats is not None else None
            raise PeerLostError.of(exc, "the sampler's neighbour exchange", dead) from None

    def _round(self, send_counts: Tensor, pos_out: Tensor) -> tuple[Tensor, Tensor]:
        """One exchange: counts, positions, ids back. Returns (ids for ``pos_out``, counts received)."""
        recv = torch.empty_like(send_counts)
        self._a2a(recv, send_counts)
        sc, rc = send_counts.clamp(min=0).tolist(), recv.clamp(min=0).tolist()
        if (recv == _DONE).all() and (send_counts == _DONE).all():
            return pos_out[:0], recv
        pos_in = torch.empty(sum(rc), dtype=torch.int64)
        self._a2a(pos_in, pos_out, rc, sc)
        served = self.local.index_select(0, pos_in - self.lo)
        ids = torch.empty(sum(sc), dtype=self.dtype)
        self._a2a(ids, served, sc, rc)
        s, me = self.stats, self.rank
        remote_out = sum(sc) - sc[me]
        remote_in = sum(rc) - rc[me]
        s.rounds += 1
        s.positions_served += remote_in
        out_b = remote_out * 8 + remote_in * self.local.element_size()
        in_b = remote_in * 8 + remote_out * self.local.element_size()
        s.bytes_out += out_b
        s.bytes_in += in_b
        s.last_round_bytes = out_b
        return ids, recv

    def take(self, pos: Tensor) -> Tensor:
        """``indices[pos]`` for int64 global positions, from whichever rank holds each (collective)."""
        t0 = time.perf_counter()
        pos = pos.to(torch.int64).view(-1)
        owner = self.layout.owner_of_positions(pos)
        order = torch.argsort(owner, stable=True)
        counts = torch.bincount(owner, minlength=self.size)
        ids, _ = self._round(counts, pos.index_select(0, order))
        out = torch.empty(pos.numel(), dtype=self.dtype)
        out.index_copy_(0, order, ids)
        s = self.stats
        s.positions_asked += pos.numel()
        s.local_positions += int(counts[self.rank])
        s.seconds += time.perf_counter() - t0
        return out

    def finish(self) -> int:
        """Answer the peers' exchanges until every rank has called ``finish``; the rounds served.

        Every rank calls it once after its last batch (of an epoch, or of the job); the source
        can sample again afterwards.
        """
        t0 = time.perf_counter()
        done = torch.full((self.size,), _DONE, dtype=torch.int64)
        nothing = torch.empty(0, dtype=torch.int64)
        served = 0
        while True:
            _, recv = self._round(done, nothing)
            if bool((recv == _DONE).all()):
                break
            served += 1
        self.stats.idle_rounds += served
        self.stats.seconds += time.perf_counter() - t0
        return served

    def close(self) -> None:
        """Stop the heartbeat (the group is the caller's)."""
        if self.heartbeats is not None:
            self.heartbeats.close()


def sample_batches(sampler: NeighborSampler, seed_batches: Sequence[Tensor], source: DistributedNeighbours, *,
                   prefetch: int = 0, reseed: Callable[[int], int] | None = None) -> Iterator[SampledBatch]:
    """The batches of ``seed_batches`` in order, then :meth:`~DistributedNeighbours.finish`.

    ``prefetch > 0`` samples on a background thread up to that many batches ahead, so that
    batch ``i + 1``'s exchanges overlap the caller's work on batch ``i``. ``reseed(i)``:
    the sampler's seed before batch ``i`` (as :class:`training.batches.LocalBatchSource`
    reseeds per step), or ``None`` to keep one stream. Errors of the thread (a lost peer)
    are raised here. Consume the iterator to the end: the peers wait on this rank's ``finish``.

    Raises
    ------
    PeerLostError
        A peer died or stopped answering during an exchange (raised here from the thread too).
    """
    def draw() -> Iterator[SampledBatch]:
        for i, seeds in enumerate(seed_batches):
            if reseed is not None:
                sampler.reseed(reseed(i))
            yield sampler.sample(seeds)
        source.finish()

    if prefetch <= 0:
        yield from draw()
        return
    q: queue.Queue[Any] = queue.Queue(maxsize=prefetch)  # Any: a batch, an error, or the end mark
    end = object()

    def work() -> None:
        try:
            for batch in draw():
                q.put(batch)
            q.put(end)
        except BaseException as exc:  # handed to the consumer, raised there
            q.put(exc)

    thread = threading.Thread(target=work, name="moment-distsample", daemon=True)
    thread.start()
    while True:
        item = q.get()
        if item is end:
            break
        if isinstance(item, BaseException):
            raise item
        yield item
    thread.join()


class PartitionedBatchSource:
    """A rank's training batches over a partitioned graph, in the dataset's own vertex ids (or the partition's).

    A :class:`~training.batches.BatchSource`: the trainer keeps its ids (labels, features,
    splits), the sampler works in the partition's. ``train_idx`` (the dataset's ids) is mapped
    to new ids once and walked as :func:`~training.batches.epoch_seeds` walks them (the epoch's
    permutation depends only on their number, so every step's global batch is the
    single-process run's), and every batch's ``n_id`` is mapped back through ``old_ids``.

    ``split="owned"`` (default): rank ``r`` takes the seeds of each global batch that partition
    ``r`` owns, as DistDGL's trainers take their partition's seeds: hop 1 reads only local lists,
    and later hops stay local as far as the partition cut few edges. The ranks' parts are uneven,
    their union is the global batch, and the trainer scales the loss by the global batch's size,
    so the gradient is the one of ``split="even"`` (:func:`~training.batches.epoch_seeds`'s
    ``tensor_split``, the order of the other sources). Every rank has the same number of steps,
    so the exchange needs no :meth:`DistributedNeighbours.finish`. With full neighbourhoods
    (``-1``) a step's batches hold the vertices and edges of the single-process run's (the order
    of a row's neighbours follows the new ids); with sampled fan-outs and ``split="even"`` a
    batch equals the whole relabelled graph's sampler's.

    Args:
        indptr: the relabelled global ``indptr``.
        indices: this rank's :class:`DistributedNeighbours` (or, one partition, its ``indices``).
        old_ids: int64 ``[N]`` new id -> the dataset's id; ``None``: the trainer works in the new ids
            (:mod:`training.partition.rank`), ``train_idx`` is in new ids and ``n_id`` stays in them.
        train_idx: the training vertices, the dataset's ids.
        batch_size, fanouts, rank, world_size, seed: as :func:`training.batches.local_source`.
        group: a process group :meth:`close` destroys (the one made for the exchange), or None.
        split: ``"owned"`` or ``"even"`` (above).
        node_offsets: the partition's vertex ranges, for ``split="owned"`` (None: one partition).
    """

    def __init__(self, indptr: np.ndarray | Tensor, indices: Tensor | DistributedNeighbours, old_ids: np.ndarray | None,
                 train_idx: np.ndarray, batch_size: int, fanouts: Sequence[int], *, rank: int = 0,
                 world_size: int = 1, seed: int = 0,
                 group: Any = None,  # Any: a torch ProcessGroup
                 split: str = "owned", node_offsets: Sequence[int] | None = None) -> None:
        if split not in ("owned", "even"):
            raise SamplerError(f"split: expected 'owned' or 'even', got {split!r}")
        self.indices, self.group, self.split = indices, group, split
        self.rank, self.world_size, self.seed, self.batch_size = rank, world_size, seed, int(batch_size)
        offsets = node_offsets if node_offsets is not None else (0, len(indptr) - 1)
        self.own = (int(offsets[rank]), int(offsets[rank + 1])) if split == "owned" else None
        train_new = torch.as_tensor(np.asarray(train_idx), dtype=torch.int64).view(-1)
        self.old_ids = None if old_ids is None else torch.from_numpy(np.asarray(old_ids, dtype=np.int64))
        if self.old_ids is not None:
            new_of_old = torch.empty_like(self.old_ids)
            new_of_old[self.old_ids] = torch.arange(self.old_ids.numel())
            train_new = new_of_old.index_select(0, train_new)
        self.sampler = NeighborSampler(indptr, indices, fanouts, seed=seed)
        # validates the seeds and the batch size once, and is the "even" split's walk
        self.inner = LocalBatchSource(self.sampler, train_new, batch_size, rank=rank, world_size=world_size, seed=seed)

    def steps(self, epoch: int) -> int:
        """Steps of ``epoch`` (the same on every rank)."""
        return self.inner.steps(epoch)

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[SampledBatch]:
        """This rank's batches of ``epoch`` from ``start_step`` on, ``n_id`` in the dataset's ids (collective)."""
        for b in self.inner.batches(epoch, start_step) if self.own is None else self._owned(epoch, start_step):
            if self.old_ids is None:  # the trainer works in the partition's ids
                yield b
                continue
            yield SampledBatch(self.old_ids.index_select(0, b.n_id), b.batch_size, b.edge_index,
                               b.num_sampled_nodes, b.num_sampled_edges)

    def _owned(self, epoch: int, start_step: int) -> Iterator[SampledBatch]:
        lo, hi = self.own or (0, 0)
        steps = epoch_seeds(self.inner.train_idx, epoch, self.batch_size, seed=self.seed)  # the global batches
        for step in range(start_step, len(steps)):
            seeds = steps[step]
            # reseeded per (seed, epoch, rank, step) as LocalBatchSource is: a resumed run samples the same
            self.sampler.reseed(_mix(self.seed, epoch, self.rank, step, 1))
            yield self.sampler.sample(seeds[(seeds >= lo) & (seeds < hi)], check=False)

    def close(self) -> None:
        if isinstance(self.indices, DistributedNeighbours):
            self.indices.close()
        group, self.group = self.group, None
        if group is not None:
            import torch.distributed as dist

            with contextlib.suppress(RuntimeError, ValueError):  # a broken group (a dead peer) goes anyway
                dist.destroy_process_group(group)


def open_partitioned_source(path: str | Path, num_nodes: int, train_idx: np.ndarray, batch_size: int,
                            fanouts: Sequence[int], *, rank: int, world_size: int, seed: int,
                            timeout_s: float | None = None, new_ids: bool = False) -> PartitionedBatchSource:
    """This rank's :class:`PartitionedBatchSource` over partition ``rank`` of ``path`` (every rank calls it).

    ``new_ids``: ``train_idx`` is in the partition's ids and the batches stay in them (the trainer of
    :mod:`training.partition.rank`); else both are the dataset's.

    Opens ``path`` with :func:`training.partition.read.open_partition` (the global ``indptr`` and
    ``old_ids``, this rank's ``indices``, memory-mapped) and, with several ranks, makes the exchange
    a gloo group of its own (timeout ``timeout_s``) and a heartbeat in the job's store.

    Raises
    ------
    TrainError
        The partition is of a graph of another size than ``num_nodes``, or has another number of
        partitions than there are ranks.
    PartitionError
        ``path`` is not a readable ``moment data partition`` output (:mod:`training.partition.read`).
    """
    from training.partition.read import open_partition

    whole = open_partition(path)
    if whole.parts != world_size:
        raise TrainError(f"`partition` {path}: {whole.parts} partitions for {world_size} ranks; start one rank "
                         "per partition")
    if whole.indptr.shape != (num_nodes + 1,):
        raise TrainError(f"`partition` {path}: a graph of {whole.indptr.shape[0] - 1} vertices, the dataset has "
                         f"{num_nodes}: partition this dataset (`moment data partition`)")
    layout = PartitionLayout(tuple(int(x) for x in whole.node_offsets), tuple(int(x) for x in whole.edge_offsets))
    local = whole.part(rank).indices
    old_ids = None if new_ids else whole.old_ids
    if world_size == 1:
        return PartitionedBatchSource(whole.indptr, torch.from_numpy(np.asarray(local)), old_ids, train_idx,
                                      batch_size, fanouts, seed=seed, node_offsets=layout.node_offsets)
    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=None if timeout_s is None else timedelta(seconds=timeout_s))
    # the job's heartbeat names a dead peer (training.distributed.open_world starts one); else one of our own
    source = DistributedNeighbours(local, layout, group=group,
                                   heartbeats=None if job_heartbeats() is not None else Heartbeats.for_job())
    return PartitionedBatchSource(whole.indptr, source, old_ids, train_idx, batch_size, fanouts, rank=rank,
                                  world_size=world_size, seed=seed, group=group, node_offsets=layout.node_offsets)
