"""The sharded layout, the node check, and a sharded feature source's rows (one process, two nodes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.errors import StoreError
from iostack.placement import load_placement
from iostack.shards import load_layout, shard_rows
from iostack.store import FeatureStore
from moment.cli import main
from planner.handoff import PlanTargets, StoreTarget
from tests.conftest import graph_fixture
from tests.fake_cuda import FakeDeviceMemory
from training.place.nodes import place_sharded
from training.place.specs import PolicySpec, ShardSpec, TierSpec
from training.sharded.exchange import PeerLostError
from training.sharded.features import NodeError, Peers, ShardedFeatures, ShardedOptions, _fill_cache, join
from training.sharded.remote_cache import RemoteCache, cache_rows


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=80), st.integers(1, 5), st.data())
def test_every_row_is_on_width_nodes_and_served_by_one_of_them(hot, n, data):
    w = data.draw(st.integers(1, n))
    k = data.draw(st.integers(0, len(hot)))
    lay = shard_rows(np.array(hot, np.float32), n, w, k)
    holds = np.stack([lay.holds(i) for i in range(n)])
    assert (holds.sum(0) == lay.width).all()
    order = np.argsort(-np.array(hot, np.float64), kind="stable")
    assert (lay.width[order[:lay.hot_rows]] == w).all() and (lay.width[order[lay.hot_rows:]] == 1).all()
    singles = np.bincount(lay.owner[lay.width == 1], minlength=n)  # dealt round-robin: balanced
    assert singles.max() - singles.min() <= 1 + lay.hot_rows
    assert lay.bytes_per_node(4).tolist() == [4 * holds[i].sum() for i in range(n)]
    for i in range(n):
        rows = lay.rows_of(i)
        assert (lay.local_index(i)[rows] == np.arange(rows.size)).all()
        missing = np.flatnonzero(~holds[i])
        if missing.size:
            srv = lay.server_of(missing, i)
            assert (srv != i).all() and holds[srv, missing].all()


def test_layout_saves_loads_and_notices_a_changed_file(tmp_path):
    lay = shard_rows(np.arange(100, dtype=np.float32), 3, 2, 10)
    lay.save(tmp_path, node=1, extra={"dataset_fingerprint": {"num_nodes": 100}})
    back, man = load_layout(tmp_path)
    assert man["node"] == 1 and back.digest() == lay.digest() and (back.owner == lay.owner).all()
    assert shard_rows(np.arange(100, dtype=np.float32), 3, 1, 10).digest() != lay.digest()
    owner = np.load(tmp_path / "owner.npy")
    owner[0] = (owner[0] + 1) % 3
    np.save(tmp_path / "owner.npy", owner)
    with pytest.raises(StoreError, match="digest"):
        load_layout(tmp_path)
    with pytest.raises(StoreError, match="replicas"):
        shard_rows(np.ones(4), 2, 3)


def _everyone(*entries):
    return lambda mine: list(entries)


def _e(rank, node, shard, digest="d", where=None):
    return {"rank": rank, "node": node, "shard": shard, "digest": digest, "where": where or f"/p/node{shard}"}


def test_join_refuses_what_does_not_fit_together():
    p = Peers(0, 4, 0, 2, 0)
    ok = join(p, 0, 2, "d", "/p/node0", _everyone(_e(0, 0, 0), _e(1, 0, 0), _e(2, 1, 1), _e(3, 1, 1)))
    assert ok.ranks_of == ((0, 1), (2, 3)) and ok.server_ranks(1).tolist() == [1, 3]
    # c10d rendezvous may number the nodes in any order: the directories say which shard is where
    swapped = join(p, 1, 2, "d", "/p/node1", _everyone(_e(0, 0, 1), _e(1, 0, 1), _e(2, 1, 0), _e(3, 1, 0)))
    assert swapped.ranks_of == ((2, 3), (0, 1))
    cases = [
        ((_e(0, 0, 0), _e(1, 1, 0)), "both started with shard 0's directory|all started with shard 0"),
        ((_e(0, 0, 0), _e(1, 1, 1, digest="x")), "another placement"),
        ((_e(0, 0, 0), _e(1, 0, 1)), "different shards"),
        ((_e(0, 0, 0), _e(1, 0, 0)), "shard\\(s\\) 1 are held by no node"),
    ]
    for entries, msg in cases:
        with pytest.raises(NodeError, match=msg):
            join(Peers(0, 2, 0, 1, 0), 0, 2, "d", "/p/node0", _everyone(*entries))


class _Cross:
    """Two nodes in one process: rank p's requests are answered by node p's serve."""

    name = "cross"

    def __init__(self, dim):
        self.serves, self.dim, self.calls = [], dim, 0

    def fetch(self, requests):
        self.calls += 1
        return [self.serves[p](r) if r.numel() else torch.empty((0, self.dim)) for p, r in enumerate(requests)]

    def stats(self):
        return {"calls": self.calls}

    def close(self):
        pass


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A 300 x 8 float32 matrix placed over two nodes (a CPU bin and an SSD bin each), W = 2 for 30 rows."""
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((300, 8)).astype(np.float32)
    hot = rng.zipf(1.5, 300).astype(np.float32)
    t = PlanTargets("toy", gpus=(("gpu0", "s0"),), stores=(StoreTarget("mem0", "cpu", "mem0", "s0", 1.0),
                                                           StoreTarget("ssd0", "ssd", "ssd0", "s0", 1.0)))
    d = tmp_path_factory.mktemp("two-nodes")
    sp = place_sharded(feats, hot, t, d, TierSpec(cpu_cache_bytes=40 * 32, ssd_dirs=[d]), PolicySpec(),
                       ShardSpec(nodes=2, replicas=2, hot_rows=0.1), fsync=False)
    return feats, hot, sp, d


