"""Node-shared SSD reads: the ranks of one node read each SSD page of a training step once, for all of them.

Data-parallel ranks on one node each gather their own part of the global
batch. Read privately, the pages their parts share are read twice, and each
part's pages are sparser, so fewer of them merge into one request (the design
notes, "Two trainers on one disk"). With node-shared reads, per training step:

1. every rank hands its SSD row ids ``(bin, row)`` to :meth:`NodeExchange.exchange`
   and gets every rank's back;
2. every rank computes the same union (sorted, de-duplicated) and the same
   split of it (:func:`plan_share`): per bin, the distinct *pages* of the union
   cut into contiguous parts, part ``i`` to rank ``i``, so a page is read by one
   rank and each rank's reads stay coalesced;
3. each rank reads its part into a node-shared host buffer (a
   :mod:`iostack.hostshare` segment), row ``i`` of the buffer holding union
   entry ``i``;
4. :meth:`NodeExchange.barrier`;
5. each rank copies the rows its gather needs from the buffer into its output.

The buffers alternate by step parity. A rank may gather on more than one
thread (a pipelined prefetch: one batch's gather waits on the node while the
next is sampled and assembled): steps then run one at a time in the order the
threads arrive (each rank pairs its own n-th step with the others' n-th; each
rank still copies exactly its rows out of the union), and a step waits, before
it joins the exchange, until this rank has released (copied out of) the step
two before it, which used the same buffer. As the exchange completes only once
every rank has joined it, no rank reads a step into a buffer that another rank
is still copying from.

Everything unexpected falls back to private reads on *every* rank of the node
at once, never to a rank waiting alone: the exchange carries each rank's
sequence number (a mismatch: every rank sees it and stops sharing), and the
barrier carries each rank's "my part is in the buffer" (a rank without room
for the buffer, or whose read failed: every rank reads its own rows again,
and stops sharing). The node-exchange itself (which ranks, which transport)
is the caller's (:class:`NodeExchange`); ``training`` implements it with
``torch.distributed`` on a gloo group of the node's ranks.

In the store, :class:`NodeSharedSsdTier` wraps the SSD tier
(:class:`iostack.ssdreads.SsdTier`): per gather, the node's ranks read the union
of their SSD rows once and each copies its rows out of the shared buffer. It is
chosen when a store is composed (:func:`with_node_shared_reads`), for the gathers
every rank of the node makes in step (the training steps); the store it was
composed from still reads privately (evaluation).

>>> import numpy as np
>>> rank0 = encode_keys([(3, np.array([9, 1, 1]))])
>>> rank1 = encode_keys([(3, np.array([2, 9])), (5, np.array([0]))])
>>> p = plan_share([rank0, rank1], rank=0, size=2, rows_per_page={3: 1, 5: 1})
>>> p.rows.tolist(), p.bins.tolist(), p.mine
([1, 2, 9, 0], [3, 3, 3, 5], ((3, 0, 1),))
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from iostack.errors import StoreError
from iostack.hostshare import SharedHostTensor, shared_host_tensor
from iostack.ssdreads import SsdTier, pages_per_unit
from iostack.tiers import VIA_HOST, Tier

#: a key is ``bin << ROW_BITS | row``: rows below 2**40, bins below 2**23
ROW_BITS = 40
_ROW_MASK = (1 << ROW_BITS) - 1

#: the smallest shared buffer, rows (buffers grow to the next power of two a step needs)
MIN_BUFFER_ROWS = 1024


@runtime_checkable
class NodeExchange(Protocol):
    """The ranks of one node, as the store's node-shared reads need them.

    ``rank``: this process's index among them (``0..size-1``); ``size``: how
    many. Both methods are collective: every rank of the node calls them, in
    the same order, from one thread each.
    """

    rank: int
    size: int

    def exchange(self, keys: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``keys`` (1-D int64, any length), in rank order."""
        ...

    def barrier(self, ok: bool = True) -> bool:
        """Wait for every rank; whether every rank passed ``ok=True``."""
        ...


