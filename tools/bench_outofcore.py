"""Out-of-core beyond RAM: features larger than memory, placed in place, trained a fixed number of steps (not a test).

    PYTHONPATH=. python tools/bench_outofcore.py --dir /var/tmp/ooc [--features-gib 0.05] [--steps 40] [--json F]
    PYTHONPATH=. python tools/bench_outofcore.py --dir /mnt/nvme/ooc --features-gib 48   # the issue's size, by hand

The default size is a smoke test; ``--features-gib 48`` (2x a 24 GiB machine)
is the issue's run. The features are written once: the SSD bin *is* the
dataset's ``features.npy`` (``moment place --in-place``), so the disk needs
the features plus the graph, not twice the features. Phases, each its own
process so that its peak RSS is its own (``os.wait4``), each timed, each
printing its progress:

1. **generate**: ``moment data synth`` (Chung-Lu, ``--edges-per-node`` edges a
   node, ``--feature-dim`` float32 features streamed by row blocks into a
   page-aligned ``features.npy``; the CSR through the chunked builder, memory
   mapped after);
2. **place**: ``moment place --in-place`` for a one-SSD machine: pre-sampled
   hotness, DDAK fills a ``--cpu-cache`` host cache with the hottest rows, the
   SSD bin is the dataset's file (no row copied; one sequential read for its CRC);
3. **profile**: ``moment profile --ssd <that features.npy> --block-size <row
   bytes>``: random reads of the rows' size from that very file (fio and
   Moment's reader; the profile keeps the better);
4. **train**: ``moment train --epochs 1`` with a train split of ``--steps`` x
   ``--batch-size`` seeds, so the epoch is ``--steps`` steps: seeds/s, the SSD
   tier's bytes, and the process's peak RSS against the bound
   ``cpu cache + CSR + --runtime-gib`` (torch, the model, batches);
5. **SSD rate**: the training's gather stream (same sampler, fan-outs and
   batch size) replayed here for ``--replay-batches`` batches through the
   ``FeatureStore``: SSD bytes / seconds spent in the SSD reads, against the
   profile's figure for the same request size (ours / profile, goal >= 0.8).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _results import Figure, write

ONE_SSD = """\
schema: moment.machine
version: 1
name: one-ssd
defaults: {pcie_gen: 4}
sockets:
  - id: 0
    threads: 2
    ports:
      - slot: bay0
        form_factor: u.2
        lanes: 4
        device: {kind: nvme, model: NVMe SSD, id: ssd0}
      - slot: g0
        form_factor: cem
        lanes: 16
        double_width: true
        device: {kind: gpu, model: A100, id: gpu0}
