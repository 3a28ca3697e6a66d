"""The dataset directory: writing (chunked CSR, atomic commit), opening and validation."""

from __future__ import annotations

import doctest
import json
import shutil

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import training.data
from training.data import (
    SCHEMA,
    DatasetError,
    dataset_info,
    index_dtype,
    open_dataset,
    skew,
)
from training.writer import DatasetWriter


def test_docstring_examples():
    result = doctest.testmod(training.data, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def small(tmp_path, name="g", **kw):
    """A 5-node directed graph with features, labels and a split."""
    src = np.array([0, 1, 2, 3, 4, 0])
    dst = np.array([1, 2, 3, 4, 0, 2])
    with DatasetWriter(tmp_path / name, num_nodes=5, **kw) as w:
        w.write_edges((src, dst))
        w.write_features(np.arange(10, dtype=np.float32).reshape(5, 2))
        w.write_labels(np.array([0, 1, 2, -1, 0]), num_classes=3)
        w.write_splits(train=[0, 1], valid=[2], test=[4])
    return tmp_path / name


def test_round_trip_and_meta(tmp_path):
    ds = open_dataset(small(tmp_path))
    assert (ds.num_nodes, ds.num_edges, ds.feature_dim, ds.num_classes) == (5, 6, 2, 3)
    assert ds.directed and ds.feature_dtype == "float32"
    # row v holds the sources of the edges into v
    assert ds.neighbours(2).tolist() == [0, 1] and ds.neighbours(0).tolist() == [4]
    assert ds.degree().tolist() == [1, 1, 2, 1, 1]
    assert ds.indices.dtype == np.int32 and ds.indptr.dtype == np.int64
    assert isinstance(ds.indices, np.memmap) and isinstance(ds.features, np.memmap)
    meta = json.loads((ds.path / "meta.json").read_text())
    assert meta["schema"] == SCHEMA and meta["version"] == 1
    assert meta["files"]["features"] == {"dtype": "float32", "shape": [5, 2]}
    assert sorted(meta["files"]) == ["features", "indices", "indptr", "labels", "test_idx", "train_idx", "valid_idx"]


def test_index_dtype_switches_at_2_31():
    assert index_dtype(2**31 - 1) == np.int32 and index_dtype(2**31) == np.int64


def reference_csr(n, src, dst, undirected, dedup):
    m = src != dst
    s, d = src[m], dst[m]
    if undirected:
        s, d = np.r_[s, d], np.r_[d, s]
    if dedup:
        a = sp.csr_matrix((np.ones(s.size), (d, s)), shape=(n, n))  # sums repeated entries
        a.sort_indices()
        return a.indptr, [a.indices[a.indptr[v] : a.indptr[v + 1]].tolist() for v in range(n)]
    rows = [sorted(s[d == v].tolist()) for v in range(n)]
    return np.r_[0, np.cumsum([len(r) for r in rows])], rows


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 40),
    edges=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 39)), max_size=200),
    chunk=st.integers(1, 64),
    undirected=st.booleans(),
    dedup=st.booleans(),
)
def test_chunked_csr_matches_scipy(tmp_path_factory, n, edges, chunk, undirected, dedup):
    e = np.array([(u % n, v % n) for u, v in edges], dtype=np.int64).reshape(-1, 2)
    src, dst = e[:, 0], e[:, 1]
    # feed the edges as a stream of uneven chunks, built afresh for each pass
    pieces = [(src[a : a + 7], dst[a : a + 7]) for a in range(0, len(src), 7)]
    path = tmp_path_factory.mktemp("csr") / "g"
    with DatasetWriter(path, num_nodes=n, chunk_edges=chunk) as w:
        w.write_edges(lambda: iter(pieces), undirected=undirected, dedup=dedup)
    ds = open_dataset(path)
    indptr, rows = reference_csr(n, src, dst, undirected, dedup)
    assert ds.indptr.tolist() == list(indptr)
    assert ds.directed is not undirected
    for v in range(n):
        got = ds.neighbours(v).tolist()
        assert (got if dedup else sorted(got)) == rows[v]  # dedup also sorts each row


def test_failure_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), DatasetWriter(tmp_path / "g", num_nodes=3) as w:
        w.write_edges((np.array([0]), np.array([1])))
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_existing_destination_is_kept_unless_overwrite(tmp_path):
    path = small(tmp_path)
    with pytest.raises(DatasetError, match="already exists"):
        DatasetWriter(path, num_nodes=2)
    with DatasetWriter(path, num_nodes=2, overwrite=True) as w:
        w.write_edges((np.array([0]), np.array([1])))
    assert open_dataset(path).num_nodes == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]


def test_writer_refuses_bad_input(tmp_path):
    with pytest.raises(DatasetError, match="outside"), DatasetWriter(tmp_path / "g", num_nodes=3) as w:
        w.write_edges((np.array([0]), np.array([3])))
    with pytest.raises(DatasetError, match="no graph"), DatasetWriter(tmp_path / "h", num_nodes=3):
        pass
    with pytest.raises(DatasetError, match="rows"), DatasetWriter(tmp_path / "i", num_nodes=3) as w:
        w.write_edges((np.array([0]), np.array([1])))
        w.write_features(iter([np.zeros((2, 4))]))
    assert list(tmp_path.iterdir()) == []