def encode_keys(groups: Sequence[tuple[int, np.ndarray]]) -> np.ndarray:
    """Sorted, distinct int64 keys ``bin << ROW_BITS | row`` of ``(bin, rows)`` pairs."""
    parts = []
    for b, rows in groups:
        r = np.asarray(rows, np.int64)
        if r.size and (r.min() < 0 or r.max() > _ROW_MASK):
            raise ValueError(f"bin {b}: rows must lie in 0..2**{ROW_BITS}-1")
        parts.append(np.int64(b) << ROW_BITS | r)
    if not parts:
        return np.zeros(0, np.int64)
    return np.unique(np.concatenate(parts))


@dataclass(frozen=True)
class SharePlan:
    """One step's union of every rank's SSD rows and this rank's part of it.

    ``keys``, ``bins``, ``rows``: the union, sorted by (bin, row); buffer row
    ``i`` holds union entry ``i``. ``mine``: ``(bin, lo, hi)`` per bin this rank
    reads, union entries ``lo..hi-1``. ``units_read``: per bin in ``mine``,
    the distinct page extents (a page of packed rows, or one whole-page row)
    of this rank's part.
    """

    keys: np.ndarray
    bins: np.ndarray
    rows: np.ndarray
    mine: tuple[tuple[int, int, int], ...]
    units_read: tuple[int, ...] = ()

    def positions(self, b: int, rows: np.ndarray) -> np.ndarray:
        """Buffer rows of ``rows`` of bin ``b`` (each must be in the union)."""
        return np.searchsorted(self.keys, np.int64(b) << ROW_BITS | np.asarray(rows, np.int64))


def plan_share(all_keys: Sequence[np.ndarray], rank: int, size: int, rows_per_page: dict[int, int]) -> SharePlan:
    """The union of ``all_keys`` (one array per rank) and rank ``rank``'s part of it, the same on every rank.

    Per bin, the union's distinct page extents (``row // rows_per_page[bin]``)
    are cut into ``size`` contiguous runs of equal count; rank ``i`` reads the
    rows of run ``i``. A page is therefore read by one rank only, and each
    rank's rows stay as contiguous as the union's.
    """
    keys = np.unique(np.concatenate([np.asarray(k, np.int64) for k in all_keys])) if all_keys else \
        np.zeros(0, np.int64)
    bins, rows = keys >> ROW_BITS, keys & _ROW_MASK
    mine, units_read = [], []
    if keys.size:
        cuts = np.flatnonzero(bins[1:] != bins[:-1]) + 1
        for a, e in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [keys.size]]).tolist(),
                        strict=True):
            b = int(bins[a])
            unit = rows[a:e] // max(1, int(rows_per_page.get(b, 1)))
            first = np.flatnonzero(np.concatenate([[True], unit[1:] != unit[:-1]]))  # each extent's first row
            n = first.size
            u0, u1 = rank * n // size, (rank + 1) * n // size
            if u1 > u0:
                lo = a + int(first[u0])
                hi = a + (int(first[u1]) if u1 < n else e - a)
                mine.append((b, lo, hi))
                units_read.append(u1 - u0)
    return SharePlan(keys, bins, rows, tuple(mine), tuple(units_read))


@dataclass(frozen=True)
class ShareRead:
    """What this rank read for one shared step, per bin: requests, page extents, rows, seconds."""

    bin_id: int
    requests: int
    units: int
    rows: int
    seconds: float


@dataclass
class SharedStep:
    """A step's shared buffer (uint8 rows, union order), its plan, and what this rank read into it."""

    buffer: np.ndarray
    plan: SharePlan
    reads: list[ShareRead]
    #: called once this rank has copied its rows out (the buffer may then take a later step's rows)
    on_release: Callable[[], None] | None = None

    def release(self) -> None:
        """This rank is done with the buffer (idempotent)."""
        f, self.on_release = self.on_release, None
        if f is not None:
            f()

    def copy_into(self, b: int, rows: np.ndarray, out: np.ndarray, positions: np.ndarray | None) -> None:
        """Rows ``rows`` of bin ``b`` from the buffer to ``out[i]`` (or ``out[positions[i]]``)."""
        at = self.plan.positions(b, rows)
        if positions is None:
            np.take(self.buffer, at, axis=0, out=out)
        else:
            out[positions] = self.buffer[at]


