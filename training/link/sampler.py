"""The link-level sampler: seed pairs to one sampled subgraph holding both endpoints' neighbourhoods.

A batch of pairs (positives and negatives, ``[2, k]``) names up to ``2k`` endpoints; their distinct
ids become the seeds of one :class:`training.sampler.NeighborSampler` batch, so the endpoints'
multi-hop neighbourhoods share one subgraph and one feature gather (what PyG's
``LinkNeighborLoader`` does). ``pair_index`` maps each pair to its endpoints' rows among the
batch's seeds (the first ``batch_size`` rows of the encoder's output).

>>> import numpy as np, torch
>>> from training.sampler import NeighborSampler
>>> s = LinkSampler(NeighborSampler(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 0]), (-1,), seed=0))
>>> b = s.sample(np.array([[2, 0], [1, 2]]))
>>> b.batch.n_id[b.pair_index].tolist()
[[2, 0], [1, 2]]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from training.sampler import NeighborSampler, SampledBatch

__all__ = ["LinkBatch", "LinkSampler", "link_presample_counts"]


@dataclass(frozen=True)
class LinkBatch:
    """A sampled subgraph of a batch of pairs: ``batch`` (its seeds the distinct endpoints, first) and
    ``pair_index`` int64 ``[2, k]``: each pair's endpoints as local ids (< ``batch.batch_size``)."""

    batch: SampledBatch
    pair_index: Tensor


class LinkSampler:
    """Samples the endpoints of pairs together with ``sampler`` (see the module doc)."""

    def __init__(self, sampler: NeighborSampler) -> None:
        self.sampler = sampler

    def sample(self, pairs: np.ndarray | Tensor) -> LinkBatch:
        """The subgraph of ``pairs`` (``[2, k]`` vertex ids, repeats allowed)."""
        p = torch.as_tensor(np.asarray(pairs), dtype=torch.int64)
        # distinct endpoints in first-appearance order would do too; sorted ids are what torch.unique gives
        seeds, inverse = torch.unique(p.reshape(-1), return_inverse=True)
        return LinkBatch(self.sampler.sample(seeds), inverse.reshape(2, -1))


def link_presample_counts(sampler: NeighborSampler, pairs: np.ndarray, batch_size: int, *, epochs: float = 1.0,
                          num_batches: int | None = None, shuffle_seed: int = 0,
                          negatives: Callable[[np.ndarray], np.ndarray] | None = None,
                          progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, int]:
    """Pre-sampling for a link task: how often each vertex's row is read over link-level batches.

    Walks the training ``pairs`` (``[2, E]``) in shuffled batches of ``batch_size`` pairs, adds each
    batch's ``negatives(batch)`` pairs when given (what training draws), samples the endpoints' subgraph
    and counts every vertex of it once. Returns int64 ``[num_nodes]`` counts and the batches walked
    (``num_batches``, else ``epochs`` passes).
    """
    link = LinkSampler(sampler)
    e = pairs.shape[1]
    per_epoch = max(1, math.ceil(e / batch_size))
    total = num_batches if num_batches is not None else math.ceil(per_epoch * epochs)
    rng = np.random.default_rng(shuffle_seed)
    counts = torch.zeros(sampler.num_nodes, dtype=torch.int64)
    order = np.arange(e)
    for done in range(total if e else 0):
        step = done % per_epoch
        if step == 0:
            order = rng.permutation(e)
        batch = pairs[:, order[step * batch_size:(step + 1) * batch_size]]
        if negatives is not None:
            batch = np.concatenate([batch, negatives(batch)], axis=1)
        n_id = link.sample(batch).batch.n_id
        counts.index_add_(0, n_id, torch.ones_like(n_id))
        if progress is not None:
            progress(done + 1, total)
    return counts.numpy(), total if e else 0
