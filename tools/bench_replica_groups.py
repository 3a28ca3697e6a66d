"""Replica groups (DDStore's width): memory per node and remote share of sampled rows against the width W.

    python tools/bench_replica_groups.py [--nodes-graph V] [--edges E] [--seeds 3] [--exchange-repeats 3]
                                         [--json out.json] [--dir DIR]

On a skewed synthetic graph (Chung-Lu, undirected, made once under ``--dir``),
hotness by the existing pre-sampling (fan-outs 10,5, batches of 1024), at N = 4
nodes, for W = 1, 2, 4 full-replica groups (:func:`iostack.shards.shard_rows`
with ``groups=W``: every group of N/W nodes holds every row once):

* memory per node: the largest node's feature bytes over a full copy
  (DDStore's figure: it grows as W/N);
* remote share: every rank (4, one a node) samples batches of its quarter of
  the training seeds (``v mod 4``, what a DDP split gives) and counts the rows
  its node does not hold (:func:`training.partition.quality.remote_share`), on
  the same batches for every layout; repeated over ``--seeds`` sampling seeds,
  median and range.

* seconds per all-to-all exchange (``--exchange-repeats`` runs): 4 spawned
  gloo processes, one a node, each sampling its seeds' batches and fetching the
  rows its node lacks through :class:`training.sharded.exchange.AllToAllExchange`
  (``--dim`` float32 per row), on its replica group's process group (the
  world with one group), all ranks starting each exchange together (a
  barrier); W = 2 against one group and against hot-row replication at the
  same rows per node. Loopback on the machine's cores: it measures the CPU
  time of the collective and the copies, not a network.

Side by side in the same run, the reference at the same memory per node:
today's hot-row replication (the hottest share of rows on all 4 nodes, the
rest on one), with the share chosen so each node holds as many rows as under W
groups ((1 - h) / 4 + h = W / 4). Both figures follow from the layout and the
sampled reads, so they need no processes; they are exact counts for a seed
(no timing). The exchange's seconds are timings: the load is printed with them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

from _cli import moment
from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NODES = 4
WIDTHS = (1, 2, 4)
#: the layouts whose exchange is timed: one group (the world), 2 groups, hot-row replication at 2 groups' memory
EXCHANGED = ("groups1", "groups2", "hot2")


def _graph(d: Path, vertices: int, edges: int) -> Path:
    path = d / f"skewed-{vertices}-{edges}"
    if not (path / "meta.json").exists():
        moment("data", "synth", str(path), "--nodes", str(vertices), "--edges", str(edges), "--generator",
               "chung-lu", "--undirected", "--feature-dim", "16", "--train-share", "0.1", "--seed", "3", "--quiet")
    return path


def measure(path: Path, seeds: int) -> dict:
    import numpy as np

    from training.data import open_dataset
    from training.hotness import HotnessSpec, presample_counts
    from training.partition.quality import remote_share

    ds = open_dataset(path)
    hot = presample_counts(ds, HotnessSpec("presample", fanouts=(10, 5), batch_size=1024, epochs=1.0))[0]
    v = ds.num_nodes
    np.save(path.parent / "hot.npy", hot)
    layouts = {f"{kind}{w}": _layout(f"{kind}{w}", hot) for w in WIDTHS for kind in ("groups", "hot")}
    ranks = np.arange(v) % NODES  # rank k trains on the seeds v mod 4 == k
    shares = {name: [] for name in layouts}
    rows = 0
    for s in range(seeds):
        rs = remote_share(ds, ranks, layouts, fanouts=(10, 5), batch_size=1024, batches_per_rank=4, seed=s)
        rows += rs.rows
        for name in layouts:
            shares[name].append(rs.share(name))
    full = max(v * ds.row_bytes, 1)
    memory = {name: int(lay.bytes_per_node(ds.row_bytes).max()) / full for name, lay in layouts.items()}
    return {"vertices": v, "edges": ds.num_edges, "sampled_rows": rows, "memory_share": memory,
            "remote_share": {k: {"median": float(np.median(x)), "min": min(x), "max": max(x)}
                             for k, x in shares.items()}}


def _layout(name: str, hot):
    """``groups<W>``: W replica groups; ``hot<W>``: hot-row replication at the same rows per node."""
    from iostack.shards import shard_rows

    w = int(name[-1])
    if name.startswith("groups"):
        return shard_rows(hot, NODES, groups=w)
    h = round(hot.size * (w - 1) / (NODES - 1))  # (1 - h/V)/N + h/V = W/N: the same rows per node as W groups
    return shard_rows(hot, NODES, replicas=NODES if h else 1, hot_rows=h)


def _exchange_rank(rank: int, store_path: str, path: str, hot_path: str, name: str, dim: int, batches: int,
                   out: str) -> None:
    """One of ``NODES`` gloo ranks: each batch's remote rows under layout ``name`` through
    :class:`AllToAllExchange`, on the rank's replica group (the world when there is one); seconds per exchange."""
    import time

    import numpy as np
    import torch
    import torch.distributed as dist

    from training.data import open_dataset
    from training.sampler import NeighborSampler
    from training.sharded.exchange import AllToAllExchange
    from training.sharded.groups import group_ranks, group_view

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=NODES)
    ds = open_dataset(path)
    lay = _layout(name, np.load(hot_path))
    ranks_of = tuple((k,) for k in range(NODES))
    view = group_view(lay, ranks_of, rank, np.arange(NODES))
    group = (AllToAllExchange.new_group(60.0) if lay.groups == 1
             else AllToAllExchange.new_subgroup(60.0, group_ranks(lay, ranks_of)))
    ex = AllToAllExchange(group, lambda ids: torch.zeros((ids.numel(), dim)), dim=dim, dtype=torch.float32)
    train = np.asarray(ds.train_idx, np.int64)
    mine = np.random.default_rng(rank).permutation(train[train % NODES == rank])
    sampler = NeighborSampler(np.asarray(ds.indptr), np.asarray(ds.indices), fanouts=(10, 5), seed=rank)
    held, secs = lay.holds(rank), []
    for b in range(batches):
        n_id = sampler.sample(mine[(b * 1024) % max(mine.size - 1024, 1):][:1024]).n_id.numpy()
        rid = n_id[~held[n_id]]
        peer = view.server[lay.server_of(rid, rank)]
        order = np.argsort(peer, kind="stable")
        counts = np.bincount(peer, minlength=len(view.ranks)).tolist()
        dist.barrier()  # every rank starts the exchange together: its own time, not the others' sampling
        t0 = time.perf_counter()
        ex.fetch(list(torch.split(torch.from_numpy(rid[order]), counts)))
        secs.append(time.perf_counter() - t0)
    Path(out).write_text(json.dumps(secs[2:]))  # the first two: connections being set up
    ex.close()
    dist.destroy_process_group()


