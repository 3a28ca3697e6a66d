"""Re-placement when hotness drifts: DDAK re-run on the reads a run counted, moving only rows whose bin changes.

A placement is computed once from pre-sampling (the paper's limit). When the
seeds a run trains on drift, the rows it reads drift with them, and a cache
filled for the first epochs serves less and less. Here:

* :class:`RowReads` counts the rows a run's gathers read (every ``every``-th
  batch: sampled; 4 bytes a vertex, fixed when made: bounded memory), and
  hands them over as a hotness (expected reads per epoch) between epochs.
* :func:`plan_replacement` re-runs the placement policy (DDAK) on that hotness
  with the placement's own bins and targets. A vertex whose bin is unchanged
  keeps its bin *and* row; a vertex whose bin changes takes, in its new bin, a
  row the old placement leaves unused (one it never used first, so a store
  still reading through the old placement never reads a row being written;
  rows vacated by this move only when the bin has no other room). That alone
  does not make the move safe beside a live store: its block checks
  (:mod:`iostack.binverify`) hold the old per-block CRCs, so a store must be
  reopened after the move (a move in the background needs arrivals in blocks
  no old row shares: not done yet). The plan says
  the traffic per bin the new hotness puts on the old placement and on the new
  one (the prediction, checked after the move by :func:`bin_traffic`).
* :func:`apply_replacement` writes the moved rows that land in SSD bins, in place
  (:func:`iostack.bins.write_rows`: only those rows' bytes change), from the
  dataset's features through the placement's codec (the bytes
  :func:`iostack.bins.write_bins` would write), then saves the new placement
  (its manifest last). GPU and CPU bins are filled from the features when a
  store opens, so rows moving into them need no write.

>>> import numpy as np
>>> from iostack.placement import simple_placement
>>> p = simple_placement(6, [("cpu", 2), ("ssd", 6)])
>>> p.bin_of.tolist(), p.row_of.tolist()
([0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 2, 3])
>>> r = plan_replacement(p, np.array([0, 0, 1, 1, 9, 9], np.float32), [1.0, 0.0001], pool=1)
>>> r.moved.tolist(), r.placement.bin_of.tolist(), r.placement.row_of.tolist()
([0, 1, 4, 5], [1, 1, 1, 1, 0, 0], [4, 5, 0, 1, 0, 1])
>>> r.static_traffic.tolist(), r.predicted_traffic.tolist()
([0.0, 20.0], [18.0, 2.0])
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iostack.bins import write_rows
from iostack.placement import Placement
from planner.placement import DdakBin
from planner.policies import place_items
from training.place.bins import PlacingError

__all__ = ["Replacement", "RowReads", "apply_replacement", "bin_traffic", "plan_replacement"]


class RowReads:
    """Per-row read counts of a run's gathers, sampled: every ``every``-th batch is counted.

    Memory: one uint32 per vertex, allocated when made (``4 * num_vertices`` bytes), whatever the
    run reads. Safe to call from several prefetch threads.
    """

    def __init__(self, num_vertices: int, every: int = 1) -> None:
        if int(every) < 1:
            raise PlacingError(f"`every` {every}: expected a positive number of batches")
        self.every = int(every)
        self._counts = np.zeros(int(num_vertices), np.uint32)
        self._batches = 0
        self._lock = threading.Lock()

    def observe(self, ids: np.ndarray) -> None:
        """One batch's gathered vertex ids (duplicates count once each)."""
        with self._lock:
            self._batches += 1
            if (self._batches - 1) % self.every:
                return
            np.add.at(self._counts, np.asarray(ids, np.int64), 1)

    def take(self) -> np.ndarray:
        """The reads counted since the last call, scaled to every batch (float32 ``(num_vertices,)``); resets."""
        with self._lock:
            h = self._counts.astype(np.float32) * self.every
            self._counts[:] = 0
            self._batches = 0
        return h

    @property
    def nbytes(self) -> int:
        return int(self._counts.nbytes)


def bin_traffic(placement: Placement, hotness: np.ndarray) -> np.ndarray:
    """The hotness each bin of ``placement`` serves (float64 ``(len(bins),)``)."""
    return np.bincount(placement.bin_of, weights=np.asarray(hotness, np.float64), minlength=len(placement.bins))


@dataclass(frozen=True)
class Replacement:
    """A re-placement: the new ``placement``; ``moved`` (int64), the vertices whose bin changes, with their
    ``old_bin`` and ``new_bin``; per bin (float64): ``static_traffic`` (the new hotness on the old
    placement), ``predicted_traffic`` (on the new one) and ``target`` (the targets rescaled to its total);
    ``reused_rows``: rows vacated by this move that arrivals took (a bin without other room)."""

    placement: Placement
    moved: np.ndarray
    old_bin: np.ndarray
    new_bin: np.ndarray
    static_traffic: np.ndarray
    predicted_traffic: np.ndarray
    target: np.ndarray
    reused_rows: int

    def cache_share(self, traffic: np.ndarray) -> float:
        """The share of ``traffic`` served by GPU and CPU bins."""
        cache = np.array([b.kind != "ssd" for b in self.placement.bins])
        total = float(traffic.sum())
        return float(traffic[cache].sum()) / total if total else 0.0


