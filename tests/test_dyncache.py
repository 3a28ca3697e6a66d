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
