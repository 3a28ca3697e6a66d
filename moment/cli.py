"""The ``moment`` command line: parses, calls the libraries, prints.

Every error a user can cause (a missing or garbled file, an unknown machine
name) is a :class:`momentbase.errors.MomentError`, whichever package raised it;
:func:`main` prints it as one line naming the input and the fix, with exit status 2. Set ``MOMENT_DEBUG=1`` to
see the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from moment._args import (
    accept_negative_values,
    add_source_args,
    examples,
    load_topology,
)
from moment.errors import CommandError
from momentbase.errors import MomentError
from planner.errors import PlannerError

EXIT_USAGE = 2


def _topo_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    from planner.topology import jsonio
    from planner.topology.render import topology_tree

    topo, _ = load_topology(args)
    if args.svg:
        from planner.topology.svg import write_svg

        write_svg(topo, args.svg)
    if args.json:
        sys.stdout.write(jsonio.dumps(topo) + "\n")
    else:
        console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)
        console.print(topology_tree(topo, show_other=args.all))
        if args.svg:
            console.print(f"[dim]picture written to {args.svg}[/dim]")
    return 0


def _plan_command(args: argparse.Namespace) -> int:
    from moment import plan_cmd

    return plan_cmd.run(args, *load_topology(args))


def _machines_command(args: argparse.Namespace) -> int:
    from planner.topology.bundled import bundled_machines

    for name, path in sorted(bundled_machines().items()):
        print(f"{name}\t{path}")
    return 0


def _profile_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from hwprofile import profile_machine
    from planner.capacities import format_size, parse_size, save_capacities

    def number(text: str, what: str, kind: type) -> float:
        try:
            return kind(text)
        except ValueError:
            raise CommandError(f"--{what} {text!r}: expected a {'whole ' if kind is int else ''}number") from None

    block = parse_size(args.block_size)
    file_bytes = parse_size(args.file_size)
    depth = int(number(args.queue_depth, "queue-depth", int))
    seconds = number(args.seconds, "seconds", float)
    for p in args.ssd or ():
        if not Path(p).exists():
            raise CommandError(f"--ssd {p}: no such directory or file")
    if args.out:  # refuse before measuring for minutes, not after
        out_dir = Path(args.out).parent
        if not out_dir.is_dir() or not os.access(out_dir, os.W_OK):
            raise CommandError(f"--out {args.out}: directory {out_dir} is missing or not writable")
    topo = None
    with contextlib.suppress(PlannerError):  # without it, figures are keyed by bus address, not node id
        topo, _ = load_topology(args)  # this machine: profile has only --sys-root
    from moment.bars import Bars

    with Bars(transient=True) as bars:
        caps = profile_machine(
            topo, ssd_paths=args.ssd or (), block_bytes=block, queue_depth=depth, seconds=seconds,
            file_bytes=file_bytes, use_fio=not args.no_fio, memory=not args.no_memory,
            keep_files=args.keep_file, sys_root=args.sys_root, progress=bars,
        )
        if args.ssd:  # what `moment train --backend auto` compares: both backends' reads into GPU memory
            from iostack.bench import add_device_read_figures

            caps = add_device_read_figures(caps, args.ssd, seconds=min(seconds, 3.0), file_bytes=file_bytes,
                                           keep_file=args.keep_file, progress=bars)

    def rate(bps: float) -> str:
        return f"{bps / 1e9:.2f} GB/s" if bps >= 1e9 else f"{bps / 1e6:.1f} MB/s"

    table = Table(title=f"measured on {caps.host}", title_justify="left")
    for col in ("what", "figure", "tool", "how"):
        table.add_column(col, overflow="fold")
    for d in caps.devices:
        what = d.key + "".join(f"\n{x}" for x in (d.block_device, d.model, d.path) if x)
        for i, m in enumerate(d.measurements()):
            iops = f"{m.read_iops / 1e3:.1f} k IOPS · " if m.read_iops is not None else ""
            how = ", ".join(x for x in (
                f"{format_size(m.block_bytes)} random reads" if m.block_bytes else None,
                f"queue depth {m.queue_depth}" if m.queue_depth else None, m.mode,
                f"{format_size(m.file_bytes)} file" if m.file_bytes else None,
                f"{m.seconds:g} s" if m.seconds else None, m.jobs) if x)
            table.add_row(what if i == 0 else "", iops + rate(m.read_bytes_per_s)
                          + (" (used)" if i == 0 and d.others else ""), m.tool or "", how)
        fio = next((m for m in d.measurements() if (m.tool or "").startswith("fio")), None)
        own = next((m for m in d.measurements() if m.tool == "moment-posix"), None)
        if fio and own and fio.read_iops and own.read_iops:
            table.add_row("", f"moment-posix / fio = {own.read_iops / fio.read_iops:.2f}", "", "")
    for mem in caps.memory:
        table.add_row("memory, " + ("all NUMA nodes" if mem.numa_node is None else f"NUMA node {mem.numa_node}"),
                      rate(mem.bytes_per_s), mem.method or "",
                      f"{mem.convention or 'stream-copy'} (read + write), "
                      f"{format_size(mem.array_bytes or 0)} x {mem.repeats}, {mem.threads} thread(s)")
    for lk in caps.links:
        table.add_row(lk.label, rate(lk.bytes_per_s), lk.tool or "",
                      f"{format_size(lk.transfer_bytes)} copies" if lk.transfer_bytes else "")
    if caps.pcie_efficiency is not None:
        table.add_row("PCIe protocol efficiency", f"{caps.pcie_efficiency.value:.3f}", "",
                      caps.pcie_efficiency.derived_from or "")
    out = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)
    out.print(table)
    if caps.notes:
        out.print("[bold]not measured, and other notes[/bold]")
        for note in caps.notes:
            out.print(f"  • {note}", markup=False)
    if args.out:
        path = save_capacities(caps, args.out)
        out.print(f"capacities written to {path} (schema moment.capacities v1)", markup=False)
    else:
        out.print("[dim]not saved: pass --out FILE to keep these figures for planning[/dim]")
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
                   "moment plan --lspci-vvv lspci-vvv.txt --dmidecode dmidecode.txt --unknown-link-gbps 16"),
    )
    add_source_args(pl, planning=True)
    inv = pl.add_argument_group("devices to place (default: the spec's inventory or the machine's own)")
    inv.add_argument("--gpus", type=int, metavar="N", help="number of GPUs to place")
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
    how.add_argument("--model", choices=("maxflow", "concurrent"), default="maxflow",
                     help="flow model: the paper's max-flow, or the stricter concurrent LP")
    how.add_argument("--top", type=int, default=5, metavar="K", help="layouts to list (default 5)")
    how.add_argument("--exhaustive", action="store_true",
                     help="solve every distinct layout instead of pruning by a cut bound")
    how.add_argument("--json", action="store_true", help="print the plan as JSON")
    how.add_argument("--layout", choices=("recommended", "current", "a", "b", "c", "d"), default="recommended",
                     help="with --json: the layout whose targets `moment place --plan` gets (default recommended; "
                          "current: the machine as cabled now, for data placed before the devices move)")
    how.add_argument("--svg", metavar="FILE", help="write the recommended layout with its flows")
    from moment.plan_nodes import add_args as add_node_args

    add_node_args(pl)
    pl.set_defaults(func=_plan_command)

    _register_modules(sub)

    machines = sub.add_parser("machines", help="list the bundled machine specs",
                              description="List the machine specs shipped with Moment: name and file.",
                              **examples("moment machines", "moment topo --machine moment-b"))
    machines.set_defaults(func=_machines_command)

    prof = sub.add_parser(
        "profile",
        help="measure SSD random reads, memory (and GPU copies) here; write a capacities file",
        description=(
            "Measure what can be measured on this machine: random aligned reads from a test file "
            "on each --ssd directory (with fio when installed, and with Moment's own reader), "
            "DRAM bandwidth, and host/GPU copies when CUDA is present. Writes a capacities file "
            "(schema moment.capacities v1, docs/capacities.md) for planning."
        ),
        **examples("moment profile --ssd /mnt/nvme0 --ssd /mnt/nvme1 --out capacities.yaml",
                   "moment profile --no-fio --seconds 2 --file-size 256MiB --ssd /var/tmp",
                   "moment plan --machine my-server.yaml --capacities capacities.yaml"),
    )
    prof.add_argument("--ssd", metavar="PATH", action="append",
                      help="a directory on an SSD (a test file is written there and removed), "
                           "or an existing file or block device to read (repeatable)")
    prof.add_argument("--block-size", metavar="SIZE", default="4KiB", help="read size (default 4KiB)")
    prof.add_argument("--queue-depth", metavar="N", default="64", help="reads in flight (default 64)")
    prof.add_argument("--seconds", metavar="S", default="5", help="duration of each read test (default 5)")
    prof.add_argument("--file-size", metavar="SIZE", default="1GiB",
                      help="size of the test file written in each --ssd directory (default 1GiB)")
    prof.add_argument("--no-fio", action="store_true", help="do not run fio even if it is installed")
    prof.add_argument("--no-memory", action="store_true", help="skip the memory bandwidth test")
    prof.add_argument("--keep-file", action="store_true", help="keep the test files")
    prof.add_argument("--out", metavar="FILE",
                      help="write the capacities here (YAML; JSON if FILE ends in .json)")
    prof.add_argument("--sys-root", metavar="DIR", default="/sys", help=argparse.SUPPRESS)
    prof.set_defaults(func=_profile_command)
    accept_negative_values(parser)  # "--gpu-cache -1KiB": a clear error from the size parser
    return parser


#: modules that add a subcommand each: ``register(subparsers)`` adds its parser and sets
#: ``func``; one module per command keeps this file from growing with every command
COMMAND_MODULES: tuple[str, ...] = ("moment.data_cmd", "moment.bench_cmd", "moment.train_cmd",
                                     "moment.serve_cmd", "moment.place_cmd", "moment.demo_cmd",
                                     "moment.report_cmd")


def _register_modules(sub) -> None:
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except MomentError as exc:
        print(f"moment {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("moment: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: say so plainly, traceback only on request
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
