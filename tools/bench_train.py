"""Training throughput: DDAK placement vs hash placement vs all features in memory, and 2 trainers vs 1.

    python tools/bench_train.py [--nodes 1000000 --edges 10000000 --feature-dim 256] [--quick]

Makes a skewed Chung-Lu graph whose features are 4x the CPU cache (float32 rows of
``--feature-dim``), pre-samples its hotness once, places it on the bundled Machine B plan
twice (``moment place --strategy ddak`` and ``--strategy hash``, the same bins and caches;
SSD bins all on this machine's one disk, read with O_DIRECT), then trains GraphSAGE
(fan-outs 25,10, hidden 256) for ``--epochs`` with each placement, with the features
all in memory (no placement: the upper bound), and with the DDAK placement under
``torchrun --nproc-per-node 2``. Every run is its own process, run by the real
``moment train`` command; figures come from its JSONL metrics: seeds/s of the last
epoch, the share of step time the trainer waited on I/O, and rows per tier.

On this 2-core machine without a GPU, compute (GraphSAGE on the CPU) takes most of
a step and the next batches' gathers overlap it, so placement shows mostly in the
I/O wait share and the SSD rows; on a GPU server the compute shrinks by orders of
magnitude and the I/O share is what limits throughput (the paper's setting).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]


def moment(*args: str, torchrun: int = 0) -> None:
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={torchrun}",
               "-m", "moment", *args]
    else:
        cmd = [sys.executable, "-m", "moment", *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")


def last_epoch(metrics: Path) -> dict:
    rec = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r for r in rec if r.get("kind") == "epoch"][-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1000000")
    ap.add_argument("--edges", default="10000000")
    ap.add_argument("--feature-dim", type=int, default=256, help="float32 features per row (default 256: 1 KiB)")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--train-share", default="0.01", help="training vertices, share of all (default 0.01, as the paper)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--dir", help="work directory on the SSD (default: a temporary one under /var/tmp)")
    ap.add_argument("--quick", action="store_true", help="a small graph (20000 nodes, 256-wide rows)")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args()
    if args.quick:  # a smoke run: at this size a batch's neighbourhood covers most of the graph
        args.nodes, args.edges, args.feature_dim, args.train_share = "20000", "200000", 256, "0.1"
    nodes = int(float(args.nodes))
    row = args.feature_dim * 4
    cpu_cache = nodes * row // 4 // 2  # features = 4 x the CPU cache (2 NUMA nodes on Machine B)
    gpu_cache = nodes * row // 50
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="moment-bench-train-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        g = base / "graph"
        print(f"graph: Chung-Lu, {nodes:,} nodes, {int(float(args.edges)):,} edges, {args.feature_dim} float32 "
              f"features ({nodes * row / 2**20:.0f} MiB: 4x the CPU cache of {2 * cpu_cache / 2**20:.0f} MiB)",
              flush=True)
        moment("data", "synth", str(g), "--nodes", args.nodes, "--edges", args.edges, "--generator", "chung-lu",
               "--undirected", "--feature-dim", str(args.feature_dim), "--train-share", args.train_share,
               "--seed", "3", "--quiet")
        for strategy in ("ddak", "hash"):
            ssd = [a for i in range(8) for a in ("--ssd", str(base / f"ssd-{strategy}{i}"))]
            for i in range(8):
                (base / f"ssd-{strategy}{i}").mkdir(exist_ok=True)
            moment("place", "--dataset", str(g), "--machine", "moment-b", "--gpu-cache", str(gpu_cache),
                   "--cpu-cache", str(cpu_cache), *ssd, "--strategy", strategy, "--fanouts", "25,10",
                   "--batch-size", str(args.batch_size), "--out", str(base / f"place-{strategy}"))
        runs = {"DDAK placement": ("place-ddak", 0), "hash placement": ("place-hash", 0),
                "all in memory": (None, 0), "DDAK placement, 2 trainers": ("place-ddak", 2)}
        res = {}
        for name, (placement, ranks) in runs.items():
            m = base / f"metrics-{len(res)}.jsonl"
            extra = ["--placement", str(base / placement)] if placement else []
            print(f"training: {name} ...", flush=True)
            moment("train", "--dataset", str(g), *extra, "--model", "sage", "--fanouts", "25,10", "--batch-size",
                   str(args.batch_size), "--epochs", str(args.epochs), "--eval-every", "0",
                   "--metrics", str(m), torchrun=ranks)
            res[name] = last_epoch(m)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)

    print(f"\n{'':30}{'seeds/s':>10}{'I/O wait':>10}{'epoch s':>9}{'SSD rows':>11}{'CPU rows':>11}{'GPU rows':>11}")
    for name, r in res.items():
        t = r.get("tiers", {})
        print(f"{name:30}{r['seeds_per_s']:>10.0f}{r['io_wait_share']:>10.1%}{r['epoch_s']:>9.1f}"
              + "".join(f"{t.get(k, {}).get('rows', 0):>11,}" for k in ("ssd", "cpu", "gpu")))
    d, h, mem, two = (res[k] for k in runs)
    print(f"\nDDAK / hash seeds/s {d['seeds_per_s'] / h['seeds_per_s']:.2f}x; DDAK / in-memory "
          f"{d['seeds_per_s'] / mem['seeds_per_s']:.2f}x; 2 trainers / 1 {two['seeds_per_s'] / d['seeds_per_s']:.2f}x "
          f"(2 ranks on {os.cpu_count()} cores). SSD rows per epoch, DDAK / hash: "
          f"{d['tiers']['ssd']['rows'] / max(1, h['tiers']['ssd']['rows']):.2f} (rank 0's counters)")
    what = f"GraphSAGE 25,10, {nodes:.0e} nodes, {args.feature_dim}-wide rows"
    write(args.json, "bench_train", [
        Figure("train", f"{what}: DDAK vs hash placement", "seeds/s", d["seeds_per_s"], h["seeds_per_s"],
               "hash placement", note=f"I/O wait {d['io_wait_share']:.0%} vs {h['io_wait_share']:.0%}"),
        Figure("train", f"{what}: DDAK placement vs all in memory", "seeds/s", d["seeds_per_s"],
               mem["seeds_per_s"], "features in memory (upper bound)"),
        Figure("train", f"{what}: SSD rows per epoch", "rows", d["tiers"]["ssd"]["rows"],
               h["tiers"]["ssd"]["rows"], "hash placement", higher_is_better=False),
        Figure("train", f"{what}: 2 trainers vs 1 (DDAK)", "seeds/s", two["seeds_per_s"], d["seeds_per_s"],
               "1 trainer", note=f"2 ranks on {os.cpu_count()} cores"),
    ], " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