def test_features_by_row_blocks_and_dtype(tmp_path):
    with DatasetWriter(tmp_path / "g", num_nodes=5) as w:
        w.write_edges(np.array([[0, 1], [1, 2]]))
        w.write_features(iter([np.full((2, 3), 0), np.full((2, 3), 1), np.full((1, 3), 2)]), dtype="float16")
    ds = open_dataset(tmp_path / "g")
    assert ds.features.dtype == np.float16 and ds.features[:, 0].tolist() == [0, 0, 1, 1, 2]
    assert ds.feature_bytes == 5 * 3 * 2 and ds.row_bytes == 6


# --- validation on open: every failure names the file -----------------------------------------

def rewrite(path, name, arr):
    np.save(path / f"{name}.npy", arr)


def edit_meta(path, **changes):
    meta = json.loads((path / "meta.json").read_text())
    meta.update(changes)
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda p: (p / "indices.npy").unlink(), r"indices\.npy: indices file is missing"),
        (
            lambda p: rewrite(p, "indices", np.array([1, 2, 3, 4, 0, 7], dtype=np.int32)),
            r"indices\.npy: neighbour id at position 5 is 7",
        ),
        (
            lambda p: rewrite(p, "indices", np.zeros(6, dtype=np.int64)),
            r"indices\.npy: dtype int64, meta\.json declares int32",
        ),
        (lambda p: rewrite(p, "indices", np.zeros(5, dtype=np.int32)), r"indices\.npy: shape \[5\].*truncated"),
        (
            lambda p: rewrite(p, "indptr", np.array([0, 1, 3, 2, 5, 6], dtype=np.int64)),
            r"indptr\.npy: decreases at row 2",
        ),
        (lambda p: rewrite(p, "indptr", np.array([1, 1, 2, 4, 5, 6], dtype=np.int64)), r"indptr\.npy: must run from 0"),
        (lambda p: rewrite(p, "labels", np.array([0, 1, 3, -1, 0])), r"labels\.npy: label at position 2 is 3"),
        (
            lambda p: rewrite(p, "test_idx", np.array([1])),
            r"test_idx\.npy: node 1 appears twice or also in another split",
        ),
        (lambda p: rewrite(p, "valid_idx", np.array([9])), r"valid_idx\.npy: node id at position 0 is 9"),
        (lambda p: (p / "features.npy").write_bytes(b"\x93NUMPY garbage"), r"features\.npy: not a readable \.npy"),
        (lambda p: edit_meta(p, version=99), r"meta\.json: dataset format version 99"),
        (lambda p: edit_meta(p, schema="x"), r"meta\.json: schema is 'x'"),
        (lambda p: (p / "meta.json").write_text("{"), r"meta\.json: not valid JSON"),
        (lambda p: (p / "meta.json").unlink(), r"meta\.json: missing"),
    ],
)
def test_corrupt_dataset_is_named(tmp_path, corrupt, message):
    """What the format checks catch, with the checksums out of the way (``verify="none"``)."""
    path = small(tmp_path)
    corrupt(path)
    with pytest.raises(DatasetError, match=message):
        open_dataset(path, verify="none")


@pytest.mark.parametrize("name, arr", [
    ("indices", np.array([1, 2, 3, 4, 0, 7], dtype=np.int32)),
    ("indptr", np.array([0, 1, 3, 2, 5, 6], dtype=np.int64)),
    ("labels", np.array([0, 1, 3, -1, 0])),
    ("test_idx", np.array([3])),  # a well-formed split, just not the one written
])
def test_a_rewritten_file_fails_its_checksum_before_any_range_check(tmp_path, name, arr):
    path = small(tmp_path)
    rewrite(path, name, arr)
    with pytest.raises(DatasetError, match=rf"{name}\.npy: block 0 of 1 \(bytes 0 to \d+\) does not match the CRC-32"):
        open_dataset(path)


def test_missing_directory(tmp_path):
    with pytest.raises(DatasetError, match="no such dataset directory"):
        open_dataset(tmp_path / "nope")


def test_validation_in_chunks_finds_late_errors(tmp_path):
    n = 1000
    src = np.arange(n)
    with DatasetWriter(tmp_path / "g", num_nodes=n) as w:
        w.write_edges((src, (src + 1) % n))
    bad = np.load(tmp_path / "g" / "indices.npy")
    bad[-1] = -1
    np.save(tmp_path / "g" / "indices.npy", bad)
    with pytest.raises(DatasetError, match="position 999 is -1"):
        training.data.validate_dataset(open_dataset(tmp_path / "g", validate=False, verify="none"), chunk=64)


