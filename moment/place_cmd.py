"""``moment place``: hotness, DDAK and the bin files of a dataset on a planned machine.

Thin: parse, call :func:`training.place.run.place_dataset` (the whole
workflow), print. What it writes to ``--out``:
``placement.json`` + ``bin_of.npy`` + ``row_of.npy`` (:meth:`Placement.save`,
last, so an existing placement is replaced only once everything else is
written), ``place.json`` (the report), and the SSD bin files (under each
``--ssd`` directory; relative names when that directory is ``--out``). The
trainer opens the result with
``FeatureStore(load_placement(out), out, features=dataset.features)``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from iostack.vocab import STORAGE_DTYPES
from moment._args import (
    add_source_args,
    examples,
    file_options,
    load_topology,
    parse_fanouts,
    parse_nvlink,
    unknown_link_bytes_per_s,
)
from moment._args import size_arg as _size
from moment.verify_cmd import add_verify_option
from planner.errors import PlannerError
from planner.flow import FLOW_MODELS
from planner.policies import PLACEMENT_POLICIES
from training.hotness_methods import HOTNESS_METHODS
from training.vocab import GPU_MODES


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "place",
        help="put every vertex's feature row where the plan wants its reads (hotness + DDAK), write the bins",
        description=(
            "Compute the vertices' hotness (pre-sampling with the training fan-outs by default; saved "
            "with the dataset), take the traffic targets of a plan (a `moment plan --json` file, or a "
            "plan made now for a bundled machine spec or this machine), fill GPU caches, CPU caches "
            "and SSD bins with DDAK so each serves its target share, and write the placement and the "
            "SSD bin files. Prints a per-bin table with the hash baseline beside it."
        ),
        **examples("moment place --dataset cora --machine moment-b --gpu-cache 200KiB --cpu-cache 1MiB \\",
                   "    --ssd /mnt/nvme0 --ssd /mnt/nvme1 ... --out cora-placement   # one --ssd per SSD of the plan",
                   "moment plan --machine moment-b --json > plan.json",
                   "moment place --dataset cora --plan plan.json --gpu-cache 200KiB --cpu-cache 1MiB $SSDS --out p2",
                   "moment plan --machine moment-b --json | moment place --dataset cora --plan - \\",
                   "    --gpu-cache 200KiB --cpu-cache 1MiB $SSDS --out p3   # the same placement as p2"),
    )
    src = p.add_argument_group("input")
    src.add_argument("--dataset", metavar="DIR", help="dataset directory (moment data import)")
    src.add_argument("--plan", metavar="FILE",
                     help="a plan written by `moment plan --json > FILE` ('-': standard input); without it a "
                          "plan is made now for the machine the source options name, as `moment plan` would")
    src.add_argument("--model", choices=FLOW_MODELS.names(), default="maxflow",
                     help="flow model of a plan made now (default maxflow)")
    add_source_args(p, planning=True)
    caches = p.add_argument_group("where the rows go")
    caches.add_argument("--gpu-cache", metavar="SIZE",
                        help="feature cache per GPU, e.g. 8GiB (0: none)")
    caches.add_argument("--cpu-cache", metavar="SIZE",
                        help="feature cache per host memory (NUMA node), e.g. 64GiB (0: none), or auto: the job's "
                             "memory (cgroup limit, MemAvailable) less what training needs, over the NUMA nodes")
    caches.add_argument("--memory-limit", metavar="SIZE", help="--cpu-cache auto: size for this memory instead")
    caches.add_argument("--gpu-cache-mode", choices=GPU_MODES, default="replicate",
                        help="replicate the hottest rows on every GPU (default), or partition the GPU "
                             "caches across GPUs joined by NVLink")
    caches.add_argument("--ssd", action="append", metavar="DIR", default=[],
                        help="directory for one SSD's bin file, one per SSD of the plan in its order "
                             "(repeatable; a directory may be repeated)")
    caches.add_argument("--feature-dtype", choices=STORAGE_DTYPES, metavar="TYPE",
                        help="store the rows in the bins as float32, float16, bfloat16 or int8 (a scale and zero "
                             "point per column, float features only); smaller rows: fewer SSD bytes, more rows per "
                             "cache; the gather decodes to float32 (default: the features' own type)")
    caches.add_argument("--in-place", action="store_true",
                        help="one SSD: its bin is the dataset's own features.npy, read where it is (no copy, no "
                             "extra disk space; datasets written by this version qualify); the caches still get "
                             "DDAK's rows")
    caches.add_argument("--out", metavar="DIR", help="where the placement is written")
    caches.add_argument("--force", action="store_true", help="replace an existing placement and bin files")
    add_verify_option(caches)
    hot = p.add_argument_group("hotness")
    hot.add_argument("--hotness", choices=HOTNESS_METHODS.names(), default="presample",
                     help="how hot each row is (default presample)")
    hot.add_argument("--hotness-dir", metavar="DIR",
                     help="keep the hotness here instead of <dataset>/hotness (for a read-only dataset)")
    hot.add_argument("--recompute-hotness", action="store_true", help="compute the hotness even if saved")
    hot.add_argument("--fanouts", default="25,10", metavar="F1,F2,...",
                     help="training fan-outs for pre-sampling (default 25,10; -1 = all neighbours)")
    hot.add_argument("--batch-size", type=int, default=8000, metavar="N",
                     help="training mini-batch size for pre-sampling (default 8000)")
    hot.add_argument("--presample-epochs", type=float, default=1.0, metavar="E",
                     help="epochs to pre-sample (default 1)")
    hot.add_argument("--presample-batches", type=int, metavar="N",
                     help="pre-sample this many mini-batches instead of whole epochs")
    hot.add_argument("--seed", type=int, default=0, help="seed of the pre-sampling and of --strategy random")
    _add_policy_args(p.add_argument_group("placement"))
    _node_options(p)
    p.set_defaults(func=run)


def _node_options(p: argparse.ArgumentParser) -> None:
    """The options of placing over several nodes."""
    nodes = p.add_argument_group("several nodes (a feature store sharded across them)")
    nodes.add_argument("--nodes", type=int, default=1, metavar="N",
                       help="split the rows over N nodes: each gets --out/node<k> (and <ssd>/node<k>) with its "
                            "own rows and bins; train with torchrun --nnodes N (default 1: one machine)")
    nodes.add_argument("--replicas", type=int, default=1, metavar="W",
                       help="hold the hottest rows (--hot-rows) on W nodes, the rest on one (default 1)")
    nodes.add_argument("--replica-groups", type=int, default=1, metavar="G",
                       help="G full replicas of the rows (DDStore's width), each over N/G nodes that exchange rows "
                            "only among themselves; N must be a multiple of G (default 1: one copy of every row)")
    nodes.add_argument("--partition", metavar="OUT",
                       help="rows owned by the partitions of OUT (`moment data partition DATASET OUT --parts N`, "
                            "N/G parts with --replica-groups G: one a node of each group) instead of dealt by "
                            "hotness: a rank's batches then read mostly its own rows")
    nodes.add_argument("--hot-rows", type=float, default=0.05, metavar="SHARE",
                       help="share of the rows, hottest first, that --replicas applies to (default 0.05)")
    nodes.add_argument("--plans", metavar="P0,P1,...",
                       help="one plan file per node (`moment plan --json > FILE` on each server), in node order: "
                            "node k's rows go into the bins of plan k (default: --plan, or the plan made now, on "
                            "every node)")
    nodes.add_argument("--halo-cache", default="0", metavar="SIZE",
                       help="with --partition: the locality cache each node will train with (`moment train "
                            "--remote-cache`); the reads it absorbs are left out of the reads a node serves "
                            "(default 0)")


def _add_policy_args(alg) -> None:
    alg.add_argument("--strategy", choices=PLACEMENT_POLICIES.names(), default="ddak",
                     help="DDAK (default) or a baseline")
    alg.add_argument("--pool", type=int, metavar="N",
                     help="DDAK pool size in rows (default 100, smaller for small graphs: >= 100 pools per bin)")
    alg.add_argument("--no-socket-aware", action="store_true",
                     help="where the plan's GPUs span sockets, place as if every GPU read every row alike (default: "
                          "each socket's GPUs train on their own part of the training vertices, pre-sampled apart, "
                          "and their rows stay on their socket's bins)")
    alg.add_argument("--json", action="store_true", help="print the report as JSON")


def _handoff(args: argparse.Namespace):
    """The plan to place for: the ``--plan`` file, or one made now for the named machine."""
    from planner.handoff import plan_now, read_plan_file
    from planner.plan import choose_inventory, measured_inventory

    if args.plan:
        named = [f"--{k.replace('_', '-')}" for k in ("machine", "capacities", "nvlink", "unknown_link_gbps",
                                                       *file_options()) if getattr(args, k, None)]
        if named:
            raise PlannerError(f"--plan {args.plan} fixes the machine and its figures already; drop "
                               f"{', '.join(named)} (or drop --plan to plan now with them)")
        if args.plan == "-":
            try:
                data = json.load(sys.stdin)
            except ValueError as exc:
                raise PlannerError(f"--plan -: standard input is not a plan ({exc}); pipe "
                                   "`moment plan --json` into it") from None
            return read_plan_file(data, source="the plan on standard input"), []
        return read_plan_file(args.plan, source=f"--plan {args.plan}"), []
    topo, caps = load_topology(args)
    notes: list[str] = []
    if caps is not None:  # the device models a plan places carry the measured figures too
        _, inventory = choose_inventory(topo, spec=args.machine)
        _, notes = measured_inventory(inventory, caps)
    return plan_now(topo, spec=args.machine, model=args.model, nvlink_pairs=parse_nvlink(args.nvlink),
                    unknown_link_bytes_per_s=unknown_link_bytes_per_s(args), capacities=caps), notes


def _node_handoffs(args: argparse.Namespace):
    """``--plans``' files read, one per node (None without it)."""
    from planner.handoff import read_plan_file

    if not args.plans:
        return None
    files = [f.strip() for f in args.plans.split(",") if f.strip()]
    if args.plan or args.machine:
        raise PlannerError(f"--plans {args.plans}: gives every node's plan; drop "
                           + ("--plan" if args.plan else "--machine"))
    if len(files) != args.nodes:
        raise PlannerError(f"--plans: {len(files)} plan files for --nodes {args.nodes}; give one per node")
    return [read_plan_file(f, source=f"--plans {f} (node {k})") for k, f in enumerate(files)]


