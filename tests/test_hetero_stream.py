"""The streamed heterogeneous writer: the in-memory writer's directory, byte for byte, from edge chunks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training.data import DatasetError
from training.hetero.graph import HeteroGraph, add_reverse
from training.hetero.store import FeatureBlocks, open_hetero, write_hetero
from training.hetero.stream import HeteroSource, array_chunks, to_graph, write_hetero_stream
from training.hetero.synth import EDGES_PER_PAPER, synth_mag, synth_mag_stream


def _source(g: HeteroGraph, chunk: int) -> HeteroSource:
    return HeteroSource(g.num_nodes, {k: array_chunks(np.asarray(e), chunk) for k, e in g.edges.items()},
                        g.features, g.target, g.labels, g.num_classes, g.splits)


def _same_bytes(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@st.composite
def graphs(draw) -> HeteroGraph:
    counts = {t: draw(st.integers(1, 12)) for t in ("a", "b", "c")[:draw(st.integers(1, 3))]}
    types = list(counts)
    edges = {}
    for i in range(draw(st.integers(1, 4))):
        s, d = draw(st.sampled_from(types)), draw(st.sampled_from(types))
        m = draw(st.integers(0, 40))
        src = draw(st.lists(st.integers(0, counts[s] - 1), min_size=m, max_size=m))
        dst = draw(st.lists(st.integers(0, counts[d] - 1), min_size=m, max_size=m))
        edges[(s, f"r{i}", d)] = np.array([src, dst], dtype=np.int64).reshape(2, m)
    feats = {}
    for t in types:
        if draw(st.booleans()):
            dt = draw(st.sampled_from(["float32", "float16", "uint8"]))
            feats[t] = (np.arange(counts[t] * 3) % 7).astype(dt).reshape(counts[t], 3)
    tgt = types[0]
    labels = np.arange(counts[tgt]) % 3
    splits = {"train_idx": np.arange(0, counts[tgt], 2)}
    return HeteroGraph(counts, edges, feats, tgt, labels.astype(np.int64), 3, splits)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(g=graphs(), chunk=st.integers(1, 50), rev=st.booleans())
def test_streamed_equals_in_memory_byte_for_byte(tmp_path_factory, g, chunk, rev):
    g = add_reverse(g) if rev else g
    d = tmp_path_factory.mktemp("s")
    ref = write_hetero(d / "mem", g, name="g", source={"x": 1})
    got = write_hetero_stream(d / "str", _source(g, chunk), name="g", meta_source={"x": 1}, chunk_edges=chunk)
    _same_bytes(ref, got)
    open_hetero(got)


def test_synth_mag_with_feature_blocks_equals_in_memory(tmp_path):
    g = add_reverse(synth_mag(papers=300))
    x = g.features["paper"]
    blocks = FeatureBlocks(x.shape[1], "float32", lambda: (x[a:a + 7] for a in range(0, 300, 7)))
    feats = {**g.features, "paper": blocks}
    src = HeteroSource(g.num_nodes, _source(g, 64).edges, feats, g.target, g.labels, g.num_classes, g.splits)
    _same_bytes(write_hetero(tmp_path / "a", g, name="m"), write_hetero_stream(tmp_path / "b", src, name="m",
                                                                                chunk_edges=100))


def test_bad_edges_and_features_are_one_line_and_nothing_is_written(tmp_path):
    g = synth_mag(papers=50)
    bad = dict(g.edges)
    bad[("author", "writes", "paper")] = np.array([[0, 1], [0, 50]])
    with pytest.raises(DatasetError, match="edge endpoint 50 is outside \\[0, 50\\)"):
        write_hetero_stream(tmp_path / "x", _source(HeteroGraph(g.num_nodes, bad, g.features, g.target, g.labels,
                                                                 g.num_classes, g.splits), 10))
    short = {**g.features, "paper": g.features["paper"][:10]}
    with pytest.raises(DatasetError, match="10 rows for 50 nodes"):
        write_hetero_stream(tmp_path / "x", HeteroSource(g.num_nodes, _source(g, 10).edges, short, g.target))
    with pytest.raises(DatasetError, match="relation 'bad/name'"):
        write_hetero_stream(tmp_path / "x", HeteroSource(g.num_nodes, {("paper", "bad/name", "paper"):
                                                                       array_chunks(np.zeros((2, 0), int))}))
    assert not (tmp_path / "x").exists()


def test_streamed_synth_mag_equals_its_in_memory_write(tmp_path):
    src = synth_mag_stream(papers=500, block_nodes=64)
    g = to_graph(src)
    assert sum(e.shape[1] for e in g.edges.values()) == EDGES_PER_PAPER * 500
    _same_bytes(write_hetero(tmp_path / "a", g, name="m"),
                write_hetero_stream(tmp_path / "b", src, name="m", chunk_edges=300))
    hd = open_hetero(tmp_path / "b")
    assert {t.name: t.feature_dtype for t in hd.schema.node_types} == {
        "paper": "float32", "author": "float16", "institution": "uint8", "field_of_study": None}
    # homophily: most citations stay inside the cited paper's class
    ip, ix = hd.rel_indptr[("paper", "cites", "paper")], hd.rel_indices[("paper", "cites", "paper")]
    y = hd.labels_of("paper")
    assert (y[np.repeat(np.arange(500), np.diff(ip))] == y[ix]).mean() > 0.7
