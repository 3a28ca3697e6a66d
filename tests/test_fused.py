"""Fused sampling (training.fused): several batches in one pass, each bit-identical to sampling it alone."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training import fused
from training.fused import FusedSampler
from training.sampler import NeighborSampler, SamplerError


def power_law_csr(num_nodes: int, num_edges: int, seed: int, index_dtype=torch.int32):
    """A skewed CSR (a few hubs, many low-degree and isolated vertices): every sampler branch is taken."""
    rng = np.random.default_rng(seed)
    src = np.minimum((rng.pareto(1.2, num_edges) * 3).astype(np.int64), num_nodes - 1)
    dst = rng.integers(0, num_nodes, num_edges)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(num_nodes + 1, np.int64)
    np.add.at(indptr, dst + 1, 1)
    return torch.from_numpy(np.cumsum(indptr)), torch.from_numpy(src[order]).to(index_dtype)


def alone(sampler: NeighborSampler, seeds: torch.Tensor, rng_seed: int):
    sampler.reseed(rng_seed)
    return sampler.sample(seeds)


def assert_same(got, want) -> None:
    assert torch.equal(got.n_id, want.n_id)
    assert torch.equal(got.edge_index, want.edge_index)
    assert got.batch_size == want.batch_size
    assert (got.num_sampled_nodes, got.num_sampled_edges) == (want.num_sampled_nodes, want.num_sampled_edges)


def test_docstring_example():
    assert doctest.testmod(fused).failed == 0


@settings(max_examples=40, deadline=None)
@given(num_nodes=st.sampled_from([30, 400, 3000]), fanouts=st.lists(st.sampled_from([-1, 1, 3, 25]), min_size=1,
                                                                     max_size=3),
       replace=st.booleans(), index64=st.booleans(), max_lanes=st.integers(1, 4), graph_seed=st.integers(0, 5),
       sizes=st.lists(st.sampled_from([0, 1, 5, 60, 700]), min_size=1, max_size=6), rng=st.integers(0, 2**40))
def test_every_lane_is_the_batch_sampled_alone(num_nodes, fanouts, replace, index64, max_lanes, graph_seed, sizes,
                                               rng):
    indptr, indices = power_law_csr(num_nodes, num_nodes * 6, graph_seed,
                                    torch.int64 if index64 else torch.int32)
    gen = torch.Generator().manual_seed(graph_seed)
    seeds = [torch.randperm(num_nodes, generator=gen)[:min(k, num_nodes)] for k in sizes]
    rng_seeds = [rng + i for i in range(len(seeds))]
    sampler = NeighborSampler(indptr, indices, fanouts, replace=replace)
    f = FusedSampler(NeighborSampler(indptr, indices, fanouts, replace=replace, compiled=False), max_lanes)
    for _ in range(2):  # the second pass reuses the lanes' maps (stamped, never reset)
        got = f.sample(seeds, rng_seeds)
        assert len(got) == len(seeds)
        for g, x, r in zip(got, seeds, rng_seeds, strict=True):
            assert_same(g, alone(sampler, x, r))


def test_overlapping_lanes_keep_their_own_local_ids():
    """The same seeds in two lanes (every vertex in both): each lane numbers them itself."""
    indptr, indices = power_law_csr(500, 5000, 1)
    seeds = torch.arange(0, 500, 3)
    sampler = NeighborSampler(indptr, indices, (10, 5))
    a, b = FusedSampler(NeighborSampler(indptr, indices, (10, 5), compiled=False), 2).sample([seeds, seeds], [7, 8])
    assert_same(a, alone(sampler, seeds, 7))
    assert_same(b, alone(sampler, seeds, 8))
    assert not torch.equal(a.edge_index, b.edge_index)  # different draws, same vertex numbering rules


def test_batches_are_laid_into_the_destinations_given():
    indptr, indices = power_law_csr(400, 4000, 2)
    seeds = [torch.arange(0, 40), torch.arange(100, 110), torch.arange(200, 260)]
    for compiled in (False, True):  # a fused torch pass, or the compiled sampler's batches one at a time
        _laid_into_destinations(FusedSampler(NeighborSampler(indptr, indices, (5, 3), compiled=compiled), 3),
                                indptr, indices, seeds)


def _laid_into_destinations(f, indptr, indices, seeds):
    buffers = [torch.full((1 << 16,), -1, dtype=torch.int64), None, torch.full((1 << 16,), -1, dtype=torch.int64)]
    asked = []

    def out(i, words):
        asked.append((i, words))
        return None if buffers[i] is None else buffers[i][:words]

    got = f.sample(seeds, [1, 2, 3], out=out)
    sampler = NeighborSampler(indptr, indices, (5, 3))
    for i, (g, x) in enumerate(zip(got, seeds, strict=True)):
        assert_same(g, alone(sampler, x, i + 1))
        words = g.num_nodes + 2 * g.num_edges
        assert (i, words) in asked
        if buffers[i] is not None:  # views of the buffer, no copy: n_id then edge_index, row-major
            assert g.n_id.data_ptr() == buffers[i].data_ptr()
            assert torch.equal(buffers[i][:words], torch.cat([g.n_id, g.edge_index.reshape(-1)]))
            assert int(buffers[i][words]) == -1  # nothing written past the batch


def test_more_batches_than_lanes_go_in_passes_and_unique_relabel_goes_alone():
    indptr, indices = power_law_csr(300, 3000, 3)
    seeds = [torch.arange(i * 20, i * 20 + 15) for i in range(7)]
    for relabel in ("map", "unique"):
        sampler = NeighborSampler(indptr, indices, (4, 4), relabel=relabel)
        f = FusedSampler(NeighborSampler(indptr, indices, (4, 4), relabel=relabel, compiled=False), 3)
        got = f.sample(seeds[:1], [0]) + f.sample(seeds[1:], range(1, 7))  # the map grows from 1 lane to 3
        for i, (g, x) in enumerate(zip(got, seeds, strict=True)):
            assert_same(g, alone(sampler, x, i))


def test_lanes_are_bounded_by_the_map_budget_and_inputs_are_checked():
    indptr, indices = power_law_csr(1000, 5000, 4)
    s = NeighborSampler(indptr, indices, (2,))
    assert FusedSampler(s, 8, map_bytes=3 * 8 * 1000).max_lanes == 3
    assert FusedSampler(s, 8, map_bytes=10).max_lanes == 1  # never below one lane
    with pytest.raises(SamplerError, match="max_lanes: expected a positive integer, got 0"):
        FusedSampler(s, 0)
    with pytest.raises(SamplerError, match="one seed per batch, got 2 and 1"):
        FusedSampler(s, 2).sample([torch.arange(3), torch.arange(3)], [1])


def test_threads_are_restored():
    indptr, indices = power_law_csr(100, 500, 5)
    before = torch.get_num_threads()
    FusedSampler(NeighborSampler(indptr, indices, (2,), num_threads=1), 2).sample([torch.arange(5)] * 2, [1, 2])
    assert torch.get_num_threads() == before
