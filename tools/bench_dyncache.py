"""Caches that fill on access against the static fill, on a graph whose hot set drifts (not a test).

    PYTHONPATH=. python tools/bench_dyncache.py [--nodes 200000] [--degree 12] [--dim 128]
        [--epochs 6] [--batches 40] [--batch 512] [--cache-share 0.1] [--repeats 3] [--json F]

The graph: every vertex links to ``degree`` others, most near it in id (within
``--local`` ids) and the rest to a global power-law hot set, so a mini-batch's
sampled rows follow its seeds. The seeds: epoch ``e`` trains on the vertices of a
window of ids that moves by ``--shift`` every epoch (a time split, as papers100M's
papers by year), so the hot set drifts. The features: a ``(nodes, dim)`` float32 file,
memory-mapped (its pages warm in the page cache: a miss costs a copy, not an SSD read).

Every policy of :data:`iostack.cachepolicy.CACHE_POLICIES` gathers the same batches
(sampled once with the project's ``NeighborSampler``, fan-outs ``--fanouts``) through
an :class:`iostack.dyncache.RowCache` of ``--cache-share`` of the rows, warm-started
with the static fill: the rows hottest in a pre-sampling of epoch 0 (as the placement
fills its caches). Per epoch: hit rate (distinct rows per batch found in the cache) and
seeds/s of the gathers (cache bookkeeping, row copies and the reads through the file);
policies run interleaved, ``--repeats`` times, medians and ranges of seeds/s. Hit rates
do not vary between repeats (same batches, deterministic policies). The reference of every
figure is ``static`` in the same run; the policy with the best mean hit rate after
epoch 0 is printed as the one to make the default.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _results import Figure, write

from iostack.cachepolicy import CACHE_POLICIES
from iostack.dyncache import RowCache
from training.sampler import NeighborSampler
from training.sharded.remote_cache import cache_rows


def drifting_graph(n: int, degree: int, local: int, hot_share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(indptr, indices)``: each vertex's ``degree`` neighbours, near it in id or in a power-law hot set."""
    rng = np.random.default_rng(seed)
    src = np.repeat(np.arange(n, dtype=np.int64), degree)
    near = (src + rng.integers(-local, local + 1, src.size)) % n
    far = np.minimum((rng.pareto(1.2, src.size) * n / 1000).astype(np.int64), n - 1)
    dst = np.where(rng.random(src.size) < hot_share, far, near)
    indptr = np.arange(0, n * degree + 1, degree, dtype=np.int64)
    return indptr, dst


def epoch_seeds(n: int, epoch: int, window: int, shift: int, batches: int, batch: int, seed: int) -> np.ndarray:
    """``(batches, batch)`` training seeds of epoch ``epoch`` from ids ``[epoch·shift, epoch·shift + window)`` (mod n),
    distinct within a batch."""
    rng = np.random.default_rng((seed, epoch))
    return (epoch * shift + np.argsort(rng.random((batches, window)), axis=1)[:, :batch]) % n


def run_policy(policy: str, capacity: int, feats: np.ndarray, warm: np.ndarray, epochs: list[list[np.ndarray]],
               seeds_per_batch: int) -> tuple[list[float], list[float], int]:
    """Gather every epoch's batches through a cache of ``policy``: hit rate and seeds/s per epoch, bookkeeping bytes."""
    cache = RowCache(capacity, feats.shape[0], feats.shape[1], policy=policy,
                     fallback=lambda ids: torch.from_numpy(feats[ids]))
    cache.warm(warm)
    rates, speeds = [], []
    for batches in epochs:
        cache.reset_counts()
        t0 = time.perf_counter()
        for n_id in batches:
            cache.gather(n_id)
        speeds.append(len(batches) * seeds_per_batch / (time.perf_counter() - t0))
        rates.append(cache.counts.hit_rate)
    return rates, speeds, cache.bookkeeping_bytes()


def drift_arguments(ap: argparse.ArgumentParser, *, nodes: int = 200_000, batches: int = 40, window: int = 20_000,
                    shift: int = 10_000) -> None:
    """The drifting graph's and seeds' options (this benchmark's, and ``tools/bench_replace.py``'s)."""
    ap.add_argument("--nodes", type=int, default=nodes)
    ap.add_argument("--degree", type=int, default=12)
    ap.add_argument("--local", type=int, default=2000, help="ids either side a near neighbour is drawn from")
    ap.add_argument("--hot-share", type=float, default=0.3, help="share of edges into the global hot set")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batches", type=int, default=batches, help="batches per epoch")
    ap.add_argument("--batch", type=int, default=512, help="seeds per batch")
    ap.add_argument("--window", type=int, default=window, help="ids an epoch's seeds come from")
    ap.add_argument("--shift", type=int, default=shift, help="ids the window moves per epoch")
    ap.add_argument("--fanouts", default="10,5")


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    drift_arguments(ap)
    ap.add_argument("--cache-share", type=float, default=0.1, help="cache rows as a share of the rows")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", help="where the feature file goes (default: a temporary directory)")
    ap.add_argument("--json")
    return ap.parse_args(argv)


