"""``moment place --nodes N``: the nodes printed (the work: training.place.run, training.place.nodes; its options are
checked by training.place.specs.ShardSpec)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def print_nodes(args: argparse.Namespace, sp, ds, hot, targets, report: dict | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from momentbase.units import format_size
    from training.place.nodes import sharded_summary

    summary = sharded_summary(sp)
    shares = (report or {}).get("presampled_remote_share")
    if shares:
        summary["presampled_remote_share"] = shares
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return 0
    console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)
    full = ds.num_nodes * ds.row_bytes
    console.print(f"[bold]{ds.name}[/bold]: {ds.num_nodes:,} rows of {format_size(ds.row_bytes)} over "
                  f"{sp.layout.num_nodes} nodes · replicas {sp.layout.replicas} for the {sp.layout.hot_rows:,} "
                  f"hottest rows · plan: {targets.source} · strategy {args.strategy}"
                  + (f" · {sp.layout.groups} replica groups of {sp.layout.group_size} nodes"
                     if sp.layout.groups > 1 else "")
                  + (f" · owners: the partitions of {args.partition}" if getattr(args, "partition", None) else ""))
    t = Table(title=f"nodes (written to {args.out}/node<k>)", title_justify="left")
    plans = (report or {}).get("node_plans")  # one plan per node (--plans): say whose each node's bins are
    for c in ("node", "rows", "bytes", "of a full replica", "SSD share of its reads", "directory",
              *(["plan"] if plans else [])):
        t.add_column(c, justify="left" if c in ("directory", "plan") else "right")
    for n in sp.nodes:
        t.add_row(str(n.node), f"{n.rows:,}", format_size(n.rows * sp.row_bytes), f"{n.rows * sp.row_bytes / full:.1%}",
                  f"{n.result.report.ssd_share:.1%}", str(n.directory), *([plans[n.node]] if plans else []))
    console.print(t)
    if shares:
        console.print(f"pre-sampled remote share of the nodes' reads: {shares['no_cache']:.1%} (with the halo caches "
                      f"{shares['halo_cache']:.1%} at best: fitted to that pre-sample): `moment plan --nodes "
                      f"{sp.layout.num_nodes} --remote-share {shares['no_cache']:.3f}` predicts the exchange")
    console.print(f"[dim]train on node k: torchrun --nnodes {sp.layout.num_nodes} --node-rank k ... -m moment "
                  f"train --placement {Path(args.out)} (or {Path(args.out)}/node<k> where each node has only its "
                  "own directory)[/dim]")
    return 0
