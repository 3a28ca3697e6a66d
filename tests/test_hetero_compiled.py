"""The typed sampler's compiled path gives the torch path's batches, tensor for tensor, for the same seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training.compiled_sampler import available
from training.hetero.graph import add_reverse
from training.hetero.sampler import HeteroNeighborSampler
from training.hetero.store import open_hetero, write_hetero
from training.hetero.synth import synth_mag

pytestmark = pytest.mark.skipif(not available(), reason="numba is not importable")


@pytest.fixture(scope="module")
def hd(tmp_path_factory):
    g = add_reverse(synth_mag(papers=300, authors=120, institutions=7, fields=12))
    return open_hetero(write_hetero(tmp_path_factory.mktemp("c") / "mag", g))


def _same(a, b) -> None:
    assert a.n_id.keys() == b.n_id.keys() and a.edge_index.keys() == b.edge_index.keys()
    for t in a.n_id:
        assert a.n_id[t].dtype == b.n_id[t].dtype == torch.int64 and torch.equal(a.n_id[t], b.n_id[t]), t
    for k in a.edge_index:
        assert a.edge_index[k].dtype == b.edge_index[k].dtype and torch.equal(a.edge_index[k], b.edge_index[k]), k
    assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), fanouts=st.lists(st.sampled_from([-1, 0, 1, 2, 3, 5, 8]), min_size=1, max_size=3),
       k=st.integers(1, 40), seed_type=st.sampled_from(["paper", "author", "institution"]))
def test_compiled_batches_equal_the_torch_path(hd, seed, fanouts, k, seed_type):
    compiled = HeteroNeighborSampler(hd, fanouts, seed=seed)
    torch_path = HeteroNeighborSampler(hd, fanouts, seed=seed, compiled=False)
    assert compiled._typed is not None and torch_path._typed is None
    n = hd.schema.node_type(seed_type).count
    rng = np.random.default_rng(seed)
    for _ in range(3):  # consecutive batches: the generator's state and the position map carry over
        seeds = rng.choice(n, size=min(k, n), replace=False)
        _same(compiled.sample(seed_type, seeds), torch_path.sample(seed_type, seeds))


def test_per_relation_fanouts_and_the_map_reset(hd):
    fan = {key: [2, 1] if key[1].startswith("rev_") else [4, -1] for key in [r.key for r in hd.schema.relations]}
    a, b = HeteroNeighborSampler(hd, fan, seed=5), HeteroNeighborSampler(hd, fan, seed=5, compiled=False)
    for i in range(4):
        s = torch.arange(i * 30, i * 30 + 30)
        _same(a.sample("paper", s), b.sample("paper", s))
    assert (a._typed.pos == -1).all()  # the position map is reset after every batch


def test_repeated_seeds_are_refused_on_both_paths_and_leave_the_map_clean(hd):
    from training.sampler import SamplerError

    for compiled in (True, False):
        s = HeteroNeighborSampler(hd, [3], seed=0, compiled=compiled)
        with pytest.raises(SamplerError, match="repeat a node"):
            s.sample("author", [4, 7, 4])
        if compiled:
            assert (s._typed.pos == -1).all()
        assert s.sample("author", [4, 7]).n_id["author"][:2].tolist() == [4, 7]
