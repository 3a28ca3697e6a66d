"""Several nodes on one machine: a feature store sharded across nodes against full replicas, side by side.

    python tools/bench_multinode.py [--quick] [--json out.json]
    python tools/bench_multinode.py --replica-groups 1,2,4 [--batch-size 250] [--json out.json]
    python tools/bench_multinode.py --partitioned [--quick] [--json out.json]   # the graph partitioned too

Nodes are separate process groups on localhost: one ``torchrun --nnodes N
--nproc-per-node L --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT`` per
node, each with its own data directory (``out/node<k>`` of a placement made by
:func:`training.place.nodes.place_sharded`), every rank running
``tools/multinode_worker.py`` (``training.trainer.train`` plus
``/proc/self/smaps_rollup``). The data set is a skewed Chung-Lu graph from
``moment data synth``, hotness by pre-sampling; every row of a node sits in its
host-memory tier (the DDStore setting: an in-memory store, sharded).

Figures, each against its reference measured in the same run:

* host memory per node, N = 2 and 4 nodes, W = 1 and 2 replicas of the 5%
  hottest rows: the node's feature store (and locality cache) in host memory,
  against one node holding a full replica (goal: about 1/N plus the
  replicated share);
* seeds/s of N sharded nodes against one node with full replicas and the same
  number of ranks (the same compute split: the cost of the exchange alone),
  and against one rank;
* remote bytes per epoch (every rank's, summed) with a locality cache of the
  5% hottest remote rows against none, W = 1 and 2;
* the exchange: ``all_to_all`` against one-sided RPC at the same batches
  (seconds per exchange, seeds/s);
* two local ranks on one node: the CPU tier's memory (proportional set size,
  anonymous + shared-memory pages, both ranks summed; RSS beside it) against
  every rank building its own copy;
* Cora: two sharded nodes against one process at the same seeds: the step
  losses (full neighbourhoods: the same sampling) and the test accuracy; and
  with sampled fan-outs against one node of two ranks (the same per-rank
  sampling streams).

``--replica-groups W1,W2,...`` runs only the replica groups' jobs instead
(``tools/_multinode_groups.py``): W full-replica groups at N = 4 beside
hot-row replication at the same memory per node.

On this 2-core machine every process competes for the same two cores and
"the network" is loopback TCP: seeds/s show what the exchange costs in CPU
time, not what a cluster's NICs would carry; memory and traffic figures do
not depend on that.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _cli import moment
from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tools" / "multinode_worker.py"
sys.path.insert(0, str(REPO))




def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: take finished runs found under --dir instead of running them again (--reuse)
REUSE = False


def run_job(work: Path, name: str, config: dict, dirs: list[str | None], local: int = 1,
            private: bool = False) -> list[dict]:
    """Train ``config`` on ``len(dirs)`` nodes (node k with placement ``dirs[k]``) of ``local`` ranks each.

    Returns every rank's record from the worker, in rank order.
    """
    out = work / "runs" / name
    done = [out / f"rank{r}.json" for r in range(len(dirs) * local)]
    if REUSE and all(p.exists() for p in done) and all(
            json.loads((out / f"cfg{k}.json").read_text()) == dict(config, placement=d) for k, d in enumerate(dirs)):
        return [json.loads(p.read_text()) for p in done]
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    n = len(dirs)
    threads = max(1, (os.cpu_count() or 1) // (n * local))  # every "node" shares this host's cores
    port = _port()
    procs = []
    for k, d in enumerate(dirs):
        cfg = dict(config, placement=d)
        (out / f"cfg{k}.json").write_text(json.dumps(cfg))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node", str(local),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", name,
               "--max-restarts", "0", str(WORKER), str(out / f"cfg{k}.json"), str(out)]
        if private:
            cmd.append("--private")
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(threads), MOMENT_THREADS=str(threads))
        with open(out / f"node{k}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        logs = "\n".join((out / f"node{k}.log").read_text()[-1500:] for k in range(n))
        sys.exit(f"{name}: failed ({codes})\n{logs}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n * local)]


def last(recs: list[dict]) -> dict:
    """The last epoch record, as rank 0 saw it."""
    return next(r for r in recs if r["rank"] == 0)["epochs"][-1]


def seeds_per_s(recs: list[dict]) -> float:
    return last(recs)["seeds_per_s"]


def host_bytes(rec: dict) -> int:
    """The feature store's host bytes of one rank (and its locality cache), from the start record."""
    m = rec["start"].get("memory") or {}
    return int(m.get("host", 0)) + int(m.get("remote_cache", 0))


