"""``moment train`` on a heterogeneous dataset: HeteroSAGE or R-GCN, its epoch lines and summary.

Runs :func:`training.hetero.train.train_hetero` through :data:`training.tasks.TASKS` (``hetero``) and
prints one line per epoch (loss, seeds/s, accuracy, rows read per tier); ``--json`` prints the records.
"""

from __future__ import annotations

import argparse
import json
import sys

from moment.errors import CommandError
from training.tasks import TASKS
from training.vocab import HETERO_MODEL_NAMES


def _line(rec: dict) -> str:
    line = f"epoch {rec['epoch']}: loss {rec['loss']:.4f}, {rec['epoch_s']:.2f} s, {rec['seeds_per_s']:,.0f} seeds/s"
    for split in ("valid", "test"):
        if f"{split}_acc" in rec:
            line += f", {split} {100 * rec[f'{split}_acc']:.1f}%"
    if rec.get("tiers"):
        line += "; rows from " + ", ".join(f"{k} {v['rows']:,}" for k, v in rec["tiers"].items())
    return line


def run_hetero(args: argparse.Namespace, spec, err, out) -> int:
    """Train ``spec`` on a heterogeneous dataset with the options of ``args``; 0 when done.

    Raises
    ------
    CommandError
        A homogeneous ``--model``, or options heterogeneous training does not take yet.
    """
    if args.model not in HETERO_MODEL_NAMES:
        raise CommandError(f"--model {args.model}: {args.dataset} is a heterogeneous dataset; train it with "
                           f"--model {' or '.join(HETERO_MODEL_NAMES)}")
    unsupported = [flag for flag, on in (("--task link", args.task == "link"), ("--server", args.server),
                                         ("--graph-on disk", args.graph_on == "disk"),
                                         ("--partition", args.partition),
                                         ("--sample-on gpu", args.sample_on == "gpu"),
                                         ("--dynamic-cache", spec.io.dynamic_cache_bytes),
                                         ("--remote-cache", spec.io.remote_cache_bytes)) if on]
    if unsupported:
        raise CommandError(f"{', '.join(unsupported)}: not available for a heterogeneous dataset yet")

    def progress(rec: dict) -> None:
        if rec["rank"] != 0:  # only rank 0 prints
            return
        if rec["kind"] == "start":
            err.print(f"training {rec['model']} on {rec['num_train']:,} seeds of the target type, "
                      f"{rec['world_size']} rank(s), "
                      f"{rec['steps_per_epoch']} steps per epoch, features from {rec['features']}"
                      + (f", from epoch {rec['start_epoch']}" if rec["start_epoch"] else ""), markup=False)
        elif rec["kind"] == "epoch":
            err.print(_line(rec), markup=False)

    result = TASKS.get("hetero")(spec, {}, progress=progress)
    if result.rank != 0:
        return 0
    if args.json:
        sys.stdout.write(json.dumps({"schema": "moment.train", "version": 1, "task": "hetero",
                                     "world_size": result.world_size,
                                     "resumed_from": result.resumed_from, "epochs": list(result.epochs)},
                                    indent=2, default=str) + "\n")
        return 0
    final = result.final
    if final is None:
        out.print(f"nothing to do: the checkpoint is already at epoch {spec.run.epochs}", markup=False)
        return 0
    acc = ", ".join(f"{s} accuracy {100 * final[f'{s}_acc']:.1f}%" for s in ("valid", "test") if f"{s}_acc" in final)
    out.print(f"{args.model} on {spec.dataset}: {len(result.epochs)} epoch(s), last loss {final['loss']:.4f}"
              + (f", {acc}" if acc else ""), markup=False)
    return 0
