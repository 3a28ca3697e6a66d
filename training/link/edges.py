"""Edges as keys, and the train/valid/test split of a graph's edges for link prediction.

:func:`split_edges` does what PyG's ``RandomLinkSplit`` does (torch_geometric/transforms/
random_link_split.py): on an undirected graph only the edges ``u <= v`` are candidates (one per
undirected pair), a seeded permutation gives the first ``num_train`` to training, the next
``num_val`` to validation and the rest to test (a float is a share of the candidates, rounded
down); validation and test negatives are drawn once against the whole graph (so none is an edge
in either direction) and kept. The held-out edges leave the sampling graph in both directions:
the training graph's CSR holds the training edges only, which is what message passing, the
sampler, the hotness and the placement see. As in PyG, validation is scored over the training
graph and test over the training and validation edges (:func:`with_edges`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.link.edgeset import EdgeSet, LinkSplitError, csr_edges
from training.link.negatives import NegativeSampler

__all__ = ["LinkSplit", "split_count", "split_edges", "with_edges"]


@dataclass(frozen=True, eq=False)
class LinkSplit:
    """An edge split: positive and negative pairs ``[2, k]`` int64 (row 0 sources, row 1 targets) and the
    training graph's CSR (``indptr`` int64 ``[num_nodes + 1]``, ``indices`` ``[num_train_edges]``).

    On an undirected graph the pairs hold one direction (``u <= v``) and the CSR both.
    """

    num_nodes: int
    undirected: bool
    train_pos: np.ndarray
    valid_pos: np.ndarray
    test_pos: np.ndarray
    valid_neg: np.ndarray
    test_neg: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray


def split_count(share: float | int, total: int, what: str) -> int:
    """Edges of a split out of ``total`` candidates: ``int(share * total)`` for a float share, else the count.

    Raises
    ------
    LinkSplitError
        A share outside ``[0, 1)`` or a negative count (named by ``what``).
    """
    if isinstance(share, float):
        if not 0.0 <= share < 1.0:
            raise LinkSplitError(f"`{what}` {share}: a share of the edges must lie in [0, 1)")
        return int(share * total)
    if share < 0:
        raise LinkSplitError(f"`{what}` {share}: expected a non-negative number of edges")
    return int(share)


def _drop(indptr: np.ndarray, indices: np.ndarray, held: EdgeSet) -> tuple[np.ndarray, np.ndarray]:
    """The CSR without the edges ``held`` names (rows keep their order)."""
    src, dst = csr_edges(indptr, indices)
    keep = ~held.contains(src, dst)
    n = indptr.shape[0] - 1
    out_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst[keep], minlength=n), out=out_ptr[1:])
    return out_ptr, np.asarray(indices)[keep]


def with_edges(indptr: np.ndarray, indices: np.ndarray, pairs: np.ndarray, undirected: bool
               ) -> tuple[np.ndarray, np.ndarray]:
    """The CSR with the edges ``pairs`` (``[2, k]``, both directions when ``undirected``) added, rows sorted.

    Test edges are scored over the training graph plus the validation edges, as PyG's split does.
    """
    src, dst = csr_edges(indptr, indices)
    add_src, add_dst = pairs[0], pairs[1]
    if undirected:
        add_src, add_dst = np.concatenate([pairs[0], pairs[1]]), np.concatenate([pairs[1], pairs[0]])
    src, dst = np.concatenate([src, add_src]), np.concatenate([dst, add_dst])
    order = np.lexsort((src, dst))  # by row (the target), then by source
    n = indptr.shape[0] - 1
    out_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=out_ptr[1:])
    return out_ptr, src[order].astype(np.asarray(indices).dtype)


def split_edges(indptr: np.ndarray, indices: np.ndarray, *, undirected: bool, num_val: float | int = 0.05,
                num_test: float | int = 0.1, seed: int = 0, negatives: str = "uniform",
                neg_ratio: float = 1.0) -> LinkSplit:
    """Split a graph's edges for link prediction (see the module doc; PyG's ``RandomLinkSplit``).

    Parameters
    ----------
    indptr, indices : np.ndarray
        The graph's CSR (row ``v``: the sources of the edges ``u -> v``); an undirected graph holds both directions.
    undirected : bool
        Keep both directions of an edge in the same split (the candidates are the pairs ``u <= v``).
    num_val, num_test : float or int
        Validation and test edges: a share of the candidates (float) or a count (int).
    seed : int
        Seed of the permutation and of the negatives.
    negatives : str
        How validation and test negatives are drawn (:data:`training.vocab.NEGATIVE_METHODS`).
    neg_ratio : float
        Negatives per positive in validation and test.

    Returns
    -------
    LinkSplit

    Raises
    ------
    LinkSplitError
        Shares outside ``[0, 1)``, or too few edges left to train on.
    """

    indptr = np.asarray(indptr, np.int64)
    n = indptr.shape[0] - 1
    src, dst = csr_edges(indptr, indices)
    cand = np.flatnonzero(src <= dst) if undirected else np.arange(src.shape[0])
    rng = np.random.default_rng(seed)
    perm = cand[rng.permutation(cand.shape[0])]
    n_val, n_test = split_count(num_val, perm.shape[0], "num_val"), split_count(num_test, perm.shape[0], "num_test")
    n_train = perm.shape[0] - n_val - n_test
    if n_train <= 0:
        raise LinkSplitError(f"{perm.shape[0]} candidate edges leave none to train on after {n_val} validation "
                             f"and {n_test} test edges; lower `num_val` or `num_test`")
    pos = [np.stack([src[p], dst[p]]) for p in (perm[:n_train], perm[n_train:n_train + n_val],
                                                  perm[n_train + n_val:])]
    held = np.concatenate([pos[1], pos[2]], axis=1)
    if undirected:
        held = np.concatenate([held, held[::-1]], axis=1)
    train_ptr, train_idx = _drop(indptr, indices, EdgeSet.from_pairs(held[0], held[1], n))
    # negatives of validation and test are drawn against the whole graph, as PyG draws them
    sampler = NegativeSampler(EdgeSet.from_pairs(src, dst, n), method=negatives,
                              degree=np.bincount(np.concatenate([src, dst]), minlength=n))
    n_neg_val, n_neg_test = int(n_val * neg_ratio), int(n_test * neg_ratio)
    neg = sampler.sample(n_neg_val + n_neg_test, rng)
    return LinkSplit(num_nodes=n, undirected=undirected, train_pos=pos[0], valid_pos=pos[1], test_pos=pos[2],
                     valid_neg=neg[:, :n_neg_val], test_neg=neg[:, n_neg_val:], indptr=train_ptr, indices=train_idx)
