"""Gradient exchange: DistributedDataParallel (this tree) against the hand-written flat all-reduce (a reference tree).

    git archive 14c7c88 | tar -x -C /var/tmp/before    # the last commit with the flat all-reduce
    python tools/bench_ddp.py --reference /var/tmp/before [--repeats 3] [--json out.json]

Trains GraphSAGE (fan-outs 10,5, features in memory) on a synthetic graph with the real
``moment train`` command, one process and ``torchrun --nproc-per-node 2`` (gloo on CPU,
NCCL on CUDA), once with each tree's code (``PYTHONPATH``), ``--repeats`` times each, in
turns so that load changes hit both alike. Prints the median over runs of each run's median
step time after its first epoch (with the range) and the ratio reference/ours (above 1: DDP
is faster) per world size; ``--json`` writes them
(``tools/_results.py``). The 2-core machine this was written on runs the two ranks on
one core each, so the figure is the exchange's overhead, not a speed-up.
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

from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]


def moment(tree: Path, *args: str, ranks: int = 1) -> None:
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               "-m", "moment", *args]
    else:
        cmd = [sys.executable, "-m", "moment", *args]
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed ({tree}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")


def step_ms(tree: Path, dataset: Path, metrics: Path, ranks: int, args: argparse.Namespace) -> float:
    """The median step time (ms) of rank 0's steps after the first epoch: robust to a busy neighbour's bursts."""
    metrics.unlink(missing_ok=True)
    moment(tree, "train", "--dataset", str(dataset), "--model", "sage", "--fanouts", "10,5", "--batch-size",
           str(args.batch_size), "--hidden", "128", "--epochs", str(args.epochs), "--eval-every", "0",
           "--metrics", str(metrics), ranks=ranks)
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    return 1e3 * statistics.median(r["step_s"] for r in recs if r.get("kind") == "step" and r["epoch"] > 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=Path, required=True, help="a tree with the flat all-reduce (git archive)")
    ap.add_argument("--nodes", default="100000")
    ap.add_argument("--edges", default="1000000")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--train-share", default="0.2", help="training vertices, share of all (default 0.2)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not (args.reference / "training" / "trainer.py").is_file():
        sys.exit(f"--reference {args.reference}: not a Moment tree (no training/trainer.py); "
                 "make one with git archive COMMIT | tar -x -C DIR")
    base = Path(tempfile.mkdtemp(prefix="bench-ddp-", dir="/var/tmp"))
    g = base / "graph"
    moment(REPO, "data", "synth", str(g), "--nodes", args.nodes, "--edges", args.edges, "--feature-dim", "128",
           "--train-share", args.train_share, "--quiet")
    runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for ranks in (1, 2):
            for name, tree in (("ddp", REPO), ("flat", args.reference.resolve())):
                runs.setdefault((name, ranks), []).append(step_ms(tree, g, base / "m.jsonl", ranks, args))
    figures = []
    print(f"{'ranks':>5} {'DDP step ms':>18} {'flat step ms':>18} {'flat / DDP':>10}")
    for ranks in (1, 2):
        ours, ref = runs[("ddp", ranks)], runs[("flat", ranks)]
        mo, mr = statistics.median(ours), statistics.median(ref)
        print(f"{ranks:>5} {mo:>8.1f} [{min(ours):.1f}-{max(ours):.1f}] {mr:>8.1f} [{min(ref):.1f}-{max(ref):.1f}] "
              f"{mr / mo:>10.3f}")
        figures.append(Figure("ddp", f"{ranks} rank(s): median step time, DDP vs the flat all-reduce", "ms", mo, mr,
                              "hand-written flat all-reduce", higher_is_better=False,
                              note=f"median of {args.repeats} runs' median steps; ours {ours}, reference {ref}"))
    write(args.json, "bench_ddp", figures, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
