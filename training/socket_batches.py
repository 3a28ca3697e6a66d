"""Socket-aware training batches: each socket's ranks train on their socket's part of the training vertices.

A placement made socket-aware (``place.json``'s ``socket_aware``, :mod:`training.place.sockets`)
kept each socket's rows on that socket's bins for a run in which the GPUs of socket ``k`` train
on part ``k`` of :func:`~training.place.sockets.socket_seed_split` (the sorted training vertices
cut into one contiguous range per socket, sized by its GPUs). :class:`SocketBatchSource` is that
run's batch source:

* rank ``i`` takes the socket of the plan's GPU ``i`` (``gpu_sockets[i]``: the mapping
  :func:`training.throughput.epoch_throughput` uses, rank ``i`` = plan GPU ``i``);
* every epoch each socket's range is reshuffled on its own (``(seed, epoch, socket)``) and walked
  in steps of ``b_k = B × gpus_k / GPUs`` seeds, rounded (:func:`socket_batch_sizes`: they sum to ``B``),
  each step's part split among that socket's ranks as :func:`training.batches.epoch_seeds`
  splits a global batch;
* uneven ranges: every rank runs ``max_k ceil(n_k / b_k)`` steps; a socket whose range runs out
  first gives its ranks an empty part on the remaining step(s), which the trainer runs over zero
  rows (see :func:`training.trainer._step`). Every training vertex is used exactly once per epoch:
  nothing dropped, nothing repeated (torch's ``DistributedSampler`` pads by repeating vertices,
  which would count them twice in an epoch and shift the reads the placement was fitted to). The
  ranges are sized in the same proportions as the step sizes, so this costs at most one short step;
* the global batch of step ``s`` is the sum of the sockets' parts (:meth:`SocketBatchSource.global_batch`),
  what the trainer scales the summed loss by, so DDP's average stays the global batch's mean-loss gradient.

:func:`socket_source` decides whether a run follows the split (and why not, for the start record):
only a placement whose ``socket_aware`` was used, ranks on one node, no more ranks than the plan's
GPUs, ranks on every socket with a part, sampled here (not by a sampling server).

>>> import torch
>>> from training.sampler import NeighborSampler
>>> lay = SocketLayout(("s0", "s1"), (1, 1), ("s0", "s1"))
>>> s = NeighborSampler(torch.zeros(11, dtype=torch.long), torch.zeros(0, dtype=torch.long), (1,))
>>> r0, r1 = (SocketBatchSource(s, torch.arange(10), 4, lay, rank=r, world_size=2) for r in range(2))
>>> [sorted(int(v) for p in r0.seeds(0) for v in p), sorted(int(v) for p in r1.seeds(0) for v in p)]
[[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
>>> r0.steps(0), [r0.global_batch(0, s) for s in range(3)]
(3, [4, 4, 2])
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from momentbase.jsontypes import JsonObject, JsonValue
from training.batches import BatchSource, _mix, epoch_permutation
from training.distributed import World
from training.place.sockets import socket_seed_split
from training.sampler import NeighborSampler, SampledBatch, SamplerError
from training.specs import TrainSpec

if TYPE_CHECKING:
    from training.diskcsr import DiskNeighbours

__all__ = ["SocketBatchSource", "SocketLayout", "bin_rows", "cross_socket_rows", "layout_from_place_report",
           "measured_cross_share", "rows_since", "socket_batch_sizes", "socket_source"]


@dataclass(frozen=True)
class SocketLayout:
    """A socket-aware placement's sockets (the reader groups, in the plan's order), the plan's GPUs on each,
    and each plan GPU's socket (in the plan's GPU order: rank ``i`` takes ``gpu_sockets[i]``)."""

    sockets: tuple[str, ...]
    gpus_per_socket: tuple[int, ...]
    gpu_sockets: tuple[str, ...]


def layout_from_place_report(report: Mapping[str, JsonValue] | None) -> tuple[SocketLayout | None, str]:
    """The socket layout ``place.json`` recorded, or ``None`` and why there is none."""
    rec = (report or {}).get("socket_aware")
    if not isinstance(rec, Mapping) or not rec.get("used"):
        why = rec.get("why_not") if isinstance(rec, Mapping) else None
        return None, f"the placement is not socket-aware ({why or 'place.json records no socket_aware'})"
    gpu_sockets = rec.get("gpu_sockets")
    if not isinstance(gpu_sockets, list):
        return None, ("place.json records no socket per GPU (`gpu_sockets`: placed by an older moment place); "
                      "place it again to train by socket")
    sockets = tuple(str(s) for s in rec.get("sockets") or ())
    return SocketLayout(sockets, tuple(int(g) for g in rec.get("gpus_per_socket") or ()),
                        tuple(str(s) for s in gpu_sockets)), ""


def socket_batch_sizes(batch_size: int, gpus: Sequence[int]) -> list[int]:
    """Each socket's seeds per step, in proportion to ``gpus`` and summing to ``batch_size``: one each first (no
    socket idles while the others train), the rest apportioned by largest remainder. Zeros where
    ``batch_size`` is below the number of sockets (:class:`SocketBatchSource` refuses those).

    >>> socket_batch_sizes(35, [2, 2]), socket_batch_sizes(10, [1, 3]), socket_batch_sizes(3, [2, 1, 1])
    ([18, 17], [3, 7], [1, 1, 1])
    """
    g = np.asarray(gpus, dtype=np.float64)
    if batch_size < g.size:
        return [0] * g.size
    share = (batch_size - g.size) * g / g.sum()
    base = np.floor(share).astype(np.int64)
    left = batch_size - g.size - int(base.sum())
    base[np.argsort(-(share - base), kind="stable")[:left]] += 1
    return (base + 1).tolist()


class SocketBatchSource:
    """One rank's batches when each socket's ranks train on their socket's part (see the module doc).

    Sampled like :class:`~training.batches.LocalBatchSource`: the sampler is reseeded from ``(seed, epoch,
    rank, step)`` before every batch, so a resumed run samples what the uninterrupted one would have.

    Raises
    ------
    SamplerError
        When ``rank`` has no plan GPU, a socket with a part has no rank, or a socket's share of the batch
        rounds to no seed.
    """

    def __init__(self, sampler: NeighborSampler, train_idx: Tensor | np.ndarray, batch_size: int,
                 layout: SocketLayout, *, rank: int = 0, world_size: int = 1, seed: int = 0) -> None:
        if not 0 <= rank < world_size <= len(layout.gpu_sockets):
            raise SamplerError(f"rank {rank} of {world_size}: the plan has {len(layout.gpu_sockets)} GPUs; "
                               "run at most one rank per plan GPU to train by socket")
        self.sampler, self.batch_size, self.rank, self.seed = sampler, int(batch_size), rank, seed
        idx = np.asarray(train_idx, dtype=np.int64).reshape(-1)
        if np.unique(idx).size != idx.size:
            raise SamplerError("train_idx: contains repeated vertex ids; list each training vertex once")
        sampler.check_seeds(torch.as_tensor(idx))
        self.parts = [torch.as_tensor(p) for p in socket_seed_split(idx, layout.gpus_per_socket)]
        self.sizes = socket_batch_sizes(self.batch_size, layout.gpus_per_socket)
        ranks = [[r for r in range(world_size) if layout.gpu_sockets[r] == s] for s in layout.sockets]
        for k, s in enumerate(layout.sockets):
            if self.parts[k].numel() and not ranks[k]:
                raise SamplerError(f"socket {s} has training vertices but none of the {world_size} ranks")
            if self.parts[k].numel() and self.sizes[k] < 1:
                raise SamplerError(f"batch_size: {batch_size} seeds leave socket {s} none per step; "
                                   f"use at least {len(layout.sockets)}, one per socket")
        self.socket = layout.sockets.index(layout.gpu_sockets[rank])
        self.peers = ranks[self.socket]
        self._steps = max((math.ceil(p.numel() / b) for p, b in zip(self.parts, self.sizes, strict=True)
                           if p.numel()), default=0)

    def steps(self, epoch: int) -> int:
        return self._steps

    def global_batch(self, epoch: int, step: int) -> int:
        """The world's seeds at ``step``: the sockets' parts summed (the last steps may be short)."""
        return sum(min(b, max(0, p.numel() - step * b)) for p, b in zip(self.parts, self.sizes, strict=True))

    def seeds(self, epoch: int) -> list[Tensor]:
        """This rank's seed vertices for every step of ``epoch`` (int64; empty where its socket's range ran out)."""
        part, b = self.parts[self.socket], self.sizes[self.socket]
        order = part[epoch_permutation(part.numel(), epoch, _mix(self.seed, self.socket, 0x50C))]
        slot, n = self.peers.index(self.rank), len(self.peers)
        return [torch.tensor_split(order[s * b:(s + 1) * b], n)[slot] for s in range(self._steps)]

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[SampledBatch]:
        parts = self.seeds(epoch)
        for step in range(start_step, len(parts)):
            self.sampler.reseed(_mix(self.seed, epoch, self.rank, step, 1))
            yield self.sampler.sample(parts[step], check=False)

    def close(self) -> None:
        pass


def socket_source(spec: TrainSpec, train_idx: np.ndarray, world: World,
                  csr: tuple[Tensor, Tensor | DiskNeighbours]) -> tuple[BatchSource | None, JsonObject]:
    """This rank's :class:`SocketBatchSource` when the run trains on a socket-aware placement it can follow,
    else ``None`` (the run's usual source); and the start record's ``socket_split`` (``used``, or why not)."""
    from training.prediction import load_place_report

    placement = spec.io.placement
    layout, why = layout_from_place_report(load_place_report(placement) if placement else None)
    if layout is None:
        return None, {"used": False, "why_not": why if placement else "no placement"}
    if spec.sampling.server:
        why = "batches come from a sampling server, which splits every batch over all ranks"
    elif world.size != world.local_size:
        why = "the ranks span nodes; the split is one node's"
    elif world.size > len(layout.gpu_sockets):
        why = f"{world.size} ranks on a plan of {len(layout.gpu_sockets)} GPUs (rank i takes plan GPU i's socket)"
    elif len(set(layout.gpu_sockets[:world.size])) < len(layout.sockets):
        why = (f"the {world.size} rank(s) sit on the sockets of plan GPUs 0..{world.size - 1} "
               f"({', '.join(sorted(set(layout.gpu_sockets[:world.size])))}), not on every socket of the split")
    elif min(socket_batch_sizes(spec.sampling.batch_size, layout.gpus_per_socket)) < 1:
        why = f"a batch of {spec.sampling.batch_size} seeds leaves a socket none per step"
    if why:  # the placement's cross-socket shares will not hold: the CLI says so
        return None, {"used": False, "why_not": why, "placement_socket_aware": True}
    sampler = NeighborSampler(*csr, tuple(spec.sampling.fanouts), seed=spec.run.seed)
    src = SocketBatchSource(sampler, train_idx, spec.sampling.batch_size, layout, rank=world.rank,
                            world_size=world.size, seed=spec.run.seed)
    return src, {"used": True, "socket": layout.sockets[src.socket], "ranks_on_socket": len(src.peers),
                 "seeds_of_socket": int(src.parts[src.socket].numel()),
                 "seeds_per_step": src.sizes[src.socket], "steps": src.steps(0)}


def bin_rows(features: object) -> dict[int, int]:
    """Rows read per bin id since the store opened (``{}`` for features not read through a placement's store)."""
    store = features if hasattr(features, "stats") else getattr(features, "store", None)
    if store is None or not hasattr(store, "stats"):
        return {}
    return {int(b.bin_id): int(b.rows) for b in store.stats()}


def rows_since(before: Mapping[int, int], now: Mapping[int, int]) -> dict[str, int]:
    """Rows read per bin between two :func:`bin_rows` (JSON keys: the bin ids as strings)."""
    return {str(b): int(n - before.get(b, 0)) for b, n in now.items()}


def cross_socket_rows(rows: Mapping[int, int] | Mapping[str, int], bin_sockets: Sequence[str | None],
                      socket: str) -> tuple[int, int]:
    """``(rows read from other sockets' bins, rows read)`` of a rank on ``socket``; a GPU bin (socket ``None``:
    on the reader's GPU) is local.

    >>> cross_socket_rows({0: 3, 1: 5, 2: 2}, ["s0", "s1", None], "s0")
    (5, 10)
    """
    total = sum(rows.values())
    cross = sum(n for b, n in rows.items() if int(b) < len(bin_sockets) and bin_sockets[int(b)] not in (None, socket))
    return cross, total


def measured_cross_share(report: Mapping[str, JsonValue], rank_rows: Sequence[Mapping[str, int]]) -> float:
    """The share of the rows ranks ``0..`` read (``rank_rows[r]``: rank ``r``'s epoch ``bin_rows``) from bins on
    another socket than theirs, rank ``r`` on the plan's GPU ``r``'s socket (``report``: ``place.json``, socket-aware):
    what ``socket_aware.held_out_cross_socket_share`` predicted.

    Raises
    ------
    SamplerError
        When ``report`` records no socket per GPU, or fewer GPUs than ranks.
    """
    gpu_sockets = (report.get("socket_aware") or {}).get("gpu_sockets") or []
    if len(gpu_sockets) < len(rank_rows):
        raise SamplerError(f"report: place.json records the sockets of {len(gpu_sockets)} GPUs for "
                           f"{len(rank_rows)} ranks; place it again socket-aware")
    bins = [None if b.get("kind") == "gpu" else b.get("socket") for b in report.get("bins") or []]
    cross = total = 0
    for r, rows in enumerate(rank_rows):
        c, t = cross_socket_rows(rows, bins, str(gpu_sockets[r]))
        cross, total = cross + c, total + t
    return cross / total if total else 0.0

