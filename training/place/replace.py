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
  row this move vacates there first, then one the old placement never used
  (lowest first), so an SSD bin does not grow with every move. The plan says
  the traffic per bin the new hotness puts on the old placement and on the new
  one (the prediction, checked after the move by :func:`bin_traffic`).
* :func:`apply_replacement` makes the new placement the directory's, beside a
  store still reading the old one: the SSD bins receiving rows are copied with
  them to staged files (:mod:`iostack.binmove`: every block of the live file
  checked as it is copied, the copy's block sums computed from what is written),
  the index staged, and one commit renames them all (:mod:`iostack.commit`). A
  live store's open files and block sums stay those of the old bins until it is
  replaced by a store of the new placement (:mod:`training.place.live` does that
  between two gathers, while training goes on). GPU and CPU bins are filled from
  the features when a store opens, so rows moving into them need no write.

>>> import numpy as np
>>> from iostack.placement import simple_placement
>>> p = simple_placement(6, [("cpu", 2), ("ssd", 6)])
>>> p.bin_of.tolist(), p.row_of.tolist()
([0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 2, 3])
>>> r = plan_replacement(p, np.array([0, 0, 1, 1, 9, 9], np.float32), [1.0, 0.0001], pool=1)
>>> r.moved.tolist(), r.placement.bin_of.tolist(), r.placement.row_of.tolist()
([0, 1, 4, 5], [1, 1, 1, 1, 0, 0], [2, 3, 0, 1, 0, 1])
>>> r.static_traffic.tolist(), r.predicted_traffic.tolist()
([0.0, 20.0], [18.0, 2.0])
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from iostack.binmove import write_moved_bin
from iostack.bins import bin_path, discard_staged, staged_path
from iostack.commit import commit
from iostack.placement import MANIFEST, Placement
from planner.placement import DdakBin
from planner.policies import place_items
from training.place.bins import PlacingError

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["STAGED_INDEX", "Replacement", "RowReads", "apply_replacement", "bin_traffic", "discard", "plan_replacement",
           "staged_placement"]


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

    def observe(self, ids: np.ndarray | Tensor) -> None:
        """One batch's gathered vertex ids (duplicates count once each; a tensor, on a device too, is
        copied to the host only when its batch is counted)."""
        with self._lock:
            self._batches += 1
            if (self._batches - 1) % self.every:
                return
        to_host = getattr(ids, "cpu", None)
        a = np.asarray(to_host().numpy() if to_host is not None else ids, np.int64).reshape(-1)
        with self._lock:
            np.add.at(self._counts, a, 1)

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
    ``reused_rows``: rows vacated by this move that arrivals took."""

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
    vacated ones first, lowest first, then rows never used; and how many vacated ones were taken."""
    extra = np.sort(vacated)[:n]
    need = n - extra.size
    if not need:
        return extra, int(extra.size)
    top = min(capacity, int(used.max()) + 1 + need if used.size else need)
    taken = np.zeros(top, bool)
    taken[used] = True
    return np.concatenate([extra, np.flatnonzero(~taken)[:need]]), int(extra.size)


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


#: the subdirectory of a placement where a re-placement stages its index until the commit
STAGED_INDEX = ".replace-staged"


def staged_placement(rep: Replacement, directory: str | os.PathLike[str]) -> Placement:
    """``rep.placement`` with the SSD bins :func:`apply_replacement` writes named by their staged files (absolute
    paths): a store opened on it before the commit reads the new bins, and keeps them open across the rename."""
    written = {int(b) for b in np.unique(rep.new_bin)}
    bins = tuple(dataclasses.replace(b, path=str(staged_path(bin_path(directory, b).resolve())))
                 if b.kind == "ssd" and b.id in written else b for b in rep.placement.bins)
    p = rep.placement
    return Placement(bins, p.bin_of, p.row_of, codec=p.codec, dataset_fingerprint=p.dataset_fingerprint)


def discard(rep: Replacement, directory: str | os.PathLike[str]) -> None:
    """Remove what :func:`apply_replacement` staged for ``rep`` and did not commit (a move given up)."""
    discard_staged(rep.placement, directory)
    shutil.rmtree(Path(directory) / STAGED_INDEX, ignore_errors=True)


def apply_replacement(rep: Replacement, directory: str | os.PathLike[str], features: np.ndarray, *,
                      fsync: bool = True, before_commit: Callable[[Placement], None] | None = None) -> dict[str, int]:
    """Make ``rep.placement`` the placement in ``directory``, all at once: the SSD bins that receive moved
    rows are copied with them to staged files (:func:`iostack.binmove.write_moved_bin`, every block of
    the live file checked as it is copied), the new index saved under :data:`STAGED_INDEX`, then one commit
    renames them all into place (:mod:`iostack.commit`). Until the commit the old placement is untouched
    (a crash leaves it valid; the staged files are removed by the next move or ignored); from it on, the new
    one is (a crash mid-renames is finished by the next :func:`~iostack.placement.load_placement`).
    ``features``: the dataset's ``(V, dim)`` rows (array or memmap; only the moved rows are read), encoded
    by the placement's codec. ``before_commit(placement)``: called with :func:`staged_placement` once all
    is staged (a live store opens the new bins there); what it raises gives the move up. Returns
    ``rows_written``, ``bytes_written`` and ``bins_written``.

    Raises
    ------
    StoreError
        A bin file is missing or damaged, or a write fails: nothing is committed, the old placement stays.
    """
    p, codec, d = rep.placement, rep.placement.codec, Path(directory)
    rows_written = bytes_written = bins_written = 0
    pairs: list[tuple[str, str]] = []
    discard(rep, d)  # a crashed move's leftovers
    try:
        for b in p.bins:
            ids = rep.moved[rep.new_bin == b.id]
            if b.kind != "ssd" or not ids.size:
                continue
            ids = np.sort(ids)  # a memmap read front to back
            x = np.asarray(features[ids])
            data = np.ascontiguousarray(x if codec is None else codec.encode(x)).view(np.uint8).reshape(ids.size, -1)
            info = write_moved_bin(d, b, p.row_of[ids], data, fsync=fsync)
            final = Path(info.path)
            pairs += [(str(staged_path(final)), str(final)),
                      (str(staged_path(final)) + ".json", str(final) + ".json")]
            rows_written += int(ids.size)
            bytes_written += int(data.nbytes)
            bins_written += 1
        p.save(d / STAGED_INDEX)
        # the index last: placement.json is what readers open first
        pairs += [(f"{STAGED_INDEX}/{n}", n) for n in ("bin_of.npy", "row_of.npy", MANIFEST)]
        if before_commit is not None:
            before_commit(staged_placement(rep, d))
        commit(d, pairs, fsync=fsync)
    except BaseException:
        discard(rep, d)
        raise
    shutil.rmtree(d / STAGED_INDEX, ignore_errors=True)
    return {"rows_written": rows_written, "bytes_written": bytes_written, "bins_written": bins_written}