def _slots(used: np.ndarray, vacated: np.ndarray, n: int, capacity: int) -> tuple[np.ndarray, int]:
    """``n`` rows of a bin whose rows ``used`` the old placement holds (``vacated``: those this move frees):
    never-used rows first, lowest first, then vacated ones; and how many vacated ones were taken."""
    top = min(capacity, int(used.max()) + 1 + n if used.size else n)
    taken = np.zeros(top, bool)
    taken[used] = True
    fresh = np.flatnonzero(~taken)[:n]
    if fresh.size == n:
        return fresh, 0
    extra = np.sort(vacated)[: n - fresh.size]
    return np.concatenate([fresh, extra]), int(extra.size)


def plan_replacement(placement: Placement, hotness: np.ndarray, targets: Sequence[float], *, pool: int = 100,
                     policy: str = "ddak") -> Replacement:
    """The placement ``policy`` makes of ``hotness`` with ``placement``'s bins and ``targets`` (one per bin,
    the flow's traffic targets, any scale), reached by moving only the vertices whose bin changes.

    Raises
    ------
    PlacingError
        ``targets`` not one per bin, or ``hotness`` not one per vertex.
    """
    bins = placement.bins
    h = np.asarray(hotness, np.float32)
    if len(targets) != len(bins):
        raise PlacingError(f"`targets`: {len(targets)} values for {len(bins)} bins; give one per bin")
    if h.shape != (placement.num_vertices,):
        raise PlacingError(f"`hotness` of shape {h.shape}: expected ({placement.num_vertices},), one per vertex")
    ddak_bins = [DdakBin(str(b.id), b.kind, b.capacity_rows, float(t)) for b, t in zip(bins, targets, strict=True)]
    res = place_items(policy, h, ddak_bins, pool=pool)
    old_bin = placement.bin_of.astype(np.int64)
    new_bin = np.asarray(res.bin_of, np.int64)
    moved = np.flatnonzero(new_bin != old_bin)
    row_of = placement.row_of.copy()
    reused = 0
    for j in np.unique(new_bin[moved]).tolist():
        arrivals = moved[new_bin[moved] == j]
        in_j = old_bin == j
        vacated = placement.row_of[in_j & (new_bin != j)]
        rows, r = _slots(placement.row_of[in_j], vacated, arrivals.size, bins[j].capacity_rows)
        row_of[arrivals] = rows
        reused += r
    new = Placement(bins, new_bin, row_of, codec=placement.codec, dataset_fingerprint=placement.dataset_fingerprint)
    return Replacement(new, moved, old_bin[moved], new_bin[moved], bin_traffic(placement, h), bin_traffic(new, h),
                       np.asarray(res.target_per_bin, np.float64), reused)


def apply_replacement(rep: Replacement, directory: str | os.PathLike[str], features: np.ndarray, *,
                      fsync: bool = True) -> dict[str, int]:
    """Write ``rep``'s moved rows that land in SSD bins of the placement in ``directory``, then save
    ``rep.placement`` there (``bin_of``, ``row_of``, the manifest last). ``features``: the dataset's
    ``(V, dim)`` rows (array or memmap; only the moved rows are read). Returns ``rows_written``,
    ``bytes_written`` and ``bins_written``.

    Raises
    ------
    StoreError
        A bin file is missing or damaged, or a write fails (the placement is then not saved: the
        old one stays in force, and the rows written went only to rows it does not use unless
        ``rep.reused_rows``).
    """
    p, codec = rep.placement, rep.placement.codec
    rows_written = bytes_written = bins_written = 0
    for b in p.bins:
        if b.kind != "ssd":
            continue
        ids = rep.moved[rep.new_bin == b.id]
        if not ids.size:
            continue
        ids = np.sort(ids)  # a memmap read front to back
        x = np.asarray(features[ids])
        stored = np.ascontiguousarray(x if codec is None else codec.encode(x))
        data = stored.view(np.uint8).reshape(ids.size, -1)
        write_rows(directory, b, p.row_of[ids], data, fsync=fsync)
        rows_written += int(ids.size)
        bytes_written += int(data.nbytes)
        bins_written += 1
    p.save(Path(directory))
    return {"rows_written": rows_written, "bytes_written": bytes_written, "bins_written": bins_written}
