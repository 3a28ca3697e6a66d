"""Which seeds each trainer takes at each step, and the sources that turn them into sampled batches.

Global-batch semantics: at every step of an epoch the world trains on the same
``batch_size`` seeds that a single process would, whatever the number of ranks.
The epoch's permutation of the training vertices depends only on ``(seed,
epoch)``; step ``s`` takes ``perm[s*B:(s+1)*B]`` and rank ``r`` of ``W`` takes
part ``r`` of ``torch.tensor_split(global_batch, W)``. Every rank therefore runs
the same number of steps (a rank may get an empty part on a short last batch);
a trainer that scales its loss by the *global* batch size and all-reduces
gradients by sum gets the single-process gradient of the same seeds — exactly
so with full neighbourhoods; with sampled fan-outs the neighbour draws differ
(each rank's sampler stream is its own), the expectation does not.

A :class:`BatchSource` yields one rank's sampled batches of an epoch in step
order. :class:`LocalBatchSource` samples in the trainer's own process; the
sampling server's client (:mod:`training.serve`) implements the same protocol.
:data:`BATCH_SOURCES` names the sources a run can be given by name, each a
factory ``(SourceRequest) -> BatchSource``.

>>> import torch
>>> shares = [epoch_seeds(torch.arange(10), 0, 4, rank=r, world_size=2, seed=1) for r in range(2)]
>>> [len(s) for s in shares[0]], [len(s) for s in shares[1]]
([2, 2, 1], [2, 2, 1])
>>> sorted(torch.cat(shares[0] + shares[1]).tolist()) == list(range(10))
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from momentbase.registry import Registry
from training.sampler import NeighborSampler, SampledBatch, SamplerError

if TYPE_CHECKING:
    from training.diskcsr import DiskNeighbours


def num_steps(num_seeds: int, batch_size: int) -> int:
    """Steps per epoch for ``num_seeds`` training vertices in global batches of ``batch_size``."""
    if batch_size < 1:
        raise SamplerError(f"batch_size: expected a positive integer, got {batch_size}")
    return math.ceil(num_seeds / batch_size)


def global_batch(source: object, epoch: int, step: int, num_seeds: int, batch_size: int) -> int:
    """The world's seeds at ``step`` of ``epoch``: the source's own count where it has one (a socket-aware
    split's, :class:`training.socket_batches.SocketBatchSource`), else the global batch of :func:`epoch_seeds`
    (``batch_size``, the last step short)."""
    own = getattr(source, "global_batch", None)
    return int(own(epoch, step)) if callable(own) else min(batch_size, num_seeds - step * batch_size)


def epoch_permutation(num_seeds: int, epoch: int, seed: int) -> Tensor:
    """The epoch's order of the training vertices (positions into them), int64 ``[num_seeds]``.

    Depends only on ``(seed, epoch)``, so every rank (and a resumed run) agrees.
    """
    g = torch.Generator().manual_seed(_mix(seed, epoch))
    return torch.randperm(num_seeds, generator=g)


def epoch_seeds(train_idx: Tensor | np.ndarray | Sequence[int], epoch: int, batch_size: int, *,
                rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True) -> list[Tensor]:
    """Rank ``rank``'s seed vertices for every step of ``epoch``: a list of int64 tensors, one per step.

    See the module docstring for the split; parts may be empty on the last step.
    """
    if not 0 <= rank < world_size:
        raise SamplerError(f"rank {rank} is outside a world of {world_size} processes")
    idx = torch.as_tensor(np.asarray(train_idx), dtype=torch.int64).view(-1)
    steps = num_steps(idx.numel(), batch_size)
    order = idx[epoch_permutation(idx.numel(), epoch, seed)] if shuffle else idx
    return [torch.tensor_split(order[s * batch_size:(s + 1) * batch_size], world_size)[rank] for s in range(steps)]


def _mix(*parts: int) -> int:
    """A 63-bit seed from several integers (numpy's SeedSequence hashing: no correlated streams)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0]
               >> np.uint64(1))


@runtime_checkable
class BatchSource(Protocol):
    """One rank's sampled mini-batches, epoch by epoch."""

    def steps(self, epoch: int) -> int:
        """Number of batches :meth:`batches` yields for ``epoch`` (the same on every rank)."""
        ...

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[SampledBatch]:
        """This rank's batches of ``epoch`` from step ``start_step`` on, in step order."""
        ...

    def close(self) -> None:
        """Release what the source holds (connections, threads)."""
        ...


class LocalBatchSource:
    """Batches sampled in this process by ``sampler`` (see :func:`epoch_seeds` for the split).

    The sampler is reseeded from ``(seed, epoch, rank, step)`` before every batch, so a
    batch does not depend on what was sampled before it: a run resumed at any step
    samples what the uninterrupted run would have.

    >>> import torch
    >>> s = NeighborSampler(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 0]), (1,))
    >>> src = LocalBatchSource(s, torch.arange(3), batch_size=2, seed=0)
    >>> [b.batch_size for b in src.batches(0)], src.steps(0)
    ([2, 1], 2)
    """

    def __init__(self, sampler: NeighborSampler, train_idx: Tensor | np.ndarray, batch_size: int, *,
                 rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True) -> None:
        self.sampler = sampler
        self.train_idx = torch.as_tensor(np.asarray(train_idx), dtype=torch.int64).view(-1)
        self.batch_size = int(batch_size)
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        num_steps(self.train_idx.numel(), self.batch_size)  # validates batch_size
        # once here rather than per batch (a host synchronisation each on a GPU): every batch is a
        # slice of a permutation of these
        sampler.check_seeds(self.train_idx)
        if torch.unique(self.train_idx).numel() != self.train_idx.numel():
            raise SamplerError("train_idx: contains repeated vertex ids; list each training vertex once")

    def steps(self, epoch: int) -> int:
        return num_steps(self.train_idx.numel(), self.batch_size)

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[SampledBatch]:
        parts = epoch_seeds(self.train_idx, epoch, self.batch_size, rank=self.rank,
                            world_size=self.world_size, seed=self.seed, shuffle=self.shuffle)
        for step in range(start_step, len(parts)):
            self.sampler.reseed(_mix(self.seed, epoch, self.rank, step, 1))
            yield self.sampler.sample(parts[step], check=False)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class SourceRequest:
    """What a batch source is built from, for one rank of a run.

    ``train_idx``: the training vertices (int ``[n]``); ``csr``: the graph's
    ``(indptr, indices)`` on the sampling device (``indices`` a tensor, or a
    :class:`~training.diskcsr.DiskNeighbours` reading them off the SSD); ``batch_size``: the
    global batch, in seed vertices; ``fanouts``: neighbours per hop (``-1``:
    all); ``seed``: the run's; ``rank`` of ``world_size``; ``server``: the
    sampling server's ``HOST:PORT`` when there is one, ``timeout_s`` how long
    to wait on it.
    """

    train_idx: np.ndarray
    csr: tuple[Tensor, Tensor | DiskNeighbours]
    batch_size: int
    fanouts: tuple[int, ...]
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    server: str | None = None
    timeout_s: float = 30.0


def local_source(req: SourceRequest) -> LocalBatchSource:
    """The ``local`` source: uniform neighbour sampling in this process (:class:`LocalBatchSource`)."""
    sampler = NeighborSampler(*req.csr, req.fanouts, seed=req.seed)
    return LocalBatchSource(sampler, req.train_idx, req.batch_size, rank=req.rank, world_size=req.world_size,
                            seed=req.seed)


#: the batch sources by name: ``factory(SourceRequest) -> BatchSource``
BATCH_SOURCES: Registry[Callable[[SourceRequest], BatchSource]] = Registry("batch source", SamplerError)
BATCH_SOURCES.register("local", local_source)
# the server's client pulls in sockets and shared memory: imported only when a run names it
BATCH_SOURCES.register("server", "training.serve.client:server_source")
