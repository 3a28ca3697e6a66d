"""``tools/bench_replace.py --train``: the trainer, static DDAK against re-placement inside training (not a test).

    PYTHONPATH=. python tools/bench_replace.py --train [--nodes 100000] [--epochs 6] [--batches 30] [--repeats 2]

The drifting graph, its seeds and the first placement are ``bench_replace.py``'s. The graph becomes a dataset
on disk (features ``(nodes, dim)`` float32, 8 random labels, every vertex in the training split); both sides
train GraphSAGE with :func:`training.trainer.train` through a copy of the same placement (SSD bin read with
the ``posix`` backend), on the same drifting batches (a batch source whose epoch ``e`` draws its seeds from
the window of epoch ``e``). ``static`` keeps the placement; ``replaced`` runs with ``replace_every=1``
(``moment train --replace-every 1``): after each epoch a background thread re-runs DDAK on the rows the run
read and moves the changed rows while the next epoch trains, swapping stores between two gathers. Per epoch:
the share of rows the caches served (the epoch record's tiers), seeds/s, and for the re-placed side the
moves' rows, seconds and predicted share (on the counted epoch) against the share measured in the epoch
after the swap. Sides interleaved per repeat; shares, seeds/s and move times as medians with ranges.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

import numpy as np
import torch

from iostack.bins import write_bins
from iostack.placement import Placement
from training.sampler import NeighborSampler, SampledBatch
from training.specs import IOSpec, ModelSpec, RunSpec, SamplingSpec, TrainSpec
from training.trainer import train
from training.writer import DatasetWriter


class DriftSource:
    """The trainer's batch source: epoch ``e``'s batches from ``seeds[e]`` (``(steps, batch)``), the sampler
    reseeded per step so both sides draw the same neighbours."""

    def __init__(self, sampler: NeighborSampler, seeds: list[np.ndarray], seed: int) -> None:
        self.sampler, self.seeds, self.seed = sampler, seeds, seed

    def steps(self, epoch: int) -> int:
        return int(self.seeds[epoch % len(self.seeds)].shape[0])

    def batches(self, epoch: int, start_step: int = 0):
        for s in range(start_step, self.steps(epoch)):
            self.sampler.reseed(self.seed * 1_000_003 + epoch * 1009 + s)
            b: SampledBatch = self.sampler.sample(torch.from_numpy(self.seeds[epoch % len(self.seeds)][s]))
            yield b

    def close(self) -> None:
        pass


def write_dataset(d: Path, indptr: np.ndarray, indices: np.ndarray, feats: np.ndarray, seed: int) -> Path:
    with DatasetWriter(d, num_nodes=feats.shape[0], name="drifting") as w:
        w.write_csr(indptr, indices)
        w.write_features(feats)
        w.write_labels(np.random.default_rng(seed).integers(0, 8, feats.shape[0]), num_classes=8)
        w.write_splits(train=np.arange(feats.shape[0]))
    return d


def _fast(tiers: dict) -> float:
    rows = sum(v["rows"] for v in tiers.values())
    return sum(v["rows"] for k, v in tiers.items() if k != "ssd") / rows if rows else 0.0


def run_side(a: argparse.Namespace, ds: Path, first_dir: Path, d: Path, source: DriftSource, replaced: bool
             ) -> list[dict]:
    """One training run through a copy of the first placement: per epoch fast share, seeds/s, moves."""
    shutil.copytree(first_dir, d)
    fan = tuple(int(f) for f in a.fanouts.split(","))
    spec = TrainSpec(str(ds), model=ModelSpec("sage", hidden=a.hidden),
                     sampling=SamplingSpec(fan, batch_size=a.batch),
                     io=IOSpec(placement=str(d), backend="posix", check_dataset="open",
                               replace_every=1 if replaced else 0, replace_count_every=a.count_every,
                               replace_min_gain=a.min_gain),
                     run=RunSpec(epochs=a.epochs, seed=a.seed, eval_every_epochs=0))
    res = train(spec, source=source)
    out = []
    for rec in res.epochs:
        r = rec.get("replacement", {})
        out.append({"epoch": rec["epoch"], "fast_share": _fast(rec["tiers"]), "seeds_per_s": rec["seeds_per_s"],
                    "moves": [m for m in r.get("moves", []) if "rechecked_share" in m],
                    "predicted_fast_share": r.get("predicted_fast_share"), "swaps": r.get("swaps", 0),
                    "swapped_at": r.get("swapped_at_gather", []), "gathers": r.get("gathers", 0)})
    shutil.rmtree(d, ignore_errors=True)
    return out


def run_train(a: argparse.Namespace, tmp: Path, indptr: np.ndarray, indices: np.ndarray, feats: np.ndarray,
              first: Placement, epochs_seeds: list[np.ndarray]) -> dict[str, list[list[dict]]]:
    """Both sides, ``a.repeats`` times, interleaved."""
    ds = write_dataset(tmp / "ds", indptr, indices, feats, a.seed)
    first_dir = tmp / "first"
    write_bins(feats, first, first_dir, fsync=False)
    first.save(first_dir)
    fan = tuple(int(f) for f in a.fanouts.split(","))
    runs: dict[str, list[list[dict]]] = {"static": [], "replaced": []}
    for r in range(a.repeats):
        for side in runs:
            src = DriftSource(NeighborSampler(torch.from_numpy(indptr), torch.from_numpy(indices), fan), epochs_seeds,
                              a.seed)
            runs[side].append(run_side(a, ds, first_dir, tmp / f"{side}-{r}", src, side == "replaced"))
    return runs


def _mid(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3g} ({min(xs):.3g}-{max(xs):.3g})"


def report_train(a: argparse.Namespace, runs: dict[str, list[list[dict]]]) -> tuple[dict, list[str]]:
    """The table's lines, and the figures' numbers: mean fast share over epochs 1.. and seeds/s, per side."""
    st, rp = runs["static"], runs["replaced"]
    lines = [f"{'epoch':>5} {'static cache %':>15} {'replaced cache %':>17} {'predicted %':>12} {'moved rows':>11} "
             f"{'move s':>14} {'static seeds/s':>20} {'replaced seeds/s':>20}"]
    for e in range(a.epochs):
        moves = [m for run in rp for m in run[e]["moves"]]
        pred = [run[e]["predicted_fast_share"] for run in rp if run[e]["predicted_fast_share"] is not None]
        lines.append(f"{e:>5} {_mid([100 * run[e]['fast_share'] for run in st]):>15} "
                     f"{_mid([100 * run[e]['fast_share'] for run in rp]):>17} "
                     f"{(_mid([100 * p for p in pred]) if pred else '-'):>12} "
                     f"{(_mid([m['moved_rows'] for m in moves]) if moves else '-'):>11} "
                     f"{(_mid([m['move_s'] for m in moves]) if moves else '-'):>14} "
                     f"{_mid([run[e]['seeds_per_s'] for run in st]):>20} "
                     f"{_mid([run[e]['seeds_per_s'] for run in rp]):>20}")
    later = range(1, a.epochs)

    def per_run(runs_: list[list[dict]], key: str) -> list[float]:
        return [statistics.fmean(run[e][key] for e in later) for run in runs_]

    moves = [m for run in rp for rec in run for m in rec["moves"]]
    # a move's prediction (its counted epoch) against the next epoch's measured share, the first wholly after it
    ahead = [100 * (run[e]["predicted_fast_share"] - run[e + 1]["fast_share"]) for run in rp
             for e in range(a.epochs - 1) if run[e]["predicted_fast_share"] is not None]
    return {"share_s": per_run(st, "fast_share"), "share_r": per_run(rp, "fast_share"),
            "sps_s": per_run(st, "seeds_per_s"), "sps_r": per_run(rp, "seeds_per_s"),
            "moved": [m["moved_rows"] for m in moves], "move_s": [m["move_s"] for m in moves],
            "ahead": ahead}, lines
