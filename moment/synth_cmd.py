"""``moment data synth``: write a synthetic power-law graph with learnable labels.

``moment/data_cmd.py`` calls :func:`register_synth` with its sub-parsers; the
generator itself is :mod:`training.synth`.
"""

from __future__ import annotations

import argparse
import math
import time

from moment._args import examples
from moment.errors import CommandError


def _feature_dim(text: str) -> int:
    """A feature width of at least 1: a graph without features can be sampled but not placed or
    trained on (``SynthSpec(feature_dim=0)`` still makes one, for sampling benchmarks)."""
    dim = _count(text, "--feature-dim")
    if dim < 1:
        raise CommandError(f"--feature-dim {text}: expected 1 or more (`moment place` and `moment train` "
                           "need features)")
    return dim


def _count(text: str, option: str) -> int:
    """A whole count written as ``1000000``, ``1_000_000``, ``1e6`` or ``10**6``."""
    t = text.strip().replace("_", "")
    try:
        if "**" in t:
            base, exp = t.split("**", 1)
            value = int(base) ** int(exp)
        elif any(ch in t for ch in ".eE"):
            f = float(t)
            if not math.isfinite(f) or f != int(f):
                raise ValueError
            value = int(f)
        else:
            value = int(t)
    except (ValueError, OverflowError):
        raise CommandError(f"{option} {text!r}: expected a whole number (like 1000000, 1e6 or 10**6)") from None
    return value


