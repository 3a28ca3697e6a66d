"""`moment train --check-dataset background`: every block of the arrays a run reads is checked while it runs;
a corrupt one that the sample on opening missed stops the run, naming the file (issue 28)."""

from __future__ import annotations

import json

import pytest

import training.trainer as trainer
from moment.cli import main
from training.data import open_dataset


@pytest.fixture()
def graph(tmp_path):
    g = tmp_path / "g"
    assert main(["data", "synth", str(g), "--nodes", "3000", "--edges", "40000", "--feature-dim", "16",
                 "--train-share", "0.2", "--quiet"]) == 0
    return g


def _train(graph, tmp_path, *extra):
    metrics = tmp_path / "m.jsonl"
    rc = main(["train", "--dataset", str(graph), "--epochs", "2", "--fanouts", "4,4", "--batch-size", "128",
               "--prefetch", "0", "--metrics", str(metrics), *extra])
    recs = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return rc, [r for r in recs if r.get("kind") == "epoch"]


def test_a_whole_run_says_it_checked_every_block(graph, tmp_path):
    rc, epochs = _train(graph, tmp_path)
    assert rc == 0 and len(epochs) == 2
    assert epochs[-1]["dataset_check"].startswith("CRC-32 verified: all")
    assert epochs[-1]["dataset_check"].endswith("of 7 file(s)")  # the CSR, labels, splits and the features
    assert "dataset_check" not in epochs[0]
    rc, epochs = _train(graph, tmp_path, "--check-dataset", "open")
    assert rc == 0 and "dataset_check" not in epochs[-1]


def test_damage_the_sample_missed_stops_the_run_before_its_results(graph, tmp_path, capsys, monkeypatch):
    # the sample on opening reads every block of a file this small: open without it, as if it had missed one
    monkeypatch.setattr(trainer, "open_dataset", lambda path, **kw: open_dataset(path, **{**kw, "verify": "none"}))
    raw = bytearray((graph / "indices.npy").read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one neighbour id off by one: nothing else would notice
    (graph / "indices.npy").write_bytes(bytes(raw))
    capsys.readouterr()
    rc, epochs = _train(graph, tmp_path, "--checkpoint", str(tmp_path / "ck"))
    assert rc == 2 and not epochs  # stopped at the first epoch's end: no epoch record, no checkpoint
    err = capsys.readouterr().err
    assert "indices.npy: block 0 of 1" in err and "does not match the CRC-32" in err and "Traceback" not in err
    assert not list((tmp_path / "ck").glob("*.pt"))
    rc, epochs = _train(graph, tmp_path, "--check-dataset", "open")  # asked not to: it trains on
    assert rc == 0 and len(epochs) == 2