def run(args: argparse.Namespace) -> int:
    """``moment place``; on an error, the directories it created are removed again (moment/place_dirs.py)."""
    from moment.place_dirs import remove_created
    from moment.verify_cmd import require_unless_verify, run_place_verify

    if args.verify:
        return run_place_verify(args.verify, as_json=args.json)
    require_unless_verify(args, ("--dataset", "--gpu-cache", "--cpu-cache", "--out"))
    created: list[Path] = []
    try:
        code = _run(args, created)
    except BaseException:
        remove_created(created, only_empty=False)
        raise
    remove_created(created, only_empty=True)
    return code


def _run(args: argparse.Namespace, created: list[Path]) -> int:
    from rich.console import Console

    from moment.bars import Bars
    from moment.place_dirs import make_dirs
    from moment.place_nodes import print_nodes
    from training.place.run import check_out, place_dataset

    gpu_bytes = _size(args.gpu_cache, "--gpu-cache")
    auto = args.cpu_cache.strip().lower() == "auto"
    cpu_bytes = 0 if auto else _size(args.cpu_cache, "--cpu-cache")
    memory_limit = _size(args.memory_limit, "--memory-limit") if args.memory_limit is not None else None
    if memory_limit is not None and not auto:
        raise PlannerError(f"--memory-limit {args.memory_limit}: sizes --cpu-cache auto only; pass --cpu-cache auto "
                           "or drop --memory-limit")
    if args.batch_size < 1:
        raise PlannerError(f"--batch-size {args.batch_size}: expected at least 1")
    spec = _spec(args, gpu_bytes, cpu_bytes)  # the options that make no sense together fail before any work
    out = Path(args.out)
    check_out(out, args.ssd, force=args.force)
    from moment.outputs import check_dir

    for option, d in [("--out", out), *(("--ssd", Path(x)) for x in args.ssd)]:  # a full or read-only disk
        check_dir(d, option, what="the placement")
    # before any work: a path under a regular file, or one we may not create
    make_dirs([("--out", out), *(("--ssd", Path(x)) for x in args.ssd)], created)
    node_handoffs = _node_handoffs(args)
    # a bad plan or machine fails before any work
    handoff, plan_notes = (node_handoffs[0], []) if node_handoffs else _handoff(args)
    from training.hetero.workflow import is_hetero

    if is_hetero(args.dataset):  # every node type's rows, of their own widths, in shared bins
        from moment.place_hetero import run_hetero

        return run_hetero(args, handoff, out, spec, plan_notes)
    sizing = None
    if auto:
        from training.data import open_dataset
        from training.memplan import cpu_cache_for

        sizing = cpu_cache_for(open_dataset(args.dataset), len(handoff.targets.of_kind("cpu")),
                               batch_size=args.batch_size, fanouts=parse_fanouts(args.fanouts),
                               feature_dtype=args.feature_dtype, memory_limit=memory_limit)
    if sizing is not None:
        spec = replace(spec, tiers=replace(spec.tiers, cpu_cache_bytes=sizing.per_node_bytes))
        if not args.json:
            _print_sizing(sizing)
    with Bars(quiet=args.json) as bars:
        placed = place_dataset(args.dataset, handoff, out, spec, hotness_dir=args.hotness_dir,
                               recompute_hotness=args.recompute_hotness, force=args.force, plan_notes=plan_notes,
                               cpu_cache_sizing=sizing, progress=bars, warn=_warn, node_handoffs=node_handoffs)
    if placed.sharded is not None:
        return print_nodes(args, placed.sharded, placed.dataset, placed.hotness, placed.targets, placed.report)
    if args.json:
        sys.stdout.write(json.dumps(placed.report, indent=2) + "\n")
        return 0
    console = Console(highlight=False, emoji=False, width=_width())
    _print_summary(console, placed.result, placed.dataset, placed.hotness, placed.targets, out, placed.row_bytes)
    sockets = placed.report.get("socket_aware") or {}
    if sockets.get("used"):
        console.print(f"socket-aware: each socket's GPUs ({', '.join(map(str, sockets['sockets']))}) read their "
                      f"own part of the training vertices ({sockets['seed_split']}); {sockets['note']}")
    elif sockets:
        console.print(f"[dim]socket-aware placement not used: {sockets['why_not']}[/dim]")
    for note in placed.plan_notes:
        console.print(f"[yellow]plan:[/yellow] {note}", markup=True)
    return 0


