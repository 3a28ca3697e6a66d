"""Re-placement inside training: a placement's store that moves rows whose hotness drifted, in the background.

:class:`LiveReplacement` is the feature source ``moment train --replace-every K``
trains through. It serves every gather from one :class:`~iostack.store.FeatureStore`
at a time and counts the rows its gathers read (:class:`~training.place.replace.RowReads`:
every ``count_every``-th batch, one uint32 per vertex, ``4 * V`` bytes fixed when
made, whatever the run reads). After every ``every_epochs``-th epoch (the trainer's
hook between epochs, :meth:`epoch_record`) a thread takes those counts and, while
training goes on:

1. re-runs DDAK on them with the placement's bins and targets
   (:func:`~training.place.replace.plan_replacement`: only vertices whose bin
   changes move) and gives up unless the share of reads the caches would serve
   rises by ``min_gain`` (a move costs a bin copy; noise should not buy one);
2. stages the move (:func:`~training.place.replace.apply_replacement`): SSD bins
   receiving rows copied with them under staged names, every block of the live
   file checked against its sums as it is read, the copy's sums computed from
   what is written, the new index staged;
3. opens a store on the staged placement (its caches filled from the features
   for the new placement, its SSD files open) and commits the move (one rename
   decides it, :mod:`iostack.commit`); then hands the new store over.

The next gather swaps it in: each gather is served wholly by the store it started
with, so it sees the old placement (old index, old files, old block sums, old
caches) or the new one, never a half-moved row. The old store closes once its
last gather ends; the files it had open stay readable until then. A crash before
the commit leaves the old placement as it was; one after it is finished by the next
:func:`~iostack.placement.load_placement` (``moment place --verify`` passes either
way). Memory while a move is staged: two stores, so the caches twice over, for the
time of the move.

Why every K epochs rather than a drift threshold alone: the counts cover whole
epochs (what the next epoch's seeds will look like), and a fixed cadence bounds
the copies; the gain floor (``min_gain``) is the threshold, on the plan's own
prediction. One process only: several ranks would have to swap at the same step.
Counts include evaluation gathers made through this source.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from iostack.placement import Placement, load_placement
from iostack.store import FeatureStore
from iostack.transfer import Gathered
from training.data import Dataset
from training.errors import TrainError
from training.place.replace import RowReads, apply_replacement, bin_traffic, plan_replacement
from training.specs import IOSpec

__all__ = ["LiveReplacement", "ReplaceOptions", "cache_targets", "live_for_run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplaceOptions:
    """When and how a run re-places: after every ``every_epochs``-th epoch, on the rows of every
    ``count_every``-th batch, when the caches' predicted share of reads rises by ``min_gain`` at least
    (a fraction of all reads); ``policy`` and ``pool`` are the placement policy's."""

    every_epochs: int = 1
    count_every: int = 1
    min_gain: float = 0.01
    policy: str = "ddak"
    pool: int = 100


def cache_targets(placement: Placement, hotness: np.ndarray) -> list[float]:
    """Targets that ask each GPU, then CPU, bin for all the reads of the hottest rows it has room for,
    and the SSD bins for the rest (split by capacity): the targets of a plan whose caches are the fast tiers.

    >>> from iostack.placement import simple_placement
    >>> cache_targets(simple_placement(4, [("cpu", 1), ("ssd", 4)]), np.float32([1, 5, 2, 2]))
    [5.0, 5.0]
    """
    order = np.sort(np.asarray(hotness, np.float64))[::-1]
    targets = [0.0] * len(placement.bins)
    at = 0
    for b in sorted((b for b in placement.bins if b.kind != "ssd"), key=lambda b: b.kind != "gpu"):
        targets[b.id] = float(order[at:at + b.capacity_rows].sum())
        at += b.capacity_rows
    ssd = [b for b in placement.bins if b.kind == "ssd"]
    rest, cap = float(order[at:].sum()), sum(b.capacity_rows for b in ssd) or 1
    for b in ssd:
        targets[b.id] = rest * b.capacity_rows / cap
    return [max(t, 1e-9) for t in targets]


