"""What checking SSD bins on read costs the gather path: checks on against checks off, in one run.

Usage:
    python tools/bench_bin_integrity.py [--rows 32768] [--row-bytes 4096] [--batch 4096] [--repeats 5]
                                        [--sum-blocks 256KiB,1MiB,4MiB] [--dir /var/tmp] [--json out.json]

One bin of ``--rows`` rows per sum block size (:data:`iostack.bins.SUM_BLOCK_BYTES` is the default), read
by the store's posix backend (O_DIRECT where the file system has it) in random batches of ``--batch``
rows. Each figure is a median over ``--repeats`` rounds, each round measuring both sides back to back
(order alternating), with the range:

* **first epoch** (every block checked on its first read, :class:`iostack.binverify.BlockChecker`):
  a fresh store gathers every row once, in random batches, with checks on vs the same with the
  checkers removed (the reference). The bin is evicted from the page cache first (cold).
* **first tenth of an epoch**: the same for the first 10% of the batches, where a block read whole
  for a few rows costs most (the read amplification each block size gives).
* **later epochs** (every block verified): a batch's gather with checks on vs off.
* **the lookup alone**: the check's own time per batch (its blocks verified, another not yet: the
  bitmap lookup every gather then pays), against that batch's unchecked gather: the noise-free
  figure of the later-epoch cost, which the gathers' own spread (a shared machine) hides.
* **background pass** (the alternative: every page checked by a sequential pass beside training):
  reading and checking the whole bin (:func:`iostack.binverify.check_bin`) against one epoch's
  gathers unchecked, the time such a pass takes on the same disk.
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
from _results import Figure, drop_from_page_cache, write

from iostack.bins import open_bin, write_bins
from iostack.binverify import check_bin
from iostack.placement import simple_placement
from iostack.ssdreads import SsdTier
from iostack.store import FeatureStore
from momentbase.units import format_size, parse_size

OPTIONS = {"processes": 0, "threads": 2}


def _mr(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _epoch(p, d: Path, batches: list[torch.Tensor], checked: bool, cold: bool) -> float:
    """Seconds to gather ``batches`` through a fresh store (its checkers removed unless ``checked``)."""
    if cold:
        drop_from_page_cache(sorted(d.glob("*.dat")))
    with FeatureStore(p, d, backend_options=OPTIONS) as s:
        if not checked:
            for t in s.tiers:
                if isinstance(t, SsdTier):
                    t.checkers.clear()
        t0 = time.perf_counter()
        for b in batches:
            s.gather(b)
        return time.perf_counter() - t0


def _check_alone(p, d: Path, batches: list[torch.Tensor], repeats: int) -> list[float]:
    """Seconds of the read-path check alone per batch while some block is unverified (the bitmap lookup)."""
    from iostack.binverify import BlockChecker

    checker = BlockChecker(open_bin(d, p.bins[0]))
    rows = [b.numpy() for b in batches[:8]]
    for r in rows:
        checker.check_rows(r)  # their blocks verified
    checker.left = 1  # as while another block is unverified: every call pays the lookup
    out = []
    for _ in range(repeats * 20):
        t0 = time.perf_counter()
        for r in rows:
            checker.check_rows(r)
        out.append((time.perf_counter() - t0) / len(rows))
    return out


def _warm(p, d: Path, batches: list[torch.Tensor], repeats: int) -> tuple[list[float], list[float], list[float]]:
    """Per-batch gather seconds once every block is verified: checks on, checks on paying the bitmap lookup
    (what a gather costs while some block of the bin is still unverified: ``left`` forced above 0), off."""
    on, lookup, off = [], [], []
    with FeatureStore(p, d, backend_options=OPTIONS) as s:
        for b in batches:
            s.gather(b)  # every block verified now
        tier = next(t for t in s.tiers if isinstance(t, SsdTier))
        keep = dict(tier.checkers)
        for r in range(repeats):
            for mode in (("on", "lookup", "off") if r % 2 == 0 else ("off", "lookup", "on")):
                tier.checkers = {} if mode == "off" else keep
                for c in keep.values():
                    c.left = 1 if mode == "lookup" else 0
                t0 = time.perf_counter()
                for b in batches[:8]:
                    s.gather(b)
                {"on": on, "lookup": lookup, "off": off}[mode].append((time.perf_counter() - t0) / len(batches[:8]))
    return on, lookup, off


def _one(block: int, feats: np.ndarray, root: Path, args: argparse.Namespace) -> list[Figure]:
    d = root / f"sums-{block}"
    p = simple_placement(feats.shape[0], [("ssd", feats.shape[0])])
    write_bins(feats, p, d, sum_block_bytes=block)
    rng = np.random.default_rng(0)
    batches = [torch.from_numpy(x) for x in np.array_split(rng.permutation(feats.shape[0]),
                                                            max(1, feats.shape[0] // args.batch))]
    tenth = batches[:max(1, len(batches) // 10)]
    full_on, full_off, part_on, part_off, bg = [], [], [], [], []
    for r in range(args.repeats):
        for checked in ((True, False) if r % 2 == 0 else (False, True)):
            (full_on if checked else full_off).append(_epoch(p, d, batches, checked, cold=True))
            (part_on if checked else part_off).append(_epoch(p, d, tenth, checked, cold=True))
        drop_from_page_cache(sorted(d.glob("*.dat")))
        t0 = time.perf_counter()
        assert check_bin(open_bin(d, p.bins[0])).ok
        bg.append(time.perf_counter() - t0)
    warm_on, warm_lookup, warm_off = _warm(p, d, batches, args.repeats)
    alone = _check_alone(p, d, batches, args.repeats)
    size = open_bin(d, p.bins[0]).file_bytes
    name = format_size(block)
    off = "checks off"
    rows = [("first epoch", full_on, full_off, off), ("first tenth of an epoch", part_on, part_off, off),
            ("later epochs, per batch", warm_on, warm_off, off),
            ("later epochs, per batch, bitmap lookup", warm_lookup, warm_off, off),
            ("the lookup alone vs a batch's unchecked gather", alone, warm_off, "the batch's unchecked gather"),
            ("background pass vs an unchecked epoch", bg, full_off, "one unchecked epoch")]
    figs = []
    for what, on, ref, ref_name in rows:
        a, b = _mr(on), _mr(ref)
        print(f"{name:>8} sums  {what:<46} {a[0] * 1e3:10.3f} ms ({a[1] * 1e3:.3f}-{a[2] * 1e3:.3f})   "
              f"ref {b[0] * 1e3:9.1f} ms ({b[1] * 1e3:.1f}-{b[2] * 1e3:.1f})   x{a[0] / b[0]:.3f}")
        figs.append(Figure("bin_integrity", f"{what}, {name} sum blocks", "s", a[0], b[0], ref_name,
                           higher_is_better=False,
                           note=f"{format_size(size)} bin, batches of {args.batch}; ranges {a[1]:.5f}-{a[2]:.5f} "
                                f"vs {b[1]:.4f}-{b[2]:.4f} s"))
    return figs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--row-bytes", type=int, default=4096, help="bytes per row (float32 features)")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sum-blocks", default="256KiB,1MiB,4MiB", help="sum block sizes to compare")
    ap.add_argument("--dir", default="/var/tmp", help="where the bins go (a real disk: O_DIRECT)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    feats = np.random.default_rng(1).random((args.rows, args.row_bytes // 4)).astype(np.float32)
    with open("/proc/loadavg") as f:
        print(f"load {f.read().split()[:3]}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
              f"{args.rows:,} rows of {args.row_bytes} B; cold = the bin evicted from the page cache first")
    figs: list[Figure] = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-bin-integrity-") as tmp:
        for block in (parse_size(x) for x in args.sum_blocks.split(",")):
            figs += _one(block, feats, Path(tmp), args)
            for f in Path(tmp).glob("sums-*/*.dat"):
                f.unlink()  # one bin at a time on the disk
    cmd = "python tools/bench_bin_integrity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write(args.json, "bench_bin_integrity", figs, cmd.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
