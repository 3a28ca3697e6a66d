"""Re-placement between epochs against the static DDAK placement, on a graph whose hot set drifts (not a test).

    PYTHONPATH=. python tools/bench_replace.py [--nodes 100000] [--epochs 6] [--batches 30] [--repeats 2] [--json F]

The graph and the seeds are ``tools/bench_dyncache.py``'s: neighbours near in id plus a global power-law hot
set; epoch ``e`` trains on a window of ids that moves by ``--shift`` every epoch (a time split), so the rows
read drift. The placement: a GPU bin of ``--gpu-share`` of the rows, a CPU bin of ``--cpu-share``, one SSD bin
file for all (float32 rows, ``--dim`` features), placed by DDAK from a pre-sampling of epoch 0 with targets
that ask each cache for all it can serve (the hottest rows up to its capacity).

Both sides gather the same sampled batches through :class:`iostack.store.FeatureStore` (SSD rows read with
the ``posix`` backend). ``static`` keeps the first placement. ``replaced`` counts the rows its gathers read
(:class:`training.place.replace.RowReads`, every ``--count-every``-th batch) and between epochs re-runs DDAK
on them (:func:`~training.place.replace.plan_replacement`), writes only the moved rows that land in the SSD
bin (:func:`~training.place.replace.apply_replacement`) and reopens the store on the new placement. Per epoch:
the share of rows the caches served (the tier counters of the store), the rows moved and the seconds the move
took, seeds/s of the gathers; and the plan's prediction re-checked after the move (the cache share the counted
reads have on the placement read back from disk, against the plan's). Sides interleaved per repeat; shares
are the same every repeat (same batches), seeds/s medians and ranges. The move runs between epochs here, not
yet in a background thread beside training: ``--train`` runs the trainer with the move in the background
(``tools/bench_replace_train.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import Figure, write  # noqa: E402
from bench_dyncache import drift_arguments, drifting_graph, epoch_seeds  # noqa: E402
from bench_replace_train import report_train, run_train  # noqa: E402

from iostack.bins import write_bins  # noqa: E402
from iostack.placement import Bin, Placement, load_placement  # noqa: E402
from iostack.store import FeatureStore  # noqa: E402
from planner.placement import DdakBin  # noqa: E402
from planner.policies import place_items  # noqa: E402
from training.place.replace import RowReads, apply_replacement, bin_traffic, plan_replacement  # noqa: E402
from training.sampler import NeighborSampler  # noqa: E402


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    drift_arguments(ap, nodes=100_000, batches=30, window=20_000, shift=5_000)
    ap.add_argument("--gpu-share", type=float, default=0.03)
    ap.add_argument("--cpu-share", type=float, default=0.07)
    ap.add_argument("--count-every", type=int, default=2, help="count the rows of every k-th batch")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", help="where the bins go (default: a temporary directory under /var/tmp)")
    ap.add_argument("--train", action="store_true",
                    help="train GraphSAGE with the trainer, static against --replace-every 1 (bench_replace_train.py)")
    ap.add_argument("--hidden", type=int, default=64, help="--train: the model's width")
    ap.add_argument("--min-gain", type=float, default=0.01, help="--train: replace_min_gain")
    ap.add_argument("--json")
    return ap.parse_args(argv)


def _placement(a: argparse.Namespace, hot: np.ndarray) -> tuple[Placement, list[float]]:
    """DDAK's placement of ``hot`` in a GPU, a CPU and an SSD bin, and the targets it was made with."""
    n = a.nodes
    bins = (Bin(0, "gpu", int(a.gpu_share * n)), Bin(1, "cpu", int(a.cpu_share * n)), Bin(2, "ssd", n, "ssd0.bin"))
    order = np.sort(hot)[::-1]
    g, c = bins[0].capacity_rows, bins[1].capacity_rows
    # each cache's target: all the hotness of the hottest rows it has room for; the SSD the rest
    targets = [float(order[:g].sum()), float(order[g:g + c].sum()), max(float(order[g + c:].sum()), 1e-9)]
    res = place_items("ddak", hot, [DdakBin(str(b.id), b.kind, b.capacity_rows, t)
                                    for b, t in zip(bins, targets, strict=True)], pool=100)
    return Placement(bins, res.bin_of, res.row_of), targets


