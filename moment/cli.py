"""The ``moment`` command line: parses, calls the libraries, prints.

Every error a user can cause (a missing or garbled file, an unknown machine
name) is a :class:`planner.errors.PlannerError`; it is printed as one line
naming the input and the fix, with exit status 2. Set ``MOMENT_DEBUG=1`` to
see the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from planner.errors import PlannerError

EXIT_USAGE = 2


def _topo_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    from planner.topology import jsonio
    from planner.topology.discover import live_topology, topology_from_files
    from planner.topology.render import topology_tree

    files = dict(
        lspci=args.lspci, lspci_vvv=args.lspci_vvv or (), dmidecode=args.dmidecode,
        nvidia_smi=args.nvidia_smi, hwloc=args.hwloc, nccl_topo=args.nccl_topo,
    )
    if args.machine is not None or any(v for v in files.values()):
        topo = topology_from_files(machine=args.machine, name=args.name, **files)
    else:
        topo = live_topology(args.sys_root)
        if args.name:
            topo.name = args.name
    if args.svg:
        from planner.topology.svg import write_svg

        write_svg(topo, args.svg)
    if args.json:
        sys.stdout.write(jsonio.dumps(topo) + "\n")
    else:
        console = Console(highlight=False, emoji=False)
        console.print(topology_tree(topo, show_other=args.all))
        if args.svg:
            console.print(f"[dim]picture written to {args.svg}[/dim]")
    return 0


def _machines_command(args: argparse.Namespace) -> int:
    from planner.topology.spec import bundled_machines

    for name, path in sorted(bundled_machines().items()):
        print(f"{name}\t{path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moment",
        description="Plan slot layouts, place data and train GNNs out-of-core on one multi-GPU server.",
    )
    from moment import __version__

    parser.add_argument("--version", action="version", version=f"moment {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    topo = sub.add_parser(
        "topo",
        help="show a machine's device graph (live, from captured files, or a machine spec)",
        description=(
            "Show a machine's device graph: sockets, switches, slots and devices with link "
            "generation × width and GB/s per direction. With no source option, reads this "
            "machine's sysfs (and NVML when NVIDIA GPUs are present)."
        ),
    )
    src = topo.add_argument_group("sources (captured on the machine; combine those of one machine)")
    src.add_argument("--lspci", metavar="FILE", help="output of `lspci -tv` (or `lspci -t`)")
    src.add_argument("--lspci-vvv", metavar="FILE", action="append",
                     help="output of `lspci -vvv` / `-vvnn`, whole or per device (repeatable)")
    src.add_argument("--dmidecode", metavar="FILE", help="output of `dmidecode` or `dmidecode -t 9`")
    src.add_argument("--nvidia-smi", metavar="FILE", help="output of `nvidia-smi topo -m`")
    src.add_argument("--hwloc", metavar="FILE", help="hwloc XML (`lstopo --of xml`)")
    src.add_argument("--nccl-topo", metavar="FILE", help="NCCL topology XML (NCCL_TOPO_FILE format)")
    src.add_argument("--machine", metavar="NAME|FILE",
                     help="a bundled machine spec (moment-a, moment-b) or a YAML spec file")
    src.add_argument("--sys-root", metavar="DIR", default="/sys", help=argparse.SUPPRESS)
    out = topo.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the model as JSON (schema moment.topology v1)")
    out.add_argument("--svg", metavar="FILE", help="write a picture of the device graph")
    out.add_argument("--all", action="store_true", help="also list chipset and other minor devices")
    out.add_argument("--name", help="name to give the machine")
    topo.set_defaults(func=_topo_command)

    machines = sub.add_parser("machines", help="list the bundled machine specs")
    machines.set_defaults(func=_machines_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except PlannerError as exc:
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
