"""Directed edges as sorted integer keys, with membership by binary search: what the link split and the
negative sampler both test pairs against.

>>> import numpy as np
>>> s = EdgeSet.from_csr(np.array([0, 1, 3, 4]), np.array([1, 0, 2, 1]), 3)  # 0-1, 1-2, both ways
>>> s.contains(np.array([0, 1, 0]), np.array([1, 2, 2])).tolist()
[True, True, False]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from training.errors import TrainingError

__all__ = ["EdgeSet", "LinkSplitError", "PairMembership", "csr_edges"]


class LinkSplitError(TrainingError):
    """An edge split that cannot be made or read (the message names the input and the fix)."""


def csr_edges(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` int64 ``[num_edges]`` of a CSR whose row ``v`` holds the sources of the edges ``u -> v``."""
    indptr = np.asarray(indptr, dtype=np.int64)
    dst = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))
    return np.asarray(indices, dtype=np.int64), dst


def _keys(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    # one int64 per directed pair: num_nodes**2 < 2**63 for every graph whose ids fit in int32 or up to 3e9
    return np.asarray(src, np.int64) * int(num_nodes) + np.asarray(dst, np.int64)


class PairMembership(Protocol):
    """What answers whether pairs are edges: :class:`EdgeSet`, or a CSR's rows
    (:class:`training.link.streamsplit.CsrEdges`)."""

    @property
    def num_nodes(self) -> int: ...

    def contains(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, eq=False)
class EdgeSet:
    """Directed edges ``u -> v`` as sorted unique ``int64`` keys ``u * num_nodes + v``; membership by binary search."""

    keys: np.ndarray
    num_nodes: int

    @classmethod
    def from_pairs(cls, src: np.ndarray, dst: np.ndarray, num_nodes: int) -> EdgeSet:
        return cls(np.unique(_keys(src, dst, num_nodes)), int(num_nodes))

    @classmethod
    def from_csr(cls, indptr: np.ndarray, indices: np.ndarray, num_nodes: int) -> EdgeSet:
        return cls.from_pairs(*csr_edges(indptr, indices), num_nodes)

    def contains(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """bool ``[len(src)]``: whether each ``src[i] -> dst[i]`` is in the set."""
        k = _keys(src, dst, self.num_nodes)
        if self.keys.size == 0:
            return np.zeros(k.shape, bool)
        at = np.minimum(np.searchsorted(self.keys, k), self.keys.size - 1)
        return self.keys[at] == k