@dataclass
class _Live:
    """A store and the gathers running on it; closed once retired and none runs."""

    store: FeatureStore
    users: int = 0
    retired: bool = False


def _expected(placement: Placement, bin_shares: Sequence[float]) -> tuple[dict[str, float], list[tuple[float, int]]]:
    """Per tier the shares ``bin_shares`` (one per bin) add to, and ``(share, rows)`` per SSD bin of ``placement``."""
    tiers: dict[str, float] = {}
    for b, share in zip(placement.bins, bin_shares, strict=True):
        tiers[b.kind] = tiers.get(b.kind, 0.0) + float(share)
    rows = placement.rows_per_bin()
    return tiers, [(float(bin_shares[b.id]), int(rows[b.id])) for b in placement.bins if b.kind == "ssd"]


def _fast_share(totals: dict[str, tuple[int, int]]) -> float | None:
    rows = sum(r for r, _ in totals.values())
    return sum(r for k, (r, _) in totals.items() if k != "ssd") / rows if rows else None


class LiveReplacement:
    """The rows of the placement in ``directory``, re-placed in the background between epochs (module doc).

    ``store``: a store open on that placement (this object closes it); ``features``: the dataset's rows
    (array or memmap) the moved rows and the new caches come from; ``open_store(placement)``: a store of
    another placement of the same directory, on ``store``'s transfer. ``targets``: one per bin (default:
    :func:`cache_targets` of each move's counts). ``on_stage(name)``: called by the mover at ``planned``,
    ``staged`` (all written, nothing committed) and ``committed`` (tests hold or break a move there).
    """

    def __init__(self, store: FeatureStore, directory: str | os.PathLike[str], features: np.ndarray,
                 options: ReplaceOptions, open_store: Callable[[Placement], FeatureStore], *,
                 targets: Sequence[float] | None = None, on_stage: Callable[[str], None] | None = None) -> None:
        self._live = _Live(store)
        self.dir, self.features, self.options = Path(directory), features, options
        self.placement = load_placement(directory)  # as on disk: the next move starts from it
        assert store.dim is not None  # a store knows its rows' width once open
        self.transfer, self.dim = store.transfer, int(store.dim)
        self.reads = RowReads(store.num_vertices, options.count_every)
        self._open, self._targets, self._on_stage = open_store, targets, on_stage
        self._lock = threading.Lock()
        self._ready: tuple[FeatureStore, Placement, dict] | None = None
        self._thread: threading.Thread | None = None
        self._reports: list[dict] = []
        self._epochs = 0
        self._totals = store.totals()
        self._predicted: float | None = None  # the fast-tier share the last move swapped in predicted
        self._expected: tuple[dict[str, float], list[tuple[float, int]]] | None = None
        self._gathers = 0  # gathers since the last epoch record
        self._swapped_at: list[int] = []  # after how many of them each move went into service

    # -- the store of the moment -------------------------------------------------------------------
    @property
    def store(self) -> FeatureStore:
        """The store gathers are served from now."""
        return self._live.store

    def _acquire(self) -> _Live:
        self._swap()
        with self._lock:
            live = self._live
            live.users += 1
            return live

    def _release(self, live: _Live) -> None:
        with self._lock:
            live.users -= 1
            done = live.retired and live.users == 0
        if done:
            _close(live.store)

    def _swap(self) -> None:
        """Put a store the mover made ready in service (between two gathers); the old one closes when idle."""
        with self._lock:
            ready, self._ready = self._ready, None
            if ready is None:
                return
            new, placement, rec = ready
            old = self._live
            for b in new.placement.bins:  # the run's counters go on across the swap
                new.tier_of(b.id).counters[b.id] = old.store.tier_of(b.id).counters[b.id]
            self._live, self.placement = _Live(new), placement
            self._predicted = rec["predicted_share"]
            self._expected = _expected(placement, rec["predicted_bin_shares"])
            self._swapped_at.append(self._gathers)
            old.retired = True
            idle = old.users == 0
        if idle:
            _close(old.store)

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        return self.gather_landing(ids).wait()

    def gather_landing(self, ids: torch.Tensor, *, dtype: torch.dtype | None = None) -> Gathered:
        """Rows of ``ids`` from one store, old or new, never both; the ids counted (sampled)."""
        live = self._acquire()
        self._gathers += 1
        try:
            out = live.store.gather_landing(ids, dtype=dtype)
        finally:
            self._release(live)
        self.reads.observe(ids)
        return out

    def tier_rows(self, ids: torch.Tensor | np.ndarray) -> dict[str, tuple[int, int]]:
        return self.store.tier_rows(ids)

    def totals(self) -> dict[str, tuple[int, int]]:
        return self.store.totals()

    def tier_stats(self) -> dict[str, dict[str, float]]:
        return self.store.tier_stats()

    def stats(self):
        return self.store.stats()

    def memory_bytes(self) -> dict[str, int]:
        return self.store.memory_bytes()

    def concurrent_gathers(self) -> bool:
        return self.store.concurrent_gathers()

    @property
    def backend(self):
        """The SSD read backend of the store in service (what :class:`training.metrics.Predictor` asks)."""
        return self.store.backend

    @property
    def notes(self) -> list[str]:
        return self.store.notes

    @property
    def feature_dtype(self) -> str | None:
        return self.store.feature_dtype

    def expected_shares(self) -> tuple[dict[str, float], list[tuple[float, int]]] | None:
        """After a move: the share of reads per tier the placement in service was planned for (on the epoch
        it counted), and ``(share, rows)`` per SSD bin: what :class:`training.metrics.Predictor` predicts
        with instead of ``place.json``'s. None before any move."""
        return self._expected

    # -- between epochs ----------------------------------------------------------------------------
    def epoch_record(self) -> dict:
        """The trainer's hook between epochs: this epoch's share of rows the caches served against what the
        last move predicted, the moves that ended since the last call; and a move started when due."""
        self._swap()
        now = self.store.totals()
        before = self._totals
        since = {k: (r - before.get(k, (0, 0))[0], n - before.get(k, (0, 0))[1]) for k, (r, n) in now.items()}
        self._totals = now
        self._epochs += 1
        with self._lock:
            moves, self._reports = self._reports, []
            swapped_at, self._swapped_at, gathers, self._gathers = self._swapped_at, [], self._gathers, 0
            running = self._ready is not None or (self._thread is not None and self._thread.is_alive())
        rec = {"fast_share": _fast_share(since), "predicted_fast_share": self._predicted, "moves": moves,
               "swaps": len(swapped_at), "swapped_at_gather": swapped_at, "gathers": gathers,
               "count_bytes": self.reads.nbytes, "moving": running}
        if not running and self._epochs % self.options.every_epochs == 0:
            hotness = self.reads.take()
            self._thread = threading.Thread(target=self._move, args=(hotness, self._epochs),
                                            name="moment-replace", daemon=True)
            self._thread.start()
            rec["moving"] = True
        return {"replacement": rec}

    def wait(self, timeout_s: float | None = None) -> None:
        """Until the move under way (if any) ends (tests, and :meth:`close`)."""
        t = self._thread
        if t is not None:
            t.join(timeout_s)

    def _stage(self, name: str) -> None:
        if self._on_stage is not None:
            self._on_stage(name)

    def _move(self, hotness: np.ndarray, epochs: int) -> None:
        """The mover thread: plan, stage, open the new store, commit, hand over (module doc)."""
        t0 = time.perf_counter()
        rec: dict = {"after_epochs": epochs}
        opened: list[FeatureStore] = []
        try:
            placement = self.placement
            targets = list(self._targets) if self._targets is not None else cache_targets(placement, hotness)
            rep = plan_replacement(placement, hotness, targets, pool=self.options.pool, policy=self.options.policy)
            total = float(rep.target.sum()) or 1.0
            rec.update(moved_rows=int(rep.moved.size), static_share=rep.cache_share(rep.static_traffic),
                       predicted_share=rep.cache_share(rep.predicted_traffic),
                       target_bin_shares=[round(float(t) / total, 6) for t in rep.target],
                       predicted_bin_shares=[round(float(t) / max(float(rep.predicted_traffic.sum()), 1e-300), 6)
                                             for t in rep.predicted_traffic])
            self._stage("planned")
            if not rep.moved.size or rec["predicted_share"] - rec["static_share"] < self.options.min_gain:
                rec["skipped"] = (f"the caches' predicted share of the counted reads rises by "
                                  f"{rec['predicted_share'] - rec['static_share']:.4f}, under `min_gain` "
                                  f"{self.options.min_gain}")
                return

            def before_commit(staged: Placement) -> None:
                self._stage("staged")
                opened.append(self._open(staged))

            rec.update(apply_replacement(rep, self.dir, self.features, before_commit=before_commit))
            self._stage("committed")
            back = load_placement(self.dir)  # the prediction re-checked on the placement as read back
            rec["rechecked_share"] = rep.cache_share(bin_traffic(back, hotness))
            rec["move_s"] = time.perf_counter() - t0
            with self._lock:
                self._ready = (opened.pop(), back, rec)
        except Exception as exc:  # a failed move leaves the run on the old placement: said, not raised
            log.warning("re-placement after epoch %d given up: %s", epochs, exc)
            rec["failed"] = str(exc)
            for s in opened:
                s.close()
        finally:
            rec.setdefault("move_s", time.perf_counter() - t0)
            with self._lock:
                self._reports.append(rec)

    def close(self) -> None:
        """End the move under way, then close every store (a store made ready but not swapped in too)."""
        self.wait()
        with self._lock:
            ready, self._ready = self._ready, None
            live, self._live.retired = self._live, True
        if ready is not None:
            ready[0].close()
        if live.users == 0:
            _close(live.store)


