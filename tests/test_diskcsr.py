"""training.diskcsr: sampling from a CSR whose neighbour lists are read from disk gives the in-memory batches."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iostack.backends.posix import PosixBackend, probe_direct
from moment.cli import main
from tests.conftest import graph_fixture
from training.batches import LocalBatchSource
from training.data import open_dataset
from training.diskcsr import DiskCsrError, DiskNeighbours, hot_vertices, open_disk_csr
from training.importers import import_dataset
from training.sampler import NeighborSampler, SamplerError


def _graph(rng: np.random.Generator, n: int, max_deg: int) -> tuple[np.ndarray, np.ndarray]:
    """A random CSR: skewed degrees (a few vertices of ``max_deg``), some isolated vertices."""
    deg = np.minimum(rng.zipf(1.6, n) - 1, max_deg)
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    indices = rng.integers(0, n, int(indptr[-1])).astype(np.int32)
    return indptr, indices


def _assert_same_batches(a: LocalBatchSource, b: LocalBatchSource, epoch: int = 0) -> tuple[int, int]:
    """Every batch of ``epoch`` equal; returns (batches, sampled edges)."""
    steps = edges = 0
    for x, y in zip(a.batches(epoch), b.batches(epoch), strict=True):
        assert torch.equal(x.n_id, y.n_id)
        assert torch.equal(x.edge_index, y.edge_index)
        assert (x.batch_size, x.num_sampled_nodes, x.num_sampled_edges) == (
            y.batch_size, y.num_sampled_nodes, y.num_sampled_edges)
        steps, edges = steps + 1, edges + x.num_edges
    return steps, edges


def _sources(indptr, indices, disk, train, fanouts, batch, replace=False, seed=7):
    # one intra-op thread: tiny batches on a shared 2-core machine run several times faster
    mem = NeighborSampler(indptr, indices, fanouts, replace=replace, num_threads=1)
    dsk = NeighborSampler(torch.from_numpy(indptr), disk, fanouts, replace=replace, num_threads=1)
    return (LocalBatchSource(mem, train, batch, seed=seed), LocalBatchSource(dsk, train, batch, seed=seed))


@pytest.fixture(scope="module")
def big_graph(tmp_path_factory):
    """60,000 edges of int32: ~59 pages of indices, lists from 0 to 3,000 neighbours."""
    rng = np.random.default_rng(1)
    indptr, indices = _graph(rng, 4000, 3000)
    path = tmp_path_factory.mktemp("diskcsr") / "indices.npy"
    np.save(path, indices)
    return indptr, indices, path


@pytest.mark.parametrize("cache_bytes", [0, 20_000], ids=["no_cache", "cache"])
@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
def test_disk_batches_equal_memory_batches(big_graph, direct, cache_bytes):
    indptr, indices, path = big_graph
    if direct:
        ok, why = probe_direct(str(path))
        if not ok:
            pytest.skip(f"the temporary directory's file system refuses O_DIRECT: {why}")
    train = np.random.default_rng(2).choice(indptr.size - 1, 600, replace=False)
    with DiskNeighbours(path, indptr, PosixBackend(processes=0, direct=direct), cache_bytes=cache_bytes,
                        max_buffer_bytes=8 * 4096) as disk:
        assert disk.direct is direct
        mem_src, disk_src = _sources(indptr, indices, disk, train, (8, 4, 3), 64)
        assert _assert_same_batches(mem_src, disk_src)[0] == 10
        s = disk.stats()
        assert s.edges > 0 and s.pages > 0 and s.bytes_read == s.pages * 4096
        assert s.requests <= s.pages
        if cache_bytes:
            assert 0 < disk.cache.values.nbytes <= cache_bytes and s.cached_edges > 0
            np.testing.assert_array_equal(  # the cache holds exactly the chosen vertices' lists
                disk.cache.values, np.concatenate([indices[indptr[v]:indptr[v + 1]] for v in disk.cache.vertices]))
        else:
            assert s.cached_edges == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), n=st.integers(1, 300), max_deg=st.integers(0, 2500),
       fanouts=st.lists(st.sampled_from([-1, 1, 2, 5, 30]), min_size=1, max_size=3), replace=st.booleans(),
       cache_items=st.integers(0, 4000), batch=st.integers(4, 50), buffer_pages=st.integers(1, 3),
       gap=st.integers(0, 8))
def test_property_disk_and_memory_sample_alike(tmp_path, seed, n, max_deg, fanouts, replace, cache_items, batch,
                                               buffer_pages, gap):
    rng = np.random.default_rng(seed)
    indptr, indices = _graph(rng, n, max_deg)
    path = tmp_path / f"indices-{seed}-{n}.npy"
    np.save(path, indices)
    train = rng.permutation(n)[: max(1, n // 2)]
    with DiskNeighbours(path, indptr, PosixBackend(processes=0, threads=2), cache_bytes=cache_items * 4,
                        max_buffer_bytes=buffer_pages * 4096, max_gap_pages=gap) as disk:
        mem_src, disk_src = _sources(indptr, indices, disk, train, tuple(fanouts), batch, replace, seed % 1000)
        edges = sum(_assert_same_batches(mem_src, disk_src, epoch)[1] for epoch in (0, 1))
        s = disk.stats()
        assert s.edges == edges  # every sampled edge was looked up once: from the cache or a page read
        assert s.cached_edges <= edges and (s.pages > 0) == (s.edges > s.cached_edges)


def _greedy_reference(indptr: np.ndarray, budget: int, itemsize: int) -> list[int]:
    """hot_vertices's rule, one vertex at a time: by degree descending, then id; take what still fits."""
    deg = np.diff(indptr)
    left, out = budget, []
    for v in sorted(range(deg.size), key=lambda v: (-deg[v], v)):
        if 0 < deg[v] * itemsize <= left:
            out.append(v)
            left -= deg[v] * itemsize
    return sorted(out)


