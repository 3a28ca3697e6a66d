"""training.synth and `moment data synth`: determinism, skew, counts, learnability, CLI."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training import draws, synth
from training.data import open_dataset
from training.synth import (
    EDGE_BLOCK,
    SynthError,
    SynthSpec,
    build_model,
    feature_rows,
    iter_edge_chunks,
    split_indices,
)
from training.synth_run import synthesize


def _edges(spec, chunk_edges):
    src, dst = zip(*iter_edge_chunks(spec, chunk_edges=chunk_edges), strict=True)
    return np.concatenate(src), np.concatenate(dst)


def _csr_rows(ds):
    return np.repeat(np.arange(ds.num_nodes), np.diff(np.asarray(ds.indptr)))


def test_docstring_examples():
    result = doctest.testmod(synth, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# --- determinism ---------------------------------------------------------------------------------


@pytest.mark.parametrize("generator", ["rmat", "chung-lu"])
def test_edge_stream_does_not_depend_on_chunk_size(generator):
    spec = SynthSpec(num_nodes=3000, num_edges=2 * EDGE_BLOCK + 1234, generator=generator, seed=5)
    src_a, dst_a = _edges(spec, chunk_edges=1)  # one block per chunk
    src_b, dst_b = _edges(spec, chunk_edges=10**7)  # everything at once
    assert src_a.size == spec.num_edges
    np.testing.assert_array_equal(src_a, src_b)
    np.testing.assert_array_equal(dst_a, dst_b)
    src_c, _ = _edges(SynthSpec(**{**spec.__dict__, "seed": 6}), chunk_edges=10**7)
    assert not np.array_equal(src_a, src_c)


def test_streams_are_the_seed_sequence_spawned_children():
    # the O(1) spawn_key shortcut must equal what SeedSequence.spawn hands out
    child = np.random.SeedSequence(42).spawn(2)[1].spawn(4)[3]
    ours = synth._rng(42, 1, 3).random(5)
    np.testing.assert_array_equal(ours, np.random.Generator(np.random.PCG64(child)).random(5))


def test_same_seed_gives_byte_identical_files_whatever_the_chunk_sizes(tmp_path):
    spec = SynthSpec(num_nodes=4000, num_edges=EDGE_BLOCK + 5000, feature_dim=6,
                     feature_dtype="float16", undirected=True, seed=11)
    # the same directory name under two parents, so that meta.json's name agrees too
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = synthesize(tmp_path / "a" / "g", spec, chunk_edges=1000, feature_chunk_bytes=100)
    b = synthesize(tmp_path / "b" / "g", spec, chunk_edges=10**7)
    assert {**a.__dict__, "path": None} == {**b.__dict__, "path": None}
    names = sorted(p.name for p in (tmp_path / "a" / "g").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b" / "g").iterdir())
    assert {"meta.json", "indptr.npy", "indices.npy", "features.npy", "labels.npy"} <= set(names)
    for name in names:
        assert (tmp_path / "a" / "g" / name).read_bytes() == (tmp_path / "b" / "g" / name).read_bytes(), name


@settings(max_examples=25, deadline=None)
@given(start=st.integers(0, 9000), length=st.integers(0, 3000), dim=st.integers(0, 5))
def test_feature_rows_are_slices_of_one_matrix(start, length, dim):
    spec = SynthSpec(num_nodes=9000, num_edges=10, feature_dim=dim, seed=2)
    model = _model(spec)
    stop = min(spec.num_nodes, start + length)
    whole = _whole_features(spec)
    np.testing.assert_array_equal(feature_rows(spec, model, start, stop), whole[start:stop])


_MODELS: dict = {}


def _model(spec):
    if spec not in _MODELS:
        _MODELS[spec] = build_model(spec)
    return _MODELS[spec]


def _whole_features(spec):
    key = ("x", spec)
    if key not in _MODELS:
        _MODELS[key] = feature_rows(spec, _model(spec), 0, spec.num_nodes)
    return _MODELS[key]


# --- skew ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("generator,skews", [("rmat", (0.3, 0.5, 0.65)), ("chung-lu", (0.2, 0.6, 1.0))])
def test_degree_skew_grows_with_the_knob(tmp_path, generator, skews):
    shares = []
    for s in skews:
        rep = synthesize(tmp_path / f"{generator}-{s}", SynthSpec(
            num_nodes=20_000, num_edges=100_000, generator=generator, skew=s, feature_dim=0, seed=1))
        shares.append(rep.top1pct_out_share)
        meta = json.loads((tmp_path / f"{generator}-{s}" / "meta.json").read_text())
        assert meta["source"]["parameters"]["skew"] == s
        assert meta["source"]["stored"]["top1pct_out_share"] == rep.top1pct_out_share
    assert shares == sorted(shares) and shares[-1] > 2 * shares[0], shares
    assert shares[0] > 0.01  # the top 1% always holds at least its own share


# --- counts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("undirected", [False, True])
def test_counts_and_what_is_dropped(tmp_path, undirected):
    spec = SynthSpec(num_nodes=10_000, num_edges=40_000, generator="chung-lu", feature_dim=3,
                     undirected=undirected, seed=4)
    rep = synthesize(tmp_path / "g", spec)
    ds = open_dataset(tmp_path / "g")
    generated = spec.num_edges * (2 if undirected else 1)
    assert ds.num_nodes == spec.num_nodes and rep.generated_edges == generated
    # self-loops and repeats are dropped: a few percent at this density, never more edges
    assert 0.9 * generated <= ds.num_edges <= generated
    rows, cols = _csr_rows(ds), np.asarray(ds.indices)
    assert not (rows == cols).any()
    key = rows * ds.num_nodes + cols
    assert np.unique(key).size == key.size
    assert ds.directed is (not undirected)
    if undirected:
        np.testing.assert_array_equal(np.sort(key), np.sort(cols * ds.num_nodes + rows))
    assert ds.meta["source"]["stored"]["dropped_self_loops_and_duplicates"] == generated - ds.num_edges


def test_splits_are_disjoint_sorted_and_sized():
    spec = SynthSpec(num_nodes=5000, num_edges=10, train_share=0.01, valid_share=0.05, test_share=0.1)
    s = split_indices(spec)
    assert [s[k].size for k in ("train", "valid", "test")] == [50, 250, 500]
    both = np.concatenate(list(s.values()))
    assert np.unique(both).size == both.size
    assert all((np.diff(v) > 0).all() for v in s.values())
    assert all(np.array_equal(s[k], split_indices(spec)[k]) for k in s)


# --- learnability ----------------------------------------------------------------------------------


def _nearest_centroid_accuracy(x, y, classes):
    centroids = np.stack([x[y == c].mean(0) for c in range(classes)])
    guess = np.argmin(((x[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    return float((guess == y).mean())


def test_labels_follow_features_and_neighbours(tmp_path):
    spec = SynthSpec(num_nodes=4000, num_edges=40_000, feature_dim=16, num_classes=8, seed=3)
    synthesize(tmp_path / "g", spec)
    ds = open_dataset(tmp_path / "g")
    x, y = np.asarray(ds.features, dtype=np.float64), np.asarray(ds.labels)
    chance = 1 / spec.num_classes
    alone = _nearest_centroid_accuracy(x, y, spec.num_classes)
    assert 3 * chance < alone < 0.95  # features help, but not all the way
    rows, cols = _csr_rows(ds), np.asarray(ds.indices)
    agreement = float((y[rows] == y[cols]).mean())
    assert agreement > 4 * chance
    # one round of mean aggregation (what a GNN layer does) beats the features alone
    summed = np.zeros_like(x)
    np.add.at(summed, rows, x[cols])
    mean = (x + summed) / (1 + np.diff(np.asarray(ds.indptr)))[:, None]
    assert _nearest_centroid_accuracy(mean, y, spec.num_classes) > alone + 0.05


def test_homophily_zero_gives_chance_agreement():
    spec = SynthSpec(num_nodes=4000, num_edges=40_000, num_classes=8, homophily=0.0, seed=3)
    src, dst = _edges(spec, chunk_edges=10**6)
    labels = _model(spec).labels
    assert abs(float((labels[src] == labels[dst]).mean()) - 1 / 8) < 0.03


# --- validation and the command line ----------------------------------------------------------------


@pytest.mark.parametrize("kwargs,option", [
    (dict(num_nodes=-3), "`num_nodes`"),
    (dict(num_edges=0), "`num_edges`"),
    (dict(num_nodes=10, num_edges=91), "`num_edges`"),
    (dict(generator="erdos"), "`generator`"),
    (dict(skew=1.5), "`skew`"),
    (dict(generator="chung-lu", skew=-1), "`skew`"),
    (dict(feature_dtype="int8"), "`feature_dtype`"),
    (dict(train_share=0.6, valid_share=0.3, test_share=0.2), "`train_share`"),
])
def test_bad_specs_name_the_field(kwargs, option):
    with pytest.raises(SynthError, match=option):
        SynthSpec(**{"num_nodes": 100, "num_edges": 200, **kwargs}).validate()


def _moment(capsys, *argv):
    """Run the real command line in-process; (exit status, stdout, stderr)."""
    from moment.cli import main

    status = main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_cli_end_to_end(tmp_path, capsys):
    dst = tmp_path / "synthetic"
    status, out, err = _moment(capsys, "data", "synth", str(dst), "--nodes", "2e3", "--edges", "10**4",
                   "--generator", "chung-lu", "--skew", "0.8", "--feature-dim", "5",
                   "--feature-dtype", "float16", "--classes", "4", "--train-share", "0.05",
                   "--seed", "9", "--undirected")
    assert status == 0, err
    assert "2,000 nodes" in out
    ds = open_dataset(dst)
    assert ds.num_nodes == 2000 and ds.features.dtype == np.float16 and ds.features.shape == (2000, 5)
    assert ds.num_classes == 4 and ds.train_idx.size == 100 and not ds.directed
    src = ds.meta["source"]
    assert (src["generator"], src["seed"], src["parameters"]["skew"]) == ("chung-lu", 9, 0.8)
    # refuses to overwrite without --force, in one line
    status, _, err = _moment(capsys, "data", "synth", str(dst), "--nodes", "2e3", "--edges", "10**4")
    assert status == 2 and "--force" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["--nodes", "-10", "--edges", "5"], "--nodes"),
    (["--nodes", "100", "--edges", "-5"], "--edges"),
    (["--nodes", "4", "--edges", "13"], "at most 12 directed edges"),
    (["--nodes", "100", "--edges", "50", "--generator", "kronecker"], "--generator"),
    (["--nodes", "ten", "--edges", "50"], "--nodes"),
])
def test_cli_bad_options_exit_2_with_one_line(tmp_path, capsys, args, needle):
    status, _, err = _moment(capsys, "data", "synth", str(tmp_path / "x"), *args)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err
    assert not (tmp_path / "x").exists()


# --- memory -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ten_million_edges_stream_in_bounded_memory(tmp_path):
    # a fresh interpreter, so that the peak RSS is this run's alone
    code = (
        "import resource, sys\n"
        "from training.synth import SynthSpec\n"
        "from training.synth_run import synthesize\n"
        "spec = SynthSpec(num_nodes=10**6, num_edges=10**7, feature_dim=16, seed=1)\n"
        "r = synthesize(sys.argv[1], spec, chunk_edges=1 << 20)\n"
        "print(r.num_edges, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "big")],
                          capture_output=True, text=True, check=True)
    edges, peak_kib = map(int, proc.stdout.split())
    assert edges > 0.8 * 10**7
    # int32 indices alone are 40 MB and the edges as int64 pairs 160 MB; the whole run
    # must stay far below holding them all (and 10x below "a few GB")
    assert peak_kib * 1024 < 600 * 2**20, f"peak RSS {peak_kib / 1024:.0f} MiB"
    assert Path(tmp_path / "big" / "meta.json").exists()


@settings(max_examples=40, deadline=None)
@given(weights=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=300)
       .filter(lambda w: sum(w) > 0),
       probes=st.lists(st.floats(0, 1), min_size=1, max_size=200))
def test_guided_lookup_equals_searchsorted(weights, probes):
    cum = np.cumsum(np.asarray(weights))
    values = np.asarray(probes) * cum[-1]
    expected = np.minimum(np.searchsorted(cum, values, side="right"), cum.size - 1)
    np.testing.assert_array_equal(draws.locate(cum, draws.guide(cum), values), expected)


def test_popcount_fallback_for_numpy_1(monkeypatch):
    x = np.random.default_rng(0).integers(0, 2**62, 1000)
    expected = np.array([bin(int(v)).count("1") for v in x])
    np.testing.assert_array_equal(draws.popcount(x), expected)
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    np.testing.assert_array_equal(draws.popcount(x), expected)


@pytest.mark.parametrize("num_nodes", [1024, 1000])  # a power of two, and cells folded onto nodes
def test_rmat_destinations_follow_the_rmat_marginal(num_nodes):
    # without homophily every destination is a plain R-MAT draw: a chi-square test against
    # the closed-form marginal the homophilous redraws also use
    spec = SynthSpec(num_nodes=num_nodes, num_edges=2**18, homophily=0.0, seed=8)
    model = _model(spec)
    _, dst = _edges(spec, chunk_edges=10**7)
    raw = np.argsort(model.relabel)[dst]
    expected = draws.rmat_destination_weights(num_nodes, draws.rmat_probabilities(0.57)) * dst.size
    chi2 = float(((np.bincount(raw, minlength=num_nodes) - expected) ** 2 / expected).sum())
    dof = num_nodes - 1
    assert chi2 < dof + 6 * np.sqrt(2 * dof), chi2


def test_report_counts_isolated_nodes(tmp_path):
    rep = synthesize(tmp_path / "g", SynthSpec(num_nodes=5000, num_edges=5000, feature_dim=0, seed=2))
    ds = open_dataset(tmp_path / "g")
    touched = np.zeros(ds.num_nodes, dtype=bool)
    touched[np.asarray(ds.indices)] = True
    touched[np.diff(np.asarray(ds.indptr)) > 0] = True
    assert rep.isolated_nodes == int((~touched).sum()) > 0
    assert ds.meta["source"]["stored"]["isolated_nodes"] == rep.isolated_nodes
