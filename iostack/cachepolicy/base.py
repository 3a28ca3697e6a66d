"""The interface every eviction policy implements, per batch and vectorised.

A cache of ``capacity`` slots asks its policy three things per batch, each once
with arrays (never once per row): :meth:`EvictionPolicy.hit` with the slots the
batch read, :meth:`EvictionPolicy.evict` for ``n`` slots to fill with the
batch's misses (free slots first, then victims), and
:meth:`EvictionPolicy.inserted` with what went into them. A batch's own
inserts are never its victims; the victims are chosen among slots filled
before the batch.
"""

from __future__ import annotations

import numpy as np


def smallest(key: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` smallest values of ``key``, ties to the lower position, in ``O(len(key))``.

    >>> smallest(np.array([5, 1, 3, 1, 0]), 3).tolist()
    [1, 3, 4]
    """
    if k <= 0:
        return np.empty(0, np.int64)
    if k >= key.size:
        return np.arange(key.size, dtype=np.int64)
    kth = np.partition(key, k - 1)[k - 1]
    less = np.flatnonzero(key < kth)
    return np.sort(np.concatenate([less, np.flatnonzero(key == kth)[:k - less.size]]))


class EvictionPolicy:
    """Victim choice over slots ``0 .. capacity-1``; subclasses implement :meth:`_victims` and keep their state.

    Slots fill in order (``filled`` of them are), so the free ones are
    ``filled .. capacity-1``; :meth:`evict` hands those out first.
    """

    #: whether the cache inserts its misses (``static`` does not)
    admits = True

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.filled = 0

    def hit(self, slots: np.ndarray) -> None:
        """The batch read ``slots`` (distinct)."""

    def evict(self, n: int) -> np.ndarray:
        """``n`` distinct slots (``n <= capacity``) to fill: free ones first, then victims among the filled."""
        n = min(int(n), self.capacity)
        free = min(n, self.capacity - self.filled)
        slots = np.arange(self.filled, self.filled + free, dtype=np.int64)
        limit, self.filled = self.filled, self.filled + free
        if n > free:
            slots = np.concatenate([slots, self._victims(n - free, limit)])
        return slots

    def _victims(self, k: int, limit: int) -> np.ndarray:
        """``k`` slots among ``0 .. limit-1`` to evict (all filled)."""
        raise NotImplementedError

    def inserted(self, slots: np.ndarray, ids: np.ndarray, old_ids: np.ndarray) -> None:
        """Rows ``ids`` went into ``slots``, replacing ``old_ids`` (-1 where the slot was free)."""

    def nbytes(self) -> int:
        """Memory of the policy's state, bytes (besides the cache's slot table and rows)."""
        return 0


__all__ = ["EvictionPolicy", "smallest"]