#: ``read(bin, rows, out) -> requests``: the store's backend read of sorted distinct rows into ``out`` (in order)
Reader = Callable[[int, np.ndarray, np.ndarray], int]


class NodeSharedReads:
    """The node-shared SSD reads of one store (see the module docstring).

    ``exchange``: the node's ranks. ``key``: a name for this job's buffers,
    the same on every rank of the node and unique to the job (letters,
    digits, ``_.-``). ``row_bytes``: a stored row's size. ``rows_per_page``:
    per SSD bin, rows per page (1 for rows of a page or more). ``directory``:
    where the buffers go (default :data:`iostack.hostshare.SHM_DIR`).

    After a fallback (:attr:`off`, with the reason) :meth:`step` returns None
    for good and makes no more collective calls, on every rank alike.
    """

    def __init__(self, exchange: NodeExchange, key: str, row_bytes: int, rows_per_page: dict[int, int], *,
                 directory: str | os.PathLike[str] | None = None) -> None:
        if exchange.size < 2 or not 0 <= exchange.rank < exchange.size:
            raise ValueError(f"node-shared reads need a rank in 0..size-1 of at least 2 ranks, got rank "
                             f"{exchange.rank} of {exchange.size}")
        self.exchange, self.key, self.row_bytes = exchange, key, int(row_bytes)
        self.rows_per_page = dict(rows_per_page)
        self.directory = directory
        self.off: str | None = None
        self.steps = 0
        self.wait_s = 0.0  # at the barrier: the other ranks' reads not yet done
        self.exchange_s = 0.0
        self._segs: list[SharedHostTensor | None] = [None, None]
        self._lock = threading.Lock()
        # a buffer is held from its step until this rank copied that step's rows out, which with more
        # than one gathering thread may come after the next step began (see step())
        self._busy: list[tuple[int, int] | None] = [None, None]  # (thread, step) holding each buffer
        self._free = threading.Condition()
        self._waited = threading.local()

    def _buffer(self, parity: int, rows: int) -> tuple[np.ndarray | None, SharedHostTensor | None]:
        """The parity's buffer with room for ``rows`` (a new segment when it grows; None: no room)."""
        seg = self._segs[parity]
        if seg is not None and seg.tensor.shape[0] >= rows:
            return seg.tensor.numpy(), None
        if seg is not None:
            seg.close()
            self._segs[parity] = None
        cap = max(MIN_BUFFER_ROWS, 1 << (rows - 1).bit_length())  # every rank picks the same size
        seg = shared_host_tensor(f"{self.key}-p{parity}-{cap}x{self.row_bytes}", (cap, self.row_bytes),
                                 torch.uint8, lambda t: None, directory=self.directory)
        if seg is None:
            return None, None
        self._segs[parity] = seg
        return seg.tensor.numpy(), seg

    def step(self, groups: Sequence[tuple[int, np.ndarray]], read: Reader) -> SharedStep | None:
        """Share one training step's SSD reads: ``groups`` are this rank's ``(bin, rows)`` (any order,
        duplicates fine); ``read`` reads this rank's part. None: read privately (:attr:`off` says why).

        The caller copies its rows out of the returned step's buffer, then calls
        :meth:`SharedStep.release`. Several threads may call this (a pipelined
        prefetch): steps then run one at a time, numbered in the order they get
        here, and a step waits for this rank's release of the step two before
        it (the same buffer) before it joins the exchange, so that no rank
        reads into a buffer another rank is still copying from.

        Raises what ``read`` raised (after the barrier: the other ranks fall back, not wait).
        """
        self._waited.s = 0.0
        with self._lock:
            if self.off is not None:
                return None
            seq = self.steps
            self.steps += 1
            parity = seq % 2
            me = threading.get_ident()
            with self._free:
                # a thread that calls again is done with its older steps (it runs one at a time)
                while self._busy[parity] is not None and self._busy[parity][0] != me:
                    self._free.wait()
                self._busy[parity] = (me, seq)
            try:
                st = self._step(seq, groups, read)
            except BaseException:
                self._release(parity, seq)
                raise
            if st is None:
                self._release(parity, seq)
            else:
                st.on_release = lambda: self._release(parity, seq)
            return st

    @property
    def last_wait_s(self) -> float:
        """Seconds the calling thread's latest :meth:`step` waited at the barrier (0 before any)."""
        return getattr(self._waited, "s", 0.0)

    def _release(self, parity: int, seq: int) -> None:
        with self._free:
            if self._busy[parity] is not None and self._busy[parity][1] == seq:
                self._busy[parity] = None
            self._free.notify_all()

    def _step(self, seq: int, groups: Sequence[tuple[int, np.ndarray]], read: Reader) -> SharedStep | None:
        t0 = time.perf_counter()
        mine = encode_keys(groups)
        try:
            got = self.exchange.exchange(np.concatenate([[seq], mine]).astype(np.int64))
        except BaseException:
            self.off = "the exchange with the node's other ranks failed"
            raise
        self.exchange_s += time.perf_counter() - t0
        seqs = {int(k[0]) if k.size else -1 for k in got}
        if len(got) != self.exchange.size or seqs != {seq}:
            self.off = (f"the node's ranks disagree on the step (sequence numbers {sorted(seqs)}): "
                        "private reads from here on")
            return None
        plan = plan_share([k[1:] for k in got], self.exchange.rank, self.exchange.size, self.rows_per_page)
        if plan.keys.size == 0:  # no rank reads the SSDs this step: every rank knows, none waits
            return SharedStep(np.zeros((0, self.row_bytes), np.uint8), plan, [])
        return self._read_and_wait(seq, plan, read)

    def _read_and_wait(self, seq: int, plan: SharePlan, read: Reader) -> SharedStep | None:
        buf, fresh = self._buffer(seq % 2, plan.keys.size)
        reads: list[ShareRead] = []
        error: BaseException | None = None
        if buf is not None:
            try:
                for (b, lo, hi), units in zip(plan.mine, plan.units_read, strict=True):
                    t0 = time.perf_counter()
                    requests = read(b, plan.rows[lo:hi], buf[lo:hi])
                    reads.append(ShareRead(b, int(requests), units, hi - lo, time.perf_counter() - t0))
            except BaseException as exc:  # the others must not wait for a part that never comes
                error = exc
        t0 = time.perf_counter()
        try:
            ok = self.exchange.barrier(buf is not None and error is None)
        except BaseException:
            self.off = "the barrier with the node's other ranks failed"
            raise
        waited = time.perf_counter() - t0
        self.wait_s += waited
        self._waited.s = waited
        if fresh is not None:  # every rank has mapped it now (it read its part before the barrier)
            fresh.unlink()
        if error is not None:
            self.off = f"a read of this rank's part failed ({error}): private reads from here on"
            raise error
        if not ok:
            self.off = ("a rank of the node had no room for the shared buffer in /dev/shm, or its read failed: "
                        "private reads from here on")
            return None
        return SharedStep(buf, plan, reads)

    def buffer_bytes(self) -> int:
        """Host memory of the shared buffers this process maps, bytes."""
        return sum(s.tensor.numel() for s in self._segs if s is not None)

    def close(self) -> None:
        for i, s in enumerate(self._segs):
            if s is not None:
                s.close()
            self._segs[i] = None


class Composed(Protocol):
    """What composing node-shared reads needs of a :class:`~iostack.store.FeatureStore` (kept apart: the store
    module imports this one)."""

    tiers: list[Tier]
    row_bytes: int

    def with_tiers(self, *tiers: Tier) -> Composed: ...


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


__all__ = ["MIN_BUFFER_ROWS", "ROW_BITS", "Composed", "NodeExchange", "NodeSharedReads", "NodeSharedSsdTier",
           "ShareRead", "SharePlan", "SharedStep", "encode_keys", "node_shared_reads_blocked", "plan_share",
           "with_node_shared_reads"]
