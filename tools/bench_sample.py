"""Sampled edges per second: ``training.sampler`` against DGL's C++ CPU sampler (not a test).

    python tools/bench_sample.py [--threads 1,2] [--graph chung-lu,uniform] [--dgl-venv DIR] [--json F]
    python tools/bench_sample.py --build-dgl-venv DIR     # once: builds DGL 2.1 + torch 2.2.1

Generates (once, cached in ``--workdir``) each graph with at least 10**7 edges: a
power-law Chung–Lu graph (``chung-lu``) and a uniform random one (``uniform``, the model
of ``dgl.rand_graph``); writes its CSR and the seed batches, then samples fan-out 25,10
(25 neighbours of every seed, 10 of every vertex reached at hop 1) in batches of 8000
seeds with ours (both relabel modes) and — when a DGL virtual environment is given — with
``dgl.dataloading.NeighborSampler`` in a subprocess of that environment, on the same graph
and seeds, at every thread count of ``--threads`` (both sides the same). Rounds alternate
ours / DGL, each side first in every other round, so that load on a shared machine hits
both alike; the median round is reported with the range, wall and CPU time per batch and
CPU/wall (the cores actually used), and the per-round ratios. DGL samples more edges per
batch than ours: its second hop re-samples the seeds' neighbours, ours (as PyG) does not;
the table says how many fewer.

DGL cannot be a dependency (its newest wheel loads only with torch <= 2.2.1), so
``--build-dgl-venv DIR`` builds that reference in its own virtual environment, following
``../shared/notes/dgl-reference.md``: it downloads about 5 GB (torch 2.2.1 with its CUDA
libraries) from PyPI. Without a venv the script prints our figures and says the
reference was not run.
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
        edges, nodes, t0, c0 = 0, 0, time.perf_counter(), time.process_time()
        for b in range(warmup, seeds.shape[0]):
            input_nodes, _, blocks = sampler.sample_blocks(g, seeds[b])
            edges += sum(int(bl.num_edges()) for bl in blocks)
            nodes += int(input_nodes.numel())
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"seconds": dt, "cpu": cpu, "edges": edges, "nodes": nodes, "dgl": dgl.__version__}),
              flush=True)
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
    return _csr(np.unique(perm[dst] * num_nodes + perm[src]), num_nodes)


def uniform_csr(num_nodes: int, num_edges: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``dgl.rand_graph``'s model (endpoints uniform and independent), as a CSR without loops or repeats."""
    rng = np.random.default_rng(seed)
    return _csr(np.unique(rng.integers(0, num_nodes, num_edges) * num_nodes + rng.integers(0, num_nodes, num_edges)),
                num_nodes)


