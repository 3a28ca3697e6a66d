"""Start-up time of the ``moment`` command against a bare interpreter (``python -c pass``).

Usage:
    python tools/bench_startup.py [--repeats 15] [--json out.json]

Each round runs, one after the other and each as a fresh process, ``python -c pass`` (the
reference) and every measured command: ``moment --help``, ``moment machines`` and, for the
record, ``moment topo --machine moment-b`` and ``moment plan --machine moment-b`` (those two
load networkx, and plan scipy; neither may load torch or PyG, which tests/test_startup.py
guards). Rounds interleave the commands so that a load spike from other processes hits all
of them alike. Reported: median wall time with min–max range over ``--repeats`` rounds, and
the ratio pass / ours (the goal for --help and machines: ours within 3× of the bare start,
i.e. a ratio of at least 0.33).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]

#: name -> arguments after ``python``; the first is the reference
COMMANDS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "moment --help": ["-m", "moment", "--help"],
    "moment machines": ["-m", "moment", "machines"],
    "moment topo --machine moment-b": ["-m", "moment", "topo", "--machine", "moment-b"],
    "moment plan --machine moment-b": ["-m", "moment", "plan", "--machine", "moment-b"],
}

#: what the issue asks of each (ratio = reference / ours, so at least 1/3)
TARGETS = {"moment --help": "≥ 0.33 (within 3× of python -c pass)",
           "moment machines": "≥ 0.33 (within 3× of python -c pass)"}


def _time_once(args: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"python {' '.join(args)} failed: {proc.stderr.strip()[-300:]}")
    return dt


def measure(repeats: int) -> dict[str, list[float]]:
    """Wall seconds of each command, ``repeats`` interleaved rounds (after one warm-up round)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for rnd in range(repeats + 1):
        for name, args in COMMANDS.items():
            dt = _time_once(args, env)
            if rnd:  # round 0 fills the page cache with the .pyc files
                times[name].append(dt)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15, help="rounds (default 15)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats: expected at least 1")
    times = measure(args.repeats)
    ref_name = next(iter(COMMANDS))
    ref = statistics.median(times[ref_name])
    load = os.getloadavg()[0]
    print(f"start-up, {args.repeats} rounds, median [min–max] wall seconds; load average {load:.2f} "
          f"on {os.cpu_count()} CPUs")
    figures = []
    for name, xs in times.items():
        med = statistics.median(xs)
        ratio = "" if name == ref_name else f"  ratio pass/ours {ref / med:.2f} ({med / ref:.1f}× the bare start)"
        print(f"  {name:32s} {med:6.3f} s [{min(xs):.3f}–{max(xs):.3f}]{ratio}")
        if name != ref_name:
            figures.append(Figure(
                bench="startup", figure=f"{name}: wall time", unit="s", ours=med, reference=ref,
                reference_name=ref_name, higher_is_better=False, target=TARGETS.get(name, "no torch/PyG import"),
                note=f"range {min(xs):.3f}–{max(xs):.3f} s, reference {min(times[ref_name]):.3f}–"
                     f"{max(times[ref_name]):.3f} s; load {load:.2f}"))
    write(args.json, "startup", figures, "python tools/bench_startup.py " + " ".join(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
