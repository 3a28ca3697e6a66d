"""The SSD tiers: a placement's SSD bins read by a read backend, privately or together with the node's ranks.

:class:`SsdTier` serves SSD bins through a :class:`~iostack.backends.ReadBackend`
(one open :class:`~iostack.backends.base.BinHandle` per bin), counting what this
process read (requests, 4 KiB pages, distinct rows). :class:`NodeSharedSsdTier`
wraps one: per gather, the node's ranks read the union of their SSD rows once
(:mod:`iostack.nodeshare`) and each copies its rows out of the shared buffer.
It is chosen when a store is composed (:func:`with_node_shared_reads`), for the
gathers every rank of the node makes in step (the training steps); the store it
was composed from still reads privately (evaluation).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Collection, Iterator, Sequence
from typing import Protocol

import numpy as np
import torch

from iostack.backends.base import BinHandle, ReadBackend
from iostack.bins import open_bin
from iostack.binverify import BlockChecker, warn_unsummed
from iostack.errors import StoreError
from iostack.nodeshare import NodeExchange, NodeSharedReads, SharedStep, page_units, pages_per_unit
from iostack.placement import Placement
from iostack.tiers import INTO_DEVICE, VIA_HOST, Tier
from iostack.transfer import Transfer


class Composed(Protocol):
    """What composing node-shared reads needs of a :class:`~iostack.store.FeatureStore` (kept apart: the store
    module imports this one)."""

    tiers: list[Tier]
    row_bytes: int

    def with_tiers(self, *tiers: Tier) -> Composed: ...


class SsdTier(Tier):
    """SSD bins read by ``backend``: ``handles[bin]`` is each bin's open file (see :func:`open_ssd_tier`);
    ``bins``: every bin it serves, when some (that no vertex uses) have no handle.

    ``transfer`` counts the copies of reads into device memory. Its rows land
    in host memory (:data:`~iostack.tiers.VIA_HOST`), or in device memory
    themselves when the backend reads there (``device_reads``, KvikIO).

    Every read is checked first: ``checkers[bin]`` verifies the bin's blocks the
    rows lie in the first time a read touches them (:mod:`iostack.binverify`); a
    bin placed before bins carried block sums has none (warned once).
    """

    held = "file"

    def __init__(self, backend: ReadBackend, handles: dict[int, BinHandle], *, bins: Sequence[int] | None = None,
                 transfer: Transfer | None = None) -> None:
        super().__init__(handles if bins is None else bins)
        self.backend, self.handles, self.transfer = backend, dict(handles), transfer
        self.closed = False
        self.lands = INTO_DEVICE if backend.device_reads else VIA_HOST
        self.checkers: dict[int, BlockChecker] = {}
        for b, h in self.handles.items():
            if h.info.block_sums is None:
                warn_unsummed(h.info)
            else:
                self.checkers[b] = BlockChecker(h.info)

    def check(self, bin_id: int, rows: np.ndarray) -> None:
        """Verify the blocks of bin ``bin_id`` that ``rows`` lie in that no read has yet (:mod:`iostack.binverify`).

        Raises
        ------
        StoreError
            When a block does not match its checksum: the rows are not read.
        """
        checker = self.checkers.get(bin_id)
        if checker is not None:
            checker.check_rows(rows)

    def read_checked(self, bin_id: int, rows: np.ndarray, out: np.ndarray) -> int:
        """Rows ``rows`` of bin ``bin_id`` into host ``out`` once their blocks check out; the read requests made.

        Raises
        ------
        StoreError
            When a block does not match its checksum.
        """
        self.check(bin_id, rows)
        return self.backend.read_rows(self.handles[bin_id], rows, out)

    def read(self, bin_id: int, rows: torch.Tensor, out: torch.Tensor, positions: torch.Tensor | None) -> None:
        t0 = time.perf_counter()
        info = self.handles[bin_id].info
        self.check(bin_id, rows.numpy())
        requests = self.backend.read_rows(self.handles[bin_id], rows, out, positions, transfer=self.transfer)
        distinct = np.unique(rows.numpy())
        c = rows.numel()
        self.counters[bin_id].add(c, c * info.row_bytes, requests, time.perf_counter() - t0,
                                  read_rows=int(distinct.size),
                                  pages=page_units(distinct, info.rows_per_page)
                                  * pages_per_unit(info.row_bytes, info.rows_per_page))

    def buffer_bytes(self) -> int:
        return 0 if self.closed else self.backend.buffer_bytes

    def row_type(self) -> tuple[np.dtype, int] | None:
        info = next((h.info for h in self.handles.values()), None)
        return None if info is None else (np.dtype(info.dtype), int(info.dim))

    def direct_io(self) -> dict[int, tuple[bool, str | None]]:
        return {i: (h.direct, h.note) for i, h in self.handles.items()}

    def sharing_blocked(self) -> str | None:
        """Why these bins' reads cannot be shared with a node's ranks (None: they can)."""
        if not self.handles:
            return "no SSD bin to read"
        if self.backend.device_reads:
            return f"the {self.backend.name} backend reads into device memory, not a node-shared host buffer"
        return None

    def __repr__(self) -> str:
        return f"SsdTier({'closed' if self.closed else self.backend.name}, bins {', '.join(map(str, self.bins))})"

    def close(self) -> None:
        if self.closed:
            return
        for h in self.handles.values():
            self.backend.close_handle(h)
        self.backend.close()
        self.handles.clear()
        self.closed = True


def open_ssd_tier(placement: Placement, bin_dir: str | os.PathLike[str] | None, backend: ReadBackend, *,
                  dtype: np.dtype | None, dim: int | None, full_check: bool = False, transfer: Transfer | None = None,
                  notes: list[str] | None = None, skip: Collection[int] = ()) -> tuple[SsdTier, np.dtype, int]:
    """The tier of ``placement``'s SSD bins in ``bin_dir``, read by ``backend`` (a built
    :class:`~iostack.backends.ReadBackend`), and the rows' dtype and width the bin files say.

    ``dtype``/``dim``: what the rows must be (None: whatever the first bin
    holds). A bin no vertex uses gets no handle (so no buffered-read worker
    processes start for it). ``notes`` hears how each bin is read; bins in ``skip`` are left out.

    Raises
    ------
    StoreError
        Without ``bin_dir``, or when a bin file is missing or does not fit its bin (from
        :func:`~iostack.bins.open_bin`).
    """
    if bin_dir is None:
        raise StoreError("the placement has SSD bins: pass bin_dir, the directory of the bin files")
    handles: dict[int, BinHandle] = {}
    bins = [b for b in placement.bins if b.kind == "ssd" and b.id not in skip]
    try:
        for b in bins:
            used = placement.row_of[placement.bin_of == b.id]
            info = open_bin(bin_dir, b, dtype=dtype, dim=dim, full_check=full_check,
                            min_rows=int(used.max()) + 1 if used.size else 0)
            dtype, dim = np.dtype(info.dtype), info.dim
            if not used.size:
                # nothing to read (a hot-first placement leaves all but one SSD bin empty): no handle, so
                # no buffered-read worker processes started for it in the memory the caches could use
                continue
            h = handles[b.id] = backend.open(info)
            if notes is not None and h.note:
                notes.append(f"SSD bin {b.id}: {h.note}")
    except BaseException:
        for h in handles.values():
            backend.close_handle(h)
        raise
    assert dtype is not None and dim is not None
    return SsdTier(backend, handles, bins=[b.id for b in bins], transfer=transfer), dtype, dim


class NodeSharedSsdTier(Tier):
    """``inner``'s bins, read once per gather by the node's ranks together (``shared``, see :mod:`iostack.nodeshare`).

    Every rank of the node must make the same number of gathers through it, in
    step order. Counts go to ``inner``'s counters: rows served here, and this
    rank's part of the node's reads (requests, pages, distinct rows).
    """

    held = "file"
    lands = VIA_HOST
    per_gather = True

    def __init__(self, inner: SsdTier, shared: NodeSharedReads) -> None:
        self.bins, self.counters = inner.bins, inner.counters  # one set of figures, whichever way read
        self.inner, self.shared = inner, shared

    @contextlib.contextmanager
    def gathering(self, groups: Sequence[tuple[int, torch.Tensor]]) -> Iterator[Tier]:
        """This gather's reader: a copy out of the step's shared buffer (released when the block ends), or
        ``inner`` where the node fell back to private reads."""
        inner = self.inner
        st = self.shared.step([(b, r.numpy()) for b, r in groups],
                              inner.read_checked)
        if st is None:
            yield inner
            return
        try:
            for x in st.reads:
                info = inner.handles[x.bin_id].info
                self.counters[x.bin_id].add_disk(x.requests, x.units * pages_per_unit(info.row_bytes,
                                                                                      info.rows_per_page),
                                                 x.rows, x.seconds)
            yield _SharedCopy(self, st)
        finally:
            st.release()

    def read(self, bin_id: int, rows: torch.Tensor, out: torch.Tensor, positions: torch.Tensor | None) -> None:
        """Not served alone: a gather reads through :meth:`gathering`'s reader.

        Raises
        ------
        StoreError
            Always (the reads of a node-shared step are made for the whole gather at once).
        """
        raise StoreError("node-shared SSD reads are made per gather: read through gathering(groups)")

    def buffer_bytes(self) -> int:
        return self.shared.buffer_bytes()

    def direct_io(self) -> dict[int, tuple[bool, str | None]]:
        return self.inner.direct_io()

    def close(self) -> None:
        self.shared.close()


class _SharedCopy(Tier):
    """One gather's reads out of its node-shared step buffer."""

    def __init__(self, tier: NodeSharedSsdTier, step: SharedStep) -> None:
        self.bins, self.counters, self._row_bytes, self._step = tier.bins, tier.counters, tier.shared.row_bytes, step

    def read(self, bin_id: int, rows: torch.Tensor, out: torch.Tensor, positions: torch.Tensor | None) -> None:
        t0 = time.perf_counter()
        c = rows.numel()
        self._step.copy_into(bin_id, rows.numpy(), out.view(torch.uint8).numpy(),
                             None if positions is None else positions.numpy())
        self.counters[bin_id].add(c, c * self._row_bytes, 0, time.perf_counter() - t0)


