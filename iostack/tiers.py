"""The tiers a :class:`~iostack.store.FeatureStore` is composed of: each serves the rows of some bins.

A tier implements one small interface (:class:`Tier`): ``read(bin_id, rows,
out, positions)`` puts row ``rows[i]`` of bin ``bin_id`` into ``out[i]``, or
into ``out[positions[i]]`` when ``positions`` is given, and counts what it
served (a :class:`~iostack.binstats.Counter` per bin). The store is a router:
it groups a gather's ids by bin (the placement index) and hands each group to
the tier that serves the bin, the way DGL GraphBolt composes its features
(``GPUCachedFeature(fallback_feature, ...)``) but over a static placement.

What a tier says about itself decides only where the router asks it to write
(:attr:`Tier.lands`): rows already in device memory (:data:`ON_DEVICE`: ``rows``,
``positions`` and ``out`` are device tensors), rows read into host memory and
copied up with the batch's other host rows (:data:`VIA_HOST`: ``out`` a pinned
slice, ``positions`` None), or reads that land in device memory themselves
(:data:`INTO_DEVICE`: host ``rows`` and ``positions``, a device ``out``). A
gather to the host hands every tier host tensors and the host result.

Here: :class:`HostTier` (bins in host memory: the CPU cache, another GPU's
partition, a GPU bin where the device is the host) and :class:`DeviceTier`
(bins in this store's GPU memory). The SSD tier is in :mod:`iostack.ssdreads`, the
node-shared SSD tier in :mod:`iostack.nodeshare`; :mod:`iostack.caches` fills the cache tiers from
the feature matrix.

>>> t = HostTier({0: torch.arange(6.0).reshape(3, 2)})
>>> out = torch.zeros(2, 2)
>>> t.read(0, torch.tensor([2, 0]), out, None)
>>> out.tolist(), t.counters[0].rows
([[4.0, 5.0], [0.0, 1.0]], 2)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from iostack.binstats import Counter
from iostack.transfer import DeviceMemory

if TYPE_CHECKING:
    from iostack.hostshare import SharedHostTensor

#: :attr:`Tier.lands`: the tier's rows are in device memory; the router hands it device rows, positions and out
ON_DEVICE = "device"
#: the tier's rows come to host memory (a pinned slice of the batch's staging, copied up once)
VIA_HOST = "host"
#: the tier's reads land in device memory themselves (host rows and positions, a device out)
INTO_DEVICE = "direct"


class Tier:
    """The interface every tier implements; subclass it and implement :meth:`read`.

    ``bins``: the bin ids it serves (each bin of a store is served by exactly one
    tier). ``held``: where the rows are, as :class:`~iostack.binstats.BinStats`
    reports it (``device``, ``host``, ``file``). ``lands``: where the router asks
    it to write on a device gather (see the module docstring). ``counters``: a
    :class:`~iostack.binstats.Counter` per bin, which :meth:`read` adds to
    (rows served, bytes, read requests, seconds).

    The other methods have defaults: a tier with per-gather work (the node-shared
    reads) overrides :meth:`gathering` and sets ``per_gather``; one holding memory
    reports it in :meth:`held_bytes` and :meth:`buffer_bytes`.
    """

    held: str = "host"
    lands: str = VIA_HOST
    #: :meth:`gathering` is called on every gather (with the groups it serves, maybe none)
    per_gather: bool = False

    def __init__(self, bins: Iterable[int]) -> None:
        self.bins = tuple(sorted(int(b) for b in bins))
        self.counters: dict[int, Counter] = {b: Counter() for b in self.bins}

    def read(self, bin_id: int, rows: torch.Tensor, out: torch.Tensor, positions: torch.Tensor | None) -> None:
        """Rows ``rows`` (int64) of bin ``bin_id`` into ``out[i]``, or ``out[positions[i]]``; counted.

        ``out`` holds rows as the bins store them (``(n, dim)`` of the storage
        type); on a device gather, where it lives follows :attr:`lands`.
        """
        raise NotImplementedError

    def read_many(self, groups: Sequence[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None]]) -> None:
        """:meth:`read` of each ``(bin, rows, out, positions)`` group of one gather (their ``out`` rows do
        not overlap). Here one after another; the SSD tier reads its bins' groups all at once."""
        for b, rows, out, positions in groups:
            self.read(b, rows, out, positions)

    def gathering(self, groups: Sequence[tuple[int, torch.Tensor]]
                  ) -> contextlib.AbstractContextManager[Tier]:
        """The reader of one gather's ``(bin, rows)`` groups of this tier (called only with ``per_gather``):
        a context whose value's :meth:`read` serves them; it ends once the rows are in the gather's output."""
        return contextlib.nullcontext(self)

    def row_type(self) -> tuple[np.dtype, int] | None:
        """The stored rows' dtype and width, when the tier knows them (a store given no features asks)."""
        return None

    def held_bytes(self, bin_id: int) -> int:
        """Memory bin ``bin_id``'s rows take in this tier, bytes (0: none, e.g. a file)."""
        return 0

    def buffer_bytes(self) -> int:
        """Host memory the tier holds besides its rows (read buffers), bytes."""
        return 0

    def direct_io(self) -> dict[int, tuple[bool, str | None]]:
        """Per file bin: whether its reads bypass the page cache, and why not (files only)."""
        return {}

    def reset_counts(self) -> None:
        """Every bin's counts from zero (in place: a store composed from another shares the dict)."""
        self.counters.update({b: Counter() for b in self.bins})

    def unlink_shared(self) -> None:
        """Remove the names of node-shared memory this tier maps (see :mod:`iostack.hostshare`)."""

    def close(self) -> None:
        """Release what the tier holds (idempotent)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(bins {', '.join(map(str, self.bins))})"


class TensorTier(Tier):
    """A tier whose bins are tensors (``tensors[bin]``: row ``r`` of the bin is ``tensors[bin][r]``): what
    :class:`HostTier` and :class:`DeviceTier` share."""

    def __init__(self, tensors: dict[int, torch.Tensor]) -> None:
        super().__init__(tensors)
        self.tensors = dict(tensors)
        # bytes of one stored row per bin (a bin of zero rows too)
        self._row_bytes = {b: int(torch.Size(t.shape[1:]).numel()) * t.element_size() for b, t in self.tensors.items()}

    def held_bytes(self, bin_id: int) -> int:
        t = self.tensors.get(bin_id)
        return 0 if t is None else t.numel() * t.element_size()

    def row_type(self) -> tuple[np.dtype, int] | None:
        for t in self.tensors.values():
            if t.dim() == 2 and t.dtype != torch.bfloat16:  # numpy has no bfloat16 (a codec says its rows' type)
                return torch.empty(0, dtype=t.dtype).numpy().dtype, int(t.shape[1])
        return None

    def close(self) -> None:
        self.tensors.clear()


class HostTier(TensorTier):
    """Bins held as host tensors (``tensors[bin]``: row ``r`` of the bin is ``tensors[bin][r]``).

    ``held``: what :class:`~iostack.binstats.BinStats` says (``device`` for a
    GPU bin where the device is the host). ``memory``, ``pinned``: tensors this
    tier page-locked on ``memory`` (unpinned at :meth:`close`); ``segments``:
    the :class:`~iostack.hostshare.SharedHostTensor` s they live in (one copy
    per node), closed at :meth:`close`.
    """

    def __init__(self, tensors: dict[int, torch.Tensor], *, held: str = "host", memory: DeviceMemory | None = None,
                 pinned: Sequence[torch.Tensor] = (), segments: Sequence[SharedHostTensor] = ()) -> None:
        super().__init__(tensors)
        self.held = held
        self._memory, self._pinned, self.segments = memory, list(pinned), list(segments)

    def read(self, bin_id: int, rows: torch.Tensor, out: torch.Tensor, positions: torch.Tensor | None) -> None:
        t0 = time.perf_counter()
        t = self.tensors[bin_id]
        if positions is None:  # into pinned memory: index_select alone would return pageable
            torch.index_select(t, 0, rows, out=out)
        else:
            out[positions] = t.index_select(0, rows)
        c = rows.numel()
        self.counters[bin_id].add(c, c * self._row_bytes[bin_id], 1, time.perf_counter() - t0)

    def unlink_shared(self) -> None:
        for seg in self.segments:
            seg.unlink()

    def close(self) -> None:
        for t in self._pinned:  # unregistered before the memory goes away
            assert self._memory is not None
            self._memory.unpin(t)
        self._pinned.clear()
        super().close()
        for seg in self.segments:
            seg.close()
        self.segments.clear()


class DeviceTier(TensorTier):
    """Bins held in the GPU memory of ``memory`` (``tensors[bin]``); rows never leave the device on a device gather.

    Timed with device events (the work, not its launch): the counters get
    event pairs that the store resolves later, so a gather never waits to count.
    """

    held = "device"
    lands = ON_DEVICE

    def __init__(self, tensors: dict[int, torch.Tensor], memory: DeviceMemory) -> None:
        super().__init__(tensors)
        self.memory = memory

    def read(self, bin_id: int, rows: torch.Tensor, out: torch.Tensor, positions: torch.Tensor | None) -> None:
        t, mem, c = self.tensors[bin_id], self.memory, rows.numel()
        nbytes = c * self._row_bytes[bin_id]
        if mem.kind_of(out) == "device":  # a device gather: rows and positions are on the device too
            m0 = mem.mark()
            vals = t.index_select(0, rows)
            if positions is None:
                out.copy_(vals)
            else:
                out.index_copy_(0, positions, vals)
            self.counters[bin_id].add(c, nbytes, 1, None, (m0, mem.mark()))
            return
        t0 = time.perf_counter()  # gathered to the host: one copy down
        vals = t.index_select(0, rows.to(t.device)).cpu()
        if positions is None:
            out.copy_(vals)
        else:
            out[positions] = vals
        self.counters[bin_id].add(c, nbytes, 1, time.perf_counter() - t0)


def check_tiers(bin_ids: Sequence[int], tiers: Sequence[Tier]) -> dict[int, Tier]:
    """Each bin's tier (every bin of ``bin_ids`` served by exactly one of ``tiers``).

    Raises
    ------
    StoreError
        When a bin has no tier or two, or a tier serves a bin the placement does not have.
    """
    from iostack.errors import StoreError

    known = set(bin_ids)
    at: dict[int, Tier] = {}
    for t in tiers:
        for b in t.bins:
            if b not in known:
                raise StoreError(f"{t!r} serves bin {b}, which the placement does not have "
                                 f"(bins {', '.join(map(str, sorted(known)))})")
            if b in at:
                raise StoreError(f"bin {b} is served by two tiers, {at[b]!r} and {t!r}: compose each bin once")
            at[b] = t
    missing = sorted(known - set(at))
    if missing:
        raise StoreError(f"bin(s) {', '.join(map(str, missing))} are served by no tier: add one that serves them")
    return at


__all__ = ["INTO_DEVICE", "ON_DEVICE", "VIA_HOST", "DeviceTier", "HostTier", "TensorTier", "Tier", "check_tiers"]
