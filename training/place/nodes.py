"""Placing a dataset's feature rows across several nodes: the layout, then every node's own bins.

:func:`place_sharded` is ``moment place --nodes N``: the rows are split over the
nodes by :func:`iostack.shards.shard_rows` (the hottest ``hot_rows`` held by
``replicas`` nodes, DDStore's width; every other row by one), then each node's
rows are placed into that node's GPU, CPU and SSD bins exactly as one machine's
(:func:`training.place.policy.place`: DDAK on the plan's targets, with the hotness
of the node's rows; with a plan per node, each node's own plan; where the rows follow
a partition, each node's own reads and the reads it serves). Node ``k`` gets a directory of its own, ``out/node<k>``,
with everything it needs and nothing it does not:

* ``placement.json``, ``bin_of.npy``, ``row_of.npy``: its bins over its
  *local ids* (its rows in increasing global id);
* ``rows.npy``: its rows of the feature matrix (``[local rows, dim]``): what
  its cache tiers are filled from, so a node needs no copy of the dataset's
  ``features.npy`` (only the graph, labels and splits); ``rows.npy.sums.json``
  its CRC-32 per 1 MiB block (:mod:`iostack.npysums`), checked for the rows
  the caches take when training fills them;
* its SSD bin files (under ``<ssd>/node<k>`` for each ``--ssd``; inside its
  directory when ``--ssd`` is ``--out``);
* ``shards.json``, ``owner.npy``, ``width.npy``: the layout (which node owns
  which rows), with the node's number and the dataset's fingerprint;
  ``hotness.npy``: what the locality cache of remote rows is chosen by, unless
  ``halo.npy`` lists them (rows that follow a partition: the remote rows the
  node's own batches read most, :mod:`training.place.node_reads`);
  ``place.json``: the report (with the node's own plan).

``out`` itself gets the layout (``shards.json`` with ``node: null``) and a
summary ``place.json``, so ``--placement out`` works where every node sees
``out`` (a shared file system, or one machine), and ``--placement
out/node<k>`` where each node has only its own directory.

>>> import numpy as np, tempfile
>>> from planner.handoff import PlanTargets, StoreTarget
>>> from training.place.specs import PolicySpec, ShardSpec, TierSpec
>>> t = PlanTargets("toy", gpus=(("gpu0", "s0"),), stores=(StoreTarget("mem0", "cpu", "mem0", "s0", 1.0),))
>>> feats = np.arange(20, dtype=np.float32).reshape(10, 2)
>>> with tempfile.TemporaryDirectory() as d:
...     sp = place_sharded(feats, np.arange(10.0), t, d, TierSpec(cpu_cache_bytes=80), PolicySpec(),
...                        ShardSpec(nodes=2, replicas=2, hot_rows=0.2))
...     [n.rows for n in sp.nodes], sorted(p.name for p in Path(d, "node0").iterdir())[:4]
([6, 6], ['bin_of.npy', 'hotness.npy', 'owner.npy', 'place.json'])
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iostack.bins import write_bins
from iostack.npysums import write_sums
from iostack.placement import MANIFEST, save_json, save_npy
from iostack.shards import SHARDS, ShardLayout, shard_rows
from momentbase.jsontypes import JsonObject
from momentbase.space import reserve
from planner.handoff import PlanTargets
from planner.progress import Progress
from training.place.bins import PlacingError, build_bins, check_free_space
from training.place.node_reads import NodeHotness
from training.place.policy import PlaceResult, place
from training.place.specs import PolicySpec, ShardSpec, TierSpec

#: rows copied per block into a node's rows.npy
BLOCK_ROWS = 1 << 16
#: a node's locality cache's rows, hottest first (global ids; written when the rows follow a partition)
HALO = "halo.npy"


@dataclass(frozen=True)
class NodePlacement:
    """One node's part: its directory, how many rows it holds, and its placement with the report."""

    node: int
    directory: Path
    rows: int
    result: PlaceResult


@dataclass(frozen=True)
class ShardedPlacement:
    """A layout over nodes and every node's placement; ``row_bytes`` per feature row."""

    layout: ShardLayout
    nodes: tuple[NodePlacement, ...]
    row_bytes: int

    def replica_share(self) -> float:
        """Rows held per node over the rows a full replica holds, averaged over the nodes (1/N without replicas)."""
        v = self.layout.num_vertices
        return float(np.mean([n.rows / v for n in self.nodes])) if v else 0.0


def node_dir(out: str | os.PathLike[str], node: int) -> Path:
    return Path(out) / f"node{node}"


