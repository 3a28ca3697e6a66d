"""Negative sampling: vertex pairs that are not edges, drawn uniformly or by degree.

``uniform``: each endpoint uniform over the vertices (PyG's ``negative_sampling``). ``degree``: each
endpoint drawn with probability proportional to ``degree ** 0.75`` (word2vec's smoothed unigram
distribution, which PinSage and DGL's link-prediction examples use), so hubs appear as negatives
about as often as they appear in edges and a model cannot score pairs by popularity alone.
Given ``src`` (the positives' sources), only the targets are drawn (per-source corruption, as
DGL's samplers do). A pair that is an edge of ``exclude`` or a self-loop is drawn again, up to
``max_rounds`` times; what is still an edge then is dropped, so a sample never holds a positive
and may fall short of ``num`` on a graph almost complete (its length says by how much).

>>> import numpy as np
>>> from training.link.edgeset import EdgeSet
>>> full = EdgeSet.from_pairs(np.array([0, 1]), np.array([1, 0]), 3)
>>> neg = NegativeSampler(full).sample(50, np.random.default_rng(0))
>>> bool(full.contains(neg[0], neg[1]).any()), bool((neg[0] == neg[1]).any())
(False, False)
"""

from __future__ import annotations

import numpy as np

from training.link.edgeset import LinkSplitError, PairMembership
from training.vocab import NEGATIVE_METHODS

__all__ = ["DEGREE_POWER", "NegativeSampler"]

#: the exponent of the degree distribution ``degree`` negatives are drawn from
DEGREE_POWER = 0.75


class NegativeSampler:
    """Draws non-edges of ``exclude`` (see the module doc).

    Parameters
    ----------
    exclude : PairMembership
        The edges a negative may not be (both directions of an undirected graph).
    method : str
        ``"uniform"`` or ``"degree"`` (:data:`training.vocab.NEGATIVE_METHODS`).
    degree : np.ndarray, optional
        Per-vertex degree ``[num_nodes]`` (needed by ``"degree"``).
    max_rounds : int
        Redraws of the pairs that hit an edge before they are dropped.

    Raises
    ------
    LinkSplitError
        An unknown method, or ``"degree"`` without degrees.
    """

    def __init__(self, exclude: PairMembership, *, method: str = "uniform", degree: np.ndarray | None = None,
                 max_rounds: int = 20) -> None:
        if method not in NEGATIVE_METHODS:
            raise LinkSplitError(f"`negatives` {method!r}: expected one of {', '.join(NEGATIVE_METHODS)}")
        self.exclude = exclude
        self.num_nodes = exclude.num_nodes
        self.method = method
        self.max_rounds = int(max_rounds)
        self._cdf: np.ndarray | None = None
        if method == "degree":
            if degree is None or np.asarray(degree).shape != (self.num_nodes,):
                raise LinkSplitError(f"`negatives` degree: pass the {self.num_nodes} vertices' degrees")
            w = np.asarray(degree, np.float64) ** DEGREE_POWER
            if not w.sum() > 0:
                raise LinkSplitError("`negatives` degree: the graph has no edges; use uniform negatives")
            self._cdf = np.cumsum(w / w.sum())

    def _vertices(self, k: int, rng: np.random.Generator) -> np.ndarray:
        if self._cdf is None:
            return rng.integers(0, self.num_nodes, size=k, dtype=np.int64)
        # inverse-CDF draws: one binary search each, no per-call O(num_nodes) set-up as rng.choice(p=) has
        return np.minimum(np.searchsorted(self._cdf, rng.random(k), side="right"), self.num_nodes - 1)

    def sample(self, num: int, rng: np.random.Generator, src: np.ndarray | None = None) -> np.ndarray:
        """``[2, k]`` int64 non-edges, ``k <= num`` (``num`` unless the graph is nearly complete).

        ``src``: the sources to keep (``[num]``); drawn too when ``None``.
        """
        keep_src = src is not None
        s = np.asarray(src, np.int64).copy() if keep_src else self._vertices(num, rng)
        d = self._vertices(s.shape[0], rng)
        bad = self.exclude.contains(s, d) | (s == d)
        for _ in range(self.max_rounds):
            redo = np.flatnonzero(bad)
            if redo.size == 0:
                break
            if not keep_src:
                s[redo] = self._vertices(redo.size, rng)
            d[redo] = self._vertices(redo.size, rng)
            bad[redo] = self.exclude.contains(s[redo], d[redo]) | (s[redo] == d[redo])
        ok = ~bad
        return np.stack([s[ok], d[ok]])
