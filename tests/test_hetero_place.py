"""DDAK over the rows of every node type (training/hetero/place.py) and the typed tiered store (tiered.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training.hetero.graph import add_reverse
from training.hetero.hotness import hetero_presample_counts
from training.hetero.place import byte_cache_shares, place_hetero, tier_shares, typed_rows
from training.hetero.store import open_hetero, write_hetero
from training.hetero.synth import synth_mag
from training.hetero.tiered import HeteroFeatureStore, write_hetero_placement
from training.place.bins import BinPlan, PlacingError


@pytest.fixture(scope="module")
def mag(tmp_path_factory):
    g = add_reverse(synth_mag(papers=2000, authors=1000, institutions=60, fields=30))
    return open_hetero(write_hetero(tmp_path_factory.mktemp("h") / "mag", g))


@pytest.fixture(scope="module")
def hot(mag):
    return hetero_presample_counts(mag, [3, 2], batch_size=32)


def _bins(total: int, gpu: int, cpu: int) -> list[BinPlan]:
    return [BinPlan("gpu", gpu, 0.3, "cuda", None), BinPlan("cpu", cpu, 0.3, "numa0", None),
            BinPlan("ssd", total, 0.2, "ssd0", None, "bin2-ssd0.dat"),
            BinPlan("ssd", total, 0.2, "ssd1", None, "bin3-ssd1.dat")]


def test_typed_rows_sizes(mag) -> None:
    rows = typed_rows(mag)
    assert rows.types == ("paper", "author", "institution")  # field_of_study is featureless
    assert rows.row_bytes == (64, 16, 4)  # 16 float32, 8 float16, 4 uint8
    assert rows.num_items == 3060
    assert rows.sizes("padded").tolist() == [64] * 3060


def test_place_spans_the_tiers_and_gathers_every_type_bit_for_bit(mag, hot, tmp_path) -> None:
    rows = typed_rows(mag)
    total = int(rows.sizes().sum())
    res = place_hetero(mag, hot, _bins(total, total // 20, total // 8))
    used = np.bincount(res.result.bin_of, weights=rows.sizes(), minlength=4)
    assert used[0] <= total // 20 and used[1] <= total // 8  # the byte budgets held
    assert np.array_equal(res.bytes_per_bin, used.astype(np.int64))
    shares = tier_shares(res)
    assert set(shares) == {"gpu", "cpu", "ssd"} and all(v["bytes"] > 0 for v in shares.values())
    # one hotness: the GPU holds rows of more than one type, chosen by reads, not by type
    on_gpu = {rows.types[i] for i in np.unique(rows.item_type[res.result.bin_of == 0])}
    assert len(on_gpu) >= 2
    # the SSD bins too hold rows of several types (the hottest, the institutions, all sit in the GPU)
    assert sum(bool((np.asarray(p.bin_of) >= 2).any()) for p in res.placements.values()) >= 2
    assert not (np.asarray(res.placements["institution"].bin_of) >= 2).any()
    write_hetero_placement(mag, res, tmp_path, {"schema": "test"})
    with HeteroFeatureStore(mag, tmp_path, backend="posix", backend_options={"processes": 0}) as store:
        for t, feats in mag.features.items():
            ids = torch.randperm(feats.shape[0])
            got = store.gather(t, ids).numpy()
            assert got.dtype == feats.dtype and got.shape == (feats.shape[0], feats.shape[1])
            assert got.tobytes() == np.ascontiguousarray(feats[ids.numpy()]).tobytes(), t
        stats = store.tier_stats()
    assert stats["ssd"]["rows"] > 0 and stats["gpu"]["rows"] > 0 and stats["cpu"]["rows"] > 0
    assert sum(v["rows"] for v in stats.values()) == 3060


def test_bytes_beat_padding_at_equal_budgets(mag, hot) -> None:
    """Sized by their own bytes, the caches hold more of the reads than rows padded to the widest."""
    rows = typed_rows(mag)
    total = int(rows.sizes().sum())
    bins = _bins(total * 4, total // 20, total // 8)
    a = tier_shares(place_hetero(mag, hot, bins))
    b = tier_shares(place_hetero(mag, hot, bins, sizing="padded"), hot)
    assert a["ssd"]["read_share"] < b["ssd"]["read_share"]


def test_byte_cache_shares_and_errors(mag) -> None:
    from planner.handoff import PlanTargets, StoreTarget

    t = PlanTargets("toy", gpus=(("gpu0", "socket0"),),
                    stores=(StoreTarget("cache:gpu0", "gpu", "gpu0", "socket0", 1.0),
                            StoreTarget("mem0", "cpu", "mem0", "socket0", 1.0),
                            StoreTarget("ssd0", "ssd", "ssd0", "socket0", 3.0)))
    h = np.array([4.0, 3.0, 2.0, 1.0])
    size = np.array([10, 1, 1, 8])  # reads x bytes: 40, 3, 2, 8 of 53
    g, c = byte_cache_shares(h, size, t, gpu_bytes=11, cpu_bytes=1)
    assert (round(g, 6), round(c, 6)) == (round(43 / 53, 6), round(2 / 53, 6))
    with pytest.raises(PlacingError, match="hotness"):
        place_hetero(mag, np.ones(3), _bins(10**6, 0, 0))
    with pytest.raises(PlacingError, match="sizing"):
        place_hetero(mag, np.ones(mag.schema.num_nodes), _bins(10**6, 0, 0), sizing="wide")


def test_the_placement_benchmark_writes_its_figures(tmp_path, load_tool) -> None:
    import json

    mod = load_tool("bench_hetero_place")
    out = tmp_path / "b.json"
    assert mod.main(["--papers", "3000", "--batches", "2", "--repeats", "1", "--batch-size", "64",
                     "--dir", str(tmp_path / "scratch"), "--json", str(out)]) == 0
    figs = json.loads(out.read_text())["figures"]
    assert len(figs) == 3 and figs[0]["ours"] > 0 and figs[0]["reference"] > 0
    assert 0 <= figs[1]["ours"] <= 1 and 0 <= figs[2]["reference"] <= 1
    assert not (tmp_path / "scratch").exists()  # the scratch data is removed


def test_feasible_targets_in_bytes() -> None:
    from training.place.bins import feasible_targets

    b = [BinPlan("cpu", 2, 0.6, "numa0", "s0"), BinPlan("cpu", 2, 0.0, "numa1", "s1"),
         BinPlan("ssd", 8, 0.4, "ssd0", "s0", "b.dat")]
    h = np.array([3, 2, 2, 1, 1, 1, 0, 0], np.float32)
    rows, _ = feasible_targets(h, b)
    ones, _ = feasible_targets(h, b, np.ones(8, np.int64))  # one byte a row: the same as counting rows
    assert [x.target_share for x in ones] == pytest.approx([x.target_share for x in rows])
    # the hottest row is 2 bytes wide: a 2-byte host memory holds it alone, 6 of the 13 bytes read;
    # the 0.6 asked of it is capped there and the rest passes to the other host memory
    fixed, why = feasible_targets(h, b, np.array([2, 1, 1, 1, 1, 1, 1, 1]))
    assert [x.target_share for x in fixed] == pytest.approx([6 / 13, 0.6 - 6 / 13, 0.4])
    assert why == ["cpu bin numa0: the plan asks 60.00% of reads, its 2 bytes can serve 46.15%"]
