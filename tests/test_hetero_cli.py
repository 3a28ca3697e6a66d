"""``moment place`` and ``moment train`` on a heterogeneous dataset (synth_mag: 4 node types, 3 with features)."""

from __future__ import annotations

import json

import pytest

from moment.cli import main
from training.hetero.graph import add_reverse
from training.hetero.store import write_hetero
from training.hetero.synth import synth_mag


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    root = tmp_path_factory.mktemp("hcli")
    write_hetero(root / "mag", add_reverse(synth_mag(papers=600, authors=300, institutions=40, fields=20)))
    return root


def test_place_spans_the_tiers_and_train_learns_through_them(placed, capsys) -> None:
    root = placed
    ssd = [a for _ in range(8) for a in ("--ssd", str(root / "ssd"))]  # moment-b has 8 SSDs
    assert main(["place", "--dataset", str(root / "mag"), "--machine", "moment-b", "--gpu-cache", "2KiB",
                 "--cpu-cache", "4KiB", *ssd, "--fanouts", "3,2", "--batch-size", "16", "--out", str(root / "pl"),
                 "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["schema"] == "moment.place.hetero" and set(rep["types"]) == {"paper", "author", "institution"}
    tiers = rep["tiers"]
    assert all(tiers[k]["bytes"] > 0 for k in ("gpu", "cpu", "ssd"))  # the placement spans the tiers
    assert tiers["gpu"]["bytes"] <= 2048 and tiers["cpu"]["bytes"] <= 2 * 4096  # moment-b: 2 host memories
    assert sum(t["rows"] * t["row_bytes"] for t in rep["types"].values()) == sum(v["bytes"] for v in tiers.values())
    # the GPU cache takes rows of several types by one hotness
    assert sum(1 for t in rep["types"].values() if t["rows_per_bin"][0]) >= 2
    # a second place into the same directory is refused
    assert main(["place", "--dataset", str(root / "mag"), "--machine", "moment-b", "--gpu-cache", "2KiB",
                 "--cpu-cache", "4KiB", *ssd, "--out", str(root / "pl")]) == 2
    assert "holds a placement already" in capsys.readouterr().err

    ck, metrics = root / "ck", root / "m.jsonl"
    args = ["train", "--dataset", str(root / "mag"), "--placement", str(root / "pl"), "--model", "rgcn",
            "--fanouts", "3,2", "--batch-size", "64", "--hidden", "32", "--lr", "0.01", "--checkpoint", str(ck),
            "--metrics", str(metrics), "--json"]
    assert main([*args, "--epochs", "2"]) == 0
    epochs = json.loads(capsys.readouterr().out)["epochs"]
    assert len(epochs) == 2 and epochs[-1]["valid_acc"] > 0.7  # 4 classes: chance 0.25
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    assert all(epochs[-1]["tiers"][k]["rows"] > 0 for k in ("gpu", "cpu", "ssd"))  # read through every tier
    assert (ck / "checkpoint.pt").exists()
    kinds = [json.loads(line)["kind"] for line in metrics.read_text().splitlines()]
    assert kinds[0] == "start" and kinds.count("epoch") == 2 and kinds.count("step") == 2 * 6
    assert main([*args, "--epochs", "3", "--resume"]) == 0  # one more epoch from the checkpoint
    out = json.loads(capsys.readouterr().out)
    assert [e["epoch"] for e in out["epochs"]] == [2] and out["resumed_from"] == [2, 0]


def test_hetero_sage_from_memory_and_model_errors(placed, capsys) -> None:
    root = placed
    assert main(["train", "--dataset", str(root / "mag"), "--model", "hetero-sage", "--fanouts", "3,2",
                 "--eval-fanouts", "5,5", "--batch-size", "64", "--hidden", "32", "--lr", "0.01", "--epochs", "2",
                 "--json"]) == 0
    epochs = json.loads(capsys.readouterr().out)["epochs"]
    assert epochs[-1]["valid_acc"] > 0.7 and epochs[-1]["tiers"] == {}
    assert main(["train", "--dataset", str(root / "mag"), "--model", "sage", "--epochs", "1"]) == 2
    assert "--model hetero-sage or rgcn" in capsys.readouterr().err
    assert main(["train", "--dataset", str(root / "mag"), "--model", "rgcn", "--dynamic-cache", "1MiB"]) == 2
    assert "--dynamic-cache: not available for a heterogeneous dataset" in capsys.readouterr().err


def test_options_a_hetero_placement_does_not_take_are_named(placed, tmp_path, capsys) -> None:
    ssd = [a for _ in range(8) for a in ("--ssd", str(tmp_path / "ssd"))]
    base = ["place", "--dataset", str(placed / "mag"), "--machine", "moment-b", "--gpu-cache", "1KiB",
            "--cpu-cache", "1KiB", *ssd, "--out", str(tmp_path / "pl")]
    assert main([*base, "--strategy", "hash", "--presample-batches", "3"]) == 2
    err = capsys.readouterr().err
    assert "--strategy" in err and "--presample-batches" in err and "not available for a heterogeneous" in err
    assert not (tmp_path / "pl" / "hetero_place.json").exists()
    assert main(["data", "synth", str(tmp_path / "g"), "--nodes", "200", "--edges", "1000", "--quiet"]) == 0
    assert main(["train", "--dataset", str(tmp_path / "g"), "--model", "rgcn", "--epochs", "1"]) == 2
    assert "for a heterogeneous dataset" in capsys.readouterr().err
