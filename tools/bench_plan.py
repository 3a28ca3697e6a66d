"""Benchmark `moment plan`: our pruned search against exhaustive search, in one run.

    python tools/bench_plan.py [--repeats 7] [--fixtures ../shared/fixtures/topology]

For the bundled Machines A and B with 4 GPUs and 8 SSDs it prints the median
wall time of the whole plan (enumerate, prune, solve, rank) next to the
exhaustive search that solves every distinct layout (the reference), their
ratio, and whether both find the same best time; then the recommended layout
against classic layout (c) on Machine B; then an 8-GPU, 16-SSD plan on each
real capture where it fits (and why not where it does not), with the
capture's own devices otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _results import Figure, write

from planner.errors import PlannerError
from planner.plan import choose_inventory, layout_summary, plan
from planner.topology.discover import topology_from_files
from planner.topology.spec.load import load_machine
from planner.workload import Demand

REPO = Path(__file__).resolve().parents[1]


def timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def capture_args(folder: Path) -> dict:
    """topology_from_files arguments for every capture in one fixture folder."""
    kw: dict = {"lspci_vvv": []}
    for f in sorted(folder.iterdir()):
        n = f.name
        if n in ("lspci-tv.txt", "lspci-t-pruned.txt"):
            kw["lspci"] = f
        elif n == "lspci-vvnn.txt" or (n.startswith("lspci-vvv-s-") and n.endswith(".txt")):
            kw["lspci_vvv"].append(f)
        elif n == "dmidecode.txt":
            kw["dmidecode"] = f
        elif n == "nvidia-smi-topo.txt":
            kw["nvidia_smi"] = f
        elif n == "hwloc.xml":
            kw["hwloc"] = f
        elif n == "nccl-topo.xml":
            kw["nccl_topo"] = f
    return kw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--fixtures", type=Path, default=REPO.parent / "shared" / "fixtures" / "topology")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args()
    figures: list[Figure] = []

    print("== bundled machines, 4 GPUs + 8 SSDs (maxflow): ours (pruned) vs exhaustive")
    print(f"{'machine':10} {'workload':22} {'distinct':>8} {'solved':>6} {'ours s':>8} {'exhaustive s':>12} "
          f"{'ratio':>7} {'same best T':>11}")
    demands = {"SSD only": Demand(1e9), "host memory 30%": Demand(1e9, host_memory_share=0.3)}
    results = {}
    for name in ("moment-a", "moment-b"):
        topo = load_machine(name)
        topo, inv = choose_inventory(topo, spec=name)
        for label, demand in demands.items():
            ours_s, ours = timed(lambda t=topo, i=inv, d=demand: plan(t, i, d), args.repeats)
            ref_s, ref = timed(lambda t=topo, i=inv, d=demand: plan(t, i, d, exhaustive=True), 1)
            same = abs(ours.best.seconds_per_iteration - ref.best.seconds_per_iteration) \
                <= 5e-4 * ref.best.seconds_per_iteration
            results[(name, label)] = ours
            figures.append(Figure("plan", f"{name}, {label}: plan time", "s", ours_s, ref_s,
                                  "exhaustive search", higher_is_better=False,
                                  note=f"same best T: {same}; {ours.solved_count} of "
                                       f"{ours.search.distinct_count} layouts solved"))
            print(f"{name:10} {label:22} {ours.search.distinct_count:>8} {ours.solved_count:>6} "
                  f"{ours_s:>8.3f} {ref_s:>12.3f} {ref_s / ours_s:>6.1f}x {str(same):>11}")

    print("\n== Machine B: recommended layout vs classic layout (c), predicted mean per-GPU inlet GB/s")
    print("   (the paper, measured with its own workload: 15.61 vs 10.92 GB/s, 1.43x)")
    for label in demands:
        r = results[("moment-b", label)]
        c = r.baselines["c"]
        figures.append(Figure("plan", f"moment-b, {label}: mean per-GPU inlet", "GB/s",
                              r.best.mean_inlet_bytes_per_s / 1e9, c.mean_inlet_bytes_per_s / 1e9,
                              "classic layout (c)", note="predicted; paper measured 15.61 vs 10.92"))
        print(f"   {label:22} recommended {r.best.mean_inlet_bytes_per_s / 1e9:6.2f}  "
              f"(c) {c.mean_inlet_bytes_per_s / 1e9:6.2f}  ratio {r.gain_over('c'):.2f}x")
        print(f"   {'':22} recommended: {layout_summary(r.best.placed)}")
        print(f"   {'':22} (c):         {layout_summary(c.placed)}")

    print("\n== real captures: 8 GPUs + 16 SSDs where they fit, else the capture's own devices")
    if not args.fixtures.is_dir():
        print(f"   {args.fixtures} not found; skipped")
        write(args.json, "bench_plan", figures, " ".join(sys.argv))
        return 0
    slowest = 0.0
    for folder in sorted(p for p in args.fixtures.iterdir() if p.is_dir()):
        try:
            topo = topology_from_files(**capture_args(folder))
        except PlannerError as exc:
            print(f"   {folder.name}: cannot read ({exc})")
            continue
        for what, counts in (("8 GPU + 16 SSD", dict(gpus=8, ssds=16)), ("own devices", {})):
            try:
                t, inv = choose_inventory(topo, **counts)
                secs, r = timed(lambda t=t, i=inv: plan(t, i, Demand(1e9), unknown_link_bytes_per_s=25e9), 1)
            except PlannerError as exc:
                print(f"   {folder.name:48} {what:15} does not fit: {str(exc)[:110]}")
                continue
            slowest = max(slowest, secs)
            print(f"   {folder.name:48} {what:15} {str(inv)[:60]:60} distinct {r.search.distinct_count:>6} "
                  f"solved {r.solved_count:>4} {secs:6.2f} s")
            break
    print(f"   slowest capture plan: {slowest:.2f} s (links no capture sized assumed at 25 GB/s)")
    write(args.json, "bench_plan", figures, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
