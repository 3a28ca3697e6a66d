"""OGB's binary layout (ogbn-papers100M: raw/data.npz, raw/node-label.npz, split/time) and the npz stream reader."""

from __future__ import annotations

import gzip
import io
import sys
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO
from training.data import DatasetError, open_dataset
from training.importers import detect_format
from training.importers._npystream import iter_items, members, write_member
from training.importers.ogb import import_ogb

sys.path.insert(0, str(REPO / "tools"))  # the synthetic papers100M-shaped writer lives with its benchmark
from bench_import import edges_in_memory, labels_of, write_ogb_binary  # noqa: E402

N, E = 300, 4000


def scipy_csr(src: np.ndarray, dst: np.ndarray, n: int) -> sp.csr_matrix:
    """The in-memory reference: row v = the sources of the edges into v, without self-loops or repeats."""
    m = src != dst
    a = sp.csr_matrix((np.ones(int(m.sum())), (dst[m], src[m])), shape=(n, n))
    a.sum_duplicates()
    a.sort_indices()
    return a


@pytest.mark.parametrize("compress", [True, False], ids=["deflated", "stored"])
def test_papers100m_layout_equals_the_in_memory_reference(tmp_path, compress):
    src_dir = write_ogb_binary(tmp_path, N, E, seed=3, feature_dim=12, compress=compress)
    assert detect_format(src_dir) == "ogb"
    seen = []
    ds = open_dataset(import_ogb(src_dir, tmp_path / "out", chunk_edges=333, chunk_bytes=1000,
                                 progress=lambda *a: seen.append(a)))
    ref = scipy_csr(*edges_in_memory(N, E, 3), N)
    assert np.array_equal(ds.indptr, ref.indptr) and np.array_equal(ds.indices, ref.indices)
    assert ds.directed and ds.num_nodes == N
    feats = np.load(src_dir / "raw" / "data.npz")["node_feat"]
    assert ds.features.shape == (N, 12) and np.array_equal(ds.features, feats)
    lab = labels_of(N, 3)
    assert np.array_equal(ds.labels, np.where(np.isnan(lab), -1, lab).astype(np.int64))
    with gzip.open(src_dir / "split" / "time" / "train.csv.gz") as f:
        train = np.loadtxt(f, dtype=np.int64)
    assert ds.train_idx.tolist() == train.tolist() and len(ds.valid_idx) and len(ds.test_idx)
    assert ds.meta["source"]["not_imported"] == ["node_year"] and ds.meta["source"]["compressed"] is compress
    stages = {s for s, *_ in seen}
    assert {"counting edges", "placing edges", "copying features", "reading labels"} <= stages
    assert seen[-1][0] == "checksumming" or ("copying features", N, N) in seen


def test_numpy_savez_compressed_file_reads_the_same(tmp_path):
    """A data.npz as OGB itself writes it (np.savez_compressed), not only our zip64 writer's."""
    rng = np.random.default_rng(0)
    ei = rng.integers(0, 50, size=(2, 500))
    d = tmp_path / "ogbn_papers100M"
    (d / "raw").mkdir(parents=True)
    np.savez_compressed(d / "raw" / "data.npz", edge_index=ei, num_nodes_list=np.array([50]),
                        num_edges_list=np.array([500]))
    ds = open_dataset(import_ogb(d, tmp_path / "out", chunk_edges=64))
    ref = scipy_csr(ei[0], ei[1], 50)
    assert np.array_equal(ds.indptr, ref.indptr) and np.array_equal(ds.indices, ref.indices)
    assert ds.features is None and ds.labels is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(0, 9), min_size=1, max_size=3),
       dtype=st.sampled_from(["<i8", "<f4", "<u2", ">i4"]), fortran=st.booleans(), compress=st.booleans(),
       cut=st.tuples(st.floats(0, 1), st.floats(0, 1)), chunk=st.integers(1, 50))
def test_member_stream_reads_what_was_written(tmp_path_factory, shape, dtype, fortran, compress, cut, chunk):
    arr = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape, order="F" if fortran else "C")
    path = tmp_path_factory.mktemp("npz") / "a.npz"
    (np.savez_compressed if compress else np.savez)(path, a=arr)
    m = members(path)["a"]
    assert m.shape == tuple(shape) and m.dtype == np.dtype(dtype) and (m.file_offset is None) == compress
    flat = arr.reshape(-1, order="F" if fortran and arr.ndim > 1 else "C")
    lo, hi = sorted(int(c * flat.size) for c in cut)
    parts = list(iter_items(m, lo, hi, chunk_items=chunk))
    got = np.concatenate(parts) if parts else np.zeros(0, dtype)
    assert got.tolist() == flat[lo:hi].tolist() and all(p.size <= chunk for p in parts)


# --- bad inputs: one line naming the file and the fix ---------------------------------------------

def small(tmp_path, **kw):
    return write_ogb_binary(tmp_path, 40, 200, seed=1, feature_dim=4, **kw)


