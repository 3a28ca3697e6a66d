"""Training on a feature store sharded across nodes: local rows from the node's tiers, the rest from their holders.

A placement made by ``moment place --nodes N`` (:mod:`training.place.nodes`) gives
every node a directory of its own: its share of the rows (local ids, see
:mod:`iostack.shards`) in its own GPU/CPU/SSD bins, the layout, the hotness.
Under a multi-node ``torchrun`` each node opens its directory
(:func:`open_sharded`), and :class:`ShardedFeatures` serves a batch's rows:

* rows the node holds, from its :class:`~iostack.store.FeatureStore`;
* rows of other nodes kept in the node's **locality cache**
  (:class:`RemoteCache`, DYAD's idea: the hottest remote rows, by the
  placement's hotness, up to a budget, fetched once at start into node-shared
  host memory or an SSD bin);
* the others from the nodes that hold them, in **one batched exchange per
  step** (:mod:`training.sharded.exchange`: ``all_to_all`` on a group of its own, or
  RPC), on the prefetch thread, so it overlaps the training step.

Before anything is read, the ranks compare what they were started with
(:func:`join`): every rank of a node must hold the same shard, no two nodes
the same one, every shard must be held, all of one layout (its digest) and
dataset. Anything else is refused on every rank with one message.

Which node a process is on: ``GROUP_RANK`` (``torchrun`` sets it: the node's
rank in the rendezvous), else ``RANK // LOCAL_WORLD_SIZE``. With a job's root
directory (``--placement DIR``, holding ``node<k>/``) node ``k`` opens
``DIR/node<k>``; with a node's own directory (``--placement DIR/node3``, what
a node with only its own disk has) the directory says which shard it is, and
:func:`join` checks that the nodes' shards fit together, whatever ranks the
rendezvous handed out.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from iostack.shards import ShardLayout, load_layout, read_manifest
from iostack.transfer import Gathered, Transfer
from momentbase.errors import MomentError
from training.errors import TrainingError
from training.sharded.exchange import PeerLostError, RowExchange
from training.sharded.groups import exchange_peers
from training.sharded.remote_cache import DynamicRemoteCache, RemoteCache, cache_rows, with_policy
from training.vocab import EXCHANGES

#: rows fetched per round when the locality cache is filled at start
FILL_ROWS = 1 << 16


class NodeError(TrainingError):
    """A multi-node run that cannot start: nodes' directories or layouts that do not fit together."""


@dataclass(frozen=True)
class Peers:
    """This process in the job: global rank and size, rank and size on its node, the node's number."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    node: int

    @classmethod
    def from_env(cls, rank: int, size: int, local_rank: int, local_size: int,
                 env: dict[str, str] | None = None) -> Peers:
        """``node`` from ``GROUP_RANK`` (torchrun), else ``rank // local_size``."""
        env = os.environ if env is None else env
        g = env.get("GROUP_RANK")
        node = int(g) if g not in (None, "") else rank // max(1, local_size)
        return cls(rank, size, local_rank, local_size, node)


def is_sharded(placement_dir: str | os.PathLike[str] | None) -> bool:
    """Whether ``placement_dir`` is a sharded placement (a job's root or a node's directory)."""
    return placement_dir is not None and read_manifest(placement_dir) is not None


def node_directory(placement_dir: str | os.PathLike[str], node: int) -> Path:
    """The directory node ``node`` opens: ``placement_dir`` itself if it is a node's, else its ``node<node>``."""
    d = Path(placement_dir)
    man = read_manifest(d)
    if man is None:
        raise NodeError(f"{d}: not a sharded placement (no shards.json); place with `place_sharded`")
    if man.get("node") is not None:
        return d
    sub = d / f"node{node}"
    if read_manifest(sub) is None:
        raise NodeError(f"{d}: has no directory node{node} for node {node} of this job (the layout has "
                        f"{man.get('num_nodes')} nodes); start one node per shard, or give each node its own "
                        f"`placement={d}/node<k>`")
    return sub


@dataclass(frozen=True)
class Membership:
    """Which ranks hold which shard (``ranks_of[shard]``: global ranks, in rank order)."""

    shard_of_rank: tuple[int, ...]
    ranks_of: tuple[tuple[int, ...], ...]

    def server_ranks(self, local_rank: int) -> np.ndarray:
        """Per shard, the rank a process of local rank ``local_rank`` asks (spreads a node's ranks over its peers)."""
        return np.array([r[local_rank % len(r)] for r in self.ranks_of], np.int64)


