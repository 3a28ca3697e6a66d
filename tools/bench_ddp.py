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

    python tools/bench_ddp.py --exchange [--steps 200] [--json out.json]

measures the step alone, without a reference tree: two gloo ranks (one process each) train
GraphSAGE on the same sampled batches and alternate, step by step, between the two ways of
exchanging gradients (the flat buffer all-reduced by hand, as before, and
DistributedDataParallel with the loss and hits all-reduced after), so that a busy
neighbour slows both alike; it prints the median step time of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _cli import moment
from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # --exchange imports training from this tree




def step_ms(tree: Path, dataset: Path, metrics: Path, ranks: int, args: argparse.Namespace) -> float:
    """The median step time (ms) of rank 0's steps after the first epoch: robust to a busy neighbour's bursts."""
    metrics.unlink(missing_ok=True)
    moment("train", "--dataset", str(dataset), "--model", "sage", "--fanouts", "10,5", "--batch-size",
           str(args.batch_size), "--hidden", "128", "--epochs", str(args.epochs), "--eval-every", "0",
           "--metrics", str(metrics), tree=tree, ranks=ranks, omp_threads="1")
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    return 1e3 * statistics.median(r["step_s"] for r in recs if r.get("kind") == "step" and r["epoch"] > 0)


def _exchange_rank(rank: int, world: int, port: int, steps: int, out: str) -> None:
    """One rank of ``--exchange``: alternate flat and DDP steps on the same batches; rank 0 writes the times."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from training.models import build_model
    from training.sampler import NeighborSampler

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from datetime import timedelta

    # a lost peer fails the run in a minute instead of gloo's half hour
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    rng = np.random.default_rng(0)
    n, deg, dim, classes, bs = 20000, 10, 128, 16, 512
    indptr = np.arange(0, (n + 1) * deg, deg, dtype=np.int64)
    indices = rng.integers(0, n, n * deg).astype(np.int64)
    x_all = torch.from_numpy(rng.standard_normal((n, dim), dtype=np.float32))
    y_all = torch.from_numpy(rng.integers(0, classes, n))
    sampler = NeighborSampler(indptr, indices, (10, 5), seed=rank)
    torch.manual_seed(0)
    model = build_model("sage", dim, classes, 2, hidden=256, dropout=0.0)
    ddp = DistributedDataParallel(model)
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    times: dict[str, list[float]] = {"flat": [], "ddp": []}
    for step in range(2 * steps):
        how = "flat" if step % 2 == 0 else "ddp"
        seeds = torch.from_numpy(rng.choice(n, bs // world, replace=False))
        b = sampler.sample(seeds)
        x, y = x_all[b.n_id], y_all[seeds]
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out_ = (model if how == "flat" else ddp)(x, b.edge_index_per_layer, b.batch_size)
        loss = F.cross_entropy(out_, y, reduction="sum")
        hits = (out_.detach().argmax(1) == y).sum().float()
        if how == "flat":  # the hand-written exchange this replaced: one flat buffer of grads, loss, hits
            (loss / bs).backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1), hits.reshape(1)])
            dist.all_reduce(flat)
            at = 0
            for p in params:
                p.grad = flat[at:at + p.numel()].view_as(p)
                at += p.numel()
        else:
            (loss * (world / bs)).backward()
            stats = torch.stack([loss.detach(), hits])
            dist.all_reduce(stats)
        opt.step()
        if step >= 10:  # warm-up steps of both kinds left out
            times[how].append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def exchange(args: argparse.Namespace) -> int:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    out = Path(tempfile.mkdtemp(prefix="bench-ddp-", dir="/var/tmp")) / "times.json"
    mp.spawn(_exchange_rank, args=(2, port, args.steps, str(out)), nprocs=2, join=True)
    times = json.loads(out.read_text())
    flat, ddp = (1e3 * statistics.median(times[k]) for k in ("flat", "ddp"))
    q = {k: statistics.quantiles([1e3 * t for t in times[k]], n=4) for k in times}
    print(f"2 gloo ranks, {len(times['ddp'])} steps of each, interleaved")
    print(f"{'':>8} {'median ms':>10} {'quartiles ms':>18}")
    for k, m in (("flat", flat), ("ddp", ddp)):
        print(f"{k:>8} {m:>10.2f} {q[k][0]:>8.2f}-{q[k][2]:<8.2f}")
    print(f"flat / DDP = {flat / ddp:.3f} (above 1: DDP's step is faster)")
    write(args.json, "bench_ddp", [Figure("ddp", "2 ranks: median step time, DDP vs the flat all-reduce, interleaved",
                                          "ms", ddp, flat, "hand-written flat all-reduce", higher_is_better=False,
                                          note=f"{len(times['ddp'])} steps each; quartiles {q}")], " ".join(sys.argv))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=Path, help="a tree with the flat all-reduce (git archive)")
    ap.add_argument("--exchange", action="store_true",
                    help="time the step alone, flat and DDP interleaved in one run (no --reference needed)")
    ap.add_argument("--steps", type=int, default=200, help="--exchange: timed steps of each kind (default 200)")
    ap.add_argument("--nodes", default="100000")
    ap.add_argument("--edges", default="1000000")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--train-share", default="0.2", help="training vertices, share of all (default 0.2)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.exchange:
        return exchange(args)
    if args.reference is None or not (args.reference / "training" / "trainer.py").is_file():
        sys.exit(f"--reference {args.reference}: not a Moment tree (no training/trainer.py); "
                 "make one with git archive COMMIT | tar -x -C DIR")
    base = Path(tempfile.mkdtemp(prefix="bench-ddp-", dir="/var/tmp"))
    g = base / "graph"
    moment("data", "synth", str(g), "--nodes", args.nodes, "--edges", args.edges, "--feature-dim", "128",
           "--train-share", args.train_share, "--quiet", omp_threads="1")
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
