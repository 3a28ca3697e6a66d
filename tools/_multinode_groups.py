"""``tools/bench_multinode.py --replica-groups 1,2,4``: whole training jobs on replica groups, beside hot-row
replication at the same memory per node.

At N = 4 nodes (one ``torchrun`` per node on this machine, one rank each, as
the rest of ``bench_multinode.py``), for every width W asked:

* ``groups W``: :func:`training.place.nodes.place_sharded` with
  ``ShardSpec(nodes=4, groups=W)``: W full replicas of the rows over 4/W nodes
  each, every node's all-to-all on its own replica group's ranks;
* ``hot-row W`` (the reference): today's hot-row replication with the same
  rows per node: the hottest share h of the rows on all 4 nodes, the rest on
  one, ``(1 - h)/4 + h = W/4``, so h = (W - 1)/3 (W = 1 is the same layout as
  one group, so it runs once).

Per run, from the job's last epoch: seeds/s (rank 0's epoch record: the job's
seeds over the epoch's seconds; ``--repeat`` rounds of every layout in turn, median and range), the
remote share of the rows the batches read, the bytes the exchange brought per
step (every rank's, summed), seconds per exchange and the feature bytes each
node holds in host memory. Four node processes share this machine's cores (2
here, with the other users' load printed at the start and the end of the
``--json``): seeds/s say what the exchange costs in CPU time, not what a
network would carry; memory, remote share and bytes do not depend on it.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from types import ModuleType

from _results import Figure

NODES = 4


def _spec(kind: str, w: int):
    from training.place.specs import ShardSpec

    if kind == "groups":
        return ShardSpec(nodes=NODES, groups=w, hot_rows=0.0)
    h = (w - 1) / (NODES - 1)  # (1 - h)/N + h = W/N: the rows per node of W groups
    return ShardSpec(nodes=NODES, replicas=NODES if h else 1, hot_rows=h)


def _place(args, work: Path, widths: list[int], bm: ModuleType) -> tuple[Path, dict[str, Path], object]:
    from planner.handoff import PlanTargets, StoreTarget
    from training.data import open_dataset
    from training.hotness import HotnessSpec, get_hotness
    from training.place.nodes import place_sharded
    from training.place.specs import PolicySpec, TierSpec

    g = bm.graph(args, work)
    ds = open_dataset(g)
    hot = get_hotness(ds, HotnessSpec("presample", fanouts=(10, 5), batch_size=args.batch_size, epochs=1.0))
    memory_only = PlanTargets("host memory", gpus=(("gpu0", "s0"),),
                              stores=(StoreTarget("mem0", "cpu", "mem0", "s0", 1.0),))
    dirs = {}
    for w in widths:
        for kind in ("groups", "hot") if w > 1 else ("groups",):
            d = work / f"rg-{kind}{w}"
            if not (d / "shards.json").exists():
                place_sharded(ds.features, hot.values, memory_only, d,
                              TierSpec(cpu_cache_bytes=ds.num_nodes * ds.row_bytes), PolicySpec(), _spec(kind, w),
                              fsync=False)
            dirs[f"{kind}{w}"] = d
    return g, dirs, ds


def _summary(runs: list[list[dict]], bm: ModuleType) -> dict:
    """Seeds/s (median, range) over the runs; the first run's remote share, bytes per step, s/exchange, memory."""
    sps = [bm.seeds_per_s(r) for r in runs]
    nodes = bm.last(runs[0]).get("nodes") or {}
    calls = nodes.get("exchange_calls", 0)  # every rank's, summed: NODES per step
    per_node = bm.node_host_bytes(runs[0])
    return {"seeds_per_s": statistics.median(sps), "range": (min(sps), max(sps)), "runs": len(sps),
            "remote_share": nodes.get("remote_share", 0.0),
            "bytes_per_step": nodes.get("remote_bytes", 0) * NODES / calls if calls else 0.0,
            "s_per_exchange": nodes.get("exchange_s", 0.0) / calls if calls else 0.0,
            "node_bytes": max(per_node), "exchange": nodes.get("exchange")}


