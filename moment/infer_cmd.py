"""``moment infer``: a trained model applied to every vertex, layer by layer, out of core.

Parses the options into a :class:`training.infer.run.InferSpec`, runs
:func:`training.infer.run.infer` with progress bars (one per layer) and prints
what it wrote and cost: vertices per second, rows and bytes read per tier and
layer, the peak resident memory.
"""

from __future__ import annotations

import argparse
import sys

from iostack.backends import backend_choices
from moment._args import examples, parse_fanouts
from moment._args import size_arg as _size
from moment.errors import CommandError


def _spec(args: argparse.Namespace):
    from training.infer.run import InferSpec

    return InferSpec(args.dataset, args.checkpoint, args.out, placement=args.placement, backend=args.backend,
                     fanouts=parse_fanouts(args.fanouts) if args.fanouts else None,
                     chunk_bytes=_size(args.chunk_size, "--chunk-size"), chunk_rows=args.chunk_rows,
                     embeddings=args.embeddings, work_dir=args.work_dir, overwrite=args.force, seed=args.seed,
                     device=args.device, capacities=args.capacities)


def _summary(result) -> str:
    from momentbase.units import format_size

    lines = [f"inferred {result.num_nodes:,} vertices in {result.seconds:.2f} s ({result.nodes_per_s:,.0f} "
             f"vertices/s through every layer), peak resident memory {format_size(result.peak_rss_bytes)}"]
    for rec in result.layers:
        read = ", ".join(f"{tier} {v['rows']:,} rows ({format_size(v['bytes'])})" for tier, v in rec["tiers"].items())
        lines.append(f"  layer {rec['layer']}: {rec['seconds']:.2f} s, {rec['chunks']} chunk(s), fan-out "
                     f"{'all' if rec['fanout'] == -1 else rec['fanout']}, read from {rec['read_from']}: {read}")
    lines += [f"  wrote {path}" for path in result.outputs.values()]
    return "\n".join(lines)


def _infer_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from moment.bars import Bars
    from moment.outputs import check_dir
    from training.infer.run import infer

    if not Path(args.dataset).is_dir():
        raise CommandError(f"--dataset {args.dataset}: no such dataset directory (create one with "
                           "`moment data import`)")
    spec = _spec(args)
    check_dir(args.out, "--out", inputs=(args.dataset, args.placement), what="the results")
    with Bars(quiet=args.json, unit="vertices") as bars:
        result = infer(spec, progress=bars)
    if args.json:
        import json

        sys.stdout.write(json.dumps({"schema": "moment.infer", "version": 1, **result.to_dict()}, indent=2) + "\n")
    else:
        print(_summary(result))
    return 0


def register(subparsers) -> None:
    """Add ``moment infer``."""
    p = subparsers.add_parser(
        "infer", help="predict (and embed) every vertex with a trained model, layer by layer, out of core",
        description="Apply a `moment train` checkpoint to every vertex of a dataset, one layer at a time over all "
                    "vertices: each layer reads its input rows through the tiered store (the placement's bins, or "
                    "the features' memory map) in chunks and writes its output as a new SSD bin the next layer "
                    "reads, so memory holds a chunk, never a layer. Writes OUT/logits.npy, OUT/predictions.npy "
                    "(and OUT/embeddings.npy) and OUT/infer.json. With full neighbourhoods (the default) the "
                    "results equal the model's forward on the whole graph in memory.",
        **examples("moment infer --dataset cora --checkpoint ckpt/ --out cora-pred",
                   "moment infer --dataset graph --placement graph-placement --checkpoint ckpt/ --out pred "
                   "--embeddings --chunk-size 256MiB"),
    )
    p.add_argument("--dataset", required=True, metavar="DIR", help="dataset directory (moment data import)")
    p.add_argument("--checkpoint", required=True, metavar="CKPT",
                   help="a `moment train --checkpoint` directory, or its checkpoint.pt")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the results")
    p.add_argument("--placement", metavar="DIR",
                   help="the dataset's placement (moment place): layer 0 reads through its bins; default: the "
                        "dataset's features.npy, memory-mapped")
    p.add_argument("--fanouts", metavar="F1,F2,..",
                   help="neighbours per layer, -1 = all (write --fanouts=-1,5); default: all in every layer (exact)")
    p.add_argument("--chunk-size", default="32MiB", metavar="SIZE",
                   help="the rows a chunk of vertices may gather, e.g. 256MiB (default 32MiB); two chunks are in "
                        "memory at once, the next gathered while this one computes")
    p.add_argument("--chunk-rows", type=int, metavar="N",
                   help="instead: at most N target vertices and N edges per chunk, every layer")
    p.add_argument("--embeddings", action="store_true", help="also write the last hidden layer, OUT/embeddings.npy")
    p.add_argument("--work-dir", metavar="DIR",
                   help="where the hidden layers' tables are written (default --out); removed at the end")
    p.add_argument("--backend", choices=backend_choices(), default="auto",
                   help="SSD read backend (default auto: posix unless --capacities measured kvikio faster)")
    p.add_argument("--capacities", metavar="FILE", help="a `moment profile` file: its figures choose --backend auto")
    p.add_argument("--device", metavar="DEV", help="where the layers run, e.g. cuda:0 (default: the host)")
    p.add_argument("--seed", type=int, default=0, help="seed of sampled fan-outs (default 0)")
    p.add_argument("--force", action="store_true", help="replace results already in --out")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_infer_command)
