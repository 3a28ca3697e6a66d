"""`moment place --verify DIR` and `moment data info --verify DIR`: every block of every bin and dataset array
checked, bad files and blocks listed, exit 1 when any is bad (issue 28, item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moment.cli import main


def _flip(path: Path, offset: int) -> bytes:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(8)
        f.seek(offset)
        f.write(bytes(b ^ 0x5A for b in old))
    return old


def _put(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify")
    d = tmp / "g"
    assert main(["data", "synth", str(d), "--nodes", "3000", "--edges", "20000", "--feature-dim", "16",
                 "--train-share", "0.1", "--quiet"]) == 0
    out = tmp / "p"
    assert main(["place", "--dataset", str(d), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache", "16KiB",
                 "--fanouts", "5", "--batch-size", "64", "--hotness", "degree", *(["--ssd", str(out)] * 8),
                 "--out", str(out), "--json"]) == 0
    return d, out


def test_place_verify_lists_every_bad_file_and_block(placed, capsys):
    ds, out = placed
    capsys.readouterr()
    bins = sorted(out.glob("bin*.dat"))
    assert len(bins) == 8
    assert main(["place", "--verify", str(out)]) == 0
    text = capsys.readouterr().out
    assert "all " in text and "files good" in text and text.count("ok   bin") == 8 and "dataset features" in text

    a = _flip(bins[2], 200)
    b = _flip(ds / "indices.npy", 300)
    try:
        assert main(["place", "--verify", str(out)]) == 1
        text = capsys.readouterr().out
        bad = [line for line in text.splitlines() if line.startswith("BAD")]
        assert len(bad) == 2 and str(bins[2]) in text and str(ds / "indices.npy") in text and "block 0" in text
        assert "2 of " in text and "moment place" in text
        assert main(["data", "info", "--verify", str(out), "--json"]) == 1  # a placement: the same check
        rep = json.loads(capsys.readouterr().out)
        assert not rep["ok"] and sorted(f["path"] for f in rep["files"] if not f["ok"]) == sorted(
            [str(bins[2]), str(ds / "indices.npy")])
        assert main(["data", "info", "--verify", str(ds)]) == 1  # the dataset alone: its bad array
        text = capsys.readouterr().out
        assert "BAD  dataset indices" in text and "ok   bin" not in text
    finally:
        _put(bins[2], 200, a)
        _put(ds / "indices.npy", 300, b)
    assert main(["data", "info", "--verify", str(ds)]) == 0
    assert "CRC-32 verified: all" in capsys.readouterr().out


def test_verify_of_an_old_placement_says_so_and_checks_whole_files(placed, tmp_path, capsys):
    import shutil

    _, out = placed
    old = tmp_path / "old"
    shutil.copytree(out, old)
    for man in old.glob("bin*.dat.json"):
        data = json.loads(man.read_text())
        del data["block_sums"]
        man.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["place", "--verify", str(old)]) == 0
    text = capsys.readouterr().out
    assert text.count("placed before Moment recorded a checksum per block") == 8 and "whole file" in text
    _flip(sorted(old.glob("bin*.dat"))[0], 40)
    assert main(["place", "--verify", str(old)]) == 1
    assert "CRC-32 does not match its manifest" in capsys.readouterr().out


def test_place_without_its_options_or_with_a_wrong_dir(tmp_path, capsys):
    assert main(["place", "--dataset", str(tmp_path)]) == 2
    assert "required: --gpu-cache, --cpu-cache, --out" in capsys.readouterr().err
    assert main(["place", "--verify", str(tmp_path)]) == 2
    assert "holds no placement" in capsys.readouterr().err