def bench_groups(args, work: Path, bm: ModuleType) -> list[Figure]:
    """Every width of ``args.replica_groups`` as groups and as hot-row replication; the figures, printed too.

    ``bm``: the running ``bench_multinode`` module (its ``graph``, ``run_job``, ``seeds_per_s``, ``last``,
    ``node_host_bytes``), passed in rather than imported so the two files do not import each other."""
    widths = sorted({int(w) for w in str(args.replica_groups).split(",")})
    bad = [w for w in widths if w < 1 or NODES % w]
    if bad:
        raise SystemExit(f"--replica-groups {args.replica_groups}: widths must divide {NODES} (the nodes)")
    g, dirs, ds = _place(args, work, widths, bm)
    full = ds.num_nodes * ds.row_bytes
    base = dict(dataset=str(g), model="sage", fanouts=[10, 5], batch_size=args.batch_size, epochs=args.epochs,
                eval_every_epochs=0, hidden=128, seed=0, backend="posix", prefetch=2)
    print(f"graph: {ds.num_nodes:,} vertices, {ds.num_edges:,} edges, rows of {ds.row_bytes} B; {NODES} nodes, one "
          f"rank each, on {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}", flush=True)
    runs: dict[str, list] = {name: [] for name in dirs}
    for i in range(args.repeat):  # round by round: a change in the machine's load falls on every layout alike
        for name, d in dirs.items():
            print(f"  {name} ({i + 1}/{args.repeat}) ...", flush=True)
            runs[name].append(bm.run_job(work, f"rg-{name}-{i}", base, [str(d / f"node{k}") for k in range(NODES)]))
    res = {name: _summary(r, bm) for name, r in runs.items()}
    print(f"\n{'layout':12}{'seeds/s (median, range)':>30}{'node MiB':>10}{'remote share':>14}{'MiB/step':>10}"
          f"{'s/exchange':>12}  (load {os.getloadavg()[0]:.2f})")
    for name, s in res.items():
        lo, hi = s["range"]
        print(f"{name:12}{s['seeds_per_s']:>12,.0f} ({lo:,.0f}-{hi:,.0f}){'':>3}{s['node_bytes'] / 2**20:>10.1f}"
              f"{s['remote_share']:>14.1%}{s['bytes_per_step'] / 2**20:>10.2f}{s['s_per_exchange']:>12.4f}")
    figs = _figures(res, widths, full)
    print()
    for f in figs:
        ratio = "-" if f.ratio is None else f"{f.ratio:.3f}"
        print(f"{f.figure:90} ours {f.ours:>12,.4g}  ref {f.reference:>12,.4g}  ratio {ratio}  {f.note}")
    return figs


def _figures(res: dict, widths: list[int], full: int) -> list[Figure]:
    """For every W > 1: groups against hot-row replication at the same rows per node, and against one group."""
    cores = f"{NODES} node processes on {os.cpu_count()} cores"
    figs = []
    for w in (w for w in widths if w > 1):
        a = res[f"groups{w}"]
        tag = f"N={NODES}, W={w} replica groups"
        refs = [(res[f"hot{w}"], "hot-row replication at the same rows per node")]
        if "groups1" in res:
            refs.append((res["groups1"], "one group (W=1, the rows once)"))
        for ref, label in refs:
            rng = f"ranges {a['range'][0]:,.0f}-{a['range'][1]:,.0f} vs {ref['range'][0]:,.0f}-{ref['range'][1]:,.0f}"
            figs += [
                Figure("multinode_groups", f"{tag} vs {label}: seeds/s of the whole job", "seeds/s",
                       a["seeds_per_s"], ref["seeds_per_s"], label, note=f"median of {a['runs']}; {rng}; {cores}"),
                Figure("multinode_groups", f"{tag} vs {label}: remote share of the rows read", "share",
                       a["remote_share"], ref["remote_share"], label, higher_is_better=False,
                       target=f"1 - W/N = {1 - w / NODES:.2f} for uniform reads"),
                Figure("multinode_groups", f"{tag} vs {label}: bytes exchanged per step (all ranks)", "bytes",
                       a["bytes_per_step"], ref["bytes_per_step"], label, higher_is_better=False,
                       note=f"s per exchange {a['s_per_exchange']:.4f} vs {ref['s_per_exchange']:.4f}"),
            ]
        hot = refs[0][0]
        figs.insert(len(figs) - 3 * (len(refs) - 1),
                    Figure("multinode_groups", f"{tag}: feature bytes of the largest node over a full copy", "share",
                           a["node_bytes"] / full, hot["node_bytes"] / full, refs[0][1], higher_is_better=False,
                           target=f"W/N = {w / NODES:.2f} (DDStore)"))
    return figs
