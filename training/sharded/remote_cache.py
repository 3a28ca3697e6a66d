"""A node's locality cache: the hottest rows other nodes hold, kept on this node (DYAD's idea).

:func:`cache_rows` picks them (by the placement's hotness, up to a budget of
rows); :class:`RemoteCache` holds them in node-shared host memory or an SSD
bin and serves them by vertex id. :mod:`training.sharded.features` fills it at start
and reads it before asking the holders.

With a cache policy other than ``static`` (``cache_policy``), :class:`DynamicRemoteCache`
takes the static fill as its warm start and from then on fills on access: the rows a
step fetched from other nodes go in after the step's exchange (:meth:`DynamicRemoteCache.admit`,
one vectorised insert per batch), victims chosen by the policy
(:data:`iostack.cachepolicy.CACHE_POLICIES`), as the host cache of a single-node run
(:mod:`training.cached_features`) does with its reads through the store.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from iostack.dyncache import RowCache
from iostack.errors import StoreError


def cache_rows(hotness: np.ndarray, held: np.ndarray, budget_rows: int) -> np.ndarray:
    """The ``budget_rows`` hottest rows this node does not hold (global ids, hottest first; ties by id).

    >>> cache_rows(np.array([5., 1., 9., 0.]), np.array([False, False, True, False]), 2).tolist()
    [0, 1]
    """
    if budget_rows <= 0:
        return np.empty(0, np.int64)
    cand = np.flatnonzero(~np.asarray(held, bool))
    if cand.size > budget_rows:
        h = -np.asarray(hotness, np.float64)[cand]
        top = np.argpartition(h, budget_rows - 1)[:budget_rows]
        cand = cand[top]
    h = -np.asarray(hotness, np.float64)[cand]
    return cand[np.lexsort((cand, h))].astype(np.int64)


class RemoteCache:
    """Rows of other nodes held on this node: ``rows[slot]`` is vertex ``ids[slot]``'s row (host memory)."""

    def __init__(self, ids: np.ndarray, num_vertices: int, rows: Tensor | None = None, store: Any = None,
                 segment: Any = None, where: str = "host") -> None:
        self.ids = np.asarray(ids, np.int64)
        index = np.full(num_vertices, -1, np.int32 if num_vertices < 2**31 - 1 else np.int64)
        index[self.ids] = np.arange(self.ids.size, dtype=index.dtype)
        self.index = torch.from_numpy(index)
        self.rows, self.store, self.segment, self.where = rows, store, segment, where

    def __len__(self) -> int:
        return int(self.ids.size)

    def take(self, slots: Tensor, out: Tensor) -> None:
        """Rows at ``slots`` into ``out`` (host)."""
        if self.rows is not None:
            torch.index_select(self.rows, 0, slots, out=out)
        else:
            out.copy_(self.store.gather(slots, device="cpu"))

    def admit(self, ids: Tensor, rows: Tensor) -> None:
        """A static cache admits nothing (the rows ``ids`` a step fetched stay remote)."""

    def nbytes(self) -> int:
        return 0 if self.rows is None else self.rows.numel() * self.rows.element_size()

    def unlink_shared(self) -> None:
        if self.segment is not None:
            self.segment.unlink()

    def close(self) -> None:
        self.rows = None
        if self.segment is not None:
            self.segment.close()
            self.segment = None
        if self.store is not None:
            self.store.close()
            self.store = None


class DynamicRemoteCache:
    """Rows of other nodes, filled on access: a :class:`~iostack.dyncache.RowCache` of ``capacity_rows`` rows in
    this rank's host memory, warm-started with ``static``'s rows (hottest first), evicting by ``policy``.

    It serves :class:`training.sharded.features.ShardedFeatures` as :class:`RemoteCache` does (``index``: vertex →
    slot, -1 where not cached, a view of the cache's slot table, so it follows every insert; :meth:`take`), and
    :meth:`admit` takes the rows a step fetched from their holders. ``static`` stays open until :meth:`close`
    (a node-shared fill's segment is unlinked through it, after every rank mapped it).

    Raises
    ------
    StoreError
        ``policy`` is not a cache policy, or ``static`` is in an SSD bin (no rows in host memory).
    """

    def __init__(self, static: RemoteCache, capacity_rows: int, policy: str) -> None:
        if static.rows is None:  # the static fill in an SSD bin: a host cache would not keep to its budget
            raise StoreError("the remote cache filled on access warm-starts from rows in host memory: leave "
                             "`remote_cache_dir` unset")
        dim, dtype, num_vertices = static.rows.shape[1], static.rows.dtype, static.index.numel()

        def from_static(ids: np.ndarray) -> Tensor:
            out = torch.empty((ids.size, dim), dtype=dtype)
            static.take(static.index[torch.from_numpy(ids)].to(torch.int64), out)
            return out

        self.static = static
        self.cache = RowCache(capacity_rows, num_vertices, dim, fallback=from_static, policy=policy, dtype=dtype)
        self.cache.warm(static.ids)
        self.cache.reset_counts()
        self.index = torch.from_numpy(self.cache.slot_of)
        self.where = f"this rank's host memory, filled on access ({policy}; warm start: {len(static):,} rows " \
                     f"of {static.where})"

    def __len__(self) -> int:
        return int(self.cache.capacity)

    def take(self, slots: Tensor, out: Tensor) -> None:
        """Rows at ``slots`` into ``out`` (host); the policy counts them as read."""
        self.cache.read_hits(slots.numpy(), out)

    def admit(self, ids: Tensor, rows: Tensor) -> None:
        """Rows ``ids`` (remote, not cached; repeats allowed) fetched this step, ``rows`` theirs: into the cache."""
        uniq, first = np.unique(ids.numpy(), return_index=True)
        self.cache.admit(uniq, rows.cpu()[torch.from_numpy(first)])

    def nbytes(self) -> int:
        return self.cache.row_bytes() + self.cache.bookkeeping_bytes()

    def unlink_shared(self) -> None:
        self.static.unlink_shared()

    def close(self) -> None:
        self.static.close()


def with_policy(static: RemoteCache, capacity_rows: int, policy: str) -> RemoteCache | DynamicRemoteCache:
    """``static`` itself for the ``static`` policy, else a :class:`DynamicRemoteCache` of ``capacity_rows`` rows
    warm-started with it.

    Raises
    ------
    StoreError
        ``policy`` is not a cache policy, or ``static`` is in an SSD bin.
    """
    return static if policy == "static" else DynamicRemoteCache(static, capacity_rows, policy)


__all__ = ["DynamicRemoteCache", "RemoteCache", "cache_rows", "with_policy"]
