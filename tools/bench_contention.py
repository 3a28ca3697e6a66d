"""The plan's read prediction under contention: the same small training run alone and beside a CPU hog.

    python tools/bench_contention.py [--dir /var/tmp/moment-contention] [--rounds 3] [--json FILE]

A skewed Chung-Lu graph with 4 KiB feature rows, ``moment profile`` of the disk its SSD bins go
to (once, before any hog), a DDAK placement on Machine B's plan with a small host cache (SSD-bound),
then rounds of two ``moment train --capacities`` runs back to back: one with nothing added
("as found": this machine is shared, its load is stated) and one beside a CPU hog, one busy process
per core started by this script and ended by it. Each run's last epoch reports the SSD read time
predicted against measured (``prediction.io_error``, the plain prediction from the profile) and the
contention-adjusted prediction beside it (``adjusted_io_error``: the plain one scaled by the disk
time others took, plus each read call's wait for a core, both measured over that same epoch,
:mod:`training.contention`), with the contention named.

The figure per condition: the median |error| adjusted (ours) against plain (the reference); a ratio
above 1 means the adjustment explains the miss. The adjusted figure uses the epoch's own measurements:
it explains a miss after the fact, it is not a forecast. Medians and ranges over ``--rounds``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from _cli import moment, skewed_graph
from _results import Figure, write
from bench_loop import REPO, med, place, rng, train

HOG = "while True: pass"


def start_hog(n: int) -> list[subprocess.Popen]:
    """``n`` busy processes (one per core): the CPU contention, ended by :func:`stop_hog`."""
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]


def stop_hog(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def describe_run(rec: dict) -> str:
    sys.path.insert(0, str(REPO))  # the tree's own training package, as the runs use
    from training.contention import describe

    return describe(rec.get("prediction"), rec["contention"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/moment-contention"), help="work directory on the SSD")
    ap.add_argument("--nodes", type=int, default=60_000)
    ap.add_argument("--edges", type=int, default=600_000)
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=2, help="epochs per run; the last one is reported (default 2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    ap.add_argument("--profile-seconds", default="3")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    d = args.dir
    d.mkdir(parents=True, exist_ok=True)
    dataset = skewed_graph(d / f"graph-{args.nodes}-{args.edges}", args.nodes, args.edges, "0.05")
    caps = d / "caps.yaml"
    (d / "ssd").mkdir(exist_ok=True)
    if not caps.exists():
        print("profiling the disk (before any hog)", flush=True)
        moment("profile", "--ssd", str(d / "ssd"), "--seconds", args.profile_seconds, "--file-size", "256MiB",
               "--out", str(caps))
    place(dataset, d / "pl", d / "ssd", "ddak", args.nodes // 20 * 4096, args.fanouts, args.batch_size)
    load0 = Path("/proc/loadavg").read_text().split()[0]
    runs: dict[str, list[dict]] = {"as found": [], "CPU hog": []}
    for r in range(args.rounds):
        for cond in runs:
            hog = start_hog(args.hogs) if cond == "CPU hog" else []
            try:
                rec = train(dataset, d / "pl", caps, args.fanouts, args.batch_size, args.epochs, hidden=16)
            finally:
                stop_hog(hog)
            runs[cond].append(rec)
            p = rec["prediction"]
            high = p.get("adjusted_io_high_s")
            print(f"round {r + 1} {cond}: predicted {p['predicted_io_s']:.3f} s, adjusted {p['adjusted_io_s']:.3f}"
                  + (f"..{high:.3f}" if high is not None else "") + f" s, measured {p['measured_io_s']:.3f} s; "
                  f"{describe_run(rec)}", flush=True)
    load1 = Path("/proc/loadavg").read_text().split()[0]
    figures = []
    for cond, recs in runs.items():
        plain = [abs(x["prediction"]["io_error"]) for x in recs]
        adj = [abs(x["prediction"]["adjusted_io_error"]) for x in recs]
        high = [abs(x["prediction"]["adjusted_io_high_error"]) for x in recs
                if x["prediction"].get("adjusted_io_high_error") is not None]
        inside = sum(1 for x in recs if x["prediction"].get("adjusted_io_high_s") is not None
                     and x["prediction"]["adjusted_io_s"] <= x["prediction"]["measured_io_s"]
                     <= x["prediction"]["adjusted_io_high_s"])
        slower = sum(1 for x in recs if x["prediction"]["measured_io_s"] > x["prediction"]["predicted_io_s"])
        waits = [1e3 * x["contention"]["wait_per_slice_s"] for x in recs]
        print(f"{cond}: |error| plain median {100 * med(plain):.1f}% ({rng(plain)}), adjusted "
              f"{100 * med(adj):.1f}% ({rng(adj)}), high end {100 * med(high) if high else float('nan'):.1f}%; "
              f"measured within the bracket in {inside} of {len(recs)} runs ({slower} slower than the plain "
              f"prediction); wait for a core per turn {rng(waits, '{:.1f}')} ms")
        figures.append(Figure("contention", f"|SSD read time error|, adjusted vs plain prediction: {cond}", "share",
                              med(adj), med(plain), "plain prediction (profile only)", higher_is_better=False,
                              target="a loaded run's miss named and explained",
                              note=f"median of {args.rounds}; plain {rng(plain)}, adjusted (low end) {rng(adj)}, high "
                                   f"end {rng(high) if high else 'not timed'}; measured within the bracket in {inside} "
                                   f"of {len(recs)} runs, {slower} slower than predicted; wait for a "
                                   f"core per turn {rng(waits, '{:.1f}')} ms; "
                                   f"{args.hogs if cond == 'CPU hog' else 0} hog(s); "
                                   f"load {load0} before, {load1} after; {os.cpu_count()} cores; warm page cache "
                                   f"for the graph, O_DIRECT bins; last run: {describe_run(recs[-1])}"))
    write(args.json, "contention", figures, " ".join(["python", "tools/bench_contention.py", *sys.argv[1:]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
