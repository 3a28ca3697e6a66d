"""Feature rows of a partitioned job in the partition's new ids: this rank's rows at home, the rest exchanged.

Rank ``r`` holds partition ``r``'s rows (``part-r/features.npy``: new ids
``[node_offsets[r], node_offsets[r + 1])``, read into host memory once) and
nothing else of the feature matrix. A batch's rows of other partitions come
from their owners through the job's feature exchange
(:class:`~training.sharded.exchange.AllToAllExchange`: counts, ids, rows in
three ``all_to_all_single`` calls on a gloo group of its own, on the prefetch
thread), each owner answering from its rows. The owner of a new id is its
partition, found by a binary search of the node offsets: no per-vertex map.

Every rank calls :meth:`PartitionFeatures.gather_landing` once per batch, in
the same order (the exchange is a collective; a batch with nothing remote still
joins it): the partitioned batch source gives every rank the same number of
training steps, and evaluation the same number of batches
(:meth:`training.partition.rank.RankView.eval_steps`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from iostack.rowbuffers import RowBuffers
from iostack.transfer import Gathered, Transfer
from training.partition import PartitionError
from training.sharded.exchange import PeerLostError, RowExchange
from training.sharded.features import summed_since

__all__ = ["PartitionFeatures", "open_partition_features"]


class PartitionFeatures:
    """A :class:`training.features.FeatureSource` over new ids: ``rows`` of this rank's range, the rest exchanged.

    Args:
        rows: ``[hi - lo, dim]`` this partition's rows (copied into host memory).
        node_offsets: the partitions' new-id ranges (``parts + 1`` entries); partition ``k``
            lives on rank ``k`` of the exchange.
        rank: this rank's partition.
        exchange: made by ``make_exchange(serve, dim, dtype)`` (the caller's: loopback for one
            rank, all-to-all for several), serving :meth:`serve`.
        transfer: how the rows reach the training device.
        all_reduce: a sum over the ranks (the main thread's group), for :meth:`epoch_record`.
    """

    def __init__(self, rows: np.ndarray, node_offsets: Sequence[int], rank: int,
                 make_exchange: Callable[[Callable[[Tensor], Tensor], int, torch.dtype], RowExchange], *,
                 transfer: Transfer | None = None, all_reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        self._x = torch.from_numpy(np.array(rows))  # a copy: the memory map's pages read once
        self.offsets = tuple(int(x) for x in node_offsets)
        self.rank = int(rank)
        self.lo, self.hi = self.offsets[rank], self.offsets[rank + 1]
        if self._x.dim() != 2 or self._x.shape[0] != self.hi - self.lo:
            raise PartitionError(f"rows: partition {rank} owns {self.hi - self.lo} vertices, got "
                                 f"{tuple(self._x.shape)}")
        self.transfer = transfer if transfer is not None else Transfer()
        self.dim, self.dtype = int(self._x.shape[1]), self._x.dtype
        self.row_bytes = self.dim * self._x.element_size()
        self.feature_dtype = str(rows.dtype)
        self._bounds = torch.tensor(self.offsets[1:-1], dtype=torch.int64)
        self._out = RowBuffers(self.dim, self.dtype)
        self._all_reduce = all_reduce
        self._c = {"local": 0, "remote": 0}
        self._mark: dict[str, float] = {}
        self.exchange = make_exchange(self.serve, self.dim, self.dtype)
        self.notes = [f"partition {rank}: {self.hi - self.lo:,} of {self.offsets[-1]:,} rows at home, the rest "
                      f"through the {self.exchange.name} exchange"]

    def serve(self, ids: Tensor) -> Tensor:
        """This partition's rows of ``ids`` (new ids a peer asked for).

        Raises
        ------
        PartitionError
            An id outside this partition's range (the ranks disagree on the partitioning).
        """
        ids = ids.to(torch.int64)
        if ids.numel() and (int(ids.min()) < self.lo or int(ids.max()) >= self.hi):
            raise PartitionError(f"a peer asked partition {self.rank} for rows outside [{self.lo}, {self.hi}): the "
                                 "ranks were started on different partitionings")
        return self._x.index_select(0, ids - self.lo)

    def fetch_remote(self, rid: Tensor) -> Tensor:
        """Rows of ``rid`` (new ids of other partitions) from their owners, in order: one exchange (collective).

        Raises
        ------
        PeerLostError
            A peer died or stopped answering within the exchange's timeout.
        """
        owner = torch.searchsorted(self._bounds, rid, right=True)
        order = torch.argsort(owner, stable=True)
        counts = torch.bincount(owner, minlength=len(self.offsets) - 1).tolist()
        try:
            parts = self.exchange.fetch(list(torch.split(rid.index_select(0, order), counts)))
        except RuntimeError as exc:  # gloo's error: a peer died or hung past the timeout
            raise PeerLostError.of(exc, "the feature exchange") from None
        out = torch.empty((rid.numel(), self.dim), dtype=self.dtype)
        if rid.numel():
            out.index_copy_(0, order, torch.cat(parts))
        return out

    def gather(self, ids: Tensor) -> Tensor:
        return self.gather_landing(ids).wait()

    def gather_landing(self, ids: Tensor | np.ndarray, dtype: torch.dtype | None = None) -> Gathered:
        """Rows of ``ids`` (new ids) on the training device: home rows indexed, the others exchanged."""
        with self.transfer.batch() as tb:
            ids_h = tb.to_host(torch.as_tensor(ids).reshape(-1)).to(torch.int64)
            n = ids_h.numel()
            home = (ids_h >= self.lo) & (ids_h < self.hi)
            pos_h, pos_r = torch.nonzero(home).reshape(-1), torch.nonzero(~home).reshape(-1)
            fetched = self.fetch_remote(ids_h.index_select(0, pos_r))
            out = (tb.staging("rows", (n, self.dim), self.dtype) if self.transfer.accelerated
                   else self._out.take(n))
            out.index_copy_(0, pos_h, self._x.index_select(0, ids_h.index_select(0, pos_h) - self.lo))
            out.index_copy_(0, pos_r, fetched)
            x = tb.to_device(out, dtype) if self.transfer.accelerated else tb.cast(out, dtype)
        self._c["local"] += pos_h.numel()
        self._c["remote"] += pos_r.numel()
        return Gathered(x, tb.landing)

    def totals(self) -> dict[str, tuple[int, int]]:
        """Rows and bytes of this rank's batches: ``memory`` (its own rows), ``remote`` (exchanged)."""
        return {"memory": (self._c["local"], self._c["local"] * self.row_bytes),
                "remote": (self._c["remote"], self._c["remote"] * self.row_bytes)}

    def epoch_record(self) -> dict[str, Any]:  # Any: the record's numbers and names
        """Rows at home and exchanged since the last call, summed over every rank (a collective on the main thread)."""
        ex = self.exchange.stats()
        now = {"local_rows": self._c["local"], "remote_rows": self._c["remote"],
               "remote_bytes": self._c["remote"] * self.row_bytes, "served_rows": ex.get("rows_served", 0),
               "exchange_calls": ex.get("calls", 0), "exchange_s": ex.get("seconds", 0.0)}
        d = summed_since(now, self._mark, self._all_reduce)
        self._mark = now
        rows = d["local_rows"] + d["remote_rows"]
        return {"nodes": {**{k: (v if k == "exchange_s" else int(v)) for k, v in d.items()},
                          "exchange": self.exchange.name, "remote_share": d["remote_rows"] / rows if rows else 0.0}}

    def memory_bytes(self) -> dict[str, int]:
        """Host bytes of this partition's rows."""
        return {"host": self._x.numel() * self._x.element_size()}

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a broken exchange (a dead peer) must not keep the rows
            self.exchange.close()


def open_partition_features(rows: np.ndarray, node_offsets: Sequence[int], rank: int, world_size: int, *,
                            timeout_s: float, transfer: Transfer | None = None) -> PartitionFeatures:
    """This rank's :class:`PartitionFeatures`; with several ranks its exchange is a gloo group of its own.

    Every rank calls it at the same point (making the group is a collective).
    """
    from training.sharded.exchange import AllToAllExchange, LoopbackExchange
    from training.sharded.features import _all_reduce_sum  # the sharded store's: the same figures' sum

    def make(serve: Callable[[Tensor], Tensor], dim: int, dtype: torch.dtype) -> RowExchange:
        if world_size <= 1:
            return LoopbackExchange(serve, dim=dim, dtype=dtype)
        return AllToAllExchange(AllToAllExchange.new_group(timeout_s), serve, dim=dim, dtype=dtype)

    return PartitionFeatures(rows, node_offsets, rank, make, transfer=transfer,
                             all_reduce=_all_reduce_sum if world_size > 1 else None)

