"""Gather speed of this checkout's feature store against another checkout's (a refactor's cost), interleaved.

Usage:
    python tools/bench_gather_ab.py --ref /work/main [--rounds 7] [--seconds 3] [--json out.json]

One data set is written once (float32 rows of ``--dim`` values, ``--vertices``
vertices): placed in GPU and CPU bins only (``gpu+cpu``: no disk, the router's
own cost shows most), in GPU, CPU and SSD bins (``gpu+cpu+ssd``) and in CPU and
SSD bins (``cpu+ssd``, the setting of ``tools/bench_io.py gather``). Each round
runs, per setting, one fresh process with ``PYTHONPATH`` set to this checkout
(ours) and one set to ``--ref`` (the reference), in alternating order, each
opening a :class:`~iostack.store.FeatureStore` on the same files and timing
``iostack.bench.io.bench_gather`` (Zipf-skewed batches of ``--batch`` ids, the same
seed both sides; without a GPU the "gpu" bin is host memory) for ``--seconds``;
round 0 is a warm-up (page cache, ``.pyc``) and not counted. Reported per
side: the median over the rounds of rows/s and of each run's median latency per
gather (less swayed by other processes' load than the run's total), and of the
fastest of ``--repeats`` gathers of uniform ids timed one by one (what the code
costs when nothing else runs), with the min-max range, and the ratio (above 1:
ours better).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from _results import Figure, write

from momentbase.space import reserve

REPO = Path(__file__).resolve().parents[1]

#: setting -> (kind, share of vertices) per bin
SETTINGS = {"gpu+cpu": (("gpu", 0.3), ("cpu", 0.7)), "gpu+cpu+ssd": (("gpu", 0.1), ("cpu", 0.3), ("ssd", 0.6)),
            "cpu+ssd": (("cpu", 0.1), ("ssd", 0.9))}

_CHILD = """
import json, sys, time
import numpy as np
import torch
from iostack.bench.io import bench_gather
from iostack.placement import load_placement
from iostack.store import FeatureStore
d, feats_path = sys.argv[1], sys.argv[2]
batch, seconds, alpha = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
feats = np.load(feats_path, mmap_mode="r")
with FeatureStore(load_placement(d), d, features=feats, backend="posix") as s:
    r = bench_gather(s, batch=batch, seconds=seconds, alpha=alpha)
    ids = [torch.from_numpy(rng.integers(0, s.num_vertices, batch)) for rng in [np.random.default_rng(1)]
           for _ in range(10)]
    lat = []
    for k in range(int(sys.argv[6])):  # the fastest of many: what the code costs when nothing else runs
        t = time.perf_counter()
        s.gather(ids[k % len(ids)])
        lat.append(time.perf_counter() - t)
