"""The neighbour sampler: real neighbours, no repeats, fan-out bounds, uniformity, PyG layout."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from training.sampler import (
    NeighborSampler,
    SampledBatch,
    SamplerError,
    count_accesses,
    sample_neighbors,
)


def csr_from_edges(num_nodes: int, edges) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR rows = targets, entries = distinct sources (``(src, dst)`` pairs, repeats dropped)."""
    pairs = sorted({(int(d), int(s)) for s, d in edges})
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    for d, _ in pairs:
        indptr[d + 1] += 1
    indptr = torch.cumsum(indptr, 0)
    indices = torch.tensor([s for _, s in pairs], dtype=torch.int32)
    return indptr, indices


def random_graph(num_nodes: int, num_edges: int, seed: int, skew: float = 0.0):
    rng = np.random.default_rng(seed)
    w = np.arange(1, num_nodes + 1, dtype=float) ** -skew
    w /= w.sum()
    src = rng.choice(num_nodes, num_edges, p=w)
    dst = rng.choice(num_nodes, num_edges, p=w)
    return csr_from_edges(num_nodes, zip(src, dst, strict=True))


def neighbours(indptr, indices, v: int) -> list[int]:
    return indices[indptr[v] : indptr[v + 1]].tolist()


def check_batch(batch: SampledBatch, indptr, indices, seeds, fanouts) -> None:
    """Every structural promise of a batch, against the CSR."""
    n_id = batch.n_id
    assert n_id.dtype == torch.int64 and batch.edge_index.dtype == torch.int64
    assert n_id[: batch.batch_size].tolist() == seeds.tolist()
    assert len(set(n_id.tolist())) == n_id.numel(), "n_id has repeats"
    assert sum(batch.num_sampled_nodes) == n_id.numel()
    assert batch.num_sampled_nodes[0] == batch.batch_size
    assert len(batch.num_sampled_edges) == len(fanouts) == batch.num_layers
    assert sum(batch.num_sampled_edges) == batch.num_edges
    src, dst = batch.edge_index
    if batch.num_edges:
        assert int(src.min()) >= 0 and int(src.max()) < n_id.numel()
        assert int(dst.min()) >= 0 and int(dst.max()) < n_id.numel()
    node_ends = np.cumsum(batch.num_sampled_nodes)
    edge_ends = np.concatenate([[0], np.cumsum(batch.num_sampled_edges)])
    for hop, fanout in enumerate(fanouts):
        lo, hi = edge_ends[hop], edge_ends[hop + 1]
        hop_src, hop_dst = src[lo:hi].tolist(), dst[lo:hi].tolist()
        frontier_lo = 0 if hop == 0 else node_ends[hop - 1]
        frontier_hi = node_ends[hop]
        # targets of hop h are exactly the vertices first reached at hop h - 1
        assert all(frontier_lo <= t < frontier_hi for t in hop_dst)
        # sources are vertices known by the end of this hop
        assert all(s < node_ends[hop + 1] for s in hop_src)
        per_target: dict[int, list[int]] = {}
        for s, t in zip(hop_src, hop_dst, strict=True):
            per_target.setdefault(t, []).append(int(n_id[s]))
        for t in range(frontier_lo, frontier_hi):
            v = int(n_id[t])
            real = neighbours(indptr, indices, v)
            got = per_target.get(t, [])
            assert set(got) <= set(real), f"vertex {v}: sampled a non-neighbour"
            assert len(got) == len(set(got)), f"vertex {v}: repeated neighbour"
            if fanout == -1 or len(real) <= fanout:
                assert sorted(got) == sorted(real), f"vertex {v}: neighbourhood not whole"
            else:
                assert len(got) == fanout