def place_sharded(features: np.ndarray, hotness: np.ndarray, targets: PlanTargets | Sequence[PlanTargets],
                  out: str | os.PathLike[str], tiers: TierSpec, policy: PolicySpec, shards: ShardSpec, *,
                  reads_per_epoch: np.ndarray | None = None, report: Mapping[str, Any] | None = None,
                  progress: Progress | None = None, fsync: bool = True,
                  layout: ShardLayout | None = None, node_hot: NodeHotness | None = None) -> ShardedPlacement:
    """Split ``features`` (``[V, dim]``, may be a memmap) over ``shards.nodes`` nodes and write each node's directory.

    ``hotness`` (``[V]``) orders the rows for the layout (the hottest
    ``shards.hot_rows`` share on ``shards.replicas`` nodes) and drives each
    node's ``policy``; ``reads_per_epoch`` (``[V]`` or None) gives the report
    its SSD bytes; the caches and SSD directories of ``tiers`` are per node
    (each node gets ``<ssd>/node<k>``), as for one machine. ``report``: fields
    every ``place.json`` starts with (the dataset, its fingerprint under
    ``dataset_fingerprint``, the hotness). Nothing under ``out`` is the
    placement until the last file of it is written (``placement.json`` per
    node, then the root's ``shards.json``).

    ``targets``: one plan's targets for every node, or one per node (each
    node's own plan, resolved for its caches). ``node_hot``: each node's
    hotness over its rows and its locality cache's order
    (:func:`training.place.node_reads.node_hotness`, rows that follow a
    partition); DDAK then places each node's rows by its own reads and the
    reads it serves, and every node directory gets ``halo.npy`` (global ids,
    the locality cache's order). None: ``hotness`` restricted to the node's rows.

    Raises
    ------
    PlacingError
        ``hotness``, ``layout`` or ``node_hot`` of another length than the features, ``targets`` for another
        number of nodes, too little free space.
    """
    feats = features.reshape(-1, 1) if features.ndim == 1 else features
    num_rows, dim = int(feats.shape[0]), int(feats.shape[1])
    if num_rows != np.asarray(hotness).shape[0]:
        raise PlacingError(f"hotness has {np.asarray(hotness).shape[0]} rows, the features {num_rows}")
    row_bytes = dim * np.dtype(feats.dtype).itemsize
    num_nodes = int(shards.nodes)
    if layout is None:
        layout = shard_rows(hotness, num_nodes, int(shards.replicas), shards.hot_row_count(num_rows),
                            groups=int(shards.groups))
    elif layout.num_vertices != num_rows or layout.num_nodes != num_nodes:
        raise PlacingError(f"the layout covers {layout.num_vertices} rows over {layout.num_nodes} nodes, the "
                           f"features {num_rows} rows over `nodes` {num_nodes}")
    per_node = _per_node(targets, layout, node_hot)
    head = dict(report or {})
    fp = head.get("dataset_fingerprint")
    hot32 = np.asarray(hotness, np.float32)
    nodes = []
    for k in range(layout.num_nodes):
        rows = layout.rows_of(k)
        node_hotness = node_hot.hotness[k] if node_hot is not None else hot32[rows]
        reads = (float(node_hotness.sum()) if node_hot is not None else
                 float(np.asarray(reads_per_epoch)[rows].sum()) if reads_per_epoch is not None else None)
        res, d = _place_node(k, rows, node_hotness, per_node[k], out, tiers, policy, row_bytes, reads)
        if progress is not None:
            progress(f"node {k}: writing {rows.size:,} rows", 0, None)
        local = _write_rows(feats, rows, d / "rows.npy")
        write_bins(local, res.placement, d, fsync=fsync)
        del local
        save_npy(d / "hotness.npy", hot32)
        if node_hot is not None:  # the locality cache's rows, in the order training takes them
            save_npy(d / HALO, node_hot.halo[k])
        else:
            (d / HALO).unlink(missing_ok=True)
        layout.save(d, node=k, extra={"dataset_fingerprint": fp, "rows": int(rows.size)})
        save_json(d / "place.json", {**head, "node": k, "num_nodes": layout.num_nodes, "rows": int(rows.size),
                                       **_node_report(res, per_node[k], node_hot, k)})
        res.placement.save(d, dataset_fingerprint=fp)  # last: the node's placement exists only once its bins do
        nodes.append(NodePlacement(k, d, int(rows.size), res))
    sp = ShardedPlacement(layout, tuple(nodes), row_bytes)
    save_json(Path(out) / "place.json", {**head, **sharded_summary(sp)})
    layout.save(out, node=None, extra={"dataset_fingerprint": fp, "nodes": [f"node{k}" for k in range(num_nodes)]})
    return sp