def join(peers: Peers, shard: int, num_shards: int, digest: str, where: str,
         gather: Callable[[Any], list[Any]]) -> Membership:
    """Check what every rank was started with and return who holds what; :class:`NodeError` on every rank if unfit.

    ``gather(obj)``: every rank's ``obj`` in rank order (``all_gather_object``).
    """
    mine = {"node": peers.node, "shard": int(shard), "digest": digest, "where": where, "rank": peers.rank}
    everyone = gather(mine)
    first = everyone[0]
    for e in everyone:
        if e["digest"] != first["digest"]:
            raise NodeError(f"rank {e['rank']} (node {e['node']}) was started with {e['where']}, another placement "
                            f"than rank 0's {first['where']} (layout {e['digest']} vs {first['digest']}); give "
                            "every node a directory of the same `place_sharded` run")
    shard_of_node: dict[int, tuple[int, str]] = {}
    for e in everyone:
        had = shard_of_node.setdefault(e["node"], (e["shard"], e["where"]))
        if had[0] != e["shard"]:
            raise NodeError(f"node {e['node']}: its ranks were started with different shards ({had[1]} and "
                            f"{e['where']}); give every rank of a node the same `placement`")
    holders: dict[int, list[int]] = {}
    for node, (s, _) in sorted(shard_of_node.items()):
        holders.setdefault(s, []).append(node)
    for s, nodes in holders.items():
        if len(nodes) > 1:
            dirs = sorted({e["where"] for e in everyone if e["shard"] == s})
            raise NodeError(f"nodes {', '.join(map(str, nodes))} were all started with shard {s}'s directory "
                            f"({', '.join(dirs)}): each node needs its own (node{nodes[1]} is another node's "
                            "directory?)")
    missing = sorted(set(range(num_shards)) - set(holders))
    if missing:
        raise NodeError(f"the placement is sharded over {num_shards} nodes but this job has {len(shard_of_node)}: "
                        f"shard(s) {', '.join(map(str, missing))} are held by no node; start one node per shard "
                        f"(torchrun --nnodes {num_shards})")
    ranks_of = tuple(tuple(e["rank"] for e in everyone if e["shard"] == s) for s in range(num_shards))
    return Membership(tuple(e["shard"] for e in everyone), ranks_of)


def check_dataset(manifest: dict, now: dict, where: str, dataset: str) -> None:
    """Refuse a node directory placed from another dataset (the fingerprint fields both sides have)."""
    made = manifest.get("dataset_fingerprint") or {}
    diff = [k for k in made if k in now and now[k] != made[k]]
    if diff:
        raise NodeError(f"{where}: placed from another dataset than {dataset} (they differ in {', '.join(diff)}); "
                        "place this dataset with `place_sharded`")


# ----------------------------------------------------------------------------------------------
# the feature source


