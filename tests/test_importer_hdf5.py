"""HDF5 import: round trips of the real Cora fixture through each documented layout, and bad files."""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import graph_fixture
from training.data import DatasetError, open_dataset
from training.importers import detect_format, import_dataset
from training.importers.hdf5 import import_hdf5
from training.importers.planetoid import import_planetoid


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    return open_dataset(import_planetoid(graph_fixture("cora"), tmp_path_factory.mktemp("c") / "cora"))


def edges_of(ds) -> np.ndarray:
    """(src, dst) pairs of the CSR, sorted: the graph as a set."""
    dst = np.repeat(np.arange(ds.num_nodes), ds.degree())
    pairs = np.stack([np.asarray(ds.indices, np.int64), dst], 1)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


def assert_same(a, b) -> None:
    assert (a.num_nodes, a.num_edges, a.directed) == (b.num_nodes, b.num_edges, b.directed)
    assert np.array_equal(edges_of(a), edges_of(b))
    assert np.array_equal(np.asarray(a.features), np.asarray(b.features))
    assert np.array_equal(np.asarray(a.labels), np.asarray(b.labels))
    for s in ("train_idx", "valid_idx", "test_idx"):
        assert np.array_equal(np.asarray(getattr(a, s)), np.asarray(getattr(b, s)))


def write_cora(path, cora, layout: str, chunk_rows: int = 100, root: str = "") -> None:
    with h5py.File(path, "w") as f:
        if layout == "csr":
            f.create_dataset(f"{root}graph/indptr", data=np.asarray(cora.indptr))
            f.create_dataset(f"{root}graph/indices", data=np.asarray(cora.indices), chunks=(512,))
        else:
            dst = np.repeat(np.arange(cora.num_nodes), cora.degree())
            src = np.asarray(cora.indices, np.int64)
            if layout == "edge_index":
                f.create_dataset(f"{root}graph/edge_index", data=np.stack([src, dst]), chunks=(2, 700))
            else:
                f.create_dataset(f"{root}graph/src", data=src)
                f.create_dataset(f"{root}graph/dst", data=dst)
        f.create_dataset(f"{root}features", data=np.asarray(cora.features), chunks=(chunk_rows, cora.feature_dim),
                         compression="gzip")
        f.create_dataset(f"{root}labels", data=np.asarray(cora.labels))
        for name, ids in (("train", cora.train_idx), ("valid", cora.valid_idx)):
            f.create_dataset(f"{root}split/{name}", data=np.asarray(ids))
        mask = np.zeros(cora.num_nodes, bool)
        mask[np.asarray(cora.test_idx)] = True
        f.create_dataset(f"{root}split/test", data=mask)  # a boolean mask is accepted too


@pytest.mark.parametrize("layout", ["csr", "edge_index", "src_dst"])
def test_cora_round_trips_through_every_layout(cora, tmp_path, layout):
    write_cora(tmp_path / "cora.h5", cora, layout)
    assert detect_format(tmp_path / "cora.h5") == "hdf5"
    # small blocks: the importer must stitch many chunk-aligned reads together
    ds = open_dataset(import_hdf5(tmp_path / "cora.h5", tmp_path / "out", undirected=True, block_bytes=40_000))
    assert_same(ds, cora)
    assert ds.meta["source"]["graph"] == ("csr" if layout == "csr" else "edge list")


