"""Node-shared SSD reads for a data-parallel run: the node's ranks, found, checked and joined by a gloo group.

The store's side (the union of a step's SSD rows, split by page, read into a
node-shared buffer) is :mod:`iostack.nodeshare`, a tier wrapping the store's SSD
tier in the store the training steps gather through
(:func:`iostack.nodeshare.with_node_shared_reads`); this module gives it the ranks
of this node (:class:`GlooNodeExchange`) and decides, the same way on every
rank, where it is used (:func:`setup_node_shared_reads`):

* on a node with more than one local rank, all of them reading SSD bins
  through a placement's store (host reads: not KvikIO's device reads), with
  the same number of training steps per epoch, unless the run turns it off
  (``IOSpec.node_shared_reads``, ``moment train --no-node-shared-reads``);
* the node's ranks are those that report the same host name and node number
  (``GROUP_RANK``, set by ``torchrun``), with local ranks ``0..n-1`` of a
  ``LOCAL_WORLD_SIZE`` of ``n``; any other sight (a rank alone on its node, a
  rank of another node claiming the same node, differing step counts) leaves
  that node on private reads.

The exchange runs on a gloo group of the node's ranks created for it alone and
used only from the prefetch thread, so its collectives never interleave with
DDP's (which run on the trainer's thread, on other groups). Only training
steps take part: every rank of a node runs the same number of them, in the
same order; evaluation gathers read privately.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from iostack.nodeshare import node_shared_reads_blocked, with_node_shared_reads
from iostack.store import FeatureStore
from momentbase.jsontypes import JsonObject
from training.distributed import World, peer_errors
from training.features import FeatureSource


class GlooNodeExchange:
    """:class:`iostack.nodeshare.NodeExchange` over a ``torch.distributed`` group of one node's ranks.

    ``group``: a gloo group of exactly the node's ranks; ``rank``: this
    process's index in it; ``size``: its size. A peer lost or hung past the
    group's timeout raises :class:`~training.sharded.exchange.PeerLostError`.
    """

    # Any: a torch.distributed process group (ProcessGroup is not a public type across torch versions)
    def __init__(self, group: Any, rank: int, size: int) -> None:
        self.group, self.rank, self.size = group, int(rank), int(size)

    def exchange(self, keys: np.ndarray) -> list[np.ndarray]:
        import torch.distributed as dist

        t = torch.from_numpy(np.ascontiguousarray(keys, np.int64))
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        with peer_errors("exchanging SSD row ids with this node's ranks"):
            dist.all_gather(sizes, torch.tensor([t.numel()], dtype=torch.int64), group=self.group)
            longest = max(int(s) for s in sizes)
            padded = torch.zeros(longest, dtype=torch.int64)  # all_gather wants one shape on every rank
            padded[:t.numel()] = t
            parts = [torch.empty(longest, dtype=torch.int64) for _ in range(self.size)]
            dist.all_gather(parts, padded, group=self.group)
        return [p[:int(s)].numpy() for p, s in zip(parts, sizes, strict=True)]

    def barrier(self, ok: bool = True) -> bool:
        import torch.distributed as dist

        flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
        with peer_errors("waiting for this node's ranks to read their share of a step's SSD pages"):
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())


@dataclass(frozen=True)
class NodeReads:
    """Whether this rank's training gathers share their SSD reads with its node (``on``), and why (not).

    ``features``: what the training steps gather through: the store composed
    with node-shared reads when on (evaluation keeps the store it came from),
    else the features given.
    """

    on: bool
    why: str
    ranks: int = 1
    features: FeatureSource | None = None

    def to_dict(self) -> JsonObject:
        return {"on": self.on, "why": self.why, "ranks": self.ranks}


def _node_decision(members: list[dict]) -> str | None:
    """Why a node's ranks (their reports, in rank order) cannot share reads; None: they can."""
    if len(members) < 2:
        return "one rank on this node"
    for m in members:
        if m["why"] is not None:
            return f"local rank {m['local_rank']}: {m['why']}"
    if sorted(m["local_rank"] for m in members) != list(range(len(members))) or \
            any(m["local_size"] != len(members) for m in members):
        return (f"the node's ranks report local ranks {sorted(m['local_rank'] for m in members)} of "
                f"{sorted({m['local_size'] for m in members})}: not one node's ranks 0..n-1")
    if len({m["steps"] for m in members}) != 1:
        return f"the node's ranks run different numbers of steps ({sorted({m['steps'] for m in members})})"
    return None