def exchange_seconds(path: Path, hot_path: Path, name: str, dim: int, batches: int) -> float:
    """Median seconds per exchange over every rank's batches, ``NODES`` spawned gloo processes."""
    import statistics
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        outs = [f"{d}/r{k}.json" for k in range(NODES)]
        mp.spawn(_exchange_child, args=(f"{d}/store", str(path), str(hot_path), name, dim, batches, outs),
                 nprocs=NODES, join=True)
        return statistics.median(x for o in outs for x in json.loads(Path(o).read_text()))


def _exchange_child(rank: int, store_path: str, path: str, hot_path: str, name: str, dim: int, batches: int,
                    outs: list) -> None:
    _exchange_rank(rank, store_path, path, hot_path, name, dim, batches, outs[rank])


def figures(r: dict) -> list[Figure]:
    figs = []
    for w in WIDTHS:
        g, h = f"groups{w}", f"hot{w}"
        rg, rh = r["remote_share"][g], r["remote_share"][h]
        figs.append(Figure("replica_groups", f"N={NODES}, W={w}: feature bytes of the largest node over a full copy",
                           "share", r["memory_share"][g], r["memory_share"][h],
                           "hot-row replication at the same rows per node", higher_is_better=False,
                           target=f"W/N = {w / NODES:.2f} (DDStore)"))
        figs.append(Figure("replica_groups", f"N={NODES}, W={w}: remote share of sampled rows (median of seeds)",
                           "share", rg["median"], rh["median"], "hot-row replication at the same rows per node",
                           higher_is_better=False, target=f"(N/W - 1)/(N/W) = {1 - w / NODES:.2f} for uniform reads",
                           note=f"range {rg['min']:.4f}-{rg['max']:.4f} vs {rh['min']:.4f}-{rh['max']:.4f}"))
    ex = r.get("exchange_s") or {}
    if all(ex.get(n) for n in EXCHANGED):
        med = {n: statistics.median(xs) for n, xs in ex.items()}
        rng = {n: f"{min(xs) * 1e3:.2f}-{max(xs) * 1e3:.2f} ms" for n, xs in ex.items()}
        for ref, ref_name in (("groups1", "one group: the exchange spans all 4 nodes"),
                              ("hot2", "hot-row replication at the same rows per node")):
            figs.append(Figure("replica_groups", f"N={NODES}, W=2: seconds per all-to-all exchange (gloo, 4 processes "
                               "on this machine; median over every rank's steps, median of runs)", "s",
                               med["groups2"], med[ref], ref_name, higher_is_better=False,
                               note=f"runs {rng['groups2']} vs {rng[ref]}; loopback on 2 shared cores: CPU time, "
                                    "not a network"))
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes-graph", type=int, default=200_000, help="vertices of the synthetic graph")
    ap.add_argument("--edges", type=int, default=2_000_000, help="edges of the synthetic graph")
    ap.add_argument("--seeds", type=int, default=3, help="sampling seeds (median and range)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench_replica_groups"))
    ap.add_argument("--exchange-repeats", type=int, default=3,
                    help="runs of the 4-process exchange timing per layout (median and range; 0: skip)")
    ap.add_argument("--dim", type=int, default=256, help="float32 features per exchanged row")
    ap.add_argument("--batches", type=int, default=12, help="batches per rank and run of the exchange timing")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    graph = _graph(args.dir, args.nodes_graph, args.edges)
    r = measure(graph, args.seeds)
    r["exchange_s"] = {n: [] for n in EXCHANGED}
    for _ in range(args.exchange_repeats):  # the layouts interleaved: a change of load falls on all of them
        for n in EXCHANGED:
            r["exchange_s"][n].append(exchange_seconds(graph, graph.parent / "hot.npy", n, args.dim, args.batches))
    print(f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC · load {load0[0]:.2f} -> "
          f"{os.getloadavg()[0]:.2f} · {r['vertices']:,} vertices, {r['edges']:,} CSR entries, "
          f"{r['sampled_rows']:,} sampled rows over {args.seeds} seeds · N = {NODES}")
    print(f"{'W':>2} {'memory/node':>12} {'(hot-row)':>10} {'remote share':>13} {'(hot-row)':>10}  "
          "range groups | hot-row")
    for w in WIDTHS:
        g, h = r["remote_share"][f"groups{w}"], r["remote_share"][f"hot{w}"]
        print(f"{w:>2} {r['memory_share'][f'groups{w}']:>12.3f} {r['memory_share'][f'hot{w}']:>10.3f} "
              f"{g['median']:>13.4f} {h['median']:>10.4f}  {g['min']:.4f}-{g['max']:.4f} | "
              f"{h['min']:.4f}-{h['max']:.4f}")
    for n, xs in r["exchange_s"].items():
        runs = ", ".join(f"{x * 1e3:.2f}" for x in xs)
        print(f"exchange {n}: median {statistics.median(xs) * 1e3:.2f} ms per step (runs {runs})")
    write(args.json, "replica_groups", figures(r), " ".join(sys.argv))


if __name__ == "__main__":
    main()
