"""The closed loop, measured: profile → plan → place → train, and the plan's prediction against the run.

    python tools/bench_loop.py [--dir /var/tmp/moment-loop] [--rounds 3] [--json FILE]

1. **Prediction error on SSD-bound training.** A skewed Chung-Lu graph with 4 KiB feature rows
   (1024 float32), ``moment profile`` on the disk the SSD bins go to (4 KiB random reads,
   queue depth 64, O_DIRECT), three placements on the bundled Machine B plan (every SSD bin on
   this machine's one disk): DDAK and hash with a small host cache, and a cache-heavy DDAK one.
   Each is trained by ``moment train --capacities`` (the profile), which reports per epoch the
   predicted SSD read time (the placement's expected SSD share of the epoch's reads, in 4 KiB
   pages, at the profiled IOPS) against the store's measured read time. Goal: within 5%.
2. **Cross-socket share of reads**, DDAK against hash on the same bins and hotness: Cora, the
   demo's graph and this Chung-Lu graph (Machine B: 2 sockets, GPUs and SSDs on both).
3. **End to end**: seeds/s of the DDAK placement against hash (same run), and against all
   features in memory. On 2 CPU cores without a GPU the model's compute is most of a step; the
   per-stage split says where the time went.

Every run is the real command in its own process; rounds alternate the placements so that
load on a shared machine hits all alike. Medians and ranges over ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]


def moment(*args: str, capture: bool = False) -> str:
    cmd = [sys.executable, "-m", "moment", *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: moment {' '.join(args)}\n{proc.stderr[-3000:]}")
    return proc.stdout


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def rng(xs: list[float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(min(xs))}..{fmt.format(max(xs))}"


def place(dataset: Path, out: Path, ssd: Path, strategy: str, cpu_cache: int, fanouts: str, batch: int,
          gpu_cache: int = 0) -> dict:
    if not (out / "place.json").exists():
        moment("place", "--dataset", str(dataset), "--machine", "moment-b", "--gpu-cache", str(gpu_cache),
               "--cpu-cache", str(cpu_cache), *[a for _ in range(8) for a in ("--ssd", str(ssd))],
               "--strategy", strategy, "--fanouts", fanouts, "--batch-size", str(batch), "--out", str(out),
               "--force")
    return json.loads((out / "place.json").read_text())


def train(dataset: Path, placement: Path | None, caps: Path, fanouts: str, batch: int, epochs: int) -> dict:
    args = ["train", "--dataset", str(dataset), "--fanouts", fanouts, "--batch-size", str(batch), "--epochs",
            str(epochs), "--eval-every", "0", "--hidden", "64", "--backend", "posix", "--capacities", str(caps),
            "--json"]
    if placement is not None:
        args += ["--placement", str(placement)]
    return json.loads(moment(*args))["epochs"][-1]


def cross_socket(dataset: Path, work: Path, fanouts: str, batch: int, cpu_rows: int, row_bytes: int,
                 gpu_rows: int = 0) -> dict:
    rep = place(dataset, work, work / "ssd", "ddak", cpu_rows * row_bytes, fanouts, batch, gpu_rows * row_bytes)
    return {"ddak": rep["report"]["cross_socket_share"], "hash": rep["baseline"]["cross_socket_share"],
            "ddak_ssd": rep["report"]["ssd_share"], "hash_ssd": rep["baseline"]["ssd_share"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/moment-loop"), help="work directory on the SSD")
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--edges", type=int, default=2_000_000)
    ap.add_argument("--train-share", default="0.03")
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=2, help="epochs per run; the last one is reported (default 2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile-seconds", default="5")
    ap.add_argument("--skip-training", action="store_true", help="only the cross-socket figures (part 2)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    d = args.dir
    d.mkdir(parents=True, exist_ok=True)
    dataset = d / f"graph-{args.nodes}-{args.edges}"
    if not (dataset / "meta.json").exists():
        print("making the graph", flush=True)
        moment("data", "synth", str(dataset), "--nodes", str(args.nodes), "--edges", str(args.edges),
               "--generator", "chung-lu", "--undirected", "--feature-dim", "1024", "--train-share",
               args.train_share, "--seed", "3", "--quiet")
    row = 4096
    small = args.nodes // 20
    figures: list[Figure] = [] if args.skip_training else training_figures(args, d, dataset, row, small)
    cross_socket_figures(args, d, dataset, row, small, figures)
    for f in figures:
        ratio = f.ratio
        print(f"{f.figure}: ours {f.ours:.4g} vs {f.reference:.4g} ({'' if ratio is None else f'{ratio:.2f}x'}) "
              f"{f.note}")
    write(args.json, "loop", figures, " ".join(["python", "tools/bench_loop.py", *sys.argv[1:]]))
    return 0


def training_figures(args, d: Path, dataset: Path, row: int, small: int) -> list[Figure]:
    caps = d / "caps.yaml"
    print("profiling the disk (4 KiB random reads, QD 64, O_DIRECT)", flush=True)
    (d / "ssd").mkdir(exist_ok=True)
    moment("profile", "--ssd", str(d / "ssd"), "--seconds", args.profile_seconds, "--file-size", "1GiB",
           "--out", str(caps))
    heavy = args.nodes * 2 // 5  # host cache rows: features 20x (small) / 2.5x (heavy) the cache
    configs = {"ddak": ("ddak", small), "hash": ("hash", small), "cache-heavy": ("ddak", heavy)}
    for name, (strategy, rows) in configs.items():
        print(f"placing {name}", flush=True)
        place(dataset, d / f"pl-{name}", d / "ssd", strategy, rows * row, args.fanouts, args.batch_size)
    runs: dict[str, list[dict]] = {name: [] for name in [*configs, "memory"]}
    load0 = os.getloadavg()[0]
    for r in range(args.rounds):
        for name in runs:
            rec = train(dataset, None if name == "memory" else d / f"pl-{name}", caps, args.fanouts,
                        args.batch_size, args.epochs)
            runs[name].append(rec)
            p = rec.get("prediction") or {}
            err = p.get("io_error")
            print(f"round {r + 1} {name}: {rec['seeds_per_s']:.0f} seeds/s"
                  + (f", SSD read time predicted {p['predicted_io_s']:.3f} s vs measured {p['measured_io_s']:.3f} s"
                     f" ({100 * err:+.1f}%)" if err is not None else ""), flush=True)
    load1 = os.getloadavg()[0]
    load = f"load {load0:.2f} before, {load1:.2f} after"
    figures: list[Figure] = []
    for name in configs:
        errs = [abs(x["prediction"]["io_error"]) for x in runs[name]]
        pred = [x["prediction"]["predicted_io_s"] for x in runs[name]]
        meas = [x["prediction"]["measured_io_s"] for x in runs[name]]
        ssd = next(t for t in runs[name][-1]["prediction"]["tiers"] if t["tier"] == "ssd")
        figures.append(Figure("loop", f"SSD read time per epoch, predicted vs measured: {name}", "s",
                              med(pred), med(meas), "measured (moment train)", higher_is_better=False,
                              target="error <= 5%",
                              note=f"|error| median {100 * med(errs):.1f}% (range {rng(errs, '{:.3f}')}); SSD bytes "
                                   f"error {100 * ssd['bytes_error']:+.1f}% (last round); {load}"))
    seeds = {k: [x["seeds_per_s"] for x in v] for k, v in runs.items()}
    split = runs["ddak"][-1]
    figures.append(Figure("loop", "seeds/s, SSD-bound skewed graph: DDAK vs hash", "seeds/s", med(seeds["ddak"]),
                          med(seeds["hash"]), "hash placement", target=">= 1.3x",
                          note=f"median of {args.rounds}; ranges {rng(seeds['ddak'], '{:.0f}')} vs "
                               f"{rng(seeds['hash'], '{:.0f}')}; DDAK split (s): sample {split['sample_s']:.2f}, "
                               f"gather {split['gather_s']:.2f}, compute {split['compute_s']:.2f}, "
                               f"I/O wait {split['io_wait_s']:.2f}; {load}"))
    figures.append(Figure("loop", "seeds/s: DDAK vs all features in memory", "seeds/s", med(seeds["ddak"]),
                          med(seeds["memory"]), "features in memory", target=">= 0.95x where compute-bound",
                          note=f"ranges {rng(seeds['ddak'], '{:.0f}')} vs {rng(seeds['memory'], '{:.0f}')}"))
    return figures


def cross_socket_figures(args, d: Path, dataset: Path, row: int, small: int, figures: list[Figure]) -> None:
    """Cross-socket share of reads on three graphs (Machine B's plan), DDAK against hash."""
    cora = d / "cora"
    if not (cora / "meta.json").exists():
        moment("data", "import", "--format", "planetoid", str(REPO.parent / "shared/fixtures/graphs/cora"), str(cora))
    demo = d / "demo-graph"
    if not (demo / "meta.json").exists():
        moment("data", "synth", str(demo), "--nodes", "100000", "--edges", "1000000", "--generator", "chung-lu",
               "--feature-dim", "128", "--undirected", "--train-share", "0.05", "--seed", "1", "--quiet")
    graphs = {"Cora": (cora, 2708 // 20, 1433 * 4, "25,10", 140),
              "demo graph": (demo, 100_000 // 20, 512, "25,10", 1000),
              "Chung-Lu 1024-dim": (dataset, small, row, args.fanouts, args.batch_size)}
    for name, (ds, cpu_rows, rb, fo, bs) in graphs.items():
        for gpu_rows in (0, cpu_rows * 2 // 5):  # no GPU cache; the demo's (rows / 50 per GPU)
            x = cross_socket(ds, d / f"xs-{name.split()[0].lower()}-{gpu_rows}", fo, bs, cpu_rows, rb, gpu_rows)
            caches = f"GPU cache {gpu_rows:,} rows, host cache {cpu_rows:,} rows per memory"
            figures.append(Figure("loop", f"cross-socket share of reads, DDAK vs hash: {name}, {caches}", "share",
                                  x["ddak"], x["hash"], "hash placement", higher_is_better=False,
                                  target="DDAK <= hash", note=f"SSD share {x['ddak_ssd']:.3f} vs {x['hash_ssd']:.3f}"))


if __name__ == "__main__":
    sys.exit(main())