def _cache_share(tiers: dict[str, tuple[int, int]]) -> float:
    total = sum(r for r, _ in tiers.values())
    return sum(r for k, (r, _) in tiers.items() if k != "ssd") / total if total else 0.0


def _epoch(store: FeatureStore, batches: list[np.ndarray], reads: RowReads | None) -> tuple[float, float]:
    """(cache share of the rows read, seeds/s) of one epoch's gathers."""
    store.reset_stats()
    t = time.perf_counter()
    for n_id in batches:
        store.gather(torch.from_numpy(n_id))
        if reads is not None:
            reads.observe(n_id)
    s = time.perf_counter() - t
    return _cache_share(store.totals()), len(batches) * batches[0].size / s if s else 0.0


def run_side(a, d: Path, feats: np.ndarray, first: Placement, targets: list[float], epochs: list, replaced: bool):
    """Per epoch: cache share, seeds/s, rows moved after it, seconds of the move, predicted and re-checked share."""
    write_bins(feats, first, d, fsync=False)
    first.save(d)
    out: list[dict] = []
    reads = RowReads(a.nodes, a.count_every) if replaced else None
    placement = load_placement(d)
    for e, batches in enumerate(epochs):
        with FeatureStore(placement, d, features=feats, backend="posix") as store:
            share, sps = _epoch(store, batches, reads)
        rec = {"epoch": e, "cache_share": share, "seeds_per_s": sps}
        if reads is not None and e + 1 < len(epochs):
            h = reads.take()
            t = time.perf_counter()
            rep = plan_replacement(placement, h, targets, pool=100)
            moved = apply_replacement(rep, d, feats, fsync=False)
            rec["move_s"] = time.perf_counter() - t
            placement = load_placement(d)
            rec.update(moved_rows=int(rep.moved.size), ssd_rows_written=moved["rows_written"],
                       predicted_share=rep.cache_share(rep.predicted_traffic),
                       static_share_of_counts=rep.cache_share(rep.static_traffic),
                       rechecked_share=rep.cache_share(bin_traffic(placement, h)))
        out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    load0 = os.getloadavg()
    indptr, indices = drifting_graph(a.nodes, a.degree, a.local, a.hot_share, a.seed)
    fan = tuple(int(f) for f in a.fanouts.split(","))

    def batches(epoch: int, seed: int) -> list[np.ndarray]:
        sampler = NeighborSampler(indptr, indices, fan, seed=seed)
        seeds = epoch_seeds(a.nodes, epoch, a.window, a.shift, a.batches, a.batch, a.seed)
        return [sampler.sample(s).n_id.numpy() for s in seeds]

    feats = np.random.default_rng(a.seed).standard_normal((a.nodes, a.dim), np.float32)
    hot = np.zeros(a.nodes, np.float32)  # pre-sampling: epoch 0's seeds, another sampler draw
    for n_id in batches(0, a.seed + 1000):
        hot[n_id] += 1
    first, targets = _placement(a, hot)
    if a.train:
        seeds = [epoch_seeds(a.nodes, e, a.window, a.shift, a.batches, a.batch, a.seed) for e in range(a.epochs)]
        with tempfile.TemporaryDirectory(dir=a.dir or "/var/tmp", prefix="moment-bench-replace-") as tmp:
            truns = run_train(a, Path(tmp), indptr, indices, feats, first, seeds)
        return report_trained(a, truns, load0, os.getloadavg())
    epochs = [batches(e, a.seed + e) for e in range(a.epochs)]
    runs: dict[str, list[list[dict]]] = {"static": [], "replaced": []}
    with tempfile.TemporaryDirectory(dir=a.dir or "/var/tmp", prefix="moment-bench-replace-") as tmp:
        for r in range(a.repeats):
            for side in runs:  # interleaved: the machine's load falls on both alike
                runs[side].append(run_side(a, Path(tmp) / f"{side}-{r}", feats, first, targets, epochs,
                                           side == "replaced"))
    return report(a, runs, load0, os.getloadavg())


