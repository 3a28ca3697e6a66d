"""The remote-row cache of a sharded run filling on access against its static fill, under a drifting hot set (not a
test).

    PYTHONPATH=. python tools/bench_dyncache_remote.py [--parts 4] [--nodes 100000] [--dim 16] [--epochs 6]
        [--batches 20] [--batch 512] [--cache-share 0.05] [--repeats 3] [--json F]

The graph and seeds are ``tools/bench_dyncache.py``'s drifting ones (every vertex's neighbours near it in id or
in a power-law hot set; epoch ``e`` trains on a window of ids that moves by ``--shift`` an epoch), placed over
``--parts`` nodes by ``place_sharded`` (rows by hotness, no hot-row replication). Every node trains on batches of
its own from the window (seeds drawn per node, sampled once with the project's ``NeighborSampler`` and gathered
the same by every configuration). The nodes are in-process: each a real :class:`ShardedFeatures` over its own
node directory, asking the others through an exchange that calls their ``serve`` (no network: rows are counted,
as in ``tools/bench_partition_place.py``, and the seeds/s are those of the gathers in one process, the holders'
reads included). Each node's remote cache holds ``--cache-share`` of the rows, warm-started with the static fill
(the node's hottest remote rows by a pre-sampling of epoch 0, as ``_halo_rows`` picks them from the placement's
hotness); ``static`` keeps that fill, every other policy of :data:`iostack.cachepolicy.CACHE_POLICIES` fills on
access (:class:`training.sharded.remote_cache.DynamicRemoteCache`). Per epoch, over all nodes: the remote share
(rows fetched from another node over the rows gathered) and the remote cache's hit rate (cache rows over the
rows not held by the node). Configurations run interleaved, ``--repeats`` times: shares do not vary between
repeats (same batches, deterministic policies), seeds/s is the median with its range.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _results import Figure, write
from bench_dyncache import drift_arguments, drifting_graph, epoch_seeds, per_epoch_note

from iostack.cachepolicy import CACHE_POLICIES
from iostack.placement import load_placement
from iostack.store import FeatureStore
from planner.handoff import PlanTargets, StoreTarget
from training.place.nodes import place_sharded
from training.place.specs import PolicySpec, ShardSpec, TierSpec
from training.sampler import NeighborSampler
from training.sharded.features import ShardedFeatures
from training.sharded.remote_cache import RemoteCache, cache_rows, with_policy

TARGETS = PlanTargets("bench", gpus=(("gpu0", "s0"),), stores=(StoreTarget("mem0", "cpu", "mem0", "s0", 1.0),))


class InProcessExchange:
    """``requests[p]`` served by node ``p``'s :meth:`ShardedFeatures.serve`, in this process."""

    name = "in-process"

    def __init__(self, serves: dict, dim: int) -> None:
        self.serves, self.dim = serves, dim

    def fetch(self, requests: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.serves[p](r) if r.numel() else torch.empty((0, self.dim)) for p, r in enumerate(requests)]

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def open_nodes(root: Path, parts: int, dim: int) -> list[ShardedFeatures]:
    """Every node's :class:`ShardedFeatures` over its directory under ``root``, exchanging in-process."""
    from iostack.shards import load_layout

    serves: dict = {}
    nodes = []
    for k in range(parts):
        nd = root / f"node{k}"
        lay, _ = load_layout(nd)
        store = FeatureStore(load_placement(nd), nd, features=np.load(nd / "rows.npy"), backend="posix",
                             backend_options={"processes": 0})
        f = ShardedFeatures(store, lay, k, lay.local_index(k), np.arange(parts), parts,
                            InProcessExchange(serves, dim))
        serves[k] = f.serve
        nodes.append(f)
    return nodes


def run_config(policy: str, nodes: list[ShardedFeatures], warm: list[np.ndarray], capacity: int,
               epochs: list[list[list[np.ndarray]]], seeds_per_batch: int) -> tuple[list[float], list[float], float]:
    """Every epoch's steps (a batch on every node) with remote caches of ``policy``: remote share and hit rate per
    epoch, seeds/s over all epochs."""
    for f, ids in zip(nodes, warm, strict=True):
        static = RemoteCache(ids, f.layout.num_vertices, rows=f.fetch_remote(torch.from_numpy(ids)).clone())
        f.cache = with_policy(static, capacity, policy)
    shares, rates, seconds, seeds = [], [], 0.0, 0

    def counts() -> np.ndarray:
        return np.array([[f.totals().get(k, (0, 0))[0] for k in ("remote", "remote-cache")] for f in nodes]).sum(0)

    for epoch in epochs:
        before = counts()
        rows = 0
        t0 = time.perf_counter()
        for step in zip(*epoch, strict=True):
            for f, n_id in zip(nodes, step, strict=True):
                rows += n_id.size
                f.gather(torch.from_numpy(n_id))
        seconds += time.perf_counter() - t0
        seeds += len(epoch[0]) * len(nodes) * seeds_per_batch
        remote, hits = counts() - before
        shares.append(remote / rows)
        rates.append(hits / (hits + remote) if hits + remote else 0.0)
    for f in nodes:
        f.cache.close()
        f.cache = None
    return shares, rates, seeds / seconds


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    drift_arguments(ap, nodes=100_000, batches=20, window=10_000, shift=5_000)
    ap.add_argument("--parts", type=int, default=4, help="nodes the rows are sharded over")
    ap.add_argument("--cache-share", type=float, default=0.05, help="each node's remote cache, a share of the rows")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", help="where the node directories go (default: a temporary directory)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if "--dim" not in (argv if argv is not None else sys.argv):
        a.dim = 16  # rows are counted: a narrow row keeps the placement small
    return a


