"""The plan's prediction against what training measures (training.prediction, moment train --json)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moment.cli import main
from tests.conftest import graph_fixture
from training.data import open_dataset
from training.importers.planetoid import import_planetoid
from training.prediction import (
    TierRate,
    pages_per_row,
    predict_epoch,
    rates_from_capacities,
    ssd_requests,
)


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


def _ssd_s(rows: int, row_bytes: int, bins, readers: int, shared: bool, steps: int = 4) -> float:
    m = {"ssd": {"rows": rows, "bytes": rows * row_bytes, "requests": 0, "seconds": 1.0}}
    rates = {"ssd": TierRate(iops=50_000.0, bytes_per_s=None, source="fio")}
    return predict_epoch(0, {"ssd": 1.0}, m, row_bytes=row_bytes, rates=rates, steps=steps, ssd_bins=bins,
                         readers=readers, shared=shared).predicted_io_s


def test_ranks_of_a_node_share_the_ssds_time():
    # 1 KiB rows, 4 to a page: the figures of tools/bench_train.py's graph, one epoch of one rank
    bins = [(0.125, 400_000)] * 8
    one = _ssd_s(250_000, 1024, bins, 1, False, steps=10)
    assert one == pytest.approx(ssd_requests(250_000, 10, bins, 1024) / 50_000)
    # private reads: the disk serves both ranks' requests while this one's run
    assert _ssd_s(250_000, 1024, bins, 2, False, steps=10) == pytest.approx(2 * one)
    # shared: the union of both ranks' rows, read once: more than one rank's, less than both
    both = _ssd_s(250_000, 1024, bins, 2, True, steps=10)
    assert one < both < 2 * one
    assert both == pytest.approx(ssd_requests(500_000, 10, bins, 1024) / 50_000)
    # sharing alone with nobody changes nothing
    assert _ssd_s(250_000, 1024, bins, 1, True, steps=10) == pytest.approx(one)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 200_000), bin_rows=st.integers(1, 2_000_000), readers=st.integers(1, 8),
       row_bytes=st.sampled_from([256, 1024, 4096, 6000, 8192]))
def test_shared_reads_never_predict_more_than_private_ones(rows, bin_rows, readers, row_bytes):
    bins = [(1.0, bin_rows)]
    private = _ssd_s(rows, row_bytes, bins, readers, False)
    shared = _ssd_s(rows, row_bytes, bins, readers, True)
    # (not bounded below by one rank's: the union's pages may join into fewer, longer reads)
    assert shared <= private * (1 + 1e-9)
    assert private == pytest.approx(readers * _ssd_s(rows, row_bytes, bins, 1, False))


def test_rates_from_a_capacities_file(tmp_path):
    from planner.capacities import load_capacities

    f = tmp_path / "caps.yaml"
    f.write_text("schema: moment.capacities\nversion: 1\ndevices:\n"
                 "  vda:\n    read_bytes_per_s: 400 MB/s\n    read_iops: 100000\n    block_bytes: 4096\n"
                 "    tool: fio-io_uring\nmemory:\n  0: {bytes_per_s: 10 GB/s}\n")
    rates = rates_from_capacities(load_capacities(f))
    assert rates["ssd"].iops == 100000 and rates["ssd"].source == "fio-io_uring"
    assert rates["cpu"].bytes_per_s == 10e9


def train_args(tmp_path, capsys) -> list[str]:
    """`moment train` on Cora placed by `moment place` over eight SSD bins, with a capacities file: the
    arguments of a one-epoch run that predicts its reads (``--metrics`` not included)."""
    cora = open_dataset(import_planetoid(graph_fixture("cora"), tmp_path / "cora"))
    ssd, pl = tmp_path / "ssd", tmp_path / "pl"
    assert main(["place", "--dataset", str(cora.path), "--machine", "moment-b", "--gpu-cache", "0",
                 "--cpu-cache", "256KiB", *[a for _ in range(8) for a in ("--ssd", str(ssd))], "--out", str(pl),
                 "--json"]) == 0
    capsys.readouterr()
    caps = tmp_path / "caps.yaml"
    caps.write_text("schema: moment.capacities\nversion: 1\ndevices:\n"
                    "  vda:\n    read_bytes_per_s: 400 MB/s\n    read_iops: 100000\n    block_bytes: 4096\n")
    return ["train", "--dataset", str(cora.path), "--placement", str(pl), "--capacities", str(caps),
            "--epochs", "1", "--batch-size", "256", "--fanouts", "5,5", "--hidden", "16", "--eval-every", "0",
            "--backend", "posix"]


def test_moment_train_json_carries_the_prediction(tmp_path, capsys):
    args = train_args(tmp_path, capsys)
    metrics = tmp_path / "m.jsonl"
    assert main([*args, "--metrics", str(metrics), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pred = out["epochs"][-1]["prediction"]
    ssd_tier = next(t for t in pred["tiers"] if t["tier"] == "ssd")
    assert ssd_tier["measured_bytes"] > 0 and ssd_tier["measured_s"] > 0 and ssd_tier["predicted_s"] > 0
    # the bytes follow the placement's expected shares (pre-sampled hotness against this run's sample)
    assert abs(ssd_tier["bytes_error"]) < 0.5
    assert pred["io_error"] == pytest.approx(ssd_tier["predicted_s"] / ssd_tier["measured_s"] - 1)
    epoch = [json.loads(x) for x in metrics.read_text().splitlines() if '"epoch"' in x][-1]
    assert epoch["kind"] == "epoch" and epoch["prediction"]["tiers"] == pred["tiers"]
