"""DDAK against the hash baseline at scale: time, peak memory, target match (not a test).

    python tools/bench_ddak.py [--items 100000000] [--zipf 0.9] [--pool 100]

Builds Zipf hotness (float32, ``1 / rank**a`` with ranks a seeded permutation)
for ``--items`` items and 10 bins — 2 GPU (5 % of the items each, 20 % of the
traffic each), 2 CPU (10 %, 10 %), 6 SSD (20 %, 40/6 %) — targets that are
feasible with room to spare. Each placer runs in its own forked child, so its
peak memory (``resource.getrusage`` ru_maxrss minus the child's resident
size at the start, the hotness included in neither) is its own; wall time is
measured around the call. Prints DDAK and hash side by side with the ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import time

import numpy as np

from planner.ddak import DdakBin, ddak, hash_placement


def zipf_hotness(n: int, a: float, seed: int = 0) -> np.ndarray:
    rank = np.random.default_rng(seed).permutation(n).astype(np.float32)
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


def _child(which: str, h: np.ndarray, pool: int, out) -> None:
    start = _rss_bytes()
    bins = bins_for(h.shape[0])
    t = time.perf_counter()
    r = ddak(h, bins, pool=pool) if which == "ddak" else hash_placement(h, bins)
    sec = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.send((sec, max(0, peak - start), r.max_relative_deviation, r.items_per_bin.tolist()))
    out.close()


def run(which: str, h: np.ndarray, pool: int) -> tuple[float, int, float, list[int]]:
    ctx = mp.get_context("fork")  # the child shares the hotness, no copy
    rx, tx = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(which, h, pool, tx))
    p.start()
    res = rx.recv()
    p.join()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=100_000_000)
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--pool", type=int, default=100)
    args = ap.parse_args()
    h = zipf_hotness(args.items, args.zipf)
    print(
        f"{args.items:,} items, Zipf {args.zipf}, float32 hotness ({h.nbytes / 1e9:.1f} GB), 10 bins"
    )
    d = run("ddak", h, args.pool)
    b = run("hash", h, args.pool)
    print(f"{'':28}{'DDAK':>12}{'hash':>12}{'DDAK/hash':>12}")
    print(f"{'time (s)':28}{d[0]:12.2f}{b[0]:12.2f}{d[0] / b[0]:12.2f}")
    print(
        f"{'peak memory beyond input (GB)':28}{d[1] / 1e9:12.2f}{b[1] / 1e9:12.2f}{d[1] / b[1]:12.2f}"
    )
    print(f"{'max relative deviation':28}{d[2]:12.4f}{b[2]:12.4f}{d[2] / b[2]:12.4f}")
    print(f"items per bin, DDAK: {d[3]}")
    print(f"items per bin, hash: {b[3]}")


if __name__ == "__main__":
    main()
