"""``moment place`` on a heterogeneous dataset: calls :func:`training.hetero.workflow.place_hetero_dataset`, prints.

Prints the bins (bytes held, rows of each type) and, per tier, the bytes held and the shares of reads
and of bytes read under an independent pre-sample, beside the padded-to-widest baseline; ``--json``
prints the report (the manifest ``hetero_place.json`` holds the same).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moment.errors import CommandError
from momentbase.units import format_size


def run_hetero(args: argparse.Namespace, handoff, out: Path, spec, plan_notes) -> int:
    """Place a heterogeneous dataset as ``args`` say; 0 when done.

    Raises
    ------
    CommandError
        ``--cpu-cache auto``, which sizes for one feature table.
    """
    from rich.console import Console
    from rich.table import Table

    from moment.bars import Bars
    from training.hetero.workflow import place_hetero_dataset

    if args.cpu_cache.strip().lower() == "auto":
        raise CommandError("--cpu-cache auto: not for a heterogeneous dataset yet; give a size")
    with Bars(quiet=args.json) as bars:
        res, rep = place_hetero_dataset(args.dataset, handoff, out, spec, force=args.force, plan_notes=plan_notes,
                                        progress=bars)
    if args.json:
        sys.stdout.write(json.dumps(rep, indent=2) + "\n")
        return 0
    console = Console(highlight=False, emoji=False)
    types = list(rep["types"])
    t = Table(title=f"{Path(args.dataset).name}: {', '.join(types)} rows in {len(res.bins)} shared bins "
                    "(DDAK by bytes)")
    for col in ("bin", "kind", "device", "capacity", "held", *(f"{x} rows" for x in types)):
        t.add_column(col, justify="left" if col in ("kind", "device") else "right")
    for j, b in enumerate(rep["bins"]):
        t.add_row(str(j), b["kind"], str(b["device"]), format_size(b["capacity_bytes"]), format_size(b["bytes"]),
                  *(f"{rep['types'][x]['rows_per_bin'][j]:,}" for x in types))
    console.print(t)
    s = Table(title="per tier, under an independent pre-sample: DDAK by bytes vs rows padded to the widest")
    for col in ("tier", "bytes held", "reads", "bytes read", "padded: reads", "padded: bytes read"):
        s.add_column(col, justify="left" if col == "tier" else "right")
    pad = rep["padded_baseline"]["tiers_held_out"]
    for kind, v in rep["tiers_held_out"].items():
        p = pad.get(kind, {})
        s.add_row(kind, format_size(v["bytes"]), f"{100 * v['read_share']:.1f}%", f"{100 * v['read_bytes_share']:.1f}%",
                  f"{100 * p.get('read_share', 0):.1f}%", f"{100 * p.get('read_bytes_share', 0):.1f}%")
    console.print(s)
    for note in rep["plan_notes"]:
        console.print(f"plan: {note}", markup=False)
    return 0
