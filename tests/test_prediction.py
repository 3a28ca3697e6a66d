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
from training.throughput import describe


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


def test_a_tiny_run_says_the_flow_model_does_not_apply_and_why(tmp_path, capsys):
    """The epoch in the paper's terms: measured GB/s and seeds/s beside the plan's inlet for rank 0's GPU
    and the profile's, each SSD bin's share against the plan's target; Cora is far too small for the flow
    model and the record, the CLI's summary and `moment report` say so, with the threshold."""
    from training.throughput import CALL_LATENCY_S, LATENCY_MARGIN

    args = train_args(tmp_path, capsys)
    with open(tmp_path / "caps.yaml", "a") as caps:  # host memory's rate too: the profile times every tier read
        caps.write("memory:\n  0: {bytes_per_s: 10 GB/s}\n")
    place = json.loads((tmp_path / "pl" / "place.json").read_text())
    inlet = place["plan_inlet_bytes_per_s"]
    assert len(inlet) == 4 and all(v > 1e9 for v in inlet.values())  # moment-b: 4 GPUs, GB/s each
    metrics = tmp_path / "m.jsonl"
    assert main([*args, "--metrics", str(metrics), "--json"]) == 0
    epoch = json.loads(capsys.readouterr().out)["epochs"][-1]
    t = epoch["throughput"]
    feature_bytes = sum(v["bytes"] for v in epoch["tiers"].values())
    assert t["feature_bytes"] == feature_bytes > 0
    assert t["measured_bytes_per_s"] == pytest.approx(feature_bytes / epoch["epoch_s"])
    assert t["measured_seeds_per_s"] == pytest.approx(epoch["seeds_per_s"])
    first = next(iter(inlet))
    assert t["plan_gpu"] == first and t["plan_bytes_per_s"] == pytest.approx(inlet[first])
    assert t["plan_machine"] == "moment-b"
    assert t["plan_error"] == pytest.approx(t["plan_bytes_per_s"] / t["measured_bytes_per_s"] - 1)
    assert t["plan_seeds_per_s"] == pytest.approx(epoch["seeds"] * inlet[first] / feature_bytes)
    tiers = {x["tier"]: x for x in epoch["prediction"]["tiers"]}
    assert t["profile_bytes_per_s"] == pytest.approx(
        feature_bytes / (tiers["ssd"]["predicted_s"] + tiers["cpu"]["predicted_s"]))
    # eight SSD bins: measured shares of the SSD reads sum to 1, targets as place.json's renormalised
    assert len(t["devices"]) == 8
    assert sum(d["measured_share"] for d in t["devices"]) == pytest.approx(1.0)
    ssd_t = [b["target_share"] for b in place["bins"] if b["kind"] == "ssd"]
    assert [d["target_share"] for d in t["devices"]] == pytest.approx([x / sum(ssd_t) for x in ssd_t])
    # a few MB over tens of read calls: latency-bound, said with the threshold
    assert t["applies"] is False and t["read_calls"] > 0
    assert feature_bytes / inlet[first] < LATENCY_MARGIN * t["read_calls"] * CALL_LATENCY_S
    assert any(w.startswith("latency-bound (too small for the flow model)") for w in t["why_not"])
    assert t["thresholds"] == {"call_latency_s": CALL_LATENCY_S, "latency_margin": LATENCY_MARGIN,
                               "io_bound_share": 0.5}
    # the end-of-run summary and `moment report` say it
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "throughput: plan vs run" in out and "the flow model does not apply: latency-bound" in out
    assert main(["report", str(metrics), "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "throughput: the flow model does not apply: latency-bound" in text
    assert "feature GB/s (plan)" in text
    assert main(["report", str(metrics), "--no-plots", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["throughput"]["applies"] is False
    assert doc["predicted_vs_measured"][0]["figure"] == "feature GB/s (plan)"


def test_the_flow_model_applies_only_to_large_io_bound_epochs():
    from training.throughput import applicability, describe, epoch_throughput

    rec = {"epoch": 2, "epoch_s": 10.0, "seeds": 50_000, "io_wait_share": 0.7,
           "tiers": {"ssd": {"rows": 10**6, "bytes": 4e9}, "cpu": {"rows": 10**6, "bytes": 4e9},
                     "gpu": {"rows": 10**6, "bytes": 2e9}}}
    t = epoch_throughput(rec, plan_inlet={"gpu0": 1.2e9, "gpu1": 0.9e9}, rank_index=1, readers=2, read_calls=1000,
                         bin_rows={3: 300.0, 4: 100.0, 9: 5.0},
                         ssd_targets=[(3, "ssd0", 0.3, 0.28), (4, "ssd1", 0.1, 0.12)])
    assert t.plan_gpu == "gpu1" and t.plan_bytes_per_s == 0.9e9 and t.measured_bytes_per_s == 1e9
    assert t.plan_seeds_per_s == pytest.approx(50_000 * 0.9e9 / 1e10) and t.applies and t.why_not == ()
    assert [d.device for d in t.devices] == ["ssd0", "ssd1"]
    assert [(d.measured_share, d.target_share) for d in t.devices] == [pytest.approx((0.75, 0.75)),
                                                                      pytest.approx((0.25, 0.25))]
    assert t.devices[0].expected_share == pytest.approx(0.7) and t.max_device_deviation == pytest.approx(0.0)
    lines = describe(t.to_dict())
    assert "plan (inlet of gpu1, 2 GPU(s) reading) 0.9 GB/s" in lines[0] and "(-10.0% against the run)" in lines[0]
    assert lines[1] == "SSD reads per device, measured vs the plan's target: ssd0 75.0% vs 75.0%, ssd1 25.0% vs 25.0%"
    assert lines[-1] == "the flow model applies: the epoch is I/O-bound and large enough"
    # a rank beyond the plan's GPUs has no plan rate; none recorded, none compared
    assert epoch_throughput(rec, plan_inlet={"gpu0": 1e9}, rank_index=3).plan_bytes_per_s is None
    # the threshold is exact: bandwidth time against margin x calls x latency
    assert applicability(1e6, 1e9, 1, 0.9, call_latency_s=1e-4) == ()          # 1 ms = 10 x 0.1 ms
    assert applicability(0.99e6, 1e9, 1, 0.9, call_latency_s=1e-4) != ()
    assert applicability(1e9, 1e9, 10, 0.49)[0].startswith("compute-bound")
    assert len(applicability(1e3, 1e9, 10, 0.1)) == 2


def test_per_device_ssd_time_is_the_sum_read_one_after_another_and_the_max_read_at_once():
    # two devices of unequal IOPS: "fast" holds 3 of the 4 SSD bins' reads at 4000 IOPS, "slow" 1 of them at 500
    bins = [(0.25, 100_000), (0.25, 100_000), (0.25, 100_000), (0.25, 100_000)]
    devs = ["fast", "fast", "fast", "slow"]
    rates = {"ssd": TierRate(iops=4500.0, bytes_per_s=None, source="fio")}
    per = {"fast": TierRate(4000.0, None, "fio"), "slow": TierRate(500.0, None, "fio")}
    m = {"ssd": {"rows": 8000, "bytes": 8000 * 4096, "requests": 8000, "seconds": 3.0}}

    def run(concurrent: bool, device_rates=per):
        return predict_epoch(0, {"ssd": 1.0}, m, row_bytes=4096, rates=rates, steps=4, ssd_bins=bins,
                             ssd_devices=devs, device_rates=device_rates, concurrent_bins=concurrent,
                             device_requests={"fast": 6100.0, "slow": 1900.0})

    seq, conc = run(False), run(True)
    # whole-page rows: one request per row; 6000 rows on "fast" (1.5 s), 2000 on "slow" (4.0 s)
    assert [(d.device, d.predicted_requests, d.read_iops, d.predicted_s, d.measured_requests)
            for d in seq.devices] == [("fast", 6000.0, 4000.0, 1.5, 6100.0), ("slow", 2000.0, 500.0, 4.0, 1900.0)]
    assert seq.predicted_io_s == 5.5 and conc.predicted_io_s == 4.0
    assert seq.to_dict()["ssd_time_model"] == "sum over devices"
    assert conc.to_dict()["ssd_time_model"] == "max over devices"
    assert conc.to_dict()["devices"][1] == {"device": "slow", "predicted_requests": 2000.0, "read_iops": 500.0,
                                            "predicted_s": 4.0, "measured_requests": 1900.0}
    # the tier-level model this replaces: all requests over the summed IOPS, as if every device were equally busy
    assert run(False, device_rates={}).predicted_io_s == pytest.approx(8000 / 4500)
    # a device without a measured rate: no per-device figures, the tier-level model
    partial = run(True, device_rates={"fast": per["fast"]})
    assert partial.devices == () and partial.predicted_io_s == pytest.approx(8000 / 4500)
    assert partial.to_dict()["ssd_time_model"] is None


def test_the_predictor_takes_bin_reads_at_once_from_the_stores_backend():
    from types import SimpleNamespace

    from training.metrics import Predictor

    def pred(backend):
        return Predictor(SimpleNamespace(backend=backend), {"ssd": 1.0}, 4096, {}, []).concurrent_bins

    assert pred(SimpleNamespace(concurrent_bins=True)) is True
    assert pred(SimpleNamespace(concurrent_bins=False)) is False
    assert pred(SimpleNamespace()) is False and pred(None) is False  # a backend that reads bins one by one


def test_the_predictor_sums_or_maxes_over_the_placements_devices():
    """Through :class:`training.metrics.Predictor`: ``place.json``'s SSD bins name their devices, the store's
    per-bin counters give each device's requests; node-shared reads go bin by bin, so the sum."""
    from types import SimpleNamespace

    from training.metrics import Predictor

    report = {"bins": [{"kind": "ssd", "device": d, "target_share": 0.5} for d in ("a", "b")],
              "report": {"bins": [{"kind": "ssd", "traffic_share": 0.5, "rows": 10**6}] * 2}}
    counts = {"ssd": {"rows": 0.0, "bytes": 0.0, "requests": 0.0, "seconds": 0.0}}
    bins = [SimpleNamespace(bin_id=0, rows=0, requests=0), SimpleNamespace(bin_id=1, rows=0, requests=0)]
    store = SimpleNamespace(backend=SimpleNamespace(concurrent_bins=True), stats=lambda: bins,
                            tier_stats=lambda: {k: dict(v) for k, v in counts.items()})
    per = {"a": TierRate(1000.0, None, "fio"), "b": TierRate(250.0, None, "fio")}
    pr = Predictor(store, {"ssd": 1.0}, 4096, {"ssd": TierRate(1250.0, None, "fio")},
                   [(0.5, 10**6), (0.5, 10**6)], report, device_rates=per)
    pr.start()
    counts["ssd"] = {"rows": 1000.0, "bytes": 1000.0 * 4096, "requests": 1000.0, "seconds": 2.0}
    bins[0].rows = bins[1].rows = 500
    bins[0].requests, bins[1].requests = 510, 490
    at_once = pr.finish(0, 1)
    assert [(d.device, d.predicted_s, d.measured_requests) for d in at_once.devices] == [("a", 0.5, 510.0),
                                                                                          ("b", 2.0, 490.0)]
    assert at_once.predicted_io_s == 2.0 and at_once.concurrent_bins
    pr.node(2, True)  # two ranks sharing the node's pages: the union of their rows, read bin by bin
    shared = pr.finish(0, 1)
    assert not shared.concurrent_bins
    assert shared.predicted_io_s == pytest.approx(sum(d.predicted_s for d in shared.devices))


def test_device_rates_from_a_capacities_file_keep_each_devices_iops(tmp_path):
    from planner.capacities import load_capacities
    from training.prediction import device_rates_from_capacities

    f = tmp_path / "caps.yaml"
    f.write_text("schema: moment.capacities\nversion: 1\ndevices:\n"
                 "  dev:ssd0:\n    read_bytes_per_s: 400 MB/s\n    read_iops: 100000\n    block_bytes: 4096\n"
                 "  dev:ssd1:\n    read_bytes_per_s: 100 MB/s\n    read_iops: 25000\n    block_bytes: 4096\n"
                 "  dev:ssd2:\n    read_bytes_per_s: 900 MB/s\n    read_iops: 7000\n    block_bytes: 131072\n")
    per = device_rates_from_capacities(load_capacities(f))
    assert {k: r.iops for k, r in per.items()} == {"dev:ssd0": 100000, "dev:ssd1": 25000, "dev:ssd2": None}
    assert per["dev:ssd1"].bytes_per_s == 100e6


def test_moment_train_predicts_each_ssds_time_at_its_own_rate(tmp_path, capsys):
    """A capacities file with each of the plan's eight SSDs at its own IOPS (as ``moment profile`` on
    emulated SSDs writes it): the prediction has one record per device, and the SSD tier's time is their
    sum (bins read one after another) or their max (read at once), as the store's backend says."""
    args = train_args(tmp_path, capsys)
    iops = [100_000, 80_000, 60_000, 40_000, 20_000, 10_000, 5_000, 2_500]
    (tmp_path / "caps.yaml").write_text("schema: moment.capacities\nversion: 1\ndevices:\n" + "".join(
        f"  ssd{i}:\n    read_bytes_per_s: {q * 4096} B/s\n    read_iops: {q}\n    block_bytes: 4096\n"
        for i, q in enumerate(iops)))
    assert main([*args, "--json"]) == 0
    epoch = json.loads(capsys.readouterr().out)["epochs"][-1]
    pred = epoch["prediction"]
    devs = pred["devices"]
    # the paper's-terms record carries each device's predicted seconds beside its share, and says it
    assert [d["predicted_s"] for d in epoch["throughput"]["devices"]] == [d["predicted_s"] for d in devs]
    assert "s predicted)" in describe(epoch["throughput"])[1]
    assert [d["device"] for d in devs] == [f"ssd{i}" for i in range(8)]
    assert [d["read_iops"] for d in devs] == iops
    assert all(d["predicted_s"] == pytest.approx(d["predicted_requests"] / d["read_iops"]) for d in devs)
    times = [d["predicted_s"] for d in devs]
    ssd_tier = next(t for t in pred["tiers"] if t["tier"] == "ssd")
    model = pred["ssd_time_model"]
    assert model in ("sum over devices", "max over devices")
    assert ssd_tier["predicted_s"] == pytest.approx(sum(times) if model.startswith("sum") else max(times))
    # the store's per-bin requests, gathered per device, are the tier's
    assert sum(d["measured_requests"] for d in devs) == pytest.approx(ssd_tier["measured_requests"])
