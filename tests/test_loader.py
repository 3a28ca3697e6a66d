"""training.loader: Moment's batches in a user's own loop, on real Cora, against the trainer's own source."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO
from training.batches import LocalBatchSource
from training.data import open_dataset
from training.errors import TrainError
from training.loader import MomentLoader, open_loader
from training.sampler import NeighborSampler
from training.specs import IOSpec, RunSpec, SamplingSpec, TrainSpec


@pytest.fixture(scope="module")
def cora(placed_cora) -> Path:
    return placed_cora


@pytest.fixture(scope="module")
def placement(cora) -> Path:
    return cora.parent / "place"


def test_batches_are_the_trainers_with_the_placements_rows(cora, placement):
    ds = open_dataset(cora)
    feats, labels = np.asarray(ds.features), np.asarray(ds.labels)
    csr = (torch.from_numpy(np.array(ds.indptr)), torch.from_numpy(np.array(ds.indices)))
    ref = LocalBatchSource(NeighborSampler(*csr, (10, 5), seed=3), ds.train_idx, 35, seed=3)
    records = []
    with open_loader(cora, placement, fanouts=(10, 5), batch_size=35, seed=3, backend="posix",
                     progress=records.append) as loader:
        assert (len(loader), loader.num_features, loader.num_classes) == (4, ds.feature_dim, ds.num_classes)
        loader.set_epoch(1)
        got = list(loader)
        want = list(ref.batches(1))
        assert len(got) == len(want) == 4
        for b, w in zip(got, want, strict=True):
            assert torch.equal(b.batch.n_id, w.n_id) and torch.equal(b.batch.edge_index, w.edge_index)
            np.testing.assert_array_equal(b.x.numpy(), feats[w.n_id.numpy()].astype(np.float32))
            np.testing.assert_array_equal(b.y.numpy(), labels[w.n_id[:w.batch_size].numpy()])
        m = loader.metrics()
        rows = sum(b.batch.num_nodes for b in got)
        assert m["steps"] == 4 and m["seeds"] == ds.train_idx.shape[0]
        assert sum(t["rows"] for t in m["tiers"].values()) == rows and set(m["tiers"]) >= {"cpu", "ssd"}
        assert m["tiers"]["ssd"]["bytes"] == m["tiers"]["ssd"]["rows"] * ds.row_bytes
        assert m["ssd_reads"]["read_rows"] > 0
        assert [r["kind"] for r in records] == ["start"] + ["step"] * 4
        assert sum(r["tiers"]["ssd"]["rows"] for r in records[1:]) == m["tiers"]["ssd"]["rows"]
        assert loader.metrics(reset=True)["steps"] == 4 and loader.metrics()["steps"] == 0


def test_set_epoch_reshuffles_and_repeats(cora):
    with open_loader(cora, fanouts=(5,), batch_size=50, seed=1) as loader:
        first = [b.batch.n_id[: b.batch.batch_size] for b in loader]
        again = [b.batch.n_id[: b.batch.batch_size] for b in loader]
        loader.set_epoch(2)
        other = [b.batch.n_id[: b.batch.batch_size] for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    assert sorted(torch.cat(first).tolist()) == sorted(torch.cat(other).tolist())


def test_evaluation_covers_each_split_once(cora):
    ds = open_dataset(cora)
    spec = TrainSpec(str(cora), sampling=SamplingSpec(fanouts=(5, 5), batch_size=64, eval_batch_size=300,
                                                      eval_fanouts=(-1, -1)),
                     io=IOSpec(prefetch=0), run=RunSpec(seed=4))
    with MomentLoader(spec) as loader:
        seen = [b.batch.n_id[: b.batch.batch_size] for b in loader.evaluation("test")]
        with pytest.raises(TrainError, match="no such split"):
            next(loader.evaluation("nope"))
    assert torch.equal(torch.cat(seen), torch.as_tensor(np.asarray(ds.test_idx, np.int64)))


def test_bad_settings_are_named(cora):
    with pytest.raises(TrainError, match="`fanouts`"):
        open_loader(cora, fanouts=(0,))


@pytest.mark.heavy  # two torch processes under torchrun (~20 s)
def test_torchrun_two_ranks_with_the_users_ddp(cora, placement, tmp_path):
    """The user's script initialises the group and wraps its own model in DDP: each step's two parts are the
    one-process batch, node-shared SSD reads are on, the parameters stay equal."""
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", str(REPO / "tests" / "loader_ranks.py"), str(cora),
                           str(placement), str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    with open_loader(cora, fanouts=(5, 5), batch_size=48, seed=2) as one:
        whole = [b.batch.n_id[: b.batch.batch_size].tolist() for b in one]
    assert all(r["world_size"] == 2 and r["steps"] == len(whole) == 3 for r in ranks)
    for step, seeds in enumerate(whole):
        assert ranks[0]["seeds"][step] + ranks[1]["seeds"][step] == seeds
    assert all(r["start"]["node_shared_reads"]["on"] for r in ranks)
    assert all(r["metrics"]["steps"] == 3 and r["metrics"]["tiers"] for r in ranks)
    assert ranks[0]["param_sum"] == ranks[1]["param_sum"]