def _spec(args: argparse.Namespace, gpu_bytes: int, cpu_bytes: int):
    """The placement ``args`` ask for (:class:`training.place.specs.PlaceSpec`)."""
    from training.hotness import HotnessSpec
    from training.place.specs import PlaceSpec, PolicySpec, ShardSpec, TierSpec

    return PlaceSpec(TierSpec(gpu_bytes, cpu_bytes, args.ssd, args.gpu_cache_mode),
                     PolicySpec(args.strategy, args.pool, args.seed, socket_aware=not args.no_socket_aware),
                     ShardSpec(args.nodes, args.replicas, args.hot_rows, args.partition, args.replica_groups,
                               _size(args.halo_cache, "--halo-cache")),
                     HotnessSpec(args.hotness, fanouts=parse_fanouts(args.fanouts), batch_size=args.batch_size,
                                 epochs=args.presample_epochs, num_batches=args.presample_batches, seed=args.seed),
                     feature_dtype=args.feature_dtype, in_place=args.in_place)


def _width() -> int | None:
    """The console width: the terminal's, or ``COLUMNS`` when set (piped too), else 160 columns."""
    return None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 160


def _print_sizing(sizing) -> None:
    """The sizing of ``--cpu-cache auto`` as a small table, before the placement's own."""
    from rich.console import Console
    from rich.table import Table

    from momentbase.units import format_size

    t = Table(title="--cpu-cache auto", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("bytes", justify="right")
    t.add_row(f"memory limit ({sizing.limit.source})", format_size(sizing.limit.bytes))
    for name, nbytes in sizing.reserve.items():
        t.add_row(f"  - {name.replace('_', ' ')}", format_size(nbytes))
    t.add_row("left for the cache", format_size(max(0, sizing.limit.bytes - sizing.reserve.total_bytes)))
    t.add_row(f"cache per NUMA node (× {sizing.numa_nodes})"
              + (", capped at the features" if sizing.capped else ""),
              f"{format_size(sizing.per_node_bytes)} ({sizing.per_node_bytes // sizing.row_bytes:,} rows)")
    console = Console(highlight=False, emoji=False, width=_width())
    console.print(t)


def _warn(note: str) -> None:
    print(f"moment place: warning: {note}", file=sys.stderr)


def _bins_table(title: str, rows: list[tuple[str, str, str, str, str, str, str, str, str, str]], width: int):
    """The bins table; on a narrow terminal (80 columns) without vertical rules, and the numbers never cut.

    rich shrinks columns to fit the terminal and cuts what does not fit with an ellipsis, numbers
    included ("97.9…"). Each number column is given the width of its widest number (and of its
    header's longest word) as its minimum, so only the words fold: names, headers, "overflow only".
    """
    from rich import box
    from rich.table import Table

    cols = ("bin", "kind", "device", "socket", "rows", "capacity", "share", "target", "deviation", "hash share")
    narrow = width < 120
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD,
                  pad_edge=not narrow, collapse_padding=narrow)
    for j, c in enumerate(cols):
        if c in ("kind", "device", "socket"):
            table.add_column(c, overflow="fold")
        else:
            widest = max([len(r[j]) for r in rows if " " not in r[j]] + [max(len(w) for w in c.split())])
            table.add_column(c, justify="right", overflow="fold", min_width=widest)
    for r in rows:
        table.add_row(*r)
    return table


