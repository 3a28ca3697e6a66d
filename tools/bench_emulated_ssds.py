"""DDAK against hash on several SSDs of different speed, emulated on this machine's disk: the paper's mechanism.

    sudo python tools/bench_emulated_ssds.py [--dir /var/tmp/moment-emu] [--count 8] [--rounds 3] [--json FILE]

The paper's DDAK gains (Figs. 14/15: +30.6% / +34.0% over hash) come from spreading the SSD reads
in proportion to what each SSD delivers, where some SSDs sit behind a congested switch. One disk
cannot show that, so this run makes ``--count`` SSDs of it (:mod:`iostack.bench.loopssds`: loop
devices with direct I/O, ext4, and a blkio read throttle each) and in ONE run:

1. measures the raw disk (``moment bench io raw``'s library call: 4 KiB random reads, QD 64,
   O_DIRECT, fio and ours) and sets the throttles to Machine B's SSDs (Intel P5510: 6 GiB/s,
   700k IOPS each) scaled so that all of them together take ``--disk-share`` of the disk's
   IOPS (the throttles, not the disk, then set each device's rate), the ``--slow`` ones at
   ``--slow-factor`` of the others (a congested switch);
2. ``moment profile`` of every mount (each device alone: delivered against its throttle), its
   figures keyed to the emulated machine's SSD nodes, ``moment plan --capacities`` on that
   machine (the plan's per-SSD targets), ``moment place`` with DDAK and with hash over the mounts;
3. ``moment train --backend posix`` (O_DIRECT reads) of both placements, alternating over
   ``--rounds``: seeds/s of the last epoch (DDAK vs hash), each device's share of the SSD reads
   (the store's per-bin counts of the last epoch, and the bytes the blkio cgroup saw per device
   over the whole run) against the plan's target, and the plan's predicted SSD read time against
   the measured one (``training.prediction`` as ``moment train --capacities`` reports it). With
   ``--bin-reads both`` (the default) each placement trains twice per round: the store reading a
   gather's SSD bins all at once (``moment train``'s default) and one after another (the ``*-seq``
   runs, ``MOMENT_SEQUENTIAL_BINS=1``), side by side.

Needs root, loop devices and the cgroup v1 blkio controller; everything it makes is removed
again at the end, on an error and on Ctrl-C. Medians and ranges over ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cli import moment, skewed_graph  # noqa: E402
from _results import Figure, write  # noqa: E402

from iostack.backends.posix import SEQUENTIAL_BINS_ENV  # noqa: E402
from iostack.bench.io import bench_raw  # noqa: E402
from iostack.bench.loopssds import (  # noqa: E402
    capacities_for_spec,
    device_reads,
    emulated_ssds,
    emulation_blocked,
    load_state,
    machine_spec_yaml,
    spec_rates,
)
from momentbase.units import parse_size  # noqa: E402
from planner.capacities import load_capacities, save_capacities  # noqa: E402


def med(xs: list[float]) -> float:
    return statistics.median(xs)


#: ``--bin-reads``: the suffixes of the runs it makes ("" concurrent, "-seq" sequential)
BIN_READS = {"both": ("", "-seq"), "concurrent": ("",), "sequential": ("-seq",)}


def rng(xs: list[float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(min(xs))}..{fmt.format(max(xs))}"


def disk_iops(d: Path, seconds: float) -> tuple[float, str]:
    """This disk's 4 KiB random-read IOPS at QD 64, O_DIRECT: the lower of fio's and ours (one round)."""
    d.mkdir(parents=True, exist_ok=True)
    r = bench_raw(d, file_bytes=512 << 20, seconds=seconds, runs=1, engine="auto", pause_s=0.5)
    run = r.runs[0]
    return min(run.fio_iops, run.ours_iops), f"{run.fio_engine} {run.fio_iops:,.0f}, {run.ours_engine} " \
                                             f"{run.ours_iops:,.0f} IOPS"


def train(dataset: Path, placement: Path, caps: Path, args, metrics: Path, sequential: bool = False) -> dict:
    """``moment train`` of ``placement``; ``sequential``: its store reads a gather's SSD bins one after another
    (:data:`~iostack.backends.posix.SEQUENTIAL_BINS_ENV`), else all at once (the default)."""
    if sequential:
        os.environ[SEQUENTIAL_BINS_ENV] = "1"
    else:
        os.environ.pop(SEQUENTIAL_BINS_ENV, None)
    out = moment("train", "--metrics", str(metrics), "--dataset", str(dataset), "--placement", str(placement),
                 "--fanouts", args.fanouts,
                 "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--eval-every", "0",
                 "--hidden", str(args.hidden), "--backend", "posix", "--capacities", str(caps), "--json")
    return json.loads(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/moment-emu"), help="work directory on the disk")
    ap.add_argument("--count", type=int, default=8, help="emulated SSDs (default 8, Machine B's)")
    ap.add_argument("--size", default="1GiB", help="each SSD's backing file (sparse; default 1GiB)")
    ap.add_argument("--spec", default="moment-b", help="the machine whose SSDs are emulated (default moment-b)")
    ap.add_argument("--slow", default="6,7", help="indices of the SSDs behind a congested switch (default 6,7)")
    ap.add_argument("--slow-factor", type=float, default=0.3, help="their share of a normal SSD's rate (0.3)")
    ap.add_argument("--disk-share", type=float, default=0.5,
                    help="the SSDs together get this share of the disk's measured IOPS (default 0.5)")
    ap.add_argument("--nodes", type=int, default=30_000)
    ap.add_argument("--edges", type=int, default=300_000)
    ap.add_argument("--train-share", default="0.05")
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=2, help="per run; the last one is reported (default 2)")
    ap.add_argument("--hidden", type=int, default=16, help="hidden units (default 16: reading rows dominates)")
    ap.add_argument("--cpu-cache-rows", type=int, default=0, help="host cache rows (default nodes / 20)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--whatif-presample-epochs", type=int, default=10,
                    help="also DDAK on the hotness of this many pre-sampled epochs (0: not)")
    ap.add_argument("--profile-seconds", default="2")
    ap.add_argument("--bin-reads", choices=tuple(BIN_READS), default="both",
                    help="the store reads a gather's SSD bins all at once (concurrent, the default of moment "
                         "train), one after another (sequential, runs named *-seq), or both side by side (default)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    why = emulation_blocked()
    if why:
        print(f"emulated SSDs cannot run here: {why}", file=sys.stderr)
        return 2
    d = args.dir.resolve()
    d.mkdir(parents=True, exist_ok=True)
    if (d / "ssds" / "emulated-ssds.json").exists():  # a killed run's devices: undo them first
        from iostack.bench.loopssds import teardown_emulated_ssds

        print("removing a previous run's emulated SSDs:", teardown_emulated_ssds(load_state(d / "ssds")) or "done")
    dataset = skewed_graph(d / f"graph-{args.nodes}-{args.edges}", args.nodes, args.edges, args.train_share)
    load0 = os.getloadavg()
    iops, disk_note = disk_iops(d / "raw", 3.0)
    slow = [int(x) for x in args.slow.split(",") if x.strip()]
    rates, model = spec_rates(args.spec, args.count, args.disk_share * iops, slow, args.slow_factor)
    print(f"disk: {disk_note}; {args.count} x {model} scaled to {args.disk_share:.0%} of {iops:,.0f} IOPS: "
          + ", ".join(f"{i:.0f}" for _, i in rates) + " IOPS", flush=True)
    with emulated_ssds(d / "ssds", rates, size_bytes=parse_size(args.size)) as ssds:
        figures = run_emulated(args, d, dataset, ssds, disk_note, load0)
    for f in figures:
        ratio = f.ratio
        print(f"{f.figure}: ours {f.ours:.4g} vs {f.reference if f.reference is None else f'{f.reference:.4g}'} "
              f"({'' if ratio is None else f'{ratio:.2f}x'}) {f.note}")
    write(args.json, "emulated_ssds", figures, " ".join(["python", "tools/bench_emulated_ssds.py", *sys.argv[1:]]))
    return 0


def run_emulated(args, d: Path, dataset: Path, ssds, disk_note: str, load0) -> list[Figure]:
    """Profile, plan, place and train on the emulated SSDs (this process is in their cgroup)."""
    mounts = ssds.mounts
    raw_caps = d / "caps-raw.yaml"
    print("profiling each emulated SSD alone", flush=True)
    moment("profile", *[a for m in mounts for a in ("--ssd", m)], "--no-memory", "--file-size",
           str(min(128 << 20, ssds.size_bytes // 5 >> 20 << 20)),
           "--seconds", args.profile_seconds, "--out", str(raw_caps))
    caps = save_capacities(capacities_for_spec(load_capacities(raw_caps), ssds), d / "caps.yaml")
    spec = d / "emulated-machine.yaml"
    spec.write_text(machine_spec_yaml(ssds))
    plan_json = moment("plan", "--machine", str(spec), "--capacities", str(caps), "--json")
    (d / "plan.json").write_text(plan_json)
    stores = {s["id"]: s for s in json.loads(plan_json)["handoff"]["targets"]["stores"] if s["kind"] == "ssd"}
    total = sum(s["target_bytes"] for s in stores.values())
    target = [stores[f"dev:ssd{i}"]["target_bytes"] / total for i in range(len(mounts))]
    measured = load_capacities(caps)
    delivered = [measured.device(f"dev:ssd{i}") for i in range(len(mounts))]
    cpu_rows = args.cpu_cache_rows or args.nodes // 20
    # name -> (strategy, extra place options): DDAK and hash on one pre-sampled epoch (the default), and the
    # what-if of DDAK on the hotness of more pre-sampled epochs (a steadier sample of which rows are hot)
    configs = {"ddak": ("ddak", []), "hash": ("hash", [])}
    if args.whatif_presample_epochs:
        configs[f"ddak-presample{args.whatif_presample_epochs}"] = (
            "ddak", ["--presample-epochs", str(args.whatif_presample_epochs), "--hotness-dir", str(d / "hot-whatif")])
    for name, (strategy, extra) in configs.items():
        print(f"placing {name}", flush=True)
        moment("place", "--dataset", str(dataset), "--plan", str(d / "plan.json"), *[a for m in mounts
                                                                                      for a in ("--ssd", m)],
               "--gpu-cache", "0", "--cpu-cache", str(cpu_rows * 4096), "--strategy", strategy, *extra,
               "--fanouts", args.fanouts, "--batch-size", str(args.batch_size), "--out", str(d / f"pl-{name}"),
               "--force")
    runs: dict[str, list[dict]] = {name + sfx: [] for name in configs for sfx in BIN_READS[args.bin_reads]}
    for r in range(args.rounds):
        for strategy in runs:
            metrics = d / f"m-{strategy}-{r}.jsonl"
            metrics.unlink(missing_ok=True)
            pl, seq = d / f"pl-{strategy.removesuffix('-seq')}", strategy.endswith("-seq")
            rec, marks = at_epoch_ends(ssds, metrics, lambda p=pl, m=metrics, q=seq: train(
                dataset, p, caps, args, m, sequential=q))
            last = rec["epochs"][-1]
            if len(marks) < 3:
                sys.exit(f"{metrics}: saw {len(marks) - 1} epoch records, need 2 (--epochs >= 2)")
            dev = [(b1 - b0, q1 - q0) for (b0, q0), (b1, q1) in zip(marks[-2], marks[-1], strict=True)]
            runs[strategy].append({"epoch": last, "device": dev, "expected": expected_ssd_shares(pl)})
            p = last.get("prediction") or {}
            print(f"round {r + 1} {strategy}: {last['seeds_per_s']:.0f} seeds/s, epoch {last['epoch_s']:.2f} s"
                  + (f", SSD read time predicted {p['predicted_io_s']:.2f} s vs measured {p['measured_io_s']:.2f} s"
                     if p.get("predicted_io_s") is not None else "")
                  + "; last epoch per device MB " + ", ".join(f"{b / 1e6:.1f}" for b, _ in dev), flush=True)
    load = f"load {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after; disk {disk_note}"
    return figures_of(args, runs, target, delivered, ssds, load)


def at_epoch_ends(ssds, metrics: Path, call, every_s: float = 0.05) -> tuple[dict, list[list[tuple[int, int]]]]:
    """``call()`` while a thread watches ``metrics`` (``moment train --metrics``, one JSON line per step and
    epoch, flushed as written) and takes the cgroup's per-device reads when each epoch record appears:
    ``call()``'s result and the reads at each epoch's end (first: before the run)."""
    marks = [device_reads(ssds)]
    done = threading.Event()

    def poll() -> None:
        seen = 0
        while not done.wait(every_s):
            text = metrics.read_text() if metrics.exists() else ""
            ends = text.count('"kind": "epoch"')
            if ends > seen:
                marks.extend([device_reads(ssds)] * (ends - seen))
                seen = ends

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        return call(), marks
    finally:
        done.set()
        t.join()


def expected_ssd_shares(placement: Path) -> list[float] | None:
    """Each SSD bin's share of the SSD reads under ``moment place``'s independent pre-sample
    (``place.json``'s ``expected_shares``), in bin order (= the ``--ssd`` order)."""
    rep = json.loads((placement / "place.json").read_text())
    held, bins = rep.get("expected_shares"), rep["report"]["bins"]
    if not held or len(held) != len(bins):
        return None
    ssd = [float(h) for h, b in zip(held, bins, strict=True) if b["kind"] == "ssd"]
    return [x / sum(ssd) for x in ssd]


def figures_of(args, runs: dict[str, list[dict]], target: list[float], delivered, ssds, load: str) -> list[Figure]:
    """The run's figures: DDAK vs hash seeds/s, each device alone vs its throttle, each device's share of the
    reads vs the plan's target, the SSD read time against two models of it, and the prediction's error."""
    figs: list[Figure] = []
    seeds = {k: [x["epoch"]["seeds_per_s"] for x in v] for k, v in runs.items()}
    how = {"": "bins read at once", "-seq": "bins read one after another"}
    for sfx in BIN_READS[args.bin_reads]:
        dk, hk = "ddak" + sfx, "hash" + sfx
        figs.append(Figure("emulated_ssds", f"seeds/s on {len(target)} emulated SSDs ({args.slow} at "
                                            f"{args.slow_factor:g}x): DDAK vs hash, {how[sfx]}", "seeds/s",
                           med(seeds[dk]), med(seeds[hk]), "hash placement", target=">= 1.3x (paper +30.6%/+34.0%)",
                           note=f"median of {args.rounds}; ranges {rng(seeds[dk], '{:.0f}')} vs "
                                f"{rng(seeds[hk], '{:.0f}')}; hidden {args.hidden}, posix O_DIRECT; {load}"))
    for name in [k for k in runs if k.removesuffix("-seq") not in ("ddak", "hash")]:
        h = "hash" + ("-seq" if name.endswith("-seq") else "")
        figs.append(Figure("emulated_ssds", f"seeds/s on {len(target)} emulated SSDs: {name} vs {h} (what-if)",
                           "seeds/s", med(seeds[name]), med(seeds[h]), "hash placement",
                           target=">= 1.3x", note=f"ranges {rng(seeds[name], '{:.0f}')} vs "
                                                  f"{rng(seeds[h], '{:.0f}')}"))
    for name in [k for k in runs if k + "-seq" in runs]:  # the same placement, its bins read both ways
        figs.append(Figure("emulated_ssds", f"{name}: seeds/s with a gather's SSD bins read at once vs one after "
                                            "another", "seeds/s", med(seeds[name]), med(seeds[name + "-seq"]),
                           "bins one after another", target="> 1x",
                           note=f"ranges {rng(seeds[name], '{:.0f}')} vs {rng(seeds[name + '-seq'], '{:.0f}')}"))
    for i, (dc, dev) in enumerate(zip(delivered, ssds.devices, strict=True)):
        if dc is not None:
            figs.append(Figure("emulated_ssds", f"SSD {i} delivered alone vs its throttle", "IOPS",
                               dc.read_iops or 0.0, dev.read_iops, "blkio throttle", target="~1.0x",
                               note=f"{dc.read.tool}, {dc.read_bytes_per_s / 1e6:.1f} MB/s"))
    for strategy, rs in runs.items():
        shares = [[b / max(1, sum(x for x, _ in r["device"])) for b, _ in r["device"]] for r in rs]
        for i, tgt in enumerate(target):
            mine = [s[i] for s in shares]
            exp = rs[-1]["expected"]
            figs.append(Figure("emulated_ssds", f"{strategy}: SSD {i}'s share of the last epoch's SSD bytes vs the "
                                                "plan's target", "share", med(mine), tgt, "plan target",
                               target="= target (DDAK)", note=f"blkio bytes per device; range {rng(mine)}"
                               + (f"; the placement's independent pre-sample expected {exp[i]:.3f}" if exp else "")))
        # bins read one after another (*-seq): the SSD time is the sum over the devices of requests /
        # throttle; read at once, the largest one (the busiest device) is the model
        serial = [sum(q / dev.read_iops for (_, q), dev in zip(r["device"], ssds.devices, strict=True)) for r in rs]
        parallel = [max(q / dev.read_iops for (_, q), dev in zip(r["device"], ssds.devices, strict=True)) for r in rs]
        meas = [(r["epoch"].get("prediction") or {}).get("measured_io_s") or 0.0 for r in rs]
        seq = strategy.endswith("-seq")
        model, other = (serial, parallel) if seq else (parallel, serial)
        figs.append(Figure("emulated_ssds", f"{strategy}: SSD read time of the last epoch vs "
                           + ("sum over devices of requests / throttle (bins read one after another)" if seq else
                              "max over devices of requests / throttle (bins read at once)"), "s",
                           med(model), med(meas), "measured (store)", higher_is_better=False, target="~1.0x",
                           note=("the max over devices (bins at once) would be" if seq else
                                 "the sum over devices (bins one after another) would be")
                           + f" {med(other):.2f} s; ranges {rng(model, '{:.2f}')} vs {rng(meas, '{:.2f}')}"))
        preds = [x["epoch"].get("prediction") or {} for x in rs]
        ok = [p for p in preds if p.get("predicted_io_s") is not None and p.get("measured_io_s")]
        if ok:
            pr, me = [p["predicted_io_s"] for p in ok], [p["measured_io_s"] for p in ok]
            errs = [abs(a / b - 1) for a, b in zip(pr, me, strict=True)]
            ep = [x["epoch"].get("epoch_s", 0.0) for x in rs]
            figs.append(Figure("emulated_ssds", f"{strategy}: SSD read time per epoch, predicted vs measured", "s",
                               med(pr), med(me), "measured (moment train)", higher_is_better=False,
                               target="error <= 5% (paper max 8.61%)",
                               note=f"|error| median {100 * med(errs):.1f}% (range {rng(errs)}); epoch time "
                                    f"{med(ep):.2f} s (range {rng(ep, '{:.2f}')})"))
    return figs


if __name__ == "__main__":
    sys.exit(main())
