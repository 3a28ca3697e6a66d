"""``moment place --in-place``: the dataset's features.npy is the SSD bin, read where it is (issue 16)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.bins import PAGE, in_place_shift, open_bin
from iostack.errors import StoreError
from iostack.placement import load_placement
from iostack.store import FeatureStore
from moment.cli import main
from training.data import open_dataset, open_paged_npy
from training.synth import SynthSpec
from training.synth_run import synthesize


def _one_ssd_spec() -> str:
    """The one-NVMe machine spec the out-of-core benchmark places for (tools/bench_outofcore.py)."""
    import importlib.util
    import sys

    from tests.conftest import REPO

    sys.path.insert(0, str(REPO / "tools"))  # for its sibling import of _results
    spec = importlib.util.spec_from_file_location("bench_outofcore", REPO / "tools" / "bench_outofcore.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ONE_SSD


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 40), st.sampled_from([1, 3, 128, 256, 512, 1024, 2048, 3000]),
       st.sampled_from(["float32", "float16", "uint8"]))
def test_paged_npy_is_an_ordinary_npy_with_page_aligned_rows(tmp_path_factory, rows, dim, dtype):
    path = tmp_path_factory.mktemp("n") / "f.npy"
    want = (np.arange(rows * dim) % 251).astype(dtype).reshape(rows, dim)
    m = open_paged_npy(path, np.dtype(dtype), (rows, dim))
    m[:] = want
    m.flush()
    del m
    got = np.load(path, mmap_mode="r")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.load(path), want)
    assert got.offset % PAGE == 0 and os.path.getsize(path) % PAGE == 0
    row_bytes = dim * np.dtype(dtype).itemsize
    if row_bytes % PAGE == 0 or PAGE % row_bytes == 0:  # a bin lays such rows out as the file does
        assert in_place_shift(path) * row_bytes == got.offset
    else:
        with pytest.raises(StoreError, match="a bin would pad them"):
            in_place_shift(path)


def test_a_plain_npy_is_refused_with_the_fix(tmp_path):
    np.save(tmp_path / "f.npy", np.zeros((10, 1024), np.float32))  # a 128-byte header
    with pytest.raises(StoreError, match="not on a page and row boundary.*without `in_place`"):
        in_place_shift(tmp_path / "f.npy")


@pytest.fixture(scope="module", params=[1024, 128], ids=["4KiB-rows", "512B-rows"])
def graph(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("g")
    synthesize(d / "g", SynthSpec(num_nodes=3000, num_edges=30000, generator="chung-lu",
                                  feature_dim=request.param, train_share=0.1, seed=2))
    (d / "one-ssd.yaml").write_text(_one_ssd_spec())
    return d


def _place(graph, out, *extra):
    return main(["place", "--dataset", str(graph / "g"), "--machine", str(graph / "one-ssd.yaml"),
                 "--gpu-cache", "0", "--cpu-cache", "256KiB", "--ssd", str(graph / "ssd"), "--in-place",
                 "--fanouts", "5,5", "--batch-size", "64", "--out", str(out), *extra])


def test_in_place_placement_reads_the_dataset_file_and_trains(graph, capsys):
    out = graph / "pl"
    assert _place(graph, out, "--force") == 0
    capsys.readouterr()
    ds = open_dataset(graph / "g")
    p = load_placement(out)
    ssd = [b for b in p.bins if b.kind == "ssd"]
    assert len(ssd) == 1 and [b.kind for b in p.bins] == ["cpu", "ssd"]
    # no copy: the bin is a link to the dataset's own file, and the SSD directory holds nothing else
    link = graph / "ssd" / os.path.basename(ssd[0].path)
    assert link.is_symlink() and os.path.realpath(link) == os.path.realpath(graph / "g" / "features.npy")
    assert sorted(f.name for f in (graph / "ssd").iterdir()) == sorted([link.name, link.name + ".json"])
    # the cache still holds DDAK's hottest rows, the SSD rows are the vertices' own
    on_ssd = np.flatnonzero(p.bin_of == ssd[0].id)
    assert 0 < on_ssd.size < ds.num_nodes
    shift = in_place_shift(graph / "g" / "features.npy")
    np.testing.assert_array_equal(p.row_of[on_ssd], on_ssd + shift)
    with FeatureStore(p, out, features=ds.features, backend_options={"processes": 0}) as store:
        ids = torch.randperm(ds.num_nodes, generator=torch.Generator().manual_seed(0))
        np.testing.assert_array_equal(store.gather(ids).numpy(), np.asarray(ds.features)[ids.numpy()])
        assert store.tier_stats()["ssd"]["rows"] == on_ssd.size
    assert main(["train", "--dataset", str(graph / "g"), "--placement", str(out), "--epochs", "1",
                 "--fanouts", "5,5", "--batch-size", "64", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)["epochs"][-1]
    assert rec["tiers"]["ssd"]["rows"] > 0


def test_changed_features_make_the_bin_refused(graph, tmp_path):
    out = graph / "pl2"
    assert _place(graph, out, "--force") == 0
    p = load_placement(out)
    ssd = next(b for b in p.bins if b.kind == "ssd")
    open_bin(out, ssd, full_check=True)  # as placed: whole-file CRC matches
    f = graph / "g" / "features.npy"
    data = np.load(f, mmap_mode="r+")
    keep = np.array(data[0])
    data[0] = keep + 1
    data.flush()
    try:
        with pytest.raises(StoreError, match="does not match its manifest"):
            open_bin(out, ssd)
    finally:
        data[0] = keep
        data.flush()


def test_in_place_needs_one_ssd_and_no_codec(graph, tmp_path, capsys):
    args = ["place", "--dataset", str(graph / "g"), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache", "0",
            *[a for _ in range(8) for a in ("--ssd", str(tmp_path / "s"))], "--in-place", "--hotness", "degree",
            "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "8 SSDs" in err[0] and "--in-place" in err[0]
    assert _place(graph, tmp_path / "o2", "--feature-dtype", "float16") == 2
    assert "--feature-dtype" in capsys.readouterr().err


def test_bench_outofcore_smoke(tmp_path):
    # the benchmark's default (tiny) size end to end: every phase runs, every figure is written
    import subprocess
    import sys

    from tests.conftest import REPO

    out = tmp_path / "ooc.json"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_outofcore.py"), "--dir", str(tmp_path / "w"),
                           "--steps", "4", "--replay-batches", "2", "--profile-seconds", "0.5", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = {f["figure"].split(": ", 1)[1]: f for f in json.loads(out.read_text())["figures"]}
    assert figures["train peak RSS"]["ours"] > 0 and figures["generate time"]["ours"] > 0
    assert figures["SSD read rate, training's stream vs moment profile"]["reference"] > 0
    assert "written once" in proc.stdout and not (tmp_path / "w" / "g").exists()  # removed without --keep
