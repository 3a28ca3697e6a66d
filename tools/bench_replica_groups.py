"""Replica groups (DDStore's width): memory per node and remote share of sampled rows against the width W.

    python tools/bench_replica_groups.py [--nodes-graph V] [--edges E] [--seeds 3] [--json out.json] [--dir DIR]

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

Side by side in the same run, the reference at the same memory per node:
today's hot-row replication (the hottest share of rows on all 4 nodes, the
rest on one), with the share chosen so each node holds as many rows as under W
groups ((1 - h) / 4 + h = W / 4). Both figures follow from the layout and the
sampled reads, so no processes are started; they are exact counts for a seed
(no timing), so the load only changes how long the run takes.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

from _cli import moment
from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NODES = 4
WIDTHS = (1, 2, 4)


def _graph(d: Path, vertices: int, edges: int) -> Path:
    path = d / f"skewed-{vertices}-{edges}"
    if not (path / "meta.json").exists():
        moment("data", "synth", str(path), "--nodes", str(vertices), "--edges", str(edges), "--generator",
               "chung-lu", "--undirected", "--feature-dim", "16", "--train-share", "0.1", "--seed", "3", "--quiet")
    return path


def measure(path: Path, seeds: int) -> dict:
    import numpy as np

    from iostack.shards import shard_rows
    from training.data import open_dataset
    from training.hotness import HotnessSpec, presample_counts
    from training.partition.quality import remote_share

    ds = open_dataset(path)
    hot = presample_counts(ds, HotnessSpec("presample", fanouts=(10, 5), batch_size=1024, epochs=1.0))[0]
    v = ds.num_nodes
    layouts = {}
    for w in WIDTHS:
        layouts[f"groups{w}"] = shard_rows(hot, NODES, groups=w)
        h = round(v * (w - 1) / (NODES - 1))  # (1 - h/V)/N + h/V = W/N: the same rows per node as W groups
        layouts[f"hot{w}"] = shard_rows(hot, NODES, replicas=NODES if h else 1, hot_rows=h)
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
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes-graph", type=int, default=200_000, help="vertices of the synthetic graph")
    ap.add_argument("--edges", type=int, default=2_000_000, help="edges of the synthetic graph")
    ap.add_argument("--seeds", type=int, default=3, help="sampling seeds (median and range)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench_replica_groups"))
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    r = measure(_graph(args.dir, args.nodes_graph, args.edges), args.seeds)
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
    write(args.json, "replica_groups", figures(r), " ".join(sys.argv))


if __name__ == "__main__":
    main()
