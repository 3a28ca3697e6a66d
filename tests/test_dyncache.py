"""The caches that fill on access (iostack/dyncache.py) and their eviction policies (iostack/cachepolicy/)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.cachepolicy import CACHE_POLICIES, DEFAULT_POLICY
from iostack.dyncache import RowCache
from iostack.errors import StoreError

POLICIES = CACHE_POLICIES.names()


def _cache(capacity: int, n: int, policy: str, dim: int = 3) -> tuple[RowCache, torch.Tensor, list[np.ndarray]]:
    feats = torch.arange(n * dim, dtype=torch.float32).reshape(n, dim)
    reads: list[np.ndarray] = []

    def fallback(ids: np.ndarray) -> torch.Tensor:
        reads.append(ids.copy())
        return feats[torch.from_numpy(ids)]

    return RowCache(capacity, n, dim, fallback=fallback, policy=policy), feats, reads


def _consistent(cache: RowCache) -> None:
    held = np.flatnonzero(cache.slot_of >= 0)
    assert held.size <= cache.capacity
    assert np.array_equal(cache.id_of[cache.slot_of[held]], held)
    assert np.array_equal(np.sort(cache.id_of[cache.id_of >= 0]), held)


@settings(max_examples=60, deadline=None)
@given(policy=st.sampled_from(POLICIES), capacity=st.integers(0, 12), n=st.integers(1, 40),
       batches=st.lists(st.lists(st.integers(0, 39), min_size=0, max_size=25), min_size=1, max_size=25),
       warm=st.lists(st.integers(0, 39), max_size=15, unique=True))
def test_gathered_rows_always_equal_the_features(policy, capacity, n, batches, warm):
    cache, feats, reads = _cache(capacity, n, policy)
    cache.warm(np.array([w % n for w in dict.fromkeys(w % n for w in warm)], np.int64))
    _consistent(cache)
    for b in batches:
        ids = np.array(b, np.int64) % n
        before = set(cache.cached_ids().tolist())
        reads.clear()
        got = cache.gather(ids)
        assert torch.equal(got, feats[torch.from_numpy(ids)])
        asked = set(np.concatenate(reads).tolist()) if reads else set()
        assert asked == set(ids.tolist()) - before  # exactly the misses read through, once each
        _consistent(cache)
        if not CACHE_POLICIES.caps(policy)["admits"]:
            assert set(cache.cached_ids().tolist()) == before


def _after(policy: str, capacity: int, batches: list[list[int]]) -> list[list[int]]:
    cache, _, _ = _cache(capacity, 20, policy)
    seen = []
    for b in batches:
        cache.gather(np.array(b, np.int64))
        seen.append(cache.cached_ids().tolist())
    return seen


def test_lru_evicts_the_row_read_longest_ago():
    seen = _after("lru", 3, [[0], [1], [2], [0], [3], [4]])
    assert seen[-2:] == [[0, 2, 3], [0, 3, 4]]


def test_clock_gives_a_read_row_a_second_chance():
    seen = _after("clock", 3, [[0], [1], [2], [0], [3], [4], [5]])
    # 0 was read: the hand clears its bit and takes 1; then 2; then 0 (its chance spent)
    assert seen[-3:] == [[0, 2, 3], [0, 3, 4], [3, 4, 5]]


def test_s3fifo_filters_one_hit_rows_and_readmits_ghosts_to_main():
    batches = [[0], [1], [2], [3], [0], [4], [1], [2], [5], [1], [6], [3], [7], [8], [7], [10]]
    seen = _after("s3fifo", 4, batches)
    assert seen[5] == [0, 2, 3, 4]  # 0 read again: to main; 1 (not read) out to the ghost
    assert seen[6] == [0, 1, 3, 4]  # 1 remembered: straight to main; the small queue's oldest (2) out
    assert seen[8] == [0, 1, 2, 5]
    assert seen[12] == [1, 2, 3, 7]  # the small queue empty: main's oldest (0, not read since) out
    assert seen[14] == [1, 2, 3, 7]  # 7 back from the ghost into main; 8 (small) out
    assert seen[15] == [1, 3, 7, 10]  # main: 1 was read (another turn), 2 was not


def test_a_batch_never_evicts_its_own_rows_and_a_huge_batch_keeps_its_last():
    for policy in POLICIES:
        cache, feats, _ = _cache(4, 30, policy)
        ids = np.arange(10, dtype=np.int64)
        assert torch.equal(cache.gather(ids), feats[:10])
        want = [] if not CACHE_POLICIES.caps(policy)["admits"] else [6, 7, 8, 9]
        assert cache.cached_ids().tolist() == want, policy


def test_static_holds_the_warm_fill_hottest_first_and_counts():
    cache, _, reads = _cache(3, 10, "static")
    cache.warm(np.array([7, 2, 9, 4]))  # hottest first: 4 does not fit
    assert cache.cached_ids().tolist() == [2, 7, 9]
    cache.gather(np.array([7, 7, 4, 2]))
    assert (cache.counts.hits, cache.counts.misses, cache.counts.inserted) == (2, 1, 0)
    assert cache.counts.hit_rate == pytest.approx(2 / 3)
    assert cache.cached_ids().tolist() == [2, 7, 9]


def test_warm_start_then_fills_on_access():
    cache, _, _ = _cache(3, 10, DEFAULT_POLICY)
    cache.warm(np.array([1, 2]))
    cache.gather(np.array([5]))
    assert cache.cached_ids().tolist() == [1, 2, 5]


def test_memory_is_bounded_as_stated():
    n, cap = 1000, 100
    for policy, per_slot in {"static": 0, "lru": 8, "clock": 1, "s3fifo": 10}.items():
        cache, _, _ = _cache(cap, n, policy, dim=4)
        cache.gather(np.arange(n, dtype=np.int64))
        ghost = 4 * n if policy == "s3fifo" else 0
        assert cache.bookkeeping_bytes() <= 4 * n + 8 * cap + per_slot * cap + ghost, policy
        assert cache.row_bytes() == cap * 4 * 4


def test_bad_sizes_and_names_are_one_line_errors():
    with pytest.raises(StoreError, match="capacity"):
        RowCache(-1, 10, 2, fallback=lambda i: torch.zeros(i.size, 2))
    with pytest.raises(StoreError, match="unknown cache policy"):
        RowCache(1, 10, 2, fallback=lambda i: torch.zeros(i.size, 2), policy="fifo")


# --- the trainer's host cache (training/cached_features.py, moment train --cache-policy) -----------------

@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    from tests.conftest import graph_fixture
    from training.importers import import_dataset

    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


@pytest.fixture(scope="module")
def cora_placed(cora, tmp_path_factory):
    from moment.cli import main

    out = tmp_path_factory.mktemp("pl")
    ssd = [a for _ in range(8) for a in ("--ssd", str(out / "ssd"))]
    assert main(["place", "--dataset", str(cora), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache",
                 "64KiB", *ssd, "--out", str(out / "pl"), "--fanouts", "5,5", "--batch-size", "35"]) == 0
    return out / "pl"


def test_cached_features_equal_the_source_and_warm_from_the_placement(cora, cora_placed):
    from training.cached_features import CachedFeatures, static_fill
    from training.data import open_dataset
    from training.features import open_features

    ds = open_dataset(cora)
    warm = static_fill(str(cora_placed))
    assert warm.size and np.unique(warm).size == warm.size
    for policy in POLICIES:
        src = open_features(ds, str(cora_placed), "posix")
        feats = CachedFeatures(src, ds.num_nodes, 200 * ds.feature_dim * 4, policy, warm)
        assert set(feats.cache.cached_ids().tolist()) <= set(warm.tolist())
        rng = np.random.default_rng(1)
        for _ in range(5):
            ids = torch.from_numpy(rng.integers(0, ds.num_nodes, 300))
            assert torch.equal(feats.gather(ids), torch.from_numpy(np.asarray(ds.features))[ids].float())
        assert "cache" in feats.totals() and 0 < feats.epoch_record()["cache_hit_rate"] < 1
        assert feats.memory_bytes()["dynamic_cache"] >= 200 * ds.feature_dim * 4
        feats.close()


def test_cli_trains_alike_with_every_policy(cora, cora_placed, tmp_path):
    import json

    from moment.cli import main

    losses = {}
    for policy in POLICIES:
        metrics = tmp_path / f"{policy}.jsonl"
        extra = [] if policy == "static" else ["--dynamic-cache", "32KiB"]
        assert main(["train", "--dataset", str(cora), "--placement", str(cora_placed), "--fanouts", "5,5",
                     "--batch-size", "35", "--epochs", "2", "--hidden", "16", "--seed", "3", "--prefetch", "1",
                     "--metrics", str(metrics), "--cache-policy", policy, *extra]) == 0
        recs = [json.loads(line) for line in metrics.read_text().splitlines()]
        losses[policy] = [r["loss"] for r in recs if r["kind"] == "step"]
        epochs = [r for r in recs if r["kind"] == "epoch"]
        assert len(epochs) == 2
        if policy != "static":
            assert all(0 <= e["cache_hit_rate"] <= 1 for e in epochs)
            assert "cache" in epochs[-1]["tiers"]
    assert all(v == losses["static"] for v in losses.values())  # exact rows: the same steps


def test_cli_dynamic_policy_without_a_size_is_one_line(cora, capsys):
    from moment.cli import main

    assert main(["train", "--dataset", str(cora), "--cache-policy", "lru"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dynamic-cache" in err


def test_cli_dynamic_cache_alone_takes_the_measured_default(cora, tmp_path):
    import json

    from moment.cli import main

    metrics = tmp_path / "m.jsonl"
    assert main(["train", "--dataset", str(cora), "--fanouts", "5", "--batch-size", "64", "--epochs", "1",
                 "--hidden", "8", "--dynamic-cache", "64KiB", "--metrics", str(metrics)]) == 0
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    start = next(r for r in recs if r["kind"] == "start")["config"]
    assert start["cache_policy"] == DEFAULT_POLICY and start["dynamic_cache"] == 64 << 10


def test_bench_tool_on_a_small_drifting_graph(tmp_path):
    """tools/bench_dyncache.py end to end: once the window has moved, every dynamic policy keeps more of a
    batch's rows than the static fill (hit rates do not depend on timing). With a cache smaller than one
    batch's rows (``--cache-share 0.1`` here) the dynamic policies thrash and the static fill wins."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    out = tmp_path / "d.json"
    args = ["--nodes", "20000", "--batches", "4", "--batch", "128", "--window", "2000", "--shift", "2000",
            "--local", "500", "--cache-share", "0.3", "--epochs", "4", "--repeats", "1"]
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_dyncache.py"), *args, "--dir", str(tmp_path),
                           "--json", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    figs = [f for f in json.loads(out.read_text())["figures"] if "hit rate" in f["figure"]]
    assert {f["figure"].split(":")[0] for f in figs} == set(POLICIES) - {"static"}
    assert all(f["ours"] > f["reference"] for f in figs)
