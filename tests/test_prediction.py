"""The plan's prediction against what training measures (training.prediction, moment train --json)."""

from __future__ import annotations

import json

import pytest

from moment.cli import main
from tests.conftest import graph_fixture
from training.data import open_dataset
from training.importers.planetoid import import_planetoid
from training.prediction import TierRate, pages_per_row, predict_epoch, rates_from_capacities


def test_prediction_per_tier_from_shares_rates_and_the_epochs_demand():
    measured = {"ssd": {"rows": 300, "bytes": 300 * 512, "requests": 300, "seconds": 0.004},
                "cpu": {"rows": 700, "bytes": 700 * 512, "requests": 0, "seconds": 0.0005}}
    rates = {"ssd": TierRate(iops=100_000.0, bytes_per_s=400e6, source="fio"),
             "cpu": TierRate(iops=None, bytes_per_s=10e9, source="memory")}
    p = predict_epoch(3, {"ssd": 0.25, "cpu": 0.75}, measured, row_bytes=512, rates=rates)
    ssd = p.tier("ssd")
    assert ssd.predicted_bytes == pytest.approx(0.25 * 1000 * 512)
    assert ssd.predicted_s == pytest.approx(250 / 100_000)  # one 4 KiB page per 512 B row, at the IOPS
    assert p.io_error == pytest.approx(ssd.predicted_s / 0.004 - 1)
    assert p.tier("cpu").predicted_s == pytest.approx(0.75 * 1000 * 512 / 10e9)
    # without IOPS the SSD's bytes/s; without a rate, no predicted time (and no error)
    q = predict_epoch(0, {"ssd": 1.0}, {"ssd": measured["ssd"]}, row_bytes=8192,
                      rates={"ssd": TierRate(None, 1e9, "x")})
    assert q.tier("ssd").predicted_s == pytest.approx(300 * 512 / 1e9)
    r = predict_epoch(0, {"ssd": 1.0}, {"ssd": measured["ssd"]}, row_bytes=512, rates={})
    assert r.predicted_io_s is None and r.io_error is None and r.to_dict()["tiers"][0]["error"] is None
    assert [pages_per_row(b) for b in (4, 2048, 2049, 4096, 4097)] == [1, 1, 1, 1, 2]


def test_rates_from_a_capacities_file(tmp_path):
    from planner.capacities import load_capacities

    f = tmp_path / "caps.yaml"
    f.write_text("schema: moment.capacities\nversion: 1\ndevices:\n"
                 "  vda:\n    read_bytes_per_s: 400 MB/s\n    read_iops: 100000\n    block_bytes: 4096\n"
                 "    tool: fio-io_uring\nmemory:\n  0: {bytes_per_s: 10 GB/s}\n")
    rates = rates_from_capacities(load_capacities(f))
    assert rates["ssd"].iops == 100000 and rates["ssd"].source == "fio-io_uring"
    assert rates["cpu"].bytes_per_s == 10e9


def test_moment_train_json_carries_the_prediction(tmp_path, capsys):
    cora = open_dataset(import_planetoid(graph_fixture("cora"), tmp_path / "cora"))
    ssd, pl = tmp_path / "ssd", tmp_path / "pl"
    assert main(["place", "--dataset", str(cora.path), "--machine", "moment-b", "--gpu-cache", "0",
                 "--cpu-cache", "256KiB", *[a for _ in range(8) for a in ("--ssd", str(ssd))], "--out", str(pl),
                 "--json"]) == 0
    capsys.readouterr()
    caps = tmp_path / "caps.yaml"
    caps.write_text("schema: moment.capacities\nversion: 1\ndevices:\n"
                    "  vda:\n    read_bytes_per_s: 400 MB/s\n    read_iops: 100000\n    block_bytes: 4096\n")
    metrics = tmp_path / "m.jsonl"
    assert main(["train", "--dataset", str(cora.path), "--placement", str(pl), "--capacities", str(caps),
                 "--epochs", "1", "--batch-size", "256", "--fanouts", "5,5", "--hidden", "16", "--eval-every", "0",
                 "--backend", "posix", "--metrics", str(metrics), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pred = out["epochs"][-1]["prediction"]
    ssd_tier = next(t for t in pred["tiers"] if t["tier"] == "ssd")
    assert ssd_tier["measured_bytes"] > 0 and ssd_tier["measured_s"] > 0 and ssd_tier["predicted_s"] > 0
    # the bytes follow the placement's expected shares (pre-sampled hotness against this run's sample)
    assert abs(ssd_tier["bytes_error"]) < 0.5
    assert pred["io_error"] == pytest.approx(ssd_tier["predicted_s"] / ssd_tier["measured_s"] - 1)
    epoch = [json.loads(x) for x in metrics.read_text().splitlines() if '"epoch"' in x][-1]
    assert epoch["kind"] == "epoch" and epoch["prediction"]["tiers"] == pred["tiers"]