@settings(max_examples=60, deadline=None)
@given(
    num_nodes=st.integers(1, 40),
    edges=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 39)), max_size=300),
    fanouts=st.lists(st.sampled_from([-1, 1, 2, 3, 5]), min_size=1, max_size=3),
    num_seeds=st.integers(0, 10),
    seed=st.integers(0, 2**31),
    relabel=st.sampled_from(["map", "unique"]),
)
def test_batches_keep_their_promises_on_random_graphs(num_nodes, edges, fanouts, num_seeds, seed, relabel):
    edges = [(s % num_nodes, d % num_nodes) for s, d in edges]
    indptr, indices = csr_from_edges(num_nodes, edges)
    seeds = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(seed))[:num_seeds]
    sampler = NeighborSampler(indptr, indices, fanouts, seed=seed, relabel=relabel)
    for _ in range(2):  # the second batch reuses the vertex map
        check_batch(sampler.sample(seeds), indptr, indices, seeds, fanouts)


def test_power_law_graph_batches_keep_their_promises():
    # hubs far above the fan-out exercise the rejection path, mid degrees the keyed one
    indptr, indices = random_graph(3000, 40000, seed=1, skew=0.8)
    deg = (indptr[1:] - indptr[:-1]).numpy()
    assert deg.max() > 50 and ((deg > 5) & (deg <= 10)).any()
    seeds = torch.randperm(3000, generator=torch.Generator().manual_seed(2))[:200]
    for relabel in ("map", "unique"):
        sampler = NeighborSampler(indptr, indices, (25, 5), seed=3, relabel=relabel)
        check_batch(sampler.sample(seeds), indptr, indices, seeds, (25, 5))


def test_same_seed_same_batch_and_relabel_modes_agree():
    indptr, indices = random_graph(500, 6000, seed=4, skew=0.7)
    seeds = torch.arange(0, 500, 7)
    a = NeighborSampler(indptr, indices, (10, 5), seed=11).sample(seeds)
    b = NeighborSampler(indptr, indices, (10, 5), seed=11).sample(seeds)
    assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
    c = NeighborSampler(indptr, indices, (10, 5), seed=12).sample(seeds)
    assert not torch.equal(a.edge_index, c.edge_index)
    # relabelling draws no random numbers and both modes number new vertices in order of
    # first appearance: the same batches, on the torch path and the compiled one
    for compiled in (False, True):
        two_map = NeighborSampler(indptr, indices, (10, 5), seed=11, compiled=compiled).sample(seeds)
        two_unique = NeighborSampler(indptr, indices, (10, 5), seed=11, relabel="unique",
                                     compiled=compiled).sample(seeds)
        assert torch.equal(two_map.n_id, two_unique.n_id)
        assert torch.equal(two_map.edge_index, two_unique.edge_index)
    # reseeding restarts the stream
    s = NeighborSampler(indptr, indices, (10, 5), seed=11)
    first = s.sample(seeds)
    s.reseed(11)
    assert torch.equal(s.sample(seeds).edge_index, first.edge_index)


def test_empty_seeds_isolated_vertices_and_all_neighbours():
    indptr, indices = csr_from_edges(5, [(1, 0), (2, 0), (0, 1)])  # 3 and 4 are isolated
    s = NeighborSampler(indptr, indices, (-1, -1), seed=0)
    empty = s.sample(torch.empty(0, dtype=torch.int64))
    assert empty.n_id.numel() == 0 and empty.edge_index.shape == (2, 0)
    assert empty.num_sampled_nodes == (0, 0, 0) and empty.num_sampled_edges == (0, 0)
    lone = s.sample(torch.tensor([3, 4]))
    assert lone.n_id.tolist() == [3, 4] and lone.num_edges == 0
    b = s.sample(torch.tensor([0, 4]))
    assert b.n_id.tolist() == [0, 4, 1, 2]
    assert sorted(map(tuple, b.edge_index.t().tolist())) == [(0, 2), (2, 0), (3, 0)]
    assert b.num_sampled_edges == (2, 1)


