"""Link prediction: the edge split's properties, negatives that are never edges, OGB's metrics against hand
counts, the link-level sampler, link-level pre-sampling, and `moment train --task link` on Cora end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import graph_fixture
from training.link.edges import split_edges, with_edges
from training.link.edgeset import EdgeSet, LinkSplitError, csr_edges
from training.link.metrics import auc, hits_at_k, link_metrics, mrr
from training.link.negatives import NegativeSampler
from training.link.sampler import LinkSampler, link_presample_counts
from training.sampler import NeighborSampler


def _csr(n: int, src: np.ndarray, dst: np.ndarray, undirected: bool) -> tuple[np.ndarray, np.ndarray]:
    """A deduplicated CSR without self-loops (row = target), both directions when ``undirected``."""
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if undirected:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    keys = np.unique(dst.astype(np.int64) * n + src)
    d, s = keys // n, keys % n
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(d, minlength=n), out=indptr[1:])
    return indptr, s.astype(np.int32)


def _pairs(a: np.ndarray) -> set[tuple[int, int]]:
    return set(zip(a[0].tolist(), a[1].tolist(), strict=True))


graphs = st.integers(4, 40).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=12, max_size=120),
    st.booleans(), st.integers(0, 2**16)))


@settings(max_examples=60, deadline=None)
@given(graphs)
def test_split_is_disjoint_and_holds_out_edges_in_both_directions(g):
    n, edges, undirected, seed = g
    e = np.array(edges).T
    indptr, indices = _csr(n, e[0], e[1], undirected)
    src, dst = csr_edges(indptr, indices)
    if (src <= dst).sum() < 5 if undirected else src.size < 5:
        return
    sp = split_edges(indptr, indices, undirected=undirected, num_val=0.2, num_test=0.2, seed=seed)
    full = _pairs(np.stack([src, dst]))
    train, valid, test = _pairs(sp.train_pos), _pairs(sp.valid_pos), _pairs(sp.test_pos)
    assert not (train & valid) and not (train & test) and not (valid & test)  # disjoint
    assert train | valid | test <= full
    # every edge (one direction per undirected pair) is in exactly one split
    assert len(train) + len(valid) + len(test) == (int((src <= dst).sum()) if undirected else src.size)
    graph = _pairs(np.stack(csr_edges(sp.indptr, sp.indices)))
    held = valid | test
    if undirected:
        held |= {(v, u) for u, v in held}
        train_both = train | {(v, u) for u, v in train}
    else:
        train_both = train
    assert not (graph & held)  # held-out edges are not in the sampling graph, in either direction
    assert graph == train_both  # and the sampling graph is exactly the training edges
    assert np.all(np.diff(sp.indptr) >= 0) and sp.indptr[-1] == sp.indices.size
    for neg in (sp.valid_neg, sp.test_neg):  # negatives are no edge of the whole graph, nor loops
        assert not (_pairs(neg) & full) and not (neg[0] == neg[1]).any()
    # the test graph is the training graph plus the validation edges
    ptr, idx = with_edges(sp.indptr, sp.indices, sp.valid_pos, undirected)
    valid_both = valid | ({(v, u) for u, v in valid} if undirected else set())
    assert _pairs(np.stack(csr_edges(ptr, idx))) == train_both | valid_both


def test_split_counts_follow_pygs_rounding_and_refuse_an_empty_train_set():
    indptr, indices = _csr(30, np.arange(29), np.arange(1, 30), True)  # a path: 29 undirected edges
    sp = split_edges(indptr, indices, undirected=True, num_val=0.1, num_test=0.2, seed=0)
    assert (sp.valid_pos.shape[1], sp.test_pos.shape[1], sp.train_pos.shape[1]) == (2, 5, 22)  # int(share * 29)
    with pytest.raises(LinkSplitError, match="num_val"):
        split_edges(indptr, indices, undirected=True, num_val=1.5)
    with pytest.raises(LinkSplitError, match="none to train on"):
        split_edges(indptr, indices, undirected=True, num_val=15, num_test=14)


@settings(max_examples=40, deadline=None)
@given(graphs, st.sampled_from(["uniform", "degree"]), st.booleans())
def test_negatives_are_never_edges(g, method, per_source):
    n, edges, undirected, seed = g
    e = np.array(edges).T
    indptr, indices = _csr(n, e[0], e[1], undirected)
    src, dst = csr_edges(indptr, indices)
    full = EdgeSet.from_pairs(src, dst, n)
    sampler = NegativeSampler(full, method=method, degree=np.bincount(np.concatenate([src, dst]), minlength=n))
    rng = np.random.default_rng(seed)
    given_src = rng.integers(0, n, 64) if per_source else None
    neg = sampler.sample(64, rng, src=given_src)
    assert neg.shape[0] == 2 and neg.shape[1] <= 64
    assert not full.contains(neg[0], neg[1]).any() and not (neg[0] == neg[1]).any()
    if per_source:  # the sources are the ones given, in order (a pair that stayed an edge is left out)
        rest = iter(given_src.tolist())
        assert all(any(s == t for t in rest) for s in neg[0].tolist())


def test_negatives_meet_their_rate_and_degree_draws_follow_degree():
    n = 200
    rng = np.random.default_rng(0)
    # a star: vertex 0 joined to 1..99; vertices 100..199 isolated
    indptr, indices = _csr(n, np.zeros(99, np.int64), np.arange(1, 100), True)
    src, dst = csr_edges(indptr, indices)
    full = EdgeSet.from_pairs(src, dst, n)
    assert NegativeSampler(full).sample(5000, rng).shape == (2, 5000)  # sparse graph: the full rate
    deg = np.bincount(np.concatenate([src, dst]), minlength=n)
    neg = NegativeSampler(full, method="degree", degree=deg).sample(5000, rng)
    assert not (np.isin(neg, np.arange(100, n))).any()  # degree 0: never drawn
    # a complete graph on 3 vertices has no negatives: none come back, none is a positive
    k3 = EdgeSet.from_pairs(*csr_edges(*_csr(3, np.array([0, 1, 2]), np.array([1, 2, 0]), True)), 3)
    assert NegativeSampler(k3, max_rounds=3).sample(10, rng).shape == (2, 0)
    with pytest.raises(LinkSplitError, match="uniform, degree"):
        NegativeSampler(full, method="zipf")


def test_metrics_against_hand_counts():
    pos, neg = np.array([0.9, 0.4, 0.1]), np.array([0.5, 0.1, 0.3, 0.0])
    # AUC: pairs (pos > neg) count 1, ties 1/2: 0.9 beats 4; 0.4 beats 3; 0.1 beats 1 and ties 1 -> 8.5 / 12
    assert auc(pos, neg) == pytest.approx(8.5 / 12)
    assert auc(np.ones(3), np.ones(2)) == 0.5
    # Hits@2: the 2nd highest negative is 0.3; positives strictly above: 0.9, 0.4 -> 2/3
    assert hits_at_k(pos, neg, 2) == pytest.approx(2 / 3)
    assert hits_at_k(pos, neg, 5) == 1.0  # fewer negatives than K: OGB returns 1
    # MRR: 0.9 -> rank 1; 0.4 -> 0.5 above -> rank 2; 0.1 -> 0.5, 0.3 above and 0.1 tied -> 1 + (2 + 3) / 2 = 3.5
    assert mrr(pos, neg) == pytest.approx((1 + 1 / 2 + 1 / 3.5) / 3)
    # OGB's [num_pos, num_neg] layout with every row the same pool gives the same number
    assert mrr(pos, np.tile(neg, (3, 1))) == pytest.approx(mrr(pos, neg))
    assert set(link_metrics(pos, neg, ks=(1, 2))) == {"auc", "mrr", "hits@1", "hits@2"}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=20), st.lists(st.floats(-5, 5), min_size=1, max_size=20))
def test_metrics_match_their_definitions(p, q):
    pos, neg = np.array(p), np.array(q)
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert auc(pos, neg) == pytest.approx(pairs / (pos.size * neg.size))
    brute = 1 / (1 + 0.5 * ((neg[None] > pos[:, None]).sum(1) + (neg[None] >= pos[:, None]).sum(1)))
    assert mrr(pos, neg) == pytest.approx(brute.mean())


def test_link_sampler_samples_both_endpoints_in_one_subgraph():
    indptr, indices = _csr(50, np.arange(49), np.arange(1, 50), True)
    ns = NeighborSampler(indptr, indices, (2, 2), seed=4)
    pairs = np.array([[3, 10, 3], [40, 11, 7]])
    b = LinkSampler(ns).sample(pairs)
    assert torch.equal(b.batch.n_id[b.pair_index], torch.from_numpy(pairs))
    assert b.batch.batch_size == 5 and int(b.pair_index.max()) < b.batch.batch_size
    ref = NeighborSampler(indptr, indices, (2, 2), seed=4).sample(torch.tensor([3, 7, 10, 11, 40]))
    assert torch.equal(ref.n_id, b.batch.n_id) and torch.equal(ref.edge_index, b.batch.edge_index)


def test_link_presample_counts_every_batch_vertex_once():
    indptr, indices = _csr(50, np.arange(49), np.arange(1, 50), True)
    pairs = np.stack([np.arange(0, 40), np.arange(1, 41)])
    counts, batches = link_presample_counts(NeighborSampler(indptr, indices, (1,), seed=0), pairs, 16, epochs=2)
    assert batches == 6 and counts.shape == (50,)
    # every pair's endpoints are read in every epoch, and a vertex at most once per batch
    assert (counts[np.unique(pairs)] >= 2).all() and counts.max() <= batches
    # the total is the batches' vertices: what the same walk samples batch by batch
    rng, link = np.random.default_rng(0), LinkSampler(NeighborSampler(indptr, indices, (1,), seed=0))
    total = 0
    for _ in range(2):
        order = rng.permutation(40)
        total += sum(link.sample(pairs[:, order[a:a + 16]]).batch.n_id.numel() for a in range(0, 40, 16))
    assert counts.sum() == total


def test_split_edges_writes_a_dataset_the_pipeline_reads(cora_links):
    from training.data import open_dataset
    from training.hotness import HotnessSpec, compute_hotness
    from training.link.store import open_link_data

    ds = open_dataset(cora_links, verify="full")  # the pair files are under the dataset's checksums
    data = open_link_data(ds)
    assert (data.train_pos.shape[1], data.valid_pos.shape[1], data.test_pos.shape[1]) == (4488, 263, 527)
    assert ds.num_edges == 2 * 4488 and ds.features is not None and ds.meta["link"]["undirected"]
    hot = compute_hotness(ds, HotnessSpec("presample", fanouts=(5, 5), batch_size=1024, epochs=1))
    assert hot.epochs_covered == 1.0 and hot.values[np.unique(data.train_pos)].min() >= 1


def test_moment_train_task_link_on_cora(cora_links, capsys):
    from moment.cli import main

    code = main(["train", "--task", "link", "--dataset", str(cora_links), "--model", "sage", "--hidden", "32",
                 "--embed-dim", "16", "--fanouts", "5,5", "--batch-size", "2048", "--epochs", "2", "--lr", "0.01",
                 "--decoder", "mlp", "--negatives", "degree", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["task"] == "link" and len(out["epochs"]) == 2
    last = out["epochs"][-1]
    assert last["pairs"] == 2 * 4488 and np.isfinite(last["loss"])
    for split in ("valid", "test"):
        assert 0.0 <= last[f"{split}_auc"] <= 1.0 and 0.0 < last[f"{split}_mrr"] <= 1.0
    assert last["tiers"]["memory"]["rows"] > 0


def test_moment_train_task_link_refuses_a_node_dataset(tmp_path):
    from moment.cli import main

    assert main(["data", "import", str(graph_fixture("cora")), str(tmp_path / "cora")]) == 0
    assert main(["train", "--task", "link", "--dataset", str(tmp_path / "cora"), "--epochs", "1"]) == 2


def test_link_options_are_checked_and_named():
    from training.errors import TrainError
    from training.link.train import LinkSpec

    for bad, name in (({"decoder": "cosine"}, "decoder"), ({"negatives": "zipf"}, "negatives"),
                      ({"neg_ratio": 0.0}, "neg_ratio"), ({"embed_dim": 0}, "embed_dim")):
        with pytest.raises(TrainError, match=f"`{name}`"):
            LinkSpec(**bad)