def _batches(a: argparse.Namespace, indptr: np.ndarray, indices: np.ndarray, epoch: int, seed: int) -> list[np.ndarray]:
    sampler = NeighborSampler(indptr, indices, tuple(int(f) for f in a.fanouts.split(",")), seed=seed)
    seeds = epoch_seeds(a.nodes, epoch, a.window, a.shift, a.batches, a.batch, a.seed)
    return [sampler.sample(s).n_id.numpy() for s in seeds]


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    indptr, indices = drifting_graph(a.nodes, a.degree, a.local, a.hot_share, a.seed)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        path = Path(tmp) / "features.f32"
        feats = np.lib.format.open_memmap(path, "w+", np.float32, (a.nodes, a.dim))
        feats[:] = np.random.default_rng(a.seed).standard_normal((a.nodes, a.dim), np.float32)
        feats.flush()
        feats = np.load(path, mmap_mode="r")
        hot = np.zeros(a.nodes, np.int64)  # pre-sampling: epoch 0's seeds, another sampler draw
        for n_id in _batches(a, indptr, indices, 0, a.seed + 1000):
            hot[n_id] += 1
        capacity = int(a.cache_share * a.nodes)
        warm = cache_rows(hot, np.zeros(a.nodes, bool), capacity)
        epochs = [_batches(a, indptr, indices, e, a.seed + e) for e in range(a.epochs)]
        policies = CACHE_POLICIES.names()
        rates: dict[str, list[float]] = {}
        speeds: dict[str, list[list[float]]] = {p: [] for p in policies}
        book: dict[str, int] = {}
        for _ in range(a.repeats):
            for p in policies:  # interleaved: the machine's load falls on every policy alike
                rates[p], s, book[p] = run_policy(p, capacity, feats, warm, epochs, a.batch)
                speeds[p].append(s)
        del feats
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    return report(a, policies, rates, speeds, book, capacity, load0, load1)


def per_epoch_note(ours: list[float], static: list[float]) -> str:
    """A figure's note: a share per epoch, ours then the static fill's."""
    return "per epoch " + " ".join(f"{r:.3f}" for r in ours) + "; static " + " ".join(f"{r:.3f}" for r in static)


def report(a: argparse.Namespace, policies: list[str] | tuple[str, ...], rates: dict[str, list[float]],
           speeds: dict[str, list[list[float]]], book: dict[str, int], capacity: int, load0: list[str],
           load1: list[str]) -> int:
    """Print the table, name the best policy and write the figures."""
    whole = {p: [sum(r) / len(r) for r in speeds[p]] for p in policies}  # seeds/s over all epochs, per repeat
    med = {p: statistics.median(whole[p]) for p in policies}
    after = {p: float(np.mean(rates[p][1:] or rates[p])) for p in policies}
    print(f"{a.nodes:,} rows, cache {capacity:,} rows ({a.cache_share:.0%}), {a.epochs} epochs × {a.batches} "
          f"batches × {a.batch} seeds; window {a.window:,} moving {a.shift:,}/epoch; load {' '.join(load0)} → "
          f"{' '.join(load1)}; features warm in the page cache")
    print(f"{'policy':8} {'hit rate per epoch':48} {'mean e≥1':>8} {'seeds/s (median, range)':>30} {'book':>9}")
    for p in policies:
        per = " ".join(f"{r:.3f}" for r in rates[p])
        rng = f"{med[p]:,.0f} ({min(whole[p]):,.0f}–{max(whole[p]):,.0f})"
        print(f"{p:8} {per:48} {after[p]:8.3f} {rng:>30} {book[p] / 2**20:7.1f}Mi")
    best = max((p for p in policies if p != "static"), key=lambda p: (after[p], med[p]))
    print(f"best hit rate after epoch 0: {best} ({after[best]:.3f} against static {after['static']:.3f}); "
          f"seeds/s {med[best] / med['static']:.2f}× static")
    figs = []
    for p in policies:
        if p == "static":
            continue
        figs.append(Figure("dyncache", f"{p}: hit rate, mean of epochs 1..{a.epochs - 1}", "share", after[p],
                           after["static"], "static fill", True, "above static",
                           per_epoch_note(rates[p], rates["static"])))
        figs.append(Figure("dyncache", f"{p}: seeds/s of the gathers (median of {a.repeats})", "seeds/s", med[p],
                           med["static"], "static fill", True, "",
                           f"range {min(whole[p]):,.0f}–{max(whole[p]):,.0f}; bookkeeping "
                           f"{book[p] / 2**20:.1f} MiB; load {' '.join(load0)}"))
    write(a.json, "dyncache", figs, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
