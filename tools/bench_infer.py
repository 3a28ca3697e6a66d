"""Layer-wise out-of-core inference (``moment infer``) against the in-memory full-graph forward (not a test).

    PYTHONPATH=. python tools/bench_infer.py [--dir /var/tmp/bench-infer] [--rounds 3] [--json F]
        [--nodes 400000 --edges 2000000 --memory-limit 768MiB --cpu-cache 64MiB]
        [--small-nodes 20000 --small-edges 100000] [--chunk-bytes 16777216] [--hidden 128]

Two skewed Chung-Lu graphs (``moment data synth``, undirected, 1024 float32 features a row:
``tools/_cli.skewed_graph``) and a two-layer GraphSAGE of random parameters (inference costs the same whatever
was learnt) saved as a ``moment train`` checkpoint. Every run is a process of its own (its peak RSS is its
own, ``os.wait4``), full neighbourhoods in both layers:

- **small** (fits in memory), interleaved per round, warm page cache: ours (:func:`training.infer.run.infer`,
  the features memory-mapped) and the reference, the same model's forward on the whole graph with every
  feature row read into memory first (PyG's full-batch inference; what layer-wise inference must equal: the
  largest difference of the logits is printed and must be below 1e-4). Vertices/s through both layers,
  reading the features included, and peak RSS.
- **large**: ours only, through an in-place placement (``moment place --in-place``: ``features.npy`` is the
  SSD bin, ``--cpu-cache`` of the hottest rows in memory), inside a memory cgroup of ``--memory-limit``,
  below the feature bytes, the features dropped from the page cache first (cold). Vertices/s, the peak RSS
  and the cgroup's peak (page cache included) against the feature bytes. The reference is not run: it holds
  every row in memory.

A process that only imports torch and PyG is measured too (``runtime``): the RSS every run starts from.
Printed and written with ``--json``: medians and ranges over the rounds, the date, the load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _cli import moment, skewed_graph  # noqa: E402
from _results import Figure, drop_from_page_cache, write  # noqa: E402

CHILDREN = ("ours", "ref", "runtime")


def _size(text: str) -> int:
    from momentbase.units import parse_size

    return parse_size(text)


def _checkpoint(ds: Path, path: Path, hidden: int) -> None:
    """A 2-layer GraphSAGE of seeded random parameters for ``ds``, in ``moment train``'s checkpoint format."""
    import torch

    from training.data import open_dataset
    from training.models import build_model
    from training.specs import ModelSpec, SamplingSpec, TrainSpec

    d = open_dataset(ds, validate=False)
    torch.manual_seed(0)
    m = build_model("sage", d.feature_dim, max(1, d.num_classes), 2, hidden=hidden)
    cfg = TrainSpec(str(ds), model=ModelSpec(arch="sage", hidden=hidden), sampling=SamplingSpec(fanouts=(10, 10)))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": cfg.to_dict(), "model": m.state_dict()}, path)


def child(args: argparse.Namespace) -> dict:
    """One run in this process: ours, the reference, or the runtime alone."""
    import numpy as np
    import torch
    import torch_geometric.nn  # noqa: F401  (what every run imports)

    if args.child == "runtime":
        return {"seconds": 0.0}
    t = time.perf_counter()
    if args.child == "ours":
        from training.infer.run import InferSpec, infer

        r = infer(InferSpec(str(args.dataset), str(args.checkpoint), str(args.out), placement=args.placement,
                            chunk_bytes=args.chunk_bytes, overwrite=True))
        return {"seconds": time.perf_counter() - t, "nodes": r.num_nodes, "layers": list(r.layers)}
    from training.data import open_dataset
    from training.infer.model import load_model

    ds = open_dataset(args.dataset, validate=False)
    x = torch.from_numpy(np.array(ds.features, np.float32))  # every row in memory
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices, np.int64)
    ei = torch.from_numpy(np.stack([indices, np.repeat(np.arange(ds.num_nodes), np.diff(indptr))]))
    loaded = load_model(args.checkpoint, x.shape[1], ds.num_classes, str(args.dataset))
    with torch.no_grad():
        logits = loaded.model(x, [ei, ei], ds.num_nodes).numpy()
    sec = time.perf_counter() - t
    Path(args.out).mkdir(parents=True, exist_ok=True)
    np.save(Path(args.out) / "logits.npy", logits)
    return {"seconds": sec, "nodes": ds.num_nodes}


