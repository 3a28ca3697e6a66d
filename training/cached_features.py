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

With ``on="gpu"`` (``moment train --dynamic-cache-on gpu``) the cached rows live
in the rank's device memory (GraphBolt's ``GPUCachedFeature``): a batch's hits
are read there (``index_select``), only its misses are gathered from the source,
reach the device through the source's own batch and landing, and go into the
cache's rows and the batch's output on the device. All of a batch's device work
on the cache (reads, inserts) runs on the gathering thread's copy stream, inside
one :meth:`iostack.transfer.Transfer.batch` whose landing covers the output; the
next batch's stream first waits for the last one's (a gather on another thread,
an evaluation on the main thread), so an insert never overwrites rows another
stream still reads. Tested on the deferred fake accelerator of
``tests/fake_cuda.py`` only: it has not run on a GPU.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from iostack.dyncache import RowCache
from iostack.transfer import AcceleratedMemory, Gathered
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
    """``source``'s rows through a cache of ``capacity_bytes`` filled on access by ``policy``.

    ``on``: where the cached rows live, ``host`` or ``gpu`` (the source's transfer's device).

    Raises
    ------
    TrainError
        ``capacity_bytes`` holds not one row, or ``on`` is ``gpu`` and the run has no accelerator.
    """

    #: the cache's bookkeeping is one thread's: the pipeline counts a batch's rows around its gather
    concurrent_gathers = False

    def __init__(self, source: FeatureSource, num_rows: int, capacity_bytes: int, policy: str,
                 warm: np.ndarray, *, on: str = "host") -> None:
        self.source, self.dim, self.transfer = source, source.dim, source.transfer
        self.on_device = on == "gpu"
        if self.on_device and not self.transfer.accelerated:
            raise TrainError("`dynamic_cache_on` gpu: this run has no accelerator (it trains on the CPU): "
                             "leave it at host")
        probe = source.gather(torch.zeros(1, dtype=torch.int64))
        row_bytes = self.dim * probe.element_size()
        if capacity_bytes < row_bytes:
            raise TrainError(f"`dynamic_cache_bytes` {capacity_bytes} holds no row of {row_bytes} bytes: "
                             "give a larger size")
        memory = self.transfer.memory
        # on the device the warm rows stay there: the source's device rows are not copied back to the host
        self.cache = RowCache(capacity_bytes // row_bytes, num_rows, self.dim, policy=policy, dtype=probe.dtype,
                              fallback=(lambda ids: source.gather(torch.from_numpy(ids))) if self.on_device
                              else (lambda ids: source.gather(torch.from_numpy(ids)).cpu()),
                              allocate=memory.empty if self.on_device else None)
        self.cache.warm(warm)
        self.cache.reset_counts()
        self._row_bytes = row_bytes
        #: the point after the last device work on the cache's rows (the warm fill's, then each batch's)
        self._last = memory.mark() if self.on_device else None

    def gather(self, ids: Tensor) -> Tensor:
        return self.gather_landing(ids).wait()

    def gather_landing(self, ids: Tensor, *, dtype: torch.dtype | None = None) -> Gathered:
        if self.on_device:
            return self._gather_on_device(torch.as_tensor(ids), dtype)
        rows = self.cache.gather(torch.as_tensor(ids).cpu())
        with self.transfer.batch() as tb:
            x = tb.to_device(rows, dtype) if self.transfer.accelerated else tb.cast(rows, dtype)
        return Gathered(x, tb.landing)

    def _gather_on_device(self, ids: Tensor, dtype: torch.dtype | None) -> Gathered:
        """Rows ``ids`` from the device cache (hits) and the source (misses, then inserted), as one landing."""
        cache, memory = self.cache, self.transfer.memory
        assert isinstance(memory, AcceleratedMemory)  # the constructor refused a run without one
        uniq, inverse = np.unique(memory.to_host(ids).numpy().astype(np.int64, copy=False), return_inverse=True)
        slots = cache.slot_of[uniq].astype(np.int64)
        hit = slots >= 0
        miss = uniq[~hit]
        fetched = self.source.gather_landing(torch.from_numpy(miss)) if miss.size else None
        # the batch's output holds the hits first, then the misses: where each distinct id's row went
        order = np.concatenate([np.flatnonzero(hit), np.flatnonzero(~hit)])
        at = np.empty(uniq.size, np.int64)
        at[order] = np.arange(uniq.size)
        n_hit = int(hit.sum())
        with self.transfer.batch() as tb:
            stream = memory.current_stream()
            memory.wait_event(stream, self._last)  # sync-point: gpu-cache-after-last-batch
            out = tb.empty((uniq.size, self.dim), cache.rows.dtype)
            if n_hit:
                cache.read_hits(slots[hit], out[:n_hit])
            if fetched is not None:
                rows = fetched.wait()  # the source's copies, ordered before this stream's use of them
                out[n_hit:] = rows.to(cache.rows.dtype)
                cache.admit(miss, rows)
            index = torch.from_numpy(at[inverse.reshape(-1)]).to(out.device)
            x = tb.cast(torch.index_select(out, 0, index), dtype)
            self._last = memory.mark()
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
