"""A rank's share of a partitioned dataset (training.partition.rank) and its rows (training.partition.features)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import graph_fixture


@pytest.fixture(scope="module")
def cora_parts(tmp_path_factory) -> tuple[Path, Path]:
    from training.data import open_dataset
    from training.importers import import_dataset
    from training.partition.write import write_partition

    d = tmp_path_factory.mktemp("cora")
    ds_dir = import_dataset(graph_fixture("cora"), d / "cora")
    ds = open_dataset(ds_dir)
    part_of = np.random.default_rng(0).integers(0, 2, ds.num_nodes).astype(np.int16)
    write_partition(ds, part_of, 2, d / "p2", method="random")
    return ds_dir, d / "p2"


def test_a_rank_view_is_its_partition_in_new_ids_and_the_split_in_the_datasets_order(cora_parts):
    from training.data import open_dataset
    from training.partition.rank import open_rank_view

    ds_dir, part = cora_parts
    ds = open_dataset(ds_dir)
    for rank in (0, 1):
        v = open_rank_view(ds_dir, part, rank, 2)
        old = np.asarray(v.whole.old_ids)
        lo, hi = v.part.node_range
        labels = np.asarray(v.dataset.labels)
        assert np.array_equal(labels[lo:hi], np.asarray(ds.labels)[old[lo:hi]])
        assert (labels[:lo] == -1).all() and (labels[hi:] == -1).all()  # other partitions' labels are not held
        assert np.array_equal(old[v.train_order], np.asarray(ds.train_idx))  # the dataset's order, new ids
        assert v.dataset.indices is v.part.indices and v.dataset.features is None
        counts = [p["seeds"]["test"] for p in v.whole.manifest["parts_detail"]]
        assert v.eval_steps("test", 300) == max(math.ceil(c / 300) for c in counts)


def test_a_rank_view_of_another_job_size_or_graph_is_refused(cora_parts, tmp_path):
    import shutil

    from training.errors import TrainError
    from training.partition.rank import open_rank_view

    ds_dir, part = cora_parts
    with pytest.raises(TrainError, match="2 partitions for 3 ranks"):
        open_rank_view(ds_dir, part, 0, 3)
    other = tmp_path / "other"
    shutil.copytree(ds_dir, other)
    meta = (other / "meta.json").read_text().replace('"num_edges": ', '"num_edges": 1')
    (other / "meta.json").write_text(meta)
    with pytest.raises(TrainError, match="partition this dataset"):
        open_rank_view(other, part, 0, 2)


def test_partition_features_serve_home_rows_and_exchange_the_others(cora_parts):
    from training.data import open_dataset
    from training.partition import PartitionError
    from training.partition.features import PartitionFeatures
    from training.partition.read import open_partition
    from training.sharded.exchange import LoopbackExchange

    ds_dir, part = cora_parts
    ds, whole = open_dataset(ds_dir), open_partition(part)
    rows_new = np.asarray(ds.features)[np.asarray(whole.old_ids)]  # every row, new-id order: the peers' side
    asked: list[int] = []

    def peers(serve, dim, dtype):
        def answer(ids):
            asked.extend(ids.tolist())
            return torch.from_numpy(rows_new[ids.numpy()])
        return LoopbackExchange(answer, dim=dim, dtype=dtype)

    feats = PartitionFeatures(whole.part(1).features, whole.node_offsets, 1, peers)
    lo, hi = whole.part(1).node_range
    ids = torch.tensor([hi - 1, 0, lo, 5, hi - 1, lo + 3])
    assert torch.equal(feats.gather(ids), torch.from_numpy(rows_new[ids.numpy()]))
    assert sorted(asked) == sorted(i for i in ids.tolist() if not lo <= i < hi)  # only the other partition's rows
    assert feats.totals()["memory"][0] == 4 and feats.totals()["remote"][0] == 2
    assert torch.equal(feats.serve(torch.tensor([lo])), torch.from_numpy(rows_new[[lo]]))
    with pytest.raises(PartitionError, match="outside"):
        feats.serve(torch.tensor([0]))
