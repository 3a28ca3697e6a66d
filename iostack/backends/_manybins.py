"""Several bins' rows read in one submission to an asynchronous engine: every SSD of a gather busy at once.

:meth:`PosixBackend.read_rows_many <iostack.backends.posix.PosixBackend.read_rows_many>`
hands its O_DIRECT items here. Each item is planned as :meth:`PosixBackend._read`
plans one bin (sorted, de-duplicated extents, coalesced reads); then the reads
of ALL items go to the engine in one call, each control block naming its own
file, interleaved in proportion to each item's share, so that the engine's
queue depth is shared by the files and each device has reads queued from the
start. A gather's time is then the busiest device's, not the sum of all of them
(the paper's mechanism: DDAK balances the devices' busy times).

Items whose rows are whole pages and whose ``out`` is page-aligned read into
``out`` itself (as ``_read_into``); the others go through the backend's one
staging buffer, cut into ``rounds``: every round holds the next equal slice of
every staged item's extents, laid out item after item, and is copied out when
the round completes. Bit-identical to reading the items one at a time: the same
bytes land at the same rows; only the order of the reads differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iostack.backends.base import BinHandle, Extents, coalesced_runs, sorted_extents
from iostack.bins import PAGE


@dataclass
class Item:
    """One bin's part of the call: its handle, validated rows, host ``out`` view and positions, and its plan."""

    handle: BinHandle
    fd: int
    rows: np.ndarray
    out: np.ndarray
    positions: np.ndarray | None
    ext: int  # bytes of one extent: a page (packed rows) or a whole row
    ex: Extents
    into_out: bool  # page-sized rows into a page-aligned out: no staging
    requests: int = 0


