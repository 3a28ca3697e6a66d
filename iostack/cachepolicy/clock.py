"""``clock``: second chance; a hand sweeps the slots, clearing reference bits, and evicts a slot whose bit is clear."""

from __future__ import annotations

import numpy as np

from iostack.cachepolicy.base import EvictionPolicy


class ClockPolicy(EvictionPolicy):
    """CLOCK with one reference bit a slot (set on a hit, clear on insert) and a hand.

    A batch's ``k`` victims in one vectorised sweep: the first ``k`` clear bits
    from the hand on, every bit passed cleared; where fewer than ``k`` are clear,
    the whole circle is cleared and the sweep goes on from the hand (the batch's
    own victims skipped), as ``k`` single-row steps would but for those.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.ref = np.zeros(self.capacity, np.bool_)
        self.hand = 0

    def hit(self, slots: np.ndarray) -> None:
        self.ref[slots] = True

    def _victims(self, k: int, limit: int) -> np.ndarray:
        hand = self.hand % limit
        pos = np.concatenate([np.arange(hand, limit), np.arange(hand)])
        bits = self.ref[pos]
        clear = np.flatnonzero(~bits)
        if clear.size >= k:
            last = clear[k - 1]
            self.ref[pos[:last + 1]] = False
            self.hand = int(pos[last]) + 1
            return pos[clear[:k]]
        self.ref[:limit] = False
        second = np.flatnonzero(bits)[:k - clear.size]
        self.hand = int(pos[second[-1]]) + 1
        return np.concatenate([pos[clear], pos[second]])

    def inserted(self, slots: np.ndarray, ids: np.ndarray, old_ids: np.ndarray) -> None:
        self.ref[slots] = False

    def nbytes(self) -> int:
        return self.ref.nbytes


__all__ = ["ClockPolicy"]
