"""Heterogeneous training seeds/s at 2 data-parallel ranks against 1 process, side by side in one run.

One ``synth_mag`` graph (``training.hetero.synth.synth_mag``, reverse relations added) is trained
by ``moment train --model hetero-sage|rgcn`` as one process (the reference) and under ``torchrun
--standalone --nproc-per-node 2`` (ours: each rank its half of every global batch, DDP over gloo,
:mod:`training.hetero.ranks`), the same global batch, fan-outs and epochs, the two launched in
turn within each round so load changes hit both. A run's figure is the median seeds/s of its
epochs after the first (the first pays numba's and torch's warm-up); the report gives the median
and range over ``--repeats`` rounds, and the load. Start-up (torchrun, imports, the model's
set-up) is not counted. Every process runs one thread (``OMP_NUM_THREADS=1``): the figure is
what a second process adds. On this project's machine the two ranks share 2 CPU cores with other
jobs. Usage::

    python tools/bench_hetero_train.py [--papers 20000] [--fanouts 10 5] [--batch-size 1024] [--epochs 3]
        [--repeats 3] [--model hetero-sage] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import Figure, write  # noqa: E402

from training.hetero.graph import add_reverse  # noqa: E402
from training.hetero.store import write_hetero  # noqa: E402
from training.hetero.synth import synth_mag  # noqa: E402
from training.vocab import HETERO_MODEL_NAMES  # noqa: E402


def _run(ranks: int, train_args: list[str]) -> list[dict]:
    """Epoch records of one ``moment train`` at ``ranks`` processes."""
    # one thread a process on both sides (torchrun's default for its ranks): on 2 loaded cores a 2-thread
    # torch process spins in OpenMP's barriers (measured 20-60x slower per epoch than 1 thread, load ~5)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    if ranks == 1:
        cmd = [sys.executable, "-m", "moment", *train_args]
    else:
        torchrun = shutil.which("torchrun") or "torchrun"
        cmd = [torchrun, "--standalone", "--nproc-per-node", str(ranks), "-m", "moment", *train_args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)["epochs"]


def _loadavg() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--papers", type=int, default=20_000)
    p.add_argument("--fanouts", type=int, nargs="+", default=[10, 5])
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="hetero-sage", choices=HETERO_MODEL_NAMES)
    p.add_argument("--json")
    args = p.parse_args(argv)
    n = args.papers
    rates: dict[int, list[float]] = {1: [], 2: []}
    loads = [_loadavg()]
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "mag"
        write_hetero(data, add_reverse(synth_mag(papers=n, authors=n // 2, institutions=max(n // 100, 1),
                                                 fields=max(n // 50, 1))))
        train_args = ["train", "--dataset", str(data), "--model", args.model, "--fanouts",
                      ",".join(map(str, args.fanouts)), "--batch-size", str(args.batch_size), "--epochs",
                      str(args.epochs), "--hidden", "64", "--eval-every", "0", "--json"]
        for _ in range(args.repeats):
            for ranks in (1, 2):  # in turn within a round, so a change of load hits both
                epochs = _run(ranks, train_args)
                counted = epochs[1:] or epochs
                rates[ranks].append(statistics.median(e["seeds_per_s"] for e in counted))
        loads.append(_loadavg())
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in rates.items():
        print(f"{k} rank(s): {med[k]:,.0f} seeds/s (median of {args.repeats} runs, range {min(v):,.0f}-{max(v):,.0f})")
    print(f"ratio 2 ranks / 1 process: {med[2] / med[1]:.2f}x; load at start {loads[0]}, at end {loads[1]}")
    fig = Figure("hetero_train", f"{args.model} on synth_mag {n} papers + reverse relations, fan-out {args.fanouts}, "
                 f"global batch {args.batch_size}, 2 ranks vs 1 process", "seeds/s", med[2], med[1],
                 "the same training in one process",
                 note=f"2 ranks {min(rates[2]):,.0f}-{max(rates[2]):,.0f}, 1 process {min(rates[1]):,.0f}-"
                      f"{max(rates[1]):,.0f}; median of {args.repeats} runs of the median epoch after the first; "
                      f"CPU only, gloo, 2 processes on the machine's cores shared with other jobs; load "
                      f"{loads[0]} -> {loads[1]}")
    write(args.json, "bench_hetero_train", [fig], " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
