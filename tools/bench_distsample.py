"""Distributed sampling over a partitioned graph (training.distsample) against one process holding all of it.

    python tools/bench_distsample.py [--quick] [--json out.json]

The graph is the skewed Chung-Lu graph of ``tools/_cli.py:skewed_graph`` (``moment data synth``),
partitioned into ``--ranks`` contiguous vertex ranges of about equal edges (identity relabelling:
a valid partition of the format; ``moment data partition``'s METIS partitions cut fewer edges, which
only lowers the remote share). Each rank is a process (``torch.multiprocessing`` spawn, gloo over
loopback TCP, as ``tools/bench_multinode.py``'s nodes talk) holding the global ``indptr`` and its
partition's slice of ``indices``. At every step the world samples one global batch of
``--batch-size`` seeds, each rank the seeds its partition owns (``--split owned``, as ``moment train
--partition`` splits it) or its ``tensor_split`` part (``--split even``), through
:class:`~training.distsample.DistributedNeighbours`; the reference is one process sampling the
whole batch over the whole in-memory CSR with :class:`~training.sampler.NeighborSampler` (its
compiled path, what a single machine runs, and its torch path, the algorithm the distributed
source runs, so the exchange's cost stands apart).

Figures, each against its reference in the same run, ``--rounds`` interleaved rounds (median, range):

* seeds/s of the ranks together against one process over the whole graph (the same cores: each
  rank gets ``cores / ranks`` threads, the single process all of them);
* bytes crossing between ranks per hop (positions out + neighbour ids back, both ways, all ranks)
  and the share of sampled positions a rank asks of another;
* graph bytes held per rank (global ``indptr`` + own slice) against the whole CSR;
* overlap: per rank, sampling then a stand-in for the model's step (one mean-aggregation layer
  over the batch, ``--width`` wide) one after the other, against sampling ``--prefetch`` batches ahead
  on a background thread (each twice, A B B A, their mean), and the overlapped run against its floor,
  the longer of sampling alone and the steps alone. Serial is slower than the sum of its parts: the
  exchange is lockstep, so a rank's hop also waits while its peer runs its step.

On this 2-core machine the ranks share two cores and "the network" is loopback: seeds/s show what
the exchange costs in CPU and latency, not what a cluster's NICs carry; bytes and memory do not
depend on that.
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

from _cli import skewed_graph
from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def rng(xs: list[float], fmt: str = "{:.3g}") -> str:
    return f"{fmt.format(min(xs))}-{fmt.format(max(xs))}" if xs else "-"


def _steps(num_nodes: int, batch: int, steps: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_nodes, generator=g)
    return [order[(s * batch) % (num_nodes - batch):][:batch] for s in range(steps)]


def _partition(dataset: Path, out: Path, ranks: int) -> dict:
    """Contiguous vertex ranges of about equal edges, written in the partition format."""
    import numpy as np

    indptr = np.load(dataset / "indptr.npy", mmap_mode="r")
    indices = np.load(dataset / "indices.npy", mmap_mode="r")
    e = int(indptr[-1])
    cuts = [0, *(int(np.searchsorted(indptr, e * k // ranks)) for k in range(1, ranks)), indptr.size - 1]
    edge_offsets = [int(indptr[v]) for v in cuts]
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "indptr.npy", np.asarray(indptr))
    for k in range(ranks):
        (out / f"part-{k}").mkdir(exist_ok=True)
        np.save(out / f"part-{k}" / "indices.npy", np.asarray(indices[edge_offsets[k]:edge_offsets[k + 1]]))
    meta = {"parts": ranks, "node_offsets": cuts, "edge_offsets": edge_offsets, "method": "contiguous ranges"}
    (out / "partition.json").write_text(json.dumps(meta))
    return {"whole_csr_bytes": indptr.nbytes + indices.nbytes, "indptr_bytes": indptr.nbytes,
            "slice_bytes": [(edge_offsets[k + 1] - edge_offsets[k]) * indices.itemsize for k in range(ranks)]}


def _given_partition(part: Path, dataset: Path, ranks: int) -> dict:
    """The byte counts of a ``moment data partition`` output of the dataset (``--partition``)."""
    import numpy as np

    meta = json.loads((part / "partition.json").read_text())
    if int(meta["parts"]) != ranks:
        raise SystemExit(f"--partition {part}: {meta['parts']} partitions, --ranks {ranks}")
    indptr = np.load(part / "indptr.npy", mmap_mode="r")
    slices = [np.load(part / f"part-{k}" / "indices.npy", mmap_mode="r") for k in range(ranks)]
    whole = sum(np.load(dataset / f"{x}.npy", mmap_mode="r").nbytes for x in ("indptr", "indices"))
    return {"whole_csr_bytes": whole, "indptr_bytes": indptr.nbytes, "slice_bytes": [s.nbytes for s in slices],
            "method": meta.get("method", "?")}


def _model_step(batch, weight):
    """A stand-in for one training step's compute: mean of the sampled neighbours' rows, one linear layer."""
    import torch

    x = torch.ones(batch.num_nodes, weight.shape[0])  # the rows' values do not change the work
    agg = torch.zeros_like(x).index_add_(0, batch.edge_index[1], x.index_select(0, batch.edge_index[0]))
    return torch.relu(agg @ weight).sum()


def _rank(rank: int, d: str, args: dict) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    from training.distsample import DistributedNeighbours, PartitionLayout, sample_batches
    from training.sampler import NeighborSampler

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args["ranks"]))
    dist.init_process_group("gloo", init_method=f"file://{d}/init", rank=rank, world_size=args["ranks"])
    part = Path(d) / "part"
    meta = json.loads((part / "partition.json").read_text())
    layout = PartitionLayout(tuple(meta["node_offsets"]), tuple(meta["edge_offsets"]))
    # in memory, as the whole-graph reference holds its CSR
    indptr, local = np.load(part / "indptr.npy"), np.load(part / f"part-{rank}" / "indices.npy")
    hop_bytes: list[list[int]] = [[] for _ in args["fanouts"]]

    class Counted(DistributedNeighbours):
        calls = 0

        def take(self, pos):
            out = super().take(pos)
            hop_bytes[Counted.calls % len(args["fanouts"])].append(self.stats.last_round_bytes)
            Counted.calls += 1
            return out

    source = Counted(local, layout)
    sampler = NeighborSampler(indptr, source, args["fanouts"], seed=rank)
    steps = _steps(layout.node_offsets[-1], args["batch"], args["steps"], args["seed"])
    lo, hi = layout.node_offsets[rank], layout.node_offsets[rank + 1]
    # "owned": the global batch's seeds this rank's partition holds (DistDGL's trainers, and
    # `moment train --partition`); "even": its tensor_split part, whichever partition holds them
    parts = [s[(s >= lo) & (s < hi)] if args["split"] == "owned" else torch.tensor_split(s, args["ranks"])[rank]
             for s in steps]
    weight = torch.randn(args["width"], args["width"])
    out: dict = {}
    for _ in sample_batches(sampler, parts[:2], source):  # warm-up: first allocations, gloo's first rounds
        pass
    for h in hop_bytes:
        h.clear()
    source.stats = type(source.stats)()
    # serial and overlapped twice each, in the order A B B A: a load that drifts during the round weighs on both
    for mode in ("sample", "serial", "overlap", "overlap", "serial"):
        dist.barrier()
        t0 = time.perf_counter()
        compute = 0.0
        for b in sample_batches(sampler, parts, source, prefetch=args["prefetch"] if mode == "overlap" else 0):
            if mode != "sample":
                c0 = time.perf_counter()
                _model_step(b, weight)
                compute += time.perf_counter() - c0
        dist.barrier()
        run = {"s": time.perf_counter() - t0, "compute_s": compute}
        if mode in out:  # the second of the pair: their mean
            run = {k: (out[mode][k] + v) / 2 for k, v in run.items()}
        out[mode] = run
        if mode == "sample":
            out["stats"] = source.stats.as_dict()
            out["hop_bytes"] = [sum(h) / max(1, len(h)) for h in hop_bytes]
    Path(d, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def _single(dataset: Path, args: dict, compiled: bool) -> float:
    """Seconds for one process to sample every global batch over the whole graph (the compiled path on every
    core; the torch path on one thread, as each rank runs it: its OpenMP fork and join per operation crawls
    on a loaded 2-core machine)."""
    import numpy as np
    import torch

    from training.sampler import NeighborSampler

    torch.set_num_threads((os.cpu_count() or 1) if compiled else 1)
    indptr = torch.from_numpy(np.load(dataset / "indptr.npy"))
    indices = torch.from_numpy(np.load(dataset / "indices.npy"))
    s = NeighborSampler(indptr, indices, args["fanouts"], seed=0, compiled=compiled)
    steps = _steps(indptr.numel() - 1, args["batch"], args["steps"], args["seed"])
    s.sample(steps[0])  # the compiled kernels' first call compiles or loads them
    t0 = time.perf_counter()
    for seeds in steps:
        s.sample(seeds)
    return time.perf_counter() - t0


def _distributed(work: Path, args: dict) -> list[dict]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(dir=work) as d:
        os.symlink(work / "part", Path(d) / "part")
        mp.spawn(_rank, args=(d, args), nprocs=args["ranks"], join=True)
        return [json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(args["ranks"])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/moment-distsample"), help="work directory")
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--edges", type=int, default=2_000_000)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--fanouts", default="15,10")
    ap.add_argument("--batch-size", type=int, default=1024, help="global batch, in seeds")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--width", type=int, default=64, help="rows' width of the stand-in model step")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partition", type=Path, help="a `moment data partition` output of the graph to sample over "
                    "(default: contiguous ranges of equal edges); the reference still samples the dataset's own ids")
    ap.add_argument("--split", choices=("owned", "even"), default="owned",
                    help="each rank's seeds of a global batch: those its partition owns (default), or an even split")
    ap.add_argument("--quick", action="store_true", help="a small graph, one round (a smoke run)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    if a.quick:
        a.nodes, a.edges, a.steps, a.rounds = 20_000, 200_000, 10, 1
    a.dir.mkdir(parents=True, exist_ok=True)
    dataset = skewed_graph(a.dir / f"graph-{a.nodes}-{a.edges}", a.nodes, a.edges)
    work = a.dir / (f"run-{a.nodes}-{a.edges}-{a.ranks}" + ("-given" if a.partition else ""))
    if a.partition:
        mem = _given_partition(a.partition, dataset, a.ranks)
        work.mkdir(parents=True, exist_ok=True)
        if not (work / "part").exists():
            os.symlink(a.partition.resolve(), work / "part")
    else:
        mem = {**_partition(dataset, work / "part", a.ranks), "method": "contiguous ranges of equal edges"}
    args = {"ranks": a.ranks, "fanouts": tuple(int(f) for f in a.fanouts.split(",")), "batch": a.batch_size,
            "steps": a.steps, "seed": 7, "prefetch": a.prefetch,
            "width": a.width, "split": a.split}
    load0 = Path("/proc/loadavg").read_text().split()[0]
    single, single_torch, dist_s, serial, overlap, hidden, remote, hops, in_take = [], [], [], [], [], [], [], [], []
    for r in range(a.rounds):
        single.append(_single(dataset, args, compiled=True))
        single_torch.append(_single(dataset, args, compiled=False))
        ranks = _distributed(work, args)
        dist_s.append(max(x["sample"]["s"] for x in ranks))
        serial.append(max(x["serial"]["s"] for x in ranks))
        overlap.append(max(x["overlap"]["s"] for x in ranks))
        # per rank: the overlapped run against its floor, the longer of sampling alone and the model steps alone
        for x in ranks:
            floor = max(x["sample"]["s"], x["serial"]["compute_s"])
            hidden.append(x["overlap"]["s"] / floor if floor > 0 else float("nan"))
        st = [x["stats"] for x in ranks]
        in_take.append(max(s["seconds"] / x["sample"]["s"] for s, x in zip(st, ranks, strict=True)))
        remote.append(1 - sum(s["local_positions"] for s in st) / sum(s["positions_asked"] for s in st))
        hops.append([sum(x["hop_bytes"][h] for x in ranks) for h in range(len(args["fanouts"]))])
        print(f"round {r + 1}: one process {single[-1]:.2f} s (torch path {single_torch[-1]:.2f} s), {a.ranks} ranks "
              f"{dist_s[-1]:.2f} s; with a model step: serial {serial[-1]:.2f} s, overlapped {overlap[-1]:.2f} s; "
              f"remote share {remote[-1]:.3f}; bytes per hop {hops[-1]}", flush=True)
    load1 = Path("/proc/loadavg").read_text().split()[0]
    seeds = a.steps * a.batch_size
    per_rank = max(mem["slice_bytes"]) + mem["indptr_bytes"]
    setting = (f"{a.nodes} vertices, {a.edges} edges Chung-Lu (undirected), {mem['method']} partition, seeds split "
               f"{a.split}, fan-outs "
               f"{a.fanouts}, global batch "
               f"{a.batch_size}, {a.steps} steps, {a.ranks} ranks on {os.cpu_count()} cores (loopback gloo); "
               f"load {load0} before, {load1} after; warm page cache; median of {a.rounds}")
    hop_mean = [med([h[i] for h in hops]) for i in range(len(args["fanouts"]))]
    figures = [
        Figure("distsample", f"seeds/s, {a.ranks} ranks with a partition each vs one process with the whole graph",
               "seeds/s", seeds / med(dist_s), seeds / med(single), "one process, compiled sampler, whole CSR",
               target="near 1 (the exchange's cost)",
               note=f"ranks {rng([seeds / x for x in dist_s])}, one process {rng([seeds / x for x in single])}, "
                    f"its torch path {rng([seeds / x for x in single_torch])} (the path a source takes, one "
                    f"thread); share of a rank's sampling time inside the exchange (take) "
                    f"{rng(in_take, '{:.2f}')}; {setting}"),
        Figure("distsample", "graph bytes held per rank (global indptr + own slice) vs the whole CSR", "bytes",
               per_rank, mem["whole_csr_bytes"], "whole CSR on every rank", higher_is_better=False,
               target=f"about 1/{a.ranks} of indices plus indptr",
               note=f"indptr {mem['indptr_bytes']} B on every rank, slices {mem['slice_bytes']} B"),
        Figure("distsample", "bytes between ranks per hop (all ranks, both ways), hop 1 first", "bytes/hop",
               sum(hop_mean), None, "", higher_is_better=False, target="only sampled neighbours cross",
               note=f"per hop {[round(x) for x in hop_mean]}; remote share of sampled positions "
                    f"{med(remote):.3f} ({rng(remote)}); 8 B per position out + the id's bytes back; {setting}"),
        Figure("distsample", f"overlap: sampling {a.prefetch} batches ahead vs one after the other, with a model "
               "step", "s", med(overlap), med(serial), "sample then compute, serially", higher_is_better=False,
               target="overlapped near its floor",
               note=f"overlapped / its floor (the longer of sampling alone and the steps alone) per rank "
                    f"{rng(hidden, '{:.2f}')} (median {med(hidden):.2f}; 1 = all of the shorter hidden); serial "
                    "also waits at every hop for the peer's step (the exchange is lockstep), which the thread "
                    f"hides too; "
                    f"overlapped {rng(overlap)} s, serial {rng(serial)} s; {setting}"),
    ]
    for f in figures:
        ratio = f"{f.ratio:.2f}x" if f.ratio else "-"
        print(f"{f.figure}: ours {f.ours:.4g} {f.unit}, reference {f.reference} ({f.reference_name}), {ratio}")
    write(a.json, "distsample", figures, " ".join(["python", "tools/bench_distsample.py", *sys.argv[1:]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