def _print_summary(console, res, ds, hot, targets, out: Path, row_bytes: int) -> None:
    from rich.table import Table

    from momentbase.units import format_size

    rep, base = res.report, res.baseline
    how = "loaded" if hot.loaded else f"computed in {hot.seconds:.1f} s"
    codec = res.placement.codec
    stored = f" stored as {codec.dtype}" if codec is not None else ""
    console.print(f"[bold]{ds.name}[/bold]: {ds.num_nodes:,} rows of {format_size(row_bytes)}{stored} · hotness "
                  f"{hot.spec.method} ({how}) · plan: {targets.source} · strategy {rep.strategy} "
                  f"({rep.seconds:.2f} s)")
    rows = [(str(b.id), b.kind, b.device, b.socket or "-", f"{b.rows:,}", f"{b.capacity_rows:,}",
             f"{b.traffic_share:.2%}", f"{b.target_share:.2%}",
             f"{b.deviation:.1%}" if b.target_share > 1e-6 else "overflow only",
             f"{base.bins[i].traffic_share:.2%}" if base else "-") for i, b in enumerate(rep.bins)]
    console.print(_bins_table(f"bins (written to {out})", rows, console.width))
    for note in res.notes:
        console.print(f"[yellow]target capped:[/yellow] {note}")

    def ssd_bytes(r) -> str:
        return format_size(r.ssd_bytes_per_epoch) if r.ssd_bytes_per_epoch is not None else "-"

    cmp = Table(title="against the hash baseline (same bins, same hotness)", title_justify="left")
    for c in ("", rep.strategy, "hash", f"{rep.strategy} / hash"):
        cmp.add_column(c, justify="left" if not c else "right")
    if base:
        def ratio(a: float | None, b: float | None) -> str:
            return f"{a / b:.3f}" if a is not None and b else "-"

        cmp.add_row("max deviation from target", f"{rep.max_relative_deviation:.2%}",
                    f"{base.max_relative_deviation:.2%}", ratio(rep.max_relative_deviation,
                                                                base.max_relative_deviation))
        cmp.add_row("SSD share of reads", f"{rep.ssd_share:.2%}", f"{base.ssd_share:.2%}",
                    ratio(rep.ssd_share, base.ssd_share))
        cmp.add_row("SSD bytes per epoch", ssd_bytes(rep), ssd_bytes(base),
                    ratio(rep.ssd_bytes_per_epoch, base.ssd_bytes_per_epoch))
        cmp.add_row("cross-socket share", f"{rep.cross_socket_share:.2%}", f"{base.cross_socket_share:.2%}",
                    ratio(rep.cross_socket_share, base.cross_socket_share))
        console.print(cmp)
    console.print(f"[dim]open with FeatureStore(load_placement({str(out)!r}), {str(out)!r}, "
                  "features=dataset.features)[/dim]")
