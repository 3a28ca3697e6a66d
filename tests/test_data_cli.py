"""`moment data import` and `moment data info`, end to end on the fixtures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moment.cli import main
from tests.conftest import graph_fixture
from training.data import open_dataset


def test_import_cora_auto_then_info(tmp_path, capsys):
    dst = tmp_path / "cora"
    assert main(["data", "import", str(graph_fixture("cora")), str(dst)]) == 0
    out = capsys.readouterr().out
    assert "(planetoid)" in out and "2,708 nodes" in out and "10,556 CSR edges" in out and "140 / 500 / 1,000" in out
    assert main(["data", "info", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "2,708" in out and "max 168" in out and "1433 × float32" in out
    assert main(["data", "info", str(dst), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_edges"] == 10556 and info["split_sizes"] == {"train": 140, "valid": 500, "test": 1000}
    assert info["in_degree"]["max"] == 168 and info["feature_bytes"] == 2708 * 1433 * 4
    assert info["source"]["format"] == "planetoid"


def test_import_npz_with_options(tmp_path, capsys):
    dst = tmp_path / "photo"
    argv = ["data", "import", "--format", "npz", "--lcc", "--seed", "7", "--feature-dtype", "uint8",
            str(graph_fixture("amazon-photo", "amazon_photo.npz")), str(dst)]
    assert main(argv) == 0
    ds = open_dataset(dst)
    assert ds.num_nodes == 7487 and ds.features.dtype == np.uint8 and ds.meta["source"]["split"]["seed"] == 7
    assert len(ds.train_idx) == 160 and len(ds.valid_idx) == 240


def test_import_edgelist_undirected_info_json(tmp_path, capsys):
    dst = tmp_path / "sd"
    src = graph_fixture("soc-Slashdot0902", "soc-Slashdot0902.txt.gz")
    assert main(["data", "import", str(src), str(dst), "--undirected"]) == 0
    capsys.readouterr()
    assert main(["data", "info", "--json", str(dst)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_nodes"] == 82168 and info["num_edges"] == 1008460
    assert info["in_degree"]["median"] == 2 and info["in_degree"]["max"] == 2552
    assert round(info["top1pct_endpoint_share"], 3) == 0.245 and 0 < info["gini"] < 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["data", "import", "{cora}", "{out}", "--lcc"], "--lcc does not apply to --format planetoid"),
        (["data", "import", "{missing}", "{out}"], "no such file or directory"),
        (["data", "info", "{out}"], "no such dataset directory"),
        (
            ["data", "import", "{bad}", "{out}", "--format", "edgelist"],
            "bad.txt:2: expected 2 whitespace-separated integers",
        ),
    ],
)
def test_user_errors_are_one_line_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "bad.txt").write_text("0 1\n1 two\n")
    names = {
        "cora": graph_fixture("cora"),
        "out": tmp_path / "out",
        "missing": tmp_path / "nope",
        "bad": tmp_path / "bad.txt",
    }
    assert main([a.format(**names) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("moment data: error:") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_existing_destination_needs_force(tmp_path, capsys):
    dst = tmp_path / "cora"
    src = str(graph_fixture("cora"))
    assert main(["data", "import", src, str(dst)]) == 0
    assert main(["data", "import", src, str(dst)]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert main(["data", "import", src, str(dst), "--force", "--name", "again"]) == 0
    assert open_dataset(dst).name == "again"


def test_corrupt_dataset_info_is_a_clear_error(tmp_path, capsys):
    dst = tmp_path / "cora"
    assert main(["data", "import", str(graph_fixture("cora")), str(dst)]) == 0
    np.save(dst / "labels.npy", np.full(2708, 9))
    assert main(["data", "info", str(dst)]) == 2
    assert "labels.npy: block 0 of 1 (bytes 0 to 21,792) does not match the CRC-32" in capsys.readouterr().err


# -- integrity: checksums written at import, checked on open ----------------------------------


@pytest.fixture
def cora_copy(tmp_path, capsys):
    dst = tmp_path / "cora"
    assert main(["data", "import", str(graph_fixture("cora")), str(dst)]) == 0
    capsys.readouterr()
    return dst


def _overwrite(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_64_overwritten_feature_bytes_are_caught_by_every_command(cora_copy, tmp_path, capsys):
    """Before checksums, these 64 bytes (NaNs in row ~838) trained to `loss nan` with exit 0."""
    _overwrite(cora_copy / "features.npy", 9_000_000, b"\xff" * 64)
    want = (f"{cora_copy / 'features.npy'}: block 2 of 4 (bytes 8,388,608 to 12,582,912) "
            "does not match the CRC-32 meta.json recorded")
    for argv in (["data", "info", str(cora_copy)],
                 ["train", "--dataset", str(cora_copy), "--epochs", "1", "--model", "gcn"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert want in err and "re-import or regenerate" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1
    # --verify reads every block of every file and reports them all, with exit status 1 (something is bad)
    assert main(["data", "info", str(cora_copy), "--verify"]) == 1
    out = capsys.readouterr().out
    bad = [line for line in out.splitlines() if line.startswith("BAD")]
    assert len(bad) == 1 and "features.npy" in bad[0] and "(block 2)" in bad[0], out
    assert "1 of 7 files are corrupt" in out and "re-import or regenerate" in out


def test_info_says_what_was_verified(cora_copy, capsys):
    assert main(["data", "info", str(cora_copy), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["integrity"] == "CRC-32 verified: all 10 block(s) of 7 file(s)"
    meta = json.loads((cora_copy / "meta.json").read_text())
    assert meta["checksums"]["algorithm"] == "crc32"
    feats = meta["checksums"]["files"]["features"]
    assert feats["bytes"] == (cora_copy / "features.npy").stat().st_size and len(feats["crc32"]) == 4 * 8


def test_a_dataset_from_before_checksums_still_opens_with_a_note(cora_copy, capsys):
    meta = json.loads((cora_copy / "meta.json").read_text())
    del meta["checksums"]
    (cora_copy / "meta.json").write_text(json.dumps(meta))
    for argv in (["data", "info", str(cora_copy)], ["data", "info", str(cora_copy), "--verify"]):
        assert main(argv) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "no checksums: written before Moment recorded them" in out
    assert open_dataset(cora_copy).integrity.startswith("no checksums")


def test_a_cut_or_grown_file_is_named(cora_copy, capsys):
    path = cora_copy / "features.npy"
    size = path.stat().st_size
    with open(path, "ab") as f:  # bytes appended: numpy reads the array and cannot tell
        f.write(b"\0" * 16)
    assert main(["data", "info", str(cora_copy)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {size + 16:,} bytes, but meta.json recorded {size:,}" in err, err
    with open(path, "r+b") as f:  # one byte off: only the page padding after the rows is cut
        f.truncate(size - 1)
    assert main(["data", "info", str(cora_copy)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {size - 1:,} bytes, but meta.json recorded {size:,}" in err, err
    with open(path, "r+b") as f:  # two pages off: into the rows
        f.truncate(size - 8192)
    assert main(["data", "info", str(cora_copy)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: shorter than its .npy header says (cut short)" in err, err
