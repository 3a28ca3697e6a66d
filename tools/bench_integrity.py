"""What the dataset checksums cost: writing them, checking a sample on open, checking every block.

Usage:
    python tools/bench_integrity.py [--nodes 1e6] [--dim 128] [--repeats 5] [--json out.json]

Three comparisons, each measured side by side in one run (medians of ``--repeats``, with ranges):

* writing a synthetic dataset with its per-block CRC-32s vs the same writer with the checksum
  pass switched off (the reference);
* ``open_dataset`` with the default sampled check vs ``verify="none"`` (the reference);
* ``verify="full"`` (CRC-32 of every byte) vs reading the same files without checksumming them
  (the reference): the price of the CRC itself, not of the reads;
* with ``--train``: a training run (GraphSAGE, one epoch, the dataset's features in memory) with
  ``check_dataset="background"`` (every block of the arrays it reads checked on a thread while it
  trains, :mod:`training.background_verify`) vs ``"open"`` (the reference): the run's wall time,
  the end-of-run wait for the check included, runs interleaved.

Files are in the page cache for the open and full-check figures (they were just written); on
a cold cache both sides of the third comparison wait on the disk alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import unittest.mock
from pathlib import Path

from _results import Figure, write

from training.data import open_dataset
from training.synth import SynthSpec
from training.synth_run import synthesize
from training.writer import DatasetWriter


def _median_range(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _read_all(root: Path) -> int:
    n = 0
    for f in sorted(root.glob("*.npy")):
        with open(f, "rb") as fh:
            while chunk := fh.read(4 << 20):
                n += len(chunk)
    return n


def _train_s(root: Path, check: str) -> float:
    """Wall seconds of one epoch of training on ``root`` with ``check_dataset=check``, set-up included."""
    from training.specs import IOSpec, ModelSpec, RunSpec, SamplingSpec, TrainSpec
    from training.trainer import train

    spec = TrainSpec(str(root), model=ModelSpec(hidden=64), sampling=SamplingSpec(fanouts=(10, 5), batch_size=1024),
                     io=IOSpec(check_dataset=check, prefetch=1), run=RunSpec(epochs=1, seed=0))
    t = time.perf_counter()
    res = train(spec)
    took = time.perf_counter() - t
    if check == "background" and "dataset_check" not in res.epochs[-1]:
        raise SystemExit("the background check did not report: the comparison would measure nothing")
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=float, default=1e6)
    ap.add_argument("--edges", type=float, default=None, help="default: 10 × nodes")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", help="where to write the datasets (default: a temporary directory)")
    ap.add_argument("--train", action="store_true",
                    help="also time a training epoch with the background check against without it")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    nodes = int(args.nodes)
    edges = int(args.edges or 10 * nodes)
    spec = SynthSpec(num_nodes=nodes, num_edges=edges, feature_dim=args.dim, seed=1)

    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        with_sums, without = [], []
        for i in range(args.repeats):
            for checked, times in ((True, with_sums), (False, without)):
                dst = Path(d) / f"g{i}{'c' if checked else 'n'}"
                t = time.perf_counter()
                if checked:
                    synthesize(dst, spec)
                else:
                    with unittest.mock.patch.object(DatasetWriter, "_checksums", lambda self, tmp: {}):
                        synthesize(dst, spec)
                times.append(time.perf_counter() - t)
        root = Path(d) / "g0c"
        size = sum(f.stat().st_size for f in root.glob("*.npy"))
        sample, plain, full, read = [], [], [], []
        for _ in range(args.repeats):
            for mode, times in (("sample", sample), ("none", plain), ("full", full)):
                t = time.perf_counter()
                open_dataset(root, validate=False, verify=mode)
                times.append(time.perf_counter() - t)
            t = time.perf_counter()
            _read_all(root)
            read.append(time.perf_counter() - t)
        integrity = open_dataset(root, validate=False).integrity
        bg: list[float] = []
        op: list[float] = []
        for i in range(args.repeats if args.train else 0):
            pair = [("background", bg), ("open", op)]
            for check, times in pair if i % 2 == 0 else pair[::-1]:  # interleaved, each first in turn
                times.append(_train_s(root, check))

    w, wn, s, n, f, r = (_median_range(x) for x in (with_sums, without, sample, plain, full, read))
    print(f"dataset: {nodes:,} nodes, {edges:,} edges, {args.dim} float32 features, {size / 1e9:.2f} GB of .npy")
    print(f"write with checksums     {w[0]:8.3f} s  ({w[1]:.3f}–{w[2]:.3f})   without {wn[0]:8.3f} s "
          f"({wn[1]:.3f}–{wn[2]:.3f})   overhead {w[0] / wn[0] - 1:+.1%}")
    print(f"open, sampled check      {s[0] * 1e3:8.1f} ms ({s[1] * 1e3:.1f}–{s[2] * 1e3:.1f})   unchecked "
          f"{n[0] * 1e3:8.1f} ms ({n[1] * 1e3:.1f}–{n[2] * 1e3:.1f})")
    print(f"full check               {f[0]:8.3f} s  ({f[1]:.3f}–{f[2]:.3f}) = {size / f[0] / 1e9:.2f} GB/s   "
          f"plain read {r[0]:.3f} s ({r[1]:.3f}–{r[2]:.3f}) = {size / r[0] / 1e9:.2f} GB/s")
    print(f"sampled check says: {integrity}")
    figures = []
    if bg:
        b, o = _median_range(bg), _median_range(op)
        print(f"train 1 epoch, background {b[0]:8.3f} s  ({b[1]:.3f}–{b[2]:.3f})   open only {o[0]:8.3f} s "
              f"({o[1]:.3f}–{o[2]:.3f})   overhead {b[0] / o[0] - 1:+.1%}")
        figures.append(Figure("integrity", "training epoch, every array block checked in the background", "s",
                              b[0], o[0], "check_dataset='open' (the sample on opening)", higher_is_better=False,
                              note=f"range {b[1]:.2f}-{b[2]:.2f} s vs {o[1]:.2f}-{o[2]:.2f} s"))
    cmd = "python tools/bench_integrity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write(args.json, "bench_integrity", [
        Figure("integrity", "dataset write time with checksums", "s", w[0], wn[0], "same writer, no checksums",
               higher_is_better=False, note=f"{size / 1e9:.2f} GB; range {w[1]:.2f}-{w[2]:.2f} s"),
        Figure("integrity", "open_dataset, sampled checksum check", "s", s[0], n[0], "verify='none'",
               higher_is_better=False, note=integrity),
        Figure("integrity", "full checksum check", "s", f[0], r[0], "reading the files without CRC",
               higher_is_better=False, note=f"{size / f[0] / 1e9:.2f} GB/s"),
        *figures,
    ], cmd.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
