"""Which seed edges each rank takes at each step of a link-prediction epoch, and its negatives' stream.

The node task's global-batch semantics (:mod:`training.batches`) over the training positives: the
epoch's permutation of the ``E`` positives depends only on ``(seed, epoch)``; step ``s`` takes
``perm[s*B:(s+1)*B]`` and rank ``r`` of ``W`` takes part ``r`` of ``torch.tensor_split`` of it. So
every positive is trained on once per epoch across the ranks, every rank runs the same
``ceil(E / B)`` steps (a rank's part of a short last step may be empty), and the ranks' parts of a
step are together the single process's batch.

Negatives are drawn per rank, ``neg_ratio`` per positive of its part, from a stream of its own
seeded by ``(seed, epoch, rank)`` (:func:`negative_stream`, numpy's ``SeedSequence`` entropy, so the
ranks' streams are independent and an epoch's draws repeat whatever ran before it). A step's
negatives over the world are the ranks' draws together; :func:`world_step_pairs` names them, which
is what a single process replays to check a data-parallel run.

>>> import numpy as np
>>> pos = np.stack([np.arange(10), np.arange(1, 11)])
>>> [p.shape[1] for p in rank_positives(pos, 0, 4, rank=0, world_size=2, seed=1)]
[2, 2, 1]
>>> both = [np.concatenate(s, 1) for s in zip(*(rank_positives(pos, 0, 4, rank=r, world_size=2, seed=1)
...                                              for r in (0, 1)), strict=True)]
>>> sorted(np.concatenate(both, 1)[0].tolist()) == list(range(10))
True
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from training.batches import epoch_seeds, num_steps
from training.link.negatives import NegativeSampler

__all__ = ["LinkSteps", "negative_stream", "rank_positives", "world_step_pairs"]

#: a constant of the negatives' seed entropy, so their stream is not the permutation's
_NEGATIVES = 0x4E4547


def rank_positives(positives: np.ndarray, epoch: int, batch_size: int, *, rank: int = 0, world_size: int = 1,
                   seed: int = 0, shuffle: bool = True) -> list[np.ndarray]:
    """Rank ``rank``'s positives ``[2, k]`` at every step of ``epoch`` (see the module doc)."""
    parts = epoch_seeds(torch.arange(positives.shape[1]), epoch, batch_size, rank=rank, world_size=world_size,
                        seed=seed, shuffle=shuffle)
    return [positives[:, p.numpy()] for p in parts]


def negative_stream(seed: int, epoch: int, rank: int) -> np.random.Generator:
    """The generator rank ``rank`` draws its negatives of ``epoch`` from (independent of the other ranks')."""
    return np.random.default_rng([int(seed), int(epoch), int(rank), _NEGATIVES])


class LinkSteps:
    """A rank's link batches: its positives and freshly drawn negatives of every step of an epoch.

    Parameters
    ----------
    positives : np.ndarray
        int64 ``[2, E]``: the training edges (one direction of each undirected edge).
    negatives : NegativeSampler
        Draws the non-edges.
    batch_size : int
        Positives per step over all ranks.
    neg_ratio : float
        Negatives per positive (``int(k * neg_ratio)`` for a part of ``k`` positives).
    seed, rank, world_size : int
        The run's seed, this rank and the number of ranks.
    """

    def __init__(self, positives: np.ndarray, negatives: NegativeSampler, batch_size: int, neg_ratio: float, *,
                 seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        self.positives, self.negatives = positives, negatives
        self.batch_size, self.neg_ratio = int(batch_size), float(neg_ratio)
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)

    def __len__(self) -> int:
        """Steps of an epoch: the same on every rank."""
        return num_steps(self.positives.shape[1], self.batch_size)

    def epoch(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(positives [2, k], negatives [2, m])`` of this rank at each step of ``epoch``, in step order."""
        rng = negative_stream(self.seed, epoch, self.rank)
        for pos in rank_positives(self.positives, epoch, self.batch_size, rank=self.rank,
                                  world_size=self.world_size, seed=self.seed):
            yield pos, self.negatives.sample(int(pos.shape[1] * self.neg_ratio), rng)


def world_step_pairs(steps: LinkSteps, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every step's ``(positives, negatives)`` of all ``steps.world_size`` ranks together, in rank order.

    What a single process replays to reproduce a data-parallel epoch (the ranks' parts concatenated).
    """
    per_rank = [list(LinkSteps(steps.positives, steps.negatives, steps.batch_size, steps.neg_ratio, seed=steps.seed,
                               rank=r, world_size=steps.world_size).epoch(epoch)) for r in range(steps.world_size)]
    return [(np.concatenate([p for p, _ in parts], 1), np.concatenate([n for _, n in parts], 1))
            for parts in zip(*per_rank, strict=True)]
