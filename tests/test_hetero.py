"""Heterogeneous datasets: write/open round trip, validation, and the typed sampler's semantics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.data import DatasetError, open_dataset
from training.hetero.graph import HeteroGraph, add_reverse
from training.hetero.sampler import HeteroNeighborSampler
from training.hetero.schema import HeteroSchema
from training.hetero.store import open_hetero, write_hetero
from training.hetero.synth import synth_mag
from training.sampler import SamplerError


@pytest.fixture(scope="module")
def mag(tmp_path_factory):
    g = add_reverse(synth_mag())
    path = write_hetero(tmp_path_factory.mktemp("h") / "mag", g)
    return g, open_hetero(path)


def _pairs(edges: np.ndarray, same: bool) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in edges.T if not (same and a == b)}


def test_round_trip_keeps_every_relation_feature_and_label(mag):
    g, hd = mag
    assert [t.name for t in hd.schema.node_types] == ["paper", "author", "institution", "field_of_study"]
    assert len(hd.schema.node_types) >= 3
    for k, e in g.edges.items():
        ip, ix = hd.rel_indptr[k], hd.rel_indices[k]
        dst = np.repeat(np.arange(len(ip) - 1), np.diff(ip))
        assert _pairs(np.stack([ix, dst]), False) == _pairs(e, k[0] == k[2])
    for t, x in g.features.items():
        assert hd.features[t].dtype == x.dtype and np.array_equal(hd.features[t], x)
    assert {str(x.dtype) for x in hd.features.values()} == {"float32", "float16", "uint8"}
    assert np.array_equal(hd.labels_of("paper"), g.labels)
    assert np.array_equal(hd.split("train_idx"), g.splits["train_idx"])
    assert (hd.labels_of("author") == -1).all()


def test_union_csr_is_every_relation_in_global_ids_with_its_type(mag):
    _, hd = mag
    ds, off = hd.base, {t.name: t.offset for t in hd.schema.node_types}
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(ds.indptr))
    got = sorted(zip(dst.tolist(), np.asarray(ds.indices).tolist(), hd.edge_type.tolist(), strict=True))
    want = []
    for i, rel in enumerate(hd.schema.relations):
        ip, ix = hd.rel_indptr[rel.key], hd.rel_indices[rel.key]
        d = np.repeat(np.arange(len(ip) - 1), np.diff(ip)) + off[rel.dst]
        want += zip(d.tolist(), (np.asarray(ix) + off[rel.src]).tolist(), [i] * len(ix), strict=True)
    assert got == sorted(want)
    assert open_dataset(ds.path).num_edges == hd.schema.num_edges


def test_a_homogeneous_dataset_is_refused_in_one_line(tmp_path):
    from training.writer import DatasetWriter
    with DatasetWriter(tmp_path / "plain", num_nodes=3) as w:
        w.write_edges(np.array([[0, 1], [1, 2]]))
    with pytest.raises(DatasetError, match="not a heterogeneous dataset"):
        open_hetero(tmp_path / "plain")


def test_a_relation_csr_out_of_range_is_named(tmp_path):
    g = synth_mag(papers=30, authors=10, institutions=3, fields=4)
    path = write_hetero(tmp_path / "m", g)
    f = path / "rel_author__writes__paper_indices.npy"
    arr = np.load(f)
    arr[0] = 999
    np.save(f, arr)
    with pytest.raises(DatasetError, match=r"rel_author__writes__paper_indices\.npy: author id at position 0"):
        open_hetero(path, verify="none")


def test_a_split_outside_the_target_type_is_named(tmp_path):
    g = synth_mag(papers=30, authors=10, institutions=3, fields=4)
    bad = HeteroGraph(g.num_nodes, g.edges, g.features, g.target, g.labels, g.num_classes,
                      {**g.splits, "test_idx": np.array([29, 30])})  # 30 is the first author
    with pytest.raises(DatasetError, match="test_idx: a paper id is outside"):
        write_hetero(tmp_path / "m", bad)
    assert not (tmp_path / "m").exists()
    path = write_hetero(tmp_path / "m", g)
    test = np.load(path / "test_idx.npy")
    test[1] = 30  # global id 30: the first author
    np.save(path / "test_idx.npy", test)
    with pytest.raises(DatasetError, match=r"test_idx\.npy: node id \(of the target type 'paper'\) at position 1"):
        open_hetero(path, verify="none")


def test_schema_errors_name_the_problem():
    ok = {"node_types": [{"name": "a", "offset": 0, "count": 2}, {"name": "b", "offset": 2, "count": 1}],
          "relations": [{"src": "a", "rel": "r", "dst": "b", "num_edges": 1}], "target": "a"}
    assert HeteroSchema.from_json(ok, "m").num_nodes == 3
    gap = json.loads(json.dumps(ok))
    gap["node_types"][1]["offset"] = 3
    with pytest.raises(DatasetError, match="contiguous"):
        HeteroSchema.from_json(gap, "m")
    bad = json.loads(json.dumps(ok))
    bad["relations"][0]["dst"] = "c"
    with pytest.raises(DatasetError, match="names node type 'c'"):
        HeteroSchema.from_json(bad, "m")
    with pytest.raises(DatasetError, match="file name"):
        HeteroSchema.from_json({**ok, "node_types": [{"name": "a/b", "offset": 0, "count": 3}]}, "m")


def test_graph_with_an_id_out_of_range_is_refused(tmp_path):
    g = HeteroGraph({"a": 2, "b": 2}, {("a", "r", "b"): np.array([[0], [5]])})
    with pytest.raises(DatasetError, match="b id is outside"):
        write_hetero(tmp_path / "x", g)
    assert not (tmp_path / "x").exists()


def test_sampler_batch_layout_and_fanout_limits(mag):
    _, hd = mag
    s = HeteroNeighborSampler(hd, [3, 2], seed=0)
    seeds = torch.tensor([5, 1, 9])
    b = s.sample("paper", seeds)
    assert b.n_id["paper"][:3].tolist() == [5, 1, 9] and b.batch_size == 3
    for t, ids in b.n_id.items():
        assert ids.unique().numel() == ids.numel()
        assert sum(b.num_sampled_nodes[t]) == ids.numel()
    for k, ei in b.edge_index.items():
        src, _, dst = k
        ip, ix = hd.rel_indptr[k], hd.rel_indices[k]
        for r, c in ei.T.tolist():
            u, v = int(b.n_id[src][r]), int(b.n_id[dst][c])
            assert u in ix[ip[v]:ip[v + 1]]
        per_dst = torch.bincount(ei[1], minlength=b.n_id[dst].numel())
        assert per_dst.numel() == 0 or int(per_dst.max()) <= 3
        if dst == "paper":  # the seeds, sampled at hop 0: min(degree, 3) each
            deg = torch.as_tensor(np.diff(ip))[seeds]
            assert per_dst[:3].tolist() == deg.clamp(max=3).tolist()
    again = HeteroNeighborSampler(hd, [3, 2], seed=0).sample("paper", seeds)
    assert all(torch.equal(again.edge_index[k], b.edge_index[k]) for k in b.edge_index)


def test_sampler_refuses_bad_seeds(mag):
    s = HeteroNeighborSampler(mag[1], [2])
    with pytest.raises(SamplerError, match="seed_type"):
        s.sample("venue", [0])
    with pytest.raises(SamplerError, match="repeat"):
        s.sample("paper", [1, 1])
    with pytest.raises(SamplerError, match="gives no fan-out"):
        HeteroNeighborSampler(mag[1], {("author", "writes", "paper"): [2]})


def _closure(hd, seed_type, seeds, hops):
    """Typed k-hop in-neighbourhood by brute force: PyG's node sets with fan-out -1."""
    have = {t.name: set() for t in hd.schema.node_types}
    have[seed_type] = set(seeds)
    frontier = {t: set(v) for t, v in have.items()}
    for _ in range(hops):
        nxt = {t: set() for t in have}
        for (src, r, dst) in hd.schema.keys():  # noqa: SIM118 (a method, not a dict)
            ip, ix = hd.rel_indptr[(src, r, dst)], hd.rel_indices[(src, r, dst)]
            for v in frontier[dst]:
                for u in ix[ip[v]:ip[v + 1]].tolist():
                    if u not in have[src]:
                        nxt[src].add(u)
        for t in have:
            have[t] |= nxt[t]
        frontier = nxt
    return have


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), hops=st.integers(1, 3), k=st.integers(1, 6))
def test_full_fanout_reaches_exactly_the_typed_closure(tmp_path_factory, seed, hops, k):
    g = add_reverse(synth_mag(papers=40, authors=15, institutions=4, fields=5, seed=seed))
    hd = open_hetero(write_hetero(tmp_path_factory.mktemp("c") / "g", g))
    seeds = np.random.default_rng(seed).choice(40, size=k, replace=False).tolist()
    b = HeteroNeighborSampler(hd, [-1] * hops, seed=seed).sample("paper", seeds)
    want = _closure(hd, "paper", seeds, hops)
    assert {t: set(v.tolist()) for t, v in b.n_id.items()} == want


