"""GPU figures (not a test): sampling, gathers per tier, SSD reads into GPU memory, one epoch, row checks.

    python tools/bench_gpu.py [--dir /mnt/nvme0/moment-gpu] [--nodes 1000000 --edges 12000000] [--json F]
    python tools/bench_gpu.py --quick             # minutes: a 200k-vertex graph
    python tools/bench_gpu.py --dry-run-cpu       # checks this script on a machine without a GPU

Needs an NVIDIA GPU with PyTorch built for CUDA (``torch.cuda.is_available()``);
without one it says so and exits 0 (with ``--json``: no figures, the reason).
KvikIO figures need ``pip install kvikio-cu12`` (else "not measured", said).
Every figure is ours against a reference measured in the same run, on the same
data, with the ratio (above 1: ours better), median of ``--rounds`` rounds:

1. **sampling**, M edges/s: ``NeighborSampler`` with the CSR on the GPU vs on the
   CPU (same graph, seeds, fan-outs 25,10, batches of 8000; the GPU timed to
   completion with ``torch.cuda.synchronize``);
2. **gather, GPU tier**, M rows/s into GPU memory: the store's device gather vs
   the same rows taken from host memory the naive way (``index_select`` into
   pageable memory, then ``.to(device)``);
3. **gather, CPU tier**: the store (``index_select`` into pinned staging, one
   asynchronous copy) vs the naive way;
4. **SSD tier into GPU memory**: KvikIO (``--backend kvikio``: ``CuFile.pread``
   into device memory; GDS or compatibility mode, said) vs posix (O_DIRECT
   reads into pinned memory, one copy up), through the store;
5. **one epoch** on one GPU (GraphSAGE 25,10, hidden 256), seeds/s: features
   through a placement with a GPU cache (GPU, CPU and SSD tiers) vs all
   features in host memory (every row copied up from pinned staging);
6. **correctness**: the rows every tier and backend gathered into GPU memory,
   compared with the in-memory feature matrix, bit for bit. Any difference is
   printed and the script exits 1.

The graph (Chung-Lu, ``training.synth``) and the placement (the highest-degree
vertices in the GPU cache, the next in the CPU cache, every row in an SSD bin
under ``--dir``, which should be on the NVMe SSD to test) are made once and
reused. Put the results in docs/benchmarks.md with
``python tools/bench_all.py --only gpu`` (it records the GPU's name).

``--dry-run-cpu`` runs every step on the CPU with tiny inputs to check that this
script works where no GPU is: its numbers are not GPU figures, and it refuses
``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import Figure, write  # noqa: E402


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rate(fn: Callable[[], int], device, seconds: float) -> float:
    """Units per second of ``fn`` (which returns the units it did), run to completion on ``device``."""
    fn()  # warm up (allocator, kernels, page cache of the index arrays)
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while True:
        n += fn()
        _sync(device)
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n / dt


def rounds(pair: dict[str, Callable[[], float]], k: int) -> dict[str, list[float]]:
    """``k`` alternating rounds of each measurement (order flipped every round: load hits both alike)."""
    out: dict[str, list[float]] = {name: [] for name in pair}
    names = list(pair)
    for r in range(k):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(pair[name]())
    return out


def make_data(args, work: Path):
    """A synthetic dataset and its tiered placement under ``work`` (reused when already there)."""
    from iostack.bins import write_bins
    from iostack.placement import load_placement, simple_placement
    from training.data import open_dataset
    from training.synth import SynthSpec
    from training.synth_run import synthesize

    tag = f"{args.nodes}-{args.edges}-{args.feature_dim}-{args.gpu_share}-{args.cpu_share}"
    ds_dir, pl_dir, stamp = work / "dataset", work / "placement", work / "made.json"
    if not (stamp.exists() and json.loads(stamp.read_text()).get("tag") == tag):
        print(f"making a {args.nodes:,}-vertex graph with {args.feature_dim} float32 features in {work} ...",
              flush=True)
        synthesize(ds_dir, SynthSpec(num_nodes=args.nodes, num_edges=args.edges, generator="chung-lu",
                                     feature_dim=args.feature_dim, train_share=args.train_share, seed=1),
                   overwrite=True)
        ds = open_dataset(ds_dir)
        deg = np.diff(np.asarray(ds.indptr))
        order = np.argsort(-deg, kind="stable")  # hottest (highest in-degree) first
        n = ds.num_nodes
        g, c = int(n * args.gpu_share), int(n * args.cpu_share)
        p = simple_placement(n, [("gpu", g), ("cpu", c), ("ssd", n)], order=order)
        pl_dir.mkdir(parents=True, exist_ok=True)
        write_bins(ds.features, p, pl_dir)
        p.save(pl_dir)
        stamp.write_text(json.dumps({"tag": tag}))
    return open_dataset(ds_dir), load_placement(pl_dir), ds_dir, pl_dir


def bench_sampling(ds, device, args, figures: list, bad: list) -> None:
    from training.sampler import NeighborSampler

    rng = np.random.default_rng(2)
    bs = min(8000, ds.num_nodes // 2)
    seeds = [torch.from_numpy(rng.choice(ds.num_nodes, bs, replace=False)) for _ in range(8)]
    indptr = torch.from_numpy(np.array(ds.indptr, np.int64))  # copies: the dataset's arrays are read-only maps
    indices = torch.from_numpy(np.array(ds.indices))
    samplers = {"gpu": NeighborSampler(indptr.to(device), indices.to(device), (25, 10), seed=0),
                "cpu": NeighborSampler(indptr, indices, (25, 10), seed=0, num_threads=args.cpu_threads)}

    def run(s):
        def one() -> int:
            return sum(s.sample(x).num_edges for x in seeds)
        return lambda: rate(one, s.device, args.seconds)

    r = rounds({k: run(s) for k, s in samplers.items()}, args.rounds)
    ours, ref = statistics.median(r["gpu"]) / 1e6, statistics.median(r["cpu"]) / 1e6
    print(f"sampling (25,10, batches of {bs}): {device} {ours:.2f} M edges/s, CPU ({args.cpu_threads} thread(s)) "
          f"{ref:.2f} M edges/s, ratio {ours / ref:.2f}")
    figures.append(Figure("gpu", f"sampling 25,10 batch {bs} on {device} vs CPU ({args.cpu_threads} threads)",
                          "M edges/s", ours, ref, f"same sampler on the CPU, {args.cpu_threads} thread(s)"))


def bench_tiers(ds, placement, pl_dir, device, args, figures: list, bad: list) -> None:
    from iostack.store import FeatureStore

    feats = torch.from_numpy(np.array(ds.features))
    rng = np.random.default_rng(3)
    batch = args.gather_batch
    store = FeatureStore(placement, pl_dir, features=ds.features, backend="posix", device=device)
    try:
        for kind in ("gpu", "cpu"):
            b = next(x for x in placement.bins if x.kind == kind)
            verts = placement.vertices_of(b.id)
            ids = [torch.from_numpy(rng.choice(verts, min(batch, verts.size))) for _ in range(4)]
            _check(f"{kind} tier", store, feats, ids[0], bad)

            def ours(ids=ids) -> int:
                return sum(store.gather(x).shape[0] for x in ids)

            def naive(ids=ids) -> int:  # pageable host gather, then a synchronous copy up
                return sum(feats.index_select(0, x).to(device).shape[0] for x in ids)

            r = rounds({"ours": lambda f=ours: rate(f, device, args.seconds),
                        "naive": lambda f=naive: rate(f, device, args.seconds)}, args.rounds)
            o, n = statistics.median(r["ours"]) / 1e6, statistics.median(r["naive"]) / 1e6
            print(f"gather, {kind} tier, {len(ids[0])} rows per call: store {o:.2f} M rows/s, naive {n:.2f}, "
                  f"ratio {o / n:.2f}")
            figures.append(Figure("gpu", f"gather {kind}-tier rows into {device}, {len(ids[0])} rows/call",
                                  "M rows/s", o, n, "host index_select + .to(device) (pageable)"))
        mixed = torch.from_numpy(rng.integers(0, ds.num_nodes, batch))
        _check("all tiers (posix)", store, feats, mixed, bad)
        moved = store.transfer.counts()
        print(f"copies up so far by source: {dict(moved.by_route)}")
    finally:
        store.close()


def bench_ssd(ds, placement, pl_dir, device, args, figures: list, bad: list, notes: list) -> None:
    from iostack.store import FeatureStore

    feats = torch.from_numpy(np.array(ds.features))
    ssd = next(x for x in placement.bins if x.kind == "ssd")
    rng = np.random.default_rng(4)
    verts = placement.vertices_of(ssd.id)  # only SSD rows: every row of a gather is a read
    ids = [torch.from_numpy(rng.choice(verts, min(args.gather_batch, verts.size))) for _ in range(4)]
    stores = {}
    for name in ("kvikio", "posix"):
        try:
            stores[name] = FeatureStore(placement, pl_dir, features=ds.features, backend=name, device=device)
        except Exception as exc:  # noqa: BLE001 - reported, the other backend still runs
            notes.append(f"SSD reads with {name}: not measured: {exc}")
            print(notes[-1])
    try:
        for name, s in stores.items():
            direct, why = next(iter(s.direct_io().values()))
            print(f"{name}: {'direct (O_DIRECT / GDS)' if direct else 'not direct'}" + (f" - {why}" if why else ""))
            _check(f"SSD tier ({name})", s, feats, ids[0], bad)

        def run(s):
            return lambda: rate(lambda: sum(s.gather(x).shape[0] for x in ids), device, args.seconds)

        r = rounds({k: run(s) for k, s in stores.items()}, args.rounds)
        med = {k: statistics.median(v) / 1e6 for k, v in r.items()}
        print("SSD rows into GPU memory: " + ", ".join(f"{k} {v:.3f} M rows/s" for k, v in med.items()))
        if "kvikio" in med and "posix" in med:
            gds = next(iter(stores["kvikio"].direct_io().values()))[0]
            figures.append(Figure("gpu", f"SSD rows into {device}, {args.gather_batch} random rows/call "
                                         f"(KvikIO {'GDS' if gds else 'compatibility mode'})", "M rows/s",
                                  med["kvikio"], med["posix"], "posix backend (O_DIRECT into pinned, one copy up)",
                                  note="ratio > 1: --backend auto should take kvikio here (moment profile)"))
        elif "posix" in med:
            figures.append(Figure("gpu", f"SSD rows into {device} with posix, {args.gather_batch} rows/call",
                                  "M rows/s", med["posix"], None, "KvikIO not measured (see notes)"))
    finally:
        for s in stores.values():
            s.close()


def _check(what: str, store, feats, ids, bad: list) -> None:
    got = store.gather(ids).cpu()
    want = feats.index_select(0, ids.to(torch.int64))
    if not (got.shape == want.shape and bool((got == want).all())):
        n = int((got != want).any(1).sum()) if got.shape == want.shape else len(ids)
        bad.append(f"{what}: {n} of {len(ids)} gathered rows differ from the in-memory features")
        print(f"MISMATCH {bad[-1]}")
    else:
        print(f"rows ok: {what} ({len(ids)} rows equal the in-memory features)")


def bench_epoch(ds_dir, pl_dir, device, args, figures: list, notes: list) -> None:
    from training.specs import IOSpec, ModelSpec, RunSpec, SamplingSpec, TrainSpec
    from training.trainer import train

    res = {}
    for name, placement in (("placement", str(pl_dir)), ("memory", None)):
        starts: list[dict] = []
        spec = TrainSpec(str(ds_dir), model=ModelSpec(hidden=args.hidden),
                         sampling=SamplingSpec(fanouts=(25, 10), batch_size=args.train_batch),
                         io=IOSpec(placement=placement, backend="posix"), run=RunSpec(epochs=1, eval_every_epochs=0))
        r = train(spec,
                  progress=lambda x, starts=starts: starts.append(x) if x["kind"] == "start" else None)
        res[name] = r.final
        s = starts[0]
        print(f"epoch ({name}): {r.final['seeds_per_s']:,.0f} seeds/s, I/O wait {100 * r.final['io_wait_share']:.0f}%, "
              f"device {s['device']}, sampling on {s['sampling']['device']} ({s['sampling']['why']}), "
              f"tiers {r.final['tiers']}, copies {r.final['transfers']}")
        notes.extend(f"epoch ({name}): store: {n}" for n in s.get("store_notes", []))
    figures.append(Figure("gpu", f"one epoch on {device}, GraphSAGE 25,10, batch {args.train_batch}: "
                                 "GPU-cache placement vs all features in host memory", "seeds/s",
                          res["placement"]["seeds_per_s"], res["memory"]["seeds_per_s"],
                          "features in host memory, copied up from pinned staging"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, help="work directory, on the SSD to test (default: a temporary one)")
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=12_000_000)
    ap.add_argument("--feature-dim", type=int, default=256)
    ap.add_argument("--gpu-share", type=float, default=0.1, help="share of rows in the GPU cache (default 0.1)")
    ap.add_argument("--cpu-share", type=float, default=0.2, help="share of rows in the CPU cache (default 0.2)")
    ap.add_argument("--train-share", type=float, default=0.05)
    ap.add_argument("--gather-batch", type=int, default=100_000, help="rows per gather call")
    ap.add_argument("--train-batch", type=int, default=8000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu-threads", type=int, default=8, help="threads of the CPU sampling reference")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--skip", default="", help="comma-separated steps to skip: sampling,tiers,ssd,epoch")
    ap.add_argument("--quick", action="store_true", help="200k vertices, 2M edges, 3 rounds of 1 s")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="check this script without a GPU: tiny inputs on the CPU, no figures written")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args(argv)
    if args.quick or args.dry_run_cpu:
        args.nodes, args.edges, args.rounds, args.seconds = 200_000, 2_000_000, 3, 1.0
        args.gather_batch = min(args.gather_batch, 20_000)
    if args.dry_run_cpu:
        if args.json:
            print("--dry-run-cpu measures nothing about GPUs: it writes no --json", file=sys.stderr)
            return 2
        args.nodes, args.edges, args.feature_dim, args.rounds, args.seconds = 5000, 40000, 16, 1, 0.05
        args.gather_batch, args.train_batch, args.hidden, args.cpu_threads = 2000, 500, 16, 1
        device = torch.device("cpu")
        print("DRY RUN on the CPU: checks that the script runs; no figure below is a GPU figure")
    elif not torch.cuda.is_available():
        why = "no CUDA device here (torch.cuda.is_available() is False): nothing measured"
        print(f"{why}. Run this on a machine with an NVIDIA GPU and PyTorch built for CUDA "
              "(--dry-run-cpu checks the script itself).")
        write(args.json, "bench_gpu", [], " ".join(sys.argv), skipped=why)
        return 0
    else:
        device = torch.device(args.device)
        torch.cuda.set_device(device)
        print(f"GPU: {torch.cuda.get_device_name(device)} ({device}), torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    figures: list[Figure] = []
    bad: list[str] = []
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        work = args.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="moment-gpu-",
                                                                                dir="/var/tmp")))
        work.mkdir(parents=True, exist_ok=True)
        ds, placement, ds_dir, pl_dir = make_data(args, work)
        if "sampling" not in skip:
            bench_sampling(ds, device, args, figures, bad)
        if "tiers" not in skip:
            bench_tiers(ds, placement, pl_dir, device, args, figures, bad)
        if "ssd" not in skip:
            bench_ssd(ds, placement, pl_dir, device, args, figures, bad, notes)
        if "epoch" not in skip:
            bench_epoch(ds_dir, pl_dir, device, args, figures, notes)
    figures.append(Figure("gpu", "gathered rows differing from the in-memory features (every tier and backend)",
                          "rows", float(len(bad)), None, "", higher_is_better=False, target="0"))
    for n in notes:
        print(f"note: {n}")
    if not args.dry_run_cpu:
        write(args.json, "bench_gpu", figures, " ".join(sys.argv))
    if bad:
        print("ROWS DIFFER: " + "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
