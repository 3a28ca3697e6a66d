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
   demo's graph and this Chung-Lu graph, on Machine B's recommended layout (all GPUs on socket 0:
   every read from socket 1 crosses), with the floor of any placement that reads as little from the
   SSDs (``cross_socket_floor``), and in the paper's own setting (its Figure 17): Machine A under the
   classic layouts (a)-(d) (``moment plan --layout``), with the demo's GPU caches.
3. **End to end**: seeds/s of the DDAK placement against hash (same run; ``--hidden`` 16 by
   default, a small model so that reading the rows is most of a step: SSD-bound), and DDAK against
   all features in memory where the model is compute-bound (GraphSAGE hidden ``--compute-hidden``
   256). On 2 CPU cores without a GPU the per-stage split says where the time went.

The SSD figure of the prediction is the profile's headline one (fio's when installed); the error
the profile's ``moment-posix`` figure would give is printed beside it from the same runs.

``--one-ssd`` plans what this machine is, one GPU and one SSD (``moment plan --machine moment-a
--gpus 1 --ssds 1`` with this disk's profile as the SSD model's figure, then ``moment place --plan``),
instead of Machine B's eight SSD bins all on this one disk (the store reads a batch's bins one after
another, eight smaller read calls per batch); ``--gpu-cache`` adds the demo's GPU cache (rows / 50)
to the training placements.

Every run is the real command in its own process; rounds alternate the placements so that
load on a shared machine hits all alike. Medians and ranges over ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
from _cli import moment, skewed_graph, small_graphs
from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]




def med(xs: list[float]) -> float:
    return statistics.median(xs)