def _gz(path, text):
    import gzip
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


@pytest.fixture
def tiny_mag(tmp_path):
    """A hand-made ogbn-mag raw directory: 4 papers (2-wide features, labels), 2 authors, 1 institution."""
    raw = tmp_path / "ogbn_mag" / "raw"
    _gz(raw / "num-node-dict.csv.gz", "author,institution,paper\n2,1,4\n")
    _gz(raw / "triplet-type-list.csv.gz",
        "author,affiliated_with,institution\nauthor,writes,paper\npaper,cites,paper\n")
    _gz(raw / "relations/author___affiliated_with___institution/edge.csv.gz", "0,0\n1,0\n")
    _gz(raw / "relations/author___writes___paper/edge.csv.gz", "0,0\n0,1\n1,2\n1,3\n")
    _gz(raw / "relations/paper___cites___paper/edge.csv.gz", "0,1\n1,2\n2,2\n3,0\n3,0\n")
    _gz(raw / "node-feat/paper/node-feat.csv.gz", "0.5,1\n1.5,2\n2.5,3\n3.5,4\n")
    _gz(raw / "nodetype-has-label.csv.gz", "author,institution,paper\nFalse,False,True\n")
    _gz(raw / "node-label/paper/node-label.csv.gz", "1\n0\n2\n1\n")
    split = tmp_path / "ogbn_mag" / "split" / "time" / "paper"
    _gz(split / "train.csv.gz", "0\n1\n")
    _gz(split / "valid.csv.gz", "2\n")
    _gz(split / "test.csv.gz", "3\n")
    return tmp_path / "ogbn_mag"