def _close(store: FeatureStore) -> None:
    """Close a store no gather uses any more (on a GPU, once the device is done with its tensors)."""
    if store.memory.accelerated:
        torch.cuda.synchronize(store.device)
    store.close()


def live_for_run(features: object, io: IOSpec, ds: Dataset, world_size: int) -> LiveReplacement:
    """A run's placement store (``features``, closed on a refusal) re-placed as ``io`` asks
    (``replace_every``, ``replace_count_every``, ``replace_min_gain``).

    Raises
    ------
    TrainError
        Several ranks, a placement sharded across nodes, or a dataset without features.npy to write
        moved rows from.
    """
    from training.features import open_store

    why = None
    if world_size > 1:
        why = (f"with {world_size} ranks: the ranks would have to swap placements at the same step; re-place in "
               "one process")
    elif not isinstance(features, FeatureStore):
        why = f"needs one placement's store, not {type(features).__name__} (a placement sharded across nodes?)"
    elif ds.features is None:
        why = f"needs the dataset's features.npy ({ds.path}) to write moved rows from"
    if why is not None or not isinstance(features, FeatureStore) or io.placement is None:
        getattr(features, "close", lambda: None)()
        raise TrainError(f"`replace_every` {io.replace_every} {why}; or leave `replace_every` at 0")
    store, directory, rows = features, io.placement, ds.features
    assert rows is not None  # refused above
    options = ReplaceOptions(io.replace_every, io.replace_count_every, io.replace_min_gain)
    return LiveReplacement(store, directory, rows, options,
                           lambda p: open_store(p, directory, rows, io.backend, transfer=store.transfer,
                                                capacities=io.capacities))