def _per_node(targets: PlanTargets | Sequence[PlanTargets], layout: ShardLayout,
              node_hot: NodeHotness | None) -> list[PlanTargets]:
    """Every node's targets (one plan for all, or one each), with ``node_hot`` checked against the layout."""
    per_node = [targets] * layout.num_nodes if isinstance(targets, PlanTargets) else list(targets)
    if len(per_node) != layout.num_nodes:
        raise PlacingError(f"{len(per_node)} plans for {layout.num_nodes} nodes: give one plan, or one per node")
    if node_hot is not None:
        sizes = [h.size for h in node_hot.hotness]
        want = [int(layout.rows_of(k).size) for k in range(layout.num_nodes)]
        if sizes != want:
            raise PlacingError(f"`node_hot` has hotness for {sizes} rows per node, the layout holds {want}")
    return per_node


def _place_node(k: int, rows: np.ndarray, hot: np.ndarray, targets: PlanTargets, out: str | os.PathLike[str],
                tiers: TierSpec, policy: PolicySpec, row_bytes: int, reads: float | None) -> tuple[PlaceResult, Path]:
    """Node ``k``'s directory made and its rows (``hot`` over them) placed into its bins by its plan's targets."""
    d = node_dir(out, k)
    d.mkdir(parents=True, exist_ok=True)
    for stale in (d / MANIFEST, d / SHARDS):  # an old node index never stands over new bins
        stale.unlink(missing_ok=True)
    ssd = [node_dir(s, k) if Path(s).resolve() != Path(out).resolve() else d for s in tiers.ssd_dirs]
    bins = build_bins(targets, num_rows=int(rows.size), row_bytes=row_bytes,
                      gpu_cache_bytes=tiers.gpu_cache_bytes, cpu_cache_bytes=tiers.cpu_cache_bytes, ssd_dirs=ssd,
                      out_dir=d, gpu_mode=tiers.gpu_mode)
    res = place(np.asarray(hot, np.float32), bins, targets, row_bytes=row_bytes, strategy=policy.strategy,
                pool=policy.pool, seed=policy.seed, reads_per_epoch=reads)
    check_free_space(res.placement, row_bytes, d)
    return res, d


def _node_report(res: PlaceResult, targets: PlanTargets, node_hot: NodeHotness | None, k: int) -> JsonObject:
    """Node ``k``'s ``place.json`` fields past the head: its plan, what its hotness was, its bins and reports."""
    return {"plan": targets.source, "machine": targets.machine,
            "node_hotness": "its own reads and those it serves" if node_hot is not None
            else "the dataset's, over its rows",
            "halo_rows": int(node_hot.halo[k].size) if node_hot is not None else None,
            "node_presample_epochs": node_hot.epochs if node_hot is not None else None,
            "bins": [asdict(b) for b in res.bins], "report": asdict(res.report),
            "baseline": asdict(res.baseline) if res.baseline else None, "target_notes": list(res.notes)}


def sharded_summary(sp: ShardedPlacement) -> dict[str, Any]:
    """The root ``place.json`` fields: nodes, replicas, rows and bytes per node, the replicated share."""
    lay = sp.layout
    return {"num_nodes": lay.num_nodes, "replicas": lay.replicas, "groups": lay.groups, "hot_rows": lay.hot_rows,
            "digest": lay.digest(), "row_bytes": sp.row_bytes,
            "nodes": [{"node": n.node, "directory": str(n.directory), "rows": n.rows,
                       "bytes": n.rows * sp.row_bytes, "ssd_share": n.result.report.ssd_share}
                      for n in sp.nodes],
            "rows_per_node_share": sp.replica_share()}


def _write_rows(feats: np.ndarray, rows: np.ndarray, path: Path) -> np.ndarray:
    """``feats[rows]`` to ``path`` (a .npy written block by block, renamed into place); its memmap."""
    tmp = path.with_name(f".{path.name}.tmp")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=feats.dtype, shape=(int(rows.size), feats.shape[1]))
    try:
        reserve(tmp)  # before the first store: a full disk is a one-line error, not SIGBUS
        for a in range(0, rows.size, BLOCK_ROWS):
            out[a:a + BLOCK_ROWS] = feats[rows[a:a + BLOCK_ROWS]]
        out.flush()
        del out
        os.replace(tmp, path)
        write_sums(path)  # what the node's caches are filled from is checked block by block when they are
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return np.load(path, mmap_mode="r")


__all__ = ["NodePlacement", "ShardedPlacement", "node_dir", "place_sharded", "sharded_summary"]
