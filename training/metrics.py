"""What a run reports: JSON-lines records, an epoch's running sums, its I/O against the placement's prediction.

Records are dicts (``kind`` ``"start"``, ``"step"``, ``"epoch"``); times in
seconds, sizes in bytes. :class:`Sums` are saved in mid-epoch checkpoints so
that a resumed epoch reports as the uninterrupted one would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iostack.transfer import TransferCounts
from momentbase.jsontypes import JsonObject
from training.errors import TrainError

if TYPE_CHECKING:  # the specs pull in torch's models: only for the annotations
    from training.data import Dataset
    from training.specs import IOSpec


def new_run_id() -> str:
    """A fresh run id: the UTC second the run began and a random suffix (sorts by time, never repeats)."""
    import time
    import uuid

    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def _is_resume(rec: dict) -> bool:
    return rec.get("kind") == "start" and bool(rec.get("start_epoch") or rec.get("start_step"))


class JsonlWriter:
    """Appends one JSON object per line, flushed per line (a resumed run continues the file).

    Every record carries ``run``, the id of the run that wrote it, so that runs appended to
    one file stay apart when read back (:func:`training.runreport.read_runs`); a resumed run
    keeps the id of the run it resumes (:meth:`rewind`).
    """

    def __init__(self, path: str | os.PathLike, run_id: str | None = None) -> None:
        p = Path(path)
        if not p.parent.is_dir():
            raise TrainError(f"{path}: directory {p.parent} does not exist; create it or pick another metrics file")
        try:
            self._f = open(p, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close(), lives for the run
        except OSError as exc:
            raise TrainError(f"{path}: cannot write metrics there ({exc.strerror})") from None
        self.run_id = run_id or new_run_id()

    def write(self, record: dict) -> None:
        self._f.write(json.dumps({"run": self.run_id, **record}) + "\n")
        self._f.flush()

    def rewind(self, epoch: int, step: int) -> None:
        """Drop the resumed run's step and epoch records at or after ``(epoch, step)``: the run resumed
        from a checkpoint there redoes them, and the file should hold each once (written atomically).

        The resumed run is the file's last run (from its last ``start`` record that is not itself a
        resume); its id is kept, and earlier runs' records are left as they are.
        """
        path = Path(self._f.name)
        self._f.close()
        recs = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut short by the crash that made this a resume
            recs.append((line, r if isinstance(r, dict) else {}))
        first = max((i for i, (_, r) in enumerate(recs) if r.get("kind") == "start" and not _is_resume(r)), default=0)
        if recs and recs[first][1].get("run"):
            self.run_id = recs[first][1]["run"]
        kept = []
        for i, (line, r) in enumerate(recs):
            mine = i >= first and r.get("run", self.run_id) == self.run_id
            if mine and r.get("kind") == "step" and (r.get("epoch", 0), r.get("step", 0)) >= (epoch, step):
                continue
            if mine and r.get("kind") == "epoch" and r.get("epoch", 0) >= epoch:
                continue
            kept.append(line)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
        os.replace(tmp, path)
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close()

    def close(self) -> None:
        self._f.close()


class RankRecords:
    """A run's records as every task's trainer emits them: each gains ``rank``, ``world_size`` and ``task``; rank 0
    appends them to ``metrics_path`` (None: no file), and every rank passes them to ``progress``.

    >>> seen = []
    >>> emit = RankRecords(None, rank=1, world_size=2, task="link", progress=seen.append)
    >>> emit({"kind": "epoch", "epoch": 0}); emit.close()
    >>> seen
    [{'rank': 1, 'world_size': 2, 'task': 'link', 'kind': 'epoch', 'epoch': 0}]
    """

    def __init__(self, metrics_path: str | os.PathLike | None, *, rank: int, world_size: int, task: str,
                 progress: Callable[[dict], None] | None = None) -> None:
        self._file = JsonlWriter(metrics_path) if metrics_path and rank == 0 else None
        self._tags = {"rank": rank, "world_size": world_size, "task": task}
        self._progress = progress

    def __call__(self, rec: dict) -> None:
        rec = {**self._tags, **rec}
        if self._file is not None:
            self._file.write(rec)
        if self._progress is not None:
            self._progress(rec)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class Sums:
    """Running sums of an epoch (saved in mid-epoch checkpoints)."""

    KEYS = ("seeds", "loss_sum", "correct", "sample_s", "gather_s", "compute_s", "allreduce_s", "io_wait_s",
            "step_s", "prior_s", "share_wait_s")  # prior_s: time the epoch ran before the checkpoint it resumed from

    def __init__(self, state: dict | None = None) -> None:
        self.v: dict[str, float] = {k: 0.0 for k in self.KEYS}
        self.tiers: dict[str, list[int]] = {}
        if state:
            self.v.update(state["v"])
            self.tiers = {k: list(x) for k, x in state["tiers"].items()}

    def state(self) -> dict:
        return {"v": dict(self.v), "tiers": {k: list(x) for k, x in self.tiers.items()}}


def add_step(sums: Sums, rec: dict, tiers: dict[str, tuple[int, int]], loss_total: float, hits: float) -> None:
    """A step record (and its summed loss and hits) into the epoch's running sums."""
    v = sums.v
    v["seeds"] += rec["seeds"]
    v["loss_sum"] += loss_total
    v["correct"] += hits
    for k in ("sample_s", "gather_s", "compute_s", "allreduce_s", "io_wait_s", "step_s", "share_wait_s"):
        v[k] += rec.get(k, 0.0)
    for k, (r, n) in tiers.items():
        acc = sums.tiers.setdefault(k, [0, 0])
        acc[0] += r
        acc[1] += n