def _share(text: str, option: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CommandError(f"{option} {text!r}: expected a number such as 0.01") from None
    if not math.isfinite(value):
        raise CommandError(f"{option} {text!r}: expected a finite number")
    return value


def _synth_hetero(args: argparse.Namespace, chunk: int) -> int:
    """``--hetero``: an ogbn-mag-shaped graph of about ``--edges`` edges, streamed (training.hetero.synth)."""
    from moment.bars import Bars
    from moment.outputs import check_dir
    from training.hetero.stream import write_hetero_stream
    from training.hetero.synth import EDGES_PER_PAPER, synth_mag_stream

    if args.nodes is not None:
        raise CommandError("--nodes does not apply with --hetero: --edges sets the size (papers = edges / "
                           f"{EDGES_PER_PAPER}; authors, institutions and fields follow ogbn-mag's proportions)")
    papers = _count(args.edges, "--edges") // EDGES_PER_PAPER
    if papers < 1:
        raise CommandError(f"--edges {args.edges}: expected at least {EDGES_PER_PAPER} with --hetero (one paper)")
    homophily = _share(args.homophily, "--homophily")
    if not 0 <= homophily <= 1:
        raise CommandError(f"--homophily {args.homophily}: expected a share in [0, 1]")
    classes = _count(args.classes, "--classes")
    if classes < 1:
        raise CommandError(f"--classes {args.classes}: expected 1 or more")
    check_dir(args.dst, "DST", what="the dataset")
    started = time.perf_counter()
    source = synth_mag_stream(papers=papers, num_classes=classes, seed=_count(args.seed, "--seed"),
                              homophily=homophily)
    with Bars(quiet=args.quiet, transient=True) as bars:
        write_hetero_stream(args.dst, source, overwrite=args.force, chunk_edges=chunk, progress=bars,
                            meta_source={"generator": "synth_mag_stream", "papers": papers, "classes": classes,
                                         "homophily": homophily, "seed": _count(args.seed, "--seed")})
    if not args.quiet:
        from training.data import open_dataset

        ds = open_dataset(args.dst, validate=False)
        types = ", ".join(f"{t} {n:,}" for t, n in source.num_nodes.items())
        print(f"{args.dst}: heterogeneous, {ds.num_nodes:,} nodes ({types}), {ds.num_edges:,} edges stored in "
              f"{len(source.edges)} relations, {classes} classes on paper; written in "
              f"{time.perf_counter() - started:.1f} s")
    return 0


def _synth_command(args: argparse.Namespace) -> int:
    from moment.bars import Bars
    from training.synth import SynthSpec
    from training.synth_run import synthesize

    chunk = _count(args.chunk_edges, "--chunk-edges")
    if chunk < 1:
        raise CommandError(f"--chunk-edges {args.chunk_edges}: expected a positive whole number")
    if args.hetero:
        return _synth_hetero(args, chunk)
    if args.nodes is None:
        raise CommandError("--nodes is required (without --hetero)")
    spec = SynthSpec(
        num_nodes=_count(args.nodes, "--nodes"),
        num_edges=_count(args.edges, "--edges"),
        generator=args.generator,
        skew=None if args.skew is None else _share(args.skew, "--skew"),
        feature_dim=_feature_dim(args.feature_dim),
        feature_dtype=args.feature_dtype,
        num_classes=_count(args.classes, "--classes"),
        homophily=_share(args.homophily, "--homophily"),
        feature_snr=_share(args.feature_snr, "--feature-snr"),
        train_share=_share(args.train_share, "--train-share"),
        valid_share=_share(args.valid_share, "--valid-share"),
        test_share=_share(args.test_share, "--test-share"),
        undirected=args.undirected,
        seed=_count(args.seed, "--seed"),
    ).validate()

    from moment.outputs import check_dir

    check_dir(args.dst, "DST", what="the dataset")  # before generating: a full or read-only disk
    started = time.perf_counter()
    with Bars(quiet=args.quiet, transient=True) as bars:
        rep = synthesize(args.dst, spec, chunk_edges=chunk, overwrite=args.force, progress=bars)
    seconds = time.perf_counter() - started
    if not args.quiet:
        dropped = rep.generated_edges - rep.num_edges
        print(
            f"{args.dst}: {rep.num_nodes:,} nodes, {rep.num_edges:,} edges stored "
            f"({rep.generated_edges:,} generated, {dropped:,} self-loops and duplicates dropped), "
            + (f"{spec.feature_dim} x {spec.feature_dtype} features" if spec.feature_dim else "no features")
            + f", {spec.num_classes} classes"
        )
        print(
            f"  skew: top 1% of nodes hold {rep.top1pct_in_share:.1%} of in-edges and "
            f"{rep.top1pct_out_share:.1%} of out-edges (hotness); "
            f"max in-degree {rep.max_in_degree:,}, max out-degree {rep.max_out_degree:,}; "
            f"{rep.isolated_nodes:,} isolated nodes"
        )
        print(f"  written in {seconds:.1f} s")
    return 0


def register_synth(data_subparsers) -> argparse.ArgumentParser:
    """Add ``synth`` to the ``moment data`` sub-parsers; returns its parser."""
    p = data_subparsers.add_parser(
        "synth",
        help="write a synthetic power-law graph (R-MAT or Chung-Lu) with learnable labels",
        description=(
            "Generate a power-law graph with latent classes and write it as a dataset "
            "directory, streaming edges and features to disk in chunks (10^8 edges fit in a "
            "few GB of memory). Features are the node's class centroid plus noise; edges "
            "prefer the source's class (--homophily), so both an MLP and neighbourhood "
            "aggregation learn the labels. Self-loops and duplicate edges are dropped. "
            "The same --seed gives byte-identical files."
        ),
        **examples("moment data synth graph --nodes 1e6 --edges 1e7 --undirected",
                   "moment data synth g2 --nodes 1e5 --edges 1e6 --generator chung-lu --skew 0.9 --feature-dim 64",
                   "moment data synth mag --hetero --edges 1e8   # ogbn-mag-shaped, streamed"),
    )
    p.add_argument("dst", metavar="DST", help="dataset directory to create")
    g = p.add_argument_group("graph")
    g.add_argument("--nodes", metavar="N", help="number of nodes (1e6 and 10**6 work); required without --hetero")
    g.add_argument("--edges", required=True, metavar="M",
                   help="edges to generate; with --undirected each is stored both ways")
    g.add_argument("--generator", default="rmat", metavar="rmat|chung-lu",
                   help="R-MAT (default) or Chung-Lu")
    g.add_argument("--skew", metavar="S",
                   help="R-MAT: the quadrant probability a, in [0.25, 1) (default 0.57, Graph500); "
                        "Chung-Lu: the weight exponent, w_i = (i+1)^-S, in [0, 2] (default 0.7)")
    g.add_argument("--undirected", action="store_true", help="store every edge in both directions")
    g.add_argument("--hetero", action="store_true",
                   help="a heterogeneous graph shaped like ogbn-mag instead (paper, author, institution, "
                        "field_of_study; 7 relations with the reverse ones; float32/float16/uint8 features): "
                        "--edges sets its size, --classes, --homophily and --seed apply, the other graph and "
                        "feature options do not")
    g.add_argument("--homophily", default="0.7", metavar="H",
                   help="share of edges whose target is redrawn from the source's class (default 0.7)")
    f = p.add_argument_group("features and labels")
    f.add_argument("--feature-dim", default="128", metavar="F", help="feature width (default 128, at least 1)")
    f.add_argument("--feature-dtype", default="float32", metavar="float32|float16",
                   help="feature dtype (default float32)")
    f.add_argument("--feature-snr", default="2.0", metavar="R",
                   help="distance of class centroids from the origin, in noise standard deviations (default 2)")
    f.add_argument("--classes", default="16", metavar="C", help="number of classes (default 16)")
    f.add_argument("--train-share", default="0.01", metavar="S", help="share of nodes to train on (default 0.01)")
    f.add_argument("--valid-share", default="0.01", metavar="S", help="validation share (default 0.01)")
    f.add_argument("--test-share", default="0.02", metavar="S", help="test share (default 0.02)")
    o = p.add_argument_group("run")
    o.add_argument("--seed", default="0", metavar="S", help="random seed (default 0)")
    o.add_argument("--chunk-edges", default=str(1 << 22), metavar="E",
                   help="edges generated per step: bounds memory, never changes the output (default 4194304)")
    o.add_argument("--force", action="store_true", help="replace DST if it exists")
    o.add_argument("--quiet", action="store_true", help="print nothing on success")
    p.set_defaults(func=_synth_command)
    return p

