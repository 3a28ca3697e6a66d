"""Replica groups (DDStore's width): W full replicas of the rows over N/W nodes each, exchanging only within a group.

The layout (every row once per group, memory per node = rows / (N/W), served
only from the own group), the format (a layout of one group is written and
named as before), the refusals, an in-process gather over 2 groups of 2 nodes
that records who asked whom (for the all-to-all and for RPC), and ``moment train`` on 2 nodes as 2 groups of
one (each serves itself: no remote rows) with 4 nodes as 2 groups of 2 marked heavy (all-to-all, RPC, and
partition ownership within the groups, each against one process's losses).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.errors import StoreError
from iostack.placement import load_placement
from iostack.shards import ShardLayout, load_layout, partition_rows, shard_rows
from iostack.store import FeatureStore
from moment.cli import main
from planner.handoff import PlanTargets, StoreTarget
from tests.conftest import flat_spec
from tests.nodes_launch import launch, log, wait_all
from tests.test_nodes import CFG, COMMON, _steps, _train, cora  # noqa: F401  (cora: the module's fixture)
from training.data import open_dataset
from training.hotness import degree_from_csr
from training.place.bins import PlacingError
from training.place.nodes import place_sharded
from training.place.specs import PolicySpec, ShardSpec, TierSpec
from training.sharded.features import ShardedFeatures
from training.sharded.groups import exchange_peers
from training.trainer import train

TOY = PlanTargets("toy", gpus=(("gpu0", "s0"),), stores=(StoreTarget("mem0", "cpu", "mem0", "s0", 1.0),))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=200), st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 1),
                                                                                 (4, 2), (4, 4), (6, 3), (8, 2)]),
       st.data())
def test_every_group_holds_every_row_once_and_serves_only_itself(hot, nw, data):
    n, w = nw
    h = np.array(hot, np.float32)
    lay = shard_rows(h, n, groups=w)
    s = n // w
    held = np.stack([lay.holds(k) for k in range(n)])  # [N, V]
    for g in range(w):
        assert (held[g * s:(g + 1) * s].sum(axis=0) == 1).all()  # once per group
    per_node = held.sum(axis=1)
    assert per_node.max() - per_node.min() <= 1 and per_node.sum() == w * h.size  # rows / (N/W) each
    assert (lay.bytes_per_node(4) == per_node * 4).all()
    node = data.draw(st.integers(0, n - 1))
    ids = np.flatnonzero(~held[node])
    srv = lay.server_of(ids, node)
    assert all(srv // s == node // s) and held[srv, ids].all()  # a holder, in the own group


def test_groups_with_hot_rows_inside_a_group():
    lay = shard_rows(np.arange(12.0), 4, replicas=2, hot_rows=2, groups=2)
    held = np.stack([lay.holds(k) for k in range(4)])
    assert held[:2, 11].all() and held[2:, 11].all() and held[:2].sum() == 14  # 12 rows + 2 hot rows twice


def test_one_group_is_the_layout_before_groups_and_groups_round_trip(tmp_path):
    h = np.random.default_rng(0).zipf(1.5, 100).astype(np.float32)
    one = shard_rows(h, 4, replicas=2, hot_rows=10)
    assert one.digest() == ShardLayout(4, 2, one.owner, one.width, hot_rows=10).digest()
    one.save(tmp_path / "a", node=None)
    assert "groups" not in json.loads((tmp_path / "a" / "shards.json").read_text())  # the format of before
    assert load_layout(tmp_path / "a")[0].groups == 1
    two = shard_rows(h, 4, groups=2)
    two.save(tmp_path / "b", node=1)
    back, man = load_layout(tmp_path / "b")
    assert man["groups"] == 2 and back.groups == 2 and back.digest() == two.digest() != shard_rows(h, 2).digest()
    assert back.rows_of(1).tolist() == two.rows_of(3).tolist()


def test_groups_that_do_not_split_the_nodes_are_refused_naming_both(cora, capsys, tmp_path):  # noqa: F811
    with pytest.raises(StoreError, match=r"`groups` 3: .*`num_nodes` 4"):
        shard_rows(np.ones(5), 4, groups=3)
    with pytest.raises(PlacingError, match=r"`groups` 3: .*`nodes` 4"):
        ShardSpec(nodes=4, groups=3)
    with pytest.raises(PlacingError, match="`replicas` 3"):
        ShardSpec(nodes=4, replicas=3, groups=2)
    out = tmp_path / "pl"
    args = ["place", "--dataset", str(cora), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache", "1MiB",
            "--fanouts=-1,-1", "--out", str(out), "--json", *[a for _ in range(8) for a in ("--ssd", str(out))]]
    assert main([*args, "--nodes", "4", "--replica-groups", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--replica-groups 3" in err[0] and "--nodes 4" in err[0], err
    assert not out.exists()  # refused before anything is written
    assert main([*args, "--nodes", "2", "--replica-groups", "2"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["groups"] == 2 and [n["rows"] for n in rep["nodes"]] == [2708, 2708]


class _Recorder:
    """An exchange among in-process nodes of one group: ``requests[p]`` goes to the group's ``p``-th node."""

    name = "recorder"

    def __init__(self, node, members, serves, log_):
        self.node, self.members, self.serves, self.log = node, members, serves, log_

    def fetch(self, requests):
        out = []
        for p, r in enumerate(requests):
            if r.numel():
                self.log.append((self.node, self.members[p]))
            out.append(self.serves[self.members[p]](r) if r.numel() else torch.empty((0, 8)))
        return out

    def stats(self):
        return {}

    def close(self):
        pass


