"""Re-placement when hotness drifts: only the rows whose bin changes move, and every row's bytes stay exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.bins import bin_path, open_bin, write_bins
from iostack.codec import fit_codec
from iostack.placement import Bin, Placement, load_placement
from iostack.store import FeatureStore
from planner.placement import DdakBin
from planner.policies import place_items
from tests.conftest import graph_fixture
from training.data import open_dataset
from training.importers import import_dataset
from training.place.bins import PlacingError
from training.place.replace import RowReads, apply_replacement, bin_traffic, plan_replacement

BINS = (Bin(0, "cpu", 300), Bin(1, "cpu", 500), Bin(2, "ssd", 3000, "ssd0.bin"), Bin(3, "ssd", 3000, "ssd1.bin"))
TARGETS = (4.0, 3.0, 1.5, 1.5)


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    return open_dataset(import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora"))


def _ddak(hotness: np.ndarray, codec=None) -> Placement:
    res = place_items("ddak", hotness, [DdakBin(str(b.id), b.kind, b.capacity_rows, t)
                                        for b, t in zip(BINS, TARGETS, strict=True)], pool=10)
    return Placement(BINS, res.bin_of, res.row_of, codec=codec)


def _drifted(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two hotness vectors of ``n`` vertices whose hot sets differ in about half their rows."""
    rng = np.random.default_rng(seed)
    a = rng.zipf(1.6, n).astype(np.float32)
    b = a.copy()
    half = rng.permutation(n)[: n // 2]
    b[half] = b[np.roll(half, 1)]  # half the vertices swap hotness among themselves
    return a, b


def _files(d: Path) -> dict[int, bytes]:
    return {b.id: bin_path(d, b).read_bytes() for b in BINS if b.kind == "ssd"}


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_only_changed_rows_move_and_every_row_stays_exact(cora, tmp_path, dtype):
    x = np.asarray(cora.features)
    codec = fit_codec(x, dtype) if dtype else None
    h0, h1 = _drifted(cora.num_nodes, 1)
    old = _ddak(h0, codec)
    write_bins(x, old, tmp_path, fsync=False)
    old.save(tmp_path)
    with FeatureStore(load_placement(tmp_path), tmp_path, features=x, backend="posix") as s:
        before = s.gather(torch.arange(cora.num_nodes)).numpy()
    files0 = _files(tmp_path)

    rep = plan_replacement(old, h1, TARGETS, pool=10)
    new = rep.placement
    same = new.bin_of == old.bin_of
    assert rep.moved.size and np.array_equal(np.flatnonzero(~same), rep.moved)
    assert np.array_equal(new.row_of[same], old.row_of[same])  # an unmoved row keeps its row too
    stats = apply_replacement(rep, tmp_path, x, fsync=False)
    into_ssd = int(np.isin(rep.new_bin, [2, 3]).sum())
    assert stats["rows_written"] == into_ssd and stats["bins_written"] == 2

    after_p = load_placement(tmp_path)
    assert np.array_equal(after_p.bin_of, new.bin_of) and np.array_equal(after_p.row_of, new.row_of)
    for b in BINS[2:]:
        open_bin(tmp_path, b, full_check=True)  # its manifest describes the file as written
    with FeatureStore(after_p, tmp_path, features=x, backend="posix") as s:
        after = s.gather(torch.arange(cora.num_nodes)).numpy()
        assert np.array_equal(before, after)  # every row's bytes, decoded, as before the move
    # in the SSD files only the rows written changed: the bytes of every other row are as they were
    for b in BINS[2:]:
        info = open_bin(tmp_path, b)
        data = bin_path(tmp_path, b).read_bytes()
        written = set(new.row_of[rep.moved[rep.new_bin == b.id]].tolist())
        kept = np.array([r for r in range(len(files0[b.id]) // info.row_bytes) if r not in written
                         and info.offsets(np.array([r]))[0] + info.row_bytes <= len(files0[b.id])], np.int64)
        offs = info.offsets(kept)
        for o in offs[:: max(1, offs.size // 500)].tolist():  # a spread sample of rows, 500 at most
            assert data[o:o + info.row_bytes] == files0[b.id][o:o + info.row_bytes]


def test_the_plan_predicts_its_traffic_and_wins_back_the_caches(cora):
    h0, h1 = _drifted(cora.num_nodes, 2)
    old = _ddak(h0)
    rep = plan_replacement(old, h1, TARGETS, pool=10)
    assert np.allclose(rep.predicted_traffic, bin_traffic(rep.placement, h1))
    assert np.allclose(rep.static_traffic, bin_traffic(old, h1))
    # the drift took reads away from the caches; the re-placement gives them back, as a fresh DDAK would
    fresh = _ddak(h1)
    assert rep.cache_share(rep.predicted_traffic) > rep.cache_share(rep.static_traffic)
    assert rep.cache_share(rep.predicted_traffic) == pytest.approx(rep.cache_share(bin_traffic(fresh, h1)))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(5, 200), seed=st.integers(0, 2**16), caps=st.lists(st.integers(1, 60), min_size=1, max_size=3))
def test_a_replacement_is_a_valid_placement_that_moves_only_changed_bins(n, seed, caps):
    rng = np.random.default_rng(seed)
    bins = tuple(Bin(i, "cpu", c) for i, c in enumerate(caps)) + (Bin(len(caps), "ssd", n, "s.bin"),)
    targets = [float(t) for t in rng.uniform(0.1, 2.0, len(bins))]
    dbins = [DdakBin(str(b.id), b.kind, b.capacity_rows, t) for b, t in zip(bins, targets, strict=True)]
    h0, h1 = rng.exponential(1.0, n).astype(np.float32), rng.exponential(1.0, n).astype(np.float32)
    r0 = place_items("ddak", h0, dbins, pool=3)
    old = Placement(bins, r0.bin_of, r0.row_of)
    rep = plan_replacement(old, h1, targets, pool=3)  # Placement() checks: rows distinct, within capacity
    assert np.array_equal(rep.placement.bin_of, place_items("ddak", h1, dbins, pool=3).bin_of)
    same = rep.placement.bin_of == old.bin_of
    assert np.array_equal(rep.placement.row_of[same], old.row_of[same])
    # arrivals take the rows this move vacates in their bin first (the bin does not grow), then unused ones
    for j in range(len(bins)):
        arrive = rep.placement.row_of[rep.moved[rep.new_bin == j]]
        clash = np.isin(arrive, old.row_of[old.bin_of == j]).sum()
        vacated = int(((old.bin_of == j) & (rep.placement.bin_of != j)).sum())
        assert clash == min(arrive.size, vacated)
    assert rep.reused_rows == sum(int(np.isin(rep.placement.row_of[rep.moved[rep.new_bin == j]],
                                              old.row_of[old.bin_of == j]).sum()) for j in range(len(bins)))


def test_read_counts_are_sampled_and_bounded():
    reads = RowReads(10, every=2)
    assert reads.nbytes == 40
    for batch in ([1, 2, 3], [3, 4], [3, 9], [0]):  # batches 1 and 3 are counted
        reads.observe(np.array(batch))
    h = reads.take()
    assert h.tolist() == [0, 2, 2, 4, 0, 0, 0, 0, 0, 2]  # counted reads x 2 (one batch in two)
    assert reads.take().sum() == 0  # reset
    with pytest.raises(PlacingError, match="`every`"):
        RowReads(3, every=0)


def test_bad_inputs_are_refused_naming_them(cora):
    old = _ddak(_drifted(cora.num_nodes, 3)[0])
    with pytest.raises(PlacingError, match="`targets`"):
        plan_replacement(old, np.ones(cora.num_nodes, np.float32), [1.0, 2.0])
    with pytest.raises(PlacingError, match="`hotness`"):
        plan_replacement(old, np.ones(5, np.float32), TARGETS)