class ShardedFeatures:
    """A :class:`training.trainer.FeatureSource` over a sharded store (see the module docstring).

    ``store``: this node's :class:`~iostack.store.FeatureStore` (local ids);
    ``local``: ``[V]`` global → local id (-1: not here); ``server_rank``:
    per shard, the rank this process asks; ``exchange``: the
    :class:`~training.sharded.exchange.RowExchange`; ``all_reduce``: a sum over the
    ranks (the main thread's group) for the epoch figures.
    """

    def __init__(self, store: Any, layout: ShardLayout, shard: int, local: np.ndarray, server_rank: np.ndarray,
                 size: int, exchange: RowExchange | None, *, all_reduce: Callable[[Tensor], Tensor] | None = None,
                 notes: Sequence[str] = ()) -> None:
        self.store = store
        self.transfer: Transfer = store.transfer
        self.layout, self.shard, self.size = layout, int(shard), int(size)
        self.dim, self.dtype, self.row_bytes = int(store.dim), store.dtype, int(store.row_bytes)
        self._local = torch.from_numpy(np.asarray(local))
        self._server_rank = np.asarray(server_rank, np.int64)
        self.exchange = exchange
        #: where exchanged rows live: the host (gloo, RPC), or this rank's GPU (NCCL)
        self.exchange_device = torch.device("cpu")
        self.cache: RemoteCache | DynamicRemoteCache | None = None
        self._all_reduce = all_reduce
        self.notes = list(store.notes) + list(notes)
        self._c = {"local": [0, 0], "remote": [0, 0], "remote-cache": [0, 0]}  # this rank's own batches
        self._epoch_mark: dict[str, float] = {}

    # -- serving peers ------------------------------------------------------------------------
    def serve(self, ids: Tensor) -> Tensor:
        """This node's rows of ``ids`` (global ids a peer asked for), on the exchange's device."""
        ids = ids.to("cpu")
        loc = self._local[ids]
        if loc.numel() and bool((loc < 0).any()):
            bad = int(ids[loc < 0][0])
            raise NodeError(f"a peer asked node shard {self.shard} for vertex {bad}, which it does not hold: the "
                            "nodes disagree on the layout")
        return self.store.gather(loc.to(torch.int64), device=self.exchange_device)

    # -- fetching --------------------------------------------------------------------------------
    def fetch_remote(self, rid: Tensor) -> Tensor:
        """Rows of ``rid`` (global ids this node does not hold) from their holders, in order: one exchange."""
        rid_np = rid.numpy()
        peer = self._server_rank[self.layout.server_of(rid_np, self.shard)] if rid_np.size else rid_np
        order = np.argsort(peer, kind="stable")
        counts = np.bincount(peer, minlength=self.size) if rid_np.size else np.zeros(self.size, np.int64)
        requests = list(torch.split(rid[torch.from_numpy(order)], counts.tolist()))
        try:
            parts = self.exchange.fetch(requests)
        except RuntimeError as exc:  # gloo/NCCL/RPC errors: a peer died or hung past the timeout
            raise PeerLostError.of(exc, "the feature exchange") from None
        dev = self.exchange_device
        rows = torch.cat([p.to(dev) for p in parts]) if parts else torch.empty((0, self.dim), dtype=self.dtype,
                                                                                 device=dev)
        out = torch.empty_like(rows)
        out[torch.from_numpy(order).to(dev)] = rows
        return out

    def gather(self, ids: Tensor) -> Tensor:
        return self.gather_landing(ids).wait()

    def gather_landing(self, ids: Tensor | np.ndarray, dtype: torch.dtype | None = None) -> Gathered:
        """Rows of ``ids`` on the training device: local tiers, the locality cache, one exchange for the rest.

        Collective with the ``alltoall`` exchange: every rank calls it once per
        batch, in the same order (even with nothing to fetch).
        """
        with self.transfer.batch() as tb:
            ids_h = tb.to_host(torch.as_tensor(ids).reshape(-1)).to(torch.int64)
            n = ids_h.numel()
            if n and (int(ids_h.min()) < 0 or int(ids_h.max()) >= self.layout.num_vertices):
                raise IndexError(f"a vertex id outside 0..{self.layout.num_vertices - 1}")
            loc = self._local[ids_h]
            here = loc >= 0
            pos_l = torch.nonzero(here).reshape(-1)
            pos_r = torch.nonzero(~here).reshape(-1)
            pos_c = slot_c = None
            if self.cache is not None and pos_r.numel():
                slot = self.cache.index[ids_h[pos_r]]
                hit = slot >= 0
                pos_c, slot_c = pos_r[hit], slot[hit].to(torch.int64)
                pos_r = pos_r[~hit]
            fetched = self.fetch_remote(ids_h[pos_r])
            on_host = fetched.device.type == "cpu"  # else NCCL delivered them on the device: no staging
            n_c = 0 if pos_c is None else pos_c.numel()
            # where each part goes, up in one pinned copy: local rows, then host rows (cache, fetched), then
            # rows already on the device
            host_pos = [p for p in (pos_c if n_c else None, pos_r if on_host else None) if p is not None]
            parts = [pos_l, *host_pos] + ([] if on_host else [pos_r])
            ibuf = tb.staging("remote-index", (sum(p.numel() for p in parts),), torch.int64)
            torch.cat(parts, out=ibuf)
            idx = tb.to_device(ibuf)
            nl, m = pos_l.numel(), sum(p.numel() for p in host_pos)
            out = tb.empty((n, self.dim), self.dtype)
            if nl:
                local = self.store.gather_landing(loc[pos_l].to(torch.int64))
                out.index_copy_(0, idx[:nl], tb.keep(local.rows))
            if m:  # cache rows (and rows fetched to the host): host memory, up in one copy
                hbuf = tb.staging("remote", (m, self.dim), self.dtype)
                if n_c:
                    self.cache.take(slot_c, hbuf[:n_c])
                if on_host:
                    hbuf[n_c:].copy_(fetched)
                out.index_copy_(0, idx[nl:nl + m], tb.to_device(hbuf))
            if not on_host and pos_r.numel():
                out.index_copy_(0, idx[nl + m:], tb.keep(fetched))
            result = tb.cast(out, dtype)
        if self.cache is not None and pos_r.numel():  # after the hits were read: the new rows may evict them
            self.cache.admit(ids_h[pos_r], fetched)
        self._c["local"][0] += pos_l.numel()
        self._c["local"][1] += pos_l.numel() * self.row_bytes
        self._c["remote"][0] += pos_r.numel()
        self._c["remote"][1] += pos_r.numel() * self.row_bytes
        self._c["remote-cache"][0] += n_c
        self._c["remote-cache"][1] += n_c * self.row_bytes
        return Gathered(result, tb.landing)

    # -- figures ---------------------------------------------------------------------------------
    def totals(self) -> dict[str, tuple[int, int]]:
        """Rows and bytes per tier: the node's own (``gpu``, ``cpu``, ``ssd``), ``remote-cache``, ``remote``.

        The node's tiers count every row they served, this rank's and the
        peers' (what they had to read); ``remote-cache`` and ``remote`` count
        this rank's batches' rows.
        """
        out = {k: (int(v["rows"]), int(v["bytes"])) for k, v in self.store.tier_stats().items()}
        for k in ("remote-cache", "remote"):
            r, b = self._c[k]
            if r or k == "remote":
                out[k] = (r, b)
        return out

    def epoch_record(self) -> dict[str, Any]:
        """What the nodes did since the last call, summed over every rank (a collective on the main thread)."""
        ex = self.exchange.stats()
        c = self._c
        now = {"local_rows": c["local"][0], "cache_rows": c["remote-cache"][0], "remote_rows": c["remote"][0],
               "remote_bytes": c["remote"][1], "served_rows": ex.get("rows_served", 0),
               "exchange_calls": ex.get("calls", 0), "exchange_s": ex.get("seconds", 0.0)}
        d = summed_since(now, self._epoch_mark, self._all_reduce)
        self._epoch_mark = now
        rows = d["local_rows"] + d["cache_rows"] + d["remote_rows"]
        return {"nodes": {**{k: (int(v) if k != "exchange_s" else v) for k, v in d.items()},
                          "exchange": self.exchange.name, "remote_share": d["remote_rows"] / rows if rows else 0.0,
                          "cache_share": d["cache_rows"] / rows if rows else 0.0}}

    def memory_bytes(self) -> dict[str, int]:
        """Host and device bytes of this node's store, plus the locality cache's host bytes (``remote_cache``)."""
        out = dict(self.store.memory_bytes())
        out["remote_cache"] = self.cache.nbytes() if self.cache is not None else 0
        return out

    def unlink_shared(self) -> None:
        self.store.unlink_shared()
        if self.cache is not None:
            self.cache.unlink_shared()

    def close(self) -> None:
        if self.exchange is not None:
            with contextlib.suppress(Exception):  # a broken exchange (a dead peer) must not keep the store open
                self.exchange.close()
        if self.cache is not None:
            self.cache.close()
        self.store.close()


