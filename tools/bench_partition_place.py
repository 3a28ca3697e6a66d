"""Placement that knows the partition: remote share per step and memory per node, partition vs hash ownership.

    python tools/bench_partition_place.py [--quick] [--repeats R] [--cache-share S] [--json out.json] [--dir DIR]

For each graph (the fixtures Cora and Amazon-Photo, soc-Slashdot0902 (an edge
list: degree features, 5% random training seeds), and a skewed Chung-Lu graph
made by ``moment data synth``), at 2 and 4 nodes, side by side on the same
batches:

* ownership by the graph's partitions (``moment place --nodes N --partition``,
  METIS) against ``v mod N`` hash ownership, each with and without a locality
  cache of ``--cache-share`` of the rows per node. The cache holds what
  ``moment place`` writes to ``halo.npy`` (:mod:`training.place.node_reads`):
  the remote rows a pre-sample of the node's own seeds (seed 0) reads most,
  then the partition's unread halo rows; under hash ownership the same
  ranking over its remote rows (no partition halo);
* the caches are chosen from a pre-sample of ``--presample-epochs`` epochs of
  every node's seeds (seed 0), today's cache (``partition+hotcache``: the
  dataset's hottest remote rows, those reads summed over the nodes) from the
  same pre-sample;
* the measured steps: every node samples batches of its partition's training
  seeds with other sampler seeds than the pre-sample (held out), fan-outs
  10,5, ``--repeats`` epochs; a step is one batch on every node and its remote
  share is the rows those batches find neither at home nor in the node's cache
  over all the rows they gather. Median and range over the steps are reported;
* memory per node: the largest node's feature rows plus its cache over a full
  copy of the features, and the graph bytes a node holds (a partition's share
  of the CSR plus the global indptr, old_ids and part_of; hash ownership
  keeps today's full copy of the CSR on every node);
* predicted vs measured: ``moment plan --nodes N`` predicts each node's
  network bytes per step from a remote share (``--remote-share``): under hash
  ownership from its own model (``planner.multinode.remote_share``: 1 - 1/N,
  less the cache's read share), under partition ownership from a pre-sample's
  remote share (what ``moment data partition`` reports). The cache's share
  comes from a second, independent pre-sample (seed 100): the caches were
  chosen by the first (seed 0), whose own reads they fit too well to predict
  by. The plan is solved for moment-b with one NIC, each GPU's demand a
  quarter of the bytes a node's batch gathers; its NICs' bytes per iteration
  are set beside the bytes the held-out steps fetched from other nodes.

Memory bound of the tool: every node's reads of every row, 4 bytes x N x V.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from _cli import REPO, moment
from _results import Figure, write

sys.path.insert(0, str(REPO))
FIXTURES = REPO.parent / "shared" / "fixtures" / "graphs"
FANOUTS = (10, 5)


def graphs(work: Path, quick: bool) -> list[tuple[str, Path]]:
    """The graphs, imported or made once under ``work``."""
    out = []
    for name, src, extra in (("cora", FIXTURES / "cora", []),
                             ("amazon-photo", FIXTURES / "amazon-photo" / "amazon_photo.npz", []),
                             ("slashdot", FIXTURES / "soc-Slashdot0902" / "soc-Slashdot0902.txt.gz",
                              ["--format", "edgelist", "--undirected", "--features", "degree", "--feature-dim", "16"])):
        if not src.exists():
            continue
        dst = work / name
        if not (dst / "meta.json").exists():
            moment("data", "import", *extra, str(src), str(dst))
        out.append((name, dst))
    v, e = (20_000, 200_000) if quick else (100_000, 1_000_000)
    skew = work / f"skewed-{v}"
    if not (skew / "meta.json").exists():
        moment("data", "synth", str(skew), "--nodes", str(v), "--edges", str(e), "--generator", "chung-lu",
               "--undirected", "--feature-dim", "128", "--train-share", "0.05", "--seed", "3", "--quiet")
    out.append(("skewed", skew))
    return out


def train_seeds(ds) -> np.ndarray:
    """The dataset's training seeds, or 5% of the vertices drawn at random (seed 0) for a graph without a split."""
    if ds.train_idx is not None and ds.train_idx.shape[0]:
        return np.asarray(ds.train_idx, np.int64)
    rng = np.random.default_rng(0)
    return np.sort(rng.choice(ds.num_nodes, max(1, ds.num_nodes // 20), replace=False)).astype(np.int64)


def measure_steps(ds, seeds_of: list[np.ndarray], held: dict, cached: dict, batch_size: int, repeats: int,
                  serve: tuple) -> tuple[dict[str, list[float]], dict[str, int], int, int, np.ndarray]:
    """Per step (one batch on every node), each configuration's remote rows over the rows gathered; each
    configuration's remote rows in all, the rows gathered in all, the node-steps; and under configuration
    ``serve = (name, layout)``, how often each node read each of its rows for itself or for another node."""
    from training.sampler import NeighborSampler

    nodes = len(seeds_of)
    per_step: dict[str, list[float]] = {k: [] for k in held}
    remote_rows = dict.fromkeys(held, 0)
    rows_total = node_steps = 0
    sname, slay = serve
    served = np.zeros((nodes, ds.num_nodes), np.float64)
    for r in range(repeats):
        batches = []
        for k, mine in enumerate(seeds_of):
            rng = np.random.default_rng(1000 + r * nodes + k)  # held out: the pre-sample used seeds 0..N-1
            order = rng.permutation(mine)
            sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=FANOUTS, seed=1000 + r * nodes + k)
            batches.append([sampler.sample(order[i:i + batch_size]).n_id.numpy()
                            for i in range(0, order.size, batch_size)])
        for step in range(max(len(b) for b in batches)):
            got = [(k, b[step]) for k, b in enumerate(batches) if step < len(b)]
            n = sum(x.size for _, x in got)
            rows_total += n
            node_steps += len(got)
            for name in held:
                rem = sum(int((~held[name][k][x] & ~cached[name][k][x]).sum()) for k, x in got)
                remote_rows[name] += rem
                per_step[name].append(rem / n if n else 0.0)
            for k, x in got:
                served[k][x[held[sname][k][x]]] += 1
                miss = x[~held[sname][k][x] & ~cached[sname][k][x]]
                srv = slay.server_of(miss, k)
                for s_ in np.unique(srv):
                    served[s_][miss[srv == s_]] += 1
    return per_step, remote_rows, rows_total, node_steps, served


def configs(layouts: dict, reads: np.ndarray, check: np.ndarray, halos: list[np.ndarray],
            cache_rows: int) -> tuple[dict, dict, dict, list[np.ndarray]]:
    """Per configuration (ownership, with or without a cache): which rows each node holds, which its cache holds,
    the predicted remote share; and the partition's caches. ``partition+hotcache``: today's cache (the dataset's
    hottest remote rows: every node's pre-sample summed) beside the halo cache."""
    from planner.multinode import remote_share as model_share
    from training.place.node_reads import halo_ranking
    from training.sharded.remote_cache import cache_rows as hottest_remote

    parts, v = reads.shape
    held, cached, predicted = {}, {}, {}
    total = float(check.sum())
    for own, lay in layouts.items():
        holds = [lay.holds(k) for k in range(parts)]
        ranked = {"cache": [halo_ranking(reads[k], holds[k], halos[k] if own == "partition" else None)[:cache_rows]
                            for k in range(parts)]}
        if own == "partition":
            partition_caches = ranked["cache"]
            ranked["hotcache"] = [hottest_remote(reads.sum(0), holds[k], cache_rows) for k in range(parts)]
        remote_reads = sum(float(check[k][~holds[k]].sum()) for k in range(parts))
        for cache in ("", *ranked):
            key = f"{own}+{cache}" if cache else own
            held[key] = holds
            cached[key] = [_mask(v, ranked[cache][k] if cache else ()) for k in range(parts)]
            absorbed = sum(float(check[k][ranked[cache][k]].sum()) for k in range(parts)) if cache else 0.0
            predicted[key] = (model_share(parts, cache_read_share=absorbed / total) if own == "hash"
                              else (remote_reads - absorbed) / total)
    return held, cached, predicted, partition_caches


def fast_tier(layout, reads: np.ndarray, caches: list[np.ndarray], served: np.ndarray, share: float) -> dict:
    """Each node's fastest tier (``share`` of its rows) chosen by its own hotness (its reads and what it serves,
    :func:`training.place.node_reads.served_hotness`) vs by the dataset's (every node's pre-sample summed): the
    share of the reads the node served in the held-out steps that it holds."""
    from training.place.node_reads import served_hotness

    mine = served_hotness(reads, layout, caches)
    glob = reads.sum(0)
    hit = {"node": 0.0, "dataset": 0.0}
    for k in range(layout.num_nodes):
        rows = layout.rows_of(k)
        m = max(1, int(round(share * rows.size)))
        for name, h in (("node", mine[k]), ("dataset", glob[rows])):
            top = rows[np.argsort(-h, kind="stable")[:m]]
            hit[name] += float(served[k][top].sum())
    return {k: v / max(1.0, float(served.sum())) for k, v in hit.items()}


def _mask(n: int, ids) -> np.ndarray:
    m = np.zeros(n, bool)
    m[np.asarray(ids, np.int64)] = True
    return m


def plan_bytes(nodes: int, share: float, gathered_bytes: float) -> float:
    """``moment plan --nodes`` for moment-b with one NIC: the node's NIC bytes in per iteration (the plan is one node
    of ``nodes``) when each of its 4 GPUs reads a quarter of ``gathered_bytes`` and ``share`` of it is remote."""
    from moment.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["plan", "--machine", "moment-b", "--nodes", str(nodes), "--remote-share", f"{share:.6f}",
                     "--nics", "1", "--demand-gb", f"{gathered_bytes / 4 / 1e9:.12f}", "--json"])
    if code != 0:
        raise SystemExit(f"moment plan --nodes {nodes} --remote-share {share} failed")
    best = json.loads(buf.getvalue())["nodes"]["nic_placements"][0]
    return float(sum(best["nic_in_bytes"].values()))


def measure(name: str, path: Path, work: Path, parts: int, cache_share: float, repeats: int,
            tier_share: float, epochs: float) -> dict:
    """One graph at ``parts`` nodes: every configuration's steps, memory, and the predictions."""
    from iostack.shards import partition_rows
    from training.data import open_dataset
    from training.hotness import HotnessSpec
    from training.partition.quality import hash_layout
    from training.partition.read import open_partition
    from training.partition.run import partition_dataset
    from training.place.node_reads import node_reads, node_seeds, partition_halos

    ds = open_dataset(path)
    train = train_seeds(ds)
    out = work / f"{name}-{parts}"
    partition_dataset(ds, out, parts, method="metis", overwrite=True, presample_batches=0)
    pt = open_partition(out)
    layouts = {"partition": partition_rows(np.asarray(pt.part_of), num_nodes=parts),
               "hash": hash_layout(ds.num_nodes, parts)}
    seeds_of = node_seeds(train, layouts["partition"])  # a node trains on its partition's seeds, either way
    batch_size = int(max(16, min(1024, min(s.size for s in seeds_of) // 4)))
    spec = HotnessSpec("presample", fanouts=FANOUTS, batch_size=batch_size, epochs=epochs, seed=0)
    reads, _ = node_reads(ds, layouts["partition"], spec, train_idx=train)
    # a second, independent pre-sample predicts: the caches were chosen by the first, which they fit too well
    check, _ = node_reads(ds, layouts["partition"], replace(spec, seed=100), train_idx=train)
    cache_rows = int(round(cache_share * ds.num_nodes))
    halos = partition_halos(str(out), parts)
    held, cached, predicted, caches = configs(layouts, reads, check, halos, cache_rows)
    steps, remote_rows, rows_total, node_steps, served = measure_steps(
        ds, seeds_of, held, cached, batch_size, repeats, serve=("partition+cache", layouts["partition"]))
    gathered = rows_total / node_steps * ds.row_bytes  # bytes a node's batch gathers, on average
    n_steps = len(steps["partition"])
    full_graph = ds.indptr.nbytes + ds.indices.nbytes
    shared = pt.indptr.nbytes + pt.old_ids.nbytes + pt.part_of.nbytes
    graph_node = shared + max(pt.part(k).indices.nbytes for k in range(parts))
    tier = fast_tier(layouts["partition"], reads, caches, served, tier_share)
    row = {"graph": name, "parts": parts, "nodes": ds.num_nodes, "edges": ds.num_edges, "row_bytes": ds.row_bytes,
           "train_seeds": int(train.size), "batch_size": batch_size, "presample_epochs": epochs, "steps": n_steps,
           "repeats": repeats,
           "cache_rows": cache_rows, "gathered_bytes_per_node_step": gathered, "configs": {},
           "fast_tier_share": tier_share, "fast_tier_hits": tier}
    for key in held:
        lay = layouts[key.split("+")[0]]
        s = steps[key]
        measured_bytes = remote_rows[key] * ds.row_bytes / node_steps
        feat = int(lay.bytes_per_node(ds.row_bytes).max()) + (cache_rows * ds.row_bytes if "+" in key else 0)
        row["configs"][key] = {
            "remote_share_median": statistics.median(s), "remote_share_min": min(s), "remote_share_max": max(s),
            "remote_share_all_steps": remote_rows[key] / rows_total,
            "predicted_share": predicted[key],
            "predicted_bytes_per_node_step": plan_bytes(parts, predicted[key], gathered),
            "measured_bytes_per_node_step": measured_bytes,
            "feature_bytes_node_share": feat / max(1, ds.feature_bytes),
            "graph_bytes_node_share": graph_node / full_graph if key.startswith("partition") else 1.0}
    return row


def figures(rows: list[dict], when: str) -> list[Figure]:
    """The table's rows; ``when``: the date and load, written into the notes of the main figures."""
    figs = []
    for r in rows:
        g, p, c = r["graph"], r["parts"], r["configs"]
        rng = {k: f"steps {v['remote_share_min']:.1%}..{v['remote_share_max']:.1%}" for k, v in c.items()}
        for cache in ("", "+cache"):
            part, hsh = c[f"partition{cache}"], c[f"hash{cache}"]
            what = " with a halo cache of " + f"{r['cache_rows']:,} rows a node" if cache else " without a cache"
            figs.append(Figure("partition_place", f"{g}, {p} nodes: remote share per step{what}, partition vs hash "
                               "ownership (median)", "share", part["remote_share_median"],
                               hsh["remote_share_median"], f"hash ownership{cache}", higher_is_better=False,
                               target="several times lower (DistDGL: METIS vs random)",
                               note=f"partition {rng[f'partition{cache}']}; hash {rng[f'hash{cache}']}; "
                                    f"{r['steps']} steps, batch {r['batch_size']}; {when}"))
        figs.append(Figure("partition_place", f"{g}, {p} nodes: remote share per step, partition ownership with the "
                           "halo cache vs without", "share", c["partition+cache"]["remote_share_median"],
                           c["partition"]["remote_share_median"], "no cache", higher_is_better=False))
        figs.append(Figure("partition_place", f"{g}, {p} nodes: remote share per step, partition ownership, the halo "
                           "cache (the node's own reads) vs today's cache (the dataset's hottest remote rows), same "
                           "size", "share", c["partition+cache"]["remote_share_median"],
                           c["partition+hotcache"]["remote_share_median"], "cache by the dataset's hotness",
                           higher_is_better=False))
        t = r["fast_tier_hits"]
        figs.append(Figure("partition_place", f"{g}, {p} nodes: share of the reads a node serves (its own and its "
                           f"peers') that its fastest tier ({r['fast_tier_share']:.0%} of its rows) holds, chosen by "
                           "the node's hotness vs the dataset's", "share", t["node"], t["dataset"],
                           "the dataset's hotness"))
        for own in ("partition", "hash"):
            x = c[f"{own}+cache"]
            figs.append(Figure("partition_place", f"{g}, {p} nodes, {own} ownership + cache: feature bytes of the "
                               "largest node (its rows and its cache) over a full copy", "share",
                               x["feature_bytes_node_share"], 1.0, "a full copy", higher_is_better=False,
                               note=f"graph bytes a node holds over the whole CSR: {x['graph_bytes_node_share']:.1%}"))
        for key, x in c.items():
            figs.append(Figure("partition_place", f"{g}, {p} nodes, {key}: network bytes per node-step, `moment plan "
                               f"--nodes {p}` predicted vs measured", "B", x["predicted_bytes_per_node_step"],
                               x["measured_bytes_per_node_step"], "measured (held-out steps)",
                               higher_is_better=False, target="ratio near 1",
                               note=f"predicted remote share {x['predicted_share']:.1%}, measured "
                                    f"{x['remote_share_all_steps']:.1%}"))
    return figs


def report(rows: list[dict]) -> None:
    print(f"{'graph':<13}{'N':>2} {'config':<16}{'remote median':>14}{'range':>16}{'predicted':>10}"
          f"{'plan B/step':>12}{'meas B/step':>12}{'feat/node':>10}{'graph/node':>11}")
    for r in rows:
        for key, x in r["configs"].items():
            print(f"{r['graph']:<13}{r['parts']:>2} {key:<16}{x['remote_share_median']:>14.1%}"
                  f"{x['remote_share_min']:>8.1%}-{x['remote_share_max']:<7.1%}{x['predicted_share']:>10.1%}"
                  f"{x['predicted_bytes_per_node_step']:>12.3g}{x['measured_bytes_per_node_step']:>12.3g}"
                  f"{x['feature_bytes_node_share']:>10.1%}{x['graph_bytes_node_share']:>11.1%}")
        c = {k: max(v["remote_share_median"], 1e-9) for k, v in r["configs"].items()}
        t = r["fast_tier_hits"]
        print(f"{'':<16}partition vs hash: {c['hash'] / c['partition']:.1f}x fewer remote rows; with caches "
              f"{c['hash+cache'] / c['partition+cache']:.1f}x; {r['steps']} steps of batch {r['batch_size']}, "
              f"cache {r['cache_rows']:,} rows a node; fastest tier ({r['fast_tier_share']:.0%} of a node's rows) "
              f"holds {t['node']:.1%} of its served reads by the node's hotness, {t['dataset']:.1%} by the dataset's")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller skewed graph, two repeats")
    ap.add_argument("--dir", default="/var/tmp/bench_partition_place", help="work directory (graphs are kept)")
    ap.add_argument("--repeats", type=int, default=5, help="epochs of held-out steps (default 5)")
    ap.add_argument("--cache-share", type=float, default=0.05,
                    help="locality cache per node, a share of the rows (default 0.05)")
    ap.add_argument("--tier-share", type=float, default=0.05,
                    help="each node's fastest tier, a share of its rows (default 0.05)")
    ap.add_argument("--presample-epochs", type=float, default=3.0,
                    help="epochs of each node's seeds the placement's pre-sample covers (default 3; moment place "
                         "--presample-epochs)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    t0, load = time.time(), Path("/proc/loadavg").read_text().split()[:3]
    when = f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {' '.join(load)}"
    print(f"{when}; counts, not timings (no clock in any figure)")
    repeats = 2 if args.quick else args.repeats
    rows = []
    for name, path in graphs(work, args.quick):
        for parts in (2, 4):
            rows.append(measure(name, path, work, parts, args.cache_share, repeats, args.tier_share,
                                args.presample_epochs))
            print(f"  {name} at {parts} nodes: done ({time.time() - t0:.0f} s)", flush=True)
    report(rows)
    print(f"{time.time() - t0:.0f} s; load at the end {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    cmd = "python tools/bench_partition_place.py " + " ".join(sys.argv[1:])
    write(args.json, "partition_place", figures(rows, when), cmd)
    if args.json:
        Path(args.json).with_suffix(".rows.json").write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