def node_host_bytes(recs: list[dict]) -> list[int]:
    """Per node: host bytes of its store (one rank per node in these runs)."""
    by = {}
    for r in recs:
        by.setdefault(r["node"], host_bytes(r))
    return [by[k] for k in sorted(by)]


def tier_pss(recs: list[dict]) -> tuple[int, int]:
    """The host tiers' memory, every rank's proportional share summed; and the ranks' RSS growth, summed.

    Private memory the store allocated is anonymous, all touched when the store fills it: the
    ``Pss_Anon`` that opening the store added (start record - before). A node-shared segment is
    shared memory, counted in a process's PSS only once it touches the pages: its ``Pss_Shmem`` at
    the last epoch's end (by then the gathers have touched nearly all of it), split among the ranks
    that map it. RSS counts a shared page in full in every rank that touched it.
    """
    pss = sum((r["start_mem"]["Pss_Anon"] - r["before"]["Pss_Anon"]) + r["epoch_mem"][-1]["Pss_Shmem"]
              for r in recs)
    rss = sum(r["epoch_mem"][-1]["Rss"] - r["before"]["Rss"] for r in recs)
    return pss, rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="200000", help="graph vertices (default 200000)")
    ap.add_argument("--edges", default="2000000", help="graph edges (default 2000000)")
    ap.add_argument("--feature-dim", type=int, default=256, help="float32 features per row (default 256)")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--train-share", default="0.05")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per run; figures from the last (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each seeds/s measurement (median; default 3)")
    ap.add_argument("--dir", help="work directory (default: a temporary one under /var/tmp)")
    ap.add_argument("--quick", action="store_true", help="a small graph, one repeat (a smoke run)")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    ap.add_argument("--reuse", action="store_true",
                    help="with --dir: take the runs finished there (same configuration) instead of running them")
    ap.add_argument("--replica-groups", help="only the replica groups' runs: widths W (comma-separated, e.g. 1,2,4) "
                                             "at 4 nodes, each beside hot-row replication at the same memory")
    ap.add_argument("--partitioned", action="store_true",
                    help="only the partitioned graph's figures (tools/multinode_partitioned.py): moment data "
                         "partition over 2 nodes against one node holding the whole graph")
    args = ap.parse_args()
    global REUSE
    REUSE = args.reuse
    if args.quick:
        args.nodes, args.edges, args.feature_dim, args.repeat, args.train_share = "20000", "200000", 64, 1, "0.1"
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="moment-bench-multinode-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    try:
        if args.replica_groups:  # its own mode: the replica groups' whole jobs (tools/_multinode_groups.py)
            from _multinode_groups import bench_groups

            figures = bench_groups(args, work, sys.modules[__name__])
        elif args.partitioned:
            from multinode_partitioned import bench_partitioned

            figures = bench_partitioned(args, work, run_job, last, graph)
            for f in figures:
                print(f"{f.figure:90} ours {f.ours}  ref {f.reference}  ratio {f.ratio}  {f.note}")
        else:
            figures = _bench(args, work)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n({'runs taken from ' + str(work) if args.reuse else f'{time.time() - t_start:.0f} s in all'}, "
          f"{os.cpu_count()} cores)")
    write(args.json, "bench_multinode", figures, " ".join(sys.argv))
    return 0


def graph(args, work: Path) -> Path:
    """The skewed Chung-Lu data set of ``args`` (made once under ``work``)."""
    g = work / "graph"
    if not (g / "meta.json").exists():
        moment("data", "synth", str(g), "--nodes", args.nodes, "--edges", args.edges, "--generator", "chung-lu",
               "--undirected", "--feature-dim", str(args.feature_dim), "--train-share", args.train_share,
               "--valid-share", "0.005", "--test-share", "0.005", "--seed", "3", "--quiet")
    return g


