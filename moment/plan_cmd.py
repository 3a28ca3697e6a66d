"""``moment plan``: print what :func:`planner.plan.plan` decided (the command's output side)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import TYPE_CHECKING

from moment._args import parse_nvlink, unknown_link_bytes_per_s
from planner.errors import PlannerError
from planner.plan import PlanResult, RankedLayout, layout_summary

if TYPE_CHECKING:
    from rich.console import Console


def gbps(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x / 1e9:.2f}"


def _bottleneck_text(entry: RankedLayout, limit: int = 3) -> str:
    names = []
    for a, b in entry.result.bottleneck[:limit]:
        na, nb = entry.placed.node(a), entry.placed.node(b)
        names.append(f"{na.label} → {nb.label}")
    if entry.result.saturated_stores:
        names.append("reads of " + ", ".join(entry.result.saturated_stores[:limit]))
    more = len(entry.result.bottleneck) - limit
    return "; ".join(names) + (f" (+{more})" if more > 0 else "") if names else "-"


def print_plan(result: PlanResult, top: int, console: Console) -> None:
    from rich.table import Table  # rich for the tables only: --json does without it

    s = result.search
    d = result.demand
    console.print(
        f"[bold]{result.machine}[/bold]: place {result.inventory} "
        f"· model [bold]{result.model}[/bold] · {d.bytes_per_consumer / 1e9:g} GB per GPU per iteration"
        + (f", GPU cache {d.accelerator_cache_share:.0%}" if d.accelerator_cache_share else "")
        + (f", host memory {d.host_memory_share:.0%}" if d.host_memory_share else "")
    )
    console.print(
        f"layouts: {s.raw_count:,} raw · {s.feasible_count:,} feasible · {s.distinct_count:,} distinct "
        f"up to symmetry · {result.solved_count:,} solved · {result.seconds['total']:.2f} s"
    )
    table = Table(title=f"top {min(top, len(result.ranked))} layouts", title_justify="left")
    for col, just in (("#", "right"), ("layout", "left"), ("per-GPU GB/s", "right"),
                      ("ms/iter", "right"), ("bottleneck", "left"), ("same as", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for e in result.ranked[:top]:
        table.add_row(str(e.rank), layout_summary(e.placed), gbps(e.mean_inlet_bytes_per_s),
                      f"{e.seconds_per_iteration * 1e3:.1f}", _bottleneck_text(e), ", ".join(e.labels))
    console.print(table)

    best = result.best
    console.print("[bold]Recommended slot map[/bold]")
    for m in result.slot_map():
        console.print(f"  {m.text}")
    inlets = ", ".join(f"{_device_name(g)} {gbps(v)}" for g, v in best.result.inlet_bytes_per_s.items())
    console.print(f"per-GPU inlet GB/s: {inlets} (mean {gbps(best.mean_inlet_bytes_per_s)}); "
                  f"{best.seconds_per_iteration * 1e3:.1f} ms per iteration")
    console.print(f"bottleneck: {_bottleneck_text(best, limit=6)}")

    base = Table(title="against the baselines", title_justify="left")
    for col, just in (("baseline", "left"), ("layout", "left"), ("per-GPU GB/s", "right"),
                      ("rank", "right"), ("recommended is", "right")):
        base.add_column(col, justify=just, overflow="fold")
    for name, b in result.baselines.items():
        if isinstance(b, RankedLayout):
            gain = result.gain_over(name)
            rank = str(b.rank) if b.rank <= top or result.solved_count == s.distinct_count else f"> {top}"
            base.add_row(_baseline_name(name, b), layout_summary(b.placed), gbps(b.mean_inlet_bytes_per_s),
                         rank, f"{gain:.2f}×" if gain is not None else "-")
        else:
            base.add_row(_baseline_name(name, None), f"[dim]{b}[/dim]", "-", "-", "-")
    console.print(base)
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


def _device_name(node_id: str) -> str:
    """``gpu2`` → ``GPU 2`` (the numbering of the slot map); other ids unchanged."""
    for prefix, word in (("gpu", "GPU"), ("ssd", "SSD")):
        if node_id.startswith(prefix) and node_id[len(prefix):].isdigit():
            return f"{word} {node_id[len(prefix):]}"
    return node_id


def _baseline_name(name: str, entry: RankedLayout | None) -> str:
    if name == "current":
        return "current"
    label = entry.layout.label if entry is not None and entry.layout.label else ""
    text = next((part for part in label.split("; ") if part.startswith(f"({name})")), "")
    return text or f"({name})"


def run(args: argparse.Namespace, topo, caps=None) -> int:
    """``topo`` and ``caps``: what :func:`moment._args.load_topology` loaded (capacities applied)."""
    from planner.plan import choose_inventory, measured_inventory, plan
    from planner.workload import Demand

    if args.top < 1:
        raise PlannerError(f"--top {args.top}: expected at least 1")
    if args.svg:
        from moment.outputs import check_file

        check_file(args.svg, "--svg", suffixes=(".svg",), what="the picture")
    if getattr(args, "nodes", 1) != 1:  # several nodes' options are checked before the search
        from moment.plan_nodes import network_demand

        network_demand(args)
    counts = args.gpus or (None,)
    if len(counts) > 1:
        return _run_scaling(args, topo, counts)
    book = None
    if args.prices is not None:  # a bad price file is reported before the search, not after the plan
        from planner.pricing import load_prices

        book = load_prices(args.prices or None)
    topo, inventory = choose_inventory(
        topo, spec=args.machine, gpus=counts[0], ssds=args.ssds,
        gpu_model=args.gpu_model, ssd_model=args.ssd_model,
    )
    measured_notes: list[str] = []
    if caps is not None:
        inventory, measured_notes = measured_inventory(inventory, caps)
    demand = Demand(args.demand_gb * 1e9, args.gpu_cache_share, args.cpu_cache_share)
    unknown = unknown_link_bytes_per_s(args)
    multinode = getattr(args, "nodes", 1) > 1
    # the table shows T, bottleneck and inlet rates only, which the ranking solve already has;
    # the best layout's tidy flows (an LP) are for the JSON's traffic targets, the picture's
    # link loads and the multinode plan
    result = plan(topo, inventory, demand, model=args.model, top=args.top,
                  exhaustive=args.exhaustive, nvlink_pairs=parse_nvlink(args.nvlink),
                  unknown_link_bytes_per_s=unknown, tidy_best=bool(args.json or args.svg or multinode))
    if measured_notes:
        result = dataclasses.replace(result, notes=(*measured_notes, *result.notes))
    if args.svg:
        from planner.topology.svg.draw import write_svg

        best = result.best
        util = best.result.link_utilisation
        labels = {k: f"{u:.0%}" for k, u in util.items() if u >= 0.005}
        write_svg(best.placed, args.svg, title=f"{result.machine}: recommended layout",
                  highlight_links=best.result.bottleneck, link_labels=_one_direction(labels),
                  highlight_nodes=best.result.saturated_stores)
    nodes = None
    if multinode:  # one node of several (moment/plan_nodes.py)
        from moment.plan_nodes import plan_nodes

        nodes = plan_nodes(args, result)
    if args.json:
        from planner.handoff import plan_document

        doc = plan_document(result, top=args.top, layout=args.layout, unknown_link_bytes_per_s=unknown,
                            nodes=nodes)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        from rich.console import Console

        console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)
        print_plan(result, args.top, console)
        if nodes:
            from moment.plan_nodes import print_nodes

            print_nodes(nodes, console)
        if args.svg:
            console.print(f"[dim]picture written to {args.svg}[/dim]")
        if book is not None:
            from moment.plan_costs import print_prices
            from planner.pricing import price_plan

            print_prices(price_plan(result, book), console)
    return 0


def _run_scaling(args: argparse.Namespace, topo, counts: tuple[int, ...]) -> int:
    """``--gpus 1,2,4``: one plan per count, the recommended and classic layouts side by side."""
    from rich.console import Console

    from moment.plan_costs import print_scaling
    from planner.scaling import scaling_table
    from planner.workload import Demand

    if args.json or args.svg or getattr(args, "nodes", 1) != 1 or args.prices is not None:
        raise PlannerError(f"--gpus {','.join(map(str, counts))}: several GPU counts print a table only "
                           "(no --json, --svg, --nodes or --prices); give one count for those")
    table = scaling_table(topo, counts, Demand(args.demand_gb * 1e9, args.gpu_cache_share, args.cpu_cache_share),
                          spec=args.machine, ssds=args.ssds, model=args.model,
                          nvlink_pairs=parse_nvlink(args.nvlink),
                          unknown_link_bytes_per_s=unknown_link_bytes_per_s(args))
    console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)
    print_scaling(table, console)
    return 0


def _one_direction(labels: dict[tuple[str, str], str]) -> dict[tuple[str, str], str]:
    """Keep the busier direction's label for each link (the picture draws one line per link)."""
    out: dict[frozenset, tuple[tuple[str, str], str]] = {}
    for key, text in labels.items():
        k = frozenset(key)
        if k not in out or float(text.rstrip("%")) > float(out[k][1].rstrip("%")):
            out[k] = (key, text)
    return dict(out.values())