def _run(args: argparse.Namespace, mode: str, dataset: Path, out: Path, *, placement: Path | None = None,
         cgroup=None) -> dict:
    """``mode`` in a process of its own (inside ``cgroup`` if given): its record, peak RSS and cgroup peak."""
    cmd = [sys.executable, __file__, "--child", mode, "--dataset", str(dataset), "--checkpoint",
           str(args.dir / f"{dataset.name}.pt"), "--out", str(out), "--chunk-bytes", str(args.chunk_bytes)]
    if placement is not None:
        cmd += ["--placement", str(placement)]
    if cgroup is not None:
        cgroup.drop_cache()
        cgroup.reset_peak()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                         preexec_fn=cgroup.preexec() if cgroup is not None else None)
    assert p.stdout is not None
    text = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench_infer: {mode} on {dataset.name} failed (exit {os.waitstatus_to_exitcode(status)})"
                 + (" - killed at the memory limit?" if cgroup is not None else ""))
    rec = json.loads(text.strip().splitlines()[-1])
    rec["maxrss_bytes"] = ru.ru_maxrss * 1024
    if cgroup is not None:
        rec["cgroup_peak_bytes"] = cgroup.usage().get("peak")
    return rec


def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _prepare(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    """The two graphs, their checkpoints, the large graph's in-place placement."""
    from bench_outofcore import ONE_SSD

    small = skewed_graph(args.dir / "small", args.small_nodes, args.small_edges)
    large = skewed_graph(args.dir / "large", args.nodes, args.edges)
    for ds in (small, large):
        if not (args.dir / f"{ds.name}.pt").exists():
            _checkpoint(ds, args.dir / f"{ds.name}.pt", args.hidden)
    pl = args.dir / "large-place"
    if not (pl / "placement.json").exists():
        print("placing the large graph in place", flush=True)
        (args.dir / "one-ssd.yaml").write_text(ONE_SSD)
        moment("place", "--dataset", str(large), "--machine", str(args.dir / "one-ssd.yaml"), "--gpu-cache", "0",
               "--cpu-cache", args.cpu_cache, "--ssd", str(args.dir / "ssd"), "--in-place", "--fanouts", "10,10",
               "--batch-size", "1024", "--out", str(pl), "--force", "--json")
    return small, large, pl


def _rounds(args: argparse.Namespace, small: Path, large: Path, pl: Path, cgroup) -> list[dict]:
    import numpy as np

    feats = large / "features.npy"
    rounds = []
    for r in range(args.rounds):
        rec = {"runtime": _run(args, "runtime", small, args.dir / "o-runtime")}
        order = ("ours", "ref") if r % 2 == 0 else ("ref", "ours")  # interleaved: neither always goes first
        for mode in order:
            rec[f"small-{mode}"] = _run(args, mode, small, args.dir / f"o-small-{mode}")
        a = np.load(args.dir / "o-small-ours" / "logits.npy", mmap_mode="r")
        b = np.load(args.dir / "o-small-ref" / "logits.npy", mmap_mode="r")
        rec["max_abs_diff"] = float(np.abs(a - b).max())
        if rec["max_abs_diff"] > 1e-4:
            sys.exit(f"round {r}: layer-wise logits differ from the full-graph forward by {rec['max_abs_diff']:.3g}")
        drop_from_page_cache([feats])  # cold: the feature rows come from the disk
        rec["large-ours"] = _run(args, "ours", large, args.dir / "o-large", placement=pl, cgroup=cgroup)
        rounds.append(rec)
        s, f, g = rec["small-ours"], rec["small-ref"], rec["large-ours"]
        print(f"round {r}: small ours {s['nodes'] / s['seconds']:,.0f} vertices/s ({s['maxrss_bytes'] / 2**20:,.0f} "
              f"MiB peak RSS), reference {f['nodes'] / f['seconds']:,.0f} ({f['maxrss_bytes'] / 2**20:,.0f} MiB), "
              f"max |diff| {rec['max_abs_diff']:.2g}; large ours {g['nodes'] / g['seconds']:,.0f} vertices/s, "
              f"{g['maxrss_bytes'] / 2**20:,.0f} MiB peak RSS, cgroup peak "
              f"{(g.get('cgroup_peak_bytes') or 0) / 2**20:,.0f} MiB", flush=True)
    return rounds


def _figures(args: argparse.Namespace, rounds: list[dict], large: Path, load: str) -> list[Figure]:
    feat_bytes = (large / "features.npy").stat().st_size
    rate = {k: _stats([r[k]["nodes"] / r[k]["seconds"] for r in rounds]) for k in ("small-ours", "small-ref",
                                                                                  "large-ours")}
    rss = {k: _stats([r[k]["maxrss_bytes"] / 2**20 for r in rounds]) for k in ("small-ours", "small-ref",
                                                                               "large-ours", "runtime")}
    cg = _stats([(r["large-ours"].get("cgroup_peak_bytes") or 0) / 2**20 for r in rounds])
    diff = max(r["max_abs_diff"] for r in rounds)
    span = lambda s: f"median of {s['n']}, range {s['min']:,.0f}-{s['max']:,.0f}"  # noqa: E731
    small_what = f"{args.small_nodes:,} vertices, {2 * args.small_edges:,} edges"
    return [
        Figure("infer", f"layer-wise inference, {small_what} (fits): vertices/s through 2 SAGE layers",
               "vertices/s", rate["small-ours"]["median"], rate["small-ref"]["median"],
               "the same model's full-graph forward, every feature row in memory (warm)",
               note=f"ours {span(rate['small-ours'])}, reference {span(rate['small-ref'])}; logits equal to "
                    f"{diff:.2g}; load {load}"),
        Figure("infer", f"layer-wise inference, {small_what}: peak RSS", "MiB", rss["small-ours"]["median"],
               rss["small-ref"]["median"], "the full-graph forward in memory", higher_is_better=False,
               note=f"ours {span(rss['small-ours'])}, reference {span(rss['small-ref'])}; torch and PyG alone "
                    f"{rss['runtime']['median']:,.0f} MiB"),
        Figure("infer", f"out-of-core inference, {args.nodes:,} vertices, {feat_bytes / 2**20:,.0f} MiB features, "
               f"cgroup limit {args.memory_limit_text}: peak RSS vs feature bytes", "MiB",
               rss["large-ours"]["median"], feat_bytes / 2**20, "the feature bytes (what an in-memory run holds)",
               higher_is_better=False, target="peak below the limit and the features",
               note=f"{span(rss['large-ours'])}; cgroup peak (page cache included) {cg['median']:,.0f} MiB; "
                    f"{rate['large-ours']['median']:,.0f} vertices/s ({span(rate['large-ours'])}), cold, "
                    f"placement in place with a {args.cpu_cache} CPU cache; torch and PyG alone "
                    f"{rss['runtime']['median']:,.0f} MiB"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, default=Path("/var/tmp/bench-infer"))
    p.add_argument("--nodes", type=int, default=400_000)
    p.add_argument("--edges", type=int, default=2_000_000)
    p.add_argument("--small-nodes", type=int, default=20_000)
    p.add_argument("--small-edges", type=int, default=100_000)
    p.add_argument("--memory-limit", default="768MiB", help="cgroup limit of the large runs (below the features)")
    p.add_argument("--cpu-cache", default="64MiB", help="the large graph's placement: hot rows in memory")
    p.add_argument("--chunk-bytes", type=int, default=16 << 20, help="rows a chunk may gather, bytes (16 MiB)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="keep the graphs for the next run (default: removed)")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", choices=CHILDREN, help=argparse.SUPPRESS)
    p.add_argument("--dataset", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--placement", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    args.memory_limit_text = args.memory_limit
    args.dir.mkdir(parents=True, exist_ok=True)
    load_before, date = ", ".join(f"{x:.2f}" for x in os.getloadavg()), time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                      time.gmtime())
    small, large, pl = _prepare(args)
    feat = (large / "features.npy").stat().st_size
    limit = _size(args.memory_limit)
    if limit >= feat:
        sys.exit(f"--memory-limit {args.memory_limit} is not below the large graph's {feat / 2**20:,.0f} MiB of "
                 "features; give a smaller limit or more --nodes")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the cgroup is removed (finally below)
    from bench_train_dgl import Cgroup

    cgroup = Cgroup(limit)
    print(f"{date}; load {load_before}; large: {feat / 2**20:,.0f} MiB of features, limit {args.memory_limit}",
          flush=True)
    try:
        rounds = _rounds(args, small, large, pl, cgroup)
    finally:
        cgroup.close()
    load = f"{load_before} before, {', '.join(f'{x:.2f}' for x in os.getloadavg())} after"
    figs = _figures(args, rounds, large, load)
    for f in figs:
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "-"
        print(f"{f.figure}: ours {f.ours:,.1f} {f.unit}, {f.reference_name} {f.reference:,.1f} = {ratio}; {f.note}")
    write(args.json, "infer", figs, " ".join(sys.argv))
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
