"""``moment train --task link``: link prediction on an edge-split dataset, its epoch lines and summary.

Runs :func:`training.link.train.train_link` through :data:`training.tasks.TASKS` (under ``torchrun`` one
data-parallel rank per process; rank 0 prints) and prints one line per
epoch (loss, validation and test AUC / MRR / Hits@50) and a summary table; ``--json`` prints the records.
"""

from __future__ import annotations

import argparse
import json
import sys

from moment.errors import CommandError
from training.tasks import TASKS


def _line(rec: dict) -> str:
    line = f"epoch {rec['epoch']}: loss {rec['loss']:.4f}, {rec['epoch_s']:.2f} s, {rec['pairs_per_s']:,.0f} pairs/s"
    for split in ("valid", "test"):
        if f"{split}_auc" in rec:
            line += (f", {split} AUC {100 * rec[f'{split}_auc']:.2f} MRR {rec[f'{split}_mrr']:.3f} "
                     f"Hits@50 {100 * rec[f'{split}_hits@50']:.1f}%")
    return line


def run_link(args: argparse.Namespace, spec, err, out) -> int:
    """Train ``spec`` for link prediction with the options of ``args``; 0 when done.

    Raises
    ------
    CommandError
        Options link prediction does not take yet (checkpoints, a sampling server, the SSD graph).
    """
    unsupported = [flag for flag, on in (("--checkpoint", args.checkpoint), ("--resume", args.resume),
                                         ("--server", args.server), ("--graph-on disk", args.graph_on == "disk"))
                   if on]
    if unsupported:
        raise CommandError(f"{', '.join(unsupported)}: not available with --task link yet")

    def progress(rec: dict) -> None:
        if rec["rank"] != 0:  # under torchrun only rank 0 prints
            return
        if rec["kind"] == "start":
            err.print(f"link prediction: {spec.model.arch} encoder, {args.decoder} decoder, "
                      f"{rec['num_train']:,} training edges, {rec['steps_per_epoch']} steps per epoch, "
                      f"{rec['world_size']} rank(s), device {rec['device']}", markup=False)
        elif rec["kind"] == "epoch":
            err.print(_line(rec), markup=False)

    options = {"decoder": args.decoder, "negatives": args.negatives, "neg_ratio": args.neg_ratio,
               "embed_dim": args.embed_dim}
    result = TASKS.get("link")(spec, options, progress=progress)
    if result.rank != 0:
        return 0
    if args.json:
        sys.stdout.write(json.dumps({"schema": "moment.train", "version": 1, "task": "link",
                                     "world_size": result.world_size,
                                     "resumed_from": None, "epochs": list(result.epochs)},
                                    indent=2, default=str) + "\n")
        return 0
    final = result.final
    if final is None:
        return 0
    best = final.get("test_at_best") or {}
    out.print(f"link prediction on {spec.dataset}: {len(result.epochs)} epoch(s), last loss {final['loss']:.4f}",
              markup=False)
    if best:
        out.print("test at the best validation AUC: " + ", ".join(
            f"{k} {100 * v:.2f}" if k.startswith(("auc", "hits")) else f"{k} {v:.4f}" for k, v in best.items()),
            markup=False)
    return 0