def rng(xs: list[float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(min(xs))}..{fmt.format(max(xs))}"


def place(dataset: Path, out: Path, ssd: Path, strategy: str, cpu_cache: int, fanouts: str, batch: int,
          gpu_cache: int = 0, plan: Path | None = None, ssds: int = 1) -> dict:
    """A placement on Machine B's plan (8 SSD bins, all on this disk), or on the plan file ``plan``
    (``ssds`` SSD bins)."""
    if not (out / "place.json").exists():
        where = ["--plan", str(plan), *[a for _ in range(ssds) for a in ("--ssd", str(ssd))]] if plan is not None \
            else ["--machine", "moment-b", *[a for _ in range(8) for a in ("--ssd", str(ssd))]]
        moment("place", "--dataset", str(dataset), *where, "--gpu-cache", str(gpu_cache),
               "--cpu-cache", str(cpu_cache),
               "--strategy", strategy, "--fanouts", fanouts, "--batch-size", str(batch), "--out", str(out),
               "--force")
    return json.loads((out / "place.json").read_text())


def train(dataset: Path, placement: Path | None, caps: Path, fanouts: str, batch: int, epochs: int,
          hidden: int = 64) -> dict:
    args = ["train", "--dataset", str(dataset), "--fanouts", fanouts, "--batch-size", str(batch), "--epochs",
            str(epochs), "--eval-every", "0", "--hidden", str(hidden), "--backend", "posix", "--capacities",
            str(caps), "--json"]
    if placement is not None:
        args += ["--placement", str(placement)]
    return json.loads(moment(*args))["epochs"][-1]


def cross_socket(dataset: Path, work: Path, fanouts: str, batch: int, cpu_rows: int, row_bytes: int,
                 gpu_sockets: list[str], gpu_rows: int = 0, plan: Path | None = None) -> dict:
    rep = place(dataset, work, work / "ssd", "ddak", cpu_rows * row_bytes, fanouts, batch, gpu_rows * row_bytes,
                plan=plan, ssds=8)
    floor, floor_ssd = (cross_socket_floor(np.load(rep["hotness"]["path"]), rep["report"]["bins"], gpu_sockets)
                        if gpu_sockets else (float("nan"), float("nan")))
    return {"ddak": rep["report"]["cross_socket_share"], "hash": rep["baseline"]["cross_socket_share"],
            "ddak_ssd": rep["report"]["ssd_share"], "hash_ssd": rep["baseline"]["ssd_share"],
            "floor": floor, "floor_ssd": floor_ssd}


def cross_socket_floor(hotness: np.ndarray, bins: list[dict], gpu_sockets: list[str]) -> tuple[float, float]:
    """The least cross-socket share of reads of any placement that reads as little from the SSDs as it can
    with these caches and splits the SSD reads as the plan's targets do (the time-optimal split), for
    data-parallel GPUs (every GPU reads every row alike): ``(floor, its SSD share)``.

    A bin on socket ``k`` sends ``(GPUs not on k) / GPUs`` of its reads across sockets (a GPU cache
    none). The least SSD share means the caches hold the hottest rows; of those, the hottest go to the
    caches with the fewest remote readers. The SSD reads split like the SSD bins' targets. This is
    the reference DDAK is held to on a layout whose GPUs share one socket: hash's share is lower only
    by reading more from the SSDs.
    """
    g = len(gpu_sockets)

    def remote(b: dict) -> float:
        return 0.0 if b["kind"] == "gpu" else sum(1 for s in gpu_sockets if s != b["socket"]) / g

    h = np.sort(np.asarray(hotness, dtype=np.float64))[::-1]
    total = float(h.sum())
    caches = sorted((b for b in bins if b["kind"] != "ssd"), key=remote)
    at, floor = 0, 0.0
    for b in caches:
        share = float(h[at:at + b["rows"]].sum()) / total
        floor += remote(b) * share
        at += b["rows"]
    ssd_share = 1.0 - float(h[:at].sum()) / total
    ssds = [b for b in bins if b["kind"] == "ssd"]
    t = sum(b["target_share"] for b in ssds)
    floor += ssd_share * sum(remote(b) * b["target_share"] for b in ssds) / t
    return floor, ssd_share


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
    ap.add_argument("--hidden", type=int, default=16,
                    help="hidden units of the SSD-bound runs (default 16: reading rows is most of a step)")
    ap.add_argument("--compute-hidden", type=int, default=256,
                    help="hidden units of the compute-bound pair, DDAK vs features in memory (default 256)")
    ap.add_argument("--gpu-cache", action="store_true",
                    help="give the training placements the demo's GPU cache too (nodes / 50 rows)")
    ap.add_argument("--one-ssd", action="store_true",
                    help="train on a plan of one GPU and one SSD (moment-a, --gpus 1 --ssds 1, this disk's profile "
                         "as the p5510's figure) through a plan file, instead of Machine B's 8 SSD bins on one disk")
    ap.add_argument("--skip-cross", action="store_true", help="only the training figures (parts 1 and 3)")
    ap.add_argument("--skip-training", action="store_true", help="only the cross-socket figures (part 2)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    d = args.dir
    d.mkdir(parents=True, exist_ok=True)
    dataset = skewed_graph(d / f"graph-{args.nodes}-{args.edges}", args.nodes, args.edges, args.train_share)
    row = 4096
    small = args.nodes // 20
    figures: list[Figure] = [] if args.skip_training else training_figures(args, d, dataset, row, small)
    if not args.skip_cross:
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
    gpu_rows = args.nodes // 50 if args.gpu_cache else 0  # the demo's GPU cache (replicated, in host memory here)
    plan = _one_ssd_plan(d, caps) if args.one_ssd else None
    for name, (strategy, rows) in configs.items():
        print(f"placing {name}", flush=True)
        place(dataset, d / f"pl-{name}", d / "ssd", strategy, rows * row, args.fanouts, args.batch_size,
              gpu_rows * row, plan)
    # (placement, hidden units) of each run: the SSD-bound ones, then the compute-bound pair
    plan_of = {**{name: (name, args.hidden) for name in configs},
               "ddak-compute": ("cache-heavy", args.compute_hidden), "memory": (None, args.compute_hidden)}
    runs: dict[str, list[dict]] = {name: [] for name in plan_of}
    load0 = os.getloadavg()[0]
    for r in range(args.rounds):
        for name, (pl, hidden) in plan_of.items():
            rec = train(dataset, None if pl is None else d / f"pl-{pl}", caps, args.fanouts,
                        args.batch_size, args.epochs, hidden)
            runs[name].append(rec)
            p = rec.get("prediction") or {}
            err = p.get("io_error")
            print(f"round {r + 1} {name}: {rec['seeds_per_s']:.0f} seeds/s"
                  + (f", SSD read time predicted {p['predicted_io_s']:.3f} s vs measured {p['measured_io_s']:.3f} s"
                     f" ({100 * err:+.1f}%)" if err is not None else ""), flush=True)
    load1 = os.getloadavg()[0]
    load = f"load {load0:.2f} before, {load1:.2f} after"
    figures: list[Figure] = []
    headline = _headline_over_own(caps)  # predicted time at moment-posix's IOPS = this x the headline's
    for name in configs:
        errs = [abs(x["prediction"]["io_error"]) for x in runs[name]]
        # the same runs predicted at the profile's moment-posix figure (time scales as 1 / IOPS)
        alt = [abs((1 + x["prediction"]["io_error"]) * headline - 1) for x in runs[name]]
        print(f"{name}: |error| median {100 * med(errs):.1f}% with the profile's headline figure, "
              f"{100 * med(alt):.1f}% with its moment-posix figure (headline IOPS x{1 / headline:.3f})")
        pred = [x["prediction"]["predicted_io_s"] for x in runs[name]]
        meas = [x["prediction"]["measured_io_s"] for x in runs[name]]
        ssd = next(t for t in runs[name][-1]["prediction"]["tiers"] if t["tier"] == "ssd")
        figures.append(Figure("loop", f"SSD read time per epoch, predicted vs measured: {name}", "s",
                              med(pred), med(meas), "measured (moment train)", higher_is_better=False,
                              target="error <= 5%",
                              note=f"|error| median {100 * med(errs):.1f}% (range {rng(errs, '{:.3f}')}; at the "
                                   f"profile's moment-posix figure {100 * med(alt):.1f}%); SSD bytes "
                                   f"error {100 * ssd['bytes_error']:+.1f}% (last round); {load}"))
    figures += throughput_figures(runs, configs, load)
    seeds = {k: [x["seeds_per_s"] for x in v] for k, v in runs.items()}
    split = runs["ddak"][-1]
    hsplit = runs["hash"][-1]
    figures.append(
        Figure(
            "loop",
            "seeds/s, SSD-bound skewed graph: DDAK vs hash",
            "seeds/s",
            med(seeds["ddak"]),
            med(seeds["hash"]),
            "hash placement",
            target=">= 1.3x",
            note=f"hidden {args.hidden}; median of {args.rounds}; ranges {rng(seeds['ddak'], '{:.0f}')} vs "
            f"{rng(seeds['hash'], '{:.0f}')}; split (s) DDAK / hash: sample {split['sample_s']:.2f} / "
            f"{hsplit['sample_s']:.2f}, gather {split['gather_s']:.2f} / {hsplit['gather_s']:.2f}, "
            f"compute {split['compute_s']:.2f} / {hsplit['compute_s']:.2f}, I/O wait "
            f"{split['io_wait_s']:.2f} / {hsplit['io_wait_s']:.2f}; {load}",
        )
    )
    csplit, msplit = runs["ddak-compute"][-1], runs["memory"][-1]
    figures.append(Figure("loop", "seeds/s, compute-bound: DDAK (cache-heavy) vs all features in memory", "seeds/s",
                          med(seeds["ddak-compute"]), med(seeds["memory"]), "features in memory",
                          target=">= 0.95x where compute-bound",
                          note=f"hidden {args.compute_hidden}; ranges {rng(seeds['ddak-compute'], '{:.0f}')} vs "
                               f"{rng(seeds['memory'], '{:.0f}')}; compute {csplit['compute_s']:.2f} / "
                               f"{msplit['compute_s']:.2f} s, I/O wait {csplit['io_wait_s']:.2f} / "
                               f"{msplit['io_wait_s']:.2f} s"))
    return figures


def _one_ssd_plan(d: Path, caps: Path) -> Path:
    """``moment plan --json`` for one GPU and one SSD, the SSD model's figures this disk's profile."""
    sys.path.insert(0, str(REPO))
    from dataclasses import replace

    from planner.capacities import Capacities, load_capacities, save_capacities

    c = load_capacities(caps)
    keyed = save_capacities(Capacities(devices=(replace(c.devices[0], key="p5510", model=None),),
                                       source=str(caps)), d / "caps-p5510.yaml")
    text = moment("plan", "--machine", "moment-a", "--gpus", "1", "--ssds", "1", "--capacities", str(keyed),
                  "--json", "--top", "1")
    (d / "plan.json").write_text(text)
    return d / "plan.json"


def _headline_over_own(caps: Path) -> float:
    """The profile's headline SSD IOPS over its moment-posix IOPS (1.0 without both)."""
    sys.path.insert(0, str(REPO))
    from planner.capacities import load_capacities

    d = load_capacities(caps).devices[0]
    own = next((m for m in d.measurements() if m.tool == "moment-posix"), None)
    if own is None or not own.read_iops or not d.read.read_iops:
        return 1.0
    return d.read.read_iops / own.read_iops


def throughput_figures(runs: dict[str, list[dict]], configs: dict, load: str) -> list[Figure]:
    """The paper's terms (training.throughput): feature GB/s per epoch, the plan's inlet vs measured, and
    whether the flow model applies to the epoch (its threshold's verdict, from the last round)."""
    out = []
    for name in configs:
        recs = [x["throughput"] for x in runs[name] if x.get("throughput")]
        if not recs or not all(t.get("plan_bytes_per_s") for t in recs):
            continue
        plan_gb = [t["plan_bytes_per_s"] / 1e9 for t in recs]
        meas_gb = [t["measured_bytes_per_s"] / 1e9 for t in recs]
        last = recs[-1]
        verdict = "applies" if last["applies"] else "does not apply: " + "; ".join(w.split(":")[0]
                                                                                  for w in last["why_not"])
        out.append(Figure("loop", f"feature GB/s per epoch, plan's inlet vs measured: {name}", "GB/s",
                          med(plan_gb), med(meas_gb), "measured (moment train)", higher_is_better=False,
                          target="within 10% where the flow model applies",
                          note=f"plan of {last.get('plan_machine')}; flow model {verdict}; I/O wait "
                               f"{100 * last['io_wait_share']:.0f}%; {last['read_calls']:,} read calls; measured "
                               f"range {rng(meas_gb, '{:.3f}')}; {load}"))
    return out


def cross_socket_figures(args, d: Path, dataset: Path, row: int, small: int, figures: list[Figure]) -> None:
    """Cross-socket share of reads on three graphs (Machine B's plan), DDAK against hash."""
    cora, demo = small_graphs(d)
    graphs = {"Cora": (cora, 2708 // 20, 1433 * 4, "25,10", 140),
              "demo graph": (demo, 100_000 // 20, 512, "25,10", 1000),
              "Chung-Lu 1024-dim": (dataset, small, row, args.fanouts, args.batch_size)}
    plan = json.loads(moment("plan", "--machine", "moment-b", "--json"))
    gpu_sockets = [s for _, s in plan["handoff"]["targets"]["gpus"]]
    for name, (ds, cpu_rows, rb, fo, bs) in graphs.items():
        for gpu_rows in (0, cpu_rows * 2 // 5):  # no GPU cache; the demo's (rows / 50 per GPU)
            x = cross_socket(ds, d / f"xs-{name.split()[0].lower()}-{gpu_rows}", fo, bs, cpu_rows, rb, gpu_sockets,
                             gpu_rows)
            caches = f"GPU cache {gpu_rows:,} rows, host cache {cpu_rows:,} rows per memory"
            figures.append(Figure("loop", f"cross-socket share of reads, DDAK vs hash: {name}, {caches}", "share",
                                  x["ddak"], x["hash"], "hash placement", higher_is_better=False,
                                  target="DDAK <= hash", note=f"SSD share {x['ddak_ssd']:.3f} vs {x['hash_ssd']:.3f}"))
            figures.append(Figure("loop", f"cross-socket share of reads, DDAK vs its floor: {name}, {caches}",
                                  "share", x["ddak"], x["floor"], "floor at the least SSD share",
                                  higher_is_better=False, target="DDAK <= 1.01 x floor",
                                  note=f"SSD share {x['ddak_ssd']:.3f} vs the floor's {x['floor_ssd']:.3f}; GPUs on "
                                       f"{', '.join(sorted(set(gpu_sockets)))}"))
    # the paper's setting (its Figure 17): Machine A under the classic layouts (a)-(d), the demo's GPU caches
    for layout in "abcd":
        plan_file = d / f"plan-moment-a-{layout}.json"
        plan_file.write_text(moment("plan", "--machine", "moment-a", "--json", "--top", "1", "--layout", layout))
        for name, (ds, cpu_rows, rb, fo, bs) in graphs.items():
            gpu_rows = cpu_rows * 2 // 5
            x = cross_socket(ds, d / f"xs-a{layout}-{name.split()[0].lower()}", fo, bs, cpu_rows, rb, [],
                             gpu_rows, plan=plan_file)
            figures.append(Figure("loop", f"cross-socket share of reads, DDAK vs hash: {name}, Machine A layout "
                                          f"({layout}), GPU cache {gpu_rows:,} rows, host cache {cpu_rows:,} rows "
                                          "per memory", "share", x["ddak"], x["hash"], "hash placement",
                                  higher_is_better=False, target="DDAK <= hash (paper: 8.7-18.1% less)",
                                  note=f"SSD share {x['ddak_ssd']:.3f} vs {x['hash_ssd']:.3f}"))


if __name__ == "__main__":
    sys.exit(main())
