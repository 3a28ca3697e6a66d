"""DDAK against the hash baseline: time and memory at scale, target match, reads on a skewed graph (not a test).

    PYTHONPATH=. python tools/bench_ddak.py [--items 1e8] [--zipf 0.9] [--pool 100]
        [--graph-nodes 200000] [--graph-edges 2000000] [--skip-scale | --scale-only] [--no-cold] [--json F]

    PYTHONPATH=. python tools/bench_ddak.py --items 1e9 --scale-only --json ddak-1e9.json
        # the paper's size (0.79 B vertices); needs about 4 GB for the hotness, plus 12-13 GB
        # in the placer's own child; check `free -g` first

One run prints three figures.

1. **Scale.** Zipf hotness (float32, ``1 / rank**a`` with ranks a seeded
   permutation) for ``--items`` items and 10 bins — 2 GPU (5 % of the items
   each, 20 % of the traffic each), 2 CPU (10 %, 10 %), 6 SSD (20 %, 40/6 %)
   — targets that are feasible with room to spare. Each placer runs in its
   own forked child, so its peak memory (``resource.getrusage`` ru_maxrss
   minus the child's resident size at the start, the hotness included in
   neither) is its own; wall time is measured around the call, and so is
   CPU time (user + system), which a busy machine changes far less, and the
   cores the placer kept busy (CPU/wall; a line starting "WARNING" below
   1.6 on 2 or more cores; its spread over threads, CPU time over the busiest
   thread's, tells a busy machine from serial work: tools/_results.py
   ``CpuMeter``).
   The goals: 10⁸ items in 10 s and 3 GB; 10⁹ items (issue 16) in 40 s on
   2 cores with CPU/wall ≥ 1.6, and 16 GB beyond the input. DDAK runs twice,
   first with an empty kernel cache (``NUMBA_CACHE_DIR`` a fresh directory:
   a user's first placement, which compiles the kernels) and then with it
   filled (the figures); ``--no-cold`` skips the first.
2. **Target match.** The same 10 bins on 10⁶ items for several Zipf
   exponents and pools of 100 and 1: max relative deviation of bin traffic
   from target, DDAK and hash. Targets count as feasible when the GPU (and
   GPU + CPU) bins' targets fit in the hotness of as many hottest items as
   they hold, and the hottest pool is no larger than the smallest target
   (a hotter pool overshoots whichever bin takes it).
3. **A skewed graph on Machine B.** A Chung–Lu power-law graph
   (:mod:`training.synth`) is pre-sampled (fan-outs 25,10), a plan of the
   bundled ``moment-b`` (2 sockets) is made for GPU caches of 5 % of the rows
   and host caches of 10 % per socket, and DDAK and hash fill the same bins:
   expected SSD bytes per epoch and cross-socket share of the bytes the GPUs
   receive, with the ratio (the paper reports 8.7–18.1 % less cross-socket
   traffic than hash).

Figures 1 and 3 measure ours and the baseline in the same run and print the ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import tempfile

import numpy as np
from _results import CpuMeter, CpuUse, Figure, write

from planner.baselines import hash_placement
from planner.ddak import ddak
from planner.placement import DdakBin


def zipf_hotness(n: int, a: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if n <= 1 << 28:
        rank = rng.permutation(n).astype(np.float32)
    else:  # 4n bytes, not permutation's 8n + 4n (12 GB at 10^9): shuffle uint32 ranks, convert in place
        ids = np.arange(n, dtype=np.uint32)
        rng.shuffle(ids)
        rank = ids.view(np.float32)
        for a0 in range(0, n, 1 << 24):
            rank[a0 : a0 + (1 << 24)] = ids[a0 : a0 + (1 << 24)]  # numpy buffers the overlapping copy
        del ids
    rank += 1.0
    np.power(rank, -a, out=rank)
    return rank


def bins_for(n: int) -> list[DdakBin]:
    return (
        [DdakBin(f"gpu{i}", "gpu", n // 20, 0.2) for i in range(2)]
        + [DdakBin(f"cpu{i}", "cpu", n // 10, 0.1) for i in range(2)]
        + [DdakBin(f"ssd{i}", "ssd", n // 5, 0.4 / 6) for i in range(6)]
    )


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _child(which: str, h: np.ndarray, pool: int, cache_dir: str, out) -> None:
    # numba reads NUMBA_CACHE_DIR when first imported, here (the parent never imports it)
    os.environ["NUMBA_CACHE_DIR"] = cache_dir
    try:  # short of memory (10⁹ items on a shared machine), the kernel kills this child first
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    start = _rss_bytes()
    bins = bins_for(h.shape[0])
    with CpuMeter() as m:
        r = ddak(h, bins, pool=pool) if which == "ddak" else hash_placement(h, bins)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.send((m.use.wall_s, max(0, peak - start), r.max_relative_deviation, r.items_per_bin.tolist(),
              m.use.cpu_s, m.use))
    out.close()


def _compile(cache_dir: str) -> None:
    os.environ["NUMBA_CACHE_DIR"] = cache_dir
    from planner import compiled

    compiled.prepare()


def _fill_cache(cache_dir: str) -> None:
    """Compile the kernels into ``cache_dir`` in a child, untimed (``--no-cold``)."""
    p = mp.get_context("fork").Process(target=_compile, args=(cache_dir,))
    p.start()
    p.join()


def run(which: str, h: np.ndarray, pool: int, cache_dir: str) -> tuple[float, int, float, list[int], float, CpuUse]:
    """One placement in a forked child: (wall s, peak bytes beyond the start, max deviation, items per bin,
    CPU s, CPU use) with numba's kernel cache in ``cache_dir``."""
    ctx = mp.get_context("fork")  # the child shares the hotness, no copy
    rx, tx = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(which, h, pool, cache_dir, tx))
    p.start()
    try:
        res = rx.recv()
    except EOFError:
        p.join()
        raise SystemExit(f"{which}: the placer's child ended without a result (exit code {p.exitcode}; -9 is "
                         f"usually the OOM killer: check `free -g`)") from None
    p.join()
    print(f"{which}: {res[0]:.2f} s, CPU {res[4]:.1f} s, {res[1] / 1e9:.2f} GB beyond the input, "
          f"max deviation {res[2]:.3g}; {res[5].line()}", flush=True)
    return res