@pytest.mark.parametrize("exchange", ["alltoall", "rpc"])
def test_four_nodes_as_two_groups_gather_exactly_and_ask_only_their_group(tmp_path, exchange):
    """The all-to-all's requests are indexed within the group (a process group of its own); RPC's by global rank
    in one RPC world, where only the group's ranks get requests (RPC asks only ranks with requests)."""
    rng = np.random.default_rng(1)
    feats = rng.standard_normal((200, 8)).astype(np.float32)
    sp = place_sharded(feats, rng.zipf(1.5, 200).astype(np.float32), TOY, tmp_path, TierSpec(cpu_cache_bytes=1 << 20),
                       PolicySpec(), ShardSpec(nodes=4, hot_rows=0.0, groups=2), fsync=False)
    lay = sp.layout
    assert [n.rows for n in sp.nodes] == [100] * 4  # rows / (N/W)
    ranks_of = tuple((k,) for k in range(4))  # one rank per node
    serves, asked, nodes = {}, [], []
    for k in range(4):
        nd = tmp_path / f"node{k}"
        ex = exchange_peers(lay, ranks_of, k, np.arange(4), 4, exchange)
        assert ex.ranks == ((0, 1) if k < 2 else (2, 3))
        members = ex.ranks if exchange == "alltoall" else tuple(range(4))
        assert (ex.groups is not None) == (exchange == "alltoall") and ex.size == len(members)
        store = FeatureStore(load_placement(nd), nd, features=np.load(nd / "rows.npy"), backend="posix",
                             backend_options={"processes": 0})
        f = ShardedFeatures(store, lay, k, lay.local_index(k), ex.server, ex.size,
                            _Recorder(k, members, serves, asked))
        serves[k] = f.serve
        nodes.append(f)
    try:
        ids = torch.randperm(200, generator=torch.Generator().manual_seed(2))
        for f in nodes:
            assert torch.equal(f.gather(ids), torch.from_numpy(feats[ids.numpy()]))
            assert f.totals()["remote"][0] == 100  # half the rows: the other node of its group
    finally:
        for f in nodes:
            f.close()
    assert sorted(set(asked)) == [(0, 1), (1, 0), (2, 3), (3, 2)]  # never across groups


def _grouped(cora_dir, out, nodes, groups, layout=None):
    ds = open_dataset(cora_dir)
    hot = degree_from_csr(np.asarray(ds.indptr), np.asarray(ds.indices)).astype(np.float32)
    place_sharded(ds.features, hot, TOY, out, TierSpec(cpu_cache_bytes=4000 * ds.row_bytes), PolicySpec(),
                  ShardSpec(nodes=nodes, hot_rows=0.0, groups=groups), fsync=False, layout=layout)
    return out


