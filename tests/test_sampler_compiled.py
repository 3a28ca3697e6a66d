"""The sampler's compiled path (training.compiled_sampler) gives the torch path's batches, at any thread count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_sampler import check_batch, csr_from_edges, random_graph
from training import compiled_sampler
from training.sampler import NeighborSampler

pytestmark = pytest.mark.skipif(not compiled_sampler.available(), reason="numba is not importable")


def same(a, b) -> bool:
    return (torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
            and a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges)


@settings(max_examples=80, deadline=None)
@given(
    num_nodes=st.integers(1, 60),
    edges=st.lists(st.tuples(st.integers(0, 59), st.integers(0, 59)), max_size=400),
    fanouts=st.lists(st.sampled_from([-1, 1, 2, 3, 7]), min_size=1, max_size=3),
    num_seeds=st.integers(0, 15),
    seed=st.integers(0, 2**31),
    relabel=st.sampled_from(["map", "unique"]),
    replace=st.booleans(),
    threads=st.sampled_from([1, 2, 3]),
)
def test_compiled_batches_are_the_torch_batches(num_nodes, edges, fanouts, num_seeds, seed, relabel, replace,
                                                threads):
    edges = [(s % num_nodes, d % num_nodes) for s, d in edges]
    indptr, indices = csr_from_edges(num_nodes, edges)
    seeds = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(seed))[:num_seeds]
    kw = {"seed": seed, "relabel": relabel, "replace": replace, "num_threads": threads}
    fast = NeighborSampler(indptr, indices, fanouts, **kw)
    slow = NeighborSampler(indptr, indices, fanouts, compiled=False, **kw)
    for _ in range(3):  # later batches reuse the vertex map / the hash table
        a, b = fast.sample(seeds), slow.sample(seeds)
        assert same(a, b)
        if not replace:  # every edge real, min(degree, fan-out) per vertex, ids consistent
            check_batch(a, indptr, indices, seeds, fanouts)


@pytest.mark.parametrize("relabel", ["map", "unique"])
def test_thread_count_does_not_change_a_batch(relabel):
    # hubs far above the fan-out (Floyd's draws), degrees below it (whole lists), many repeats
    indptr, indices = random_graph(3000, 40000, seed=1, skew=0.8)
    seeds = torch.randperm(3000, generator=torch.Generator().manual_seed(2))
    spans = [slice(0, 50), slice(50, 1050), slice(1050, 1060), slice(0, 3000)]
    batches = {}
    for threads in (1, 2, 4):
        s = NeighborSampler(indptr, indices, (25, 10), seed=3, relabel=relabel, num_threads=threads)
        # batches of different sizes: the unique mode's table grows, its epochs advance
        batches[threads] = [s.sample(seeds[span]) for span in spans]
    ref = NeighborSampler(indptr, indices, (25, 10), seed=3, relabel=relabel, compiled=False)
    for span, b in zip(spans, batches[1], strict=True):
        assert same(b, ref.sample(seeds[span]))
        check_batch(b, indptr, indices, seeds[span], (25, 10))
    assert all(same(b, c) for t in (2, 4) for b, c in zip(batches[1], batches[t], strict=True))


def test_relabel_modes_give_the_same_batches_and_threads_may_change_between_batches():
    indptr, indices = random_graph(800, 9000, seed=5, skew=0.6)
    seeds = torch.arange(0, 800, 3)
    m = NeighborSampler(indptr, indices, (10, 5, 3), seed=9, relabel="map")
    u = NeighborSampler(indptr, indices, (10, 5, 3), seed=9, relabel="unique")
    for threads in (1, 2, 1, 3):
        m.num_threads = u.num_threads = threads
        assert same(m.sample(seeds), u.sample(seeds))


def test_int64_and_read_only_memory_mapped_csr(tmp_path):
    indptr, indices = random_graph(400, 5000, seed=6, skew=0.5)
    np.save(tmp_path / "indptr.npy", indptr.numpy())
    np.save(tmp_path / "indices.npy", indices.numpy().astype(np.int64))
    mm = NeighborSampler(np.load(tmp_path / "indptr.npy", mmap_mode="r"),
                         np.load(tmp_path / "indices.npy", mmap_mode="r"), (8, 4), seed=1)
    ref = NeighborSampler(indptr, indices, (8, 4), seed=1, compiled=False)
    seeds = torch.arange(0, 400, 5)
    assert same(mm.sample(seeds), ref.sample(seeds))


def test_isolated_seeds_and_empty_batches():
    indptr, indices = csr_from_edges(5, [(1, 0), (2, 0), (0, 1)])
    for relabel in ("map", "unique"):
        s = NeighborSampler(indptr, indices, (2, -1), seed=0, relabel=relabel, num_threads=2)
        assert s.sample(torch.tensor([], dtype=torch.int64)).num_nodes == 0
        b = s.sample(torch.tensor([3, 4]))
        assert b.num_edges == 0 and b.n_id.tolist() == [3, 4]


def test_a_forked_child_samples_with_threads_of_its_own():
    # the parent's pool threads do not survive fork: the child must start its own, not wait forever
    import multiprocessing as mp

    indptr, indices = random_graph(500, 6000, seed=7, skew=0.5)
    s = NeighborSampler(indptr, indices, (5, 3), seed=2, num_threads=2)
    want = s.sample(torch.arange(0, 500, 4))
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_sample_in_child, (indptr, indices)).get(timeout=120)
    assert torch.equal(got, want.edge_index)


def _sample_in_child(indptr, indices):
    s = NeighborSampler(indptr, indices, (5, 3), seed=2, num_threads=2)
    return s.sample(torch.arange(0, 500, 4)).edge_index


@pytest.mark.parametrize("relabel", ["map", "unique"])
@pytest.mark.parametrize(("chunk_rows", "parallel_from"), [(3, 3), (64, 2)])
def test_chunked_pipeline_and_parallel_relabel_at_two_threads(monkeypatch, relabel, chunk_rows, parallel_from):
    # tiny chunks: the relabelling thread waits on, and fills, many chunks behind its helper;
    # parallel_from=2: the atomic-min relabelling in parts runs at 2 threads as well
    monkeypatch.setattr(compiled_sampler, "_CHUNK_ROWS", chunk_rows)
    monkeypatch.setattr(compiled_sampler, "PARALLEL_RELABEL_THREADS", parallel_from)
    indptr, indices = random_graph(2000, 30000, seed=11, skew=0.8)
    seeds = torch.randperm(2000, generator=torch.Generator().manual_seed(4))
    ref = NeighborSampler(indptr, indices, (10, 5), seed=8, relabel=relabel, compiled=False)
    two = NeighborSampler(indptr, indices, (10, 5), seed=8, relabel=relabel, num_threads=2)
    for span in (slice(0, 300), slice(300, 310), slice(0, 2000)):
        assert same(two.sample(seeds[span]), ref.sample(seeds[span]))


def test_hash_table_epochs_run_out_and_start_again(monkeypatch):
    # when the epoch tags run out the table is replaced; stale entries must never match
    monkeypatch.setattr(compiled_sampler, "_MAX_EPOCH", 3)
    indptr, indices = random_graph(500, 6000, seed=12, skew=0.6)
    seeds = torch.arange(0, 500, 7)
    ref = NeighborSampler(indptr, indices, (6, 3), seed=1, relabel="unique", compiled=False)
    for threads in (1, 2, 3):
        fast = NeighborSampler(indptr, indices, (6, 3), seed=1, relabel="unique", num_threads=threads)
        ref.reseed(1)
        for _ in range(5):
            assert same(fast.sample(seeds), ref.sample(seeds))