def figure_scale(items: int, a: float, pool: int, cold: bool = True) -> list[Figure]:
    h = zipf_hotness(items, a)
    print(f"\nFigure 1: {items:,} items, Zipf {a}, float32 hotness ({h.nbytes / 1e9:.1f} GB), 10 bins; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        c = run("ddak", h, pool, cache) if cold else _fill_cache(cache)  # empty cache: compiles, fills it
        d = run("ddak", h, pool, cache)
        b = run("hash", h, pool, cache)
    print(f"{'':32}{'DDAK':>12}{'hash':>12}{'DDAK/hash':>12}")
    print(f"{'time (s)':32}{d[0]:12.2f}{b[0]:12.2f}{d[0] / b[0]:12.2f}")
    # CPU time hardly depends on what else runs on the machine (wall time does)
    print(f"{'CPU time, user + system (s)':32}{d[4]:12.2f}{b[4]:12.2f}{d[4] / b[4]:12.2f}")
    print(f"{'cores kept busy (CPU/wall)':32}{d[5].cores_used:12.2f}{b[5].cores_used:12.2f}"
          f"{d[5].cores_used / b[5].cores_used:12.2f}")
    print(f"{'spread over threads':32}{d[5].spread:12.2f}{b[5].spread:12.2f}")
    print(f"{'waited for a core (s)':32}{d[5].wait_s:12.2f}{b[5].wait_s:12.2f}")
    print(f"{'peak memory beyond input (GB)':32}{d[1] / 1e9:12.2f}{b[1] / 1e9:12.2f}{d[1] / b[1]:12.2f}")
    print(f"{'max relative deviation':32}{d[2]:12.4f}{b[2]:12.4f}{d[2] / b[2]:12.4f}")
    print(f"items per bin, DDAK: {d[3]}")
    print(f"items per bin, hash: {b[3]}")
    print(f"DDAK: {d[5].line()}")
    for w in (d[5].warning("DDAK (parallel sort, pool sums and scatter)"),):
        if w:
            print(w)
    if c is not None:
        print(f"first run, empty kernel cache (compiles): {c[0]:.2f} s, CPU {c[4]:.1f} s; "
              f"cached: {d[0]:.2f} s, CPU {d[4]:.1f} s ({c[0] / d[0]:.2f}x)")
    big = items >= 500_000_000
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    figs = [Figure("ddak", f"{items:.0e} items, 10 bins: time", "s", d[0], b[0], "hash placement",
                   higher_is_better=False, target="ours <= 40 s on 2 cores" if big else "ours <= 10 s",
                   note=f"CPU time {d[4]:.1f} s vs {b[4]:.1f} s; {d[5].cores_used:.2f} cores busy; kernels "
                        f"cached; load average {load}"),
            Figure("ddak", f"{items:.0e} items, 10 bins: CPU time", "s", d[4], b[4], "hash placement",
                   higher_is_better=False, note=f"load average {load}"),
            Figure("ddak", f"{items:.0e} items, 10 bins: cores kept busy (CPU/wall)", "cores", d[5].cores_used,
                   b[5].cores_used, "hash placement", target=f"ours >= 1.6 of {d[5].cores}",
                   note=f"spread over threads {d[5].spread:.2f} vs {b[5].spread:.2f} (CPU / the busiest "
                        f"thread's: what a quiet machine would give); waited for a core {d[5].wait_s:.1f} s vs "
                        f"{b[5].wait_s:.1f} s; load average {load}"),
            Figure("ddak", f"{items:.0e} items, 10 bins: memory beyond input", "GB", d[1] / 1e9, b[1] / 1e9,
                   "hash placement", higher_is_better=False, target="ours <= 16 GB" if big else "ours <= 3 GB",
                   note=f"hotness {h.nbytes / 1e9:.1f} GB not counted; the outputs (bin_of + row_of) are "
                        f"{items * 12 / 1e9:.1f} GB of it"),
            Figure("ddak", f"{items:.0e} items, 10 bins: max relative deviation", "", d[2], b[2],
                   "hash placement", higher_is_better=False, target="ours <= 0.05")]
    if c is not None:
        figs.append(Figure("ddak", f"{items:.0e} items, 10 bins: first run (empty kernel cache, compiles)", "s",
                           c[0], d[0], "the next run (kernels cached on disk)", higher_is_better=False,
                           note=f"CPU time {c[4]:.1f} s vs {d[4]:.1f} s; load average {load}"))
    return figs


def capacity_feasible(h: np.ndarray, bins: list[DdakBin]) -> bool:
    """A necessary condition: the GPU bins' targets fit in the hotness of as many hottest items as they hold,
    and so do the GPU and CPU bins' together (the tiers are filled hottest first)."""
    top = np.cumsum(np.sort(h.astype(np.float64))[::-1])
    total = top[-1]
    t = np.array([b.target_traffic for b in bins])
    share = t / t.sum()
    for kinds in (("gpu",), ("gpu", "cpu")):
        mine = [j for j, b in enumerate(bins) if b.kind in kinds]
        cap = min(h.shape[0], sum(bins[j].capacity_items for j in mine))
        if cap and share[mine].sum() * total > top[cap - 1] * (1 + 1e-9):
            return False
    return True


def figure_targets(n: int = 1_000_000) -> list[Figure]:
    print(f"\nFigure 2: target match on {n:,} items, the same 10 bins (max relative deviation from target)")
    print(f"{'Zipf a':>7}{'pool':>6}{'capacity-feasible':>19}{'hottest pool/min target':>25}"
          f"{'DDAK':>9}{'hash':>9}{'DDAK/hash':>11}")
    bins = bins_for(n)
    worst, worst_hash = 0.0, 0.0
    for a in (0.5, 0.7, 0.8, 0.9, 1.0, 1.1):
        h = zipf_hotness(n, a)
        b = hash_placement(h, bins)
        hs = np.sort(h)[::-1]
        feasible = capacity_feasible(h, bins)
        for pool in (100, 1):
            d = ddak(h, bins, pool=pool)
            ratio = float(hs[:pool].sum(dtype=np.float64)) / float(d.target_per_bin.min())
            print(f"{a:7.1f}{pool:6d}{'yes' if feasible else 'no':>19}{ratio:25.3f}"
                  f"{d.max_relative_deviation:9.4f}{b.max_relative_deviation:9.4f}"
                  f"{d.max_relative_deviation / b.max_relative_deviation:11.4f}")
            if feasible and ratio <= 1.0:
                worst = max(worst, d.max_relative_deviation)
                worst_hash = max(worst_hash, b.max_relative_deviation)
    print(f"feasible (capacity-feasible, and the hottest pool no larger than the smallest target): "
          f"DDAK's worst deviation {worst:.4f} ({'within' if worst <= 0.05 else 'above'} 5 %)")
    return [Figure("ddak", "max relative deviation from target, feasible targets (worst case)", "",
                   worst, worst_hash, "hash placement", higher_is_better=False, target="ours <= 0.05",
                   note="Zipf 0.5-1.1, pools 1 and 100, 10^6 items")]


def figure_graph(nodes: int, edges: int, pool: int | None) -> list[Figure]:
    from planner.handoff import plan_now
    from planner.topology.spec.load import load_machine
    from training.data import open_dataset
    from training.hotness import HotnessSpec, compute_hotness
    from training.place.bins import build_bins, targets_for_caches
    from training.place.policy import place
    from training.synth import SynthSpec
    from training.synth_run import synthesize

    with tempfile.TemporaryDirectory() as tmp:
        spec = SynthSpec(num_nodes=nodes, num_edges=edges, generator="chung-lu", feature_dim=128,
                         train_share=0.05, seed=1)
        with CpuMeter() as made:
            synthesize(f"{tmp}/g", spec)
            ds = open_dataset(f"{tmp}/g")
        gen = made.use.wall_s
        with CpuMeter() as sampled:
            hot = compute_hotness(ds, HotnessSpec("presample", fanouts=(25, 10), batch_size=1024, epochs=1))
        sample = sampled.use.wall_s
        row = ds.row_bytes
        gpu_bytes, cpu_bytes = nodes // 20 * row, nodes // 10 * row
        targets, _ = targets_for_caches(plan_now(load_machine("moment-b"), spec="moment-b"), hot.values,
                                        gpu_rows=nodes // 20, cpu_rows=nodes // 10)
        n_ssd = len(targets.of_kind("ssd"))
        bins = build_bins(targets, num_rows=nodes, row_bytes=row, gpu_cache_bytes=gpu_bytes,
                          cpu_cache_bytes=cpu_bytes, ssd_dirs=[tmp] * n_ssd, out_dir=tmp)
        reads = float(hot.reads_per_epoch.sum())
        res = place(hot.values, bins, targets, row_bytes=row, pool=pool, reads_per_epoch=reads)
    d, b = res.report, res.baseline
    sockets = sorted({s for _, s in targets.gpus if s})
    print(f"\nFigure 3: Chung–Lu graph, {ds.num_nodes:,} nodes, {ds.num_edges:,} CSR edges, "
          f"{row} B rows (made in {gen:.1f} s); pre-sampled 1 epoch, fan-outs 25,10, batch 1024 "
          f"({sample:.1f} s, {reads:,.0f} reads)")
    # both run on one thread by design (no WARNING): the generator is a sequence of seeded chunks, the
    # pre-sampling one sampler over the seeds in order, so that each makes the same bytes every time
    print(f"generation: {made.use.line()}\npre-sampling: {sampled.use.line()}")
    print(f"plan of moment-b: {len(targets.gpus)} GPUs on {', '.join(sockets)}; {len(bins)} bins "
          f"(GPU cache {nodes // 20:,} rows replicated, host caches {nodes // 10:,} rows per socket, "
          f"{n_ssd} SSDs)")
    print(f"{'':32}{'DDAK':>12}{'hash':>12}{'DDAK/hash':>12}")
    print(f"{'SSD bytes per epoch (MB)':32}{d.ssd_bytes_per_epoch / 1e6:12.1f}{b.ssd_bytes_per_epoch / 1e6:12.1f}"
          f"{d.ssd_bytes_per_epoch / b.ssd_bytes_per_epoch:12.3f}")
    print(f"{'SSD share of reads':32}{d.ssd_share:12.4f}{b.ssd_share:12.4f}{d.ssd_share / b.ssd_share:12.3f}")
    print(f"{'cross-socket share':32}{d.cross_socket_share:12.4f}{b.cross_socket_share:12.4f}"
          f"{d.cross_socket_share / b.cross_socket_share:12.3f}")
    print(f"{'max relative deviation':32}{d.max_relative_deviation:12.4f}{b.max_relative_deviation:12.4f}")
    less = 1 - d.cross_socket_share / b.cross_socket_share
    print(f"cross-socket traffic: DDAK {less:.1%} less than hash (paper: 8.7-18.1 % less)")
    what = f"Chung-Lu {nodes:.0e} nodes, moment-b plan"
    return [Figure("ddak", f"{what}: SSD bytes per epoch", "MB", d.ssd_bytes_per_epoch / 1e6,
                   b.ssd_bytes_per_epoch / 1e6, "hash placement", higher_is_better=False),
            Figure("ddak", f"{what}: cross-socket share", "", d.cross_socket_share, b.cross_socket_share,
                   "hash placement", higher_is_better=False, note="paper: 8.7-18.1% less than hash")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=lambda v: int(float(v)), default=100_000_000,
                    help="items of figure 1 (default 1e8; the paper's size is 1e9)")
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--pool", type=int, default=100, help="DDAK pool (figure 3: default as moment place)")
    ap.add_argument("--graph-nodes", type=int, default=200_000)
    ap.add_argument("--graph-edges", type=int, default=2_000_000)
    ap.add_argument("--skip-scale", action="store_true", help="skip figure 1 (the 10⁸-item run)")
    ap.add_argument("--scale-only", action="store_true", help="run figure 1 only")
    ap.add_argument("--no-cold", action="store_true",
                    help="figure 1 without the first run on an empty kernel cache (one placement less)")
    ap.add_argument("--json", help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args()
    figures = []
    if not args.skip_scale:
        figures += figure_scale(args.items, args.zipf, args.pool, cold=not args.no_cold)
    if not args.scale_only:
        figures += figure_targets()
        figures += figure_graph(args.graph_nodes, args.graph_edges, None)
    write(args.json, "bench_ddak", figures, " ".join(sys.argv))


if __name__ == "__main__":
    main()
