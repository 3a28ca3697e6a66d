"""Importers on the real fixtures (counts from each SOURCE.md), synthetic OGB / IGB layouts, bad inputs."""

from __future__ import annotations

import gzip
import pickle
import shutil
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import graph_fixture
from training.data import DatasetError, dataset_info, open_dataset
from training.importers import detect_format, import_dataset
from training.importers._text import iter_rows
from training.importers.edgelist import import_edgelist
from training.importers.igb import import_igb
from training.importers.npz import import_npz
from training.importers.ogb import import_ogb
from training.importers.planetoid import import_planetoid


def edge_set(ds) -> set[tuple[int, int]]:
    dst = np.repeat(np.arange(ds.num_nodes), ds.degree())
    return set(zip(np.asarray(ds.indices).tolist(), dst.tolist(), strict=True))


# --- Planetoid ----------------------------------------------------------------------------------

def test_cora_planetoid_counts_and_public_split(tmp_path):
    ds = open_dataset(import_planetoid(graph_fixture("cora"), tmp_path / "cora"))
    # cora/SOURCE.md: 2708 nodes, 5278 undirected edges = 10556 directed, 1433 features, 7 classes
    assert (ds.num_nodes, ds.num_edges, ds.feature_dim, ds.num_classes) == (2708, 10556, 1433, 7)
    assert not ds.directed and ds.degree().max() == 168 and (ds.degree() > 0).all()
    assert np.bincount(ds.labels).tolist() == [351, 217, 418, 818, 426, 298, 180]
    assert float(np.asarray(ds.features).sum()) == 49216  # binary features, total nnz
    assert ds.train_idx.tolist() == list(range(140)) and ds.valid_idx.tolist() == list(range(140, 640))
    test_ids = [int(x) for x in (graph_fixture("cora") / "ind.cora.test.index").read_text().split()]
    assert ds.test_idx.tolist() == sorted(test_ids)
    assert np.bincount(ds.labels[ds.train_idx]).tolist() == [20] * 7


def test_cora_planetoid_equals_pyg(tmp_path):
    from torch_geometric.io import read_planetoid_data

    ref = read_planetoid_data(str(graph_fixture("cora")), "cora")
    ds = open_dataset(import_planetoid(graph_fixture("cora"), tmp_path / "cora"))
    assert edge_set(ds) == set(zip(*ref.edge_index.tolist(), strict=True))
    assert np.array_equal(np.asarray(ds.features), ref.x.numpy())
    assert np.array_equal(np.asarray(ds.labels), ref.y.numpy())
    for ours, mask in ((ds.train_idx, ref.train_mask), (ds.valid_idx, ref.val_mask), (ds.test_idx, ref.test_mask)):
        assert np.asarray(ours).tolist() == mask.nonzero().view(-1).tolist()