def _csr(keys: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """The CSR of the sorted, distinct edge keys ``dst * num_nodes + src``, self-loops dropped."""
    dst, src = np.divmod(keys, num_nodes)
    keep = dst != src
    dst, src = dst[keep], src[keep]
    indptr = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    return indptr, src.astype(np.int32)


def make_graph(args: argparse.Namespace, graph: str, workdir: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """The CSR of ``graph`` (made once, cached in ``workdir``): ``(indptr, indices, how it was made)``."""
    tag = f"{graph} n={args.nodes} m={args.edges} skew={args.skew} seed={args.seed}"
    stamp = workdir / "graph.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("tag") == tag:
        how = json.loads(stamp.read_text())["how"]
        return np.load(workdir / "indptr.npy"), np.load(workdir / "indices.npy"), how
    if graph == "uniform":
        indptr, indices = uniform_csr(args.nodes, args.edges, args.seed)
        how = "uniform random (dgl.rand_graph's model)"
    else:
        indptr, indices, how = chung_lu(args, workdir)
    np.save(workdir / "indptr.npy", indptr)
    np.save(workdir / "indices.npy", indices)
    stamp.write_text(json.dumps({"tag": tag, "how": how}))
    return indptr, indices, how


def chung_lu(args: argparse.Namespace, workdir: Path) -> tuple[np.ndarray, np.ndarray, str]:
    try:  # the project's generator when it is there, else the inline one (same model)
        from training.data import open_dataset
        from training.synth import SynthSpec
        from training.synth_run import synthesize

        spec = SynthSpec(num_nodes=args.nodes, num_edges=args.edges, generator="chung-lu",
                         skew=args.skew, feature_dim=0, seed=args.seed)
        synthesize(workdir / "dataset", spec, overwrite=True)
        ds = open_dataset(workdir / "dataset")
        return np.asarray(ds.indptr, np.int64), np.asarray(ds.indices), "training.synth (chung-lu)"
    except Exception as exc:  # noqa: BLE001 — any failure falls back to the inline model
        print(f"training.synth unavailable ({type(exc).__name__}: {exc}); using the inline generator")
        return (*chung_lu_csr(args.nodes, args.edges, args.skew, args.seed), "inline Chung-Lu")


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


Row = tuple[float, float, int, int]  # one round: wall s, CPU s, edges, vertices


def start_dgl(args: argparse.Namespace, workdir: Path, threads: int) -> subprocess.Popen[str] | None:
    if not args.dgl_venv:
        return None
    script = workdir / "dgl_side.py"
    script.write_text(DGL_SIDE)
    return subprocess.Popen(
        [str(Path(args.dgl_venv) / "bin" / "python"), str(script), str(workdir), args.fanouts,
         str(args.rounds), str(args.warmup), str(threads)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, OMP_NUM_THREADS=str(threads), DGLBACKEND="pytorch"),
    )


def dgl_round(dgl: subprocess.Popen[str]) -> tuple[Row, str] | None:
    assert dgl.stdin is not None and dgl.stdout is not None
    dgl.stdin.write("go\n")
    dgl.stdin.flush()
    line = dgl.stdout.readline()
    if not line:
        print("DGL side failed; see its stderr above")
        return None
    r = json.loads(line)
    return (r["seconds"], r["cpu"], r["edges"], r["nodes"]), r["dgl"]


def run_config(args: argparse.Namespace, csr: tuple[np.ndarray, np.ndarray], seeds: torch.Tensor,
               workdir: Path, threads: int) -> tuple[dict[str, list[Row]], str]:
    """Rounds of ours (each relabel mode) and DGL at ``threads``, in alternating order."""
    torch.set_num_threads(threads)
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    modes = ("map", "unique") if args.relabel == "both" else (args.relabel,)
    samplers = {m: NeighborSampler(*csr, fanouts, seed=args.seed, relabel=m, num_threads=threads) for m in modes}
    rows: dict[str, list[Row]] = {m: [] for m in (*modes, "dgl")}
    dgl, version = start_dgl(args, workdir, threads), ""
    for s in samplers.values():
        for b in range(args.warmup):
            s.sample(seeds[b])
    for r in range(args.rounds):
        order = [*samplers, "dgl"] if r % 2 == 0 else ["dgl", *samplers]  # neither side always first
        for side in order:
            if side == "dgl":
                got = dgl_round(dgl) if dgl is not None else None
                if got is None:
                    dgl = None
                    continue
                rows["dgl"].append(got[0])
                version = got[1]
                continue
            edges = nodes = 0
            wall, cpu = time.perf_counter(), time.process_time()
            for b in range(args.warmup, seeds.shape[0]):
                batch = samplers[side].sample(seeds[b])
                edges += batch.num_edges
                nodes += batch.num_nodes
            rows[side].append((time.perf_counter() - wall, time.process_time() - cpu, edges, nodes))
    if dgl is not None:
        dgl.wait()
    return rows, version


def summary(rows: list[Row], batches: int) -> dict[str, float]:
    rates = [e / w for w, _, e, _ in rows]
    return {"rate": statistics.median(rates), "lo": min(rates), "hi": max(rates),
            "cpu_per_wall": statistics.median(c / w for w, c, _, _ in rows),
            "ms_batch": statistics.median(w for w, _, _, _ in rows) / batches * 1e3,
            "cpu_ms_batch": statistics.median(c for _, c, _, _ in rows) / batches * 1e3,
            "edges": statistics.mean(e for _, _, e, _ in rows) / batches,
            "nodes": statistics.mean(n for _, _, _, n in rows) / batches}


def report(args: argparse.Namespace, graph: str, threads: int, rows: dict[str, list[Row]], version: str,
           ) -> tuple[list[Figure], dict[str, dict[str, float]]]:
    """Print one configuration's table; its figures (two per relabel mode) and its summaries per side."""
    print(f"{graph}, {threads} thread(s): median of {args.rounds} rounds of {args.batches} batches (range)")
    print(f"{'sampler':<26}{'M edges/s':>10}{'range':>14}{'ms/batch':>10}{'CPU ms':>8}{'CPU/wall':>9}"
          f"{'edges/batch':>12}{'nodes/batch':>12}")
    stats = {side: summary(r, args.batches) for side, r in rows.items() if r}
    for side, x in stats.items():
        label = f"dgl {version} C++ CPU" if side == "dgl" else f"moment (relabel={side})"
        print(f"{label:<26}{x['rate'] / 1e6:>10.2f}{x['lo'] / 1e6:>7.2f}-{x['hi'] / 1e6:<6.2f}{x['ms_batch']:>10.1f}"
              f"{x['cpu_ms_batch']:>8.1f}{x['cpu_per_wall']:>9.2f}{x['edges']:>12,.0f}{x['nodes']:>12,.0f}")
    ref = stats.get("dgl")
    figures = []
    for mode in (m for m in stats if m != "dgl"):
        x = stats[mode]
        note = f"ours {x['lo'] / 1e6:.2f}-{x['hi'] / 1e6:.2f}; CPU/wall {x['cpu_per_wall']:.2f}"
        if ref is not None:
            pair = [o[2] / o[0] / (d[2] / d[0]) for o, d in zip(rows[mode], rows["dgl"], strict=False)]
            fewer = 1 - x["edges"] / ref["edges"]
            note += (f"; DGL {ref['lo'] / 1e6:.2f}-{ref['hi'] / 1e6:.2f}, CPU/wall {ref['cpu_per_wall']:.2f}; "
                     f"per-round ratio {min(pair):.2f}-{max(pair):.2f}; ours samples {fewer:.0%} fewer edges "
                     "per batch (hop 2 does not re-sample the seeds, as PyG)")
            print(f"ratio moment(relabel={mode}) / dgl: {x['rate'] / ref['rate']:.2f}x (rounds "
                  f"{min(pair):.2f}-{max(pair):.2f}); ours samples {fewer:.0%} fewer edges per batch")
        figures.append(Figure(
            "sample", f"{graph}, fan-out {args.fanouts}, batch {args.batch_size}, relabel={mode}, {threads} thread(s)",
            "M edges/s", x["rate"] / 1e6, None if ref is None else ref["rate"] / 1e6,
            f"DGL {version} C++ CPU sampler" if ref else "DGL (not run: no --dgl-venv)",
            target=">= 1.5x DGL", note=note))
        # CPU time per edge hardly depends on what else runs on a shared machine, wall time does
        figures.append(Figure(
            "sample", f"{graph}, relabel={mode}, {threads} thread(s): CPU per sampled edge", "CPU ns/edge",
            x["cpu_ms_batch"] * 1e6 / x["edges"], None if ref is None else ref["cpu_ms_batch"] * 1e6 / ref["edges"],
            f"DGL {version} C++ CPU sampler" if ref else "DGL (not run: no --dgl-venv)", higher_is_better=False,
            note="all threads of each process, median round"))
    return figures, stats


def thread_scaling(graph: str, rates: dict[int, dict[str, dict[str, float]]]) -> list[Figure]:
    """Per side, the most threads against one (what picks the sampler's default thread count)."""
    if 1 not in rates or len(rates) < 2:
        return []
    most = max(rates)
    figures = []
    for side in rates[1]:
        if side not in rates[most]:
            continue
        one, many = rates[1][side], rates[most][side]
        name = "DGL" if side == "dgl" else f"moment (relabel={side})"
        print(f"{graph}: {name} {many['rate'] / one['rate']:.2f}x from 1 to {most} threads "
              f"(CPU/wall {one['cpu_per_wall']:.2f} -> {many['cpu_per_wall']:.2f})")
        figures.append(Figure(
            "sample", f"{graph}, {name}: {most} threads vs 1", "M edges/s", many["rate"] / 1e6, one["rate"] / 1e6,
            "the same sampler on 1 thread", target="> 1: more threads pay (the default uses them)",
            note=f"CPU/wall {one['cpu_per_wall']:.2f} -> {many['cpu_per_wall']:.2f}"))
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument(
        "--edges", type=int, default=12_000_000, help="generated edges (>= 10**7 kept after dedup at the default)"
    )
    p.add_argument("--skew", type=float, default=0.7, help="Chung-Lu weight exponent")
    p.add_argument("--graph", default="chung-lu,uniform", help="graphs, comma-separated: chung-lu, uniform")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8000)
    p.add_argument("--fanouts", default="25,10")
    p.add_argument("--batches", type=int, default=10, help="timed batches per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7, help="alternating ours/DGL rounds; the median is shown")
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated, each run on both sides")
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
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    figures: list[Figure] = []
    for graph in args.graph.split(","):
        workdir = args.workdir / graph
        workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        indptr, indices, how = make_graph(args, graph, workdir)
        deg = np.diff(indptr)
        print(f"graph: {how}, {indptr.size - 1:,} nodes, {indices.size:,} edges, max in-degree {deg.max():,}, "
              f"mean {deg.mean():.1f} ({time.perf_counter() - t0:.1f} s to make/load)")
        total = args.warmup + args.batches
        rng = np.random.default_rng(args.seed + 1)
        seeds = rng.permutation(indptr.size - 1)[: total * args.batch_size].reshape(total, args.batch_size)
        np.save(workdir / "seeds.npy", seeds.astype(np.int64))
        seeds_t = torch.from_numpy(seeds.astype(np.int64))
        rates = {}
        for threads in (int(t) for t in args.threads.split(",")):
            rows, version = run_config(args, (indptr, indices), seeds_t, workdir, threads)
            got, rates[threads] = report(args, graph, threads, rows, version)
            figures += got
        figures += thread_scaling(graph, rates)
        if not args.dgl_venv:
            print("dgl: reference not run (pass --dgl-venv DIR, or --build-dgl-venv DIR to build it; ~5 GB)")
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; warm (graphs in memory, kernels compiled)")
    for f in figures:
        object.__setattr__(f, "note", f"{f.note}; load {' '.join(load_before)} -> {' '.join(load_after)}")
    write(args.json, "bench_sample", figures, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
