"""Training throughput: DDAK placement vs hash placement vs all features in memory, and 2 trainers vs 1.

    python tools/bench_train.py [--nodes 1000000 --edges 10000000 --feature-dim 256] [--quick]
    python tools/bench_train.py --ranks-only --rounds 5 --dir /var/tmp/bench-train --json out.json

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

2 trainers vs 1: ``--rounds`` rounds of runs on the same DDAK placement, back to back:
one rank, two ranks with node-shared SSD reads (the default: each SSD page of a step
read once by the node, split between the ranks) and two ranks reading privately
(``--no-node-shared-reads``); the ratio of each 2-rank run to its round's 1-rank run,
median and range (load moves between rounds, not within one). Each run lasts
``--epochs`` epochs of which the last is measured (the first fills the pipeline and
the host cache's pages). Each run's per-step split — compute, gather (sampling
included), I/O wait, all-reduce of the loss — is printed: it says where the ceiling
is (the disk when I/O wait dominates; the cores when compute does). ``disk_work``
counts, without timing, the SSD pages and read requests of the measured epoch for
one rank and for both 2-rank modes. ``--ranks-only`` runs just those rounds; with
``--dir`` an earlier run's graph and placements are reused (delete the directory to
make them again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import _cli
from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]



#: every step with 2 OpenMP threads unless the caller's environment sets them
moment = partial(_cli.moment, omp_threads="2")


def last_epoch(metrics: Path) -> dict:
    rec = [json.loads(line) for line in metrics.read_text().splitlines()]
    ep = [r for r in rec if r.get("kind") == "epoch"][-1]
    ep["prefetch_workers"] = next((r.get("prefetch_workers", 1) for r in rec if r.get("kind") == "start"), 1)
    steps = [r for r in rec if r.get("kind") == "step" and r.get("epoch") == ep["epoch"]]
    # per-step means of rank 0's split (ms): where a step's time goes
    ep["split_ms"] = {k: 1000 * statistics.fmean(r[k + "_s"] for r in steps) for k in SPLIT} if steps else {}
    return ep


#: the per-step stages of the split: compute (forward, backward with the gradients' all-reduce, update),
#: gather (a prefetch thread's, per batch: sampling and feature rows, overlapped with the step; with two
#: prefetch threads two batches' gathers also overlap each other), I/O wait (the trainer blocked on
#: the prefetch queue), all-reduce (the loss and hits), the whole step
SPLIT = ("compute", "gather", "io_wait", "allreduce", "step")


def split_text(ep: dict) -> str:
    threads = f"{ep['prefetch_workers']} prefetch threads: " if ep.get("prefetch_workers", 1) > 1 else ""
    return threads + ", ".join(f"{k} {v:.0f}" for k, v in ep["split_ms"].items())


def prediction_text(ep: dict) -> str:
    """Rank 0's SSD read time of the epoch, the plan's prediction against what it measured ("" without one)."""
    p = ep.get("prediction") or {}
    if p.get("predicted_io_s") is None or not p.get("measured_io_s"):
        return ""
    return (f"SSD reads predicted {p['predicted_io_s']:.2f} s, measured {p['measured_io_s']:.2f} s "
            f"({p['io_error']:+.0%})")


def prepare(args, base: Path, nodes: int, row: int) -> Path:
    """The graph and its DDAK and hash placements under ``base`` (reused when an earlier run made them)."""
    cpu_cache = nodes * row // 4 // 2  # features = 4 x the CPU cache (2 NUMA nodes on Machine B)
    gpu_cache = nodes * row // 50
    g = base / "graph"
    print(f"graph: Chung-Lu, {nodes:,} nodes, {int(float(args.edges)):,} edges, {args.feature_dim} float32 "
          f"features ({nodes * row / 2**20:.0f} MiB: 4x the CPU cache of {2 * cpu_cache / 2**20:.0f} MiB)",
          flush=True)
    if not (g / "meta.json").exists():
        moment("data", "synth", str(g), "--nodes", args.nodes, "--edges", args.edges, "--generator", "chung-lu",
               "--undirected", "--feature-dim", str(args.feature_dim), "--train-share", args.train_share,
               "--seed", "3", "--quiet")
    for strategy in ("ddak", "hash"):
        if (base / f"place-{strategy}" / "placement.json").exists():
            continue
        ssd = [a for i in range(8) for a in ("--ssd", str(base / f"ssd-{strategy}{i}"))]
        for i in range(8):
            (base / f"ssd-{strategy}{i}").mkdir(exist_ok=True)
        moment("place", "--dataset", str(g), "--machine", "moment-b", "--gpu-cache", str(gpu_cache),
               "--cpu-cache", str(cpu_cache), *ssd, "--strategy", strategy, "--fanouts", "25,10",
               "--batch-size", str(args.batch_size), "--out", str(base / f"place-{strategy}"), "--force")
    return g


#: the runs of a round: (name, ranks, extra ``moment train`` arguments)
MODES = (("1 rank", 0, ()), ("2 ranks shared", 2, ()), ("2 ranks private", 2, ("--no-node-shared-reads",)))


def disk_work(args, g: Path, placement: Path, epoch: int = 1) -> dict[str, tuple[int, int]]:
    """Mode (:data:`MODES`' names) -> (SSD pages, read requests) per epoch, summed over the ranks; no timing.

    Samples every rank's batches of ``epoch`` exactly as ``moment train`` does (the same seeds,
    the same per-rank sampler streams) and counts what the posix backend reads: the distinct
    4 KiB pages of the SSD rows read, and one request per run of consecutive pages (the
    backend's coalescing; its cap of ``max_read_bytes`` per read is not applied). Read
    privately, two ranks read the pages their halves share twice, and each half's sparser
    pages break into more runs. Shared, each step's union of both halves is split by page
    between the ranks as the store splits it (:func:`iostack.nodeshare.plan_share`): each page
    once, each rank's part a contiguous stretch of the union's pages.
    """
    sys.path.insert(0, str(REPO))
    import numpy as np

    from iostack.bins import PAGE
    from iostack.nodeshare import encode_keys, plan_share
    from iostack.placement import load_placement
    from training.batches import LocalBatchSource
    from training.data import open_dataset
    from training.sampler import NeighborSampler

    ds, pl = open_dataset(str(g), validate=False), load_placement(str(placement))
    bin_of, row_of = np.asarray(pl.bin_of), np.asarray(pl.row_of)
    ssd = [b.id for b in pl.bins if b.kind == "ssd"]
    per_page = max(1, PAGE // (args.feature_dim * 4))

    def count(p: np.ndarray) -> tuple[int, int]:  # pages, and requests: runs of consecutive pages
        return p.size, int(p.size > 0) + int((np.diff(p) > 1).sum())

    def batches(world: int):
        srcs = [LocalBatchSource(NeighborSampler(ds.indptr, ds.indices, (25, 10), seed=0),
                                 np.asarray(ds.train_idx, np.int64), args.batch_size, rank=rank,
                                 world_size=world, seed=0) for rank in range(world)]
        return zip(*(s.batches(epoch) for s in srcs), strict=True)  # every rank's batch of each step

    out = {name: [0, 0] for name, _, _ in MODES}
    for (b,) in batches(1):
        ids = b.n_id.numpy()
        for k in ssd:
            out["1 rank"] = [x + y for x, y in zip(out["1 rank"], count(np.unique(row_of[ids[bin_of[ids] == k]]
                                                                                  // per_page)), strict=True)]
    for step in batches(2):
        groups = []
        for b in step:
            ids = b.n_id.numpy()
            mine = [(k, row_of[ids[bin_of[ids] == k]]) for k in ssd]
            groups.append(encode_keys(mine))
            for _, rows in mine:
                c = count(np.unique(rows // per_page))
                out["2 ranks private"] = [x + y for x, y in zip(out["2 ranks private"], c, strict=True)]
        for rank in range(2):
            plan = plan_share(groups, rank, 2, {k: per_page for k in ssd})
            for _, lo, hi in plan.mine:
                c = count(np.unique(plan.rows[lo:hi] // per_page))
                out["2 ranks shared"] = [x + y for x, y in zip(out["2 ranks shared"], c, strict=True)]
    return {k: (int(p), int(r)) for k, (p, r) in out.items()}


def train(args, base: Path, g: Path, placement: str | None, ranks: int, tag: str, more: tuple[str, ...] = ()
          ) -> dict:
    m = base / f"metrics-{tag}.jsonl"
    m.unlink(missing_ok=True)
    extra = ["--placement", str(base / placement)] if placement else []
    if args.capacities:
        extra += ["--capacities", str(args.capacities)]
    moment("train", "--dataset", str(g), *extra, "--model", "sage", "--fanouts", "25,10", "--batch-size",
           str(args.batch_size), "--epochs", str(args.epochs), "--eval-every", "0", "--metrics", str(m), *more,
           ranks=ranks)
    return last_epoch(m)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1000000")
    ap.add_argument("--edges", default="10000000")
    ap.add_argument("--feature-dim", type=int, default=256, help="float32 features per row (default 256: 1 KiB)")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument(
        "--train-share", default="0.01", help="training vertices, share of all (default 0.01, as the paper)"
    )
    ap.add_argument("--epochs", type=int, default=2, help="epochs per run; the last is measured (default 2)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of 1-rank, 2-rank shared and 2-rank private runs (default 3)")
    ap.add_argument("--ranks-only", action="store_true", help="only the 2-trainers-vs-1 rounds")
    ap.add_argument("--dir", help="work directory on the SSD, kept and reused (default: a temporary one)")
    ap.add_argument("--quick", action="store_true", help="a small graph (20000 nodes, 256-wide rows)")
    ap.add_argument("--capacities", type=Path,
                    help="a `moment profile` file of this disk: each run's SSD read time, predicted against measured")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args()
    if args.quick:  # a smoke run: at this size a batch's neighbourhood covers most of the graph
        args.nodes, args.edges, args.feature_dim, args.train_share = "20000", "200000", 256, "0.1"
    nodes = int(float(args.nodes))
    row = args.feature_dim * 4
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="moment-bench-train-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    res, rounds = {}, []
    load_before = os.getloadavg()
    try:
        g = prepare(args, base, nodes, row)
        if not args.ranks_only:
            for name, placement in (("DDAK placement", "place-ddak"), ("hash placement", "place-hash"),
                                    ("all in memory", None)):
                print(f"training: {name} ...", flush=True)
                res[name] = train(args, base, g, placement, 0, name.split()[0])
        for r in range(args.rounds):  # the modes back to back: a round sees the same load
            runs = {name: train(args, base, g, "place-ddak", ranks, name.replace(" ", "-"), more)
                    for name, ranks, more in MODES}
            rounds.append(runs)
            one = runs["1 rank"]
            print(
                f"round {r + 1}: "
                + "; ".join(
                    f"{name} {x['seeds_per_s']:.0f} seeds/s ({split_text(x)} ms/step"
                    + (f", waited for the other rank {x.get('share_wait_s', 0.0):.2f} s" if "shared" in name else "")
                    + (f"; {prediction_text(x)}" if prediction_text(x) else "")
                    + ")"
                    + (f" {x['seeds_per_s'] / one['seeds_per_s']:.2f}x" if name != "1 rank" else "")
                    for name, x in runs.items()
                )
                + f"; load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
        work = disk_work(args, g, base / "place-ddak", args.epochs - 1)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    ratios = {name: [x[name]["seeds_per_s"] / x["1 rank"]["seeds_per_s"] for x in rounds] for name, _, _ in MODES[1:]}
    # the round of the median ratio of the default (shared) mode
    mid = sorted(range(len(rounds)), key=lambda i: ratios["2 ranks shared"][i])[len(rounds) // 2]
    chosen = rounds[mid]
    for name, _, _ in MODES:
        res[f"DDAK, {name} (round {mid + 1})"] = chosen[name]
    print(f"\n{'':34}{'seeds/s':>10}{'I/O wait':>10}{'epoch s':>9}{'SSD rows':>11}{'CPU rows':>11}{'GPU rows':>11}")
    for name, r in res.items():
        t = r.get("tiers", {})
        print(f"{name:34}{r['seeds_per_s']:>10.0f}{r['io_wait_share']:>10.1%}{r['epoch_s']:>9.1f}"
              + "".join(f"{t.get(k, {}).get('rows', 0):>11,}" for k in ("ssd", "cpu", "gpu")))
    load = f"load {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    print(f"\nper-step split, ms (rank 0; {', '.join(SPLIT)}):\n"
          + "\n".join(f"  {name + ':':17}{split_text(chosen[name])}" for name, _, _ in MODES))
    for name, _, _ in MODES:
        errs = [x[name]["prediction"]["io_error"] for x in rounds if prediction_text(x[name])]
        if errs:
            print(f"{name}: the plan's SSD read time / measured - 1, rank 0, per round: "
                  + ", ".join(f"{e:+.0%}" for e in errs))
    p1, r1 = work["1 rank"]
    ceiling = "disk work of the measured epoch, both ranks together / 1 rank: " + "; ".join(
        f"{name} {p:,} / {p1:,} SSD pages ({p / p1:.2f}x), {r:,} / {r1:,} read requests ({r / r1:.2f}x)"
        for name, (p, r) in work.items() if name != "1 rank")
    print(ceiling)
    for name, rs in ratios.items():
        print(f"{name} / 1 rank: median {statistics.median(rs):.2f}x, range {min(rs):.2f}-{max(rs):.2f} over "
              f"{len(rs)} rounds (2 ranks on {os.cpu_count()} cores); {load}")
    what = f"GraphSAGE 25,10, {nodes:.0e} nodes, {args.feature_dim}-wide rows"
    figs = []
    if not args.ranks_only:
        d, h, mem = (res[k] for k in ("DDAK placement", "hash placement", "all in memory"))
        print(f"DDAK / hash seeds/s {d['seeds_per_s'] / h['seeds_per_s']:.2f}x; DDAK / in-memory "
              f"{d['seeds_per_s'] / mem['seeds_per_s']:.2f}x; SSD rows per epoch, DDAK / hash: "
              f"{d['tiers']['ssd']['rows'] / max(1, h['tiers']['ssd']['rows']):.2f} (rank 0's counters)")
        figs += [
            Figure("train", f"{what}: DDAK vs hash placement", "seeds/s", d["seeds_per_s"], h["seeds_per_s"],
                   "hash placement", note=f"I/O wait {d['io_wait_share']:.0%} vs {h['io_wait_share']:.0%}"),
            Figure("train", f"{what}: DDAK placement vs all in memory", "seeds/s", d["seeds_per_s"],
                   mem["seeds_per_s"], "features in memory (upper bound)"),
            Figure("train", f"{what}: SSD rows per epoch", "rows", d["tiers"]["ssd"]["rows"],
                   h["tiers"]["ssd"]["rows"], "hash placement", higher_is_better=False)]
    one = chosen["1 rank"]
    for name, rs in ratios.items():
        two = chosen[name]
        figs.append(Figure(
            "train", f"{what}: 2 trainers vs 1 (DDAK, {name.removeprefix('2 ranks ')} SSD reads)", "seeds/s",
            two["seeds_per_s"], one["seeds_per_s"], "1 trainer", target=">= 1.0x",
            note=f"round of the shared mode's median ratio of {len(rs)} (range {min(rs):.2f}-{max(rs):.2f}); 2 ranks "
                 f"on {os.cpu_count()} cores; per-step ms 1 rank: {split_text(one)}; 2 ranks: {split_text(two)}; "
                 + (f"1 rank {prediction_text(one)}; 2 ranks {prediction_text(two)}; " if prediction_text(two) else "")
                 + f"{ceiling}; {load}"))
    write(args.json, "bench_train", figs, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