print(json.dumps({"rows_per_s": r.rows_per_s, "p50_s": r.latency_p50_s, "min_s": min(lat), "share": r.tier_share}))
"""


def _prepare(root: Path, vertices: int, dim: int) -> Path:
    """The features (``features.npy``) and one placement directory per setting under ``root``."""
    from iostack.bins import write_bins
    from iostack.placement import simple_placement

    feats = np.lib.format.open_memmap(root / "features.npy", mode="w+", dtype=np.float32, shape=(vertices, dim))
    reserve(root / "features.npy")
    rng = np.random.default_rng(0)
    for a in range(0, vertices, 1 << 14):
        feats[a:a + (1 << 14)] = rng.random((min(vertices, a + (1 << 14)) - a, dim), dtype=np.float32)
    feats.flush()
    for name, shares in SETTINGS.items():
        d = root / name
        d.mkdir()
        counts = [int(vertices * s) for _, s in shares]
        counts[-1] = vertices - sum(counts[:-1])
        p = simple_placement(vertices, [(k, c) for (k, _), c in zip(shares, counts, strict=True)],
                             order=rng.permutation(vertices))
        write_bins(feats, p, d, fsync=False)
        p.save(d)
    return root / "features.npy"


def _run(checkout: Path, d: Path, feats: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(d), str(feats), str(args.batch), str(args.seconds),
                           str(args.alpha), str(args.repeats)], env=env, capture_output=True, text=True, cwd=checkout)
    if proc.returncode != 0:
        raise SystemExit(f"gather in {checkout} failed: {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, root: Path, feats: Path) -> dict[tuple[str, str], list[dict]]:
    """Each run's figures per (setting, side) over the counted rounds, sides alternating which goes first."""
    sides = {"ours": REPO, "reference": Path(args.ref)}
    out: dict[tuple[str, str], list[dict]] = {(s, k): [] for s in SETTINGS for k in sides}
    for rnd in range(args.rounds + 1):
        order = list(sides) if rnd % 2 else list(sides)[::-1]
        for setting in SETTINGS:
            for side in order:
                r = _run(sides[side], root / setting, feats, args)
                if rnd:
                    out[setting, side].append(r)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", required=True, help="the reference checkout (e.g. a worktree of main)")
    ap.add_argument("--rounds", type=int, default=7, help="counted rounds (default 7), after one warm-up")
    ap.add_argument("--seconds", type=float, default=3.0, help="gathering per run (default 3)")
    ap.add_argument("--vertices", type=int, default=200_000, help="vertices (default 200000)")
    ap.add_argument("--dim", type=int, default=256, help="float32 values a row (default 256: 1 KiB rows)")
    ap.add_argument("--batch", type=int, default=8192, help="ids a gather (default 8192)")
    ap.add_argument("--alpha", type=float, default=0.8, help="Zipf exponent of the ids (default 0.8)")
    ap.add_argument("--repeats", type=int, default=60,
                    help="gathers of uniform ids timed one by one after the stream, the fastest kept (default 60)")
    ap.add_argument("--dir", default="/var/tmp" if os.path.isdir("/var/tmp") else None,
                    help="where the temporary data set goes (default /var/tmp)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1 or not (Path(args.ref) / "iostack" / "store.py").is_file():
        ap.error("need --rounds >= 1, --repeats >= 1 and --ref a checkout of this repository")
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="moment-gather-ab-") as d:
        feats = _prepare(Path(d), args.vertices, args.dim)
        runs = measure(args, Path(d), feats)
    load1 = os.getloadavg()[0]
    print(f"gather, {args.vertices} x {args.dim} float32, {args.batch} ids a gather, Zipf {args.alpha}, "
          f"{args.rounds} rounds of {args.seconds:g} s (warm page cache), load {load0:.2f} -> {load1:.2f} "
          f"on {os.cpu_count()} CPUs; median [min-max] over the rounds of k rows/s, and of each run's median "
          "latency per gather (ms)")
    figures = []
    for setting in SETTINGS:
        for key, unit, scale, higher in (("rows_per_s", "k rows/s", 1e-3, True), ("p50_s", "ms p50", 1e3, False),
                                         ("min_s", "ms min", 1e3, False)):
            ours = [r[key] for r in runs[setting, "ours"]]
            ref = [r[key] for r in runs[setting, "reference"]]
            mo, mr = statistics.median(ours), statistics.median(ref)
            ratios = [(a / b if higher else b / a) for a, b in zip(ours, ref, strict=True)]
            ratio = mo / mr if higher else mr / mo
            print(f"  {setting:12s} {unit:9s} ours {mo * scale:7.1f} [{min(ours) * scale:.1f}-{max(ours) * scale:.1f}]"
                  f"  reference {mr * scale:7.1f} [{min(ref) * scale:.1f}-{max(ref) * scale:.1f}]  "
                  f"ratio {ratio:.3f} (per round {min(ratios):.2f}-{max(ratios):.2f}; above 1: ours better)")
            figures.append(Figure(
                bench="gather-ab", figure=f"gather {setting}, {args.batch} Zipf ids: {unit}", unit=unit,
                ours=mo * scale, reference=mr * scale, reference_name=f"store at {args.ref}", higher_is_better=higher,
                target="≥ 1.0", note=f"{args.rounds} interleaved rounds; ours {min(ours) * scale:.1f}-"
                f"{max(ours) * scale:.1f}, reference {min(ref) * scale:.1f}-{max(ref) * scale:.1f}; per-round ratio "
                f"{min(ratios):.2f}-{max(ratios):.2f}; load {load0:.2f}->{load1:.2f}"))
    write(args.json, "gather-ab", figures, "python tools/bench_gather_ab.py " + " ".join(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