def planetoid_copy(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(graph_fixture("cora"), src)
    for p in src.iterdir():
        p.chmod(0o644)
    return src


def test_planetoid_with_gaps_in_test_index_like_citeseer(tmp_path):
    """Test ids with holes (CiteSeer's isolated nodes) become empty, unlabelled rows."""
    src = planetoid_copy(tmp_path)
    ids = [int(x) for x in (src / "ind.cora.test.index").read_text().split()]
    # drop the test node with the largest id... and one in the middle: tx/ty shrink accordingly
    gone = sorted(ids)[500]
    keep = [i for i in ids if i != gone]
    rows_sorted = sorted(ids)
    tx = pickle.loads((src / "ind.cora.tx").read_bytes(), encoding="latin1")
    ty = pickle.loads((src / "ind.cora.ty").read_bytes(), encoding="latin1")
    keep_rows = [rows_sorted.index(i) for i in sorted(keep)]
    (src / "ind.cora.tx").write_bytes(pickle.dumps(tx[keep_rows], protocol=2))
    (src / "ind.cora.ty").write_bytes(pickle.dumps(ty[keep_rows], protocol=2))
    # test.index rows must follow tx rows (sorted), as in the original files
    (src / "ind.cora.test.index").write_text("\n".join(map(str, sorted(keep))) + "\n")
    ds = open_dataset(import_planetoid(src, tmp_path / "out"))
    assert ds.num_nodes == 2708 and ds.labels[gone] == -1 and not np.asarray(ds.features[gone]).any()
    assert gone not in set(ds.test_idx.tolist()) and len(ds.test_idx) == 999
    assert ds.meta["source"]["isolated_test_gaps"] == 1


@pytest.mark.parametrize(
    "part, payload, message",
    [
        (
            "x",
            pickle.dumps({"not": "a matrix"}, protocol=2),
            r"ind\.cora\.x: holds a dict, expected a sparse feature matrix",
        ),
        ("graph", pickle.dumps([1, 2, 3], protocol=2), r"ind\.cora\.graph: holds a list, expected a dict"),
        ("ally", pickle.dumps(np.zeros(3), protocol=2), r"ind\.cora\.ally: holds a ndarray, expected a one-hot"),
        ("graph", None, r"ind\.cora\.graph: not a readable pickle.*truncated"),
        ("tx", b"", r"ind\.cora\.tx: not a readable pickle"),
    ],
)
def test_planetoid_wrong_or_truncated_pickles(tmp_path, part, payload, message):
    src = planetoid_copy(tmp_path)
    if payload is None:  # truncate the real file
        payload = (src / f"ind.cora.{part}").read_bytes()[:1000]
    (src / f"ind.cora.{part}").write_bytes(payload)
    with pytest.raises(DatasetError, match=message):
        import_planetoid(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_planetoid_refuses_code_in_pickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (shutil.rmtree, (str(tmp_path / "victim"),))

    (tmp_path / "victim").mkdir()
    src = planetoid_copy(tmp_path)
    (src / "ind.cora.graph").write_bytes(pickle.dumps(Evil(), protocol=2))
    with pytest.raises(DatasetError, match=r"shutil\.rmtree.*refusing"):
        import_planetoid(src, tmp_path / "out")
    assert (tmp_path / "victim").exists()


def test_planetoid_missing_file(tmp_path):
    src = planetoid_copy(tmp_path)
    (src / "ind.cora.ty").unlink()
    with pytest.raises(DatasetError, match=r"ind\.cora\.ty: missing"):
        import_planetoid(src, tmp_path / "out")


# --- gnn-benchmark npz ---------------------------------------------------------------------------

def test_amazon_photo_npz_counts(tmp_path):
    src = graph_fixture("amazon-photo", "amazon_photo.npz")
    ds = open_dataset(import_npz(src, tmp_path / "photo"))
    # amazon-photo/SOURCE.md: 7650 nodes, 119081 undirected edges (238162 directed), 745 features, 8 classes
    assert (ds.num_nodes, ds.num_edges, ds.feature_dim, ds.num_classes) == (7650, 238162, 745, 8)
    assert ds.degree().max() == 1434
    assert np.bincount(ds.labels).tolist() == [369, 1686, 703, 915, 882, 823, 1941, 331]
    lcc = open_dataset(import_npz(src, tmp_path / "lcc", lcc=True, seed=3))
    # the Shchur protocol: largest component 7487 nodes, 119043 edges
    assert (lcc.num_nodes, lcc.num_edges // 2) == (7487, 119043)
    assert np.bincount(lcc.labels).tolist() == [365, 1634, 686, 901, 872, 798, 1900, 331]
    assert np.bincount(lcc.labels[lcc.train_idx]).tolist() == [20] * 8
    assert np.bincount(lcc.labels[lcc.valid_idx]).tolist() == [30] * 8
    assert len(lcc.test_idx) == 7487 - 8 * 50


def test_cora_npz_counts_and_seeded_split(tmp_path):
    src = graph_fixture("cora", "cora.npz")
    ds = open_dataset(import_npz(src, tmp_path / "a"))
    assert (ds.num_nodes, ds.num_edges // 2, ds.feature_dim, ds.num_classes) == (2708, 5278, 1433, 7)
    lcc = open_dataset(import_npz(src, tmp_path / "b", lcc=True))
    assert (lcc.num_nodes, lcc.num_edges // 2) == (2485, 5069)  # Shchur et al. 2018, Table 1
    again = open_dataset(import_npz(src, tmp_path / "c", lcc=True))
    other = open_dataset(import_npz(src, tmp_path / "d", lcc=True, seed=1))
    assert np.array_equal(lcc.train_idx, again.train_idx)
    assert not np.array_equal(lcc.train_idx, other.train_idx)
    raw = open_dataset(import_npz(src, tmp_path / "e", directed=True, split="none"))
    assert raw.directed and raw.num_edges == 5429 - 0 and raw.train_idx is None  # the raw LINQS citations


def test_npz_missing_key_and_truncated(tmp_path):
    src = graph_fixture("cora", "cora.npz")
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files if k != "adj_indptr"}
    np.savez(tmp_path / "missing.npz", **arrays)
    with pytest.raises(DatasetError, match=r"missing\.npz: key 'adj_indptr' is missing"):
        import_npz(tmp_path / "missing.npz", tmp_path / "out")
    (tmp_path / "cut.npz").write_bytes(src.read_bytes()[:100_000])
    with pytest.raises(DatasetError, match=r"cut\.npz: not an \.npz"):
        import_npz(tmp_path / "cut.npz", tmp_path / "out")
    with zipfile.ZipFile(tmp_path / "evil.npz", "w") as zf:
        zf.writestr(
            "adj_matrix.npy",
            b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (), }".ljust(128, b" ")[:127]
            + b"\n"
            + pickle.dumps(np.array(print, dtype=object)),
        )
    with pytest.raises(DatasetError, match="refusing"):
        import_npz(tmp_path / "evil.npz", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- edge lists ----------------------------------------------------------------------------------

def test_slashdot_edgelist_counts_and_skew(tmp_path):
    src = graph_fixture("soc-Slashdot0902", "soc-Slashdot0902.txt.gz")
    ds = open_dataset(import_edgelist(src, tmp_path / "u", undirected=True))
    meta = ds.meta["source"]
    # SOURCE.md: 82,168 nodes, 948,464 rows, 78,303 self-loops, 504,230 undirected edges
    assert (ds.num_nodes, meta["rows"], meta["self_loops_dropped"]) == (82168, 948464, 78303)
    assert ds.num_edges == 2 * 504230 and not meta["relabelled"]
    info = dataset_info(ds)
    # undirected degree: median 2, p99 192, max 2552; the top 1% hold 24.5% of the endpoints
    assert (info.in_degree.median, info.in_degree.p99, info.in_degree.max) == (2, 192, 2552)
    assert round(100 * info.top1pct_endpoint_share, 1) == 24.5 and info.isolated_nodes == 0


@pytest.mark.slow
def test_slashdot_directed(tmp_path):
    src = graph_fixture("soc-Slashdot0902", "soc-Slashdot0902.txt.gz")
    ds = open_dataset(import_edgelist(src, tmp_path / "d", features="degree", feature_dim=8))
    assert ds.directed and ds.num_edges == 948464 - 78303  # no duplicate directed rows
    assert ds.features.shape == (82168, 8) and (np.asarray(ds.features).sum(1) == 1).all()


def test_edgelist_relabels_sparse_ids(tmp_path):
    (tmp_path / "e.txt").write_text(
        "% konect-style header\n# comment\n100 7\n7 100\n100 5000000000\n\n5000000000 5000000000\n"
    )
    ds = open_dataset(import_edgelist(tmp_path / "e.txt", tmp_path / "g", features="random", feature_dim=4, seed=1))
    assert ds.num_nodes == 3 and ds.meta["source"]["relabelled"]
    ids = np.load(tmp_path / "g" / "node_ids.npy")
    assert ids.tolist() == [7, 100, 5000000000]
    assert edge_set(ds) == {(1, 0), (0, 1), (1, 2)}
    assert ds.features.shape == (3, 4) and ds.features.dtype == np.float32


def test_edgelist_bad_line_names_its_number(tmp_path):
    lines = ["# header", *[f"{i} {i + 1}" for i in range(50)], "3 x", "4 5"]
    (tmp_path / "e.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"e\.txt:52: expected 2 whitespace-separated integers, found '3 x'"):
        import_edgelist(tmp_path / "e.txt", tmp_path / "g", chunk_bytes=64)
    (tmp_path / "one.txt").write_text("1 2\n3\n")
    with pytest.raises(DatasetError, match=r"one\.txt:2: expected 2"):
        import_edgelist(tmp_path / "one.txt", tmp_path / "g")
    assert not (tmp_path / "g").exists()


def test_truncated_gzip(tmp_path):
    data = graph_fixture("soc-Slashdot0902", "soc-Slashdot0902.txt.gz").read_bytes()
    (tmp_path / "cut.txt.gz").write_bytes(data[: len(data) // 3])
    with pytest.raises(DatasetError, match=r"cut\.txt\.gz: the gzip stream ends early \(the file is truncated\)"):
        import_dataset(tmp_path / "cut.txt.gz", tmp_path / "g")
    assert [p.name for p in tmp_path.iterdir()] == ["cut.txt.gz"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    edges=st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 10**12)), min_size=1, max_size=60),
    seps=st.lists(st.sampled_from([" ", "\t", "  ", " \t "]), min_size=1, max_size=4),
    eol=st.sampled_from(["\n", "\r\n"]),
    comments=st.lists(st.integers(0, 60), max_size=5),
    extra_col=st.booleans(),
    gz=st.booleans(),
    chunk=st.integers(1, 200),
)
def test_edgelist_parser_reads_what_was_written(tmp_path_factory, edges, seps, eol, comments, extra_col, gz, chunk):
    lines = []
    for i, (u, v) in enumerate(edges):
        if i in comments:
            lines.append("# a comment 1 2")
            lines.append("")
        lines.append(f"{u}{seps[i % len(seps)]}{v}" + (" 0.5" if extra_col else ""))
    text = eol.join(lines) + eol
    path = tmp_path_factory.mktemp("el") / ("e.txt.gz" if gz else "e.txt")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    got = np.concatenate(list(iter_rows(path, ncols=2, chunk_bytes=chunk)))
    assert got.tolist() == [list(e) for e in edges]


# --- OGB layout (synthetic, with the real file names) ---------------------------------------------

def write_csv_gz(path, rows, fmt="{}"):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(",".join(fmt.format(x) for x in (r if isinstance(r, (list, tuple, np.ndarray)) else [r])) + "\n")


def make_ogb(root, n=30, seed=0, name="ogbn_toy"):
    rng = np.random.default_rng(seed)
    d = root / name
    edges = rng.integers(0, n, size=(120, 2))
    write_csv_gz(d / "raw" / "edge.csv.gz", edges.tolist())
    write_csv_gz(d / "raw" / "num-node-list.csv.gz", [n])
    write_csv_gz(d / "raw" / "num-edge-list.csv.gz", [len(edges)])
    feats = rng.standard_normal((n, 5)).astype(np.float32)
    write_csv_gz(d / "raw" / "node-feat.csv.gz", feats.tolist(), fmt="{!r}")
    labels = rng.integers(0, 4, size=n).astype(float)
    labels[3] = np.nan
    write_csv_gz(d / "raw" / "node-label.csv.gz", labels.tolist())
    perm = rng.permutation(n)
    for part, ids in (("train", perm[:15]), ("valid", perm[15:22]), ("test", perm[22:])):
        write_csv_gz(d / "split" / "time" / f"{part}.csv.gz", ids.tolist())
    return d, edges, feats, labels, perm


def test_ogb_layout(tmp_path):
    src, edges, feats, labels, perm = make_ogb(tmp_path)
    assert detect_format(src) == "ogb"
    ds = open_dataset(import_ogb(src, tmp_path / "out", chunk_bytes=100))
    assert ds.num_nodes == 30 and ds.directed
    want = {(int(u), int(v)) for u, v in edges if u != v}
    assert edge_set(ds) == want
    assert np.allclose(ds.features, feats) and ds.labels[3] == -1
    assert np.array_equal(ds.labels[np.arange(30) != 3], labels[np.arange(30) != 3].astype(int))
    assert ds.train_idx.tolist() == perm[:15].tolist() and ds.test_idx.tolist() == perm[22:].tolist()
    assert ds.meta["source"]["split"] == "time"


def test_ogb_products_is_made_undirected_and_bad_rows_are_named(tmp_path):
    src, edges, *_ = make_ogb(tmp_path, name="ogbn_products")
    ds = open_dataset(import_ogb(src, tmp_path / "out"))
    assert not ds.directed and ds.num_edges == 2 * len({frozenset(e) for e in edges.tolist() if e[0] != e[1]})
    with gzip.open(src / "raw" / "edge.csv.gz", "at") as f:
        f.write("1,2\n4;5\n")
    with pytest.raises(DatasetError, match=r"edge\.csv\.gz:122: expected 2 comma-separated integers, found '4;5'"):
        import_ogb(src, tmp_path / "out2")
    write_csv_gz(src / "raw" / "edge.csv.gz", [[0, 1], [2, 99]])
    with pytest.raises(DatasetError, match=r"edge\.csv\.gz: node id 99 outside \[0, 30\)"):
        import_ogb(src, tmp_path / "out3")


# --- IGB layout (synthetic, with the real file names) ---------------------------------------------

def make_igb(root, n=40, raw=False):
    rng = np.random.default_rng(1)
    proc = root / "igb" / "small" / "processed"
    (proc / "paper").mkdir(parents=True)
    (proc / "paper__cites__paper").mkdir()
    feats = rng.standard_normal((n, 1024)).astype(np.float32)
    labels = rng.integers(0, 19, size=n).astype(np.float32)
    edges = rng.integers(0, n, size=(200, 2)).astype(np.int64)
    if raw:  # IGB large/full: headerless arrays
        feats.tofile(proc / "paper" / "node_feat.npy")
        labels.tofile(proc / "paper" / "node_label_19.npy")
    else:
        np.save(proc / "paper" / "node_feat.npy", feats)
        np.save(proc / "paper" / "node_label_19.npy", labels)
    np.save(proc / "paper__cites__paper" / "edge_index.npy", edges)
    return root / "igb", feats, labels, edges


@pytest.mark.parametrize("raw", [False, True])
def test_igb_layout(tmp_path, raw):
    src, feats, labels, edges = make_igb(tmp_path, raw=raw)
    assert detect_format(src) == "igb"
    ds = open_dataset(import_igb(src, tmp_path / "out", chunk_edges=17))
    assert ds.num_nodes == 40 and ds.feature_dim == 1024 and ds.num_classes == int(labels.max()) + 1
    assert edge_set(ds) == {(int(u), int(v)) for u, v in edges if u != v}
    assert np.array_equal(ds.features, feats) and np.array_equal(ds.labels, labels.astype(np.int64))
    assert (len(ds.train_idx), len(ds.valid_idx), len(ds.test_idx)) == (24, 8, 8)


def test_igb_bad_edges(tmp_path):
    src, *_ = make_igb(tmp_path)
    np.save(src / "small" / "processed" / "paper__cites__paper" / "edge_index.npy", np.array([[0, 1, 2]]))
    with pytest.raises(DatasetError, match=r"edge_index\.npy: shape \[1, 3\], expected \[E, 2\]"):
        import_igb(src, tmp_path / "out")


def test_detect_format_refuses_the_unknown(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\x00\x01garbage")
    with pytest.raises(DatasetError, match="cannot tell its format"):
        detect_format(tmp_path / "x.bin")


def test_edgelist_import_memory_is_bounded_by_the_chunk(tmp_path):
    """Python-side allocations stay near the chunk size, far below the edge list held whole."""
    import tracemalloc

    rng = np.random.default_rng(0)
    edges = rng.integers(0, 1000, size=(100_000, 2))
    np.savetxt(tmp_path / "e.txt", edges, fmt="%d")
    whole = edges.nbytes  # 1.6 MB: what an in-memory importer would hold at least once
    tracemalloc.start()
    try:
        import_edgelist(tmp_path / "e.txt", tmp_path / "g", chunk_bytes=32 << 10, chunk_edges=1 << 12)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < whole / 3
    ds = open_dataset(tmp_path / "g")
    assert ds.num_edges == len({(u, v) for u, v in edges.tolist() if u != v})
