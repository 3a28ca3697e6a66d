"""The models' fast paths against the reference operations they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.nn import SAGEConv

from training.models import GraphSAGE, adjacency, build_model, dropout, relu_dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_keeps_the_expectation_and_the_rate(p):
    torch.manual_seed(1)
    y = dropout(torch.ones(2_000_000), p)
    kept = (y != 0).float().mean().item()
    q = round(p * 256) / 256  # the rate after rounding to 1/256
    assert abs(kept - (1 - q)) < 0.002 and abs(q - p) <= 1 / 512
    assert abs(y.mean().item() - 1.0) < 0.004  # scaled by the exact inverse keep rate
    assert torch.unique(y).tolist() == pytest.approx([0.0, 1 / (1 - q)])


def test_dropout_is_reproducible_off_in_eval_and_its_gradient_is_the_mask():
    x = torch.randn(1000, 33, requires_grad=True)
    torch.manual_seed(5)
    a = dropout(x, 0.5)
    torch.manual_seed(5)
    b = dropout(x, 0.5)
    assert torch.equal(a, b)
    assert dropout(x, 0.5, training=False) is x and dropout(x, 0.0) is x
    a.sum().backward()
    assert torch.equal(x.grad, (a.detach() != 0).float() * 2.0)
    # no element's keep decision is correlated with its neighbours' (bytes of one word are independent)
    torch.manual_seed(2)
    m = (dropout(torch.ones(700_000), 0.5) != 0).float().view(-1, 7)
    corr = torch.corrcoef(m.T)
    assert (corr - torch.eye(7)).abs().max() < 0.01


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 19), st.integers(0, 6)), min_size=0, max_size=60), st.booleans())
def test_sparse_adjacency_aggregates_like_the_edge_list(edges, shuffle):
    """SAGEConv over the CSR adjacency equals SAGEConv over the edge list, any edge order, any degree."""
    ei = torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).T.contiguous()
    if not shuffle:
        ei = ei[:, torch.argsort(ei[1], stable=True)]
    torch.manual_seed(0)
    conv = SAGEConv(5, 3)
    x = torch.randn(20, 5)
    ref = conv((x, x[:7]), ei)
    got = conv((x, x[:7]), adjacency(ei, 7, 20, x.dtype))
    assert torch.allclose(ref, got, atol=1e-5)


def test_graphsage_gradients_match_the_edge_list_path():
    torch.manual_seed(0)
    m = build_model("sage", 8, 3, 2, hidden=16, dropout=0.0)
    x = torch.randn(30, 8)
    layers = (torch.randint(0, 30, (2, 80)).clamp(max=29), torch.randint(0, 10, (2, 20)))
    layers = (torch.stack([layers[0][0], layers[0][1] % 10]), torch.stack([layers[1][0], layers[1][1] % 4]))
    out = m(x, layers, 4)
    F.cross_entropy(out, torch.tensor([0, 1, 2, 0])).backward()
    fast = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()

    def scatter_conv(self, layer, x, ei, num_out, **extra):
        return self.convs[layer]((x, x[:num_out]), ei)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GraphSAGE, "_conv", scatter_conv)
        ref_out = m(x, layers, 4)
        F.cross_entropy(ref_out, torch.tensor([0, 1, 2, 0])).backward()
    assert torch.allclose(out, ref_out, atol=1e-5)
    assert all(torch.allclose(a, p.grad, atol=1e-5) for a, p in zip(fast, m.parameters(), strict=True))


def test_graphsage_drops_hidden_units_only_gat_and_gcn_the_input_too():
    x = torch.randn(12, 4)
    ei = torch.tensor([[4, 5, 6], [0, 1, 2]])
    seen = []

    def spy(h, p, training=True):
        seen.append(h.shape[1])
        return h

    def relu_spy(h, p, training=True):
        seen.append(h.shape[1])
        return F.relu(h)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("training.models.dropout", spy)
        mp.setattr("training.models.relu_dropout", relu_spy)
        for name, want in (("sage", [8]), ("gcn", [4, 8]), ("gat", [4, 8])):
            seen.clear()
            m = build_model(name, 4, 3, 2, hidden=8, heads=1) if name == "gat" else build_model(name, 4, 3, 2, hidden=8)
            m.train()
            m(x, (ei, ei), 3)
            assert seen == want, name


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5])
def test_relu_dropout_is_relu_then_dropout_with_the_same_mask_and_gradient(p):
    """The fused op equals ReLU followed by dropout under the same draw, forward and backward."""
    x = torch.randn(3000, 17)
    x[::7, 3] = 0.0  # ReLU's kink: torch's derivative there is 0
    a = x.clone().requires_grad_()
    torch.manual_seed(3)
    fused = relu_dropout(a, p)
    b = x.clone().requires_grad_()
    torch.manual_seed(3)
    ref = dropout(F.relu(b), p)
    assert torch.equal(fused, ref)
    g = torch.randn_like(x)
    fused.backward(g)
    ref.backward(g)
    assert torch.equal(a.grad, b.grad)
    assert relu_dropout(x, 0.5, training=False).equal(F.relu(x))
