"""``moment data``: import public graph formats, describe a dataset directory (and ``synth``).

``register(subparsers)`` adds the ``data`` command with its actions; the
``synth`` action lives in :mod:`moment.synth_cmd` (``register_synth(data_subparsers)``)
and is added when that module exists.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from moment._args import examples
from moment.errors import CommandError
from training.vocab import DATASET_FEATURE_DTYPES, NEGATIVE_METHODS

#: options of `data import` and the formats they apply to (dest -> formats)
_FORMAT_OPTIONS = {
    "dataset": ("planetoid",),
    "undirected": ("ogb", "igb", "edgelist", "hdf5", "webgraph"),
    "hdf5_key": ("hdf5",),
    "directed": ("npz",),
    "lcc": ("npz",),
    "split": ("npz",),
    "train_per_class": ("npz",),
    "valid_per_class": ("npz",),
    "seed": ("npz", "edgelist"),
    "split_name": ("ogb", "ogb-hetero"),
    "igb_classes": ("igb", "igb-hetero"),
    "no_reverse": ("ogb-hetero", "igb-hetero"),
    "features": ("edgelist",),
    "feature_dim": ("edgelist",),
    "no_relabel": ("edgelist",),
}
_KWARG = {"igb_classes": "classes", "no_relabel": "relabel", "hdf5_key": "keys", "no_reverse": "reverse"}
#: flags that turn a default off: the keyword gets the opposite
_NEGATED = ("no_relabel", "no_reverse")


def _import_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from moment.bars import Bars
    from training.data import open_dataset
    from training.importers import detect_format, import_dataset

    fmt = detect_format(args.src) if args.format == "auto" else args.format
    options = {}
    for dest, formats in _FORMAT_OPTIONS.items():
        value = getattr(args, dest)
        if value is None or value is False:
            continue
        if fmt not in formats:
            flag = "--" + dest.replace("_", "-")
            raise CommandError(f"{flag} does not apply to --format {fmt} (it is for {', '.join(formats)})")
        options[_KWARG.get(dest, dest)] = (not value) if dest in _NEGATED else value
    if fmt in ("igb", "igb-hetero") and "classes" in options:
        options["classes"] = str(options["classes"])
    if "keys" in options:
        options["keys"] = _hdf5_keys(options["keys"])
    from moment.outputs import check_dir

    check_dir(args.dst, "DST", inputs=(args.src,), what="the dataset")  # before reading: a full or read-only disk
    with Bars(transient=True) as bars:
        dst = import_dataset(Path(args.src), Path(args.dst), format=fmt, name=args.name, overwrite=args.force,
                             feature_dtype=args.feature_dtype, progress=bars, **options)
    ds = open_dataset(dst, validate=False)
    if "hetero" in ds.meta:
        print(f"imported {args.src} ({fmt}) to {dst}: {ds.num_nodes:,} nodes, {ds.num_edges:,} CSR edges; "
              + "; ".join(f"{k}: {v}" for k, v in _hetero_rows(ds.meta)))
        return 0
    splits = " / ".join(f"{getattr(ds, s).shape[0]:,}" for s in ("train_idx", "valid_idx", "test_idx")
                        if getattr(ds, s) is not None)
    # plain text, one line: easy to grep, and never wrapped mid-number
    print(
        f"imported {args.src} ({fmt}) to {dst}: {ds.num_nodes:,} nodes, {ds.num_edges:,} CSR edges "
        f"({'directed' if ds.directed else 'undirected, both directions'}), "
        + (f"{ds.feature_dim} × {ds.feature_dtype} features, " if ds.features is not None else "no features, ")
        + (f"{ds.num_classes} classes" if ds.labels is not None else "no labels")
        + (f", split {splits}" if splits else "")
    )
    return 0


def _register_split(data_sub) -> None:
    """Add ``moment data split-edges``."""
    split = data_sub.add_parser(
        "split-edges", help="split a dataset's edges into train / valid / test for link prediction",
        description="Write an edge-split dataset: the source's features and labels, its graph without the "
                    "held-out edges (both directions of an undirected edge go together), and the validation and "
                    "test pairs with negatives drawn once (as PyG's RandomLinkSplit does). Train on it with "
                    "`moment train --task link`; `moment place` places it as any dataset.",
        **examples("moment data split-edges cora cora-links", "moment data split-edges cora cora-links "
                   "--val 0.05 --test 0.1 --seed 1 --negatives degree"))
    split.add_argument("src", metavar="SRC", help="dataset directory to split")
    split.add_argument("dst", metavar="DST", help="edge-split dataset directory to create")
    split.add_argument("--val", type=float, default=0.05, dest="num_val", metavar="SHARE",
                       help="share of the edges for validation (default 0.05)")
    split.add_argument("--test", type=float, default=0.1, dest="num_test", metavar="SHARE",
                       help="share of the edges for test (default 0.1)")
    split.add_argument("--seed", type=int, default=0, help="seed of the split and the negatives (default 0)")
    split.add_argument("--negatives", choices=NEGATIVE_METHODS, default="uniform",
                       help="how validation and test negatives are drawn (default uniform)")
    split.add_argument("--neg-ratio", type=float, default=1.0, metavar="R",
                       help="validation and test negatives per positive (default 1)")
    split.add_argument("--force", action="store_true", dest="overwrite", help="replace DST if it exists")
    split.set_defaults(func=_split_command)


def _split_command(args: argparse.Namespace) -> int:
    from training.link.store import write_link_dataset

    ds, split = write_link_dataset(args.src, args.dst, num_val=args.num_val, num_test=args.num_test, seed=args.seed,
                                   negatives=args.negatives, neg_ratio=args.neg_ratio, overwrite=args.overwrite)
    print(f"split {args.src} into {ds.path}: {split.train_pos.shape[1]:,} training, {split.valid_pos.shape[1]:,} "
          f"validation and {split.test_pos.shape[1]:,} test edges ({'undirected' if split.undirected else 'directed'}),"
          f" {split.valid_neg.shape[1]:,} + {split.test_neg.shape[1]:,} negatives; the training graph holds "
          f"{ds.num_edges:,} CSR edges")
    return 0


def _hdf5_keys(pairs: list[str]) -> dict[str, str]:
    out = {}
    for text in pairs:
        key, sep, path = text.partition("=")
        if not sep or not key or not path:
            raise CommandError(f"--hdf5-key {text!r}: expected KEY=PATH, e.g. features=/node/x")
        out[key] = path
    return out


def _hetero_rows(meta) -> list[tuple[str, str]]:
    """What ``moment data info`` and ``import`` say of a heterogeneous dataset: its node types (count, feature
    table), relations (edge count) and target type, from ``meta.json``'s ``hetero`` section."""
    from momentbase.units import format_size
    from training.hetero.schema import HeteroSchema

    schema = HeteroSchema.from_json(meta["hetero"], "meta.json")
    types = []
    for t in schema.node_types:
        feat = "no features"
        if t.feature_dim:
            import numpy as np

            size = format_size(t.count * t.feature_dim * np.dtype(t.feature_dtype).itemsize)
            feat = f"{t.feature_file}.npy {t.feature_dim} × {t.feature_dtype} = {size}"
        types.append(f"{t.name} {t.count:,} ({feat})")
    rels = [f"{r.src} -{r.rel}-> {r.dst} {r.num_edges:,}" for r in schema.relations]
    return [("node types", ", ".join(types)), ("relations", ", ".join(rels)),
            ("target type", schema.target or "none")]


