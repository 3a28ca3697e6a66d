"""``moment report METRICS``: pictures and a short summary of a training run's metrics file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moment._args import examples

FORMATS = ("png", "svg")


def _report_command(args: argparse.Namespace) -> int:
    from training.runreport import (
        predicted_vs_measured,
        read_metrics,
        summary,
        tier_shares,
        tier_targets,
    )

    run = read_metrics(args.metrics)
    out = Path(args.out) if args.out else run.path.with_name(run.path.stem + "-report")
    paths = []
    if not args.no_plots:
        from moment.plots import plot_report

        paths = plot_report(run, out, FORMATS)
    if args.json:
        last = run.epochs[-1]
        data = {"metrics": str(run.path), "epochs": [e["epoch"] for e in run.epochs], "last_epoch": last,
                "tier_shares": tier_shares(last), "tier_targets": tier_targets(run),
                "predicted_vs_measured": [{"figure": n, "predicted": p, "measured": m}
                                          for n, p, m in predicted_vs_measured(run)],
                "plots": [str(p) for p in paths]}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0
    for line in summary(run):
        print(line)
    if paths:
        print("plots: " + ", ".join(str(p) for p in paths))
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
                   "moment report metrics.jsonl --out plots/ --json"),
    )
    p.add_argument("metrics", metavar="METRICS", help="the metrics file (JSON lines)")
    p.add_argument("--out", metavar="DIR", help="where report.png and report.svg go (default: METRICS-report/ "
                                                 "beside the file)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of the summary")
    p.add_argument("--no-plots", action="store_true", help="only the summary")
    p.set_defaults(func=_report_command)