def test_skew_and_info(tmp_path):
    share, gini = skew(np.array([1.0] * 99 + [101.0]))
    assert share == pytest.approx(101 / 200) and 0.4 < gini < 0.6
    # a star: the centre holds half of all endpoints
    n = 200
    with DatasetWriter(tmp_path / "star", num_nodes=n) as w:
        w.write_edges((np.zeros(n - 1, dtype=np.int64), np.arange(1, n)), undirected=True)
    info = dataset_info(open_dataset(tmp_path / "star"))
    assert info.num_edges == 2 * (n - 1) and not info.directed
    assert info.in_degree.max == n - 1 and info.in_degree.median == 1
    assert info.top1pct_endpoint_share == pytest.approx((n - 1 + 1) / (2 * (n - 1)))  # top 2 vertices
    assert info.isolated_nodes == 0 and info.split_sizes == {}
    # directed: endpoints count both ends of each edge
    info = dataset_info(open_dataset(small(tmp_path)))
    assert info.labelled_nodes == 4 and info.split_sizes == {"train": 2, "valid": 1, "test": 1}
    assert info.feature_bytes == 40 and info.graph_bytes == 6 * 8 + 6 * 4


# --- checksums: per-block CRC-32 written by the writer, checked on open -------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from iostack.checksums import BlockSums  # noqa: E402


@pytest.fixture(scope="module")
def many_blocks(tmp_path_factory):
    """A dataset whose features span 626 checksum blocks of 256 bytes."""
    import unittest.mock

    path = tmp_path_factory.mktemp("blocks") / "g"
    with unittest.mock.patch.object(training.data, "CHECKSUM_BLOCK_BYTES", 256), \
            DatasetWriter(path, num_nodes=5000) as w:
        w.write_edges((np.arange(4999), np.arange(1, 5000)))
        w.write_features(np.arange(5000 * 8, dtype=np.float32).reshape(5000, 8))
    return path


# features.npy of many_blocks: rows from byte 4096 (a page-aligned header), the file padded to whole pages
HEADER, DATA = 4096, 5000 * 8 * 4
SIZE = -(-(HEADER + DATA) // 4096) * 4096
BLOCKS = SIZE // 256


def _corrupt_copy(src, dst, offset):
    shutil.copytree(src, dst)
    with open(dst / "features.npy", "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    return dst


def test_a_plain_open_checks_first_last_and_a_sample(many_blocks):
    meta = json.loads((many_blocks / "meta.json").read_text())
    sums = BlockSums.from_json(meta["checksums"]["files"]["features"])
    assert np.load(many_blocks / "features.npy", mmap_mode="r").offset == HEADER
    assert sums.block_bytes == 256 and sums.blocks == BLOCKS
    total = sum(BlockSums.from_json(e).blocks for e in meta["checksums"]["files"].values())
    assert total == BLOCKS + 157 + 79  # features, indptr, indices
    ds = open_dataset(many_blocks)
    assert ds.integrity.startswith(f"CRC-32 verified: {3 * 8} of {total} blocks of 3 file(s)")
    assert "moment data info --verify" in ds.integrity
    assert open_dataset(many_blocks, verify="full").integrity == f"CRC-32 verified: all {total} block(s) of 3 file(s)"


@pytest.mark.parametrize("where", ["first", "last"])
def test_the_first_and_last_blocks_are_always_checked(many_blocks, tmp_path, where):
    size = (many_blocks / "features.npy").stat().st_size
    # block 0 is all header (padded to a page): a flipped byte there is refused by the header's parse
    bad = _corrupt_copy(many_blocks, tmp_path / "g", 200 if where == "first" else size - 1)
    with pytest.raises(DatasetError, match=r"features\.npy: not a readable \.npy file" if where == "first"
                       else rf"features\.npy: block {BLOCKS - 1} of {BLOCKS}"):
        open_dataset(bad)


@settings(max_examples=25, deadline=None)
@given(offset=st.integers(HEADER, HEADER + DATA - 1))  # the data (a bad header is numpy's to refuse)
def test_full_verification_names_the_block_of_any_flipped_byte(many_blocks, tmp_path_factory, offset):
    bad = _corrupt_copy(many_blocks, tmp_path_factory.mktemp("flip") / "g", offset)
    with pytest.raises(DatasetError) as info:
        open_dataset(bad, verify="full")
    a = offset // 256 * 256
    assert f"block {offset // 256} of {BLOCKS} (bytes {a:,} to {min(a + 256, SIZE):,})" in str(info.value)
    open_dataset(bad, verify="none", validate=False)  # nothing checked, nothing refused
    shutil.rmtree(bad.parent)


@given(size=st.integers(0, 10_000), block=st.integers(64, 4096), data=st.data())
def test_block_sums_round_trip_through_json(size, block, data):
    n = -(-size // block)
    crcs = tuple(data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n)))
    sums = BlockSums(size, block, crcs)
    assert BlockSums.from_json(json.loads(json.dumps(sums.to_json()))) == sums


def test_malformed_checksum_tables_are_named(tmp_path):
    path = small(tmp_path)
    meta = json.loads((path / "meta.json").read_text())
    meta["checksums"]["files"]["labels"]["crc32"] = "0123"
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"meta\.json: checksums of labels: .*cut CRC list"):
        open_dataset(path)
    with pytest.raises(DatasetError, match="verify='quick'"):
        open_dataset(path, verify="quick")