# ----------------------------------------------------------------------------------------------
# opening


@dataclass(frozen=True)
class ShardedOptions:
    """How a node takes part: exchange kind, timeout, locality cache budget (bytes), where it lives, its policy."""

    exchange: str = "alltoall"
    timeout_s: float = 30.0
    remote_cache_bytes: int = 0
    remote_cache_dir: str | None = None
    cache_policy: str = "static"

    def __post_init__(self) -> None:
        if self.exchange not in EXCHANGES:
            raise NodeError(f"exchange {self.exchange!r}: expected one of {', '.join(EXCHANGES)}")
        if not self.timeout_s > 0:
            raise NodeError(f"timeout: expected a positive number of seconds, got {self.timeout_s}")
        if self.remote_cache_bytes < 0:
            raise NodeError(f"remote cache: expected a size >= 0, got {self.remote_cache_bytes}")
        if self.cache_policy != "static" and (not self.remote_cache_bytes or self.remote_cache_dir):
            raise NodeError(f"`cache_policy` {self.cache_policy} fills a sharded run's remote cache in host memory: "
                            "give `remote_cache_bytes`, without `remote_cache_dir`")


def open_sharded(ds: Any, placement_dir: str, peers: Peers, options: ShardedOptions, *, transfer: Transfer,
                 open_store: Callable[..., Any], share_key: Callable[[Path], str] | None = None,
                 local_gpu_bins: Sequence[int] | None = None, backend: str = "auto",
                 capacities: str | None = None) -> ShardedFeatures:
    """Open this node's shard, check the job fits together (:func:`join`), start the exchange, fill the cache.

    Every rank of the job calls it at the same point (it runs collectives).
    ``open_store(placement, directory, features, backend, transfer=, ...)``
    opens a :class:`~iostack.store.FeatureStore` (the trainer's);
    ``share_key(node_dir)`` names the node-shared host tiers (None: private).
    """
    from training.data import fingerprint

    node_dir = node_directory(placement_dir, peers.node)
    try:
        layout, man = load_layout(node_dir)
    except MomentError as exc:
        raise NodeError(str(exc)) from None
    shard = int(man["node"])
    check_dataset(man, fingerprint(ds), str(node_dir), str(ds.path))
    if layout.num_vertices != ds.num_nodes:
        raise NodeError(f"{node_dir}: the layout has {layout.num_vertices} vertices, the dataset {ds.path} "
                        f"{ds.num_nodes}; place this dataset with `place_sharded`")
    member = join(peers, shard, layout.num_nodes, layout.digest(), str(node_dir), _gather_objects(peers))
    store, local = _node_store(node_dir, layout, shard, peers, transfer, open_store, share_key, local_gpu_bins,
                               backend, capacities)
    # replica groups trade only within their group (a process group of its own for the all-to-all)
    ex = exchange_peers(layout, member.ranks_of, shard, member.server_ranks(peers.local_rank), peers.size,
                        options.exchange)
    within = f" within ranks {', '.join(map(str, ex.ranks))}" if layout.groups > 1 and peers.size > 1 else ""
    feats = ShardedFeatures(store, layout, shard, local, ex.server, ex.size,
                            None, all_reduce=_all_reduce_sum if peers.size > 1 else None)
    try:
        feats.exchange = _start_exchange(options, peers, feats, ex.groups)
        feats.notes.append(f"node shard {shard} of {layout.num_nodes} ({node_dir}): {int((local >= 0).sum()):,} "
                           f"of {layout.num_vertices:,} rows, replicas {layout.replicas}, groups {layout.groups}; "
                           f"exchange {feats.exchange.name}{within}")
        if options.remote_cache_bytes:
            feats.cache = _fill_cache(feats, node_dir, layout, options, peers, share_key)
            feats.cache = with_policy(feats.cache, options.remote_cache_bytes // feats.row_bytes, options.cache_policy)
            feats.notes.append(f"locality cache: {len(feats.cache):,} remote rows in {feats.cache.where}")
        return feats
    except BaseException:
        feats.close()
        raise


def _gather_objects(peers: Peers) -> Callable[[Any], list[Any]]:
    if peers.size <= 1:
        return lambda obj: [obj]
    import torch.distributed as dist

    def gather(obj: Any) -> list[Any]:
        out: list[Any] = [None] * peers.size
        try:
            dist.all_gather_object(out, obj)
        except RuntimeError as exc:  # a peer that failed to start (its own error says why)
            raise PeerLostError.of(exc, "comparing the nodes' placements") from None
        return out

    return gather


def summed_since(now: dict[str, float], mark: dict[str, float],
                 all_reduce: Callable[[Tensor], Tensor] | None) -> dict[str, float]:
    """``now - mark`` per key (a missing mark counts 0), summed over the ranks by ``all_reduce`` (None: this rank's)."""
    delta = torch.tensor([now[k] - mark.get(k, 0) for k in now], dtype=torch.float64)
    if all_reduce is not None:
        delta = all_reduce(delta)
    return dict(zip(now, delta.tolist(), strict=True))


def _all_reduce_sum(t: Tensor) -> Tensor:
    import torch.distributed as dist

    try:
        dist.all_reduce(t)
    except RuntimeError as exc:
        raise PeerLostError.of(exc, "the epoch's node figures") from None
    return t


def _node_store(node_dir: Path, layout: ShardLayout, shard: int, peers: Peers, transfer: Transfer,
                open_store: Callable[..., Any], share_key: Callable[[Path], str] | None,
                local_gpu_bins: Sequence[int] | None, backend: str, capacities: str | None) -> tuple[Any, np.ndarray]:
    from iostack.npysums import check_rows
    from iostack.placement import load_placement

    placement = load_placement(node_dir)
    local = layout.local_index(shard)
    held = int((local >= 0).sum())
    if placement.num_vertices != held:
        raise NodeError(f"{node_dir}: its placement holds {placement.num_vertices} rows, the layout gives shard "
                        f"{shard} {held}; the directory was changed after placing: place again")
    rows_file = node_dir / "rows.npy"
    feats = np.load(rows_file, mmap_mode="r") if rows_file.exists() else None
    if feats is not None:  # the caches fill from these rows: their blocks are checked first
        cached = [placement.vertices_of(b.id) for b in placement.bins if b.kind in ("gpu", "cpu")]
        check_rows(rows_file, np.concatenate(cached) if cached else np.empty(0, np.int64))
    key = share_key(node_dir) if share_key is not None and peers.local_size > 1 else None
    store = open_store(placement, node_dir, feats, backend, transfer=transfer, local_gpu_bins=local_gpu_bins,
                       share_key=key, capacities=capacities)
    return store, local


def _start_exchange(options: ShardedOptions, peers: Peers, feats: ShardedFeatures,
                    groups: list[list[int]] | None = None) -> RowExchange:
    """The exchange, serving ``feats``'s rows from the moment it is up (peers may ask right away); ``groups``: the
    replica groups' ranks, each exchanging on a group of its own (None: the whole job)."""
    from training.sharded.exchange import AllToAllExchange, LoopbackExchange, RpcExchange

    kw = {"dim": feats.dim, "dtype": feats.dtype}
    if peers.size <= 1:
        return LoopbackExchange(feats.serve, **kw)
    if options.exchange == "rpc":
        return RpcExchange(feats.serve, rank=peers.rank, size=peers.size, timeout_s=options.timeout_s, **kw)
    # gloo, with host rows, even when the ranks train on GPUs: the exchange runs on the prefetch thread while
    # DDP's all-reduce runs on NCCL from the trainer's thread, and NCCL's rule for several communicators is that
    # their operations be issued in one order on every rank (its kernels block waiting for peers, and a device
    # synchronisation inside one waits for the other's): two threads cannot promise that, so a second NCCL
    # communicator on the prefetch thread could hang the job. Gloo runs no GPU kernels; the rows cross PCIe twice.
    pg = (AllToAllExchange.new_group(options.timeout_s, backend="gloo") if groups is None
          else AllToAllExchange.new_subgroup(options.timeout_s, groups, backend="gloo"))
    return AllToAllExchange(pg, feats.serve, **kw)


def _fill_cache(feats: ShardedFeatures, node_dir: Path, layout: ShardLayout, options: ShardedOptions,
                peers: Peers, share_key: Callable[[Path], str] | None) -> RemoteCache:
    """The hottest remote rows, fetched once (collective: every rank takes part in every round).

    Which rows: the first of the placement's ``halo.npy`` where it wrote one (rows that follow a partition: the
    rows this node's own batches read most, :mod:`training.place.node_reads`), else the dataset's hottest.
    """
    budget = options.remote_cache_bytes // feats.row_bytes
    ids = _halo_rows(node_dir, feats._local.numpy() >= 0, budget)
    if options.remote_cache_dir:
        return _fill_cache_ssd(feats, ids, options.remote_cache_dir, layout, peers)
    where = f"host memory of shard {feats.shard}"
    if share_key is None or peers.local_size <= 1:
        return RemoteCache(ids, layout.num_vertices, rows=_fetch_all(feats, ids, peers), where=where)
    from iostack.hostshare import shared_host_tensor

    # one copy per node: the node's first rank fetches and fills the segment, the others map it
    key, shape = f"{share_key(node_dir)}-rc{ids.size}", (int(ids.size), feats.dim)
    first = peers.local_rank == 0
    fetched = _fetch_all(feats, ids if first else ids[:0], peers)
    seg = shared_host_tensor(key, shape, feats.dtype, lambda t: t.copy_(fetched)) if first else None
    _barrier(peers)
    if not first:
        with contextlib.suppress(_NotFilled):
            seg = shared_host_tensor(key, shape, feats.dtype, _not_filled)
    # a rank left without the segment (no room in /dev/shm) fetches a copy of its own: a round for every rank
    lack = seg is None and not first
    need = torch.tensor([float(lack)])
    if peers.size > 1:
        _all_reduce_sum(need)
    if float(need) > 0:
        own = _fetch_all(feats, ids if lack else ids[:0], peers)
        if lack:
            fetched = own
    if seg is not None:
        return RemoteCache(ids, layout.num_vertices, rows=seg.tensor, segment=seg,
                           where=f"node-shared {where} ({seg.path})")
    return RemoteCache(ids, layout.num_vertices, rows=fetched, where=where)


def _halo_rows(node_dir: Path, held: np.ndarray, budget: int) -> np.ndarray:
    """The locality cache's ``budget`` rows: ``halo.npy``'s first, else the hottest by ``hotness.npy``."""
    halo_file, hot_file = node_dir / "halo.npy", node_dir / "hotness.npy"
    try:
        if halo_file.exists():
            ids = np.load(halo_file)[:max(0, budget)].astype(np.int64)
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= held.size or bool(held[ids].any())):
                raise NodeError(f"{halo_file}: lists rows this node holds or no vertex of the layout; place again")
            return ids
        hot = np.load(hot_file, mmap_mode="r")
    except (OSError, ValueError):
        raise NodeError(f"{hot_file}: no hotness to choose the locality cache's rows by; place again with "
                        "`place_sharded`, or train without `remote_cache`") from None
    return cache_rows(hot, held, budget)