def _batches(a: argparse.Namespace, indptr: np.ndarray, indices: np.ndarray, epoch: int, node: int,
             seed: int) -> list[np.ndarray]:
    sampler = NeighborSampler(indptr, indices, tuple(int(f) for f in a.fanouts.split(",")), seed=seed)
    seeds = epoch_seeds(a.nodes, epoch, a.window, a.shift, a.batches, a.batch, a.seed * 1000 + node)
    return [sampler.sample(s).n_id.numpy() for s in seeds]


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    indptr, indices = drifting_graph(a.nodes, a.degree, a.local, a.hot_share, a.seed)
    feats = np.random.default_rng(a.seed).standard_normal((a.nodes, a.dim), np.float32)
    hot = np.zeros((a.parts, a.nodes), np.int64)  # pre-sampling: each node's epoch-0 seeds, another sampler draw
    for k in range(a.parts):
        for n_id in _batches(a, indptr, indices, 0, k, a.seed + 1000 + k):
            hot[k, n_id] += 1
    epochs = [[_batches(a, indptr, indices, e, k, a.seed + 10 * e + k) for k in range(a.parts)]
              for e in range(a.epochs)]
    capacity = int(a.cache_share * a.nodes)
    policies = CACHE_POLICIES.names()
    shares: dict[str, list[float]] = {}
    rates: dict[str, list[float]] = {}
    speeds: dict[str, list[float]] = {p: [] for p in policies}
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        place_sharded(feats, hot.sum(0).astype(np.float32), TARGETS, Path(tmp),
                      TierSpec(cpu_cache_bytes=feats.nbytes),
                      PolicySpec(), ShardSpec(nodes=a.parts, hot_rows=0.0), fsync=False)
        nodes = open_nodes(Path(tmp), a.parts, a.dim)
        try:
            warm = [cache_rows(hot[k], f._local.numpy() >= 0, capacity) for k, f in enumerate(nodes)]
            for _ in range(a.repeats):
                for p in policies:  # interleaved: the machine's load falls on every configuration alike
                    shares[p], rates[p], s = run_config(p, nodes, warm, capacity, epochs, a.batch)
                    speeds[p].append(s)
        finally:
            for f in nodes:
                f.close()
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    return report(a, policies, shares, rates, speeds, capacity, load0, load1)


OVERLAP = " (the ranges overlap: no difference shown)"


def _overlap(x: list[float], y: list[float]) -> bool:
    return min(x) <= max(y) and min(y) <= max(x)


def report(a: argparse.Namespace, policies: tuple[str, ...] | list[str], shares: dict[str, list[float]],
           rates: dict[str, list[float]], speeds: dict[str, list[float]], capacity: int, load0: list[str],
           load1: list[str]) -> int:
    """Print the table and write the figures (each dynamic policy against ``static`` of the same run)."""
    after = {p: float(np.mean(shares[p][1:] or shares[p])) for p in policies}
    hit = {p: float(np.mean(rates[p][1:] or rates[p])) for p in policies}
    med = {p: statistics.median(speeds[p]) for p in policies}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{a.parts} in-process nodes, {a.nodes:,} rows × {a.dim}, remote cache {capacity:,} rows a node "
          f"({a.cache_share:.0%}); {a.epochs} epochs × {a.batches} steps × {a.batch} seeds a node; window "
          f"{a.window:,} moving {a.shift:,}/epoch; {when}; load {' '.join(load0)} → {' '.join(load1)}; warm (rows in "
          "memory)")
    print(f"{'policy':8} {'remote share per epoch':44} {'hit rate per epoch':44} {'seeds/s (median, range)':>26}")
    for p in policies:
        rng = f"{med[p]:,.0f} ({min(speeds[p]):,.0f}–{max(speeds[p]):,.0f})"
        print(f"{p:8} {' '.join(f'{s:.3f}' for s in shares[p]):44} {' '.join(f'{r:.3f}' for r in rates[p]):44} "
              f"{rng:>26}")
    figs = []
    where = f"{a.parts} nodes (in-process, rows counted), drifting graph {a.nodes:,} rows, remote cache " \
            f"{a.cache_share:.0%} of the rows a node"
    for p in policies:
        if p == "static":
            continue
        figs.append(Figure("dyncache_remote", f"{where}, {p}: remote share, mean of epochs 1..{a.epochs - 1}",
                           "share", after[p], after["static"], "static fill (hottest remote rows at start)", False,
                           "below static", per_epoch_note(shares[p], shares["static"])))
        figs.append(Figure("dyncache_remote", f"{where}, {p}: remote cache hit rate, mean of epochs 1..{a.epochs - 1}",
                           "share", hit[p], hit["static"], "static fill", True, "above static",
                           per_epoch_note(rates[p], rates["static"])))
        figs.append(Figure("dyncache_remote", f"{where}, {p}: gather seeds/s in one process (median of {a.repeats})",
                           "seeds/s", med[p], med["static"], "static fill", True, "",
                           f"range {min(speeds[p]):,.0f}–{max(speeds[p]):,.0f} vs {min(speeds['static']):,.0f}–"
                           f"{max(speeds['static']):,.0f}" + (OVERLAP if _overlap(speeds[p], speeds["static"]) else "")
                           + f"; no network (in-process exchange); {when}; load {' '.join(load0)} → {' '.join(load1)}"))
    write(a.json, "dyncache_remote", figs, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