def test_with_replacement_draws_exactly_fanout_real_neighbours():
    indptr, indices = random_graph(200, 1500, seed=5)
    nodes = torch.arange(200)
    row, nbr = sample_neighbors(indptr, indices, nodes, 7, replace=True, generator=torch.Generator().manual_seed(0))
    deg = indptr[1:] - indptr[:-1]
    assert torch.equal(torch.bincount(row, minlength=200), torch.where(deg > 0, 7, 0))
    for r, v in zip(row.tolist(), nbr.tolist(), strict=True):
        assert v in neighbours(indptr, indices, r)


@pytest.mark.parametrize(
    "degree, rows_per_call",
    [(6, 60_000), (7, 60_000), (40, 200_000), (6, 2_000)],  # >= 4096 rows: column-wise Floyd
)
def test_subsets_are_uniform(degree, rows_per_call):
    """Each of the C(d, 3) subsets is equally likely (chi-square, fixed seed)."""
    indptr = torch.tensor([0, degree])
    indices = torch.arange(degree)
    rows = 60_000 if degree < 10 else 200_000
    g = torch.Generator().manual_seed(123)
    parts = [
        sample_neighbors(indptr, indices, torch.zeros(rows_per_call, dtype=torch.int64), 3, generator=g)
        for _ in range(rows // rows_per_call)
    ]
    row = torch.cat([r for r, _ in parts])
    nbr = torch.cat([n for _, n in parts])
    assert torch.equal(
        torch.bincount(row, minlength=rows_per_call), torch.full((rows_per_call,), 3 * (rows // rows_per_call))
    )
    picks = nbr.view(rows, 3).sort(dim=1).values
    assert bool((picks[:, 0] < picks[:, 1]).all() and (picks[:, 1] < picks[:, 2]).all())
    if degree < 10:
        counts = Counter(map(tuple, picks.tolist()))
        observed = [counts.get(c, 0) for c in itertools.combinations(range(degree), 3)]
    else:  # too many subsets for a table: check inclusion frequencies instead
        observed = torch.bincount(picks.view(-1), minlength=degree).tolist()
    assert chisquare(observed).pvalue > 1e-3


@pytest.mark.parametrize("rows", [300, 5000])  # the matrix and the column-wise repeat checks
def test_floyd_subsets_are_floyds_own_picks(rows):
    """The batched draws pick exactly what Floyd's algorithm, row by row, picks from the same uniforms."""
    from training.sampler import _subset_floyd

    k = 10
    deg = torch.randint(k + 1, 40, (rows,), generator=torch.Generator().manual_seed(3))
    got = _subset_floyd(deg, k, torch.Generator().manual_seed(9))
    u = torch.rand((k, rows), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    for r in range(rows):
        chosen: list[int] = []
        for i in range(k):
            j = int(deg[r]) - k + i
            t = int(float(u[i, r]) * (j + 1))
            chosen.append(j if t in chosen else t)
        assert got[r].tolist() == chosen


def test_pyg_convs_on_full_fanout_equal_the_full_graph():
    from torch_geometric.nn import GCNConv, SAGEConv
    from torch_geometric.utils import trim_to_layer

    indptr, indices = random_graph(300, 2500, seed=6, skew=0.5)
    full_edges = torch.stack(
        [indices.to(torch.int64), torch.repeat_interleave(torch.arange(300), indptr[1:] - indptr[:-1])]
    )
    torch.manual_seed(0)
    x = torch.randn(300, 16)
    for conv in (SAGEConv, GCNConv):
        kwargs = {"add_self_loops": False, "normalize": False} if conv is GCNConv else {}
        layers = [conv(16, 32, **kwargs), conv(32, 8, **kwargs)]

        def model(h, edge_index, per_layer=None, batch=None, layers=layers):
            for i, layer in enumerate(layers):
                if batch is not None:  # PyG's HGAM trimming from the per-hop counts
                    h, edge_index, _ = trim_to_layer(
                        i, list(batch.num_sampled_nodes), list(batch.num_sampled_edges), h, edge_index
                    )
                ei = per_layer[i] if per_layer is not None else edge_index
                h = layer(h, ei)
                h = h.relu() if i == 0 else h
            return h

        seeds = torch.tensor([5, 17, 42, 99, 250])
        batch = NeighborSampler(indptr, indices, (-1, -1), seed=0).sample(seeds)
        with torch.no_grad():
            expected = model(x, full_edges)[seeds]
            plain = model(x[batch.n_id], batch.edge_index)[: batch.batch_size]
            layered = model(x[batch.n_id], None, per_layer=batch.edge_index_per_layer)[: batch.batch_size]
            trimmed = model(x[batch.n_id], batch.edge_index, batch=batch)[: batch.batch_size]
        torch.testing.assert_close(plain, expected)
        torch.testing.assert_close(layered, expected)
        torch.testing.assert_close(trimmed, expected)


def test_edge_index_per_layer_are_hop_prefixes():
    indptr, indices = random_graph(400, 4000, seed=7, skew=0.6)
    b = NeighborSampler(indptr, indices, (4, 3, 2), seed=0).sample(torch.arange(10))
    per_layer = b.edge_index_per_layer
    ends = np.cumsum(b.num_sampled_edges)
    assert [e.shape[1] for e in per_layer] == [ends[2], ends[1], ends[0]]
    assert torch.equal(per_layer[-1], b.edge_index[:, : b.num_sampled_edges[0]])
    assert b.nbytes == 8 * (b.n_id.numel() + 2 * b.num_edges)


class Recording:
    """Delegates to a sampler and records the size of every batch's n_id."""

    def __init__(self, sampler):
        self.sampler, self.sizes = sampler, []
        self.num_nodes, self.device = sampler.num_nodes, sampler.device

    def sample(self, seeds):
        batch = self.sampler.sample(seeds)
        self.sizes.append(batch.num_nodes)
        return batch


def test_count_accesses_totals_and_epochs():
    indptr, indices = random_graph(1000, 9000, seed=8, skew=0.8)
    train = torch.arange(0, 1000, 3)  # 334 seeds -> 4 batches of 100 per epoch
    rec = Recording(NeighborSampler(indptr, indices, (5, 3), seed=0))
    seen = []
    counts = count_accesses(rec, train, 100, epochs=2, progress=lambda d, t: seen.append((d, t)))
    assert counts.dtype == torch.int64 and counts.shape == (1000,)
    assert len(rec.sizes) == 8 and seen[-1] == (8, 8)
    assert int(counts.sum()) == sum(rec.sizes)
    assert bool((counts[train] >= 2).all()), "every seed is read once per epoch"
    rec2 = Recording(NeighborSampler(indptr, indices, (5, 3), seed=0))
    assert int(count_accesses(rec2, train, 100, num_batches=3).sum()) == sum(rec2.sizes)
    assert len(rec2.sizes) == 3
    # the same seeds give the same counts
    again = count_accesses(NeighborSampler(indptr, indices, (5, 3), seed=0), train, 100, epochs=2)
    assert torch.equal(again, counts)
    assert int(count_accesses(rec, train[:0], 100, epochs=3).sum()) == 0


def test_numpy_and_memory_mapped_csr(tmp_path):
    indptr, indices = random_graph(100, 600, seed=9)
    np.save(tmp_path / "indptr.npy", indptr.numpy())
    np.save(tmp_path / "indices.npy", indices.numpy())
    s = NeighborSampler(
        np.load(tmp_path / "indptr.npy", mmap_mode="r"),
        np.load(tmp_path / "indices.npy", mmap_mode="r"),
        (3, 2),
        seed=0,
    )
    seeds = torch.tensor([1, 2, 3])
    check_batch(s.sample(seeds.numpy()), indptr, indices, seeds, (3, 2))


@pytest.mark.parametrize(
    "kwargs, seeds, message",
    [
        ({"fanouts": (0,)}, [0], "fanouts"),
        ({"fanouts": ()}, [0], "fanouts"),
        ({"fanouts": (-2,)}, [0], "fanouts"),
        ({"relabel": "hash"}, [0], "relabel"),
        ({}, [0, 9], r"\[0, 4\)"),
        ({}, [-1], r"\[0, 4\)"),
        ({}, [1, 1], "repeated"),
        ({"relabel": "unique"}, [2, 2], "repeated"),
    ],
)
def test_bad_input_is_named(kwargs, seeds, message):
    indptr, indices = csr_from_edges(4, [(0, 1), (1, 2)])
    with pytest.raises(SamplerError, match=message):
        NeighborSampler(indptr, indices, **kwargs).sample(torch.tensor(seeds))


def test_malformed_csr_is_named():
    with pytest.raises(SamplerError, match="indptr"):
        NeighborSampler(torch.tensor([0, 2, 5]), torch.tensor([0, 1, 0]))
    with pytest.raises(SamplerError, match="integer"):
        NeighborSampler(np.array([0.0, 1.0]), np.array([0]))
    # a sampler that refused a batch is still good for the next one
    indptr, indices = csr_from_edges(4, [(0, 1), (1, 2)])
    s = NeighborSampler(indptr, indices, (2,), seed=0)
    with pytest.raises(SamplerError):
        s.sample(torch.tensor([1, 1]))
    check_batch(s.sample(torch.tensor([1, 2])), indptr, indices, torch.tensor([1, 2]), (2,))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_the_promises():
    indptr, indices = random_graph(2000, 20000, seed=10, skew=0.8)
    s = NeighborSampler(indptr.cuda(), indices.cuda(), (25, 10), seed=0)
    seeds = torch.arange(0, 2000, 9)
    b = s.sample(seeds.cuda())
    assert b.n_id.is_cuda
    check_batch(b.to("cpu"), indptr, indices, seeds, (25, 10))


def test_vertex_map_survives_stamp_wraparound():
    from training import sampler as module

    indptr, indices = random_graph(300, 3000, seed=12, skew=0.6)
    s = NeighborSampler(indptr, indices, (4, 3), seed=0)
    seeds = torch.arange(0, 300, 11)
    s.sample(seeds)
    s._stamp = module._MAX_STAMP - 1  # the next batch takes the last stamp, the one after refills
    for _ in range(3):
        check_batch(s.sample(seeds), indptr, indices, seeds, (4, 3))
    assert s._stamp == 2


def test_num_threads_is_scoped_to_the_batch():
    indptr, indices = random_graph(200, 2000, seed=13)
    before = torch.get_num_threads()
    s = NeighborSampler(indptr, indices, (3, 2), seed=0, num_threads=1)
    seeds = torch.tensor([4, 5, 6])
    check_batch(s.sample(seeds), indptr, indices, seeds, (3, 2))
    assert torch.get_num_threads() == before
    with pytest.raises(SamplerError, match="num_threads"):
        NeighborSampler(indptr, indices, (3,), num_threads=0)


def test_unchecked_sampling_is_the_same_and_sources_check_once():
    """``check=False`` (what LocalBatchSource passes per batch) changes nothing but the checks."""
    from training.batches import LocalBatchSource

    indptr = torch.tensor([0, 2, 4, 6, 6])
    indices = torch.tensor([1, 2, 0, 2, 0, 1])
    for relabel in ("map", "unique"):
        a = NeighborSampler(indptr, indices, (1, -1), seed=0, relabel=relabel).sample(torch.tensor([2, 0]))
        b = NeighborSampler(indptr, indices, (1, -1), seed=0, relabel=relabel).sample(torch.tensor([2, 0]),
                                                                                      check=False)
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
    s = NeighborSampler(indptr, indices, (1,), seed=0)
    with pytest.raises(SamplerError, match="repeated"):
        LocalBatchSource(s, torch.tensor([0, 1, 1]), batch_size=2)
    with pytest.raises(SamplerError, match=r"\[0, 4\)"):
        LocalBatchSource(s, torch.tensor([0, 7]), batch_size=2)
