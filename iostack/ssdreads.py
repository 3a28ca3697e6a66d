"""The SSD tier: a placement's SSD bins read by a read backend.

:class:`SsdTier` serves SSD bins through a :class:`~iostack.backends.ReadBackend`
(one open :class:`~iostack.backends.base.BinHandle` per bin), counting what this
process read (requests, 4 KiB pages, distinct rows). Reading them together with
the node's ranks is :mod:`iostack.nodeshare`'s :class:`~iostack.nodeshare.NodeSharedSsdTier`,
which wraps one.
"""
from __future__ import annotations

import os
import time
from collections.abc import Collection, Sequence

import numpy as np
import torch

from iostack.backends.base import BinHandle, ReadBackend
from iostack.bins import PAGE, open_bin
from iostack.binstats import thread_wait_s
from iostack.binverify import BlockChecker, warn_unsummed
from iostack.errors import StoreError
from iostack.placement import Placement
from iostack.tiers import INTO_DEVICE, VIA_HOST, Tier
from iostack.transfer import Transfer


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
        self.read_many([(bin_id, rows, out, positions)])

    def read_many(self, groups: Sequence[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None]]) -> None:
        """Every group's blocks checked first, then all groups in one backend call (their SSDs read at
        the same time where the backend can, :meth:`~iostack.backends.base.ReadBackend.read_rows_many`);
        the call's time is shared among the bins by their read requests.

        Raises
        ------
        StoreError
            When a block does not match its checksum (no group is read), or a read fails.
        """
        if not groups:
            return
        t0, w0 = time.perf_counter(), thread_wait_s()
        for b, rows, _, _ in groups:
            self.check(b, rows.numpy())
        requests = self.backend.read_rows_many([(self.handles[b], rows, out, positions)
                                                for b, rows, out, positions in groups], transfer=self.transfer)
        seconds, wait = time.perf_counter() - t0, thread_wait_s() - w0
        share = np.asarray(requests, np.float64) / max(1, sum(requests)) if len(groups) > 1 else np.ones(1)
        for (b, rows, _, _), req, f in zip(groups, requests, share.tolist(), strict=True):
            info = self.handles[b].info
            distinct = np.unique(rows.numpy())
            c = rows.numel()
            self.counters[b].add(c, c * info.row_bytes, req, seconds * f, read_rows=int(distinct.size),
                                 pages=page_units(distinct, info.rows_per_page)
                                 * pages_per_unit(info.row_bytes, info.rows_per_page),
                                 cpu_wait_s=wait * f)

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
        for c in self.checkers.values():
            c.close()
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


def page_units(distinct_rows: np.ndarray, rows_per_page: int) -> int:
    """Distinct page extents of sorted, distinct ``distinct_rows`` (pages of packed rows; rows themselves
    when a row is a page or more). Sorted input: counted without a second sort.

    >>> page_units(np.array([0, 1, 5, 8, 9]), 4), page_units(np.array([0, 1, 5]), 1)
    (3, 3)
    """
    r = np.asarray(distinct_rows, np.int64)
    if r.size == 0 or rows_per_page <= 1:
        return int(r.size)
    return int(np.count_nonzero(np.diff(r // rows_per_page))) + 1


def pages_per_unit(row_bytes: int, rows_per_page: int) -> int:
    """4 KiB pages of one extent: 1 for packed rows, the row's pages otherwise."""
    return 1 if rows_per_page > 1 else -(-row_bytes // PAGE)


__all__ = ["SsdTier", "open_ssd_tier", "page_units", "pages_per_unit"]
