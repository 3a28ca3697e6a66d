"""The compiled placement kernels (planner.compiled): the same results as the numpy and Python paths.

Large placements (10⁸-10⁹ items) run the hot-first sort, DDAK's whole-pool
loop and the output scatter compiled; here they run on small inputs by
lowering the threshold, and every output is compared with the path below it.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

import planner.ddak as D  # noqa: E402
import planner.placement as P  # noqa: E402
from planner import compiled  # noqa: E402
from planner.baselines import hash_placement, hot_first_placement
from planner.ddak import ddak
from planner.placement import DdakBin

# ties, zeros, -0.0 (passes the negative check), tiny and huge values
HOTNESS = st.lists(
    st.one_of(st.sampled_from([0.0, -0.0, 1.0, 2.0, 0.5, 3e-39]), st.floats(0, 2.0**100, width=32)),
    min_size=0, max_size=400,
)


@pytest.fixture
def always_compiled(monkeypatch):
    monkeypatch.setattr(P, "_COMPILED_MIN_ITEMS", 0)


def reference_order(h: np.ndarray) -> np.ndarray:
    return np.argsort(-np.abs(h.astype(np.float64)), kind="stable")


@settings(max_examples=80, deadline=None)
@given(HOTNESS)
def test_hot_order_is_the_stable_hot_first_order(values):
    h = np.array(values, dtype=np.float32)
    srt = compiled.hot_sort(h)
    order, hs = srt.order, srt.hotness()
    assert order.dtype == np.uint32 and hs.dtype == np.float32
    ref = reference_order(h)
    np.testing.assert_array_equal(order, ref)
    np.testing.assert_array_equal(hs, np.abs(h[ref]))
    for pool in (1, 3, 100):  # the pool sums of the numpy path, to the last bit
        np.testing.assert_array_equal(srt.pool_sums(pool), D._pool_sums(np.abs(h[ref]), pool))


@pytest.mark.parametrize("spread", [2.0**-7, 2.0**-20, 0.0])
def test_hot_order_one_crowded_bucket(spread):
    # all values share the key's top 16 bits: the bucket's counting sort (or, with one value, none)
    rng = np.random.default_rng(3)
    h = (1.0 + rng.random(50_000) * spread).astype(np.float32)
    srt = compiled.hot_sort(h)
    np.testing.assert_array_equal(srt.order, reference_order(h))
    np.testing.assert_array_equal(srt.hotness(), h[srt.order])
    np.testing.assert_array_equal(srt.pool_sums(77), D._pool_sums(h[srt.order], 77))


def test_hot_order_zipf_many_buckets():
    rng = np.random.default_rng(0)
    h = (1.0 / (rng.permutation(200_000) + 1.0) ** 0.9).astype(np.float32)
    h[::13] = 0.0
    np.testing.assert_array_equal(compiled.hot_sort(h).order, reference_order(h))


def scatter_reference(order, seg_start, seg_len, code, bits):
    packed = np.empty(order.shape[0], dtype=np.int64)
    for k in range(seg_start.shape[0]):
        p = np.arange(seg_start[k], seg_start[k] + seg_len[k], dtype=np.int64)
        packed[order[p]] = code[k] + (p << bits)
    return packed


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 70_000), min_size=1, max_size=8), st.integers(1, 5), st.integers(0, 2**31))
def test_scatter_codes_and_split(lengths, bits, seed):
    rng = np.random.default_rng(seed)
    seg_len = np.array(lengths, dtype=np.int64)  # zero-length segments included
    seg_start = np.cumsum(seg_len) - seg_len
    n = int(seg_len.sum())
    order = rng.permutation(n).astype(np.uint32)
    code = rng.integers(0, 1 << 20, seg_len.shape[0]).astype(np.int64) - seg_start
    packed = compiled.scatter_codes(order, seg_start, seg_len, code, bits)
    ref = scatter_reference(order, seg_start, seg_len, code, bits)
    np.testing.assert_array_equal(packed, ref)
    bin_of = compiled.split_codes(packed, bits)
    np.testing.assert_array_equal(bin_of, ref & ((1 << bits) - 1))
    np.testing.assert_array_equal(packed, ref >> bits)


def _bins(n: int, m: int, rng) -> list[DdakBin]:
    bins = [DdakBin(f"b{j}", ("gpu", "cpu", "ssd")[j % 3], int(rng.integers(1, n + 1)),
                    float(rng.integers(1, 9))) for j in range(m)]
    return bins + [DdakBin("ssd-all", "ssd", n, 1.0)]


def _same(a, b) -> None:
    np.testing.assert_array_equal(a.bin_of, b.bin_of)
    np.testing.assert_array_equal(a.row_of, b.row_of)
    np.testing.assert_array_equal(a.traffic_per_bin, b.traffic_per_bin)
    np.testing.assert_array_equal(a.items_per_bin, b.items_per_bin)
    assert a.max_relative_deviation == b.max_relative_deviation


@settings(max_examples=60, deadline=None)
@given(HOTNESS.filter(len), st.integers(1, 7), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_compiled_ddak_makes_the_same_placement(values, pool, m, seed):
    h = np.array(values, dtype=np.float32)
    bins = _bins(h.shape[0], m, np.random.default_rng(seed))
    plain = ddak(h, bins, pool=pool)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(P, "_COMPILED_MIN_ITEMS", 0)
        fast = ddak(h, bins, pool=pool)
        given_order = ddak(h, bins, pool=pool, order=reference_order(h))
        hot = hot_first_placement(h, bins)
        hashed = hash_placement(h, bins)
    _same(fast, plain)
    _same(given_order, plain)
    _same(hot, hot_first_placement(h, bins))
    _same(hashed, hash_placement(h, bins))


def test_compiled_ddak_with_tight_cache_bins_and_splits(always_compiled):
    # two host memories capped at the hottest rows they hold (the tight path), GPU bins that fill
    # mid-pool, a short last pool: every branch of the greedy next to the compiled loop
    rng = np.random.default_rng(1)
    h = (1.0 / (rng.permutation(30_001) + 1.0) ** 0.9).astype(np.float32)
    hs = np.sort(h.astype(np.float64))[::-1]
    bins = [DdakBin("g0", "gpu", 777, 0.15), DdakBin("g1", "gpu", 777, 0.15),
            DdakBin("m1", "cpu", 2_000, hs[2_000:4_000].sum()),
            DdakBin("m0", "cpu", 2_000, hs[:2_000].sum()),
            DdakBin("s0", "ssd", 30_001, 0.3), DdakBin("s1", "ssd", 30_001, 0.3)]
    fast = ddak(h, bins, pool=97)
    P._COMPILED_MIN_ITEMS = 1 << 40  # the fixture restores it
    _same(fast, ddak(h, bins, pool=97))


def test_compiled_kernels_take_turns_across_threads(always_compiled):
    # numba's workqueue layer aborts the process on concurrent parallel launches: the lock prevents it
    h = np.random.default_rng(2).random(100_000).astype(np.float32)
    ref = reference_order(h)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                np.testing.assert_array_equal(compiled.hot_sort(h).order, ref)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("threshold", [0, 1 << 40])
def test_bin_of_never_takes_over_a_callers_order(monkeypatch, threshold):
    # bin_of reuses the placement's own order buffer; an order the caller passed stays as it was
    monkeypatch.setattr(P, "_COMPILED_MIN_ITEMS", threshold)
    h = np.random.default_rng(4).random(5_000).astype(np.float32)
    bins = [DdakBin("g", "gpu", 500, 1.0), DdakBin("s", "ssd", 5_000, 1.0)]
    mine = reference_order(h).astype(np.uint32)
    kept = mine.copy()
    r = ddak(h, bins, pool=10, order=mine)
    np.testing.assert_array_equal(mine, kept)
    assert not np.shares_memory(r.bin_of, mine)
    _same(r, ddak(h, bins, pool=10))


@pytest.mark.parametrize("n", [(1 << 22) + 12_345, pytest.param(9_000_001, marks=pytest.mark.slow)])
def test_large_placements_are_the_numpy_paths_to_the_bit(n):
    # sizes where the compiled path runs by itself (from 4M items), both threads' id ranges and
    # bucket groups busy; against the numpy sort, the Python greedy and the blocked scatter
    rng = np.random.default_rng(n)
    h = (1.0 / (rng.permutation(n) + 1.0) ** 0.9).astype(np.float32)
    h[rng.integers(0, n, n // 50)] = 0.0
    h[::7] = h[1]  # many equal keys: ties keep id order
    bins = [DdakBin("g0", "gpu", n // 20, 0.2), DdakBin("g1", "gpu", n // 20, 0.2),
            DdakBin("c0", "cpu", n // 10, 0.1), DdakBin("s0", "ssd", n, 0.25), DdakBin("s1", "ssd", n, 0.25)]
    assert P._use_compiled(n)
    fast = ddak(h, bins, pool=100)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(P, "_COMPILED_MIN_ITEMS", 1 << 40)
        _same(fast, ddak(h, bins, pool=100))


def test_prepare_leaves_every_kernel_cached():
    compiled.prepare()
    assert compiled.cache_state() == "warm"
    seen: list[tuple] = []
    compiled.prepare(lambda *a: seen.append(a))
    assert seen == []  # nothing to compile: nothing announced


_FIRST_RUN = """
import json, sys
import numpy as np
from planner import compiled
from planner.ddak import ddak
from planner.placement import DdakBin
import planner.placement as P
P._COMPILED_MIN_ITEMS = 0
before = compiled.cache_state()
seen = []
h = np.random.default_rng(0).random(5000).astype(np.float32)
ddak(h, [DdakBin("g", "gpu", 500, 1.0), DdakBin("s", "ssd", 5000, 1.0)], pool=10,
     progress=lambda *a: seen.append(a))
from planner import _kernels
misses = sum(sum(getattr(_kernels, k).stats.cache_misses.values()) for k in compiled.KERNELS)
print(json.dumps({"before": before, "after": compiled.cache_state(), "seen": seen, "misses": misses}))
"""


@pytest.mark.slow  # compiles every kernel: 10-15 s of CPU
def test_a_first_placement_says_it_compiles_and_the_next_loads_the_cache(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = os.environ | {"NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}

    def run() -> dict:
        out = subprocess.run([sys.executable, "-c", _FIRST_RUN], env=env, capture_output=True, text=True,
                             check=True, timeout=600)
        return json.loads(out.stdout.splitlines()[-1])

    first, second = run(), run()
    assert first["before"] == "cold" and first["after"] == "warm" and first["misses"] > 0
    stages = [s for s, _, _ in first["seen"]]
    assert stages[0].startswith("compiling kernels") and stages.index("ddak") > 0
    assert first["seen"][stages.index("ddak") - 1][1:] == [5, 5]  # compiled before the placement began
    assert second["before"] == "warm" and second["misses"] == 0
    assert all(s == "ddak" for s, _, _ in second["seen"])