def node_shared_reads_blocked(store: Composed) -> str | None:
    """Why ``store``'s SSD reads cannot be shared with a node's ranks (None: they can)."""
    ssd = [t for t in store.tiers if isinstance(t, SsdTier)]
    return ssd[0].sharing_blocked() if ssd else "no SSD bin to read"


def with_node_shared_reads(store: Composed, exchange: NodeExchange, key: str, *,
                           directory: str | os.PathLike[str] | None = None) -> Composed:
    """``store`` composed with its SSD tier read together with the node's ranks (:class:`NodeSharedSsdTier`).

    The returned store shares every tier with ``store`` (closing either closes
    both); gather through it what every rank of ``exchange`` gathers in step,
    from one thread at a time per step order (see :mod:`iostack.nodeshare`), and
    through ``store`` what only this rank gathers. ``key`` names this job's
    shared buffers (the same on the node's ranks, unique to the job).

    Raises
    ------
    StoreError
        When the reads cannot be shared (:func:`node_shared_reads_blocked` says why).
    """
    blocked = node_shared_reads_blocked(store)
    if blocked is not None:
        raise StoreError(f"node-shared SSD reads: {blocked}")
    ssd = next(t for t in store.tiers if isinstance(t, SsdTier))
    shared = NodeSharedReads(exchange, key, store.row_bytes,
                             {b: h.info.rows_per_page for b, h in ssd.handles.items()}, directory=directory)
    return store.with_tiers(NodeSharedSsdTier(ssd, shared))


__all__ = ["NodeSharedSsdTier", "SsdTier", "node_shared_reads_blocked", "open_ssd_tier", "with_node_shared_reads"]
