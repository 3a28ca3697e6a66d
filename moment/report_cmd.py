"""``moment report METRICS``: pictures and a short summary of a training run's metrics file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moment._args import examples
from moment.errors import CommandError

FORMATS = ("png", "svg")


def _chosen(args: argparse.Namespace) -> list:
    """The runs ``--run`` names: the last (default), run N, or all of them that finished an epoch."""
    from training.runreport import MetricsError, read_metrics, read_runs

    if args.run == "last":
        return [read_metrics(args.metrics)]
    if args.run == "all":
        runs = [r for r in read_runs(args.metrics) if r.epochs]
        if not runs:
            raise MetricsError(f"{args.metrics}: no epoch record (did the run finish an epoch?)")
        return runs
    try:
        number = int(args.run)
    except ValueError:
        raise CommandError(f"--run {args.run!r}: expected a run number (1 is the file's first), last or all") from None
    return [read_metrics(args.metrics, number)]


def _report_command(args: argparse.Namespace) -> int:
    from training.runreport import predicted_vs_measured, summary, tier_shares, tier_targets

    base = Path(args.out) if args.out else Path(args.metrics).with_name(Path(args.metrics).stem + "-report")
    if not args.no_plots:  # before reading: --out naming the metrics file itself, or a place that cannot be written
        from moment.outputs import check_dir

        check_dir(base, "--out", inputs=(args.metrics,), what="the report's pictures")
    runs = _chosen(args)
    docs = []
    for run in runs:
        out = base / f"run{run.number}" if len(runs) > 1 else base
        paths = []
        if not args.no_plots:
            from moment.plots import plot_report

            paths = plot_report(run, out, FORMATS)
        last = run.epochs[-1]
        docs.append({"metrics": str(run.path), "run": run.run_id, "run_number": run.number, "runs": run.runs,
                     "epochs": [e["epoch"] for e in run.epochs], "last_epoch": last,
                     "tier_shares": tier_shares(last), "tier_targets": tier_targets(run),
                     "predicted_vs_measured": [{"figure": n, "predicted": p, "measured": m}
                                               for n, p, m in predicted_vs_measured(run)],
                     "throughput": last.get("throughput"),
                     "plots": [str(p) for p in paths]})
        if not args.json:
            for line in summary(run):
                print(line)
            if paths:
                print("plots: " + ", ".join(str(p) for p in paths))
    if args.json:
        sys.stdout.write(json.dumps(docs[0] if args.run != "all" else {"runs": docs}, indent=2) + "\n")
    return 0


def register(subparsers) -> None:
    """Add ``moment report``."""
    p = subparsers.add_parser(
        "report", help="plots and a summary of a training run's metrics file (moment train --metrics)",
        description="Read the JSON-lines metrics of `moment train --metrics FILE` and draw, as PNG and SVG: "
                    "the time split of each epoch (sample / gather / compute / all-reduce / I/O wait), the "
                    "reads per tier and per bin against the plan's targets (from the placement the run "
                    "trained on), and predicted against measured figures when the metrics hold a prediction. "
                    "Prints a short summary.",
        **examples("moment report metrics.jsonl                  # plots in metrics-report/",
                   "moment report metrics.jsonl --out plots/ --json",
                   "moment report metrics.jsonl --run all       # every run appended to the file"),
    )
    p.add_argument("metrics", metavar="METRICS", help="the metrics file (JSON lines)")
    p.add_argument("--out", metavar="DIR", help="where report.png and report.svg go (default: METRICS-report/ "
                                                 "beside the file)")
    p.add_argument("--run", default="last", metavar="N|all",
                   help="which run of a file that several runs appended to: its number (1 is the first), "
                        "last (default) or all (plots of run N in --out/runN)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of the summary")
    p.add_argument("--no-plots", action="store_true", help="only the summary")
    p.set_defaults(func=_report_command)
