"""``moment profile``: measure SSD random reads, memory and GPU copies here; write a capacities file.

Thin: parse, call :func:`hwprofile.profile_machine` (and
:func:`hwprofile.gpureads.add_device_read_figures` for the backends' reads into
GPU memory), print the figures, save them.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from moment._args import examples, load_topology
from moment.errors import CommandError
from planner.errors import PlannerError


def register(sub) -> None:
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
    prof.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from hwprofile import MemoryProbe, ProfileSpec, SsdProbe, profile_machine
    from momentbase.units import parse_size
    from planner.capacities import save_capacities

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
    spec = ProfileSpec(SsdProbe(args.ssd or (), block, depth, seconds, file_bytes, use_fio=not args.no_fio,
                                keep_files=args.keep_file),
                       memory=None if args.no_memory else MemoryProbe())
    if args.out:  # refuse before measuring for minutes, not after
        from moment.outputs import check_file

        check_file(args.out, "--out", what="the capacities")
    topo = None
    with contextlib.suppress(PlannerError):  # without it, figures are keyed by bus address, not node id
        topo, _ = load_topology(args)  # this machine: profile has only --sys-root
    from moment.bars import Bars

    with Bars(transient=True) as bars:
        caps = profile_machine(spec, topo, sys_root=args.sys_root, progress=bars)
        if args.ssd:  # what `moment train --backend auto` compares: both backends' reads into GPU memory
            from hwprofile.gpureads import add_device_read_figures

            caps = add_device_read_figures(caps, args.ssd, seconds=min(seconds, 3.0), file_bytes=file_bytes,
                                           keep_file=args.keep_file, progress=bars)

    table = _table(caps)
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


def _rate(bps: float) -> str:
    return f"{bps / 1e9:.2f} GB/s" if bps >= 1e9 else f"{bps / 1e6:.1f} MB/s"


def _table(caps):
    """The figures of ``caps`` as a rich table: per SSD each tool's reads (and our reader against fio), memory,
    links."""
    from rich.table import Table

    from momentbase.units import format_size

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
            table.add_row(what if i == 0 else "", iops + _rate(m.read_bytes_per_s)
                          + (" (used)" if i == 0 and d.others else ""), m.tool or "", how)
        fio = next((m for m in d.measurements() if (m.tool or "").startswith("fio")), None)
        own = next((m for m in d.measurements() if m.tool == "moment-posix"), None)
        if fio and own and fio.read_iops and own.read_iops:
            table.add_row("", f"moment-posix / fio = {own.read_iops / fio.read_iops:.2f}", "", "")
    for mem in caps.memory:
        table.add_row("memory, " + ("all NUMA nodes" if mem.numa_node is None else f"NUMA node {mem.numa_node}"),
                      _rate(mem.bytes_per_s), mem.method or "",
                      f"{mem.convention or 'stream-copy'} (read + write), "
                      f"{format_size(mem.array_bytes or 0)} x {mem.repeats}, {mem.threads} thread(s)")
    for lk in caps.links:
        table.add_row(lk.label, _rate(lk.bytes_per_s), lk.tool or "",
                      f"{format_size(lk.transfer_bytes)} copies" if lk.transfer_bytes else "")
    if caps.pcie_efficiency is not None:
        table.add_row("PCIe protocol efficiency", f"{caps.pcie_efficiency.value:.3f}", "",
                      caps.pcie_efficiency.derived_from or "")
    return table
