"""`moment data import | info | synth --hetero` on heterogeneous layouts, end to end (hand-made, no downloads)."""

from __future__ import annotations

import json

import numpy as np

from moment.cli import main
from tests.test_hetero import tiny_igbh, tiny_mag  # noqa: F401  (fixtures)
from training.hetero.sampler import HeteroNeighborSampler
from training.hetero.store import open_hetero
from training.importers import detect_format


def _one_line_error(capsys, argv: list[str], text: str) -> None:
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert text in err and len(err.splitlines()) == 1, err


def test_ogbn_mag_layout_is_detected_imported_and_described(tiny_mag, tmp_path, capsys):  # noqa: F811
    assert detect_format(tiny_mag) == "ogb-hetero"
    dst = tmp_path / "mag"
    assert main(["data", "import", str(tiny_mag), str(dst)]) == 0
    out = capsys.readouterr().out
    assert "(ogb-hetero)" in out and "7 nodes" in out and "paper 4 (feat_paper.npy 2 × float32" in out
    hd = open_hetero(dst)
    assert ("paper", "rev_writes", "author") in hd.rel_indptr and hd.base.num_classes == 3
    assert main(["data", "info", str(dst)]) == 0
    out = capsys.readouterr().out
    for text in ("node types", "author 2 (no features)", "author -writes-> paper 4", "paper -cites-> paper 3",
                 "target type", "relations"):
        assert text in out, text
    assert main(["data", "info", str(dst), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in info["hetero"]["node_types"]] == ["author", "institution", "paper"]
    assert main(["data", "import", "--no-reverse", "--force", str(tiny_mag), str(dst)]) == 0
    assert ("paper", "rev_writes", "author") not in open_hetero(dst).rel_indptr


def test_igbh_layout_is_detected_before_igb_and_imported(tiny_igbh, tmp_path, capsys):  # noqa: F811
    assert detect_format(tiny_igbh) == "igb-hetero"
    dst = tmp_path / "igbh"
    assert main(["data", "import", "--feature-dtype", "float16", str(tiny_igbh), str(dst)]) == 0
    assert "(igb-hetero)" in capsys.readouterr().out
    hd = open_hetero(dst)
    assert [t.feature_dtype for t in hd.schema.node_types] == ["float16"] * 4
    x = np.load(tiny_igbh / "processed/author/node_feat.npy")
    assert np.array_equal(hd.features["author"], x.astype(np.float16))


def test_bad_hetero_layouts_are_one_line(tiny_mag, tiny_igbh, tmp_path, capsys):  # noqa: F811
    (tiny_mag / "raw/relations/author___writes___paper/edge.csv.gz").unlink()
    _one_line_error(capsys, ["data", "import", str(tiny_mag), str(tmp_path / "a")],
                    "author___writes___paper: edge.csv.gz is missing")
    np.save(tiny_igbh / "processed/paper__cites__paper/edge_index.npy", np.array([[0, 9]], np.int64))
    _one_line_error(capsys, ["data", "import", str(tiny_igbh), str(tmp_path / "b")],
                    "edge endpoint 9 is outside [0, 5)")
    _one_line_error(capsys, ["data", "import", "--undirected", str(tiny_igbh), str(tmp_path / "b")],
                    "--undirected does not apply to --format igb-hetero")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_synth_hetero_writes_a_mag_shaped_graph_of_the_given_size(tmp_path, capsys):
    dst = tmp_path / "s"
    assert main(["data", "synth", str(dst), "--hetero", "--edges", "15000", "--classes", "4", "--seed", "3",
                 "--chunk-edges", "2000"]) == 0
    assert "heterogeneous" in capsys.readouterr().out
    hd = open_hetero(dst)
    assert hd.schema.node_type("paper").count == 1000 and len(hd.schema.node_types) == 4
    assert 14000 < hd.base.num_edges <= 15000  # repeats and self-loops dropped
    b = HeteroNeighborSampler(hd, [5, 5], seed=0).sample("paper", np.arange(8))
    assert set(b.n_id) >= {"paper", "author", "field_of_study"}
    again = tmp_path / "t"  # the chunk size never changes the output
    assert main(["data", "synth", str(again), "--hetero", "--edges", "15000", "--classes", "4", "--seed", "3",
                 "--quiet"]) == 0
    assert (again / "indices.npy").read_bytes() == (dst / "indices.npy").read_bytes()
    _one_line_error(capsys, ["data", "synth", str(tmp_path / "u"), "--hetero", "--nodes", "5", "--edges", "100"],
                    "--nodes does not apply with --hetero")
