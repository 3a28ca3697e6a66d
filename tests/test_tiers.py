"""The feature store as composed tiers (iostack.tiers): a tier of one's own added by composition, gathered through.

A toy tier serves one bin from a dict of rows; the store routes that bin's ids
to it and the other bins' to the tiers it builds. Gathers through it return the
source rows bit for bit, on the host path and on the fake accelerator's device
path, and its counters show what it served. Composition errors name the bin.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from iostack.bins import write_bins
from iostack.errors import StoreError
from iostack.placement import simple_placement
from iostack.store import FeatureStore
from iostack.tiers import HostTier, Tier
from tests.fake_cuda import FakeDeviceMemory


class DictTier(Tier):
    """A toy tier: bin ``bin_id``'s rows from a dict ``{row: array of dim values}``."""

    def __init__(self, bin_id: int, rows: dict[int, np.ndarray]) -> None:
        super().__init__([bin_id])
        self.rows = rows

    def read(self, bin_id, rows, out, positions):
        vals = torch.from_numpy(np.stack([self.rows[int(r)] for r in rows.tolist()]))
        if positions is None:
            out.copy_(vals)
        else:
            out[positions] = vals
        self.counters[bin_id].add(rows.numel(), vals.numel() * vals.element_size(), 1, 0.0)


@pytest.fixture
def placed(tmp_path):
    rng = np.random.default_rng(0)
    n, dim = 600, 8
    feats = rng.random((n, dim)).astype(np.float32)
    p = simple_placement(n, [("gpu", 100), ("cpu", 200), ("ssd", 300)], order=rng.permutation(n))
    write_bins(feats, p, tmp_path, fsync=False)
    return feats, p, tmp_path


def _dict_tier(feats, p, bin_id: int) -> DictTier:
    verts = p.vertices_of(bin_id)
    return DictTier(bin_id, {int(p.row_of[v]): feats[v] for v in verts})


@pytest.mark.parametrize("memory", [None, FakeDeviceMemory], ids=["host", "fake-device"])
def test_a_toy_tier_added_by_composition_serves_its_bin(placed, memory):
    feats, p, d = placed
    toy = _dict_tier(feats, p, 1)  # the CPU bin, from a dict instead of the built host tier
    with FeatureStore(p, d, features=feats, backend_options={"processes": 0}, tiers=[toy],
                      memory=memory() if memory else None) as s:
        assert s.tier_of(1) is toy and toy in s.tiers
        assert {type(s.tier_of(b.id)).__name__ for b in p.bins} == \
            {"DictTier", "SsdTier", "DeviceTier" if memory else "HostTier"}
        ids = np.random.default_rng(1).integers(0, 600, 2000)
        assert torch.equal(s.gather(ids).cpu(), torch.from_numpy(feats[ids]))
        assert torch.equal(s.gather(ids[:50], device="cpu"), torch.from_numpy(feats[ids[:50]]))
        hits = int((np.asarray(p.bin_of)[ids] == 1).sum()) + int((np.asarray(p.bin_of)[ids[:50]] == 1).sum())
        assert s.tier_stats()["cpu"]["rows"] == toy.counters[1].rows == hits
        assert next(b for b in s.stats() if b.bin_id == 1).rows == hits


def test_a_store_composed_of_given_tiers_only(placed):
    feats, p, _ = placed
    host = HostTier({0: torch.from_numpy(feats[p.vertices_of(0)][np.argsort(p.row_of[p.vertices_of(0)])])})
    toys = [_dict_tier(feats, p, b) for b in (1, 2)]
    with FeatureStore(p, tiers=[host, *toys]) as s:  # no features, no bin files: the tiers say the rows' type
        assert s.tiers == [host, *toys] and s.dim == 8 and s.dtype == torch.float32
        ids = np.arange(600)[::-1].copy()
        assert torch.equal(s.gather(ids), torch.from_numpy(feats[ids]))
        assert sum(t.counters[b].rows for t in s.tiers for b in t.bins) == 600


def test_with_tiers_routes_a_bin_elsewhere_and_shares_the_rest(placed):
    feats, p, d = placed
    with FeatureStore(p, d, features=feats, backend_options={"processes": 0}) as s:
        toy = _dict_tier(feats, p, 2)  # the SSD bin, served from memory in the composed store
        v = s.with_tiers(toy)
        assert v.tier_of(2) is toy and s.tier_of(2) is not toy and v.tier_of(1) is s.tier_of(1)
        ids = np.random.default_rng(2).integers(0, 600, 500)
        assert torch.equal(v.gather(ids), s.gather(ids))
        assert toy.counters[2].rows == s.tier_of(2).counters[2].rows == int((np.asarray(p.bin_of)[ids] == 2).sum())


def test_each_bin_is_served_by_exactly_one_tier(placed, tmp_path):
    feats, p, d = placed
    with pytest.raises(StoreError, match="bin 1 is served by two tiers"):
        FeatureStore(p, d, features=feats, tiers=[_dict_tier(feats, p, 1), _dict_tier(feats, p, 1)])
    with pytest.raises(StoreError, match="serves bin 7, which the placement does not have"):
        FeatureStore(p, d, features=feats, tiers=[DictTier(7, {})])
    two = simple_placement(600, [("cpu", 200), ("ssd", 200), ("ssd", 200)])
    write_bins(feats, two, tmp_path / "two", fsync=False)
    with FeatureStore(two, tmp_path / "two", features=feats, backend_options={"processes": 0}) as s, \
            pytest.raises(StoreError, match=r"bin\(s\) 2 are served by no tier"):
        s.with_tiers(_dict_tier(feats, two, 1))  # replaces the SSD tier, which served bin 2 too
