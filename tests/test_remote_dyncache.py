"""The remote-row cache of a sharded run filling on access (issue 33 item 1): ``--cache-policy`` on ``--remote-cache``.

In process: two nodes of a sharded placement, each a :class:`ShardedFeatures` asking the other through an
exchange that calls the holder's ``serve``; the remote cache warm-started with the static fill, then gathers
over epochs whose ids drift. The rows are exact across evictions; the cache holds, after every batch, exactly
what an :class:`~iostack.dyncache.RowCache` of the same policy holds when given the batch's remote ids (so its
eviction order is the policy's, pinned in tests/test_dyncache.py); under drift it leaves fewer rows remote than
the static fill. Two node processes (heavy): ``moment train --cache-policy lru --remote-cache`` trains the losses
of one process.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from iostack.dyncache import RowCache
from iostack.errors import StoreError
from iostack.placement import load_placement
from iostack.store import FeatureStore
from planner.handoff import PlanTargets, StoreTarget
from tests.conftest import flat_spec
from tests.nodes_launch import launch, log, wait_all
from tests.test_nodes import CFG, _steps, _train, cora, shards  # noqa: F401  (cora, shards: fixtures)
from training.errors import TrainError
from training.place.nodes import place_sharded
from training.place.specs import PolicySpec, ShardSpec, TierSpec
from training.sharded.features import NodeError, ShardedFeatures, ShardedOptions
from training.sharded.remote_cache import DynamicRemoteCache, RemoteCache, cache_rows, with_policy
from training.specs import IOSpec
from training.trainer import train

TOY = PlanTargets("toy", gpus=(("gpu0", "s0"),), stores=(StoreTarget("mem0", "cpu", "mem0", "s0", 1.0),))
V, DIM, BUDGET = 600, 8, 40


class _Exchange:
    """In-process nodes: ``requests[p]`` is served by node ``p``'s ``serve``."""

    name = "in-process"

    def __init__(self, serves):
        self.serves = serves

    def fetch(self, requests):
        return [self.serves[p](r) if r.numel() else torch.empty((0, DIM)) for p, r in enumerate(requests)]

    def stats(self):
        return {}

    def close(self):
        pass


def _two_nodes(tmp_path, hot):
    feats = np.random.default_rng(1).standard_normal((V, DIM)).astype(np.float32)
    lay = place_sharded(feats, hot, TOY, tmp_path, TierSpec(cpu_cache_bytes=1 << 20), PolicySpec(),
                        ShardSpec(nodes=2, hot_rows=0.0), fsync=False).layout
    serves, nodes = {}, []
    for k in range(2):
        nd = tmp_path / f"node{k}"
        store = FeatureStore(load_placement(nd), nd, features=np.load(nd / "rows.npy"), backend="posix",
                             backend_options={"processes": 0})
        f = ShardedFeatures(store, lay, k, lay.local_index(k), np.arange(2), 2, _Exchange(serves))
        serves[k] = f.serve
        nodes.append(f)
    return feats, nodes


def _static(f, hot):
    ids = cache_rows(hot, f._local.numpy() >= 0, BUDGET)
    return RemoteCache(ids, V, rows=f.fetch_remote(torch.from_numpy(ids)).clone(), where="test")


def _epochs(n_epochs=5, batches=6):
    """Per epoch, batches of ids from a window that moves by 100 ids an epoch (a drifting hot set)."""
    rng = np.random.default_rng(7)
    return [[torch.from_numpy((e * 100 + rng.choice(160, 60, replace=False)) % V) for _ in range(batches)]
            for e in range(n_epochs)]


@pytest.mark.parametrize("policy", ["lru", "clock", "s3fifo"])
def test_remote_cache_filled_on_access_gathers_exact_rows_and_evicts_as_its_policy(tmp_path, policy):
    hot = np.random.default_rng(3).zipf(1.5, V).astype(np.float32)
    feats, nodes = _two_nodes(tmp_path, hot)
    try:
        f = nodes[0]
        f.cache = DynamicRemoteCache(_static(f, hot), BUDGET, policy)
        held = f._local.numpy() >= 0
        mirror = RowCache(BUDGET, V, DIM, policy=policy, fallback=lambda ids: torch.from_numpy(feats[ids]))
        mirror.warm(f.cache.static.ids)
        mirror.reset_counts()
        assert np.array_equal(f.cache.cache.cached_ids(), np.sort(f.cache.static.ids))  # the static fill
        for epoch in _epochs():
            for ids in epoch:
                got = f.gather(ids)
                assert torch.equal(got, torch.from_numpy(feats[ids.numpy()]))  # exact, whatever was evicted
                remote = ids.numpy()[~held[ids.numpy()]]
                mirror.gather(remote)
                assert np.array_equal(f.cache.cache.cached_ids(), mirror.cached_ids())
        assert f.cache.cache.counts == mirror.counts
        assert f.cache.cache.counts.inserted > 2 * BUDGET  # rows were evicted, many times over
        assert f.totals()["remote-cache"][0] >= f.cache.cache.counts.hits > 0
        assert not (held[f.cache.cache.cached_ids()]).any()  # only other nodes' rows are cached
    finally:
        for f in nodes:
            f.close()


