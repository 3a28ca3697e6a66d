"""Replica groups in the exchange: which ranks a rank trades rows with when the layout has ``groups > 1``.

A layout of ``groups`` full replicas (:mod:`iostack.shards`, DDStore's width)
serves every row a node lacks from a node of its own group, so the exchange
need not span the job: each group gets a process group of its own ranks
(``torch.distributed.new_subgroups_by_enumeration``), and a rank's requests are
indexed by rank *within* that group. The whole job still meets in the
trainer's gradient all-reduce and the epoch figures (the world group).

>>> import numpy as np
>>> from iostack.shards import shard_rows
>>> lay = shard_rows(np.arange(8.0), num_nodes=4, groups=2)
>>> ranks_of = ((0, 1), (2, 3), (4, 5), (6, 7))  # two ranks on each of 4 nodes, node k holding shard k
>>> group_ranks(lay, ranks_of)
[[0, 1, 2, 3], [4, 5, 6, 7]]
>>> v = group_view(lay, ranks_of, shard=2, server_ranks=np.array([1, 3, 5, 7]))  # rank 5 asks local rank 1s
>>> v.ranks, v.server.tolist()
((4, 5, 6, 7), [-1, -1, 1, 3])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from iostack.shards import ShardLayout


@dataclass(frozen=True)
class GroupView:
    """This rank's replica group: its global ranks (increasing) and, per shard, the group-local rank asked (-1: not
    in the group, never asked)."""

    ranks: tuple[int, ...]
    server: np.ndarray


def group_ranks(layout: ShardLayout, ranks_of: Sequence[Sequence[int]]) -> list[list[int]]:
    """The global ranks of every replica group, group by group, each increasing (what every rank enumerates alike).

    ``ranks_of[shard]``: the ranks holding each shard (:class:`training.sharded.features.Membership`).
    """
    s = layout.group_size
    return [sorted(r for shard in range(g * s, g * s + s) for r in ranks_of[shard]) for g in range(layout.groups)]


def group_view(layout: ShardLayout, ranks_of: Sequence[Sequence[int]], shard: int,
               server_ranks: np.ndarray) -> GroupView:
    """The group of the rank holding ``shard``, and ``server_ranks`` (per shard, the global rank it asks) as ranks
    within that group."""
    mine = tuple(group_ranks(layout, ranks_of)[int(shard) // layout.group_size])
    pos = {r: i for i, r in enumerate(mine)}
    server = np.array([pos.get(int(r), -1) for r in server_ranks], np.int64)
    return GroupView(mine, server)


@dataclass(frozen=True)
class ExchangePeers:
    """Whom a rank's exchange addresses: ``server`` (per shard, the index into its requests: a rank of ``size``),
    ``groups`` (every replica group's ranks, for a process group of each; None: the exchange spans the job) and
    ``ranks`` (the ranks its requests can reach, for the startup note)."""

    server: np.ndarray
    size: int
    groups: list[list[int]] | None
    ranks: tuple[int, ...]


def exchange_peers(layout: ShardLayout, ranks_of: Sequence[Sequence[int]], shard: int, server_ranks: np.ndarray,
                   world_size: int, exchange: str) -> ExchangePeers:
    """The peers of the rank holding ``shard`` under ``exchange`` (``alltoall`` or ``rpc``).

    One group (or one rank): the whole job, requests indexed by global rank. Replica groups with the
    ``alltoall`` exchange: a process group per replica group and requests indexed by rank within it (a
    collective spans the ranks that take part). With ``rpc`` (one-sided: a request goes to the rank it is
    indexed by, and only ranks with requests are asked) requests stay indexed by global rank, in one RPC world:
    :meth:`~iostack.shards.ShardLayout.server_of` names only nodes of the asking node's group, so the
    non-empty requests are those of the group's ranks.
    """
    server = np.asarray(server_ranks, np.int64)
    if layout.groups <= 1 or world_size <= 1:
        return ExchangePeers(server, int(world_size), None, tuple(range(int(world_size))))
    view = group_view(layout, ranks_of, shard, server)
    if exchange == "alltoall":
        return ExchangePeers(view.server, len(view.ranks), group_ranks(layout, ranks_of), view.ranks)
    return ExchangePeers(server, int(world_size), None, view.ranks)


__all__ = ["ExchangePeers", "GroupView", "exchange_peers", "group_ranks", "group_view"]