def plan_item(handle: BinHandle, fd: int, rows: np.ndarray, out: np.ndarray, positions: np.ndarray | None) -> Item:
    """The extents of one bin's rows, and whether they can land in ``out`` itself."""
    info = handle.info
    packed = info.rows_per_page > 1
    ext = PAGE if packed else info.row_stride_bytes
    ex = sorted_extents(rows // info.rows_per_page if packed else rows)
    into = (not packed and info.row_bytes == ext and out.flags.c_contiguous and out.ctypes.data % PAGE == 0)
    return Item(handle, fd, rows, out, positions, ext, ex, into)


def interleave(counts: list[int]) -> np.ndarray:
    """An order of ``sum(counts)`` reads (item after item in the input) that mixes the items in
    proportion to their counts from the first read to the last (by each read's fraction of its item).

    >>> interleave([4, 2]).tolist()
    [0, 4, 1, 2, 5, 3]
    """
    frac = np.concatenate([(np.arange(c) + 0.5) / c for c in counts if c] or [np.zeros(0)])
    return np.argsort(frac, kind="stable")


@dataclass
class Batch:
    """Reads of one engine call: file, offset and bytes, target address, and the item each belongs to."""

    fds: list[np.ndarray]
    offsets: list[np.ndarray]
    nbytes: list[np.ndarray]
    addrs: list[np.ndarray]

    @classmethod
    def empty(cls) -> Batch:
        return cls([], [], [], [])

    def add(self, it: Item, u: np.ndarray, base_addr: int, slots_of_first: np.ndarray | None, per_read: int,
            brk: np.ndarray) -> None:
        """Reads of extents ``u`` of ``it``, to ``base_addr`` + slot × extent (slots: ``0..`` in ``u``'s order,
        or ``slots_of_first[i]`` for the run starting at ``u[i]``)."""
        starts, lens = coalesced_runs(brk, u.size, per_read)
        slots = starts if slots_of_first is None else slots_of_first[starts]
        self.fds.append(np.full(starts.size, it.fd, np.int64))
        self.offsets.append(u[starts] * it.ext)
        self.nbytes.append(lens * it.ext)
        self.addrs.append(np.uint64(base_addr) + (slots * it.ext).astype(np.uint64))
        it.requests += int(starts.size)

    def run(self, engine) -> None:
        """All the reads in one engine call, interleaved across the items."""
        if not self.offsets:
            return
        order = interleave([a.size for a in self.offsets])
        fds = np.concatenate(self.fds)[order]
        engine.run(fds, np.concatenate(self.offsets)[order], np.concatenate(self.nbytes)[order],
                   np.concatenate(self.addrs)[order])


def read_into_reads(it: Item, reads: Batch, max_read_bytes: int) -> np.ndarray:
    """Queue ``it``'s reads straight into its ``out`` (whole page rows); the out row of each distinct row."""
    uniq = it.ex.uniq
    first = it.ex.order[it.ex.first]
    if it.positions is not None:
        first = it.positions[first]
    brk = np.flatnonzero((np.diff(uniq) != 1) | (np.diff(first) != 1)) + 1
    reads.add(it, uniq, it.out.ctypes.data, first, max(1, max_read_bytes // it.ext), brk)
    return first


def copy_duplicates(it: Item, first: np.ndarray) -> None:
    """Rows asked for more than once: copied from the out row the read landed in."""
    ex = it.ex
    if ex.uniq.size < ex.order.size:
        dup = np.ones(ex.order.size, np.bool_)
        dup[ex.first] = False
        d = ex.order[dup]
        it.out[d if it.positions is None else it.positions[d]] = it.out[first[ex.sinv[dup]]]


def copy_round(it: Item, stg: np.ndarray, lo: int, hi: int) -> None:
    """Copy the rows of ``it`` whose extents ``lo..hi-1`` (indices into ``uniq``) lie in staging ``stg``
    (``(hi - lo) * ext`` bytes, extent ``lo`` first) to their places in ``out``."""
    ex, info = it.ex, it.handle.info
    a, e = np.searchsorted(ex.sinv, [lo, hi])
    pos = ex.order[a:e]
    slot = ex.sinv[a:e] - lo
    dest = pos if it.positions is None else it.positions[pos]
    rb = info.row_bytes
    region = stg[:(hi - lo) * it.ext].reshape(hi - lo, it.ext)
    if info.rows_per_page > 1:
        k = info.rows_per_page
        src = region[:, :k * rb].reshape(hi - lo, k, rb)
        it.out[dest] = src[slot, it.rows[pos] % k]
    else:
        it.out[dest] = region[slot, :rb]


def read_many(items: list[Item], engine, staging: np.ndarray, max_read_bytes: int) -> bool:
    """Read every item's rows, all files' reads in flight together; False (nothing read) when the
    staged items' one extent each does not fit the staging buffer (the caller reads them one by one).

    Raises OSError from the engine (a failed read, or one at the end of a file).
    """
    staged = [it for it in items if not it.into_out]
    reserve = sum(it.ext for it in staged)
    if reserve >= staging.size and staged:
        return False
    total = sum(it.ex.uniq.size * it.ext for it in staged)
    rounds = max(1, -(-total // max(1, staging.size - reserve))) if staged else 1
    chunk = [-(-it.ex.uniq.size // rounds) for it in staged]
    base = np.concatenate([[0], np.cumsum([c * it.ext for c, it in zip(chunk, staged, strict=True)])]).tolist()
    firsts: dict[int, np.ndarray] = {}
    stg_addr = staging.ctypes.data
    for r in range(rounds):
        reads = Batch.empty()
        if r == 0:  # the reads into out go with the first round
            for i, it in enumerate(items):
                if it.into_out:
                    firsts[i] = read_into_reads(it, reads, max_read_bytes)
        spans = []
        for it, c, b in zip(staged, chunk, base[:-1], strict=True):
            lo, hi = min(r * c, it.ex.uniq.size), min((r + 1) * c, it.ex.uniq.size)
            spans.append((lo, hi))
            if hi > lo:
                u = it.ex.uniq[lo:hi]
                reads.add(it, u, stg_addr + b, None, max(1, max_read_bytes // it.ext),
                          np.flatnonzero(np.diff(u) != 1) + 1)
        reads.run(engine)
        for it, (lo, hi), b in zip(staged, spans, base[:-1], strict=True):
            if hi > lo:
                copy_round(it, staging[b:], lo, hi)
    for i, first in firsts.items():
        copy_duplicates(items[i], first)
    return True