def test_under_drift_the_cache_that_fills_on_access_leaves_fewer_rows_remote(tmp_path):
    hot = np.random.default_rng(3).zipf(1.5, V).astype(np.float32)
    feats, nodes = _two_nodes(tmp_path, hot)
    remote = {}
    try:
        f = nodes[0]
        for policy in ("static", "lru"):
            static = _static(f, hot)
            f.cache = with_policy(static, BUDGET, policy)
            before = f.totals()["remote"][0]
            for epoch in _epochs():
                for ids in epoch:
                    f.gather(ids)
            remote[policy] = f.totals()["remote"][0] - before
    finally:
        for f in nodes:
            f.close()
    assert remote["lru"] < remote["static"], remote


def test_a_policy_for_the_remote_cache_needs_its_budget_in_host_memory():
    with pytest.raises(NodeError, match="`remote_cache_bytes`"):
        ShardedOptions(cache_policy="lru")
    with pytest.raises(NodeError, match="without `remote_cache_dir`"):
        ShardedOptions(cache_policy="lru", remote_cache_bytes=1 << 20, remote_cache_dir="/tmp")
    assert IOSpec(cache_policy="s3fifo", remote_cache_bytes=1 << 20).cache_policy == "s3fifo"  # no dynamic_cache
    with pytest.raises(TrainError, match="`remote_cache_bytes`"):
        IOSpec(cache_policy="s3fifo")
    ssd = RemoteCache(np.arange(3), V, store=object())  # a static fill in an SSD bin: no rows in host memory
    assert with_policy(ssd, 3, "static") is ssd
    with pytest.raises(StoreError, match="`remote_cache_dir`"):
        with_policy(ssd, 3, "lru")
    with pytest.raises(StoreError, match="lfu"):
        with_policy(RemoteCache(np.arange(3), V, rows=torch.zeros((3, DIM))), 3, "lfu")


@pytest.mark.heavy  # two node processes (~15 s)
def test_two_nodes_with_a_remote_cache_filled_on_access_train_what_one_process_trains(cora, shards, tmp_path):  # noqa: F811
    """A remote cache of 12 rows (evicting every batch), LRU: the rows arrive exact, the losses are one process's."""
    m = tmp_path / "m.jsonl"
    args = ["--batch-size", "35", "--epochs", "2", "--metrics", str(m), "--remote-cache", "64KiB",
            "--cache-policy", "lru"]
    procs = launch([_train(shards / f"node{k}", *args, cora=cora) for k in range(2)], logs=tmp_path / "logs")
    assert wait_all(procs) == [[0], [0]], log(tmp_path / "logs", 0)[-2000:] + log(tmp_path / "logs", 1)[-2000:]
    one = []
    train(flat_spec(dataset=str(cora), batch_size=35, epochs=2, **CFG),
          progress=lambda r: one.append(r["loss"]) if r["kind"] == "step" else None)
    np.testing.assert_allclose([r["loss"] for r in _steps(m)], one, rtol=1e-5)
    nodes = [r for r in map(json.loads, m.read_text().splitlines()) if r["kind"] == "epoch"][-1]["nodes"]
    assert nodes["remote_rows"] > 0 and nodes["cache_rows"] > 0
    assert "filled on access (lru" in " ".join(log(tmp_path / "logs", 0).split())


def test_a_policy_on_a_sharded_run_without_its_remote_cache_is_one_line(cora, shards, capsys):  # noqa: F811
    from moment.cli import main

    base = ["train", "--dataset", str(cora), "--placement", str(shards / "node0"), "--epochs", "1"]
    assert main([*base, "--cache-policy", "lru", "--dynamic-cache", "1MiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("moment train: error:") and "--remote-cache" in err and "\n" not in err, err


@pytest.mark.heavy  # two nodes of two ranks (~40 s)
def test_two_ranks_a_node_warm_start_from_the_node_shared_fill_and_unlink_it(cora, shards, tmp_path):  # noqa: F811
    """Each rank's cache fills on its own; the node's shared static fill (the warm start) leaves no name behind."""
    shm = tmp_path / "shm"
    shm.mkdir()
    args = ["--batch-size", "35", "--epochs", "1", "--remote-cache", "64KiB", "--cache-policy", "s3fifo"]
    procs = launch([_train(shards / f"node{k}", *args, cora=cora) for k in range(2)], local_size=2,
                   logs=tmp_path / "logs", env={"MOMENT_SHM_DIR": str(shm)})
    assert wait_all(procs) == [[0, 0], [0, 0]], log(tmp_path / "logs", 0)[-2000:]
    text = " ".join(log(tmp_path / "logs", 0).split())
    assert "filled on access (s3fifo" in text and "node-shared" in text, text[-2000:]
    assert os.listdir(shm) == []
