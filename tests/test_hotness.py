"""training.hotness: pre-sampling counts, out-degree, reverse PageRank; saved with the dataset."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import graph_fixture
from training import sampler as sampler_mod
from training.data import open_dataset
from training.hotness import (
    HotnessError,
    HotnessSpec,
    compute_hotness,
    degree_from_csr,
    get_hotness,
    hot_share,
    load_hotness,
    pagerank_from_csr,
    save_hotness,
)
from training.importers.npz import import_npz
from training.importers.planetoid import import_planetoid


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    return open_dataset(import_planetoid(graph_fixture("cora"), tmp_path_factory.mktemp("h") / "cora"))


@pytest.fixture(scope="module")
def citations(tmp_path_factory):
    """The raw LINQS Cora citations: directed, so reversing the graph matters."""
    src = graph_fixture("cora", "cora.npz")
    return open_dataset(import_npz(src, tmp_path_factory.mktemp("h") / "cit", directed=True, split="none"))


def test_presample_counts_sum_to_the_batches_sizes(cora, monkeypatch):
    sizes = []
    real = sampler_mod.NeighborSampler.sample

    def recording(self, seeds):
        batch = real(self, seeds)
        sizes.append(batch.num_nodes)
        return batch

    monkeypatch.setattr(sampler_mod.NeighborSampler, "sample", recording)
    spec = HotnessSpec("presample", fanouts=(10, 5), batch_size=32, epochs=2, seed=3)
    seen = []
    hot = compute_hotness(cora, spec, progress=lambda stage, d, t: seen.append((stage, d, t)))
    per_epoch = -(-cora.train_idx.shape[0] // 32)  # 140 training vertices: 5 batches
    assert len(sizes) == 2 * per_epoch and seen[-1] == ("presample", 2 * per_epoch, 2 * per_epoch)
    assert hot.values.dtype == np.int64 and hot.values.shape == (cora.num_nodes,)
    assert int(hot.values.sum()) == sum(sizes)
    assert (hot.values[cora.train_idx] >= 2).all(), "every training vertex is a seed once per epoch"
    assert hot.epochs_covered == 2.0
    np.testing.assert_allclose(hot.reads_per_epoch.sum(), sum(sizes) / 2)
    # by batches instead of epochs; the same seed gives the same counts
    again = compute_hotness(cora, HotnessSpec("presample", fanouts=(10, 5), batch_size=32, epochs=2, seed=3))
    np.testing.assert_array_equal(again.values, hot.values)
    three = compute_hotness(cora, HotnessSpec("presample", fanouts=(10, 5), batch_size=32, num_batches=3))
    assert three.epochs_covered == pytest.approx(3 / per_epoch)


def test_degree_is_the_csr_s(cora, citations):
    # undirected: both directions stored, so appearances in indices = row lengths
    np.testing.assert_array_equal(compute_hotness(cora, HotnessSpec("degree")).values, cora.degree())
    # directed: how many rows list v (the neighbourhoods it can be sampled from)
    d = compute_hotness(citations, HotnessSpec("degree")).values
    np.testing.assert_array_equal(d, np.bincount(citations.indices, minlength=citations.num_nodes))
    assert not np.array_equal(d, citations.degree())
    # chunking changes nothing
    np.testing.assert_array_equal(degree_from_csr(citations.indptr, citations.indices, chunk_edges=77), d)


def test_pagerank_matches_networkx_on_the_reversed_citation_graph(citations):
    pr = compute_hotness(citations, HotnessSpec("pagerank", tol=1e-13)).values
    assert pr.dtype == np.float64 and pr.sum() == pytest.approx(1.0, abs=1e-12)
    # the message edge u -> v is stored in row v; reversed, the walk goes v -> u
    g = nx.DiGraph()
    g.add_nodes_from(range(citations.num_nodes))
    rows = np.repeat(np.arange(citations.num_nodes), citations.degree())
    g.add_edges_from(zip(rows.tolist(), np.asarray(citations.indices).tolist(), strict=True))
    ref = nx.pagerank(g, alpha=0.85, tol=1e-14, max_iter=1000)
    np.testing.assert_allclose(pr, [ref[v] for v in range(citations.num_nodes)], rtol=1e-6, atol=1e-12)
    # blocks of a few edges (rebuilt every iteration) give the same vector
    small = pagerank_from_csr(citations.indptr, citations.indices, tol=1e-13, chunk_edges=300)
    np.testing.assert_allclose(small, pr, rtol=1e-9, atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.lists(st.tuples(st.integers(0, 39), st.integers(0, 39)), max_size=150))
def test_pagerank_sums_to_one_on_any_graph(n, edges):
    rows = [[] for _ in range(n)]
    for u, v in edges:
        if u < n and v < n:
            rows[v].append(u)
    indptr = np.cumsum([0] + [len(r) for r in rows])
    indices = np.array([u for r in rows for u in r], dtype=np.int64)
    pr = pagerank_from_csr(indptr, indices, tol=1e-12, max_iter=2000)
    assert pr.sum() == pytest.approx(1.0, abs=1e-9) and (pr > 0).all()


def test_save_load_and_mismatch(cora, tmp_path):
    spec = HotnessSpec("presample", fanouts=(5,), batch_size=50)
    hot = get_hotness(cora, spec, directory=tmp_path)
    assert not hot.loaded and hot.path == tmp_path / "presample.npy"
    meta = json.loads((tmp_path / "presample.json").read_text())
    assert meta["params"] == spec.params() and meta["num_nodes"] == cora.num_nodes
    back = get_hotness(cora, spec, directory=tmp_path)
    assert back.loaded and back.epochs_covered == hot.epochs_covered
    np.testing.assert_array_equal(back.values, hot.values)
    # other parameters: not loaded, recomputed and saved over the old one
    other = HotnessSpec("presample", fanouts=(5,), batch_size=60)
    assert load_hotness(cora, other, directory=tmp_path) is None
    assert not get_hotness(cora, other, directory=tmp_path).loaded
    assert load_hotness(cora, spec, directory=tmp_path) is None
    assert load_hotness(cora, other, directory=tmp_path).loaded
    # an array without its .json (a crash between the two writes) is not trusted
    (tmp_path / "presample.json").unlink()
    assert load_hotness(cora, other, directory=tmp_path) is None


def test_saved_with_the_dataset_by_default(cora):
    hot = get_hotness(cora, HotnessSpec("degree"))
    assert hot.path == cora.path / "hotness" / "degree.npy"
    assert get_hotness(cora, HotnessSpec("degree")).loaded
    # the dataset itself still opens: the hotness folder is no dataset file
    assert open_dataset(cora.path).num_nodes == cora.num_nodes


def test_unwritable_directory_names_the_fix(cora, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    hot = compute_hotness(cora, HotnessSpec("degree"))
    with pytest.raises(HotnessError, match="cannot save the hotness.*writable `hotness_dir`"):
        save_hotness(cora, hot, directory=blocked / "sub")


def test_bad_specs_and_no_training_vertices(citations):
    with pytest.raises(HotnessError, match="'heat'"):
        HotnessSpec("heat")
    with pytest.raises(HotnessError, match="batch size 0"):
        HotnessSpec("presample", batch_size=0)
    with pytest.raises(HotnessError, match="damping"):
        HotnessSpec("pagerank", damping=1.0)
    with pytest.raises(HotnessError, match="no training vertices.*`method` degree"):
        compute_hotness(citations, HotnessSpec("presample"))
    with pytest.raises(HotnessError, match="did not converge"):
        pagerank_from_csr(citations.indptr, citations.indices, max_iter=2)


def test_hot_share():
    v = np.array([0, 4, 1, 3, 2], dtype=np.int64)
    assert hot_share(v, [1, 2]) == pytest.approx([0.4, 0.5])
    assert hot_share(v, [10]) == [1.0]
    assert hot_share(np.zeros(3), [1]) == [0.0]


@pytest.mark.parametrize("name", ["training.hotness", "training.place.bins"])
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
