"""Sampled edges per second: ``training.sampler`` against DGL's C++ CPU sampler (not a test).

    python tools/bench_sample.py [--nodes 1000000 --edges 12000000] [--dgl-venv DIR]
    python tools/bench_sample.py --build-dgl-venv DIR     # once: builds DGL 2.1 + torch 2.2.1

Generates (once, cached in ``--workdir``) a power-law Chung–Lu graph with at least 10**7
edges, writes its CSR as ``indptr.npy``/``indices.npy`` and the seed batches as
``seeds.npy``, then samples fan-out 25,10 (25 neighbours of every seed, 10 of every
vertex reached at hop 1) in batches of 8000 seeds with ours and — when a DGL virtual
environment is given — with ``dgl.dataloading.NeighborSampler`` in a subprocess of that
environment, on the same graph and seeds. Rounds alternate ours / DGL so that load on a
shared machine hits both alike; the median round is reported, with the ratio.
``--threads`` (default 1) sets both sides' intra-op threads; ``--dgl-threads`` overrides
DGL's. One thread is the default because our sampler is a chain of short torch
operations, each an OpenMP fork/join, which a busy machine punishes (see
``NeighborSampler(num_threads=...)``).

DGL cannot be a dependency (its newest wheel loads only with torch <= 2.2.1), so
``--build-dgl-venv DIR`` builds that reference in its own virtual environment, following
``../shared/notes/dgl-reference.md``: it downloads about 5 GB (torch 2.2.1 with its CUDA
libraries) from PyPI. Without a venv the script prints our figures and says the
reference was not run.

Memory per batch is reported from torch's profiler: bytes of the batch's outputs and the
peak of all tensors allocated while sampling one batch (excluding the graph and the
sampler's reusable vertex map, reported separately).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import Figure, write  # noqa: E402

from training.sampler import NeighborSampler  # noqa: E402

DGL_SIDE = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np, torch
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import dgl
    workdir, fanouts = sys.argv[1], sys.argv[2]
    rounds, warmup, threads = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(threads)
    indptr = torch.from_numpy(np.load(f"{workdir}/indptr.npy"))
    indices = torch.from_numpy(np.load(f"{workdir}/indices.npy").astype(np.int64))
    seeds = torch.from_numpy(np.load(f"{workdir}/seeds.npy"))
    # row v of our CSR lists the vertices v aggregates from: that is DGL's CSC (in-edges)
    g = dgl.graph(("csc", (indptr, indices, torch.arange(indices.numel()))), num_nodes=indptr.numel() - 1)
    g = g.formats(["csc"])
    # DGL lists fan-outs from the input layer inwards: [10, 25] samples 25 at hop 1
    sampler = dgl.dataloading.NeighborSampler([int(f) for f in reversed(fanouts.split(","))])
    for b in range(warmup):
        sampler.sample_blocks(g, seeds[b])
    for r in range(rounds):
        line = sys.stdin.readline()  # the parent says when to run a round
        edges, nodes, t0 = 0, 0, time.perf_counter()
        for b in range(warmup, seeds.shape[0]):
            input_nodes, _, blocks = sampler.sample_blocks(g, seeds[b])
            edges += sum(int(bl.num_edges()) for bl in blocks)
            nodes += int(input_nodes.numel())
        dt = time.perf_counter() - t0
        print(json.dumps({"seconds": dt, "edges": edges, "nodes": nodes, "dgl": dgl.__version__}), flush=True)
    """
)