def report(a, runs: dict[str, list[list[dict]]], load0, load1) -> int:
    st, rp = runs["static"], runs["replaced"]
    print(f"{'epoch':>5} {'static cache %':>15} {'replaced cache %':>17} {'moved rows':>11} {'move s':>8} "
          f"{'predicted %':>12} {'re-checked %':>13} {'static seeds/s':>16} {'replaced seeds/s':>17}")
    for e in range(a.epochs):
        r0 = rp[0][e]
        sps_s = [run[e]["seeds_per_s"] for run in st]
        sps_r = [run[e]["seeds_per_s"] for run in rp]
        print(f"{e:>5} {100 * st[0][e]['cache_share']:>15.1f} {100 * r0['cache_share']:>17.1f} "
              f"{r0.get('moved_rows', 0):>11,} {statistics.median(run[e].get('move_s', 0) for run in rp):>8.2f} "
              f"{100 * r0.get('predicted_share', float('nan')):>12.1f} "
              f"{100 * r0.get('rechecked_share', float('nan')):>13.1f} "
              f"{statistics.median(sps_s):>16,.0f} {statistics.median(sps_r):>17,.0f}")
    later = range(1, a.epochs)
    share_s = statistics.fmean(st[0][e]["cache_share"] for e in later)
    share_r = statistics.fmean(rp[0][e]["cache_share"] for e in later)
    sps_s = [statistics.fmean(run[e]["seeds_per_s"] for e in later) for run in st]
    sps_r = [statistics.fmean(run[e]["seeds_per_s"] for e in later) for run in rp]
    moved = [rp[0][e]["moved_rows"] for e in range(a.epochs - 1)]
    move_s = [run[e]["move_s"] for run in rp for e in range(a.epochs - 1)]
    what = (f"drifting graph {a.nodes:,} nodes, caches {a.gpu_share:.0%} GPU + {a.cpu_share:.0%} CPU of the rows, "
            f"epochs 1-{a.epochs - 1}")
    figures = [
        Figure("replace", f"{what}: share of rows served by the caches, re-placed vs static DDAK", "% rows",
               100 * share_r, 100 * share_s, "static DDAK (placed once from epoch 0)",
               target="re-placement wins back what the drift takes",
               note=f"mean over epochs; moved {min(moved):,}-{max(moved):,} rows a time, "
                    f"{statistics.median(move_s):.2f} s median ({min(move_s):.2f}-{max(move_s):.2f}) per move, "
                    "between epochs"),
        Figure("replace", f"{what}: gather seeds/s, re-placed vs static DDAK", "seeds/s",
               statistics.median(sps_r), statistics.median(sps_s), "static DDAK",
               note=f"median of {a.repeats} repeats (re-placed {min(sps_r):,.0f}-{max(sps_r):,.0f}, static "
                    f"{min(sps_s):,.0f}-{max(sps_s):,.0f}); SSD rows by the posix backend (O_DIRECT where the file "
                    "system has it), a store opened per epoch"),
    ]
    err = max(abs(rp[0][e]["rechecked_share"] - rp[0][e]["predicted_share"]) for e in range(a.epochs - 1))
    # the plan predicts the counted epoch's reads; the next epoch reads rows the drift moved on
    ahead = [100 * (rp[0][e]["predicted_share"] - rp[0][e + 1]["cache_share"]) for e in range(a.epochs - 1)]
    print(f"cache share epochs 1-{a.epochs - 1}: static {100 * share_s:.1f} %, re-placed {100 * share_r:.1f} %; "
          f"the prediction re-checked on the placement read back after each move: largest difference "
          f"{100 * err:.2g} points; predicted (counted epoch) minus measured in the next epoch: "
          f"{min(ahead):.1f} to {max(ahead):.1f} points (the drift between them)")
    figures[0] = dataclasses.replace(figures[0], note=figures[0].note + f"; the plan's predicted share minus the "
                                     f"next epoch's measured one: {min(ahead):.1f} to {max(ahead):.1f} points (the "
                                     f"drift in one epoch); on the counted reads it holds to {100 * err:.2g} points")
    return _finish(a, figures, load0, load1)


