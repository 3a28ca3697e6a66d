"""A node's locality cache: the hottest rows other nodes hold, kept on this node (DYAD's idea).

:func:`cache_rows` picks them (by the placement's hotness, up to a budget of
rows); :class:`RemoteCache` holds them in node-shared host memory or an SSD
bin and serves them by vertex id. :mod:`training.sharded.features` fills it at start
and reads it before asking the holders.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor


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


__all__ = ["RemoteCache", "cache_rows"]
