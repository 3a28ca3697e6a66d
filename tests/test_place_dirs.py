"""`moment place --ssd`: warnings when the "SSDs" are not separate drives; nothing left behind on an error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from moment.cli import main
from moment.place_dirs import make_dirs, remove_created
from training.place.run import ssd_warnings


def test_dirs_on_one_device_are_named_in_one_warning(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    other_root = "/proc"  # its own file system: tmp_path is then not "the root" here
    assert os.stat(other_root).st_dev != os.stat(a).st_dev
    (note,) = ssd_warnings([a, b, a], root=other_root)
    assert "all on one device" in note and str(a) in note and str(b) in note
    assert ssd_warnings([a], root=other_root) == []  # one directory on its own drive: nothing to say
    (note,) = ssd_warnings([a], root=str(tmp_path))
    assert "root file system" in note


def test_dirs_on_different_devices_are_not_one_device(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system here")
    assert not any("one device" in n for n in ssd_warnings([tmp_path, shm], root="/proc"))


def test_make_dirs_records_only_what_it_created_and_cleans_up(tmp_path):
    keep = tmp_path / "existing"
    keep.mkdir()
    (keep / "mine.txt").write_text("x")
    created: list[Path] = []
    make_dirs([("--out", keep / "out" / "deep"), ("--ssd", keep), ("--ssd", tmp_path / "s")], created)
    assert created == [keep / "out", keep / "out" / "deep", tmp_path / "s"]
    (tmp_path / "s" / "bin").write_text("written by this run")
    remove_created(created, only_empty=True)  # after success: empty ones go, filled ones stay
    assert not (keep / "out").exists() and (tmp_path / "s" / "bin").exists()
    remove_created(created, only_empty=False)  # after an error: all it created goes
    assert not (tmp_path / "s").exists() and (keep / "mine.txt").read_text() == "x"


def test_place_that_fails_late_leaves_no_directories(tmp_path, capsys):
    d = tmp_path / "g"
    assert main(["data", "synth", str(d), "--nodes", "2000", "--edges", "20000", "--feature-dim", "4",
                 "--train-share", "0.1", "--quiet"]) == 0
    existing = tmp_path / "existing-ssd"
    existing.mkdir()
    args = ["place", "--dataset", str(d), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache", "8KiB",
            "--fanouts", "5", "--batch-size", "64", "--hotness-dir", str(tmp_path / "hot"),
            "--ssd", str(tmp_path / "new" / "ssd0"), "--ssd", str(existing), "--out", str(tmp_path / "out")]
    assert main(args) == 2  # 2 --ssd for moment-b's 8 SSDs: refused after the pre-sampling
    assert "has 8 SSD(s)" in capsys.readouterr().err
    assert not (tmp_path / "new").exists() and not (tmp_path / "out").exists()
    assert existing.is_dir()  # it was there before: never removed
