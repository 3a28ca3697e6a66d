"""Typed neighbour sampling (per-relation CSRs) against the homogeneous sampler on the union CSR.

The same synthetic ogbn-mag-shaped graph (``training.hetero.synth.synth_mag``, reverse relations
added) is sampled both ways in one run, from the same training papers, same fan-outs, same batch
size: ours is :class:`training.hetero.sampler.HeteroNeighborSampler` (one draw per relation and
hop, PyG's hetero semantics) on its compiled path (:mod:`training.hetero.compiled`, one plan and
one fill-and-relabel numba call per hop), shown beside its torch path (``compiled=False``, the
same batches), the reference is :class:`training.sampler.NeighborSampler` over
the dataset's union CSR in global ids (what an untyped loop would sample; it draws ``fanout``
over all relations together, so its batches are smaller). Reported: sampled edges per second,
median of ``--repeats`` rounds of ``--batches`` batches each (warm: one round first, not
counted), with the range. Usage::

    python tools/bench_hetero_sample.py [--papers 200000] [--fanouts 10 5] [--batch-size 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _results import Figure, write  # noqa: E402

from training.hetero.graph import add_reverse  # noqa: E402
from training.hetero.sampler import HeteroNeighborSampler  # noqa: E402
from training.hetero.store import open_hetero, write_hetero  # noqa: E402
from training.hetero.synth import synth_mag  # noqa: E402
from training.sampler import NeighborSampler  # noqa: E402


def _round(sample, batches: list[np.ndarray]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds of this process (every thread) and sampled edges of one round."""
    edges = 0
    t, c = time.perf_counter(), time.process_time()
    for b in batches:
        edges += sample(b)
    return time.perf_counter() - t, time.process_time() - c, edges


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--papers", type=int, default=200_000)
    p.add_argument("--fanouts", type=int, nargs="+", default=[10, 5])
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args(argv)
    n = args.papers
    with tempfile.TemporaryDirectory() as d:
        g = add_reverse(synth_mag(papers=n, authors=n // 2, institutions=max(n // 100, 1), fields=max(n // 50, 1)))
        hd = open_hetero(write_hetero(Path(d) / "mag", g))
        train = np.asarray(hd.split("train_idx"))
        rng = np.random.default_rng(0)
        batches = [rng.choice(train, args.batch_size, replace=False) for _ in range(args.batches)]
        typed = HeteroNeighborSampler(hd, args.fanouts, seed=0)
        typed_torch = HeteroNeighborSampler(hd, args.fanouts, seed=0, compiled=False)
        union = NeighborSampler(hd.base.indptr, hd.base.indices, fanouts=tuple(args.fanouts), seed=0)
        off = hd.schema.node_type("paper").offset
        sides = {
            "typed": lambda b: sum(int(e.shape[1]) for e in typed.sample("paper", b).edge_index.values()),
            "typed_torch": lambda b: sum(int(e.shape[1]) for e in typed_torch.sample("paper", b).edge_index.values()),
            "union": lambda b: int(union.sample(torch.from_numpy(b + off)).edge_index.shape[1]),
        }
        rates: dict[str, list[float]] = {k: [] for k in sides}
        cpu_rates: dict[str, list[float]] = {k: [] for k in sides}
        for f in sides.values():
            _round(f, batches[:2])  # warm
        for _ in range(args.repeats):
            for k, f in sides.items():  # interleaved, so load changes hit both
                wall, cpu, edges = _round(f, batches)
                rates[k].append(edges / wall)
                cpu_rates[k].append(edges / max(cpu, 1e-9))
    med = {k: statistics.median(v) for k, v in rates.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu_rates.items()}
    for k, v in rates.items():
        c = cpu_rates[k]
        print(f"{k}: {med[k] / 1e6:.2f} M edges/s (range {min(v) / 1e6:.2f}-{max(v) / 1e6:.2f}, "
              f"{args.repeats} rounds); per CPU second {cpu_med[k] / 1e6:.2f} "
              f"(range {min(c) / 1e6:.2f}-{max(c) / 1e6:.2f})")
    print(f"per CPU second: typed / union {cpu_med['typed'] / cpu_med['union']:.2f}x, compiled / torch path "
          f"{cpu_med['typed'] / cpu_med['typed_torch']:.2f}x (less sensitive to other jobs than wall time)")
    print(f"ratio typed / union: {med['typed'] / med['union']:.2f}x; typed torch path / union: "
          f"{med['typed_torch'] / med['union']:.2f}x; compiled / torch path: {med['typed'] / med['typed_torch']:.2f}x")
    fig = Figure("hetero_sample", f"synth_mag {n} papers + reverse relations, fan-out {args.fanouts}, batch "
                 f"{args.batch_size}", "M edges/s", med["typed"] / 1e6, med["union"] / 1e6,
                 "homogeneous NeighborSampler on the union CSR",
                 note=f"ours {min(rates['typed']) / 1e6:.2f}-{max(rates['typed']) / 1e6:.2f}, reference "
                      f"{min(rates['union']) / 1e6:.2f}-{max(rates['union']) / 1e6:.2f}; warm, median of "
                      f"{args.repeats}")
    fig_torch = Figure("hetero_sample", f"synth_mag {n} papers, compiled typed path vs its torch path", "M edges/s",
                       med["typed"] / 1e6, med["typed_torch"] / 1e6, "HeteroNeighborSampler(compiled=False)",
                       note=f"torch path {min(rates['typed_torch']) / 1e6:.2f}-{max(rates['typed_torch']) / 1e6:.2f}; "
                            f"the same batches; warm, median of {args.repeats}")
    fig_cpu = Figure("hetero_sample", f"synth_mag {n} papers, typed vs union, per CPU second", "M edges/CPU s",
                     cpu_med["typed"] / 1e6, cpu_med["union"] / 1e6, "homogeneous NeighborSampler on the union CSR",
                     note=f"compiled / torch path {cpu_med['typed'] / cpu_med['typed_torch']:.2f}x per CPU second; "
                          f"median of {args.repeats}")
    write(args.json, "bench_hetero_sample", [fig, fig_torch, fig_cpu], " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