@settings(max_examples=60, deadline=None)
@given(degs=st.lists(st.integers(0, 40), min_size=1, max_size=120), budget=st.integers(0, 2000),
       chunk=st.integers(1, 50), itemsize=st.sampled_from([4, 8]))
def test_hot_vertices_is_the_greedy_by_degree(degs, budget, chunk, itemsize):
    indptr = np.concatenate([[0], np.cumsum(degs)]).astype(np.int64)
    got = hot_vertices(indptr, budget, itemsize, chunk=chunk)
    assert got.tolist() == _greedy_reference(indptr, budget, itemsize)
    assert int(np.diff(indptr)[got].sum()) * itemsize <= budget


def test_bad_inputs_are_one_line_errors(big_graph, tmp_path):
    indptr, indices, path = big_graph
    with pytest.raises(DiskCsrError, match="shape"):
        DiskNeighbours(path, indptr[:-1], PosixBackend(processes=0, threads=1))
    np.save(tmp_path / "f.npy", indices.astype(np.float32))
    with pytest.raises(DiskCsrError, match="int32/int64"):
        DiskNeighbours(tmp_path / "f.npy", indptr, PosixBackend(processes=0, threads=1))
    (tmp_path / "junk.npy").write_bytes(b"not an array")
    with pytest.raises(DiskCsrError, match="not a readable .npy"):
        DiskNeighbours(tmp_path / "junk.npy", indptr, PosixBackend(processes=0, threads=1))
    with pytest.raises(DiskCsrError, match="budget"):
        hot_vertices(indptr, -1, 4)
    with DiskNeighbours(path, indptr, PosixBackend(processes=0, threads=1)) as disk:
        with pytest.raises(DiskCsrError, match="edge position"):
            disk.take(torch.tensor([indices.size]))
        with pytest.raises(SamplerError, match="len\\(indices\\)"):
            NeighborSampler(torch.from_numpy(indptr[:-1].copy()), disk, (2,))


# ----------------------------------------------------------------------------------------------
# moment train --graph-on disk


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


def test_open_disk_csr_on_a_dataset(cora):
    ds = open_dataset(cora)
    indptr, disk = open_disk_csr(ds, cache_bytes=4096)
    with disk:
        assert torch.equal(indptr, torch.from_numpy(np.asarray(ds.indptr)))
        pos = torch.arange(0, ds.num_edges, 7)
        assert torch.equal(disk.take(pos), torch.from_numpy(np.asarray(ds.indices))[pos])
        assert "adjacency cache" in disk.describe()


def test_cli_graph_on_disk_trains_like_memory(cora, tmp_path, capsys):
    runs = {}
    for where in ("memory", "disk"):
        metrics = tmp_path / f"{where}.jsonl"
        rc = main(["train", "--dataset", str(cora), "--fanouts", "5,5", "--batch-size", "35", "--epochs", "1",
                   "--hidden", "16", "--seed", "3", "--prefetch", "1", "--metrics", str(metrics),
                   "--graph-on", where, "--graph-cache", "8KiB"])
        assert rc == 0
        err = capsys.readouterr().err
        recs = [json.loads(line) for line in metrics.read_text().splitlines()]
        runs[where] = [r["loss"] for r in recs if r["kind"] == "step"]
        if where == "disk":
            assert "lists are read from disk" in err and "adjacency cache 8 KiB" in err
    assert len(runs["disk"]) == 4
    assert runs["disk"] == runs["memory"]  # the same batches, the same seeds: the same steps


@pytest.mark.parametrize("extra", [["--server", "localhost:1"], ["--sample-on", "gpu"]], ids=["server", "gpu"])
def test_cli_graph_on_disk_refuses_other_samplers_in_one_line(cora, capsys, extra):
    assert main(["train", "--dataset", str(cora), "--graph-on", "disk", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--graph-on 'disk'" in err and extra[0] in err


def test_csr_on_refuses_an_unknown_place(cora):
    from training.errors import TrainError
    from training.pipeline import csr_on

    with pytest.raises(TrainError, match="graph_on"):
        csr_on(open_dataset(cora), torch.device("cpu"), "tape")