def setup_node_shared_reads(wanted: bool, world: World, features: FeatureSource, steps: int, timeout_s: float
                            ) -> NodeReads:
    """Turn node-shared SSD reads on for this rank's store where its whole node can (see the module doc).

    Every rank must call it, at the same point (it makes collective calls on
    the world's default group when there is more than one rank).
    """
    if world.size <= 1:
        return NodeReads(False, "one rank", features=features)
    store = features if isinstance(features, FeatureStore) else None
    if not wanted:
        why = "turned off (--no-node-shared-reads)"
    elif store is None:  # in memory, or a placement sharded across nodes (its local store is not wired in)
        why = f"features from {type(features).__name__}, not one placement's store"
    else:
        why = node_shared_reads_blocked(store)
    me = {"host": socket.gethostname(), "node": os.environ.get("GROUP_RANK", str(world.rank // world.local_size)),
          "local_rank": world.local_rank, "local_size": world.local_size, "steps": int(steps), "why": why,
          "token": secrets.token_hex(6), "rank": world.rank}
    everyone = world.gather_objects(me, during="finding this node's ranks for shared SSD reads")
    nodes: dict[tuple[str, str], list[dict]] = {}
    for m in everyone:
        nodes.setdefault((m["host"], m["node"]), []).append(m)
    import torch.distributed as dist

    mine, group = nodes[(me["host"], me["node"])], None
    for key in sorted(nodes, key=lambda k: min(m["rank"] for m in nodes[k])):  # the same order on every rank
        members = nodes[key]
        if _node_decision(members) is None:
            # every rank of the world creates every node's group (torch requires it), in the same order
            g = dist.new_group([m["rank"] for m in members], timeout=timedelta(seconds=float(timeout_s)),
                               backend="gloo")
            if members is mine:
                group = g
    reason = _node_decision(mine)
    if group is None:
        return NodeReads(False, reason or "no group", features=features)
    lead = next(m for m in mine if m["local_rank"] == 0)
    ordered = sorted(m["rank"] for m in mine)
    # cannot be refused after the check above (a refusal would raise, never leave the others waiting)
    steps = with_node_shared_reads(store, GlooNodeExchange(group, ordered.index(world.rank), len(mine)),
                                   f"nsr-{lead['token']}")
    return NodeReads(True, f"the SSD pages of each training step read once by this node's {len(mine)} ranks",
                     len(mine), steps)


def ssd_reads(features: FeatureSource, since: JsonObject | None = None) -> JsonObject:
    """What this rank read from the SSD bins (``ssd_reads``: pages, requests, distinct rows) and its node-shared
    reads' waits (``node_shared_reads``), since ``since`` (an earlier return) when given; {} without a store.

    With node-shared reads on these are this rank's part of its node's reads, not the rows its batches used
    (those are the epoch's ``tiers``).
    """
    store = features if isinstance(features, FeatureStore) else None
    if store is None:
        return {}
    t = store.tier_stats().get("ssd", {})
    now = {"ssd_reads": {k: int(t.get(k, 0)) for k in ("pages", "requests", "read_rows")}}
    nr = store.node_shared_reads
    if nr is not None:
        now["node_shared_reads"] = {"on": nr.off is None, "fell_back": nr.off, "wait_s": nr.wait_s,
                                    "exchange_s": nr.exchange_s}
    if since is None:
        return now
    out = {"ssd_reads": {k: v - since["ssd_reads"][k] for k, v in now["ssd_reads"].items()}}
    if nr is not None:
        was = since.get("node_shared_reads", {})
        out["node_shared_reads"] = {
            **now["node_shared_reads"],
            **{k: now["node_shared_reads"][k] - was.get(k, 0.0) for k in ("wait_s", "exchange_s")},
        }
    return out
__all__ = ["GlooNodeExchange", "NodeReads", "setup_node_shared_reads", "ssd_reads"]