def _placements(args, work: Path):
    import numpy as np

    from iostack.placement import simple_placement
    from planner.handoff import PlanTargets, StoreTarget
    from training.data import open_dataset
    from training.hotness import HotnessSpec, get_hotness
    from training.place.nodes import place_sharded
    from training.place.specs import PolicySpec, ShardSpec, TierSpec

    g = graph(args, work)
    ds = open_dataset(g)
    hot = get_hotness(ds, HotnessSpec("presample", fanouts=(10, 5), batch_size=args.batch_size, epochs=1.0))
    full = work / "full"
    if not (full / "placement.json").exists():
        simple_placement(ds.num_nodes, [("cpu", ds.num_nodes)]).save(full)
    memory_only = PlanTargets("host memory", gpus=(("gpu0", "s0"),),
                              stores=(StoreTarget("mem0", "cpu", "mem0", "s0", 1.0),))
    shards = {}
    for n in (2, 4):
        for w in (1, 2):
            d = work / f"shards-n{n}-w{w}"
            if not (d / "shards.json").exists():
                place_sharded(ds.features, hot.values, memory_only, d,
                              TierSpec(cpu_cache_bytes=ds.num_nodes * ds.row_bytes), PolicySpec(),
                              ShardSpec(nodes=n, replicas=w, hot_rows=0.05), fsync=False)
            shards[n, w] = d
    return g, ds, full, shards, np


