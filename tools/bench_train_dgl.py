"""GraphSAGE mini-batch training: ``moment train`` against DGL's own training loop (not a test).

    python tools/bench_train_dgl.py [--nodes 200000 --edges 4000000] [--dgl-venv DIR] [--rounds 3]
    python tools/bench_train_dgl.py --out-of-core [--memory-limit 3GiB] ...

What a user would pick instead of Moment is DGL's GraphSAGE example
(``examples/pytorch/graphsage/node_classification.py``: ``dgl.dataloading.DataLoader``
over ``NeighborSampler``, ``dglnn.SAGEConv(..., "mean")`` layers, ReLU and dropout 0.5
between layers, Adam). Both sides train the same Chung-Lu graph (made once with
``moment data synth``, cached in ``--workdir``) with the same fan-outs, batch size,
hidden size, learning rate and intra-op threads, one epoch per round, each in its own
process; rounds alternate ours / DGL so that load on a shared machine hits both
alike. DGL runs with ``num_workers`` 0 and 1 (its sampler inline, or in a worker
process overlapping compute, as our prefetch thread does) and the faster is the
reference. Figures: seeds per second of the epoch loop (start-up and graph loading
excluded on both sides), median and range over ``--rounds``.

``--out-of-core``: features larger than the memory the run may use. Each side runs
in its own memory cgroup of ``--memory-limit`` (cgroup v1 or v2): DGL reads features
through an ``np.memmap`` of ``features.npy`` (page faults, synchronous; ``1r`` in
``--dgl-workers``: with ``madvise(MADV_RANDOM)``, no read-around), ours through
``moment place`` bins (a host cache of ``--cpu-cache`` in all, ``--strategy``, and
SSD bins read with O_DIRECT). A page is charged to the cgroup that first read it, so
a cgroup alone does not bound what DGL reads from memory: the file's pages left in
the page cache by the generator are evicted first, and before each DGL round the
page cache charged to every other side (our cache fill, the other DGL runs) is
reclaimed; DGL keeps its own (an epoch after the first starts as warm as its limit
lets it). Each round prints where each side's memory went (peak, page cache, anon,
how much of ``features.npy`` is resident) and the share of our rows the host cache
served. Without permission to make a cgroup the script says so and stops: a file
the page cache holds would measure memory, not the disk.

DGL cannot be a dependency (its newest wheel loads only with torch <= 2.2.1); build its
venv once with ``python tools/bench_sample.py --build-dgl-venv DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]

DGL_SIDE = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import dgl, dgl.nn as dglnn
    from dgl.dataloading import DataLoader, NeighborSampler
    d, fanouts, batch, hidden, threads, workers, feats_mode, lr, seed = sys.argv[1:10]
    batch, hidden, threads, workers = int(batch), int(hidden), int(threads), int(workers)
    lr, seed = float(lr), int(seed)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    load = lambda name, **kw: np.load(os.path.join(d, name + ".npy"), **kw)
    indptr = torch.from_numpy(load("indptr").astype(np.int64))
    indices = torch.from_numpy(load("indices").astype(np.int64))
    # row v of the CSR lists the vertices v aggregates from: DGL's CSC (in-edges)
    g = dgl.graph(("csc", (indptr, indices, torch.arange(indices.numel()))), num_nodes=indptr.numel() - 1)
    g = g.formats(["csc"])
    if feats_mode == "memory":
        feat = torch.from_numpy(np.array(load("features")))
    else:  # the page cache serves it, as far as the memory budget lets it
        fmap = load("features", mmap_mode="r")
        if feats_mode == "memmap-random":  # read only the pages touched (no read-around)
            import mmap
            fmap._mmap.madvise(mmap.MADV_RANDOM)
        feat = torch.from_numpy(fmap)
    labels = torch.from_numpy(load("labels").astype(np.int64))
    train_idx = torch.from_numpy(load("train_idx").astype(np.int64))
    num_classes = int(labels.max()) + 1

    class SAGE(nn.Module):  # DGL's examples/pytorch/graphsage/node_classification.py
        def __init__(self, i, h, o, layers):
            super().__init__()
            dims = [i] + [h] * (layers - 1) + [o]
            self.layers = nn.ModuleList(dglnn.SAGEConv(dims[k], dims[k + 1], "mean") for k in range(layers))
            self.dropout = nn.Dropout(0.5)
        def forward(self, blocks, x):
            h = x
            for l, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if l != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    fo = [int(f) for f in fanouts.split(",")]
    sampler = NeighborSampler(list(reversed(fo)))  # DGL lists the input layer's fan-out first
    loader = DataLoader(g, train_idx, sampler, batch_size=batch, shuffle=True, drop_last=False,
                        num_workers=workers, persistent_workers=workers > 0)
    model = SAGE(feat.shape[1], hidden, num_classes, len(fo))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    rounds = int(sys.argv[10])
    for r in range(rounds):
        sys.stdin.readline()  # the parent says when to run a round
        model.train()
        seeds, t0, c0 = 0, time.perf_counter(), time.process_time()
        for input_nodes, output_nodes, blocks in loader:
            x = feat[input_nodes].float()
            y = labels[output_nodes]
            loss = F.cross_entropy(model(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seeds += int(output_nodes.numel())
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"seconds": dt, "cpu_s": cpu, "seeds": seeds, "loss": float(loss),
                          "dgl": dgl.__version__}), flush=True)
    """
)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        why = (" (killed by a signal: over the memory cgroup's limit? lower --batch-size or the fan-outs)"
               if proc.returncode < 0 or proc.returncode == 137 else "")
        sys.exit(f"failed{why}: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc


class Cgroup:
    """A memory cgroup (v2 if mounted and delegated, else v1) that child processes join."""

    def __init__(self, limit_bytes: int) -> None:
        name = f"moment-bench-{uuid.uuid4().hex[:8]}"
        v2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() else None
        if Path("/sys/fs/cgroup/cgroup.controllers").exists():
            v2 = Path("/sys/fs/cgroup")
        self.path = None
        errors = []
        if v2 is not None and "memory" in (v2 / "cgroup.controllers").read_text():
            try:
                (v2 / name).mkdir()
                (v2 / name / "memory.max").write_text(str(limit_bytes))
                self.path, self.procs = v2 / name, v2 / name / "cgroup.procs"
            except OSError as exc:
                errors.append(f"v2: {exc}")
        if self.path is None:
            v1 = Path("/sys/fs/cgroup/memory")
            try:
                (v1 / name).mkdir()
                (v1 / name / "memory.limit_in_bytes").write_text(str(limit_bytes))
                self.path, self.procs = v1 / name, v1 / name / "cgroup.procs"
            except OSError as exc:
                errors.append(f"v1: {exc}")
        if self.path is None:
            sys.exit("--out-of-core needs a memory cgroup to bound the page cache, and none could be made "
                     f"({'; '.join(errors)}); run as root on a machine with cgroups")
        self.limit = limit_bytes
        self.v1 = self.path.parent.name == "memory"

    def reset_peak(self) -> None:
        if self.v1:  # cgroup v2's memory.peak cannot be reset before Linux 6.12: it then covers all rounds
            with contextlib.suppress(OSError):
                (self.path / "memory.max_usage_in_bytes").write_text("0")

    def drop_cache(self) -> None:
        """Reclaim the page cache charged here (mapped or not); the processes' own memory stays."""
        with contextlib.suppress(OSError):  # no swap: reclaim gives up on anonymous memory, as wanted
            if self.v1:
                (self.path / "memory.force_empty").write_text("0")
            else:
                (self.path / "memory.reclaim").write_text(str(1 << 50))

    def usage(self) -> dict[str, int]:
        """Bytes charged now: page cache (``cache``), anonymous (``anon``), mapped files; and the peak."""
        stat = dict(line.split() for line in (self.path / "memory.stat").read_text().splitlines())
        keys = (("cache", "rss", "mapped_file") if self.v1 else ("file", "anon", "file_mapped"))
        out = {k: int(stat.get(n, 0)) for k, n in zip(("cache", "anon", "mapped_file"), keys, strict=True)}
        with contextlib.suppress(OSError, ValueError):
            peak = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
            out["peak"] = int((self.path / peak).read_text())
        return out

    def preexec(self):
        procs = self.procs

        def join() -> None:
            procs.write_text(str(os.getpid()))

        return join

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


def ours(args, dataset: Path, metrics: Path, placement: Path | None, cgroup: Cgroup | None) -> dict:
    metrics.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "moment", "train", "--dataset", str(dataset), "--model", "sage",
           "--fanouts", args.fanouts, "--batch-size", str(args.batch_size), "--hidden", str(args.hidden),
           "--lr", str(args.lr), "--epochs", "1", "--eval-every", "0", "--metrics", str(metrics),
           # the run ends with an evaluation (not timed: epoch_s stops before it); in training's batch
           # size, so that its batches fit the same memory budget
           "--eval-batch-size", str(args.batch_size)]
    if args.prefetch is not None:
        cmd += ["--prefetch", str(args.prefetch)]
    if placement is not None:
        cmd += ["--placement", str(placement)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    run(cmd, env=env, preexec_fn=cgroup.preexec() if cgroup else None)
    rec = [json.loads(x) for x in metrics.read_text().splitlines()]
    ep = [r for r in rec if r.get("kind") == "epoch"][-1]
    start = next((r for r in rec if r.get("kind") == "start"), {})
    return {"cache_bytes": start.get("memory", {}).get("host"),
            "seconds": ep["epoch_s"], "cpu_s": ep["cpu_s"], "seeds": ep["seeds"], "seeds_per_s": ep["seeds_per_s"],
            "split": {k: ep[k] for k in ("sample_s", "gather_s", "compute_s", "io_wait_s")},
            "tiers": ep.get("tiers", {})}


class Dgl:
    """One DGL training process kept alive across rounds (graph loading once, like a user's script)."""

    def __init__(self, args, dataset: Path, workers: int, feats: str, cgroup: Cgroup | None) -> None:
        python = Path(args.dgl_venv) / "bin" / "python"
        self.proc = subprocess.Popen(
            [str(python), "-c", DGL_SIDE, str(dataset), args.fanouts, str(args.batch_size), str(args.hidden),
             str(args.threads), str(workers), feats, str(args.lr), "0", str(args.rounds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, OMP_NUM_THREADS=str(args.threads), DGLBACKEND="pytorch"),
            preexec_fn=cgroup.preexec() if cgroup else None)

    def round(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"the DGL side died:\n{self.proc.stderr.read()[-3000:]}")
        r = json.loads(line)
        r["seeds_per_s"] = r["seeds"] / r["seconds"]
        return r

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # still in a round the parent gave up on
            self.proc.kill()
            self.proc.wait()


def evict(path: Path) -> None:
    """Drop ``path``'s unmapped pages from the page cache (pages a process still maps stay)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_bytes(path: Path) -> int | None:
    """Bytes of ``path`` in the page cache now (util-linux ``fincore``), None without it."""
    with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return int(out.split()[0])
    return None


def label(w: str) -> str:
    """``1r`` -> ``num_workers=1, MADV_RANDOM``."""
    return f"num_workers={w.rstrip('r')}" + (", MADV_RANDOM" if w.endswith("r") else "")


def memory_line(res: dict[str, list[dict]], workers: list[int]) -> str:
    """Where each side's memory went in the last round (MiB), and our cache's share of the rows."""
    mib = lambda v: "?" if v is None else f"{v / 2**20:.0f}"  # noqa: E731
    o = res["ours"][-1]
    tiers = o.get("tiers", {})
    rows = sum(t.get("rows", 0) for t in tiers.values()) or 1
    hit = sum(t.get("rows", 0) for k, t in tiers.items() if k != "ssd") / rows
    parts = [f"ours: peak {mib(o['memory'].get('peak'))} MiB, host cache {mib(o.get('cache_bytes'))} MiB, "
             f"rows from it {hit:.0%}"]
    for w in workers:
        m = res[f"dgl{w}"][-1]["memory"]
        parts.append(f"DGL {w}: peak {mib(m.get('peak'))}, page cache {mib(m['cache'])} (features.npy resident "
                     f"{mib(m.get('features_resident'))}), anon {mib(m['anon'])}")
    return "; ".join(parts)


def parse_size(text: str) -> int:
    sys.path.insert(0, str(REPO))
    from momentbase.units import parse_size as ps

    return ps(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="200000")
    ap.add_argument("--edges", default="4000000")
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--train-share", default="0.25", help="training vertices, share of all (default 0.25)")
    ap.add_argument("--fanouts", default="25,10")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of both sides (default 2)")
    ap.add_argument("--prefetch", type=int, default=None, metavar="K",
                    help="our --prefetch (default: moment train's own default)")
    ap.add_argument("--rounds", type=int, default=3, help="epochs per side, alternating (default 3)")
    ap.add_argument("--dgl-workers", default="0,1",
                    help="DGL DataLoader num_workers to try (default 0,1); with --out-of-core a trailing r "
                         "(e.g. 1r) maps the features with madvise(MADV_RANDOM): no read-around")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/moment-bench-train-dgl"))
    ap.add_argument("--dgl-venv", default=os.environ.get("MOMENT_DGL_VENV", "/var/tmp/dglv"),
                    help="a venv with dgl 2.1 + torch 2.2.1 (tools/bench_sample.py --build-dgl-venv DIR)")
    ap.add_argument("--out-of-core", action="store_true",
                    help="features from disk under a memory cgroup: DGL through np.memmap, ours through bins")
    ap.add_argument("--memory-limit", default="3GiB", help="--out-of-core: the cgroup's memory limit")
    ap.add_argument("--cpu-cache", default="1GiB",
                    help="--out-of-core: our host cache in all (counts in the limit; default 1GiB)")
    ap.add_argument("--strategy", default="ddak", choices=("ddak", "hot-first"),
                    help="--out-of-core: moment place --strategy (default ddak)")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args()
    if not (Path(args.dgl_venv) / "bin" / "python").exists():
        print(f"no DGL venv at {args.dgl_venv}: build it with python tools/bench_sample.py --build-dgl-venv DIR; "
              "the reference was not run")
        return 0
    args.workdir.mkdir(parents=True, exist_ok=True)
    tag = f"{args.nodes}-{args.edges}-{args.feature_dim}-{args.train_share}"
    dataset = args.workdir / f"graph-{tag}"
    if not (dataset / "meta.json").exists():
        print(f"making the graph: Chung-Lu, {args.nodes} nodes, {args.edges} edges, {args.feature_dim} features",
              flush=True)
        run([sys.executable, "-m", "moment", "data", "synth", str(dataset), "--nodes", args.nodes, "--edges",
             args.edges, "--generator", "chung-lu", "--undirected", "--feature-dim", str(args.feature_dim),
             "--train-share", args.train_share, "--seed", "7", "--quiet"])
    feat_bytes = os.path.getsize(dataset / "features.npy")
    cgroup = placement = None
    mode = "features in memory"
    if args.out_of_core:
        limit = parse_size(args.memory_limit)
        if feat_bytes < 2 * limit:
            sys.exit(f"--out-of-core: the features ({feat_bytes / 2**30:.1f} GiB) must be at least 2x the memory "
                     f"limit ({limit / 2**30:.1f} GiB): raise --nodes or --feature-dim, or lower --memory-limit")
        cache = parse_size(args.cpu_cache)
        placement = args.workdir / f"place-{tag}-{args.strategy}-{cache >> 20}MiB"
        if not (placement / "placement.json").exists():
            print(f"placing: host cache of {cache / 2**30:.2f} GiB + SSD bins ({args.strategy})", flush=True)
            # Machine B's plan (2 NUMA nodes: the cache is split over them; 8 SSDs, all in one directory
            # here, on this machine's one disk)
            run([sys.executable, "-m", "moment", "place", "--dataset", str(dataset), "--machine", "moment-b",
                 "--gpu-cache", "0", "--cpu-cache", str(cache // 2), *[a for i in range(8) for a in
                                                                       ("--ssd", str(placement))],
                 "--strategy", args.strategy,
                 "--fanouts", args.fanouts, "--batch-size", str(args.batch_size), "--out", str(placement),
                 "--force"])
        cgroup = limit
        mode = (f"features {feat_bytes / 2**30:.1f} GiB on disk, memory limit {limit / 2**30:.1f} GiB "
                "(DGL: np.memmap; ours: moment place bins)")
    print(f"{mode}; GraphSAGE {args.fanouts}, batch {args.batch_size}, hidden {args.hidden}, "
          f"{args.threads} threads, {args.rounds} rounds", flush=True)
    metrics = args.workdir / f"metrics-{os.getpid()}.jsonl"  # two runs sharing the work directory stay apart
    workers = args.dgl_workers.split(",")
    # one cgroup per process: each side gets the whole budget, none is charged for another's memory
    groups = {k: Cgroup(cgroup) for k in ["ours", *workers]} if cgroup else {}
    if cgroup:  # the file's pages the generator left in the page cache (charged to no side) go first
        evict(dataset / "features.npy")

    def feats(w: str) -> str:
        return ("memmap-random" if w.endswith("r") else "memmap") if args.out_of_core else "memory"

    dgl = {w: Dgl(args, dataset, int(w.rstrip("r")), feats(w), groups.get(w)) for w in workers}
    res: dict[str, list[dict]] = {"ours": [], **{f"dgl{w}": [] for w in workers}}
    try:
        load_before = os.getloadavg()
        for r in range(args.rounds):
            if "ours" in groups:
                groups["ours"].reset_peak()
            res["ours"].append(ours(args, dataset, metrics, placement, groups.get("ours")))
            if "ours" in groups:
                res["ours"][-1]["memory"] = groups["ours"].usage()
            for w, side in dgl.items():
                if args.out_of_core:
                    # only this side's own pages may serve its reads: the page cache charged to the
                    # other sides (our cache fill, the other DGL runs) is reclaimed; its own stays (an
                    # epoch after the first starts as warm as its memory limit lets it)
                    for other, g in groups.items():
                        if other != w:
                            g.drop_cache()
                    groups[w].reset_peak()
                res[f"dgl{w}"].append(side.round())
                if args.out_of_core:
                    res[f"dgl{w}"][-1]["memory"] = groups[w].usage()
                    res[f"dgl{w}"][-1]["memory"]["features_resident"] = resident_bytes(dataset / "features.npy")
            print(f"round {r + 1}: ours {res['ours'][-1]['seeds_per_s']:.0f} seeds/s; "
                  + "; ".join(f"DGL {label(w)} {res[f'dgl{w}'][-1]['seeds_per_s']:.0f}" for w in workers)
                  + f" (load {os.getloadavg()[0]:.2f})", flush=True)
            if args.out_of_core:
                print("  " + memory_line(res, workers), flush=True)
    finally:
        for side in dgl.values():
            side.close()
        for g in groups.values():
            g.close()
        metrics.unlink(missing_ok=True)

    def med(k: str) -> float:
        return statistics.median(x["seeds_per_s"] for x in res[k])

    def rng(k: str) -> str:
        v = [x["seeds_per_s"] for x in res[k]]
        return f"{min(v):.0f}-{max(v):.0f}"

    best = max(workers, key=lambda w: med(f"dgl{w}"))
    o, d = med("ours"), med(f"dgl{best}")
    print(f"\n{'':28}{'seeds/s (median)':>18}{'range':>14}")
    print(f"{'ours (moment train)':28}{o:>18.0f}{rng('ours'):>14}")
    for w in workers:
        print(f"{f'DGL {label(w)}':28}{med(f'dgl{w}'):>18.0f}{rng(f'dgl{w}'):>14}")
    split = res["ours"][len(res["ours"]) // 2]["split"]
    print(f"ours / DGL (best, {label(best)}): {o / d:.2f}x; our epoch split (s): "
          + ", ".join(f"{k[:-2]} {v:.1f}" for k, v in split.items()))

    def cpu(k: str) -> float:  # CPU seconds per 1000 seeds: the work, which load stretches less than the wall
        return statistics.median(1e6 * x["cpu_s"] / x["seeds"] for x in res[k])

    # against DGL inline (num_workers=0) when it ran: a worker process's CPU time is not counted
    cref = "0" if "0" in workers else best
    print(f"CPU ms per 1000 seeds (median): ours {cpu('ours'):.0f}, DGL {label(cref)} {cpu(f'dgl{cref}'):.0f}; "
          f"ours / DGL {cpu(f'dgl{cref}') / cpu('ours'):.2f}x")
    name = "out-of-core (np.memmap vs tiered store)" if args.out_of_core else "features in memory"
    target = ">= 2x" if args.out_of_core else ">= 1.0x"
    write(args.json, "bench_train_dgl", [
        Figure("train_dgl", f"GraphSAGE {args.fanouts}, {args.nodes} nodes, {name}", "seeds/s", o, d,
               f"DGL 2.1 DataLoader ({label(best)})", target=target,
               note=f"median of {args.rounds}; ours {rng('ours')}, DGL {rng(f'dgl{best}')}; {args.threads} threads; "
                    f"load {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"),
        Figure("train_dgl", f"GraphSAGE {args.fanouts}, {args.nodes} nodes, {name}: CPU per seed", "CPU ms/1000 seeds",
               cpu("ours"), cpu(f"dgl{cref}"), f"DGL 2.1 DataLoader ({label(cref)})", higher_is_better=False,
               note=f"median of {args.rounds}; all threads of each training process"
                    + ("; DGL's worker process not counted" if cref != "0" else "")),
    ], " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
