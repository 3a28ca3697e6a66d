"""planner.flow.dinic against scipy.sparse.csgraph.maximum_flow, whose Dinic it ports edge for edge."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import sparse
from scipy.sparse.csgraph import maximum_flow as scipy_maximum_flow

from planner.flow.dinic import maximum_flow


@st.composite
def networks(draw):
    n = draw(st.integers(2, 12))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40))
    pairs = sorted({(u, v) for u, v in pairs if u != v})
    caps = draw(st.lists(st.integers(0, 50), min_size=len(pairs), max_size=len(pairs)))
    s, t = draw(st.sampled_from([(a, b) for a in range(n) for b in range(n) if a != b]))
    return n, pairs, caps, s, t


def _csr(n, pairs, caps):
    tail = np.array([u for u, _ in pairs], dtype=np.int64)
    indices = np.array([v for _, v in pairs], dtype=np.int32)
    indptr = np.searchsorted(tail, np.arange(n + 1)).astype(np.int32)
    return indptr, indices, np.array(caps, dtype=np.int32)


@settings(max_examples=300, deadline=None)
@given(networks())
def test_flow_on_every_edge_equals_scipys(net):
    n, pairs, caps, s, t = net
    indptr, indices, cap = _csr(n, pairs, caps)
    value, flow = maximum_flow(indptr, indices, cap, s, t)
    # scipy keeps the explicit zeros of a csr_array built from its arrays, as the planner builds it
    ref = scipy_maximum_flow(sparse.csr_array((cap, indices, indptr), shape=(n, n)), s, t)
    assert value == ref.flow_value
    dense = ref.flow.toarray()
    assert flow.tolist() == [int(dense[u, v]) for u, v in pairs]


def test_a_flow_respects_capacities_and_conservation():
    # two paths 0-1-3 (3, 2) and 0-2-3 (2, 3) and a cross edge 1-2 (5): the value is 4 + 1 through 1-2
    pairs = [(0, 1), (0, 2), (1, 2), (1, 3), (2, 3)]
    indptr, indices, cap = _csr(4, pairs, [3, 2, 5, 2, 3])
    value, flow = maximum_flow(indptr, indices, cap, 0, 3)
    assert value == 5
    assert all(0 <= f <= c for f, c in zip(flow.tolist(), cap.tolist(), strict=True))
    net_out = np.zeros(4, np.int64)
    for (u, v), f in zip(pairs, flow.tolist(), strict=True):
        net_out[u] += f
        net_out[v] -= f
    assert net_out.tolist() == [5, 0, 0, -5]


@pytest.mark.parametrize("machine", ["moment-a", "moment-b"])
def test_plans_ranked_as_with_scipys_maxflow(machine, monkeypatch):
    """The ranking and every flow result (times, link bytes, bottlenecks) equal scipy's own maximum flow's."""
    import planner.flow.maxflow as mf
    from planner.inventory import inventory_from_counts
    from planner.plan import plan
    from planner.topology.spec.load import load_machine
    from planner.workload import Demand

    def ranking():
        res = plan(load_machine(machine), inventory_from_counts(gpus=4, ssds=8),
                   Demand(bytes_per_consumer=3e9), top=8, tidy_best=False)
        return [(c.layout, c.result) for c in res.ranked]

    ours = ranking()

    def scipy_flow(indptr, indices, caps, s, t):
        n = len(indptr) - 1
        res = scipy_maximum_flow(sparse.csr_array((caps.astype(np.int32), indices, indptr), shape=(n, n)), s, t)
        dense = res.flow.toarray()
        tail = np.repeat(np.arange(n), np.diff(indptr))
        return int(res.flow_value), dense[tail, indices].astype(np.int64)

    monkeypatch.setattr(mf, "maximum_flow", scipy_flow)
    assert ranking() == ours