def test_undirected_attribute_symmetrises_a_one_way_edge_list(tmp_path):
    with h5py.File(tmp_path / "g.h5", "w") as f:
        f.create_dataset("graph/src", data=[0, 1, 1, 2, 2])
        f.create_dataset("graph/dst", data=[1, 2, 2, 2, 0])  # a duplicate and a self-loop
        f.attrs["undirected"] = True
        f.attrs["num_nodes"] = 4  # an isolated vertex only the attribute knows of
    ds = open_dataset(import_hdf5(tmp_path / "g.h5", tmp_path / "out"))
    assert ds.num_nodes == 4 and not ds.directed
    assert {tuple(p) for p in edges_of(ds).tolist()} == {(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (0, 2)}


def test_remapped_keys_and_the_cli(cora, tmp_path):
    write_cora(tmp_path / "cora.h5", cora, "csr", root="run1/")
    keys = [f"{k}=/run1/{v}" for k, v in (("indptr", "graph/indptr"), ("indices", "graph/indices"),
                                          ("features", "features"), ("labels", "labels"),
                                          ("train", "split/train"), ("valid", "split/valid"),
                                          ("test", "split/test"))]
    cmd = [sys.executable, "-m", "moment", "data", "import", str(tmp_path / "cora.h5"), str(tmp_path / "out")]
    proc = subprocess.run(cmd + ["--undirected"] + [a for k in keys for a in ("--hdf5-key", k)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "2,708 nodes" in proc.stdout and "(hdf5)" in proc.stdout
    assert_same(open_dataset(tmp_path / "out"), cora)
    # without the remapping the default paths are missing: one line naming the path and the fix
    proc = subprocess.run(cmd[:-1] + [str(tmp_path / "out2")], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "/graph/indptr" in proc.stderr and "--hdf5-key" in proc.stderr
    proc = subprocess.run(cmd[:-1] + [str(tmp_path / "out3"), "--hdf5-key", "features"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "KEY=PATH" in proc.stderr


def bad_file(path, **datasets):
    with h5py.File(path, "w") as f:
        for name, data in datasets.items():
            f.create_dataset(name.replace("__", "/"), data=data)
    return path


@pytest.mark.parametrize(
    "datasets, message",
    [
        ({}, "no graph"),
        ({"graph__indptr": [0, 1], "graph__indices": [0], "graph__src": [0], "graph__dst": [0]}, "both a CSR"),
        ({"graph__indptr": [0, 2, 1], "graph__indices": [0, 1]}, "not a CSR row pointer"),
        ({"graph__indptr": [0, 1], "graph__indices": [0.5]}, "expected CSR column ids"),
        ({"graph__edge_index": [[0, 1, 2]]}, "expected (2, E)"),
        ({"graph__src": [0, 1], "graph__dst": [1]}, "pair up"),
        (
            {"graph__indptr": [0, 1, 2], "graph__indices": [1, 0], "features": np.ones((3, 2))},
            "has 3 rows; expected one per node (2)",
        ),
        ({"graph__src": [0, 1], "graph__dst": [1, 0], "features": np.ones(2)}, "expected features (N, F)"),
        ({"graph__src": [0, 1], "graph__dst": [1, 0], "labels": [0, -2]}, "use -1 for unlabelled"),
        ({"graph__src": [0, 1], "graph__dst": [1, 0], "split__train": [5]}, "outside [0, 2)"),
        ({"graph__src": [0, 1], "graph__dst": [1, 0], "split__test": [True, False, True]}, "one per node (2)"),
    ],
)
def test_bad_files_name_the_dataset_and_the_fix(tmp_path, datasets, message):
    with pytest.raises(DatasetError) as err:
        import_hdf5(bad_file(tmp_path / "bad.h5", **datasets), tmp_path / "out")
    assert message in str(err.value) and "bad.h5" in str(err.value)
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_not_hdf5_and_unknown_key(tmp_path):
    (tmp_path / "x.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(DatasetError, match="not a readable HDF5 file"):
        import_hdf5(tmp_path / "x.h5", tmp_path / "out")
    bad_file(tmp_path / "g.h5", graph__src=[0], graph__dst=[1])
    with pytest.raises(DatasetError, match="unknown key 'feats'"):
        import_dataset(tmp_path / "g.h5", tmp_path / "out", format="hdf5", keys={"feats": "/x"})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=200),
       st.integers(1, 64), st.booleans())
def test_edge_list_property_matches_the_set_of_edges(tmp_path_factory, edges, chunk, undirected):
    """Any edge list, any chunking: the CSR holds exactly the distinct non-loop edges (both ways if undirected)."""
    d = tmp_path_factory.mktemp("p")
    e = np.array(edges, np.int64).T
    with h5py.File(d / "g.h5", "w") as f:
        f.create_dataset("graph/edge_index", data=e, chunks=(2, min(chunk, e.shape[1])))
    ds = open_dataset(import_hdf5(d / "g.h5", d / "out", undirected=undirected, block_bytes=8 * chunk))
    want = {(s, t) for s, t in edges if s != t}
    if undirected:
        want |= {(t, s) for s, t in want}
    assert ds.num_nodes == int(e.max()) + 1
    assert {tuple(p) for p in edges_of(ds).tolist()} == want


def test_a_named_dataset_that_is_missing_is_an_error_listing_the_files_datasets(tmp_path):
    # issue 28 item 3: a remapped key that names nothing used to import without features, exit 0
    bad_file(tmp_path / "g.h5", graph__edge_index=[[0, 1], [1, 0]], node__x=np.ones((2, 3)))
    with pytest.raises(DatasetError) as err:
        import_hdf5(tmp_path / "g.h5", tmp_path / "out", keys={"features": "/nope"})
    assert "/nope" in str(err.value) and "/graph/edge_index, /node/x" in str(err.value)
    assert not (tmp_path / "out").exists()
    proc = subprocess.run([sys.executable, "-m", "moment", "data", "import", "--hdf5-key", "features=/nope",
                           str(tmp_path / "g.h5"), str(tmp_path / "d")], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "--hdf5-key features=/nope" in proc.stderr and "/node/x" in proc.stderr
    assert not (tmp_path / "d").exists()