def _finish(a, figures: list[Figure], load0, load1) -> int:
    """The load before and after, and the figures written (``--json``)."""
    print(f"load average {' '.join(f'{x:.2f}' for x in load0)} -> {' '.join(f'{x:.2f}' for x in load1)}; "
          f"{os.cpu_count()} cores shared with other jobs")
    write(a.json, "bench_replace", figures, " ".join(sys.argv))
    return 0


def report_trained(a, runs: dict[str, list[list[dict]]], load0, load1) -> int:
    """``--train``: the table and the figures of the trainer's runs."""
    f, lines = report_train(a, runs)
    print("\n".join(lines))
    what = (f"trainer (GraphSAGE), drifting graph {a.nodes:,} nodes, caches {a.gpu_share:.0%} GPU + "
            f"{a.cpu_share:.0%} CPU of the rows, epochs 1-{a.epochs - 1}")
    moves = (f"moved {min(f['moved']):,}-{max(f['moved']):,} rows a time, {statistics.median(f['move_s']):.2f} s "
             f"median ({min(f['move_s']):.2f}-{max(f['move_s']):.2f}) per move in the background"
             if f["moved"] else "no move")
    ahead = (f"; a move's predicted share minus the next epoch's measured one: {min(f['ahead']):.1f} to "
             f"{max(f['ahead']):.1f} points" if f["ahead"] else "")
    overlap = min(f["sps_r"]) <= max(f["sps_s"]) and min(f["sps_s"]) <= max(f["sps_r"])
    figures = [
        Figure("replace_train", f"{what}: share of rows served by the caches, --replace-every 1 vs static DDAK",
               "% rows", 100 * statistics.median(f["share_r"]), 100 * statistics.median(f["share_s"]),
               "static DDAK (placed once from epoch 0)", target="re-placement inside training wins back the caches",
               note=f"median over {a.repeats} repeats of the mean over epochs (re-placed "
                    f"{100 * min(f['share_r']):.1f}-{100 * max(f['share_r']):.1f}, static "
                    f"{100 * min(f['share_s']):.1f}-{100 * max(f['share_s']):.1f}); {moves}{ahead}"),
        Figure("replace_train", f"{what}: training seeds/s, --replace-every 1 vs static DDAK", "seeds/s",
               statistics.median(f["sps_r"]), statistics.median(f["sps_s"]), "static DDAK",
               note=f"median of {a.repeats} repeats (re-placed {min(f['sps_r']):,.0f}-{max(f['sps_r']):,.0f}, "
                    f"static {min(f['sps_s']):,.0f}-{max(f['sps_s']):,.0f}"
                    f"{': the ranges overlap, no difference shown' if overlap else ''}); CPU only, SSD rows by "
                    "the posix backend; the move's copy and the new store's fill share the cores with training"),
    ]
    print(f"cache share epochs 1-{a.epochs - 1} (median of repeats): static "
          f"{100 * statistics.median(f['share_s']):.1f} %, re-placed {100 * statistics.median(f['share_r']):.1f} %; "
          f"{moves}{ahead}")
    return _finish(a, figures, load0, load1)


if __name__ == "__main__":
    sys.exit(main())
