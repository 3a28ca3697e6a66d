"""The SSD part of a :class:`~iostack.store.FeatureStore`'s gather: private reads, or node-shared ones.

:class:`SsdReads` is a part of the store (its base class), apart only to keep
the store's module short: reading one bin's rows of a gather into the result,
from the backend or from a step's node-shared buffer (:mod:`iostack.nodeshare`),
and counting what this process read (requests, pages, distinct rows).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from iostack.nodeshare import NodeExchange, NodeSharedReads, SharedStep, page_units, pages_per_unit


class SsdReads:
    """The store's SSD reads; uses the store's ``backend``, ``_handles``, ``_counters`` and ``row_bytes``."""

    backend: Any
    row_bytes: int
    _handles: dict[int, Any]
    _counters: dict[int, Any]
    _node_reads: NodeSharedReads | None

    def enable_node_shared_reads(self, exchange: NodeExchange, key: str, *,
                                 directory: str | os.PathLike[str] | None = None) -> str | None:
        """Read the SSD rows of ``gather(..., node_shared=True)`` calls together with the node's other ranks.

        See :mod:`iostack.nodeshare`: every rank of ``exchange`` must make the
        same number of such gathers, in step order, from one thread. ``key``
        names this job's shared buffers (the same on the node's ranks, unique
        to the job). Returns None when enabled, else why not (nothing changes).
        """
        blocked = self.node_shared_reads_blocked()
        if blocked is not None:
            return blocked
        self._node_reads = NodeSharedReads(exchange, key, self.row_bytes,
                                           {b: h.info.rows_per_page for b, h in self._handles.items()},
                                           directory=directory)
        return None

    def node_shared_reads_blocked(self) -> str | None:
        """Why this store cannot share its SSD reads with a node (None: it can)."""
        if not self._handles:
            return "no SSD bin to read"
        if self.backend.device_reads:
            return f"the {self.backend.name} backend reads into device memory, not a node-shared host buffer"
        return None

    @property
    def node_shared_reads(self) -> NodeSharedReads | None:
        """The node-shared reads when enabled (their ``off`` says if they fell back, ``wait_s`` the waits)."""
        return self._node_reads

    def _shared_step(self, groups: list) -> SharedStep | None:
        """This step's SSD rows read together with the node's ranks, counted as this rank's reads; None:
        read privately."""
        if self._node_reads is None:
            return None
        ssd = [(b, r.numpy()) for b, _, r in groups if b in self._handles]
        st = self._node_reads.step(ssd, lambda b, rows, out: self.backend.read_rows(self._handles[b], rows, out))
        for x in st.reads if st is not None else ():
            info = self._handles[x.bin_id].info
            self._counters[x.bin_id].add_disk(x.requests, x.units * pages_per_unit(info.row_bytes, info.rows_per_page),
                                              x.rows, x.seconds)
        return st

    @contextlib.contextmanager
    def _shared_reads(self, groups: list, node_shared: bool) -> Iterator[SharedStep | None]:
        """:meth:`_shared_step` when ``node_shared``; its buffer released when the block ends (rows copied out)."""
        shared = self._shared_step(groups) if node_shared else None
        try:
            yield shared
        finally:
            if shared is not None:
                shared.release()

    def _read_ssd(self, b: int, pos: torch.Tensor | None, r: torch.Tensor, out, shared: SharedStep | None) -> None:
        """Bin ``b``'s rows ``r`` into ``out`` (at ``pos``), from the step's shared buffer or read here; counted."""
        t0 = time.perf_counter()
        c, rows = r.numel(), r.numpy()
        if shared is not None:
            dst = out if isinstance(out, np.ndarray) else out.view(torch.uint8).numpy()
            shared.copy_into(b, rows, dst, None if pos is None else pos.numpy())
            self._counters[b].add(c, c * self.row_bytes, 0, time.perf_counter() - t0)
            return
        requests = self.backend.read_rows(self._handles[b], r, out, pos)
        info = self._handles[b].info
        distinct = np.unique(rows)
        self._counters[b].add(c, c * self.row_bytes, requests, time.perf_counter() - t0, read_rows=int(distinct.size),
                              pages=page_units(distinct, info.rows_per_page)
                              * pages_per_unit(info.row_bytes, info.rows_per_page))


__all__ = ["SsdReads"]
