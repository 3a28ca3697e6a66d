"""``moment plan --nodes N``: the recommended layout as one node of N, and where NICs should go (see
planner.multinode)."""

from __future__ import annotations

import argparse
import math

from moment.errors import CommandError


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("several nodes (a feature store sharded across them; planner.multinode)")
    g.add_argument("--nodes", type=int, default=1, metavar="N",
                   help="plan one node of N training together: part of every GPU's reads crosses the network")
    g.add_argument("--replicas", type=int, default=1, metavar="W", help="nodes holding each hot row (default 1)")
    g.add_argument("--replica-groups", type=int, default=1, metavar="G",
                   help="G full replicas of the rows, each over N/G nodes (`moment place --replica-groups`; "
                        "default 1)")
    g.add_argument("--hot-read-share", type=float, default=0.0, metavar="S",
                   help="share of the reads that go to the replicated hot rows (default 0)")
    g.add_argument("--remote-share", type=float, metavar="S",
                   help="share of every GPU's reads from other nodes (default: from --nodes, --replicas, "
                        "--hot-read-share and --gpu-cache-share)")
    g.add_argument("--remote-share-of", metavar="PLACEMENT",
                   help="take --remote-share from a placement over partition-owned rows (`moment place --nodes N "
                        "--partition`): the share of its nodes' pre-sampled reads that no node holds itself")
    g.add_argument("--nic-gbps", type=float, metavar="GBIT/S",
                   help="every data NIC's port rate (default: the NIC's known model, else its PCIe link)")
    g.add_argument("--no-gpudirect", action="store_true",
                   help="no GPUDirect RDMA: the network's bytes land in host memory first")
    g.add_argument("--nics", type=int, default=0, metavar="K", help="also place K NICs into free slots")
    g.add_argument("--nic-model", default="connectx-7-400g", metavar="MODEL",
                   help="model of the NICs to place (connectx-7-400g, connectx-6-200g, connectx-5-100g, efa-100g)")


def network_demand(args: argparse.Namespace):
    from planner.multinode import NetworkDemand, remote_share

    if args.nodes < 1:
        raise CommandError(f"--nodes {args.nodes}: expected at least 1")
    if args.replica_groups < 1 or args.nodes % args.replica_groups:
        raise CommandError(f"--replica-groups {args.replica_groups}: replica groups split --nodes "
                           f"{args.nodes} evenly; choose a divisor of {args.nodes}")
    if not 1 <= args.replicas <= args.nodes // args.replica_groups:
        raise CommandError(f"--replicas {args.replicas}: expected 1 to --nodes ({args.nodes}) over "
                           f"--replica-groups ({args.replica_groups})")
    if args.nic_gbps is not None and not (0 < args.nic_gbps < math.inf):
        raise CommandError(f"--nic-gbps {args.nic_gbps}: expected a positive number of Gbit/s")
    share = args.remote_share
    if args.remote_share_of:
        if share is not None:
            raise CommandError("--remote-share-of and --remote-share: give one of them")
        share = placement_remote_share(args.remote_share_of, args.nodes)
    if share is None:
        share = remote_share(args.nodes, replicas=args.replicas, hot_read_share=args.hot_read_share,
                             gpu_cache_share=args.gpu_cache_share, groups=args.replica_groups)
    elif not 0 <= share <= 1:
        raise CommandError(f"--remote-share {share}: expected 0 to 1")
    return NetworkDemand(args.nodes, share, not args.no_gpudirect,
                         args.nic_gbps * 1e9 / 8 if args.nic_gbps else None)


def placement_remote_share(placement: str, nodes: int) -> float:
    """The pre-sampled remote share a ``moment place --nodes N --partition`` placement recorded (its ``place.json``).

    Raises
    ------
    CommandError
        No readable ``place.json``, one without the share, or a placement over another number of nodes.
    """
    import json
    from pathlib import Path

    path = Path(placement) / "place.json"
    try:
        rep = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CommandError(f"--remote-share-of {placement}: cannot read {path} ({exc}); give the directory "
                           "`moment place --nodes N --partition OUT --out DIR` wrote") from None
    shares = rep.get("presampled_remote_share") if isinstance(rep, dict) else None
    if not isinstance(shares, dict) or "no_cache" not in shares:
        raise CommandError(f"--remote-share-of {placement}: {path} records no pre-sampled remote share (only a "
                           "placement over partition-owned rows with a pre-sampled hotness does); give --remote-share")
    if rep.get("num_nodes") != nodes:
        raise CommandError(f"--remote-share-of {placement}: placed over {rep.get('num_nodes')} nodes, --nodes is "
                           f"{nodes}")
    return float(shares["no_cache"])