def _run_grouped(cora_dir, shards, nodes, tmp_path, *extra):
    m = tmp_path / "m.jsonl"
    args = ["--batch-size", "35", "--epochs", "1", "--metrics", str(m), *extra]
    procs = launch([_train(shards / f"node{k}", *args, cora=cora_dir) for k in range(nodes)], logs=tmp_path / "logs")
    codes = wait_all(procs)
    assert codes == [[0]] * nodes, "".join(log(tmp_path / "logs", k)[-1500:] for k in range(nodes))
    one = []
    train(flat_spec(dataset=str(cora_dir), batch_size=35, epochs=1, **CFG),
          progress=lambda r: one.append(r["loss"]) if r["kind"] == "step" else None)
    np.testing.assert_allclose([r["loss"] for r in _steps(m)], one, rtol=1e-5)  # the rows arrive exact
    ep = [r for r in map(json.loads, m.read_text().splitlines()) if r["kind"] == "epoch"]
    assert "groups 2;" in " ".join(log(tmp_path / "logs", 0).split())
    return ep[-1]["nodes"]


def test_two_nodes_as_two_groups_of_one_serve_themselves(cora, tmp_path):  # noqa: F811
    """Each node a full replica: every row local, nothing crosses nodes, the losses one process's."""
    nodes = _run_grouped(cora, _grouped(cora, tmp_path / "p", 2, 2), 2, tmp_path)
    assert nodes["remote_rows"] == 0 and nodes["served_rows"] == 0 and nodes["remote_share"] == 0.0
    assert nodes["local_rows"] > 0


@pytest.mark.heavy  # four node processes (~20 s)
def test_four_nodes_as_two_groups_of_two_exchange_within_their_group(cora, tmp_path):  # noqa: F811
    """With a locality cache of the group's other node's hottest rows (filled through the group's exchange too)."""
    nodes = _run_grouped(cora, _grouped(cora, tmp_path / "p", 4, 2), 4, tmp_path, "--remote-cache", "64KiB")
    assert nodes["remote_rows"] > 0 and nodes["cache_rows"] > 0
    assert nodes["served_rows"] > nodes["remote_rows"]  # the batches' rows and, in this first epoch, the cache's fill
    assert 0.2 < nodes["remote_share"] + nodes["cache_share"] < 0.8  # half a group's rows are on its other node
    # rank 0 (the one that prints) exchanges on a group of its replica group's ranks alone
    assert "exchange alltoall within ranks 0, 1" in " ".join(log(tmp_path / "logs", 0).split())  # lines wrap


@pytest.mark.heavy  # four node processes over TensorPipe RPC (~30 s)
def test_four_nodes_as_two_groups_of_two_over_rpc_train_what_one_process_trains(cora, tmp_path):  # noqa: F811
    """``--exchange rpc``: one RPC world, but every request goes to a holder in the asking node's group."""
    nodes = _run_grouped(cora, _grouped(cora, tmp_path / "p", 4, 2), 4, tmp_path, "--exchange", "rpc")
    assert nodes["exchange"] == "rpc" and nodes["remote_rows"] > 0
    assert nodes["served_rows"] == nodes["remote_rows"]  # every row asked for was served, by a peer
    assert 0.3 < nodes["remote_share"] < 0.7  # half a group's rows are on its other node
    assert "exchange rpc within ranks 0, 1" in " ".join(log(tmp_path / "logs", 0).split())


