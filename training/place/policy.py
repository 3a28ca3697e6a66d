"""A placement policy run over a plan's bins: hotness -> DDAK or a baseline -> an iostack ``Placement``.

:func:`place` fills the bins of :func:`training.place.bins.build_bins` with
the policy named (:data:`planner.policies.PLACEMENT_POLICIES`), keeping rows
near the sockets that read them when it is given the reads per socket, and
returns the :class:`iostack.placement.Placement` with its report
(:mod:`training.place.report`) and the hash baseline's on the same input.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from iostack.placement import Bin, Placement
from planner.affinity import Affinity
from planner.baselines import hash_placement
from planner.handoff import PlanTargets
from planner.placement import DdakBin
from planner.policies import place_items
from planner.progress import Progress
from training.place.bins import BinPlan, PlacingError, bin_split, feasible_targets, reader_sockets
from training.place.report import PlacementReport, report_for

if TYPE_CHECKING:
    from iostack.codec import FeatureCodec


@dataclass(frozen=True)
class PlaceResult:
    """A placement with its report, and the hash baseline's report on the same input."""

    placement: Placement
    bins: tuple[BinPlan, ...]
    report: PlacementReport
    baseline: PlacementReport | None
    #: where the plan's targets were more than the caches can serve (see :func:`feasible_targets`)
    notes: tuple[str, ...] = ()


def default_pool(num_rows: int, num_bins: int) -> int:
    """The paper's pool of 100 rows, smaller for small inputs: at least 100 pools per bin.

    A bin's traffic can only move in whole pools, so with a few thousand rows
    (Cora) pools of 100 would leave every bin tens of percent off target.

    >>> default_pool(10**9, 10), default_pool(2708, 11)
    (100, 2)
    """
    return max(1, min(100, num_rows // (100 * max(1, num_bins))))


def place(hotness: np.ndarray, bins: Sequence[BinPlan], targets: PlanTargets, *, row_bytes: int,
          strategy: str = "ddak", pool: int | None = None, seed: int = 0, reads_per_epoch: float | None = None,
          baseline: bool = True, codec: FeatureCodec | None = None, progress: Progress | None = None,
          group_reads: np.ndarray | None = None) -> PlaceResult:
    """Place every row: ``hotness`` (``[num_rows]``, any non-negative numbers) into ``bins``.

    ``pool``: DDAK's pool size; ``None`` takes :func:`default_pool`.
    ``row_bytes``: a row as the bins hold it (``codec.row_bytes`` for a
    :class:`iostack.codec.FeatureCodec`, which the placement then carries).
    ``progress``: DDAK's stages (:func:`planner.ddak.ddak`).
    ``group_reads`` (``[num_rows, len(reader_sockets(targets))]``): each
    row's reads by the GPUs of each socket; with two or more sockets DDAK
    puts rows on the bins the plan routes to their readers' socket
    (:class:`planner.affinity.Affinity` with :func:`bin_split`), and the reports
    count cross-socket reads from them.

    Returns the iostack :class:`Placement` (SSD bins' capacity = the rows
    they got, the size of their file) with the report, and the hash
    baseline's report on the same bins and hotness (``baseline=False``: none).
    """
    h = np.asarray(hotness)
    if h.dtype != np.float32:
        h = h.astype(np.float32)  # DDAK's fast path; counts stay exact up to 2**24
    bins, notes = feasible_targets(h, bins)
    dbins = [DdakBin(f"bin{i}", b.kind, b.capacity_rows, b.target_share) for i, b in enumerate(bins)]
    if pool is None:
        pool = default_pool(h.size, len(dbins))
    affinity = None
    if group_reads is not None:
        group_reads = np.asarray(group_reads, dtype=np.float32)
        if group_reads.shape != (h.size, len(reader_sockets(targets))):
            raise PlacingError(f"reads per socket: expected shape ({h.size}, {len(reader_sockets(targets))}), "
                               f"got {group_reads.shape}")
        if group_reads.shape[1] > 1:
            affinity = Affinity(group_reads, bin_split(targets, bins))
    t = time.perf_counter()
    result = place_items(strategy, h, dbins, pool=pool, seed=seed, progress=progress, affinity=affinity)
    sec = time.perf_counter() - t
    rep = report_for(result, bins, targets, strategy=strategy, row_bytes=row_bytes,
                     reads_per_epoch=reads_per_epoch, seconds=sec, group_reads=group_reads)
    base = None
    if baseline:
        t = time.perf_counter()
        hashed = hash_placement(h, dbins) if strategy != "hash" else result
        base = report_for(hashed, bins, targets, strategy="hash", row_bytes=row_bytes,
                          reads_per_epoch=reads_per_epoch, seconds=time.perf_counter() - t,
                          group_reads=group_reads)
        del hashed
    items = result.items_per_bin
    ibins = tuple(Bin(i, b.kind, int(items[i]) if b.kind == "ssd" else b.capacity_rows, path=b.path,
                      device=b.device) for i, b in enumerate(bins))
    placement = Placement(ibins, result.bin_of, result.row_of, codec=codec)
    return PlaceResult(placement, tuple(bins), rep, base, tuple(notes))


__all__ = ["PlaceResult", "default_pool", "place"]