def test_ogb_mag_layout_imports_every_relation_and_the_paper_labels(tiny_mag, tmp_path):
    from training.hetero.mag import import_ogb_hetero
    hd = open_hetero(import_ogb_hetero(tiny_mag, tmp_path / "out"))
    assert [(t.name, t.offset, t.count) for t in hd.schema.node_types] == [
        ("author", 0, 2), ("institution", 2, 1), ("paper", 3, 4)]
    assert hd.schema.target == "paper"
    writes = ("author", "writes", "paper")
    assert hd.rel_indptr[writes].tolist() == [0, 1, 2, 3, 4] and hd.rel_indices[writes].tolist() == [0, 0, 1, 1]
    cites = ("paper", "cites", "paper")  # 2->2 (a self-loop) and the repeated 3->0 dropped
    assert hd.rel_indptr[cites].tolist() == [0, 1, 2, 3, 3] and hd.rel_indices[cites].tolist() == [3, 0, 1]
    rev = ("paper", "rev_writes", "author")
    assert hd.rel_indptr[rev].tolist() == [0, 2, 4] and hd.rel_indices[rev].tolist() == [0, 1, 2, 3]
    assert ("paper", "rev_cites", "paper") not in hd.rel_indptr
    assert hd.features["paper"].tolist() == [[0.5, 1], [1.5, 2], [2.5, 3], [3.5, 4]] and set(hd.features) == {"paper"}
    assert hd.labels_of("paper").tolist() == [1, 0, 2, 1] and hd.base.num_classes == 3
    assert hd.split("train_idx").tolist() == [0, 1] and hd.split("test_idx").tolist() == [3]
    b = HeteroNeighborSampler(hd, [-1], seed=0).sample("paper", [0])
    assert b.n_id["author"].tolist() == [0] and sorted(b.n_id["paper"].tolist()) == [0, 3]


