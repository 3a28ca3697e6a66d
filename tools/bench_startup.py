"""Start-up time of ``moment`` commands: this tree against another tree and a bare interpreter.

Usage:
    python tools/bench_startup.py [--repeats 15] [--reference-tree DIR] [--json out.json]

Each round runs, each as a fresh process, ``python -c pass`` (the floor) and every measured
command (``moment --help``, ``moment machines``, ``moment train --help``, ``moment place --help``,
``moment topo --machine moment-b``, ``moment plan --machine moment-b``) on this tree and, with
``--reference-tree``, on that tree too (``PYTHONPATH=DIR``: e.g. an export of main from before
a change, ``git archive COMMIT | tar -x -C DIR``). Rounds interleave everything, the two trees'
runs of a command back to back in alternating order, so that a load spike from other processes
hits both alike. Round 0 is discarded (it fills the page cache: the figures are warm starts).
Reported: median wall time with min–max range over ``--repeats`` rounds, the median CPU time
(user + system, which a loaded machine inflates less than wall time), the ratio reference /
ours per command, and each against the bare start; the load average before and after.
The goal (issue 30): plan, topo, machines and every --help within 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]
BARE = "python -c pass"

#: name -> arguments after ``python``
COMMANDS: dict[str, list[str]] = {
    "moment --help": ["-m", "moment", "--help"],
    "moment machines": ["-m", "moment", "machines"],
    "moment train --help": ["-m", "moment", "train", "--help"],
    "moment place --help": ["-m", "moment", "place", "--help"],
    "moment topo --machine moment-b": ["-m", "moment", "topo", "--machine", "moment-b"],
    "moment plan --machine moment-b": ["-m", "moment", "plan", "--machine", "moment-b"],
}

TARGET = "≤ 0.5 s (issue 30 item 3)"


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _time_once(args: list[str], tree: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run; the CPU time holds up better under load."""
    env = {**os.environ, "PYTHONPATH": str(tree) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    c = _cpu_children()
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: python {' '.join(args)} failed: {proc.stderr.strip()[-300:]}")
    return dt, _cpu_children() - c


def measure(repeats: int, reference: Path | None) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(wall, CPU) seconds per (command, tree), ``repeats`` interleaved rounds after one warm-up round."""
    trees = {"ours": REPO} if reference is None else {"ours": REPO, "reference": reference}
    times: dict[tuple[str, str], list[tuple[float, float]]] = {(BARE, "ours"): []}
    for name in COMMANDS:
        for side in trees:
            times[name, side] = []
    for rnd in range(repeats + 1):
        sides = list(trees) if rnd % 2 == 0 else list(reversed(trees))  # alternate who goes first
        jobs = [(BARE, "ours", ["-c", "pass"])] + [(n, side, a) for n, a in COMMANDS.items() for side in sides]
        for name, side, args in jobs:
            wall_cpu = _time_once(args, trees[side])
            if rnd:  # round 0 fills the page cache with the .pyc files
                times[name, side].append(wall_cpu)
    return times


def _span(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.3f} s [{min(xs):.3f}–{max(xs):.3f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15, help="rounds (default 15)")
    ap.add_argument("--reference-tree", metavar="DIR", type=Path,
                    help="another checkout of the project to time beside this one (PYTHONPATH=DIR)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats: expected at least 1")
    ref_tree = args.reference_tree
    if ref_tree is not None and not (ref_tree / "moment" / "cli.py").is_file():
        ap.error(f"--reference-tree {ref_tree}: no moment/cli.py there (give a checkout of the project)")
    load_before = os.getloadavg()
    both = measure(args.repeats, ref_tree.resolve() if ref_tree else None)
    load_after = os.getloadavg()
    times = {k: [w for w, _ in v] for k, v in both.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in both.items()}
    bare = statistics.median(times[BARE, "ours"])
    load = (f"load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in load_before)} before, "
            f"{'/'.join(f'{x:.2f}' for x in load_after)} after, on {os.cpu_count()} CPUs; warm page cache")
    print(f"start-up, {args.repeats} interleaved rounds, median [min–max] wall seconds; {load}")
    print(f"  {BARE:32s} {_span(times[BARE, 'ours'])} cpu {cpu[BARE, 'ours']:.3f} s")
    figures = []
    for name in COMMANDS:
        ours = times[name, "ours"]
        med = statistics.median(ours)
        line = f"  {name:32s} ours {_span(ours)} cpu {cpu[name, 'ours']:.3f} s ({med / bare:.1f}× the bare start)"
        note = f"ours {min(ours):.3f}–{max(ours):.3f} s, median CPU {cpu[name, 'ours']:.3f} s"
        ref_med, ref_name = bare, BARE
        if ref_tree is not None:
            ref = times[name, "reference"]
            ref_med, ref_name = statistics.median(ref), f"the same command on {ref_tree}"
            line += (f"  before {_span(ref)} cpu {cpu[name, 'reference']:.3f} s  ratio before/ours "
                     f"{ref_med / med:.2f} (CPU {cpu[name, 'reference'] / cpu[name, 'ours']:.2f})")
            note += (f", before {min(ref):.3f}–{max(ref):.3f} s, median CPU {cpu[name, 'reference']:.3f} s; "
                     f"bare start {bare:.3f} s")
        print(line)
        figures.append(Figure(bench="startup", figure=f"{name}: wall time", unit="s", ours=med,
                              reference=ref_med, reference_name=ref_name, higher_is_better=False,
                              target=TARGET, note=f"{note}; {load}"))
        side = "reference" if ref_tree is not None else None
        figures.append(Figure(bench="startup", figure=f"{name}: CPU time (user + system)", unit="s",
                              ours=cpu[name, "ours"], reference=cpu[name, side] if side else cpu[BARE, "ours"],
                              reference_name=ref_name, higher_is_better=False, target=TARGET,
                              note=f"median of {args.repeats}; {load}"))
    write(args.json, "startup", figures, "python tools/bench_startup.py " + " ".join(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