class _NotFilled(Exception):
    pass


def _not_filled(t: Tensor) -> None:
    raise _NotFilled


def _barrier(peers: Peers) -> None:
    if peers.size > 1:
        import torch.distributed as dist

        try:
            dist.barrier()
        except RuntimeError as exc:
            raise PeerLostError.of(exc, "filling the locality cache") from None


def _fetch_all(feats: ShardedFeatures, ids: np.ndarray, peers: Peers) -> Tensor:
    """Rows of ``ids`` (remote rows) in rounds of :data:`FILL_ROWS`; every rank runs as many rounds as the most."""
    rounds = torch.tensor([float(-(-ids.size // FILL_ROWS))])
    if peers.size > 1:
        import torch.distributed as dist

        try:
            dist.all_reduce(rounds, op=dist.ReduceOp.MAX)
        except RuntimeError as exc:
            raise PeerLostError.of(exc, "filling the locality cache") from None
    parts = []
    t = torch.from_numpy(np.ascontiguousarray(ids, np.int64))
    for i in range(int(rounds)):
        parts.append(feats.fetch_remote(t[i * FILL_ROWS:(i + 1) * FILL_ROWS]))
    return torch.cat([p.cpu() for p in parts]) if parts else torch.empty((0, feats.dim), dtype=feats.dtype)


def _fill_cache_ssd(feats: ShardedFeatures, ids: np.ndarray, directory: str, layout: ShardLayout,
                    peers: Peers) -> RemoteCache:
    """The cache as an SSD bin under ``directory``, written by the node's first rank, read by all."""
    from iostack.bins import write_bins
    from iostack.placement import simple_placement
    from iostack.store import FeatureStore

    d = Path(directory)
    name = f"remote-cache-shard{feats.shard}-{layout.digest()}-{ids.size}.dat"
    placement = simple_placement(max(1, ids.size), [("ssd", max(1, ids.size))], ssd_paths=[name])
    first = peers.local_rank == 0
    rows = _fetch_all(feats, ids if first else ids[:0], peers)
    if first:
        d.mkdir(parents=True, exist_ok=True)
        data = rows.numpy() if ids.size else np.zeros((1, feats.dim), feats.store.dtype_np)
        write_bins(data, placement, d, fsync=False)
    _barrier(peers)
    store = FeatureStore(placement, d, backend="posix")
    return RemoteCache(ids, layout.num_vertices, store=store, where=f"an SSD bin ({d / name})")


__all__ = [
    "NodeError", "Peers", "Membership", "ShardedFeatures", "ShardedOptions", "check_dataset",
    "is_sharded", "join", "node_directory", "open_sharded", "summed_since"
]