def _node_sources(sp, d, cache_budget=0, hot=None, memory=None):
    ex = _Cross(8)
    out = []
    for k in range(2):
        nd = d / f"node{k}"
        store = FeatureStore(load_placement(nd), nd, features=np.load(nd / "rows.npy"), backend="posix",
                             backend_options={"processes": 0}, memory=memory)
        f = ShardedFeatures(store, sp.layout, k, sp.layout.local_index(k), np.array([0, 1]), 2, ex)
        ex.serves.append(f.serve)
        out.append(f)
    if cache_budget:
        for k, f in enumerate(out):
            ids = cache_rows(hot, sp.layout.holds(k), cache_budget)
            f.cache = RemoteCache(ids, 300, rows=f.fetch_remote(torch.from_numpy(ids)))
    return out, ex


def test_a_node_gathers_every_row_from_its_tiers_its_cache_and_the_other_node(two_nodes):
    feats, hot, sp, d = two_nodes
    assert sorted(p.name for p in d.iterdir())[:3] == ["node0", "node1", "owner.npy"]
    assert json.loads((d / "shards.json").read_text())["node"] is None
    assert [n.rows for n in sp.nodes] == [165, 165]  # 300 / 2 + 30 replicated rows / 2
    ids = torch.cat([torch.randperm(300, generator=torch.Generator().manual_seed(1)), torch.tensor([5, 5])])
    for cache in (0, 20):
        nodes, ex = _node_sources(sp, d, cache, hot)
        try:
            for f in nodes:
                got = f.gather(ids)
                assert torch.equal(got, torch.from_numpy(feats[ids.numpy()]))
                assert torch.equal(f.gather_landing(ids, dtype=torch.float64).wait(), got.double())
                t = f.totals()
                remote = int((f._local[ids] < 0).sum())
                if cache:
                    assert t["remote-cache"][0] == 2 * 20  # every cached row is among the ids
                    assert t["remote"][0] + t["remote-cache"][0] == 2 * remote
                else:
                    assert t["remote"] == (2 * remote, 2 * remote * 32)
        finally:
            for f in nodes:
                f.close()


def test_on_an_accelerator_local_rows_stay_there_and_remote_ones_go_up_in_one_copy(two_nodes):
    """The device path through the fake accelerator: the result is assembled in "device" memory, the cache's
    and the other node's rows cross once from pinned staging."""
    feats, hot, sp, d = two_nodes
    mem = FakeDeviceMemory()
    nodes, _ = _node_sources(sp, d, 20, hot, memory=mem)
    try:
        f = nodes[0]
        ids = torch.cat([torch.from_numpy(f.cache.ids[:5]), torch.tensor([0, 1, 2, 150, 299])])
        before = f.transfer.counts()
        g = f.gather_landing(ids, dtype=torch.float64)
        rows = g.wait()
        assert mem.kind_of(rows) == "device" and rows.dtype == torch.float64
        assert torch.equal(rows, torch.from_numpy(feats[ids.numpy()]).double())
        moved = f.transfer.counts().by_route
        assert moved.get(("pinned", "device"), (0, 0))[0] > before.by_route.get(("pinned", "device"), (0, 0))[0]
        assert ("pageable", "device") not in moved  # nothing uploaded from pageable memory
    finally:
        for f in nodes:
            f.close()