def moved_since(before: TransferCounts, now: TransferCounts) -> dict[str, list[int]]:
    """Copies and bytes per route (``pinned->device``, ...) between two counts of a transfer."""
    out = {}
    for (src, dst), (n, b) in now.by_route.items():
        n0, b0 = before.by_route.get((src, dst), (0, 0))
        if n > n0:
            out[f"{src}->{dst}"] = [n - n0, b - b0]
    return out


class Predictor:
    """Per epoch: the placement's predicted I/O against the store's counters (:mod:`training.prediction`)."""

    def __init__(self, store: Any, shares: dict[str, float], row_bytes: int, rates: dict,
                 ssd_bins: list[tuple[float, int]], report: JsonObject | None = None,
                 device_rates: dict | None = None, concurrent_bins: bool | None = None) -> None:
        from training.throughput import plan_inlet_from_place_report, ssd_targets_from_place_report

        self.store, self.shares, self.row_bytes, self.rates = store, shares, row_bytes, rates
        self.ssd_bins, self.device_rates = ssd_bins, device_rates or {}
        # whether the store reads a gather's SSD bins at once (the busiest device sets the time) or one
        # after another (the sum): the backend's ``concurrent_bins`` where it has one, else one after another
        self.concurrent_bins = (bool(getattr(getattr(store, "backend", None), "concurrent_bins", False))
                                if concurrent_bins is None else bool(concurrent_bins))
        self.readers, self.shared, self.index = 1, False, 0
        self._before: dict[str, dict[str, float]] = {}
        self._bins_before: dict[int, tuple[float, float]] = {}
        self._bins_now: dict[int, tuple[float, float]] = {}
        # the paper's terms (training.throughput): the plan's inlet per GPU, each SSD bin's target
        self.plan_inlet = plan_inlet_from_place_report(report) if report else {}
        self.ssd_targets = ssd_targets_from_place_report(report) if report else []
        self.plan_machine = str(report["machine"]) if report and report.get("machine") else None

    def node(self, readers: int, shared: bool, index: int = 0) -> None:
        """The ranks of this node reading the same SSDs at the same time, and whether they share pages
        (:func:`training.prediction.predict_epoch`); ``index``: this rank's place among them (its GPU in
        the plan's order)."""
        self.readers, self.shared, self.index = max(1, int(readers)), bool(shared), max(0, int(index))

    def _bin_counts(self) -> dict[int, tuple[float, float]]:
        """``(rows, requests)`` the store counted per bin id so far."""
        stats = self.store.stats() if self.ssd_targets and hasattr(self.store, "stats") else []
        return {int(b.bin_id): (float(b.rows), float(b.requests)) for b in stats}

    def _since(self, col: int) -> dict[int, float]:
        return {b: v[col] - self._bins_before.get(b, (0.0, 0.0))[col] for b, v in self._bins_now.items()}

    @classmethod
    def for_run(cls, io: IOSpec, features: Any, ds: Dataset) -> Predictor | None:
        """One where the features come through a placement that ``moment place`` reported on (``io.placement``);
        its read rates from ``io.capacities``, a ``moment profile`` file, when given."""
        from training.prediction import (
            device_rates_from_capacities,
            load_place_report,
            rates_from_capacities,
            shares_from_place_report,
            ssd_bins_from_place_report,
        )

        store = features if hasattr(features, "tier_stats") else getattr(features, "store", None)
        report = load_place_report(io.placement) if io.placement else None
        if store is None or report is None or not hasattr(store, "tier_stats"):
            return None
        rates, per_device = {}, {}
        if io.capacities:
            from planner.capacities import load_capacities

            caps = load_capacities(io.capacities)
            rates, per_device = rates_from_capacities(caps), device_rates_from_capacities(caps)
        return cls(store, shares_from_place_report(report), int(report.get("row_bytes") or ds.row_bytes), rates,
                   ssd_bins_from_place_report(report), report, device_rates=per_device)

    def start(self) -> None:
        self._before = self.store.tier_stats()
        self._bins_before = self._bin_counts()

    def finish(self, epoch: int, steps: int):
        from training.prediction import predict_epoch

        now = self.store.tier_stats()
        self._bins_now = self._bin_counts()
        keys = ("rows", "bytes", "requests", "seconds", "cpu_wait_s")
        measured = {t: {k: v.get(k, 0) - self._before.get(t, {}).get(k, 0) for k in keys} for t, v in now.items()}
        per_bin = self._since(1)
        requests: dict[str, float] = {}
        for b, dev, _, _ in self.ssd_targets:
            requests[dev] = requests.get(dev, 0.0) + per_bin.get(b, 0.0)
        # a placement re-placed while training (training.place.live) predicts with its new shares
        replaced = getattr(self.store, "expected_shares", lambda: None)()
        shares, ssd_bins = replaced if replaced is not None else (self.shares, self.ssd_bins)
        return predict_epoch(epoch, shares, measured, row_bytes=self.row_bytes, rates=self.rates,
                             steps=steps, ssd_bins=ssd_bins, readers=self.readers, shared=self.shared,
                             ssd_devices=[dev for _, dev, _, _ in self.ssd_targets], device_rates=self.device_rates,
                             # node-shared reads go bin by bin (iostack.nodeshare's tier), whatever the backend
                             concurrent_bins=self.concurrent_bins and not self.shared,
                             device_requests=requests or None)


    def throughput(self, record: JsonObject, prediction, read_calls: int) -> JsonObject:
        """The epoch in the paper's terms (:func:`training.throughput.epoch_throughput`), after :meth:`finish`:
        ``record`` the epoch record, ``prediction`` what :meth:`finish` returned."""
        from training.throughput import epoch_throughput

        rows = self._since(0)
        return epoch_throughput(record, prediction, plan_inlet=self.plan_inlet, rank_index=self.index,
                                readers=self.readers, read_calls=read_calls, bin_rows=rows,
                                ssd_targets=self.ssd_targets, plan_machine=self.plan_machine).to_dict()


def epoch_record(epoch: int, steps: int, sums: Sums, epoch_s: float) -> dict:
    v = sums.v
    seeds = v["seeds"] or 1
    return {"kind": "epoch", "epoch": epoch, "steps": steps, "seeds": int(v["seeds"]), "epoch_s": epoch_s,
            "seeds_per_s": v["seeds"] / epoch_s if epoch_s > 0 else 0.0, "loss": v["loss_sum"] / seeds,
            "train_acc": v["correct"] / seeds, "io_wait_share": v["io_wait_s"] / epoch_s if epoch_s > 0 else 0.0,
            **{k: v.get(k, 0.0) for k in ("sample_s", "gather_s", "compute_s", "allreduce_s", "io_wait_s",
                                          "share_wait_s")},
            "tiers": {k: {"rows": r, "bytes": n} for k, (r, n) in sums.tiers.items()}}


__all__ = ["JsonlWriter", "RankRecords", "new_run_id", "Predictor", "Sums", "add_step", "epoch_record", "moved_since"]
