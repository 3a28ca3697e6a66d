"""``s3fifo``: S3-FIFO (Yang et al., SOSP'23): a small FIFO that filters one-hit rows, a main FIFO with
reinsertion, and a ghost record of what the small queue evicted.

A new row enters the small queue (a tenth of the slots), or the main one when the
ghost remembers it. Evicting from the small queue (while it holds at least its
tenth, or the main one is empty): the oldest row moves to the main queue if it
was read since it came in, else it leaves and is remembered by the ghost. From
the main queue: the oldest row read since its last turn goes back to the head
with its count less one (counts stop at 3), else it leaves.
"""

from __future__ import annotations

import numpy as np

from iostack.cachepolicy.base import EvictionPolicy, smallest

_NONE, _SMALL, _MAIN = 0, 1, 2
#: the most rows of the main queue looked at per vectorised round (rows past the victims stay as they are)
_WINDOW = 4096


class S3FifoPolicy(EvictionPolicy):
    """S3-FIFO over slots: per slot a queue tag, a count (0..3) and a position (``seq``, oldest smallest);
    the ghost as a ``uint32`` stamp per row id (grown to the largest id seen: 4 bytes a row),
    remembering the last ``capacity - capacity // 10`` rows the small queue evicted.

    A batch's victims come in a few vectorised rounds, each taking the oldest rows of one
    queue in order, exactly the sequence of single evictions (but a batch's inserts are not
    candidates).
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.queue = np.zeros(self.capacity, np.int8)
        self.freq = np.zeros(self.capacity, np.int8)
        self.seq = np.zeros(self.capacity, np.int64)
        self.next_seq = 0
        self.small_target = max(1, self.capacity // 10)
        self.ghost_size = max(1, self.capacity - self.small_target)
        self.ghost = np.zeros(0, np.uint32)
        self.ghost_count = np.uint32(0)
        self._to_ghost = np.zeros(0, np.int64)

    def hit(self, slots: np.ndarray) -> None:
        self.freq[slots] = np.minimum(self.freq[slots] + 1, 3)

    def _oldest(self, tag: int, limit: int, k: int) -> np.ndarray:
        """The ``k`` oldest slots of queue ``tag`` (among ``0 .. limit-1``), oldest first."""
        members = np.flatnonzero(self.queue[:limit] == tag)
        key = self.seq[members]
        pick = smallest(key, k)
        return members[pick[np.argsort(key[pick], kind="stable")]]

    def _renew(self, slots: np.ndarray, tag: int) -> None:
        """``slots`` (in order) to the head of queue ``tag``."""
        self.queue[slots] = tag
        self.seq[slots] = self.next_seq + np.arange(slots.size)
        self.next_seq += slots.size

    def _round(self, tag: int, cand: np.ndarray, need: int) -> np.ndarray:
        """One walk over ``cand`` (oldest first) of queue ``tag``: its victims (at most ``need``)."""
        cold = np.flatnonzero(self.freq[cand] == 0)[:need]
        passed = cand if cold.size < need else cand[:cold[-1] + 1]
        out = cand[cold]
        kept = passed[self.freq[passed] > 0]
        if tag == _SMALL:
            self.freq[kept] = 0
            self._renew(kept, _MAIN)
            self._to_ghost = np.concatenate([self._to_ghost, out])
        else:
            self.freq[kept] -= 1
            self._renew(kept, _MAIN)
        self.queue[out] = _NONE
        return out

    def _victims(self, k: int, limit: int) -> np.ndarray:
        got: list[np.ndarray] = []
        need = k
        while need > 0:
            n_small = int(np.count_nonzero(self.queue[:limit] == _SMALL))
            n_main = int(np.count_nonzero(self.queue[:limit] == _MAIN))
            if n_small and (n_small >= self.small_target or not n_main):
                steps = n_small - self.small_target + 1 if n_main else n_small
                out = self._round(_SMALL, self._oldest(_SMALL, limit, max(steps, 1)), need)
            else:
                out = self._round(_MAIN, self._oldest(_MAIN, limit, min(n_main, max(need, _WINDOW))), need)
            got.append(out)
            need -= out.size
        return np.concatenate(got)

    def _ghost_of(self, ids: np.ndarray) -> np.ndarray:
        """Whether the ghost remembers each of ``ids``."""
        known = ids < self.ghost.size
        stamp = np.zeros(ids.size, np.uint32)
        stamp[known] = self.ghost[ids[known]]
        age = (self.ghost_count - stamp).astype(np.uint32)
        return (stamp > 0) & (age < self.ghost_size)

    def inserted(self, slots: np.ndarray, ids: np.ndarray, old_ids: np.ndarray) -> None:
        gone = old_ids[np.isin(slots, self._to_ghost)] if self._to_ghost.size else old_ids[:0]
        self._to_ghost = np.zeros(0, np.int64)
        top = int(max(ids.max(initial=-1), gone.max(initial=-1))) + 1
        if top > self.ghost.size:
            self.ghost = np.concatenate([self.ghost, np.zeros(top - self.ghost.size, np.uint32)])
        to_main = self._ghost_of(ids)
        if gone.size:
            self.ghost[gone] = self.ghost_count + 1 + np.arange(gone.size, dtype=np.uint32)
            self.ghost_count = np.uint32(self.ghost_count + gone.size)
        self.ghost[ids[to_main]] = 0
        self.freq[slots] = 0
        self._renew(slots[~to_main], _SMALL)
        self._renew(slots[to_main], _MAIN)

    def nbytes(self) -> int:
        return self.queue.nbytes + self.freq.nbytes + self.seq.nbytes + self.ghost.nbytes


__all__ = ["S3FifoPolicy"]