def _info_command(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from moment.bars import Bars
    from momentbase.units import format_size
    from training.data import dataset_info, open_dataset
    from training.partition.read import is_partitioned

    if is_partitioned(args.dir):  # a `moment data partition` output: its cut, balance and parts
        from moment.partition_cmd import print_partition_info

        return print_partition_info(args.dir, args.json)
    verified = None
    if args.verify:  # every block of every array (or, for a placement, of its bins too); bad ones listed, exit 1
        from moment.verify_cmd import verify_for_info

        code, verified = verify_for_info(args.dir, as_json=args.json)
        if code is not None:
            return code
    with Bars(quiet=args.json, transient=True) as bars:
        ds = open_dataset(args.dir, verify="none" if verified else "sample", progress=bars)
        info = dataset_info(ds, progress=bars)
    if verified:
        info = replace(info, integrity=verified)
    hetero = _hetero_rows(ds.meta) if "hetero" in ds.meta else []
    if args.json:
        out = info.to_dict() | ({"hetero": ds.meta["hetero"]} if hetero else {})
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return 0
    t = Table(title=f"{info.name}  ({args.dir})", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", overflow="fold")
    d = info.in_degree
    t.add_row("nodes", f"{info.num_nodes:,}")
    t.add_row("edges (CSR entries)",
              f"{info.num_edges:,} ({'directed' if info.directed else 'undirected: each edge twice'})")
    t.add_row("in-degree", f"min {d.min:,} · median {d.median:g} · mean {d.mean:.2f} · p99 {d.p99:g} · max {d.max:,}")
    t.add_row("isolated nodes", f"{info.isolated_nodes:,}")
    t.add_row("skew", f"top 1% of vertices hold {100 * info.top1pct_endpoint_share:.1f}% of edge endpoints "
                      f"· Gini {info.gini:.3f}")
    if hetero:  # per-type feature tables instead of one features.npy
        for what, value in hetero:
            t.add_row(what, value)
    else:
        t.add_row("features", f"{info.feature_dim} × {info.feature_dtype} = {format_size(info.feature_bytes)}"
                  if info.feature_dim else "none")
    t.add_row("graph (indptr + indices)", format_size(info.graph_bytes))
    t.add_row("labels", f"{info.num_classes} classes, {info.labelled_nodes:,} labelled nodes"
              if info.num_classes else "none")
    t.add_row("split (train / valid / test)",
              " / ".join(f"{info.split_sizes.get(k, 0):,}" for k in ("train", "valid", "test"))
              if info.split_sizes else "none")
    if info.source:
        flat = {k: v for k, v in info.source.items() if k != "path" and not isinstance(v, (dict, list))}
        nested = len(info.source) - len(flat) - ("path" in info.source)
        t.add_row("source", ", ".join(f"{k}={v}" for k, v in flat.items())
                  + (" (more with --json)" if nested else "")
                  + (f"\n{info.source['path']}" if "path" in info.source else ""))
    t.add_row("integrity", info.integrity)
    Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160).print(t)
    return 0


def _data_usage(parser: argparse.ArgumentParser):
    def run(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return run


def register(subparsers) -> None:
    """Add ``moment data`` (import, info, and synth when :mod:`moment.synth_cmd` is present)."""
    from training.importers import FORMATS

    data = subparsers.add_parser(
        "data", help="import graph datasets, describe them, generate synthetic ones",
        description="Graph datasets in Moment's directory format (docs/dataset-format.md): "
                    "memory-mapped CSR, features, labels and splits.",
        **examples("moment data import ../shared/fixtures/graphs/cora cora",
                   "moment data synth graph --nodes 1e6 --edges 1e7 --undirected", "moment data info cora --verify"),
    )
    data.set_defaults(func=_data_usage(data))
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION")

    imp = data_sub.add_parser(
        "import", help="convert a public graph format into a dataset directory",
        description="Convert Planetoid, gnn-benchmark .npz, OGB node-property (CSV or papers100M's binary "
                    "data.npz), IGB, HDF5, edge-list or WebGraph BV data into a dataset directory. "
                    "Large inputs are converted in chunks with bounded memory; "
                    "DST appears only when complete.",
        **examples("moment data import ../shared/fixtures/graphs/cora cora   # Planetoid, format detected",
                   "moment data import --format npz --lcc amazon_photo.npz photo",
                   "moment data import --format edgelist --undirected soc-Slashdot0902.txt.gz slashdot",
                   "moment data import --format hdf5 --hdf5-key features=/node/x graph.h5 mygraph",
                   "moment data import papers100M-bin papers100M   # OGB binary: raw/data.npz, streamed",
                   "moment data import --format webgraph uk-2014 uk2014   # uk-2014.graph + .properties"),
    )
    imp.add_argument("src", metavar="SRC", help="source file or directory (webgraph: the BASENAME)")
    imp.add_argument("dst", metavar="DST", help="dataset directory to create")
    imp.add_argument("--format", choices=("auto", *FORMATS), default="auto",
                     help="source format (default: detect from the file names)")
    imp.add_argument("--name", help="dataset name to record (default: from the source)")
    imp.add_argument("--force", action="store_true", help="replace DST if it exists")
    imp.add_argument("--feature-dtype", choices=DATASET_FEATURE_DTYPES,
                     help="store features with this dtype (default: as the source, float32 for text)")
    g = imp.add_argument_group("format options")
    g.add_argument("--dataset", metavar="NAME", help="planetoid: which ind.NAME.* when SRC holds several")
    g.add_argument("--undirected", action="store_true", default=None,
                   help="ogb/igb/edgelist/hdf5/webgraph: store every edge in both directions "
                        "(ogb default: as OGB does, for ogbn-products/proteins)")
    g.add_argument("--directed", action="store_true", help="npz: keep the raw direction (default: symmetrise)")
    g.add_argument("--lcc", action="store_true", help="npz: keep only the largest connected component")
    g.add_argument("--split", choices=("random", "none"), help="npz: seeded random per-class split (default) or none")
    g.add_argument("--train-per-class", type=int, metavar="K", help="npz: training nodes per class (default 20)")
    g.add_argument("--valid-per-class", type=int, metavar="K", help="npz: validation nodes per class (default 30)")
    g.add_argument("--seed", type=int, help="npz: split seed; edgelist: random-feature seed (default 0)")
    g.add_argument("--split-name", metavar="NAME", help="ogb/ogb-hetero: split/NAME when there are several")
    g.add_argument("--igb-classes", choices=("19", "2K"), help="igb/igb-hetero: label set (default 19)")
    g.add_argument("--features", choices=("none", "random", "degree"),
                   help="edgelist: features to generate (default none)")
    g.add_argument("--feature-dim", type=int, metavar="F", help="edgelist: width of generated features")
    g.add_argument("--no-relabel", action="store_true",
                   help="edgelist: keep node ids as they are (num_nodes = max id + 1)")
    g.add_argument("--no-reverse", action="store_true",
                   help="ogb-hetero/igb-hetero: do not add the rev_<rel> relations (default: add them, as PyG's "
                        "ToUndirected does)")
    g.add_argument("--hdf5-key", action="append", metavar="KEY=PATH",
                   help="hdf5: where a dataset of the layout lives in the file, e.g. features=/node/x "
                        "(keys: indptr, indices, edge_index, src, dst, features, labels, train, valid, test; "
                        "repeatable; docs/dataset-format.md)")
    imp.set_defaults(func=_import_command)

    info = data_sub.add_parser("info", help="counts, degree distribution, skew and sizes of a dataset directory",
                               description="Counts, degree distribution, skew and sizes of a dataset directory, "
                                           "with a check of its files against their checksums.",
                               **examples("moment data info cora", "moment data info cora --json",
                                          "moment data info cora --verify   # every block, not a sample"))
    info.add_argument("dir", metavar="DIR", help="dataset directory")
    info.add_argument("--json", action="store_true", help="print the figures as JSON")
    info.add_argument("--verify", action="store_true",
                      help="check every block of every file against its checksum (default: each file's "
                           "first, last and a few random blocks)")
    info.set_defaults(func=_info_command)

    _more_actions(data_sub)


def _more_actions(data_sub) -> None:
    """``partition`` (:mod:`moment.partition_cmd`), ``split-edges``, and ``synth`` when :mod:`moment.synth_cmd`
    is present."""
    from moment.partition_cmd import register_partition

    register_partition(data_sub)
    _register_split(data_sub)
    try:
        from moment.synth_cmd import register_synth
    except ModuleNotFoundError as exc:  # the synth command is optional; a broken one must still fail loudly
        if exc.name != "moment.synth_cmd":
            raise
    else:
        register_synth(data_sub)
