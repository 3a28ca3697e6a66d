"""The ``moment`` command line: parses, calls the libraries, prints.

Every error a user can cause (a missing or garbled file, an unknown machine
name) is a :class:`momentbase.errors.MomentError`, whichever package raised it;
:func:`main` prints it as one line naming the input and the fix, with exit status 2. Set ``MOMENT_DEBUG=1`` to
see the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence

from moment._args import (
    accept_negative_values,
    add_source_args,
    argtype,
    examples,
    load_topology,
    parse_gpu_counts,
)
from momentbase.errors import MomentError
from planner.flow import FLOW_MODELS
from planner.vocab import HANDOFF_LAYOUTS

EXIT_USAGE = 2
#: write failures that come from the machine, not from Moment: no space, over quota, a read-only disk
OUTPUT_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def _topo_command(args: argparse.Namespace) -> int:
    from planner.topology import jsonio

    if args.svg:
        from moment.outputs import check_file

        check_file(args.svg, "--svg", suffixes=(".svg",), what="the picture")
    topo, _ = load_topology(args)
    if args.svg:
        from planner.topology.svg.draw import write_svg

        write_svg(topo, args.svg)
    if args.json:
        sys.stdout.write(jsonio.dumps(topo) + "\n")
    else:  # rich only for the tree (--json does without it)
        from rich.console import Console

        from planner.topology.render import topology_tree

        console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)
        console.print(topology_tree(topo, show_other=args.all))
        if args.svg:
            console.print(f"[dim]picture written to {args.svg}[/dim]")
    return 0


def _plan_command(args: argparse.Namespace) -> int:
    from moment import plan_cmd

    return plan_cmd.run(args, *load_topology(args))


def _machines_command(args: argparse.Namespace) -> int:
    from planner.topology.spec.bundled import bundled_machines

    for name, path in sorted(bundled_machines().items()):
        print(f"{name}\t{path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moment",
        description="Plan slot layouts, place data and train GNNs out-of-core on one multi-GPU server.",
        **examples("moment demo                                  # the whole pipeline on a bundled default",
                   "moment plan --machine moment-b --svg plan.svg",
                   "moment data synth graph --nodes 1e5 --edges 1e6",
                   "moment COMMAND --help                        # each command's options and examples"),
    )
    from moment import __version__

    parser.add_argument("--version", action="version", version=f"moment {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    # a command that runs other commands (moment demo) is handed main, not made to import this module
    parser.set_defaults(cli_main=main)

    _add_topo(sub)
    _add_plan(sub)
    _register_modules(sub)
    _add_machines(sub)
    from moment.profile_cmd import register as add_profile

    add_profile(sub)
    accept_negative_values(parser)  # "--gpu-cache -1KiB": a clear error from the size parser
    return parser


def _add_topo(sub) -> None:
    topo = sub.add_parser(
        "topo",
        help="show a machine's device graph (live, from captured files, or a machine spec)",
        description=(
            "Show a machine's device graph: sockets, switches, slots and devices with link "
            "generation × width and GB/s per direction. With no source option, reads this "
            "machine's sysfs (and NVML when NVIDIA GPUs are present)."
        ),
        **examples("moment topo                                  # this machine (sysfs, NVML)",
                   "moment topo --machine moment-b --svg b.svg   # a bundled spec, with a picture",
                   "moment topo --lspci-vvv lspci-vvv.txt --dmidecode dmidecode.txt   # captured files",
                   "moment topo --hwloc lstopo.xml --json"),
    )
    add_source_args(topo)
    out = topo.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the model as JSON (schema moment.topology v1)")
    out.add_argument("--svg", metavar="FILE", help="write a picture of the device graph")
    out.add_argument("--all", action="store_true", help="also list chipset and other minor devices")
    topo.set_defaults(func=_topo_command)


def _add_plan(sub) -> None:
    pl = sub.add_parser(
        "plan",
        help="recommend where GPUs and NVMe SSDs go (slot layout search with flow models)",
        description=(
            "Enumerate the ways to put the GPUs and SSDs into the machine's slots, keep one "
            "layout per symmetry class, predict each one's time per iteration with a flow "
            "model, and recommend the best with a slot map and its bottleneck, against the "
            "paper's classic layouts (a)-(d) and the machine's current layout."
        ),
        **examples("moment plan --machine moment-b",
                   "moment plan --machine moment-b --cpu-cache-share 0.3 --svg plan.svg",
                   "moment plan --machine moment-a --gpus 2 --ssds 4 --ssd-model samsung-980-pro   # what-if",
                   "moment plan --machine moment-b --json > plan.json   # for moment place --plan",
                   "moment plan --machine moment-a --gpus 1,2,4   # scaling table",
                   "moment plan --machine moment-b --prices   # $ per GB/s and TCO",
                   "moment plan --lspci-vvv lspci-vvv.txt --dmidecode dmidecode.txt --unknown-link-gbps 16"),
    )
    add_source_args(pl, planning=True)
    inv = pl.add_argument_group("devices to place (default: the spec's inventory or the machine's own)")
    inv.add_argument("--gpus", type=argtype(parse_gpu_counts), metavar="N[,N...]",
                     help="number of GPUs to place; several (1,2,4): a table of the recommended and the "
                          "classic layouts per count (the paper's §4.6 scaling)")
    inv.add_argument("--ssds", type=int, metavar="N", help="number of NVMe SSDs to place")
    inv.add_argument("--gpu-model", metavar="MODEL", help="GPU model (e.g. a100-40gb-pcie, h100-pcie)")
    inv.add_argument("--ssd-model", metavar="MODEL", help="SSD model (e.g. p5510, samsung-980-pro)")
    wl = pl.add_argument_group("workload (planner terms: bytes per GPU and per iteration, and cache shares)")
    wl.add_argument("--demand-gb", type=float, default=1.0, metavar="GB",
                    help="bytes each GPU reads per iteration, in GB (default 1; scales T, not the ranking)")
    wl.add_argument("--gpu-cache-share", type=float, default=0.0, metavar="S",
                    help="share of reads served by a cache replicated on every GPU (default 0)")
    wl.add_argument("--cpu-cache-share", type=float, default=0.0, metavar="S",
                    help="share of reads served by host memory (default 0)")
    how = pl.add_argument_group("search and output")
    how.add_argument("--model", choices=FLOW_MODELS.names(), default="maxflow",
                     help="flow model: the paper's max-flow, or the stricter concurrent LP")
    how.add_argument("--top", type=int, default=5, metavar="K", help="layouts to list (default 5)")
    how.add_argument("--exhaustive", action="store_true",
                     help="solve every distinct layout instead of pruning by a cut bound")
    how.add_argument("--json", action="store_true", help="print the plan as JSON")
    how.add_argument("--layout", choices=HANDOFF_LAYOUTS, default="recommended",
                     help="with --json: the layout whose targets `moment place --plan` gets (default recommended; "
                          "current: the machine as cabled now, for data placed before the devices move)")
    how.add_argument("--svg", metavar="FILE", help="write the recommended layout with its flows")
    how.add_argument("--prices", nargs="?", const="", default=None, metavar="FILE",
                     help="price the plan: $ per GB/s of every ranked layout and a 5-year TCO, from the "
                          "bundled dated price file or FILE (same format)")
    from moment.plan_nodes import add_args as add_node_args

    add_node_args(pl)
    pl.set_defaults(func=_plan_command)


def _add_machines(sub) -> None:
    machines = sub.add_parser("machines", help="list the bundled machine specs",
                              description="List the machine specs shipped with Moment: name and file.",
                              **examples("moment machines", "moment topo --machine moment-b"))
    machines.set_defaults(func=_machines_command)


#: modules that add a subcommand each: ``register(subparsers)`` adds its parser and sets
#: ``func``; one module per command keeps this file from growing with every command
COMMAND_MODULES: tuple[str, ...] = ("moment.data_cmd", "moment.bench_cmd", "moment.train_cmd",
                                     "moment.serve_cmd", "moment.place_cmd", "moment.demo_cmd",
                                     "moment.report_cmd", "moment.infer_cmd")


def _register_modules(sub) -> None:
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    try:  # Ctrl-C while the command modules load: the same one line as during the work, not a traceback
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
    except KeyboardInterrupt:
        print("moment: interrupted", file=sys.stderr)
        return 130
    if unknown:  # argparse would answer at the top, with `moment`'s usage: the command's own is the one to read
        from moment.flags import command_parser

        command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.func(args)
    except MomentError as exc:  # the library names its parameters; the user typed options
        from moment.flags import in_flags

        print(f"moment {args.command}: error: {in_flags(str(exc), parser, args)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("moment: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: say so plainly, traceback only on request
        if isinstance(exc, OSError) and exc.errno in OUTPUT_FAULTS:
            # a disk that filled (or turned read-only) during the work: the user's to fix, not a bug
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"moment {args.command}: error: {where}{exc.strerror}; free space or choose another output",
                  file=sys.stderr)
            return EXIT_USAGE
        if os.environ.get("MOMENT_DEBUG"):
            raise
        print(
            f"moment {args.command}: internal error: {type(exc).__name__}: {exc}\n"
            "This is a bug in Moment. Re-run with MOMENT_DEBUG=1 for the traceback and report it.",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