def test_ogb_mag_layout_with_a_missing_edge_file_is_one_line(tiny_mag, tmp_path):
    from training.hetero.mag import import_ogb_hetero
    (tiny_mag / "raw/relations/paper___cites___paper/edge.csv.gz").unlink()
    with pytest.raises(DatasetError, match="paper___cites___paper: edge.csv.gz is missing"):
        import_ogb_hetero(tiny_mag, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["sage", "rgcn"])
def test_hetero_models_learn_the_synthetic_labels(mag, kind):
    from training.hetero.model import accuracy, build_model, train_epoch
    _, hd = mag
    torch.manual_seed(0)
    sampler = HeteroNeighborSampler(hd, [5, 5], seed=0)
    model = build_model(hd, sampler, kind=kind, hidden=32)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    before = accuracy(model, hd, sampler, "valid_idx")
    losses = [train_epoch(model, opt, hd, sampler, batch_size=64, seed=e) for e in range(5)]
    after = accuracy(model, hd, sampler, "valid_idx")
    assert losses[-1] < losses[0] / 4
    assert after > 0.8 > before  # 4 classes: chance is 0.25


@pytest.fixture
def tiny_igbh(tmp_path):
    """A hand-made IGBH ``processed`` directory: 5 papers, 3 authors, 2 institutes, 2 fos (1024-wide features)."""
    proc = tmp_path / "tiny" / "processed"
    rng = np.random.default_rng(0)
    for t, n in (("paper", 5), ("author", 3), ("institute", 2), ("fos", 2)):
        (proc / t).mkdir(parents=True)
        np.save(proc / t / "node_feat.npy", rng.normal(size=(n, 1024)).astype(np.float32))
    np.save(proc / "paper" / "node_label_19.npy", np.array([0, 3, 18, np.nan, 2], dtype=np.float32))
    for name, e in (("paper__cites__paper", [[0, 1], [1, 2], [4, 0]]), ("paper__written_by__author", [[0, 2], [3, 0]]),
                    ("author__affiliated_to__institute", [[0, 1], [2, 1]]), ("paper__topic__fos", [[1, 0], [1, 1]])):
        (proc / name).mkdir()
        np.save(proc / name / "edge_index.npy", np.array(e, dtype=np.int64))
    return tmp_path / "tiny"


def test_igbh_layout_imports_types_relations_and_igb_split(tiny_igbh, tmp_path):
    from training.hetero.igbh import import_igbh
    hd = open_hetero(import_igbh(tiny_igbh, tmp_path / "out"))
    assert [(t.name, t.count, t.feature_dim) for t in hd.schema.node_types] == [
        ("paper", 5, 1024), ("author", 3, 1024), ("fos", 2, 1024), ("institute", 2, 1024)]
    wb = ("paper", "written_by", "author")
    assert hd.rel_indptr[wb].tolist() == [0, 1, 1, 2] and hd.rel_indices[wb].tolist() == [3, 0]
    rev = ("author", "rev_written_by", "paper")
    assert hd.rel_indptr[rev].tolist() == [0, 1, 1, 1, 2, 2] and hd.rel_indices[rev].tolist() == [2, 0]
    assert np.array_equal(hd.features["author"], np.load(tiny_igbh / "processed/author/node_feat.npy"))
    assert hd.labels_of("paper").tolist() == [0, 3, 18, -1, 2] and hd.base.num_classes == 19
    assert hd.split("train_idx").tolist() == [0, 1, 2] and hd.split("test_idx").tolist() == [4]