def test_truncated_npz_is_named(tmp_path):
    d = small(tmp_path)
    data = (d / "raw" / "data.npz").read_bytes()
    (d / "raw" / "data.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        DatasetError, match=r"data\.npz: not a readable \.npz .*truncated or damaged, download it again"
    ):
        import_ogb(d, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_corrupt_compressed_member_is_named(tmp_path):
    d = small(tmp_path)
    path = d / "raw" / "data.npz"
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("edge_index.npy")
    start = info.header_offset + 30 + len(info.filename) + 200  # inside the compressed edge data
    data[start : start + 64] = bytes(64)
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"data\.npz \(member edge_index\.npy\): .*download the file again"):
        import_ogb(d, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _rewrite(path, key, arr):
    """``path`` with member ``key`` replaced by ``arr`` (the others kept)."""
    with zipfile.ZipFile(path) as zf:
        keep = {i.filename: zf.read(i) for i in zf.infolist() if i.filename != f"{key}.npy"}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in keep.items():
            zf.writestr(name, data)
        if arr is not None:
            write_member(zf, key, arr.shape, arr.dtype, [arr])


@pytest.mark.parametrize("key, arr, message", [
    ("edge_index", np.zeros((3, 200), np.int64), r"edge_index\.npy\): shape \[3, 200\], expected \[2, E\]"),
    ("edge_index", np.zeros((2, 200), np.float32), r"dtype float32, expected integer node ids"),
    ("edge_index", None, r"data\.npz: no edge_index\.npy member"),
    ("num_edges_list", np.array([7]), r"num_edges_list says \[7\], edge_index has 200 edges"),
    ("node_feat", np.zeros((39, 4), np.float32), r"node_feat\.npy\): shape \[39, 4\], expected \[40, F\]"),
    ("edge_index", np.array([[0, 1], [5, 40]]), None),
])
def test_wrong_members_are_named(tmp_path, key, arr, message):
    d = small(tmp_path)
    _rewrite(d / "raw" / "data.npz", key, arr)
    if message is None:  # an id out of range, with the node count it was checked against
        _rewrite(d / "raw" / "data.npz", "num_edges_list", np.array([2]))
        message = r"edge_index\.npy\): edges 0\.\.: node id 40 outside \[0, 40\)"
    with pytest.raises(DatasetError, match=message):
        import_ogb(d, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_member_shorter_than_its_header_is_named(tmp_path):
    d = small(tmp_path)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<i8", "fortran_order": False, "shape": (2, 200)})
    with zipfile.ZipFile(d / "raw" / "data.npz") as zf:
        keep = {i.filename: zf.read(i) for i in zf.infolist() if i.filename != "edge_index.npy"}
    with zipfile.ZipFile(d / "raw" / "data.npz", "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in keep.items():
            zf.writestr(name, data)
        zf.writestr("edge_index.npy", buf.getvalue() + bytes(8 * 300))
    with pytest.raises(DatasetError, match=r"holds [\d,]+ bytes but its header \(\[2, 200\] int64\) needs [\d,]+; "
                                           r"the file is truncated or damaged"):
        import_ogb(d, tmp_path / "out")


def test_missing_split_and_bad_labels_are_named(tmp_path):
    d = small(tmp_path, splits=("train", "valid"))
    with pytest.raises(DatasetError, match=r"split/time: test\.csv\.gz is missing"):
        import_ogb(d, tmp_path / "out")
    d = small(tmp_path / "b")
    _rewrite(d / "raw" / "node-label.npz", "node_label", np.zeros((40, 3), np.float32))
    with pytest.raises(DatasetError, match=r"node-label\.npz \(member node_label\.npy\): shape \[40, 3\], "
                                           r"expected \[40, 1\]"):
        import_ogb(d, tmp_path / "out")


def test_cli_imports_the_binary_layout(tmp_path, capsys):
    from moment.cli import main

    d = small(tmp_path)
    assert main(["data", "import", str(d), str(tmp_path / "out"), "--feature-dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert "(ogb)" in out and "40 nodes" in out and "4 × float16 features" in out
    ds = open_dataset(tmp_path / "out")
    ref = scipy_csr(*edges_in_memory(40, 200, 1), 40)
    assert np.array_equal(ds.indices, ref.indices) and ds.features.dtype == np.float16


def test_cli_imports_igb_full_layout(tmp_path, capsys):
    """IGB large/full: headerless features and labels, [E, 2] edges; the CLI end to end."""
    from bench_import import write_igb

    from moment.cli import main

    src = write_igb(tmp_path, 60, 500, seed=2)
    assert main(["data", "import", str(src), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "(igb)" in out and "60 nodes" in out and "1024 × float32 features" in out
    ds = open_dataset(tmp_path / "out")
    ref = scipy_csr(*edges_in_memory(60, 500, 2), 60)
    assert np.array_equal(ds.indptr, ref.indptr) and np.array_equal(ds.indices, ref.indices)


@pytest.mark.parametrize("fmt, make, message", [
    ("auto", "truncated", "data.npz: not a readable .npz (zip) file"),
    ("auto", "no_split", "split/time: test.csv.gz is missing"),
    ("webgraph", "no_graph", "g.graph: no such file"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, fmt, make, message):
    from moment.cli import main

    if make == "no_graph":
        (tmp_path / "g.properties").write_text("graphclass=it.unimi.dsi.webgraph.BVGraph\nnodes=1\narcs=0\n")
        src = tmp_path / "g"
    else:
        src = small(tmp_path, splits=("train", "valid") if make == "no_split" else ("train", "valid", "test"))
        if make == "truncated":
            data = src / "raw" / "data.npz"
            data.write_bytes(data.read_bytes()[:1000])
    assert main(["data", "import", "--format", fmt, str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("moment data: error:") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
