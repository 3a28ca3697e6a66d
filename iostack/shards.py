"""A feature matrix sharded across nodes: which nodes hold each row, and each node's own rows.

DDStore's layout with a hotness twist: every row has an *owner* node and a
*width* (1 up to ``replicas``, DDStore's replication knob): it is held by the
nodes ``owner, owner + 1, ..., owner + width - 1`` (mod the node count).
:func:`shard_rows` makes one: rows are dealt to the nodes in order of falling
hotness (row ``i`` of that order to node ``i mod N``), so every node owns as
many rows and as much of the traffic as any other; the ``hot_rows`` hottest
are held by ``replicas`` nodes, the rest by their owner alone.

A node stores its rows under *local ids*: ``0..rows-1`` in increasing global
id (:meth:`ShardLayout.local_index`). A row a node does not hold is fetched
from :meth:`ShardLayout.server_of` it, a holder chosen so that requesters
spread over the holders of a replicated row.

:meth:`ShardLayout.save` writes ``shards.json`` with ``owner.npy`` and
``width.npy`` into a node's directory (and, with ``node=None``, the job's
root directory); :meth:`ShardLayout.digest` names the layout, so nodes
started on different layouts find out before they train.

>>> import numpy as np
>>> lay = shard_rows(np.array([5, 1, 9, 0, 3, 7], np.float32), num_nodes=2, replicas=2, hot_rows=2)
>>> lay.owner.tolist(), lay.width.tolist()
([0, 0, 0, 1, 1, 1], [1, 1, 2, 1, 1, 2])
>>> lay.rows_of(0).tolist(), lay.rows_of(1).tolist()
([0, 1, 2, 5], [2, 3, 4, 5])
>>> lay.server_of(np.array([3, 4]), node=0).tolist()
[1, 1]

*Replica groups* (DDStore's width proper, ``groups``): the ``N`` nodes form
``groups`` full replicas of ``N / groups`` consecutive nodes each (group ``g``:
nodes ``g*S .. g*S + S - 1``, ``S = N / groups``); every group holds every row
once (``owner`` is then a position ``0..S-1`` inside a group, the same in each
group), and a node is served only by the nodes of its own group, so the
exchange never crosses groups. ``groups == 1`` is the layout above;
``shards.json`` names ``groups`` only when it is more than 1, so layouts
written before it read back as they were.

>>> g = shard_rows(np.array([5, 1, 9, 0, 3, 7], np.float32), num_nodes=4, groups=2)
>>> g.owner.tolist(), g.rows_of(0).tolist(), g.rows_of(2).tolist(), g.rows_of(3).tolist()
([0, 0, 0, 1, 1, 1], [0, 1, 2], [0, 1, 2], [3, 4, 5])
>>> g.server_of(np.array([3, 4]), node=0).tolist(), g.server_of(np.array([3, 4]), node=2).tolist(), g.group_nodes(3)
([1, 1], [3, 3], [2, 3])
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iostack.errors import StoreError
from iostack.placement import save_json, save_npy

#: the layout's manifest in a node's (or the job's) directory
SHARDS = "shards.json"

#: the most nodes a layout spans (owners are int16)
MAX_NODES = 1 << 15


@dataclass(frozen=True, eq=False)
class ShardLayout:
    """Rows of ``num_vertices`` vertices over ``num_nodes`` nodes.

    ``owner`` (int16 ``[V]``): the first node holding each row (with
    ``groups > 1``: its position in every group); ``width`` (uint8 ``[V]``,
    ``1..replicas``): how many consecutive nodes (mod the group size) from the
    owner hold it. ``hot_rows``: rows held by more than one node of a group
    (what :func:`shard_rows` was asked to replicate); ``groups``: full
    replicas of the rows, each over ``num_nodes / groups`` nodes.
    """

    num_nodes: int
    replicas: int
    owner: np.ndarray
    width: np.ndarray
    hot_rows: int = 0
    groups: int = 1

    def __post_init__(self) -> None:
        n, w, g = int(self.num_nodes), int(self.replicas), int(self.groups)
        if not 1 <= n <= MAX_NODES:
            raise StoreError(f"a sharded layout spans 1 to {MAX_NODES} nodes, got {n}")
        check_groups(n, g)
        s = n // g
        if not 1 <= w <= s:
            raise StoreError(f"replicas: expected 1 to {s} (the nodes of a replica group), got {w}")
        owner, width = np.asarray(self.owner), np.asarray(self.width)
        if owner.ndim != 1 or owner.shape != width.shape:
            raise StoreError(f"owner {owner.shape} and width {width.shape} must be 1-D and of one length")
        if owner.size and (owner.min() < 0 or owner.max() >= s):
            raise StoreError(f"an owner is outside nodes 0..{s - 1}")
        if width.size and (width.min() < 1 or width.max() > w):
            raise StoreError(f"a width is outside 1..{w} (the replicas)")
        owner, width = owner.astype(np.int16), width.astype(np.uint8)
        owner.setflags(write=False)
        width.setflags(write=False)
        object.__setattr__(self, "num_nodes", n)
        object.__setattr__(self, "replicas", w)
        object.__setattr__(self, "groups", g)
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "width", width)

    @property
    def num_vertices(self) -> int:
        return int(self.owner.shape[0])

    @property
    def group_size(self) -> int:
        """Nodes per replica group (``num_nodes`` when there is one group)."""
        return self.num_nodes // self.groups

    def group_nodes(self, node: int) -> list[int]:
        """The nodes of ``node``'s replica group, increasing (every node when there is one group)."""
        self._check(node)
        s = self.group_size
        first = int(node) // s * s
        return list(range(first, first + s))

    def holds(self, node: int) -> np.ndarray:
        """Boolean ``[V]``: which rows ``node`` holds."""
        self._check(node)
        s = self.group_size
        return (node % s - self.owner.astype(np.int32)) % s < self.width

    def rows_of(self, node: int) -> np.ndarray:
        """Global ids of the rows ``node`` holds, increasing (its local id order), int64."""
        return np.flatnonzero(self.holds(node)).astype(np.int64)

    def local_index(self, node: int) -> np.ndarray:
        """``[V]`` global id → ``node``'s local id, ``-1`` where it does not hold the row (int32 or int64)."""
        held = self.holds(node)
        dt = np.int32 if self.num_vertices < np.iinfo(np.int32).max else np.int64
        out = np.full(self.num_vertices, -1, dt)
        out[held] = np.arange(int(held.sum()), dtype=dt)
        return out

    def server_of(self, ids: np.ndarray, node: int) -> np.ndarray:
        """The node that serves ``node`` each of ``ids`` (rows it does not hold), int64.

        Holder number ``node mod width`` of the row, in ``node``'s own replica
        group: requesters spread over the holders of a replicated row; it is
        never ``node`` itself, nor a node of another group.
        """
        self._check(node)
        s = self.group_size
        ids = np.asarray(ids, np.int64)
        w = self.width[ids].astype(np.int64)
        return int(node) // s * s + (self.owner[ids].astype(np.int64) + node % s % w) % s

    def bytes_per_node(self, row_bytes: int) -> np.ndarray:
        """Feature bytes each node holds, ``[num_nodes]`` int64 (every group holds the same)."""
        s = self.group_size
        counts = np.zeros(s, np.int64)
        for j in range(self.replicas):
            sel = self.width > j
            counts += np.bincount((self.owner[sel].astype(np.int64) + j) % s, minlength=s)
        return np.tile(counts, self.groups) * int(row_bytes)

    def digest(self) -> str:
        """A name of this layout (nodes, replicas, groups, every row's holders): equal layouts, equal digests."""
        grouped = f":g{self.groups}" if self.groups > 1 else ""  # one group: the digest layouts had before groups
        h = hashlib.sha1(f"{self.num_nodes}:{self.replicas}:{self.num_vertices}{grouped}".encode())
        h.update(np.ascontiguousarray(self.owner).tobytes())
        h.update(np.ascontiguousarray(self.width).tobytes())
        return h.hexdigest()[:20]

    def _check(self, node: int) -> None:
        if not 0 <= int(node) < self.num_nodes:
            raise StoreError(f"node {node} is outside the layout's {self.num_nodes} nodes")

    def save(self, directory: str | os.PathLike[str], node: int | None = None,
             extra: dict | None = None) -> Path:
        """Write ``shards.json`` (``node``: the node this directory is for; None: the job's root), owner, width."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        for name, arr in (("owner", self.owner), ("width", self.width)):
            save_npy(d / f"{name}.npy", arr)
        if node is not None:
            self._check(node)
        man = {"format": "moment-shards", "version": 1, "num_nodes": self.num_nodes, "replicas": self.replicas,
               "num_vertices": self.num_vertices, "hot_rows": int(self.hot_rows), "node": node,
               "digest": self.digest(), **(extra or {})}
        if self.groups > 1:  # absent: one group, so readers before replica groups read the layout they always did
            man["groups"] = self.groups
        save_json(d / SHARDS, man)
        return d / SHARDS


def read_manifest(directory: str | os.PathLike[str]) -> dict | None:
    """The ``shards.json`` of ``directory`` as a dict; None when there is none (not a sharded placement)."""
    p = Path(directory) / SHARDS
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"{p}: cannot read the shard manifest ({exc}); place again over nodes (`place_sharded`)"
        ) from None
    if not isinstance(data, dict) or data.get("format") != "moment-shards":
        raise StoreError(f"{p}: not a shard manifest (no \"format\": \"moment-shards\")")
    return data


def load_layout(directory: str | os.PathLike[str]) -> tuple[ShardLayout, dict]:
    """The layout :meth:`ShardLayout.save` wrote to ``directory``, and its manifest (``node`` says whose)."""
    d = Path(directory)
    man = read_manifest(d)
    if man is None:
        raise StoreError(f"{d}: no {SHARDS} (not a sharded placement: write one with `place_sharded`)")
    try:
        arrays = [np.load(d / f"{n}.npy", allow_pickle=False) for n in ("owner", "width")]
        lay = ShardLayout(int(man["num_nodes"]), int(man["replicas"]), *arrays, hot_rows=int(man.get("hot_rows", 0)),
                          groups=int(man.get("groups", 1)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{d}: the shard layout is unreadable ({exc}); place again over nodes (`place_sharded`)"
                         ) from None
    if lay.digest() != man.get("digest"):
        raise StoreError(f"{d}: owner.npy/width.npy do not match {SHARDS} (digest {lay.digest()} is not "
                         f"{man.get('digest')}); the directory was changed after placing: place again")
    return lay, man


def check_groups(num_nodes: int, groups: int) -> None:
    """Refuse ``groups`` replica groups that do not split ``num_nodes`` nodes evenly.

    Raises
    ------
    StoreError
        ``groups`` below 1, or ``num_nodes`` not a multiple of it.
    """
    if int(groups) < 1 or int(num_nodes) % int(groups):
        raise StoreError(f"`groups` {groups}: replica groups split `num_nodes` {num_nodes} evenly (every group "
                         f"holds every row once): choose a divisor of {num_nodes}")


def shard_rows(hotness: np.ndarray, num_nodes: int, replicas: int = 1, hot_rows: int = 0,
               groups: int = 1) -> ShardLayout:
    """Deal rows to ``num_nodes`` nodes by falling ``hotness``; the ``hot_rows`` hottest on ``replicas`` nodes.

    ``hotness`` (``[V]``, any non-negative numbers: reads per epoch from
    pre-sampling). Ties keep id order, so the layout is a pure function of
    its inputs. ``groups``: full replicas of the rows over ``num_nodes /
    groups`` nodes each, every group dealt alike (``replicas`` then counts
    nodes within a group).

    Raises
    ------
    StoreError
        ``hotness`` not 1-D, ``hot_rows``, ``replicas`` or ``groups`` out of range.
    """
    h = np.asarray(hotness)
    if h.ndim != 1:
        raise StoreError(f"hotness must be 1-D, got shape {h.shape}")
    if not 0 <= int(hot_rows) <= h.size:
        raise StoreError(f"hot_rows: expected 0 to {h.size} (the rows), got {hot_rows}")
    check_groups(num_nodes, groups)
    size = int(num_nodes) // int(groups)
    if not 1 <= int(replicas) <= size:
        raise StoreError(f"replicas {replicas}: expected 1 to {size} (a row is on at most every node of a group)")
    order = np.argsort(-h.astype(np.float64), kind="stable")
    owner = np.empty(h.size, np.int16)
    owner[order] = (np.arange(h.size) % size).astype(np.int16)
    width = np.ones(h.size, np.uint8)
    hot = int(hot_rows) if replicas > 1 else 0
    width[order[:hot]] = int(replicas)
    return ShardLayout(int(num_nodes), int(replicas), owner, width, hot_rows=hot, groups=int(groups))


def partition_rows(part_of: np.ndarray, hotness: np.ndarray | None = None, replicas: int = 1,
                   hot_rows: int = 0, num_nodes: int | None = None, groups: int = 1) -> ShardLayout:
    """Rows owned by the partition of their vertex (``part_of``, ``[V]``); the ``hot_rows`` hottest on ``replicas``.

    The graph's partitioning (``moment data partition``) decides ownership
    instead of :func:`shard_rows`' deal by hotness: a rank's seeds and most of
    its sampled neighbours are then its own rows. Replication is as there: the
    ``hot_rows`` rows of highest ``hotness`` (ties in id order) are held by
    ``replicas`` consecutive nodes from their owner. ``num_nodes`` defaults to
    ``part_of.max() + 1`` times ``groups``.

    With ``groups`` replica groups the partitions split each group: a group's
    ``num_nodes / groups`` nodes hold one partition each (node ``k`` the
    partition ``k mod (num_nodes / groups)``), so every group holds the
    partitioned rows once and is served only by itself, as with
    :func:`shard_rows`.

    >>> lay = partition_rows(np.array([1, 1, 0, 0]), np.array([0, 9, 1, 2]), replicas=2, hot_rows=1)
    >>> lay.owner.tolist(), lay.width.tolist(), lay.rows_of(0).tolist()
    ([1, 1, 0, 0], [1, 2, 1, 1], [1, 2, 3])
    >>> g = partition_rows(np.array([1, 1, 0, 0]), groups=2)
    >>> g.num_nodes, [g.rows_of(k).tolist() for k in range(4)]
    (4, [[2, 3], [0, 1], [2, 3], [0, 1]])

    Raises
    ------
    StoreError
        ``part_of`` not 1-D or negative, a partition past the group's nodes, ``hotness`` of another length,
        ``hot_rows``, ``replicas`` or ``groups`` out of range.
    """
    owner = np.asarray(part_of)
    if owner.ndim != 1:
        raise StoreError(f"part_of must be 1-D, got shape {owner.shape}")
    if owner.size and int(owner.min()) < 0:
        raise StoreError("part_of: a vertex has no partition (a negative entry); partition the graph again")
    parts = int(owner.max()) + 1 if owner.size else 1
    n = int(num_nodes) if num_nodes is not None else parts * max(1, int(groups))
    check_groups(n, groups)
    n_group = n // int(groups)
    if parts > n_group:
        raise StoreError(f"part_of names partition {parts - 1}, but `num_nodes` {n} over `groups` {groups} gives "
                         f"each group {n_group} nodes: one partition a node")
    if not 1 <= int(replicas) <= n_group:
        raise StoreError(f"replicas {replicas}: expected 1 to {n_group} (a row is on at most every node of a group)")
    if not 0 <= int(hot_rows) <= owner.size:
        raise StoreError(f"hot_rows: expected 0 to {owner.size} (the rows), got {hot_rows}")
    width = np.ones(owner.size, np.uint8)
    hot = int(hot_rows) if replicas > 1 else 0
    if hot:
        h = np.asarray(hotness, np.float64) if hotness is not None else None
        if h is None or h.shape != owner.shape:
            raise StoreError(f"hotness must have one value per row ({owner.size}) to replicate the hottest rows")
        width[np.argsort(-h, kind="stable")[:hot]] = int(replicas)
    return ShardLayout(n, int(replicas), owner.astype(np.int16), width, hot_rows=hot, groups=int(groups))