def test_the_plans_remote_share_of_groups_is_what_sampled_batches_read(cora, capsys):  # noqa: F811
    """``moment plan --nodes 4 --replica-groups 2``'s model (1 - W/N) against the rows 4 ranks' batches gather."""
    from planner.errors import PlannerError
    from planner.multinode import remote_share as model
    from training.partition.quality import remote_share as sampled

    ds = open_dataset(cora)
    hot = degree_from_csr(np.asarray(ds.indptr), np.asarray(ds.indices)).astype(np.float32)
    layouts = {f"g{w}": shard_rows(hot, 4, groups=w) for w in (1, 2, 4)}
    got = sampled(ds, np.arange(ds.num_nodes) % 4, layouts, batch_size=35, batches_per_rank=4)
    for w in (1, 2, 4):
        assert got.share(f"g{w}") == pytest.approx(model(4, groups=w), abs=0.05)
    with pytest.raises(PlannerError, match="groups 3"):
        model(4, groups=3)
    assert main(["plan", "--machine", "moment-b", "--gpus", "2", "--ssds", "4", "--nodes", "4",
                 "--replica-groups", "3", "--top", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--replica-groups 3" in err[0] and "--nodes 4" in err[0], err


# --- replica groups with partition ownership: each group's N/G nodes hold one partition each


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([(2, 2), (3, 2), (2, 3), (4, 2), (2, 1)]), st.integers(1, 120), st.data())
def test_partitions_split_every_group_alike(sg, v, data):
    s, g = sg
    part_of = np.array(data.draw(st.lists(st.integers(0, s - 1), min_size=v, max_size=v)))
    lay = partition_rows(part_of, num_nodes=s * g, groups=g)
    assert lay.groups == g and lay.group_size == s
    held = np.stack([lay.holds(k) for k in range(s * g)])
    for k in range(s * g):
        assert np.array_equal(held[k], part_of == k % s)  # node k: partition k mod S, in every group
    node = data.draw(st.integers(0, s * g - 1))
    ids = np.flatnonzero(~held[node])
    srv = lay.server_of(ids, node)
    assert all(srv // s == node // s) and held[srv, ids].all()  # its partition's holder in its own group
    with pytest.raises(StoreError, match="one partition a node"):
        partition_rows(np.append(part_of, s), num_nodes=s * g, groups=g)  # a partition more than a group's nodes


def test_place_groups_with_partition_ownership(cora, capsys, tmp_path):  # noqa: F811
    """``moment place --nodes 4 --replica-groups 2 --partition P`` with P of 2 parts; other part counts refused."""
    for parts in (2, 4):
        assert main(["data", "partition", str(cora), str(tmp_path / f"c{parts}"), "--parts", str(parts),
                     "--method", "ldg", "--presample-batches", "0"]) == 0
    capsys.readouterr()
    ssd = [a for _ in range(8) for a in ("--ssd", str(tmp_path / "ssd"))]
    common = ["place", "--dataset", str(cora), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache", "1MiB",
              *ssd, "--fanouts=-1,-1", "--json"]
    assert main([*common, "--nodes", "4", "--replica-groups", "2", "--partition", str(tmp_path / "c2"), "--out",
                 str(tmp_path / "pl")]) == 0
    rep = json.loads(capsys.readouterr().out)
    part_of = np.load(tmp_path / "c2" / "part_of.npy")
    assert rep["groups"] == 2 and [n["rows"] for n in rep["nodes"]] == [int((part_of == k % 2).sum()) for k in range(4)]
    lay, man = load_layout(tmp_path / "pl" / "node3")
    assert man["groups"] == 2 and np.array_equal(lay.owner, part_of)
    assert np.array_equal(lay.rows_of(3), np.flatnonzero(part_of == 1))
    for bad, why in ((["--nodes", "4", "--replica-groups", "2", "--partition", str(tmp_path / "c4")],
                      ["--partition", "--nodes 4", "--replica-groups 2", "4 parts"]),
                     (["--nodes", "2", "--replica-groups", "2", "--partition", str(tmp_path / "c2")],
                      ["--partition", "--nodes 2", "--replica-groups 2", "per replica group"])):
        out = tmp_path / "refused"
        assert main([*common, *bad, "--out", str(out)]) == 2
        err = [ln for ln in capsys.readouterr().err.strip().splitlines() if "warning:" not in ln]  # the SSD's
        assert len(err) == 1 and all(w in err[0] for w in why), err
        assert not (out / "shards.json").exists()


@pytest.mark.heavy  # four node processes (~30 s)
def test_four_nodes_as_two_groups_with_partition_ownership_train_what_one_process_trains(cora, tmp_path):  # noqa: F811
    from training.partition.owners import partition_layout

    assert main(["data", "partition", str(cora), str(tmp_path / "c2"), "--parts", "2", "--method", "ldg",
                 "--presample-batches", "0"]) == 0
    lay = partition_layout(open_dataset(cora), tmp_path / "c2", 4, groups=2)
    nodes = _run_grouped(cora, _grouped(cora, tmp_path / "p", 4, 2, layout=lay), 4, tmp_path)
    assert nodes["remote_rows"] > 0 and 0.2 < nodes["remote_share"] < 0.8
    assert "exchange alltoall within ranks 0, 1" in " ".join(log(tmp_path / "logs", 0).split())
