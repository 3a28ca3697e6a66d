"""DDAK over items of several sizes (``ddak(..., item_size=)``): byte budgets, one hotness, shared bins."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.ddak import ddak
from planner.errors import PlannerError
from planner.placement import DdakBin


def _bins(total: int, gpu: int, cpu: int) -> list[DdakBin]:
    return [DdakBin("gpu0", "gpu", gpu, 0.4), DdakBin("cpu0", "cpu", cpu, 0.3), DdakBin("cpu1", "cpu", cpu, 0.1),
            DdakBin("ssd0", "ssd", total, 0.1), DdakBin("ssd1", "ssd", total, 0.1)]


@st.composite
def instances(draw):
    n = draw(st.integers(1, 300))
    h = np.array(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), dtype=np.float32)
    widths = draw(st.lists(st.sampled_from([4, 16, 64, 100]), min_size=1, max_size=4))
    size = np.array([widths[i % len(widths)] for i in range(n)], dtype=np.int64)
    total = int(size.sum())
    gpu = draw(st.integers(0, total // 3))
    cpu = draw(st.integers(0, total // 3))
    return h, size, _bins(total, gpu, cpu), draw(st.integers(1, 8))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_sized_placement_fits_the_byte_budgets(inst) -> None:
    h, size, bins, pool = inst
    r = ddak(h, bins, pool=pool, item_size=size)
    m = len(bins)
    used = np.bincount(r.bin_of, weights=size, minlength=m)
    assert np.all(used <= [b.capacity_items for b in bins])  # every bin within its bytes
    assert r.items_per_bin.tolist() == np.bincount(r.bin_of, minlength=m).tolist()
    for j in range(m):  # rows of a bin are 0..k-1, each once
        assert sorted(r.row_of[r.bin_of == j].tolist()) == list(range(int(r.items_per_bin[j])))
    # a bin's traffic is the bytes it serves: hotness × size
    served = np.bincount(r.bin_of, weights=h.astype(np.float64) * size, minlength=m)
    assert np.allclose(r.traffic_per_bin, served)
    # the hierarchy holds: no cache row is colder than an SSD row while the cache had room for it
    cache = r.bin_of < 3
    if cache.any() and (~cache).any():
        spare = [b.capacity_items - u for b, u in zip(bins[:3], used[:3], strict=True)]
        hottest_ssd = int(np.argmax(np.where(~cache, h, -1)))
        if min(spare) >= size[hottest_ssd] and h[hottest_ssd] > 0:
            assert h[cache].max() >= h[hottest_ssd]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 400), st.sampled_from([1, 2, 8, 64]), st.integers(1, 10), st.integers(0, 3))
def test_equal_sizes_place_as_items(n, s, pool, seed) -> None:
    """All rows one size s, capacities × s: the same placement as counting items (traffic × s)."""
    h = np.random.default_rng(seed).zipf(1.5, n).astype(np.float32)
    rows = _bins(n, n // 10, n // 7)
    sized = [DdakBin(b.id, b.kind, b.capacity_items * s, b.target_traffic) for b in rows]
    a = ddak(h, rows, pool=pool)
    b = ddak(h, sized, pool=pool, item_size=np.full(n, s))
    assert a.bin_of.tolist() == b.bin_of.tolist() and a.row_of.tolist() == b.row_of.tolist()
    assert np.allclose(a.traffic_per_bin * s, b.traffic_per_bin)


def test_sized_hot_rows_fill_the_gpu_by_bytes() -> None:
    # hot narrow rows (4 B) before hot wide ones (100 B): a 212-byte GPU takes the 3 narrow and 2 wide
    # (212 B); the third wide row does not fit, and the bin is then full (the cold rows go to the SSD)
    h = np.array([10] * 3 + [9] * 3 + [1] * 20, dtype=np.float32)
    size = np.array([4] * 3 + [100] * 3 + [4] * 20)
    bins = [DdakBin("gpu0", "gpu", 212, 0.9), DdakBin("ssd0", "ssd", 10_000, 0.1)]
    r = ddak(h, bins, pool=1, item_size=size)
    assert r.bin_of.tolist() == [0] * 5 + [1] * 21
    assert r.traffic_per_bin.tolist() == [3 * 40.0 + 2 * 900.0, 900.0 + 80.0]
    # the edge case: 12 bytes left, a 100-byte row next: the bin closes, loses less than a row
    r = ddak(h[3:], [DdakBin("gpu0", "gpu", 212, 0.9), DdakBin("ssd0", "ssd", 10_000, 0.1)], pool=1,
             item_size=size[3:])
    assert r.bin_of.tolist() == [0, 0] + [1] * 21


def test_sized_errors() -> None:
    bins = [DdakBin("ssd0", "ssd", 10, 1.0)]
    with pytest.raises(PlannerError, match="item_size"):
        ddak(np.ones(3), bins, item_size=np.array([1, 0, 2]))
    with pytest.raises(PlannerError, match="item_size"):
        ddak(np.ones(3), bins, item_size=np.ones(2, np.int64))
    with pytest.raises(PlannerError, match="12 size units"):
        ddak(np.ones(3), bins, item_size=np.array([4, 4, 4]))
    # room enough in sum, but no bin has a gap for the last wide row
    two = [DdakBin("cpu0", "cpu", 6, 1.0), DdakBin("ssd0", "ssd", 6, 1.0)]
    with pytest.raises(PlannerError, match="no bin has room"):
        ddak(np.array([3.0, 2.0, 1.0]), two, pool=1, item_size=np.array([4, 4, 4]))
