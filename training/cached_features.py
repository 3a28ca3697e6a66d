"""A feature source with a cache that fills on access in front of it (``moment train --cache-policy``).

:class:`CachedFeatures` puts an :class:`iostack.dyncache.RowCache` in host memory
in front of another :class:`~training.features.FeatureSource` (the placement's
store, or the features in memory): a batch's rows found in it are copied from it,
the rest are gathered once from the source and inserted, victims chosen by the
policy. The warm start is the placement's static fill (the vertices of its GPU
and CPU bins, GPU bins first). The cache's rows reach the training device through
the source's :class:`~iostack.transfer.Transfer` as one batch, like
:class:`~training.features.MemoryFeatures`' rows. Its bookkeeping is not
thread-safe, so it says so to the pipeline (``concurrent_gathers``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from iostack.dyncache import RowCache
from iostack.transfer import Gathered
from training.errors import TrainError
from training.features import FeatureSource


def static_fill(placement_dir: str | None) -> np.ndarray:
    """The vertices a placement's GPU and CPU bins hold (GPU bins first): the cache's warm start (none without one)."""
    if placement_dir is None:
        return np.empty(0, np.int64)
    from iostack.placement import load_placement

    placement = load_placement(placement_dir)
    order = sorted((b for b in placement.bins if b.kind != "ssd"), key=lambda b: b.kind != "gpu")
    parts = [placement.vertices_of(b.id) for b in order]
    return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)


class CachedFeatures:
    """``source``'s rows through a host cache of ``capacity_bytes`` filled on access by ``policy``.

    Raises
    ------
    TrainError
        ``capacity_bytes`` holds not one row.
    """

    #: the cache's bookkeeping is one thread's: the pipeline counts a batch's rows around its gather
    concurrent_gathers = False

    def __init__(self, source: FeatureSource, num_rows: int, capacity_bytes: int, policy: str,
                 warm: np.ndarray) -> None:
        probe = source.gather(torch.zeros(1, dtype=torch.int64))
        self.source, self.dim, self.transfer = source, source.dim, source.transfer
        row_bytes = self.dim * probe.element_size()
        if capacity_bytes < row_bytes:
            raise TrainError(f"`dynamic_cache_bytes` {capacity_bytes} holds no row of {row_bytes} bytes: "
                             "give a larger size")
        self.cache = RowCache(capacity_bytes // row_bytes, num_rows, self.dim, policy=policy, dtype=probe.dtype,
                              fallback=lambda ids: source.gather(torch.from_numpy(ids)).cpu())
        self.cache.warm(warm)
        self.cache.reset_counts()
        self._row_bytes = row_bytes

    def gather(self, ids: Tensor) -> Tensor:
        return self.gather_landing(ids).wait()

    def gather_landing(self, ids: Tensor, *, dtype: torch.dtype | None = None) -> Gathered:
        rows = self.cache.gather(torch.as_tensor(ids).cpu())
        with self.transfer.batch() as tb:
            x = tb.to_device(rows, dtype) if self.transfer.accelerated else tb.cast(rows, dtype)
        return Gathered(x, tb.landing)

    def totals(self) -> dict[str, tuple[int, int]]:
        """The source's tiers (the misses read through) and ``cache`` (distinct rows found in the cache)."""
        hits = self.cache.counts.hits
        return {**self.source.totals(), "cache": (hits, hits * self._row_bytes)}

    def memory_bytes(self) -> dict[str, int]:
        inner = getattr(self.source, "memory_bytes", None)
        out = dict(inner()) if inner is not None else {}
        out["dynamic_cache"] = self.cache.row_bytes() + self.cache.bookkeeping_bytes()
        return out

    def epoch_record(self) -> dict:
        """This epoch's hit rate (then counted from zero), and the source's own record."""
        inner = getattr(self.source, "epoch_record", None)
        rec = dict(inner()) if inner is not None else {}
        rec["cache_hit_rate"] = round(self.cache.counts.hit_rate, 4)
        self.cache.reset_counts()
        return rec

    def unlink_shared(self) -> None:
        inner = getattr(self.source, "unlink_shared", None)
        if inner is not None:
            inner()

    def close(self) -> None:
        self.source.close()


__all__ = ["CachedFeatures", "static_fill"]