def _bench(args, work: Path) -> list[Figure]:
    g, ds, full, shards, np = _placements(args, work)
    base = dict(dataset=str(g), model="sage", fanouts=[10, 5], batch_size=args.batch_size, epochs=args.epochs,
                eval_every_epochs=0, hidden=128, seed=0, backend="posix", prefetch=2)
    cache = int(0.05 * ds.num_nodes) * ds.row_bytes
    print(f"graph: {ds.num_nodes:,} vertices, {ds.num_edges:,} edges, rows of {ds.row_bytes} B "
          f"({ds.num_nodes * ds.row_bytes / 2**20:.0f} MiB of features); hot rows replicated: 5%; locality cache: "
          f"{cache / 2**20:.1f} MiB per node", flush=True)
    figs: list[Figure] = []
    runs: dict[str, list] = {}

    def job(name, cfg, dirs, local=1, private=False, repeat=1):
        out = []
        for i in range(repeat):
            print(f"  {name}{f' ({i + 1}/{repeat})' if repeat > 1 else ''} ...", flush=True)
            out.append(run_job(work, f"{name}-{i}", cfg, dirs, local, private))
        runs[name] = out
        return out

    # --- the reference: one node, a full replica, 1 / N ranks
    ref1 = job("full-1x1", base, [str(full)], repeat=args.repeat)
    full_bytes = host_bytes(ref1[0][0])
    ref = {n: job(f"full-1x{n}", base, [str(full)], local=n, repeat=args.repeat) for n in (2, 4)}
    # --- sharded
    sh = {}
    for n in (2, 4):
        for w in (1, 2):
            dirs = [str(shards[n, w] / f"node{k}") for k in range(n)]
            sh[n, w, 0] = job(f"shards-n{n}-w{w}", base, dirs, repeat=args.repeat if w == 1 else 1)
            sh[n, w, 1] = job(f"shards-n{n}-w{w}-cache", dict(base, remote_cache=cache), dirs)
    rpc = {n: job(f"shards-n{n}-w1-rpc", dict(base, exchange="rpc"),
                  [str(shards[n, 1] / f"node{k}") for k in range(n)], repeat=args.repeat) for n in (2, 4)}
    # --- two local ranks, one node: node-shared CPU tier against a copy per rank
    shared = job("local-2-shared", dict(base, epochs=1), [str(full)], local=2)
    private = job("local-2-private", dict(base, epochs=1), [str(full)], local=2, private=True)

    med = statistics.median

    def sps(rs):
        v = [seeds_per_s(r) for r in rs]
        return med(v), min(v), max(v)

    print(f"\n{'run':34}{'seeds/s (median, range)':>30}{'host MiB/node':>15}{'remote MiB/ep':>15}"
          f"{'remote share':>13}{'s/exchange':>12}")
    for name, rs in runs.items():
        m, lo, hi = sps(rs)
        nodes = last(rs[0]).get("nodes") or {}
        per_node = node_host_bytes(rs[0])
        ex = nodes.get("exchange_s", 0.0) / nodes["exchange_calls"] if nodes.get("exchange_calls") else 0.0
        print(f"{name:34}{m:>12,.0f} ({lo:,.0f}-{hi:,.0f}){'':>3}{statistics.mean(per_node) / 2**20:>15.1f}"
              f"{nodes.get('remote_bytes', 0) / 2**20:>15.1f}{nodes.get('remote_share', 0.0):>13.1%}{ex:>12.4f}")

    for n in (2, 4):
        for w in (1, 2):
            per_node = node_host_bytes(sh[n, w, 0][0])
            rows_share = json.loads((shards[n, w] / "place.json").read_text())["rows_per_node_share"]
            pss = statistics.mean(tier_pss([r])[0] for r in sh[n, w, 0][0])  # one rank per node
            pss_full = tier_pss(ref1[0])[0]
            figs.append(Figure("multinode", f"host memory per node, {n} nodes, W={w} (5% hottest rows replicated)",
                               "bytes", statistics.mean(per_node), full_bytes, "one node, full replica",
                               higher_is_better=False, target=f"about 1/N + replicated share = {rows_share:.3f} of "
                                                              "the full replica",
                               note=f"max node {max(per_node) / full_bytes:.3f} of a full replica; measured PSS of "
                                    f"the host tiers {pss / 2**20:.0f} vs {pss_full / 2**20:.0f} MiB"))
        m, lo, hi = sps(sh[n, 1, 0])
        r, rlo, rhi = sps(ref[n])
        figs.append(Figure("multinode", f"seeds/s, {n} sharded nodes x 1 rank (W=1) vs one node x {n} ranks",
                           "seeds/s", m, r, f"one node, full replica, {n} ranks",
                           note=f"median of {len(sh[n, 1, 0])}; ranges {lo:,.0f}-{hi:,.0f} vs {rlo:,.0f}-{rhi:,.0f}; "
                                f"{os.cpu_count()} cores shared by every process"))
        r1 = sps(ref1)[0]
        figs.append(Figure("multinode", f"seeds/s, {n} sharded nodes vs one rank, full replica", "seeds/s", m, r1,
                           "one node, one rank"))
        for w in (1, 2):
            a, b = last(sh[n, w, 1][0])["nodes"], last(sh[n, w, 0][0])["nodes"]
            figs.append(Figure("multinode", f"remote bytes per epoch, {n} nodes, W={w}: locality cache vs none",
                               "bytes", a["remote_bytes"], b["remote_bytes"], "no locality cache",
                               higher_is_better=False,
                               note=f"remote share {a['remote_share']:.1%} vs {b['remote_share']:.1%} of rows read"))
        a2a, rp = last(sh[n, 1, 0][0])["nodes"], last(rpc[n][0])["nodes"]
        per = [last(x)["nodes"]["exchange_s"] / last(x)["nodes"]["exchange_calls"] for x in sh[n, 1, 0]]
        per_rpc = [last(x)["nodes"]["exchange_s"] / last(x)["nodes"]["exchange_calls"] for x in rpc[n]]
        ma, la, ha = sps(sh[n, 1, 0])
        mr, lr, hr = sps(rpc[n])
        figs.append(Figure("multinode", f"seeds/s, {n} nodes: all_to_all exchange vs RPC", "seeds/s", ma, mr,
                           "RPC (TensorPipe, one rpc_async per peer)",
                           note=f"median of {len(rpc[n])}; ranges {la:,.0f}-{ha:,.0f} vs {lr:,.0f}-{hr:,.0f}"))
        figs.append(
            Figure(
                "multinode",
                f"seconds per exchange, {n} nodes: all_to_all vs RPC",
                "s",
                med(per),
                med(per_rpc),
                "RPC (TensorPipe, one rpc_async per peer)",
                higher_is_better=False,
                note=f"median of {len(per)}; {a2a['remote_rows'] / max(1, a2a['exchange_calls']):,.0f} "
                f"remote rows per exchange; seeds/s {sps(sh[n, 1, 0])[0]:,.0f} vs {sps(rpc[n])[0]:,.0f}",
            )
        )
        del rp
    tier = ds.num_nodes * ds.row_bytes
    ps, rs_ = tier_pss(shared[0])
    pp, rp_ = tier_pss(private[0])
    figs.append(Figure("multinode", "two local ranks: CPU tier memory (PSS, both ranks)", "bytes", ps, pp,
                       "a copy per rank", higher_is_better=False,
                       target="about 1x the tier, not 2x",
                       note=f"{ps / tier:.2f}x vs {pp / tier:.2f}x the tier ({tier / 2**20:.0f} MiB); the ranks' RSS "
                            f"grew {rs_ / tier:.2f}x vs {rp_ / tier:.2f}x (RSS counts a shared page in every rank)"))
    figs += _cora(work)
    print()
    for f in figs:
        ratio = f"{f.ratio:.3f}" if f.ratio is not None else "-"
        print(f"{f.figure:80} ours {f.ours:>14,.4g}  ref {f.reference if f.reference is not None else '-':>14,.4g}  "
              f"ratio {ratio}  {f.note}")
    return figs


