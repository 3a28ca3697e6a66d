"""PyG's ``LinkNeighborLoader`` over Moment's stores (a placed edge-split Cora) gives the batches it gives over
the same graph in memory, same seed: the link-level half of PyG's remote-backend behaviour (PyG's
test/loader/test_link_neighbor_loader.py ``test_custom_hetero_link_neighbor_loader`` compares the same way).

PyG's own sampler needs pyg-lib or torch-sparse; as in tests/test_pyg_stores.py, Moment's sampler is handed in
(``neighbor_sampler=``). A remote backend names its seed edges with their edge type: ``(None, edge_label_index)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")

from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import LinkNeighborLoader  # noqa: E402

from tests.conftest import graph_fixture  # noqa: E402
from training.data import open_dataset  # noqa: E402
from training.link.store import open_link_data  # noqa: E402
from training.pyg import MomentPygSampler, open_pyg_stores  # noqa: E402


@pytest.fixture(scope="module")
def placed_links(tmp_path_factory) -> Path:
    from moment.cli import main

    root = tmp_path_factory.mktemp("placed-links")
    assert main(["data", "import", str(graph_fixture("cora")), str(root / "cora")]) == 0
    assert main(["data", "split-edges", str(root / "cora"), str(root / "links")]) == 0
    ssd = [a for _ in range(8) for a in ("--ssd", str(root / "ssd"))]
    # hotness from link-level pre-sampling (the dataset carries edge splits), bins on every tier
    assert main(["place", "--dataset", str(root / "links"), "--machine", "moment-b", "--gpu-cache", "128KiB",
                 "--cpu-cache", "1MiB", *ssd, "--fanouts", "5,3", "--batch-size", "64",
                 "--out", str(root / "place")]) == 0
    return root / "links"


def _data(path: Path) -> Data:
    ds = open_dataset(path)
    indptr = torch.from_numpy(np.array(ds.indptr, np.int64))
    dst = torch.repeat_interleave(torch.arange(ds.num_nodes), indptr.diff())
    return Data(x=torch.from_numpy(np.array(ds.features)), y=torch.from_numpy(np.asarray(ds.labels, np.int64)),
                edge_index=torch.stack([torch.from_numpy(np.array(ds.indices, np.int64)), dst]))


@pytest.mark.parametrize("neg_sampling", ["binary", None])
def test_link_neighbor_loader_over_our_stores_equals_in_memory(placed_links, neg_sampling):
    from iostack.placement import load_placement

    fs, gs = open_pyg_stores(placed_links, placed_links.parent / "place", backend="posix")
    try:
        data = _data(placed_links)
        eli = torch.from_numpy(open_link_data(open_dataset(placed_links)).train_pos[:, :300])

        def batches(d, sampler, label_index):
            torch.manual_seed(7)  # shuffling and PyG's binary negatives draw from torch's stream
            loader = LinkNeighborLoader(d, num_neighbors=[5, 3], edge_label_index=label_index, batch_size=64,
                                        neg_sampling=neg_sampling, shuffle=True, neighbor_sampler=sampler)
            # without negatives PyG sets no edge_label: the ones below are every positive's
            return [(b.n_id, b.edge_index, b.x, b.y, b.edge_label_index,
                     b.edge_label if neg_sampling else torch.ones(b.edge_label_index.shape[1])) for b in loader]

        ours = batches((fs, gs), MomentPygSampler((fs, gs), [5, 3], seed=2), (None, eli))
        ref = batches(data, MomentPygSampler(data, [5, 3], seed=2, is_sorted=True), eli)
        assert len(ours) == len(ref) == 5
        for a, b in zip(ours, ref, strict=True):
            for u, v in zip(a, b, strict=True):
                assert torch.equal(u, v)
        n_id, _, x, _, label_index, label = ours[0]
        assert torch.equal(x, data.x[n_id]) and int(label_index.max()) < n_id.numel()
        assert int(label.sum()) == 64 and label.numel() == (128 if neg_sampling else 64)
        # the rows came through the tiered store of a placement that spans the tiers
        assert {b.kind for b in load_placement(placed_links.parent / "place").bins} == {"gpu", "cpu", "ssd"}
        served = fs.get_tensor_size(None, "x") and fs._entries[(None, "x")].totals()
        assert all(served[t][0] > 0 for t in ("gpu", "cpu", "ssd")), served
    finally:
        fs.close()