def plan_nodes(args: argparse.Namespace, result) -> dict:
    """Solve the best layout as one node of ``--nodes`` (and place ``--nics``); a JSON-able summary."""
    from planner.multinode import NIC_MODELS, NetworkDemand, data_nics, place_nics, solve_nodes
    from planner.plan import workload_for
    from planner.workload import Demand

    nd = network_demand(args)
    best = result.best
    unknown = args.unknown_link_gbps * 1e9 if args.unknown_link_gbps else None
    base = workload_for(best.placed, Demand(args.demand_gb * 1e9, args.gpu_cache_share, args.cpu_cache_share))
    one = solve_nodes(best.placed, base, NetworkDemand(1, 0.0), unknown_link_bytes_per_s=unknown)
    out = {"nodes": nd.nodes, "remote_share": nd.remote_share, "gpudirect": nd.gpudirect,
           "one_node": _summary(one)}
    if data_nics(best.placed):
        out["with_its_nics"] = _summary(solve_nodes(best.placed, base, nd, unknown_link_bytes_per_s=unknown))
    if args.nics:
        model = NIC_MODELS.get(args.nic_model)
        if model is None:
            raise CommandError(f"--nic-model {args.nic_model!r}: expected one of {', '.join(NIC_MODELS)}")
        placed = place_nics(best.placed, base, nd, model, args.nics, unknown_link_bytes_per_s=unknown)
        out["nic_placements"] = [{"slots": list(p.slots), **_summary(p.result), "notes": list(p.notes)}
                                 for p in placed]
    elif not data_nics(best.placed):
        raise CommandError(f"{result.machine}: --nodes {nd.nodes} needs NICs and the machine has none that carries "
                           "data; give --nics K (and --nic-model) to place some")
    return out


def _summary(r) -> dict:
    return {"seconds_per_iteration": r.seconds_per_iteration, "mean_inlet_bytes_per_s": r.mean_inlet_bytes_per_s,
            "min_inlet_bytes_per_s": r.min_inlet_bytes_per_s, "inlet_bytes_per_s": r.inlet_bytes_per_s,
            "nic_in_bytes": r.nic_in_bytes, "nic_out_bytes": r.nic_out_bytes, "bottleneck": r.bottleneck[:6],
            "gdr_paths": r.gdr_paths}


def print_nodes(summary: dict, console) -> None:
    from rich.table import Table

    n = summary["nodes"]
    console.print(f"\n[bold]as one node of {n}[/bold]: {summary['remote_share']:.1%} of every GPU's reads from the "
                  f"other nodes, as many served to them; GPUDirect RDMA {'on' if summary['gpudirect'] else 'off'}")
    t = Table(title_justify="left")
    for c in ("", "mean GB/s per GPU", "slowest GPU GB/s", "NICs (in GB/iter)", "bottleneck"):
        t.add_column(c, justify="left" if c in ("", "bottleneck", "NICs (in GB/iter)") else "right")
    rows = [("one node (no network)", summary["one_node"])]
    if "with_its_nics" in summary:
        rows.append((f"{n} nodes, the machine's NICs", summary["with_its_nics"]))
    for i, p in enumerate(summary.get("nic_placements", [])):
        rows.append((f"{n} nodes, NICs in {', '.join(p['slots'])}" + (" (best)" if i == 0 else ""), p))
    for name, s in rows:
        nics = ", ".join(f"{k.split(':', 1)[-1]} {max(0.0, v) / 1e9:.2f}" for k, v in s["nic_in_bytes"].items()) or "-"
        t.add_row(name, f"{s['mean_inlet_bytes_per_s'] / 1e9:.2f}", f"{s['min_inlet_bytes_per_s'] / 1e9:.2f}", nics,
                  "; ".join(s["bottleneck"][:3]) or "-")
    console.print(t)
    gdr = (summary.get("with_its_nics") or (summary.get("nic_placements") or [{}])[0]).get("gdr_paths") or {}
    for nic, gpus in gdr.items():
        console.print(f"[dim]GPUDirect path: {nic} → {', '.join(gpus)} under one PCIe switch[/dim]" if gpus else
                      f"[dim]{nic} shares no PCIe switch with a GPU: its bytes cross a CPU root complex[/dim]")
