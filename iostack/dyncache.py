"""A cache that fills on access: rows read through the next tier on a miss and inserted, victims by a policy.

:class:`RowCache` holds ``capacity`` rows in a tensor (host memory, or device
memory for the GPU cache: only the row copies touch the device) and keeps its
bookkeeping on the CPU in numpy, per batch and vectorised: a slot table indexed
by row id (``slot_of``: -1 where the row is not cached) gives the hit test of a
whole batch in one lookup, and the batch's misses go in at once, into slots the
policy (:data:`iostack.cachepolicy.CACHE_POLICIES`) chose in one call. This is
DGL GraphBolt's ``GPUCachedFeature``/``CPUCachedFeature`` (a dynamic cache over a
fallback feature) with the per-row work of its C++ policies done as array
operations, because the bookkeeping here is Python. The placement's static fill
(the DDAK GPU/CPU bins) is the warm start (:meth:`RowCache.warm`).

Memory, bounded and stated by :meth:`RowCache.bookkeeping_bytes`: the rows
(``capacity × row bytes``), the slot table (4 bytes a row id below 2**31, else 8),
the slot → id table (8 bytes a slot), and the policy's state (LRU 8, CLOCK 1,
S3-FIFO 10 bytes a slot plus a 4-byte ghost stamp per row id).

>>> feats = torch.arange(12.0).reshape(6, 2)
>>> cache = RowCache(2, 6, 2, fallback=lambda ids: feats[torch.from_numpy(ids)], policy="lru")
>>> cache.gather(np.array([4, 1, 4])).tolist()
[[8.0, 9.0], [2.0, 3.0], [8.0, 9.0]]
>>> cache.gather(np.array([1, 5]))[:, 0].tolist(), cache.counts
([2.0, 10.0], CacheCounts(hits=1, misses=3, inserted=3))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from iostack.cachepolicy import CACHE_POLICIES
from iostack.cachepolicy.base import EvictionPolicy
from iostack.errors import StoreError

#: rows of the next tier: ``fallback(ids)`` (int64 numpy ids, distinct) → ``(len(ids), dim)`` tensor
Fallback = Callable[[np.ndarray], torch.Tensor]


@dataclass(frozen=True)
class CacheCounts:
    """Distinct rows per batch summed: found in the cache, read through, and inserted."""

    hits: int = 0
    misses: int = 0
    inserted: int = 0

    @property
    def hit_rate(self) -> float:
        """Hits over distinct rows asked for (0 when none was)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class RowCache:
    """``capacity`` rows of a ``(num_rows, dim)`` feature matrix, filled on access through ``fallback``.

    ``policy``: a name of :data:`~iostack.cachepolicy.CACHE_POLICIES` (``static``
    caches only what :meth:`warm` put in). ``dtype``, ``device``: the cached rows'
    type and where they live (the fallback's rows are converted to them); ``allocate``:
    ``allocate(shape, dtype)`` makes the rows tensor instead (a
    :meth:`iostack.transfer.DeviceMemory.empty`: device memory the transfer layer knows).

    Raises
    ------
    StoreError
        ``capacity`` or ``num_rows`` is negative, or ``policy`` is unknown.
    """

    def __init__(self, capacity: int, num_rows: int, dim: int, *, fallback: Fallback, policy: str = "s3fifo",
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 allocate: Callable[[tuple[int, int], torch.dtype], torch.Tensor] | None = None) -> None:
        if capacity < 0 or num_rows < 0:
            raise StoreError(f"`capacity` {capacity}, `num_rows` {num_rows}: expected sizes >= 0")
        self.capacity, self.num_rows, self.fallback = min(int(capacity), int(num_rows)), int(num_rows), fallback
        self.policy: EvictionPolicy = CACHE_POLICIES.get(policy)(self.capacity)
        self.policy_name = policy
        self.rows = (torch.zeros((self.capacity, dim), dtype=dtype, device=device) if allocate is None
                     else allocate((self.capacity, dim), dtype).zero_())
        self.slot_of = np.full(self.num_rows, -1, np.int32 if self.num_rows < 2**31 else np.int64)
        self.id_of = np.full(self.capacity, -1, np.int64)
        self.counts = CacheCounts()

    def warm(self, ids: np.ndarray) -> None:
        """Fill with rows ``ids`` (hottest first; the static fill), read through the fallback, as far as room allows."""
        ids = np.asarray(ids, np.int64)
        ids = ids[self.slot_of[ids] < 0][:self.capacity - self.policy.filled]
        if ids.size:
            self._insert(ids[::-1].copy(), self.fallback(ids[::-1].copy()), admit_all=True)

    def _insert(self, ids: np.ndarray, rows: torch.Tensor, *, admit_all: bool = False) -> int:
        """Rows ``ids`` into slots the policy frees (the last ``capacity`` of them); how many went in."""
        if not (self.policy.admits or admit_all) or not self.capacity:
            return 0
        if ids.size > self.capacity:
            ids, rows = ids[-self.capacity:], rows[-self.capacity:]
        if not self.policy.admits:  # the warm fill of a static cache: free slots only
            ids, rows = ids[:self.capacity - self.policy.filled], rows[:self.capacity - self.policy.filled]
        slots = self.policy.evict(ids.size)
        old = self.id_of[slots]
        self.slot_of[old[old >= 0]] = -1
        self.slot_of[ids] = slots
        self.id_of[slots] = ids
        self.rows[torch.from_numpy(slots).to(self.rows.device)] = rows.to(self.rows.device, self.rows.dtype)
        self.policy.inserted(slots, ids, old)
        return int(ids.size)

    def gather(self, ids: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (``(n,)`` int64, repeats allowed) as a ``(n, dim)`` tensor where the rows live.

        Hits are read from the cache, the distinct misses once through the
        fallback; then the misses go in (the policy's victims out).
        """
        ids_np = ids.cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
        uniq, inverse = np.unique(ids_np.astype(np.int64, copy=False), return_inverse=True)
        slots = self.slot_of[uniq].astype(np.int64)
        hit = slots >= 0
        dev = self.rows.device
        out = torch.empty((uniq.size, self.rows.shape[1]), dtype=self.rows.dtype, device=dev)
        at_hit = np.flatnonzero(hit)
        self.policy.hit(slots[hit])
        out[torch.from_numpy(at_hit).to(dev)] = self.rows[torch.from_numpy(slots[hit]).to(dev)]
        miss = uniq[~hit]
        inserted = 0
        if miss.size:
            fetched = self.fallback(miss).to(dev, self.rows.dtype)
            out[torch.from_numpy(np.flatnonzero(~hit)).to(dev)] = fetched
            inserted = self._insert(miss, fetched)
        c = self.counts
        self.counts = CacheCounts(c.hits + int(at_hit.size), c.misses + int(miss.size), c.inserted + inserted)
        return out[torch.from_numpy(inverse.reshape(-1)).to(dev)]

    def admit(self, ids: np.ndarray, rows: torch.Tensor) -> int:
        """Rows read elsewhere (``ids``: distinct, none cached; ``rows``: theirs, in order) go in, counted as misses.

        For a cache whose misses are fetched by its owner, not through a fallback (the remote-row cache of a
        sharded run, whose misses come in the step's exchange): the same insert as :meth:`gather`'s. Returns how
        many went in.
        """
        ids = np.asarray(ids, np.int64)
        inserted = self._insert(ids, rows) if ids.size else 0
        c = self.counts
        self.counts = CacheCounts(c.hits, c.misses + int(ids.size), c.inserted + inserted)
        return inserted

    def read_hits(self, slots: np.ndarray, out: torch.Tensor) -> None:
        """Rows at ``slots`` (found by ``slot_of``; repeats allowed) into ``out``; the policy told of the distinct
        ones, counted as hits."""
        distinct = np.unique(np.asarray(slots, np.int64))
        self.policy.hit(distinct)
        torch.index_select(self.rows, 0, torch.from_numpy(np.asarray(slots, np.int64)).to(self.rows.device),
                           out=out)
        c = self.counts
        self.counts = CacheCounts(c.hits + int(distinct.size), c.misses, c.inserted)

    def reset_counts(self) -> None:
        """Counts from zero (the cached rows stay)."""
        self.counts = CacheCounts()

    def cached_ids(self) -> np.ndarray:
        """The row ids cached now (ascending)."""
        return np.sort(self.id_of[self.id_of >= 0])

    def bookkeeping_bytes(self) -> int:
        """Host memory besides the rows: slot table, slot → id table, policy state."""
        return self.slot_of.nbytes + self.id_of.nbytes + self.policy.nbytes()

    def row_bytes(self) -> int:
        """Memory of the cached rows, bytes (on their device)."""
        return self.rows.numel() * self.rows.element_size()


__all__ = ["CacheCounts", "Fallback", "RowCache"]
