"""Placement that knows the partition (issue 32 item 3): each node's rows placed by DDAK with its own plan and its own
reads, the locality cache filled with the halo rows its batches read most (training/place/node_reads.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.placement import load_placement
from iostack.shards import partition_rows
from iostack.store import FeatureStore
from planner.handoff import PlanTargets, StoreTarget
from tests.conftest import graph_fixture
from training.data import open_dataset
from training.hotness import HotnessSpec, presample_counts
from training.place.bins import PlacingError
from training.place.node_reads import halo_ranking, node_hotness, node_seeds, partition_halos, served_hotness
from training.place.nodes import place_sharded
from training.place.specs import PolicySpec, ShardSpec, TierSpec

SPEC = HotnessSpec("presample", fanouts=(10, 5), batch_size=64, epochs=1.0)


@pytest.fixture(scope="module")
def cora2(tmp_path_factory) -> tuple[Path, Path]:
    """Cora imported and partitioned into 2 (the default partitioner)."""
    from moment.cli import main

    root = tmp_path_factory.mktemp("cora-part")
    assert main(["data", "import", str(graph_fixture("cora")), str(root / "cora")]) == 0
    assert main(["data", "partition", str(root / "cora"), str(root / "c2"), "--parts", "2",
                 "--presample-batches", "0"]) == 0
    return root / "cora", root / "c2"


def _targets(name: str, gpu: float, cpu: float, ssd: float) -> PlanTargets:
    return PlanTargets(name, gpus=(("gpu0", "s0"),), stores=(
        StoreTarget("gpu0", "gpu", "gpu0", "s0", gpu), StoreTarget("mem0", "cpu", "mem0", "s0", cpu),
        StoreTarget("ssd0", "ssd", "ssd0", "s0", ssd)))


def test_each_node_places_its_own_rows_by_its_own_plan_hottest_first_exact_data(cora2, tmp_path):
    cora, c2 = cora2
    ds = open_dataset(cora)
    part_of = np.load(c2 / "part_of.npy")
    lay = partition_rows(part_of)
    cache_rows = 40
    nh = node_hotness(ds, lay, SPEC, cache_rows=cache_rows, halos=partition_halos(str(c2), 2))
    plans = [_targets("plan-a", 3.0, 1.0, 1.0), _targets("plan-b", 0.5, 1.0, 4.0)]  # two servers, unlike
    rb = ds.row_bytes
    out = tmp_path / "pl"
    sp = place_sharded(ds.features, np.zeros(ds.num_nodes), plans, out,
                       TierSpec(gpu_cache_bytes=60 * rb, cpu_cache_bytes=200 * rb, ssd_dirs=[out]), PolicySpec(),
                       ShardSpec(nodes=2, partition=str(c2)), layout=lay, node_hot=nh, fsync=False)
    feats = np.asarray(ds.features)
    for k in range(2):
        d = out / f"node{k}"
        rows = lay.rows_of(k)
        assert np.array_equal(rows, np.flatnonzero(part_of == k))  # its partition's rows, nothing else
        pl = load_placement(d)
        assert pl.num_vertices == rows.size == sp.nodes[k].rows
        assert json.loads((d / "place.json").read_text())["plan"] == plans[k].source
        # every row, read back through the node's own store (its GPU, CPU and SSD bins), is the dataset's row
        store = FeatureStore(pl, d, features=np.load(d / "rows.npy"), backend="posix")
        try:
            got = store.gather(torch.arange(rows.size)).numpy()
        finally:
            store.close()
        assert np.array_equal(got, feats[rows])
        # the fastest tier holds the node's hottest rows by its own reads plus what it serves
        hot = nh.hotness[k]
        gpu = pl.vertices_of(next(b.id for b in pl.bins if b.kind == "gpu"))
        ssd = np.concatenate([pl.vertices_of(b.id) for b in pl.bins if b.kind == "ssd"])
        assert int(np.argmax(hot)) in set(gpu.tolist())
        assert hot[gpu].mean() > hot[ssd].mean()
    # each node's bins follow its own plan: plan-b sends more of its reads to the SSD than plan-a
    shares = [{kind: sum(b.traffic_share for b in n.result.report.bins if b.kind == kind) for kind in ("gpu", "ssd")}
              for n in sp.nodes]
    assert shares[1]["ssd"] > shares[0]["ssd"] and shares[1]["gpu"] < shares[0]["gpu"]
    halo = np.load(out / "node0" / "halo.npy")
    assert np.array_equal(halo, nh.halo[0]) and not lay.holds(0)[halo].any()


def test_the_node_hotness_is_its_own_reads_plus_what_it_serves(cora2):
    """Against a direct count: node k's hotness of row r is node k's reads of it plus the other node's reads of it
    that its locality cache does not absorb; each node's reads are a pre-sample of its own seeds only."""
    cora, c2 = cora2
    ds = open_dataset(cora)
    lay = partition_rows(np.load(c2 / "part_of.npy"))
    nh = node_hotness(ds, lay, SPEC, cache_rows=25)
    seeds = node_seeds(np.asarray(ds.train_idx), lay)
    assert sum(s.size for s in seeds) == ds.train_idx.shape[0]
    for k in range(2):  # each node's reads: its own seeds' batches, which stay mostly in its partition
        assert (nh.reads[k][seeds[k]] > 0).all()
        assert nh.reads[k][lay.holds(k)].sum() > 0.8 * nh.reads[k].sum()
    assert nh.epochs == 3.0  # one epoch asked for, MIN_EPOCHS taken
    for k in range(2):
        j = 1 - k
        rows = lay.rows_of(k)
        served = nh.reads[j][rows].copy()
        served[np.isin(rows, nh.halo[j][:25])] = 0
        np.testing.assert_allclose(nh.hotness[k], nh.reads[k][rows] + served, rtol=1e-6)
    # the caches' rows are the remote rows the node's own batches read most
    for k in range(2):
        top = nh.halo[k][:25]
        assert not lay.holds(k)[top].any()
        remote = np.flatnonzero(~lay.holds(k))
        assert nh.reads[k][top].min() >= np.sort(nh.reads[k][remote])[::-1][24]


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.integers(5, 40), st.integers(0, 10), st.data())
def test_every_read_is_counted_once_by_the_node_that_answers_it(nodes, v, cached, data):
    """The total over the nodes is every read, less those the caches absorb, with hot rows on several nodes."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    part_of = rng.integers(0, nodes, v)
    part_of[:nodes] = np.arange(nodes)
    reads = (rng.random((nodes, v)) * (rng.random((nodes, v)) < 0.6)).astype(np.float32)
    replicas = data.draw(st.integers(1, nodes))
    lay = partition_rows(part_of, reads.sum(0), replicas, data.draw(st.integers(0, v)), num_nodes=nodes)
    caches = [halo_ranking(reads[k], lay.holds(k))[:cached] for k in range(nodes)]
    hot = served_hotness(reads, lay, caches)
    absorbed = sum(float(reads[k][caches[k]].sum()) for k in range(nodes))
    assert sum(float(h.sum()) for h in hot) == pytest.approx(float(reads.sum()) - absorbed, rel=1e-5, abs=1e-5)
    for k in range(nodes):
        assert hot[k].size == lay.rows_of(k).size and (hot[k] >= reads[k][lay.rows_of(k)] - 1e-6).all()


def test_halo_ranking_puts_the_partitions_unread_halo_rows_last():
    reads = np.array([0., 4., 0., 2., 2., 0.])
    held = np.array([True, False, False, False, False, True])
    assert halo_ranking(reads, held, np.array([2, 5, 0])).tolist() == [1, 3, 4, 2]


def test_plans_must_be_one_per_node(cora2, tmp_path):
    cora, c2 = cora2
    ds = open_dataset(cora)
    with pytest.raises(PlacingError, match="3 plans for 2 nodes"):
        place_sharded(ds.features, np.ones(ds.num_nodes), [_targets("a", 1, 1, 1)] * 3, tmp_path / "p",
                      TierSpec(ssd_dirs=[tmp_path / "p"]), PolicySpec(), ShardSpec(nodes=2))


def test_training_fills_the_locality_cache_from_the_placements_halo_list(cora2, tmp_path):
    """Cora over two partition nodes: node 1's cache takes halo.npy's first rows through the exchange, exact."""
    from tests.test_shards import _Cross
    from training.sharded.features import Peers, ShardedFeatures, ShardedOptions, _fill_cache

    cora, c2 = cora2
    ds = open_dataset(cora)
    lay = partition_rows(np.load(c2 / "part_of.npy"))
    nh = node_hotness(ds, lay, SPEC, halos=partition_halos(str(c2), 2))
    budget = int((nh.reads[1][nh.halo[1]] > 0).sum()) + 10
    assert budget < nh.halo[1].size  # the partition's unread halo rows fill the last 10
    out = tmp_path / "pl"
    place_sharded(ds.features, np.ones(ds.num_nodes), _targets("a", 1, 1, 1), out,
                  TierSpec(cpu_cache_bytes=100 * ds.row_bytes, ssd_dirs=[out]), PolicySpec(),
                  ShardSpec(nodes=2), layout=lay, node_hot=nh, fsync=False)
    ex = _Cross(ds.features.shape[1])
    nodes = []
    for k in range(2):
        nd = out / f"node{k}"
        store = FeatureStore(load_placement(nd), nd, features=np.load(nd / "rows.npy"), backend="posix",
                             backend_options={"processes": 0})
        f = ShardedFeatures(store, lay, k, lay.local_index(k), np.array([0, 1]), 2, ex)
        ex.serves.append(f.serve)
        nodes.append(f)
    try:
        f = nodes[1]
        opts = ShardedOptions(remote_cache_bytes=budget * ds.row_bytes)
        f.cache = _fill_cache(f, out / "node1", lay, opts, Peers(0, 1, 0, 1, 0), None)
        assert np.array_equal(f.cache.ids, nh.halo[1][:budget])
        ids = torch.from_numpy(np.concatenate([nh.halo[1][:budget], lay.rows_of(1)[:10]]))
        assert torch.equal(f.gather(ids), torch.from_numpy(np.asarray(ds.features)[ids.numpy()]))
        t = f.totals()
        assert t["remote-cache"][0] == budget and t["remote"][0] == 0
    finally:
        for f in nodes:
            f.close()


def test_cli_places_each_node_by_its_own_plan_and_writes_the_halo_list(cora2, tmp_path, capsys):
    from moment.cli import main

    cora, c2 = cora2
    assert main(["plan", "--machine", "moment-b", "--json"]) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(capsys.readouterr().out)
    ssd = [a for _ in range(8) for a in ("--ssd", str(tmp_path / "ssd"))]
    common = ["place", "--dataset", str(cora), "--gpu-cache", "64KiB", "--cpu-cache", "256KiB", *ssd,
              "--fanouts", "10,5", "--batch-size", "64", "--nodes", "2", "--partition", str(c2)]
    assert main([*common, "--plans", f"{plan},{plan}", "--halo-cache", "100KiB", "--out", str(tmp_path / "pl")]) == 0
    assert "--remote-share" in capsys.readouterr().out
    rep = json.loads((tmp_path / "pl" / "place.json").read_text())
    assert rep["node_plans"] == [f"--plans {plan} (node 0)", f"--plans {plan} (node 1)"]
    assert rep["halo_cache_bytes"] == 100 * 1024
    shares = rep["presampled_remote_share"]  # Cora's METIS halves: few remote reads, fewer with the caches
    assert 0 < shares["halo_cache"] < shares["no_cache"] < 0.2
    for k in range(2):
        halo = np.load(tmp_path / "pl" / f"node{k}" / "halo.npy")
        assert halo.size and not (np.load(c2 / "part_of.npy")[halo] == k).any()
    assert main([*common, "--plans", str(plan), "--out", str(tmp_path / "p2")]) == 2
    assert "--plans: 1 plan files for --nodes 2" in capsys.readouterr().err
    assert main([*common[:-2], "--plan", str(plan), "--halo-cache", "1KiB", "--out", str(tmp_path / "p3")]) == 2
    assert "--halo-cache 1024: the halo cache is a partition's; give --partition too" in capsys.readouterr().err


def test_the_hotness_deal_keeps_the_datasets_hotness_and_writes_no_halo_list(cora2, tmp_path):
    cora, _ = cora2
    ds = open_dataset(cora)
    hot = presample_counts(ds, SPEC)[0].astype(np.float32)
    out = tmp_path / "pl"
    sp = place_sharded(ds.features, hot, _targets("a", 1, 1, 1), out,
                       TierSpec(gpu_cache_bytes=30 * ds.row_bytes, cpu_cache_bytes=100 * ds.row_bytes,
                                ssd_dirs=[out]), PolicySpec(), ShardSpec(nodes=2), fsync=False)
    for k in range(2):
        assert not (out / f"node{k}" / "halo.npy").exists()
        pl = load_placement(out / f"node{k}")
        gpu = pl.vertices_of(next(b.id for b in pl.bins if b.kind == "gpu"))
        assert int(np.argmax(hot[sp.layout.rows_of(k)])) in set(gpu.tolist())


def test_the_benchmark_measures_partition_below_hash_and_predicts_the_exchange(cora2, tmp_path, monkeypatch):
    import importlib.util

    tools = Path(__file__).resolve().parents[1] / "tools"
    monkeypatch.syspath_prepend(str(tools))
    spec = importlib.util.spec_from_file_location("bench_partition_place", tools / "bench_partition_place.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cora, _ = cora2
    row = mod.measure("cora", cora, tmp_path, 2, 0.05, 1, 0.05, 1.0)
    c = row["configs"]
    assert set(c) == {"partition", "partition+cache", "partition+hotcache", "hash", "hash+cache"}
    assert c["partition"]["remote_share_median"] < c["hash"]["remote_share_median"] / 3
    assert 0.4 < c["hash"]["remote_share_all_steps"] < 0.6 and c["hash"]["predicted_share"] == 0.5
    assert c["partition+cache"]["remote_share_all_steps"] <= c["partition"]["remote_share_all_steps"]
    for x in c.values():  # the plan's bytes are its share of what a node's batch gathers, as measured
        assert x["predicted_bytes_per_node_step"] == pytest.approx(
            x["predicted_share"] * row["gathered_bytes_per_node_step"], rel=1e-3)
        assert x["remote_share_min"] <= x["remote_share_median"] <= x["remote_share_max"]
    assert c["partition"]["feature_bytes_node_share"] == pytest.approx(0.5, abs=0.02)
    figs = mod.figures([row], "today")
    assert len(figs) == 2 + 1 + 1 + 1 + 2 + len(c)


@pytest.mark.heavy  # starts two node processes that import torch (~15 s)
def test_two_nodes_train_over_a_partition_placement_with_its_halo_cache_what_one_process_trains(cora2, tmp_path):
    """`moment place --nodes 2 --partition` (each node's own reads, halo.npy), then two nodes training with
    `--remote-cache`: the cache holds halo.npy's first rows, serves reads, and the losses are one process's."""
    from moment.cli import main
    from tests.conftest import flat_spec
    from tests.nodes_launch import launch, log, wait_all
    from tests.test_nodes import CFG, _steps, _train
    from training.trainer import train

    cora, c2 = cora2
    ssd = [a for _ in range(8) for a in ("--ssd", str(tmp_path / "ssd"))]
    assert main(["place", "--dataset", str(cora), "--machine", "moment-b", "--gpu-cache", "64KiB", "--cpu-cache",
                 "256KiB", *ssd, "--fanouts", "10,5", "--batch-size", "35", "--nodes", "2", "--partition", str(c2),
                 "--halo-cache", "256KiB", "--out", str(tmp_path / "pl")]) == 0
    m = tmp_path / "m.jsonl"
    args = ["--batch-size", "35", "--epochs", "2", "--metrics", str(m), "--remote-cache", "256KiB"]
    procs = launch([_train(tmp_path / "pl" / f"node{k}", *args, cora=cora) for k in range(2)], logs=tmp_path / "logs")
    assert wait_all(procs) == [[0], [0]], log(tmp_path / "logs", 0)[-2000:] + log(tmp_path / "logs", 1)[-2000:]
    rows = 256 * 1024 // open_dataset(cora).row_bytes
    assert f"locality cache: {rows:,} remote rows" in log(tmp_path / "logs", 0)
    epochs = [r for r in map(json.loads, m.read_text().splitlines()) if r["kind"] == "epoch"]
    assert epochs and all(r["nodes"]["cache_rows"] > 0 for r in epochs)
    one: list[float] = []
    train(flat_spec(dataset=str(cora), batch_size=35, epochs=2, **CFG),
          progress=lambda r: one.append(r["loss"]) if r["kind"] == "step" else None)
    np.testing.assert_allclose([r["loss"] for r in _steps(m)], one, rtol=1e-5)


def test_moment_plan_takes_the_remote_share_a_partition_placement_measured(cora2, tmp_path, capsys):
    from moment.cli import main

    cora, c2 = cora2
    ssd = [a for _ in range(8) for a in ("--ssd", str(tmp_path / "ssd"))]
    assert main(["place", "--dataset", str(cora), "--machine", "moment-b", "--gpu-cache", "64KiB", "--cpu-cache",
                 "256KiB", *ssd, "--fanouts", "10,5", "--batch-size", "64", "--nodes", "2", "--partition", str(c2),
                 "--out", str(tmp_path / "pl"), "--json"]) == 0
    share = json.loads(capsys.readouterr().out)["presampled_remote_share"]["no_cache"]
    plan = ["plan", "--machine", "moment-b", "--nics", "1", "--top", "1", "--json"]
    assert main([*plan, "--nodes", "2", "--remote-share-of", str(tmp_path / "pl")]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert nodes["remote_share"] == share  # the NIC then carries that share of the node's 4 GPUs' reads
    assert sum(nodes["nic_placements"][0]["nic_in_bytes"].values()) == pytest.approx(share * 4e9, rel=1e-6)
    assert main([*plan, "--nodes", "4", "--remote-share-of", str(tmp_path / "pl")]) == 2
    assert "placed over 2 nodes, --nodes is 4" in capsys.readouterr().err


def test_halo_cache_with_replica_groups_is_refused_in_one_line():
    """A halo cache is chosen from each node's own reads, which replica groups split differently: refused, naming
    both parameters, rather than a cache fitted to reads the nodes never make."""
    from training.place.bins import PlacingError

    with pytest.raises(PlacingError, match="`halo_cache_bytes`.*`groups` 2"):
        ShardSpec(nodes=4, groups=2, partition="parts", halo_cache_bytes=1 << 20)
    assert ShardSpec(nodes=4, groups=2, partition="parts").halo_cache_bytes == 0
