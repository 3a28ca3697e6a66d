"""One rank of tests/test_distsample.py's torchrun launches: distributed sampling over a partition, checked.

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        tests/distsample_ranks.py DIR [--die-at STEP]

``DIR/part`` holds the partition (``partition.json``, ``indptr.npy``, ``part-K/indices.npy``),
``DIR/whole_indices.npy`` the whole relabelled ``indices`` for the reference. Each rank samples
its batches through :class:`training.distsample.DistributedNeighbours` on a process group of
its own (as a trainer gives it one beside DDP's), the heartbeat in torchrun's store, and
compares every batch with :class:`training.sampler.NeighborSampler` over the whole graph;
``DIR/rank<R>.json`` gets the comparison, or the one-line error when a peer died. With
``--die-at STEP`` the last rank exits (code 3) before that step, as a killed node does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.distsample import DistributedNeighbours, PartitionLayout  # noqa: E402
from training.heartbeats import Heartbeats  # noqa: E402
from training.launcher import bind_to_launcher  # noqa: E402
from training.sampler import NeighborSampler  # noqa: E402
from training.sharded.exchange import PeerLostError  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--die-at", type=int, default=None)
    a = ap.parse_args()
    bind_to_launcher()  # a killed agent takes its rank with it, as a node's death does
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=20))
    part = a.dir / "part"
    meta = json.loads((part / "partition.json").read_text())
    layout = PartitionLayout(tuple(meta["node_offsets"]), tuple(meta["edge_offsets"]))
    indptr = np.load(part / "indptr.npy", mmap_mode="r")
    local = np.load(part / f"part-{rank}" / "indices.npy", mmap_mode="r")
    beats = Heartbeats.for_job(every_s=0.2)
    source = DistributedNeighbours(local, layout, group=group, heartbeats=beats)
    sampler = NeighborSampler(indptr, source, (5, 3), seed=rank)
    ref = NeighborSampler(torch.from_numpy(np.asarray(indptr)), torch.from_numpy(np.load(a.dir / "whole_indices.npy")),
                          (5, 3), seed=rank)
    g = torch.Generator().manual_seed(rank)
    same, out = [], a.dir / f"rank{rank}.json"
    try:
        for step in range(30 if a.die_at is not None else 6):
            if a.die_at is not None and step == a.die_at and rank == size - 1:
                os._exit(3)
            seeds = torch.randperm(layout.node_offsets[-1], generator=g)[: 10 + step]
            b, r = sampler.sample(seeds), ref.sample(seeds)
            same.append(torch.equal(b.n_id, r.n_id) and torch.equal(b.edge_index, r.edge_index))
        source.finish()
    except PeerLostError as exc:
        out.write_text(json.dumps({"error": str(exc), "same": same}))
        os._exit(2)
    out.write_text(json.dumps({"same": same, "stats": source.stats.as_dict()}))
    source.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
