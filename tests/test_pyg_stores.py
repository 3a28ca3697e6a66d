"""PyG's remote-backend interfaces over a placed Cora: the stores behave as PyG's own tests ask, and
``NeighborLoader`` over them gives the batches it gives over the same graph in memory.

Ported from PyG's test/data/test_feature_store.py, test/data/test_graph_store.py and
test/loader/test_neighbor_loader.py's ``test_custom_neighbor_loader`` (the stores against a ``Data``
reference, the same seed). PyG's own sampler needs pyg-lib or torch-sparse; the comparison runs with
Moment's sampler swapped in (``neighbor_sampler=``) everywhere, and with PyG's own where one is installed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")

import torch_geometric.typing  # noqa: E402
from torch_geometric.data import Data, EdgeAttr, TensorAttr  # noqa: E402
from torch_geometric.loader import NeighborLoader  # noqa: E402

from training.data import open_dataset  # noqa: E402
from training.pyg import MomentGraphStore, MomentPygSampler, open_pyg_stores  # noqa: E402


@pytest.fixture(scope="module")
def cora(placed_cora) -> Path:
    return placed_cora


@pytest.fixture(scope="module")
def stores(cora):
    fs, gs = open_pyg_stores(cora, cora.parent / "place", backend="posix")
    yield fs, gs
    fs.close()


def _data(cora) -> Data:
    """The reference: the same graph and features as an in-memory ``Data`` (edges sorted by destination)."""
    ds = open_dataset(cora)
    indptr = torch.from_numpy(np.array(ds.indptr, np.int64))
    dst = torch.repeat_interleave(torch.arange(ds.num_nodes), indptr.diff())
    edge_index = torch.stack([torch.from_numpy(np.array(ds.indices, np.int64)), dst])
    return Data(x=torch.from_numpy(np.array(ds.features)), y=torch.from_numpy(np.asarray(ds.labels, np.int64)),
                edge_index=edge_index)


def test_feature_store_answers_as_pygs_tests_ask(cora, stores):
    fs, _ = stores
    data = _data(cora)
    idx = torch.tensor([5, 0, 2707, 5])
    assert torch.equal(fs.get_tensor(None, "x", idx), data.x[idx])  # tiered rows, any order, repeats
    assert torch.equal(fs.get_tensor(TensorAttr(None, "x", idx)), data.x[idx])
    assert torch.equal(fs.get_tensor(None, "x", slice(10, 13)), data.x[10:13])
    assert torch.equal(fs.get_tensor(None, "x", None), data.x)
    x, y = fs.multi_get_tensor([TensorAttr(None, "x", idx), TensorAttr(None, "y", idx)])
    assert torch.equal(x, data.x[idx]) and torch.equal(y, data.y[idx])
    assert tuple(fs.get_tensor_size(None, "x")) == tuple(data.x.shape)
    assert {(a.group_name, a.attr_name) for a in fs.get_all_tensor_attrs()} == {(None, "x"), (None, "y")}
    # tiered rows are read-only: the store refuses (PyG's put_tensor returns its answer) and nothing changes
    assert not fs.put_tensor(torch.zeros(4, data.x.shape[1]), group_name=None, attr_name="x", index=idx)
    assert torch.equal(fs.get_tensor(None, "x", idx), data.x[idx])
    with pytest.raises(KeyError):
        fs.get_tensor(None, "z", idx)


def test_graph_store_layouts_equal_the_reference(cora, stores):
    _, gs = stores
    data = _data(cora)
    (attr,) = gs.get_all_edge_attrs()
    n = data.num_nodes
    assert attr.edge_type is None and attr.layout.value == "csc" and tuple(attr.size) == (n, n)
    # a homogeneous store answers with tensors, not dicts keyed by edge type
    row, col, perm = gs.coo()
    assert torch.equal(torch.stack([row, col]), data.edge_index) and perm is None
    row2, colptr, perm2 = gs.csc()  # PyG orders CSC as (row, colptr)
    assert torch.equal(row2, data.edge_index[0]) and perm2 is None
    assert torch.equal(colptr, torch.from_numpy(np.array(open_dataset(cora).indptr, np.int64)))
    rowptr, col3, perm3 = gs.csr()  # converted from the stored CSC, as PyG's GraphStore does
    back = torch.stack([torch.repeat_interleave(torch.arange(n), rowptr.diff()), col3])
    assert torch.equal(back, data.edge_index[:, perm3])
    assert gs.get_edge_index(EdgeAttr(None, "csc")) is not None
    assert not gs.remove_edge_index(EdgeAttr(None, "csc"))


def _batches(loader):
    return [(b.n_id, b.edge_index, b.x, b.y, b.batch_size) for b in loader]


def _assert_same(ours, ref):
    assert len(ours) == len(ref) > 0
    for a, b in zip(ours, ref, strict=True):
        for u, v in zip(a, b, strict=True):
            assert (torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v)


@pytest.mark.parametrize("fanouts", [[10, 5], [-1, -1]])
def test_neighbor_loader_over_our_stores_equals_in_memory(cora, stores, fanouts):
    fs, gs = stores
    data = _data(cora)
    seeds = torch.from_numpy(np.asarray(open_dataset(cora).train_idx, np.int64))

    def loader(d, sampler):
        return NeighborLoader(d, num_neighbors=fanouts, batch_size=35, input_nodes=seeds, neighbor_sampler=sampler)

    ours = _batches(loader((fs, gs), MomentPygSampler((fs, gs), fanouts, seed=3)))
    ref = _batches(loader(data, MomentPygSampler(data, fanouts, seed=3, is_sorted=True)))
    _assert_same(ours, ref)
    n_id, edge_index, x, y, bs = ours[0]
    assert bs == 35 and torch.equal(n_id[:bs], seeds[:35]) and torch.equal(y, data.y[n_id])
    assert int(edge_index.max()) < n_id.numel() and torch.equal(x, data.x[n_id])


@pytest.mark.skipif(not (torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE),
                    reason="PyG's own neighbour sampler needs pyg-lib or torch-sparse")
def test_neighbor_loader_with_pygs_own_sampler_equals_in_memory(cora, stores):
    fs, gs = stores
    data = _data(cora)
    seeds = torch.from_numpy(np.asarray(open_dataset(cora).train_idx, np.int64))
    torch.manual_seed(12345)
    ours = _batches(NeighborLoader((fs, gs), num_neighbors=[10, 5], batch_size=35, input_nodes=seeds))
    torch.manual_seed(12345)
    ref = _batches(NeighborLoader(data, num_neighbors=[10, 5], batch_size=35, input_nodes=seeds, is_sorted=True))
    _assert_same(ours, ref)


def test_graph_store_of_a_tiny_graph():
    gs = MomentGraphStore(np.array([0, 2, 3, 3]), np.array([1, 2, 0], np.int32))
    row, col, _ = gs.coo()
    assert row.tolist() == [1, 2, 0] and col.tolist() == [0, 0, 1]
