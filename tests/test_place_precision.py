"""`moment place --feature-dtype`: smaller rows in every tier, the plan sized in them, training on them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from iostack.placement import load_placement
from iostack.store import FeatureStore
from moment.cli import main
from tests.conftest import graph_fixture
from training.data import open_dataset
from training.importers.planetoid import import_planetoid


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    return open_dataset(import_planetoid(graph_fixture("cora"), tmp_path_factory.mktemp("p") / "cora"))


def _place(cora, tmp_path, name, *extra):
    out = tmp_path / name
    args = ["place", "--dataset", str(cora.path), "--machine", "moment-b", "--gpu-cache", "256KiB",
            "--cpu-cache", "1MiB", *[a for _ in range(8) for a in ("--ssd", str(tmp_path / "ssd"))],
            "--out", str(out), "--fanouts", "10,5", "--batch-size", "64", "--hotness-dir", str(tmp_path / "hot"),
            "--json", *extra]
    assert main(args) == 0
    return out


def test_smaller_rows_everywhere_and_the_plan_sees_them(cora, tmp_path, capsys):
    reports = {}
    for dtype in ("float32", "float16", "int8"):
        out = _place(cora, tmp_path, dtype, "--feature-dtype", dtype)
        reports[dtype] = json.loads(capsys.readouterr().out)
        assert reports[dtype]["feature_dtype"] == dtype
        assert load_placement(out).codec.dtype == dtype
    dim = cora.feature_dim
    assert [reports[d]["row_bytes"] for d in ("float32", "float16", "int8")] == [4 * dim, 2 * dim, dim]
    for d, k in (("float16", 2), ("int8", 4)):
        # caches of the same bytes hold k times the rows; bins and SSD bytes are sized in the stored rows
        caps = [b["capacity_rows"] for b in reports[d]["bins"] if b["kind"] != "ssd"]
        caps32 = [b["capacity_rows"] for b in reports["float32"]["bins"] if b["kind"] != "ssd"]
        assert caps == [(256 << 10) // (4 * dim // k), *[(1 << 20) // (4 * dim // k)] * (len(caps) - 1)]
        assert all(c >= k * c32 for c, c32 in zip(caps, caps32, strict=True))
        ssd = reports[d]["report"]["ssd_bytes_per_epoch"]
        share = reports[d]["report"]["ssd_share"]
        assert ssd == pytest.approx(reports["float32"]["report"]["ssd_bytes_per_epoch"] / k
                                    * share / reports["float32"]["report"]["ssd_share"])


def test_training_on_an_int8_placement_reports_its_type(cora, tmp_path, capsys):
    out = _place(cora, tmp_path, "int8", "--feature-dtype", "int8")
    capsys.readouterr()
    p = load_placement(out)
    with FeatureStore(p, out, features=cora.features, backend_options={"processes": 0}) as s:
        x = np.asarray(cora.features)
        got = s.gather(torch.arange(cora.num_nodes)).numpy()
        assert got.dtype == np.float32 and np.all(np.abs(got - x) <= p.codec.scale / 2 + 1e-6)
        assert {"gpu", "cpu", "ssd"} <= set(s.tier_stats())
    assert main(["train", "--dataset", str(cora.path), "--placement", str(out), "--fanouts", "5", "--hidden", "8",
                 "--batch-size", "140"]) == 0
    cap = capsys.readouterr()
    assert "(int8 rows)" in cap.err and "stored as int8" in cap.err
    assert "feature rows held as" in cap.out and "int8" in cap.out


def test_feature_dtype_refusals_are_one_line(cora, tmp_path, capsys):
    args = ["place", "--dataset", str(cora.path), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache", "0",
            *[a for _ in range(8) for a in ("--ssd", str(tmp_path / "ssd"))], "--out", str(tmp_path / "o"),
            "--hotness", "degree", "--feature-dtype", "int8", "--nodes", "2"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--feature-dtype with --nodes > 1" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):
        main([*args[:-4], "--feature-dtype", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_training_on_a_fake_gpu_decodes_there_and_equals_the_host_run(cora, tmp_path, dtype):
    from iostack.bins import write_bins
    from iostack.codec import fit_codec
    from iostack.placement import Placement, simple_placement
    from tests.conftest import flat_spec
    from tests.fake_cuda import FakeDeviceMemory
    from training.trainer import train

    p = simple_placement(cora.num_nodes, [("gpu", 300), ("cpu", 700), ("ssd", cora.num_nodes)])
    p = Placement(p.bins, p.bin_of, p.row_of, codec=fit_codec(cora.features, dtype))
    write_bins(cora.features, p, tmp_path, fsync=False)
    p.save(tmp_path)
    cfg = flat_spec(dataset=str(cora.path), placement=str(tmp_path), epochs=1, prefetch=2, backend="posix",
                      model="gcn", gcn_norm="global", fanouts=(10, 5), batch_size=35, hidden=32, seed=3)
    host = train(cfg)
    starts = []
    fake = train(cfg, memory=FakeDeviceMemory(), progress=lambda r: starts.append(r) if r["kind"] == "start" else None)
    for k, v in host.model.state_dict().items():
        assert torch.equal(v, fake.model.state_dict()[k]), k
    assert starts[0]["feature_dtype"] == dtype
    # the rows crossed as stored: the CPU and SSD rows' bytes at the stored size, not float32's
    row = p.codec.row_bytes
    tiers = fake.final["tiers"]
    assert tiers["ssd"]["bytes"] == tiers["ssd"]["rows"] * row and tiers["cpu"]["bytes"] == tiers["cpu"]["rows"] * row
