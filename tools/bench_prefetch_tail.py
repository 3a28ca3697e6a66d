"""The epoch's last ``prefetch`` steps: prefetch threads held until ``close()`` (ours) beside threads that end with
the last batch (the code before the fix), side by side in one run.

    PYTHONPATH=$PWD nice -n 5 python3 tools/bench_prefetch_tail.py --repeat 3 --json tail.json

One process of ``moment train`` (the whole graph, one rank, on the CPU, torch's default threads) on a
Chung-Lu graph (``moment data synth``: 200,000 vertices, 2 M edges, 256 float32 features, 5% training
vertices; made once under ``--dir``), GraphSAGE fan-outs 10,5, batch 1000, prefetch 2, ``--epochs`` epochs
per run. Each run is a fresh process; ``held`` and ``ended`` alternate, ``--repeat`` runs each. ``ended``
is the same trainer with :class:`training.pipeline.Prefetcher`'s threads returning as soon as their
batches are handed over (what they did before): the process imports the trainer, swaps in that
subclass, and calls the CLI's entry. Figures from every epoch but the first (numba's kernels load and
the page cache fills in it), read from the run's ``--metrics`` step and epoch records:

- the tail step: the mean ``step_s`` of each epoch's last ``prefetch`` steps (their batches were
  already prepared when the threads' batches ran out);
- the median step: the median ``step_s`` of the epoch's other steps;
- seeds/s of the epoch (the epoch record's, its wall clock).

Medians over runs x epochs, with ranges. Warm page cache (the graph is read by every run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import Figure, write  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PREFETCH = 2


def _child(mode: str, argv: list[str]) -> int:
    """Run ``moment train argv`` in this process, with the prefetch threads ``held`` (as shipped) or ``ended``."""
    import training.trainer as trainer
    from training.pipeline import Prefetcher

    class EndedPrefetcher(Prefetcher):
        """The threads of the code before the fix: they return once their batches are handed over."""

        def _run(self, k: int = 0, n: int = 1) -> None:
            self._work(k, n)

    if mode == "ended":
        trainer.Prefetcher = EndedPrefetcher  # the trainer's own name for it: its epochs use the subclass
    from moment.entry import run

    sys.argv = ["moment", "train", *argv]
    return int(run() or 0)


def _graph(work: Path) -> Path:
    g = work / "graph"
    if not (g / "meta.json").exists():
        subprocess.run([sys.executable, "-m", "moment", "data", "synth", str(g), "--nodes", "200000", "--edges",
                        "2000000", "--generator", "chung-lu", "--undirected", "--feature-dim", "256",
                        "--train-share", "0.05", "--valid-share", "0.005", "--test-share", "0.005", "--seed", "3",
                        "--quiet"], check=True, cwd=REPO)
    return g


def _run(mode: str, g: Path, metrics: Path, epochs: int) -> list[dict]:
    """One fresh process's training; its step and epoch records."""
    metrics.unlink(missing_ok=True)
    argv = ["--dataset", str(g), "--model", "sage", "--fanouts", "10,5", "--batch-size", "1000", "--epochs",
            str(epochs), "--eval-every", "0", "--hidden", "128", "--prefetch", str(PREFETCH), "--metrics",
            str(metrics)]
    proc = subprocess.run([sys.executable, __file__, "--child", mode, "--", *argv], cwd=REPO, capture_output=True,
                          text=True)
    if proc.returncode:
        raise SystemExit(f"bench_prefetch_tail: the {mode} run failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def epoch_figures(records: list[dict]) -> list[tuple[float, float, float]]:
    """Per epoch but the first: (tail step s, median other step s, seeds/s)."""
    out = []
    for ep in sorted({r["epoch"] for r in records if r.get("kind") == "epoch"} - {0}):
        steps = sorted((r for r in records if r.get("kind") == "step" and r["epoch"] == ep), key=lambda r: r["step"])
        tail, rest = steps[-PREFETCH:], steps[:-PREFETCH]
        rec = next(r for r in records if r.get("kind") == "epoch" and r["epoch"] == ep)
        out.append((statistics.mean(s["step_s"] for s in tail), statistics.median(s["step_s"] for s in rest),
                    rec["seeds_per_s"]))
    return out


def _span(xs: list[float], fmt: str) -> str:
    return f"{format(statistics.median(xs), fmt)} ({format(min(xs), fmt)}-{format(max(xs), fmt)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp/moment-prefetch-tail", help="work directory (the graph, metrics)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side, alternating (default 3)")
    ap.add_argument("--epochs", type=int, default=4, help="epochs per run; the first is not counted (default 4)")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--child", choices=("held", "ended"), help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child, [a for a in args.rest if a != "--"])
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    g = _graph(work)
    got: dict[str, list[tuple[float, float, float]]] = {"held": [], "ended": []}
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    for i in range(args.repeat):
        for mode in ("held", "ended"):
            t0 = time.perf_counter()
            figs = epoch_figures(_run(mode, g, work / f"{mode}.jsonl", args.epochs))
            got[mode] += figs
            print(f"  {mode} {i + 1}/{args.repeat}: " + ", ".join(f"tail {t:.3f} s / median {m:.3f} s, {s:,.0f} seeds/s"
                                                               for t, m, s in figs)
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    note = (f"medians (ranges) of {len(got['held'])} epochs each ({args.repeat} alternating runs x "
            f"{args.epochs - 1} epochs); load {' '.join(load0)} before, {' '.join(load1)} after; warm page cache")
    figures = []
    for i, (what, unit, higher) in enumerate((("tail step (mean of the last prefetch steps)", "s", False),
                                              ("median step (the other steps)", "s", False),
                                              ("seeds/s of an epoch", "seeds/s", True))):
        ours, ref = [f[i] for f in got["held"]], [f[i] for f in got["ended"]]
        fmt = ",.0f" if higher else ".3f"
        mo, mr = statistics.median(ours), statistics.median(ref)
        print(f"{what}: held {_span(ours, fmt)} vs ended {_span(ref, fmt)} {unit}; ratio "
              f"{(mo / mr if higher else mr / mo):.2f}")
        figures.append(Figure("prefetch_tail", f"single-process sage training, {what}", unit,
                              statistics.median(ours), statistics.median(ref),
                              "prefetch threads ended with their last batch (before the fix)", higher_is_better=higher,
                              note=f"{note}; held {_span(ours, fmt)}, ended {_span(ref, fmt)}"))
    print(note)
    write(args.json, "bench_prefetch_tail", figures, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