def chung_lu_csr(num_nodes: int, num_edges: int, skew: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Inline Chung–Lu (weights ``(i+1)**-skew``, randomly relabelled): CSR, no loops or repeats."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, num_nodes + 1, dtype=np.float64) ** -skew)
    cdf /= cdf[-1]
    # sorted queries make searchsorted cache-friendly; a shuffle restores independence
    src = np.searchsorted(cdf, np.sort(rng.random(num_edges)))
    dst = np.searchsorted(cdf, np.sort(rng.random(num_edges)))
    rng.shuffle(dst)
    perm = rng.permutation(num_nodes)
    key = np.unique(perm[dst] * num_nodes + perm[src])
    dst, src = np.divmod(key, num_nodes)
    keep = dst != src
    dst, src = dst[keep], src[keep]
    indptr = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    return indptr, src.astype(np.int32)


def make_graph(args: argparse.Namespace, workdir: Path) -> tuple[np.ndarray, np.ndarray, str]:
    tag = f"chung-lu n={args.nodes} m={args.edges} skew={args.skew} seed={args.seed}"
    stamp = workdir / "graph.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("tag") == tag:
        how = json.loads(stamp.read_text())["how"]
        return np.load(workdir / "indptr.npy"), np.load(workdir / "indices.npy"), how
    indptr = indices = None
    how = "inline Chung-Lu"
    try:  # the project's generator when it is there, else the inline one (same model)
        from training.data import open_dataset
        from training.synth import SynthSpec
        from training.synth_run import synthesize

        spec = SynthSpec(num_nodes=args.nodes, num_edges=args.edges, generator="chung-lu",
                         skew=args.skew, feature_dim=0, seed=args.seed)
        synthesize(workdir / "dataset", spec, overwrite=True)
        ds = open_dataset(workdir / "dataset")
        indptr, indices = np.asarray(ds.indptr, np.int64), np.asarray(ds.indices)
        how = "training.synth (chung-lu)"
    except Exception as exc:  # noqa: BLE001 — any failure falls back to the inline model
        print(f"training.synth unavailable ({type(exc).__name__}: {exc}); using the inline generator")
        indptr, indices = chung_lu_csr(args.nodes, args.edges, args.skew, args.seed)
    np.save(workdir / "indptr.npy", indptr)
    np.save(workdir / "indices.npy", indices)
    stamp.write_text(json.dumps({"tag": tag, "how": how}))
    return indptr, indices, how


def build_dgl_venv(path: Path) -> None:
    """The recipe of ``../shared/notes/dgl-reference.md``; downloads ~5 GB from PyPI."""
    print(f"building the DGL reference venv in {path}: torch 2.2.1 (~5 GB with CUDA libraries) "
          "and dgl 2.1.0 from PyPI; this takes a while")
    pip = str(path / "bin" / "pip")
    env = dict(os.environ, PIP_CONSTRAINT="")
    wheels = path / "wheels"
    steps = [
        [sys.executable, "-m", "venv", str(path)],
        [pip, "install", "torch==2.2.1"],
        [pip, "download", "--no-deps", "dgl==2.1.0", "-d", str(wheels)],
        "install-dgl",
        [pip, "install", "setuptools<70", "torchdata==0.7.1", "pandas==2.2.3", "pydantic", "pyyaml",
         "requests", "psutil", "tqdm", "scipy", "networkx", "numpy<2"],
    ]
    for step in steps:
        if step == "install-dgl":
            step = [pip, "install", "--no-deps", *map(str, sorted(wheels.glob("dgl-*.whl")))]
        print("+", " ".join(step), flush=True)
        subprocess.run(step, check=True, env=env)


def peak_bytes(sampler: NeighborSampler, seeds: torch.Tensor) -> tuple[int, int]:
    """(bytes of the batch's outputs, peak bytes of tensors alive while sampling it)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        batch = sampler.sample(seeds)
    events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()
                    if e.self_cpu_memory_usage)
    live = np.cumsum([m for _, m in events]) if events else np.zeros(1)
    return batch.nbytes, int(live.max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument(
        "--edges", type=int, default=12_000_000, help="generated edges (>= 10**7 kept after dedup at the default)"
    )
    p.add_argument("--skew", type=float, default=0.7, help="Chung-Lu weight exponent")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8000)
    p.add_argument("--fanouts", default="25,10")
    p.add_argument("--batches", type=int, default=10, help="timed batches per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="alternating ours/DGL rounds; the median is shown")
    p.add_argument(
        "--threads", type=int, default=1, help="intra-op threads, both sides (1: see NeighborSampler num_threads)"
    )
    p.add_argument("--dgl-threads", type=int, help="DGL's threads, if not --threads")
    p.add_argument("--relabel", choices=("map", "unique", "both"), default="both")
    p.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    p.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "moment-bench-sample")
    p.add_argument("--dgl-venv", type=Path, default=os.environ.get("MOMENT_DGL_VENV"),
                   help="a venv with dgl 2.1 + torch 2.2.1 (see --build-dgl-venv)")
    p.add_argument("--build-dgl-venv", type=Path, metavar="DIR",
                   help="build the DGL reference venv in DIR first (downloads ~5 GB), then run with it")
    args = p.parse_args(argv)

    if args.build_dgl_venv:
        build_dgl_venv(args.build_dgl_venv)
        args.dgl_venv = args.build_dgl_venv
    torch.set_num_threads(args.threads)
    args.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    indptr, indices, how = make_graph(args, args.workdir)
    num_nodes, num_edges = indptr.size - 1, indices.size
    deg = np.diff(indptr)
    print(f"graph: {how}, {num_nodes:,} nodes, {num_edges:,} edges, max in-degree {deg.max():,}, "
          f"mean {deg.mean():.1f} ({time.perf_counter() - t0:.1f} s to make/load)")
    if num_edges < 10**7:
        print("note: fewer than 10**7 edges; pass --edges larger for the issue's figure")
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    total = args.warmup + args.batches
    rng = np.random.default_rng(args.seed + 1)
    seeds = rng.permutation(num_nodes)[: total * args.batch_size].reshape(total, args.batch_size)
    np.save(args.workdir / "seeds.npy", seeds.astype(np.int64))
    seeds_t = torch.from_numpy(seeds.astype(np.int64))

    dgl = None
    dgl_version = ""
    if args.dgl_venv:
        python = Path(args.dgl_venv) / "bin" / "python"
        script = args.workdir / "dgl_side.py"
        script.write_text(DGL_SIDE)
        dgl = subprocess.Popen(
            [str(python), str(script), str(args.workdir), args.fanouts, str(args.rounds),
             str(args.warmup), str(args.dgl_threads or args.threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, OMP_NUM_THREADS=str(args.dgl_threads or args.threads), DGLBACKEND="pytorch"),
        )

    modes = ("map", "unique") if args.relabel == "both" else (args.relabel,)
    samplers = {
        m: NeighborSampler(indptr, indices, fanouts, seed=args.seed, relabel=m, num_threads=args.threads)
        for m in modes
    }
    results: dict[str, list[tuple[float, int, int]]] = {m: [] for m in modes}
    results["dgl"] = []
    for s in samplers.values():
        for b in range(args.warmup):
            s.sample(seeds_t[b])
    for _ in range(args.rounds):
        for mode, s in samplers.items():
            edges = nodes = 0
            t = time.perf_counter()
            for b in range(args.warmup, total):
                batch = s.sample(seeds_t[b])
                edges += batch.num_edges
                nodes += batch.num_nodes
            results[mode].append((time.perf_counter() - t, edges, nodes))
        if dgl is not None:
            dgl.stdin.write("go\n")
            dgl.stdin.flush()
            line = dgl.stdout.readline()
            if not line:
                print("DGL side failed; see its stderr above")
                dgl = None
                continue
            r = json.loads(line)
            results["dgl"].append((r["seconds"], r["edges"], r["nodes"]))
            dgl_version = r["dgl"]
    if dgl is not None:
        dgl.wait()

    def rate(rows: list[tuple[float, int, int]]) -> tuple[float, float, float]:
        best = statistics.median(e / s for s, e, _ in rows)
        edges_per_batch = statistics.mean(e for _, e, _ in rows) / args.batches
        nodes_per_batch = statistics.mean(n for _, _, n in rows) / args.batches
        return best, edges_per_batch, nodes_per_batch

    print(f"fan-out {args.fanouts}, batch {args.batch_size}, {args.batches} batches x {args.rounds} rounds, "
          f"{args.threads} thread(s); median round")
    print(f"{'sampler':<28}{'edges/s':>14}{'ms/batch':>10}{'edges/batch':>13}{'nodes/batch':>13}")
    ours = {}
    for mode in modes:
        r, e, n = rate(results[mode])
        ours[mode] = r
        print(f"{'moment (relabel=' + mode + ')':<28}{r:>14,.0f}{e / r * 1e3:>10.1f}{e:>13,.0f}{n:>13,.0f}")
    if results["dgl"]:
        r, e, n = rate(results["dgl"])
        label = f"dgl {dgl_version} C++ CPU ({args.dgl_threads or args.threads}t)"
        print(f"{label:<28}{r:>14,.0f}{e / r * 1e3:>10.1f}{e:>13,.0f}{n:>13,.0f}")
        for mode in modes:
            print(f"ratio moment(relabel={mode}) / dgl: {ours[mode] / r:.2f}x")
    else:
        print("dgl: reference not run (pass --dgl-venv DIR, or --build-dgl-venv DIR to build it; ~5 GB)")
    ref = rate(results["dgl"])[0] if results["dgl"] else None
    write(args.json, "bench_sample", [
        Figure("sample", f"fan-out {args.fanouts}, batch {args.batch_size}, relabel={m}, {args.threads} thread(s)",
               "M edges/s", ours[m] / 1e6, None if ref is None else ref / 1e6,
               f"DGL {dgl_version} C++ CPU sampler" if ref else "DGL (not run: no --dgl-venv)")
        for m in modes], " ".join(sys.argv))
    for mode, s in samplers.items():
        out_b, peak_b = peak_bytes(s, seeds_t[args.warmup])
        print(f"memory per batch (relabel={mode}): outputs {out_b / 2**20:.1f} MiB, peak of tensors "
              f"allocated while sampling {peak_b / 2**20:.1f} MiB; reusable vertex map "
              f"{s.map_nbytes / 2**20:.1f} MiB; graph {(indptr.nbytes + indices.nbytes) / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