"""


def phase(name: str, args: list[str], log: Path) -> dict:
    """Run ``python -m moment ARGS`` as its own process: seconds, peak RSS (bytes), its stdout."""
    print(f"\n== {name}: moment {' '.join(args)}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    t = time.perf_counter()
    with open(log, "w") as out:
        p = subprocess.Popen([sys.executable, "-m", "moment", *args], stdout=out, env=env)  # progress: stderr
        _, status, ru = os.wait4(p.pid, 0)
    sec = time.perf_counter() - t
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"bench_outofcore: {name} failed (exit {code}); its output is in {log}")
    print(f"== {name}: {sec:.1f} s, peak RSS {ru.ru_maxrss / 2**20:.2f} GiB", flush=True)
    return {"seconds": sec, "peak_rss_bytes": ru.ru_maxrss * 1024, "stdout": log.read_text()}


def profile_rate(caps_file: Path) -> tuple[float, str]:
    """The random-read figure (bytes/s) the profile recorded, and which tool gave it."""
    caps = json.loads(caps_file.read_text())
    for dev in (caps.get("devices") or {}).values():
        for key in ("random_read_bytes_per_s", "read_bytes_per_s"):
            if key in dev:
                return float(dev[key]), str(dev.get("tool", dev.get("source", "")))
    sys.exit(f"bench_outofcore: no SSD read figure in {caps_file}")


def replay(dataset: Path, placement: Path, *, fanouts: tuple[int, ...], batch_size: int, batches: int,
           seed: int = 0) -> dict:
    """The training's gather stream through the FeatureStore: SSD bytes and read seconds."""
    import torch

    from iostack.placement import load_placement
    from iostack.store import FeatureStore
    from training.data import open_dataset
    from training.sampler import NeighborSampler

    ds = open_dataset(dataset)
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=fanouts, seed=seed, num_threads=1)
    train = np.asarray(ds.train_idx)
    order = torch.from_numpy(train[np.random.default_rng(seed).permutation(train.size)])
    with FeatureStore(load_placement(placement), placement, features=ds.features) as store:
        store.reset_stats()
        t = time.perf_counter()
        for i in range(batches):
            seeds = order[(i * batch_size) % order.numel():][:batch_size]
            store.gather(sampler.sample(seeds).n_id)
        wall = time.perf_counter() - t
        ssd = store.tier_stats().get("ssd", {})
        direct = all(d for d, _ in store.direct_io().values())
    return {"bytes": int(ssd.get("bytes", 0)), "seconds": float(ssd.get("seconds", 0.0)),
            "requests": int(ssd.get("requests", 0)), "pages": int(ssd.get("pages", 0)), "wall_s": wall,
            "direct": direct}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="work directory (dataset, placement); on the SSD to measure")
    ap.add_argument("--features-gib", type=float, default=0.05, help="feature bytes on disk, GiB (default 0.05)")
    ap.add_argument("--feature-dim", type=int, default=1024, help="float32 features a row (default 1024: 4 KiB)")
    ap.add_argument("--edges-per-node", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40, help="training steps (one epoch of this many batches)")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--cpu-cache", default="256MiB", help="host cache for the hottest rows (default 256MiB)")
    ap.add_argument("--replay-batches", type=int, default=20)
    ap.add_argument("--runtime-gib", type=float, default=2.0,
                    help="RSS allowed beyond the cache and the CSR: torch, the model, batches (default 2)")
    ap.add_argument("--profile-seconds", type=float, default=5.0)
    ap.add_argument("--keep", action="store_true", help="keep the dataset and placement (default: removed)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    row_bytes = args.feature_dim * 4
    nodes = max(1000, int(args.features_gib * 2**30 // row_bytes))
    need = nodes * row_bytes * 1.05 + nodes * args.edges_per_node * 4 * 1.2 + (1 << 30)
    free = shutil.disk_usage(work).free
    if need > free:
        sys.exit(f"bench_outofcore: --dir {work}: needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free; "
                 "free space or give a smaller --features-gib")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    load = [", ".join(f"{x:.1f}" for x in os.getloadavg())]
    train_share = min(0.5, args.steps * args.batch_size / nodes)
    ds, pl, ssd = work / "g", work / "pl", work / "ssd"
    (work / "one-ssd.yaml").write_text(ONE_SSD)
    print(f"{nodes:,} nodes x {row_bytes} B rows = {nodes * row_bytes / 2**30:.2f} GiB of features "
          f"({nodes * row_bytes / mem:.2f}x this machine's {mem / 2**30:.1f} GiB of memory); "
          f"{nodes * args.edges_per_node:,} edges; {args.steps} steps of {args.batch_size}; load {load[0]}")
    res: dict[str, dict] = {}
    res["generate"] = phase("generate", [
        "data", "synth", str(ds), "--nodes", str(nodes), "--edges", str(nodes * args.edges_per_node),
        "--generator", "chung-lu", "--feature-dim", str(args.feature_dim), "--train-share", f"{train_share:.8f}",
        "--valid-share", "0", "--test-share", "0", "--force"], work / "generate.log")
    res["place"] = phase("place", [
        "place", "--dataset", str(ds), "--machine", str(work / "one-ssd.yaml"), "--gpu-cache", "0",
        "--cpu-cache", args.cpu_cache, "--ssd", str(ssd), "--in-place", "--fanouts", args.fanouts,
        "--batch-size", str(args.batch_size), "--out", str(pl), "--force", "--json"], work / "place.log")
    res["profile"] = phase("profile", [
        "profile", "--ssd", str(ds / "features.npy"), "--block-size", str(row_bytes), "--no-memory",
        "--seconds", str(args.profile_seconds), "--out", str(work / "caps.json")], work / "profile.log")
    prof_bps, prof_tool = profile_rate(work / "caps.json")
    res["train"] = phase("train", [
        "train", "--dataset", str(ds), "--placement", str(pl), "--epochs", "1", "--fanouts", args.fanouts,
        "--batch-size", str(args.batch_size), "--json"], work / "train.log")
    load.append(", ".join(f"{x:.1f}" for x in os.getloadavg()))
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    t = time.perf_counter()
    rp = replay(ds, pl, fanouts=fanouts, batch_size=args.batch_size, batches=args.replay_batches)
    rp_s = time.perf_counter() - t
    load.append(", ".join(f"{x:.1f}" for x in os.getloadavg()))

    place = json.loads(res["place"]["stdout"])
    epoch = json.loads(res["train"]["stdout"])["epochs"][-1]
    import iostack.placement as ipl

    cache_rows = sum(b.capacity_rows for b in ipl.load_placement(pl).bins if b.kind == "cpu")
    csr = sum((ds / f).stat().st_size for f in ("indptr.npy", "indices.npy"))
    bound = cache_rows * row_bytes + csr + args.runtime_gib * 2**30
    peak = res["train"]["peak_rss_bytes"]
    ours_bps = rp["bytes"] / rp["seconds"] if rp["seconds"] > 0 else 0.0
    # the trainer times its own SSD reads too (the prediction record): the rate inside the training run
    t_ssd = next((t for t in (epoch.get("prediction") or {}).get("tiers", []) if t.get("tier") == "ssd"), {})
    train_bps = t_ssd["measured_bytes"] / t_ssd["measured_s"] if t_ssd.get("measured_s") else 0.0
    seeds = epoch.get("seeds") or args.steps * args.batch_size
    seeds_s = seeds / epoch["epoch_s"] if epoch.get("epoch_s") else 0.0
    feats = nodes * row_bytes

    print(f"\nfeatures {feats / 2**30:.2f} GiB on disk ({feats / mem:.2f}x memory), written once "
          f"(the SSD bin is the dataset's file)")
    print(f"{'phase':10}{'seconds':>10}{'peak RSS GiB':>14}")
    for k in ("generate", "place", "profile", "train"):
        print(f"{k:10}{res[k]['seconds']:10.1f}{res[k]['peak_rss_bytes'] / 2**30:14.2f}")
    print(f"train RSS bound: cache {cache_rows * row_bytes / 2**30:.2f} + CSR {csr / 2**30:.2f} + runtime "
          f"{args.runtime_gib:.1f} = {bound / 2**30:.2f} GiB; peak {peak / 2**30:.2f} GiB "
          f"({'within' if peak <= bound else 'ABOVE'})")
    print(
        f"train: {seeds:,} seeds in {epoch.get('epoch_s', 0):.1f} s = {seeds_s:,.0f} seeds/s; SSD "
        f"{epoch['tiers'].get('ssd', {}).get('bytes', 0) / 2**20:,.0f} MiB; I/O wait {epoch.get('io_wait_s', 0):.1f} s"
    )
    # the gather merges adjacent rows into one read, so its requests average more than one row
    per_req = rp["bytes"] / rp["requests"] if rp["requests"] else 0.0
    print(f"SSD rate, {row_bytes} B rows: ours (training's gather stream, {rp['requests']:,} requests of "
          f"{per_req / 1024:.1f} KiB on average, "
          f"O_DIRECT {rp['direct']}) {ours_bps / 1e6:,.1f} MB/s vs moment profile ({prof_tool}) "
          f"{prof_bps / 1e6:,.1f} MB/s = {ours_bps / prof_bps:.2f}x (goal >= 0.80); replay {rp_s:.1f} s")
    print(f"SSD rate inside the training run (the trainer's own timing of its SSD reads): "
          f"{train_bps / 1e6:,.1f} MB/s = {train_bps / prof_bps:.2f}x the profile")
    print(f"load average before, after training, after the replay: {' | '.join(load)}")
    what = f"{feats / 2**30:.1f} GiB features ({feats / mem:.1f}x RAM), {row_bytes} B rows"
    figures = [
        Figure(
            "outofcore",
            f"{what}: SSD read rate, training's stream vs moment profile",
            "MB/s",
            ours_bps / 1e6,
            prof_bps / 1e6,
            f"moment profile ({prof_tool}), same file, same request size",
            target="ratio >= 0.8",
            note=f"O_DIRECT {rp['direct']}; {rp['requests']:,} requests, {per_req / 1024:.1f} KiB on average; "
            f"load {' | '.join(load)}",
        ),
        Figure(
            "outofcore",
            f"{what}: SSD read rate inside moment train vs moment profile",
            "MB/s",
            train_bps / 1e6,
            prof_bps / 1e6,
            f"moment profile ({prof_tool}), same file, same request size",
            target="ratio >= 0.8",
            note="the trainer's own timing of its SSD reads (prefetch overlaps them)",
        ),
        Figure(
            "outofcore",
            f"{what}: train peak RSS",
            "GiB",
            peak / 2**30,
            bound / 2**30,
            "bound: cache + CSR + runtime",
            higher_is_better=False,
            target="ours <= bound",
            note=f"{args.steps} steps; {seeds_s:,.0f} seeds/s",
        ),
    ]
    for k in ("generate", "place", "profile", "train"):
        figures.append(Figure("outofcore", f"{what}: {k} time", "s", res[k]["seconds"], None, "",
                              higher_is_better=False, target="minutes" if k != "profile" else "",
                              note=f"peak RSS {res[k]['peak_rss_bytes'] / 2**30:.2f} GiB"))
    write(args.json, "bench_outofcore", figures, " ".join(sys.argv))
    if args.json:  # the raw phases too, for the record
        extra = Path(args.json).with_suffix(".phases.json")
        extra.write_text(json.dumps({"phases": {k: {kk: vv for kk, vv in v.items() if kk != "stdout"}
                                                for k, v in res.items()},
                                     "replay": rp, "profile_bytes_per_s": prof_bps, "place_report": place["report"],
                                     "epoch": epoch, "nodes": nodes, "row_bytes": row_bytes}, indent=1))
    if not args.keep:
        shutil.rmtree(ds, ignore_errors=True)
        shutil.rmtree(pl, ignore_errors=True)
        shutil.rmtree(ssd, ignore_errors=True)


if __name__ == "__main__":
    main()
