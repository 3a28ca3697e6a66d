"""Ordinary output failures say what is wrong in one line, before the work (issue 28 item 10).

A directory where a file is wanted, an unknown suffix, the input named as the output, a read-only
or full disk: each used to end in "internal error ... a bug in Moment", some only after the whole
run. The full and read-only disks are small tmpfs mounts (the tests run as root here; where
mount is refused they are skipped with the reason).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moment.cli import main
from tests.conftest import graph_fixture
from training.checkpoint import save_checkpoint
from training.errors import TrainError
from training.importers import import_dataset

TRAIN = ["--fanouts", "5,5", "--batch-size", "70", "--epochs", "1", "--hidden", "8", "--eval-every", "0"]


@pytest.fixture(scope="module")
def cora(tmp_path_factory) -> Path:
    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


def _one_line(argv: list[str], capsys, *needles: str) -> str:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "internal error" not in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 or sum("error:" in line for line in err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def _metrics(tmp_path: Path) -> Path:
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"kind": "start", "config": {}}) + "\n" + json.dumps(
        {"kind": "epoch", "epoch": 0, "epoch_s": 1.0, "compute_s": 1.0, "allreduce_s": 0.0, "io_wait_s": 0.0,
         "sample_s": 0.0, "gather_s": 0.0, "tiers": {}}) + "\n")
    return m


def test_report_out_is_the_metrics_file(tmp_path, capsys):
    m = _metrics(tmp_path)
    before = m.read_bytes()
    _one_line(["report", str(m), "--out", str(m)], capsys, f"--out {m}: is the input")
    assert m.read_bytes() == before


@pytest.mark.parametrize("command", ["topo", "plan"])
def test_a_picture_named_as_a_directory_or_with_another_suffix(tmp_path, capsys, command):
    _one_line([command, "--machine", "moment-b", "--svg", str(tmp_path)], capsys, "is a directory")
    _one_line([command, "--machine", "moment-b", "--svg", str(tmp_path / "p.png")], capsys,
              "unknown suffix '.png'; expected .svg")
    assert list(tmp_path.iterdir()) == []


def test_emulate_plot_with_an_unknown_suffix_fails_before_the_run(tmp_path, capsys):
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    (tmp_path / "wl.yaml").write_text(
        "data: {synthetic: {rows: 2048, row_bytes: 4KiB, dir: " + str(ssd) + "}}\n"
        "stream: {kind: uniform, rows_per_step: 256, steps: 4}\n")
    _one_line(["bench", "emulate", str(tmp_path / "wl.yaml"), "--plot", str(tmp_path / "e.pdfx")], capsys,
              "--plot", "unknown suffix '.pdfx'")
    assert list(ssd.iterdir()) == []  # nothing ran: the synthetic data was never written


def test_train_checkpoint_onto_a_file_is_refused_before_training(cora, tmp_path, capsys):
    (tmp_path / "ck").write_text("mine")
    err = _one_line(["train", "--dataset", str(cora), *TRAIN, "--checkpoint", str(tmp_path / "ck")], capsys,
                    "--checkpoint", "is a file, not a directory")
    assert "epoch 0" not in err and (tmp_path / "ck").read_text() == "mine"


@pytest.mark.parametrize("kind, why", [("full", "no space left"), ("ro", "read-only file system")])
def test_outputs_on_a_full_or_read_only_disk(cora, tmp_path, capsys, disk, kind, why):
    d = disk(kind)
    before = sorted(p.name for p in d.iterdir())
    _one_line(["train", "--dataset", str(cora), *TRAIN, "--checkpoint", str(d / "ck")], capsys, "--checkpoint", why)
    _one_line(["plan", "--machine", "moment-b", "--svg", str(d / "p.svg")], capsys, "--svg", why)
    _one_line(["topo", "--machine", "moment-b", "--svg", str(d / "t.svg")], capsys, "--svg", why)
    _one_line(["report", str(_metrics(tmp_path)), "--out", str(d / "r")], capsys, "--out", why)
    _one_line(["data", "synth", str(d / "s"), "--nodes", "1000", "--edges", "5000"], capsys, "DST", why)
    _one_line(["data", "import", str(graph_fixture("cora")), str(d / "c")], capsys, "DST", why)
    _one_line(["profile", "--ssd", str(tmp_path), "--no-fio", "--no-memory", "--out", str(d / "caps.yaml")], capsys,
              "--out", why)
    _one_line(["place", "--dataset", str(cora), "--machine", "moment-b", "--gpu-cache", "1MiB", "--cpu-cache", "1MiB",
               "--ssd", str(d / "ssd"), "--out", str(tmp_path / "placed")], capsys, "--ssd", why)
    assert not (tmp_path / "placed").exists()
    assert sorted(p.name for p in d.iterdir()) == before  # nothing made, nothing left behind


def test_a_disk_that_fills_while_writing_keeps_the_old_output_and_leaves_no_temp(cora, tmp_path, capsys, disk):
    d = disk("tight", keep={"p.svg": "old picture"})
    # 4 KiB free passes the check before the work; the picture (tens of KiB) fills the disk while written
    _one_line(["plan", "--machine", "moment-b", "--svg", str(d / "p.svg")], capsys, "No space left on device")
    assert (d / "p.svg").read_text() == "old picture"
    # a checkpoint is about three times the model: refused before training, nothing made
    _one_line(["train", "--dataset", str(cora), *TRAIN, "--checkpoint", str(d / "ck")], capsys,
              "B free, a checkpoint needs about", "--checkpoint")  # its lock file may take the last page
    (d / "ck").mkdir()
    (d / "ck" / "checkpoint.pt").write_text("previous")
    with pytest.raises(TrainError, match="cannot write it .*the previous checkpoint is kept"):
        save_checkpoint(d / "ck" / "checkpoint.pt", {"blob": bytes(256 << 10)})
    assert (d / "ck" / "checkpoint.pt").read_text() == "previous"
    assert sorted(p.name for p in d.iterdir()) == ["ck", "fill", "p.svg"]
    assert [p.name for p in (d / "ck").iterdir()] == ["checkpoint.pt"]