@pytest.mark.parametrize("on_ssd", [False, True])
def test_the_locality_cache_holds_the_hottest_remote_rows_in_memory_or_an_ssd_bin(two_nodes, tmp_path, on_ssd):
    feats, hot, sp, d = two_nodes
    nodes, _ = _node_sources(sp, d)
    try:
        f = nodes[1]
        opts = ShardedOptions(remote_cache_bytes=25 * 32, remote_cache_dir=str(tmp_path) if on_ssd else None)
        f.cache = _fill_cache(f, d / "node1", sp.layout, opts, Peers(0, 1, 0, 1, 0), None)
        assert len(f.cache) == 25 and ("SSD bin" in f.cache.where) == on_ssd
        assert (f.cache.ids == cache_rows(hot, sp.layout.holds(1), 25)).all()
        assert not sp.layout.holds(1)[f.cache.ids].any()  # only rows of the other node
        ids = torch.from_numpy(f.cache.ids)
        assert torch.equal(f.gather(ids), torch.from_numpy(feats[f.cache.ids]))
        assert f.totals()["remote-cache"][0] == 25 and f.totals()["remote"][0] == 0
    finally:
        for f in nodes:
            f.close()


def test_serving_a_row_the_node_does_not_hold_is_refused(two_nodes):
    feats, hot, sp, d = two_nodes
    nodes, _ = _node_sources(sp, d)
    try:
        missing = int(np.flatnonzero(~sp.layout.holds(0))[0])
        with pytest.raises(NodeError, match=f"vertex {missing}"):
            nodes[0].serve(torch.tensor([missing]))
    finally:
        for f in nodes:
            f.close()


def test_a_broken_collective_is_one_line_naming_when():
    err = PeerLostError.of(
        RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
            "peer [127.0.0.1]:6560. This is typically caused by a crash"
        ),
        "epoch 1, step 3",
    )
    assert str(err).startswith("epoch 1, step 3: another rank died or stopped answering (Connection closed by peer "
                               "[127.0.0.1]:6560); ")
    assert "`resume`" in str(err) and "\n" not in str(err)


# ----------------------------------------------------------------------------------------------
# moment place --nodes


def test_place_nodes_writes_one_directory_per_node(tmp_path, capsys):
    from training.importers import import_dataset

    cora = import_dataset(graph_fixture("cora"), tmp_path / "cora")
    out = tmp_path / "pl"
    ssd = [a for _ in range(8) for a in ("--ssd", str(out))]
    args = ["place", "--dataset", str(cora), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache", "1MiB",
            *ssd, "--fanouts=-1,-1", "--out", str(out)]
    assert main([*args, "--nodes", "3", "--replicas", "2", "--hot-rows", "0.1", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["num_nodes"] == 3 and rep["replicas"] == 2 and rep["hot_rows"] == 271
    lay, man = load_layout(out)
    assert man["node"] is None and lay.digest() == rep["digest"]
    full = 2708 * 1433 * 4
    for k in range(3):
        nd = out / f"node{k}"
        p = load_placement(nd)
        _, nman = load_layout(nd)
        assert nman["node"] == k and p.num_vertices == lay.holds(k).sum() == rep["nodes"][k]["rows"]
        assert np.load(nd / "rows.npy", mmap_mode="r").shape == (p.num_vertices, 1433)
        assert all((nd / b.path).exists() for b in p.bins if b.kind == "ssd")  # bins inside the node's directory
        assert 1 / 3 < rep["nodes"][k]["bytes"] / full < 1 / 3 + 0.1  # 1/N plus the replicated share
    for bad, msg in ((["--nodes", "2", "--replicas", "3"], "--replicas 3: expected 1 to --nodes"),
                     (["--nodes", "2", "--hot-rows", "1.5"], "--hot-rows 1.5"),
                     (["--nodes", "2"], "holds a placement already")):
        assert main([*args, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("moment place: error:") and msg in err and "\n" not in err


def test_a_nodes_ssd_bins_go_under_each_ssd_directory_in_its_own_subdirectory(tmp_path):
    feats = np.arange(400, dtype=np.float32).reshape(100, 4)
    t = PlanTargets("toy", gpus=(("gpu0", "s0"),), stores=(StoreTarget("ssd0", "ssd", "ssd0", "s0", 1.0),
                                                           StoreTarget("ssd1", "ssd", "ssd1", "s0", 1.0)))
    out, a, b = tmp_path / "out", tmp_path / "nvme0", tmp_path / "nvme1"
    sp = place_sharded(feats, np.ones(100), t, out, TierSpec(ssd_dirs=[a, b]), PolicySpec(), ShardSpec(nodes=2),
                       fsync=False)
    for k, n in enumerate(sp.nodes):
        p = load_placement(out / f"node{k}")
        paths = sorted(Path(x.path).parent for x in p.bins if x.kind == "ssd")
        assert paths == [a / f"node{k}", b / f"node{k}"]
        with FeatureStore(p, out / f"node{k}", backend="posix", backend_options={"processes": 0}) as s:
            rows = sp.layout.rows_of(k)
            assert np.array_equal(s.gather(torch.arange(n.rows)).numpy(), feats[rows])