def test_igbh_relation_to_an_unknown_type_is_one_line(tiny_igbh, tmp_path):
    from training.hetero.igbh import import_igbh
    (tiny_igbh / "processed/paper__venue__conference").mkdir()
    np.save(tiny_igbh / "processed/paper__venue__conference/edge_index.npy", np.zeros((1, 2), np.int64))
    with pytest.raises(DatasetError, match="names node type 'conference'"):
        import_igbh(tiny_igbh, tmp_path / "out")


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), fanouts=st.lists(st.integers(0, 4), min_size=1, max_size=3),
       k=st.integers(1, 8))
def test_each_node_is_sampled_once_at_the_hop_it_joined(mag, seed, fanouts, k):
    """PyG's hop rule: a node that joined at hop h (seeds: 0) draws min(degree, fanout[h]) in-edges
    per relation, a node that joined at the last hop none; the sampled ones are distinct."""
    _, hd = mag
    seeds = np.random.default_rng(seed).choice(400, size=k, replace=False)
    b = HeteroNeighborSampler(hd, fanouts, seed=seed).sample("paper", seeds)
    for (src, r, dst), ei in b.edge_index.items():
        ip = hd.rel_indptr[(src, r, dst)]
        joined = np.repeat(np.arange(len(fanouts) + 1), b.num_sampled_nodes[dst])
        got = torch.bincount(ei[1], minlength=b.n_id[dst].numel()).numpy()
        deg = np.diff(ip)[b.n_id[dst].numpy()]
        want = np.array([min(d, fanouts[h]) if h < len(fanouts) else 0 for d, h in zip(deg, joined, strict=True)])
        assert got.tolist() == want.tolist()
        pairs = set(zip(ei[0].tolist(), ei[1].tolist(), strict=True))
        assert len(pairs) == ei.shape[1]


def test_one_hotness_spans_every_type_in_global_ids(mag):
    from training.hetero.hotness import hetero_presample_counts
    _, hd = mag
    counts = hetero_presample_counts(hd, [4, 3], batch_size=50, epochs=2, seed=1)
    assert counts.shape == (hd.base.num_nodes,) and counts.dtype == np.int64
    train = hd.split("train_idx")
    for t in hd.schema.node_types:  # every type's rows are read, counted in its own id range
        assert counts[t.offset:t.offset + t.count].sum() > 0, t.name
    paper = hd.schema.node_type("paper")
    # every training paper is a seed once per epoch, so read at least twice
    assert (counts[paper.offset + train] >= 2).all()
    # one batch of every training paper, whole neighbourhoods: each row of the typed closure read once
    full = hetero_presample_counts(hd, [-1], batch_size=len(train), epochs=1)
    reach = _closure(hd, "paper", train.tolist(), 1)
    want = np.zeros(hd.base.num_nodes, np.int64)
    for t in hd.schema.node_types:
        want[t.offset + np.array(sorted(reach[t.name]), dtype=np.int64)] = 1
    assert full.tolist() == want.tolist()
    with pytest.raises(DatasetError, match="must be above 0"):
        hetero_presample_counts(hd, [2], batch_size=0)


def test_the_sampling_benchmark_writes_its_figure(tmp_path, load_tool):
    mod = load_tool("bench_hetero_sample")
    out = tmp_path / "b.json"
    assert mod.main(["--papers", "2000", "--batches", "2", "--repeats", "1", "--batch-size", "64",
                     "--json", str(out)]) == 0
    fig = json.loads(out.read_text())["figures"][0]
    assert fig["ours"] > 0 and fig["reference"] > 0 and fig["ratio"] == pytest.approx(fig["ours"] / fig["reference"])
