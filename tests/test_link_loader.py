"""training.link.loader: link batches for the user's own loop on Cora's edge split, against the link sampler
and the placement's rows; evaluation covers a split once and its metrics are those of the whole split."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

from tests.conftest import REPO
from training.data import open_dataset
from training.errors import TrainError
from training.link.batches import LinkSteps, world_step_pairs
from training.link.edgeset import EdgeSet
from training.link.loader import open_link_loader
from training.link.metrics import link_metrics
from training.link.negatives import NegativeSampler
from training.link.sampler import LinkSampler
from training.link.store import open_link_data
from training.sampler import NeighborSampler


def test_batches_are_the_link_samplers_with_the_placements_rows(cora_links, placed_cora_links):
    data = open_link_data(open_dataset(cora_links))
    ds = data.ds
    feats = np.asarray(ds.features)
    negatives = NegativeSampler(EdgeSet.from_csr(ds.indptr, ds.indices, ds.num_nodes),
                                degree=np.diff(np.asarray(ds.indptr)))
    steps = LinkSteps(data.train_pos, negatives, 1000, 2.0, seed=5)
    sampler = LinkSampler(NeighborSampler(ds.indptr, ds.indices, (5, 5), seed=5))
    records = []
    with open_link_loader(cora_links, placed_cora_links, fanouts=(5, 5), batch_size=1000, neg_ratio=2.0, seed=5,
                          backend="posix", progress=records.append) as loader:
        assert len(loader) == 5 and loader.num_features == ds.feature_dim
        loader.set_epoch(1)
        got = list(loader)
        m = loader.metrics()
    want = list(steps.epoch(1))
    assert len(got) == len(want) == 5
    seen = set()
    for b, (pos, neg) in zip(got, want, strict=True):
        ref = sampler.sample(np.concatenate([pos, neg], 1))
        assert torch.equal(b.batch.n_id, ref.batch.n_id) and torch.equal(b.batch.edge_index, ref.batch.edge_index)
        pairs = b.batch.n_id[b.edge_label_index].numpy()
        np.testing.assert_array_equal(pairs, np.concatenate([pos, neg], 1))  # positives first, then negatives
        assert b.edge_label.tolist() == [1.0] * pos.shape[1] + [0.0] * neg.shape[1] and neg.shape[1] == 2 * pos.shape[1]
        assert int(b.edge_label_index.max()) < b.batch.batch_size
        np.testing.assert_array_equal(b.x.numpy(), feats[b.batch.n_id.numpy()].astype(np.float32))
        seen |= set(map(tuple, pos.T.tolist()))
    assert seen == set(map(tuple, data.train_pos.T.tolist()))  # every training edge once in the epoch
    assert m["steps"] == 5 and sum(t["rows"] for t in m["tiers"].values()) == sum(b.batch.num_nodes for b in got)
    assert set(m["tiers"]) >= {"cpu", "ssd"} and m["ssd_reads"]["read_rows"] > 0
    assert [r["kind"] for r in records] == ["step"] * 5


def test_evaluation_covers_each_split_once_and_scores_the_whole_split(cora_links):
    data = open_link_data(open_dataset(cora_links))
    with open_link_loader(cora_links, fanouts=(5,), batch_size=512, eval_batch_size=200, seed=1) as loader:
        for split in ("valid", "test"):
            pos, neg = data.pairs(split)
            batches = list(loader.evaluation(split))
            pairs = np.concatenate([b.batch.n_id[b.edge_label_index].numpy() for b in batches], 1)
            labels = torch.cat([b.edge_label for b in batches])
            want = {(u, v, 1.0) for u, v in pos.T.tolist()} | {(u, v, 0.0) for u, v in neg.T.tolist()}
            assert sorted(zip(*pairs.tolist(), labels.tolist(), strict=True)) == sorted(want)
            # any score: the loader's metrics are those of the split's positives against its negatives
            scores = torch.from_numpy(pairs.sum(0) % 97).float()
            y = labels.numpy() > 0.5
            assert loader.link_metrics(scores, labels) == link_metrics(scores.numpy()[y], scores.numpy()[~y])
        with pytest.raises(TrainError, match="`split`"):
            next(loader.evaluation("train"))


@pytest.mark.heavy  # two torch processes under torchrun (~30 s)
def test_torchrun_two_ranks_take_their_parts_and_gather_the_metrics(cora_links, placed_cora_links, tmp_path):
    """Each step's two parts are the world's pairs (every training edge once, each rank's own negatives); the
    gathered metrics are the whole split's on both ranks; the user's DDP keeps the parameters equal."""
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", str(REPO / "tests" / "link_loader_ranks.py"),
                           str(cora_links), str(placed_cora_links), str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    data = open_link_data(open_dataset(cora_links))
    ds = data.ds
    negatives = NegativeSampler(EdgeSet.from_csr(ds.indptr, ds.indices, ds.num_nodes),
                                degree=np.diff(np.asarray(ds.indptr)))
    world = world_step_pairs(LinkSteps(data.train_pos, negatives, 1000, 1.0, seed=2, world_size=2), 0)
    assert all(r["world_size"] == 2 and len(r["steps"]) == len(world) == 5 for r in ranks)
    for step, (pos, neg) in enumerate(world):
        parts = [np.array(r["steps"][step]["pairs"]) for r in ranks]
        labels = [np.array(r["steps"][step]["labels"]) > 0.5 for r in ranks]
        np.testing.assert_array_equal(np.concatenate([p[:, y] for p, y in zip(parts, labels, strict=True)], 1), pos)
        np.testing.assert_array_equal(np.concatenate([p[:, ~y] for p, y in zip(parts, labels, strict=True)], 1), neg)
    feats = np.asarray(ds.features, np.float32)
    pos, neg = data.pairs("test")
    score = lambda p: (feats[p[0]] * feats[p[1]]).sum(1)  # noqa: E731
    want = link_metrics(score(pos), score(neg))
    for r in ranks:
        assert r["metrics"].keys() == want.keys()
        assert all(r["metrics"][k] == pytest.approx(v, abs=1e-9) for k, v in want.items())
    assert ranks[0]["param_sum"] == ranks[1]["param_sum"]
