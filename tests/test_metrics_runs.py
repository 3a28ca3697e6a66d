"""Runs appended to one metrics file stay apart: a run id in every record, `moment report` per run (issue 28 item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moment.cli import main
from tests.conftest import flat_spec, graph_fixture
from training.importers import import_dataset
from training.runreport import MetricsError, read_metrics, read_runs
from training.trainer import train

SMALL = dict(fanouts=(5, 5), batch_size=35, hidden=16, seed=3, eval_every_epochs=0)


class _Crash(Exception):
    pass


@pytest.fixture(scope="module")
def cora(tmp_path_factory) -> Path:
    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


def _epoch(e: int) -> dict:
    return {"kind": "epoch", "epoch": e, "epoch_s": 2.0, "seeds_per_s": 500.0, "compute_s": 1.0, "allreduce_s": 0.0,
            "io_wait_s": 0.5, "sample_s": 0.5, "gather_s": 0.5, "loss": 1.0 + e, "tiers": {}}


def test_two_trainings_into_one_file_report_apart_and_a_resume_stays_one_run(cora, tmp_path, capsys):
    metrics = tmp_path / "m.jsonl"
    gcn = dict(dataset=str(cora), model="gcn", epochs=2, checkpoint_dir=str(tmp_path / "ck"),
               checkpoint_every_steps=2, metrics_path=str(metrics), **SMALL)

    def crash(rec):
        if rec["kind"] == "step" and rec["epoch"] == 1 and rec["step"] == 3:
            raise _Crash

    with pytest.raises(_Crash):
        train(flat_spec(**gcn), progress=crash)
    train(flat_spec(**gcn, resume=True))  # the same run, continued
    train(flat_spec(dataset=str(cora), model="sage", epochs=1, metrics_path=str(metrics), **SMALL))
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert all(r.get("run") for r in recs)
    ids = list(dict.fromkeys(r["run"] for r in recs))
    assert len(ids) == 2  # the resume kept its run's id
    first, second = read_runs(metrics)
    assert (first.run_id, second.run_id) == tuple(ids)
    assert [e["epoch"] for e in first.epochs] == [0, 1] and first.start["config"]["model"] == "gcn"
    assert [e["epoch"] for e in second.epochs] == [0] and second.start["config"]["model"] == "sage"
    assert first.steps == 8 and second.steps == 4  # the resumed run's redone steps once each
    # the report: the last run by default, named as such; never the first run's epochs under its name
    assert main(["report", str(metrics), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert f"run 2 of 2 ({ids[1]}): 1 epoch(s), 4 step record(s)" in out, out
    assert main(["report", str(metrics), "--no-plots", "--run", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"] == ids[0] and doc["epochs"] == [0, 1] and doc["runs"] == 2
    assert main(["report", str(metrics), "--run", "all", "--out", str(tmp_path / "r"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["run"] for d in doc["runs"]] == ids
    assert (tmp_path / "r" / "run1" / "report.svg").exists() and (tmp_path / "r" / "run2" / "report.svg").exists()


def test_files_without_run_ids_split_at_each_start_that_is_not_a_resume(tmp_path):
    recs = [{"kind": "start", "config": {"model": "gcn"}}, _epoch(0), {"kind": "step", "epoch": 1, "step": 0},
            {"kind": "start", "config": {"model": "gcn"}, "start_epoch": 1, "start_step": 0}, _epoch(1),
            {"kind": "start", "config": {"model": "sage"}}, _epoch(0)]
    m = tmp_path / "old.jsonl"
    m.write_text("".join(json.dumps(r) + "\n" for r in recs))
    runs = read_runs(m)
    assert [len(r.epochs) for r in runs] == [2, 1] and [r.run_id for r in runs] == [None, None]
    last = read_metrics(m)
    assert last.start["config"]["model"] == "sage" and last.epochs[0]["loss"] == 1.0 and last.name == "run 2 of 2"
    assert read_metrics(m, 1).start["config"]["model"] == "gcn"
    with pytest.raises(MetricsError, match="holds 2 run"):
        read_metrics(m, 3)


def test_a_last_run_without_an_epoch_is_refused_naming_the_runs_that_have_one(tmp_path, capsys):
    m = tmp_path / "m.jsonl"
    m.write_text("".join(json.dumps(r) + "\n" for r in [
        {"run": "a", "kind": "start", "config": {}}, {"run": "a", **_epoch(0)},
        {"run": "b", "kind": "start", "config": {}}, {"run": "b", "kind": "step", "epoch": 0, "step": 0}]))
    assert main(["report", str(m), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "run 2 of 2 (b) no epoch record" in err and "run(s) 1 did (choose one with --run)" in err, err
    assert main(["report", str(m), "--no-plots", "--run", "first"]) == 2
    assert "--run 'first': expected a run number" in capsys.readouterr().err
    assert main(["report", str(m), "--no-plots", "--run", "1"]) == 0
