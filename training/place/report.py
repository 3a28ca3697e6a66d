"""What a placement does to the reads: each bin's share against its target, the SSDs', the sockets'.

The report (:class:`PlacementReport`) says what a placement does to the
reads: each bin's share of the hotness against its target, the SSDs'
share and bytes per epoch, and the cross-socket share of the bytes the GPUs
receive. Data-parallel GPUs each read the same distribution, so every bin's
traffic reaches every GPU; a byte crosses sockets when its bin sits on
another socket than the GPU reading it (GPU caches never: a replicated
cache is local, a partitioned one is reached over NVLink).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.handoff import PlanTargets
from planner.placement import DdakResult
from training.place.bins import ZERO_TARGET_SHARE, BinPlan, reader_sockets


@dataclass(frozen=True)
class BinReport:
    """What one bin serves: rows, its share of the reads against its target (shares of all reads)."""

    id: int
    kind: str
    device: str
    socket: str | None
    rows: int
    capacity_rows: int
    traffic_share: float
    target_share: float

    @property
    def deviation(self) -> float:
        """``|traffic - target| / target``."""
        return abs(self.traffic_share - self.target_share) / self.target_share


@dataclass(frozen=True)
class PlacementReport:
    """A placement's expected effect on the reads.

    ``max_relative_deviation`` over the bins whose target is not the
    zero-target stand-in; ``ssd_share`` the share of reads the SSD bins
    serve; ``ssd_bytes_per_epoch`` those reads in bytes per epoch (``None``
    when the hotness is not a read count, e.g. degree or PageRank);
    ``cross_socket_share`` the share of the bytes delivered to the GPUs that
    cross sockets; ``seconds`` the time the placer took. ``socket_reads``:
    ``(reader socket, bin socket, share of all reads)`` for every pair with
    reads (a GPU cache counts on the reader's socket: it is local), from the
    reads per socket when :func:`place` had them, else every GPU reading alike.
    """

    strategy: str
    bins: tuple[BinReport, ...]
    max_relative_deviation: float
    ssd_share: float
    ssd_bytes_per_epoch: float | None
    cross_socket_share: float
    seconds: float
    socket_reads: tuple[tuple[str | None, str | None, float], ...] = ()


def socket_reads(result: DdakResult, bins: Sequence[BinPlan], targets: PlanTargets,
                 group_reads: np.ndarray | None = None) -> np.ndarray:
    """Reads by (reader socket, bin): ``(len(reader_sockets), len(bins))``, shares of all reads.

    ``group_reads`` (``[num_rows, len(reader_sockets)]``) are the reads of
    each socket's GPUs; without them every GPU reads the bins' traffic alike
    (data-parallel training: each rank takes a random part of every batch).
    """
    socks = list(reader_sockets(targets))
    m = len(bins)
    if group_reads is None:
        traffic = np.asarray(result.traffic_per_bin, dtype=np.float64)
        per = np.array([sum(1 for _, s in targets.gpus if s == k) for k in socks], dtype=np.float64)
        out = np.outer(per / per.sum(), traffic)
    else:
        out = np.stack([np.bincount(result.bin_of, weights=group_reads[:, g], minlength=m)
                        for g in range(len(socks))])
    total = out.sum()
    return out / total if total > 0 else out


def report_for(result: DdakResult, bins: Sequence[BinPlan], targets: PlanTargets, *, strategy: str,
               row_bytes: int, reads_per_epoch: float | None, seconds: float = 0.0,
               group_reads: np.ndarray | None = None) -> PlacementReport:
    """The :class:`PlacementReport` of ``result`` (``reads_per_epoch``: all reads of an epoch, or ``None``;
    ``group_reads``: reads per socket, see :func:`socket_reads`)."""
    traffic = np.asarray(result.traffic_per_bin, dtype=np.float64)
    total = float(traffic.sum())
    shares = traffic / total if total > 0 else np.zeros_like(traffic)
    # targets renormalised over the bins there are (a plan store without a bin, e.g. host
    # memory with no CPU cache, leaves its share to the others), as DDAK sees them
    t_sum = sum(b.target_share for b in bins)
    reports = tuple(BinReport(i, b.kind, b.device, b.socket, int(result.items_per_bin[i]), b.capacity_rows,
                              float(shares[i]), b.target_share / t_sum) for i, b in enumerate(bins))
    real = [r for r, b in zip(reports, bins, strict=True) if b.target_share > ZERO_TARGET_SHARE]
    dev = max((r.deviation for r in real), default=0.0) if total > 0 else 0.0
    ssd = float(sum(r.traffic_share for r in reports if r.kind == "ssd"))
    cross = 0.0
    pairs: dict[tuple[str | None, str | None], float] = {}
    if targets.gpus:
        by = socket_reads(result, bins, targets, group_reads)
        for g, gsock in enumerate(reader_sockets(targets)):
            for j, b in enumerate(bins):
                where = gsock if b.kind == "gpu" else b.socket  # a GPU cache is on the reader's side
                pairs[(gsock, where)] = pairs.get((gsock, where), 0.0) + float(by[g, j])
                if where is not None and gsock is not None and where != gsock:
                    cross += float(by[g, j])
    ssd_bytes = ssd * reads_per_epoch * row_bytes if reads_per_epoch is not None else None
    return PlacementReport(strategy, reports, float(dev), ssd, ssd_bytes, float(cross), seconds,
                           tuple((a, b, v) for (a, b), v in pairs.items() if v > 0))


def expected_shares(bin_of: np.ndarray, hotness: np.ndarray, num_bins: int) -> list[float]:
    """Each bin's share of the reads under ``hotness`` (``[num_rows]``), for rows placed by ``bin_of``.

    With a hotness the placement was *not* fitted to (an independent pre-sample), this is an
    unbiased estimate of what training will read from each bin: DDAK fitted to one sample
    puts the rows that happened to be hot in it into the caches, and a new epoch reads them
    less often (on a skewed graph with 4 KiB rows here, the in-sample SSD share was 11-21% below
    what training read; python tools/bench_loop.py).

    >>> expected_shares(np.array([0, 1, 1]), np.array([2.0, 1.0, 1.0]), 3)
    [0.5, 0.5, 0.0]
    """
    w = np.bincount(np.asarray(bin_of, np.int64), weights=np.asarray(hotness, np.float64), minlength=num_bins)
    total = float(w.sum())
    return [float(x) / total if total > 0 else 0.0 for x in w[:num_bins]]


__all__ = ["BinReport", "PlacementReport", "expected_shares", "report_for", "socket_reads"]