def _cora(work: Path) -> list[Figure]:
    """Two sharded nodes against one process (full neighbourhoods) and one node of two ranks (sampled)."""
    import numpy as np

    from planner.handoff import PlanTargets, StoreTarget
    from training.data import open_dataset
    from training.hotness import HotnessSpec, get_hotness
    from training.importers import import_dataset
    from training.place.nodes import place_sharded
    from training.place.specs import PolicySpec, ShardSpec, TierSpec

    # the real Cora of ../shared/fixtures (MOMENT_SHARED moves it, as for the tests)
    src = Path(os.environ.get("MOMENT_SHARED", REPO.parent / "shared")) / "fixtures" / "graphs" / "cora"
    if not src.exists():
        print(f"{src} not found: no Cora figures")
        return []
    cora = work / "cora"
    if not (cora / "meta.json").exists():
        import_dataset(src, cora)
    ds = open_dataset(cora)
    d = work / "cora-shards"
    if not (d / "shards.json").exists():
        hot = get_hotness(ds, HotnessSpec("presample", fanouts=(-1, -1), batch_size=35, epochs=1.0))
        t = PlanTargets("host memory", gpus=(("gpu0", "s0"),), stores=(StoreTarget("mem0", "cpu", "mem0", "s0", 1.0),))
        place_sharded(ds.features, hot.values, t, d, TierSpec(cpu_cache_bytes=ds.num_nodes * ds.row_bytes),
                      PolicySpec(), ShardSpec(nodes=2, replicas=2, hot_rows=0.05), fsync=False)
    nodes = [str(d / "node0"), str(d / "node1")]
    figs = []
    # full neighbourhoods, no dropout: every batch and every update is one process's (dropout would draw from
    # each rank's own stream); sampled, with dropout: one node of two ranks draws exactly what two nodes do
    for fan, drop, ref_local, label in (([-1, -1], 0.0, 0, "one process"),
                                        ([25, 10], 0.5, 2, "one node, 2 ranks, features in memory")):
        cfg = dict(dataset=str(cora), model="sage", fanouts=fan, batch_size=35, epochs=20, eval_every_epochs=0,
                   hidden=64, seed=1, lr=0.01, dropout=drop, weight_decay=5e-4, normalize_features=True,
                   backend="posix", remote_cache=200 * ds.row_bytes)
        tag = "full" if fan[0] < 0 else "sampled"
        print(f"  cora-{tag} ...", flush=True)
        a = run_job(work, f"cora-{tag}-shards", cfg, nodes)
        b = run_job(work, f"cora-{tag}-ref", cfg, [None], local=max(1, ref_local))
        la = [s["loss"] for s in next(r for r in a if r["rank"] == 0)["steps"]]
        lb = [s["loss"] for s in next(r for r in b if r["rank"] == 0)["steps"]]
        diff = float(np.max(np.abs(np.array(la) - np.array(lb))))
        acc_a, acc_b = last(a).get("test_acc"), last(b).get("test_acc")
        figs.append(Figure("multinode", f"Cora test accuracy, 2 sharded nodes vs {label} (fan-outs {fan}, "
                                        f"dropout {drop})",
                           "accuracy", acc_a, acc_b, label,
                           target="the same accuracy (the same losses where the sampling is the same)",
                           note=f"largest step-loss difference {diff:.2e} over {len(la)} steps"))
    return figs


if __name__ == "__main__":
    sys.exit(main())
