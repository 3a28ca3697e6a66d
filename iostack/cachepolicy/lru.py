"""``lru``: evict the slots read longest ago (a batch's reads are equally recent)."""

from __future__ import annotations

import numpy as np

from iostack.cachepolicy.base import EvictionPolicy, smallest


class LruPolicy(EvictionPolicy):
    """Least recently used, by a per-slot batch stamp (8 bytes a slot); victims in ``O(capacity)`` per batch
    (a partition, not a sort), ties to the lower slot."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.stamp = np.zeros(self.capacity, np.int64)
        self.now = 0

    def hit(self, slots: np.ndarray) -> None:
        self.now += 1
        self.stamp[slots] = self.now

    def _victims(self, k: int, limit: int) -> np.ndarray:
        return smallest(self.stamp[:limit], k)

    def inserted(self, slots: np.ndarray, ids: np.ndarray, old_ids: np.ndarray) -> None:
        self.stamp[slots] = self.now

    def nbytes(self) -> int:
        return self.stamp.nbytes


__all__ = ["LruPolicy"]
