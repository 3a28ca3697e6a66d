"""``moment data partition``: split a dataset over nodes (the work: :mod:`training.partition.run`), print the cut,
the balance and the remote share; ``moment data info`` of a partitioned directory (:func:`print_partition_info`)."""

from __future__ import annotations

import argparse
import json
import sys

from moment._args import examples, parse_fanouts


def _table(summary: dict, title: str):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for c in ("part", "vertices", "CSR entries", "train seeds", "halo vertices", "remote entries"):
        t.add_column(c, justify="right")
    for r in summary["parts_detail"]:
        t.add_row(str(r["part"]), f"{r['nodes']:,}", f"{r['edges']:,}", f"{r['seeds'].get('train', 0):,}",
                  f"{r['halo']:,}", f"{r['remote_edges']:,}")
    return t


def _print(head: str, s: dict, extra: list[str]) -> int:
    """``head``, the cut, balance and halo lines, ``extra``, then the parts' table."""
    from rich.console import Console

    console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)
    for line in [head, *_lines(s), *extra]:
        console.print(line)
    console.print(_table(s, "parts"))
    return 0


def _lines(s: dict) -> list[str]:
    b = s["balance"]
    return [f"edge cut: {s['edge_cut']:,} of {s['num_edges']:,} CSR entries ({s['edge_cut_share']:.1%}) "
            f"· method {s['method']}",
            f"balance (largest part over the mean): vertices {b['nodes']:.3f} · edges {b['edges']:.3f} · "
            f"train seeds {b['train_seeds']:.3f}",
            f"halo: {s['halo_share']:.2f} remote neighbours a vertex (the parts' halos summed over the vertices)"]


def _partition_command(args: argparse.Namespace) -> int:
    from moment.bars import Bars
    from moment.outputs import check_dir
    from training.data import open_dataset
    from training.partition.read import summary
    from training.partition.run import partition_dataset

    ds = open_dataset(args.dataset)
    check_dir(args.out, "OUT", inputs=(args.dataset,), what="the partitions")
    with Bars(quiet=args.json, transient=True) as bars:
        res = partition_dataset(ds, args.out, args.parts, method=args.method, overwrite=args.force, seed=args.seed,
                                presample_batches=args.presample_batches, fanouts=parse_fanouts(args.fanouts),
                                batch_size=args.batch_size, progress=bars)
    s = summary(res.manifest)
    remote = None
    if res.remote is not None:
        remote = {name: res.remote.share(name) for name in res.remote.remote}
    if args.json:
        out = {**s, "partition_s": res.partition_s, "write_s": res.write_s, "remote_share": remote,
               "presampled_rows": res.remote.rows if res.remote else 0}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return 0
    extra = []
    if remote is not None and res.remote is not None:
        extra.append(f"remote share of sampled rows ({res.remote.batches} batches of {args.batch_size} seeds, "
                     f"fan-outs {args.fanouts}): partition {remote['partition']:.1%} · hash {remote['hash']:.1%} · "
                     f"random {remote['random']:.1%}")
    return _print(f"[bold]{ds.name}[/bold] into {s['parts']} parts ({s['method']}, {res.partition_s:.2f} s; "
                  f"written in {res.write_s:.2f} s to {args.out})", s, extra)


def print_partition_info(path: str, as_json: bool) -> int:
    """``moment data info`` of a ``moment data partition`` output."""
    from training.partition.read import open_partition, summary

    s = summary(open_partition(path).manifest)
    if as_json:
        sys.stdout.write(json.dumps(s, indent=2) + "\n")
        return 0
    source = s.get("source") or {}
    return _print(f"[bold]{s['name']}[/bold] ({path}): partitioned into {s['parts']} parts · "
                  f"{s['num_nodes']:,} vertices · {s['num_edges']:,} CSR entries", s,
                  [f"source: {source.get('path')} (digest {source.get('digest')})"] if source else [])


def register_partition(data_subparsers) -> argparse.ArgumentParser:
    """Add ``moment data partition`` to ``moment data``'s actions."""
    from training.partition import PARTITIONERS

    p = data_subparsers.add_parser(
        "partition", help="split a dataset's graph, features and seeds over nodes",
        description="Partition a dataset over N nodes (METIS, or LDG streaming for graphs too large to load), "
                    "balanced by vertices, training seeds and edges; relabel the vertices by partition and write "
                    "OUT/part-<k> for each (its slice of the CSR, its features, labels, seeds and halo), with "
                    "the global row pointers. Prints the edge cut, the balance and the remote share of a short "
                    "pre-sampling against hash and random ownership.",
        **examples("moment data partition cora cora-2 --parts 2",
                   "moment data partition big big-4 --parts 4 --method ldg   # streamed, O(N) memory",
                   "moment data info cora-2"))
    p.add_argument("dataset", metavar="DATASET", help="dataset directory")
    p.add_argument("out", metavar="OUT", help="directory to write the partitions to")
    p.add_argument("--parts", type=int, required=True, metavar="N", help="number of partitions (nodes)")
    p.add_argument("--method", choices=PARTITIONERS.names(), default=None,
                   help="partitioner (default: metis where pymetis is installed and the graph fits, else ldg)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists and is not empty")
    p.add_argument("--seed", type=int, default=0, help="partitioner and pre-sampling seed (default 0)")
    p.add_argument("--presample-batches", type=int, default=4, metavar="B",
                   help="batches per rank pre-sampled for the remote share (0: skip; default 4)")
    p.add_argument("--fanouts", default="10,5", help="pre-sampling fan-outs (default 10,5)")
    p.add_argument("--batch-size", type=int, default=1024, help="pre-sampling batch size (default 1024)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=_partition_command)
    return p
