"""`moment train --task link` under torchrun: two ranks train what one process computes on their pairs together.

With full neighbourhoods (fan-outs -1) and no dropout a batch's logits do not depend on how its pairs are split
between ranks, so a single process that replays each step on the ranks' positives and negatives together
(:func:`training.link.batches.world_step_pairs`), from the same initial parameters, must see the same losses
step by step and end with the same model: that holds only if each rank took its own part of the positives,
drew its negatives from its own stream, and DDP averaged the gradient of the world's mean loss. Evaluation
gathers every rank's scores, so its metrics equal the replayed model's, evaluated here in one process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import REPO
from training.data import open_dataset
from training.link.batches import LinkSteps, world_step_pairs
from training.link.edges import with_edges
from training.link.edgeset import EdgeSet
from training.link.metrics import link_metrics
from training.link.negatives import NegativeSampler
from training.link.sampler import LinkSampler
from training.link.store import open_link_data
from training.link.train import LinkSpec, build_link_model
from training.sampler import NeighborSampler
from training.specs import ModelSpec, RunSpec, SamplingSpec, TrainSpec

BATCH, EPOCHS, LR, SEED = 1000, 2, 0.01, 3


class _Replay:
    """One process: the model, full-neighbourhood samplers of the training and test graphs, the rows."""

    def __init__(self, links: Path) -> None:
        self.data = open_link_data(open_dataset(links, validate=False))
        ds = self.data.ds
        self.feats = torch.from_numpy(np.asarray(ds.features)).float()
        spec = TrainSpec(str(links), model=ModelSpec(hidden=32, dropout=0.0),
                         sampling=SamplingSpec(fanouts=(-1, -1)), run=RunSpec(seed=SEED))
        self.model = build_link_model(spec, LinkSpec(embed_dim=16), self.feats.shape[1], torch.device("cpu"))
        self.graphs = {"train": (np.asarray(ds.indptr), np.asarray(ds.indices))}
        self.graphs["test"] = with_edges(*self.graphs["train"], self.data.valid_pos, self.data.undirected)

    def logits(self, pairs: np.ndarray, graph: str = "train") -> torch.Tensor:
        ptr, idx = self.graphs[graph]
        b = LinkSampler(NeighborSampler(ptr, idx, (-1, -1), seed=0)).sample(pairs)
        deg = torch.from_numpy(np.diff(ptr)).float()[b.batch.n_id]
        return self.model(self.feats[b.batch.n_id], b.batch.edge_index_per_layer, b.batch.batch_size,
                          b.pair_index, deg=deg)

    def train(self, steps: LinkSteps) -> tuple[list[float], list[float]]:
        """Rank 0's summed loss at every step (its pairs' part of the world's batch), and the epochs' mean losses."""
        opt = torch.optim.Adam(self.model.parameters(), lr=LR)
        rank0, means = [], []
        for epoch in range(EPOCHS):
            total = pairs = 0.0
            mine = LinkSteps(steps.positives, steps.negatives, BATCH, 1.0, seed=SEED, rank=0, world_size=2)
            for (pos, neg), (pos0, neg0) in zip(world_step_pairs(steps, epoch), mine.epoch(epoch), strict=True):
                out = self.logits(np.concatenate([pos, neg], 1))
                target = torch.cat([torch.ones(pos.shape[1]), torch.zeros(neg.shape[1])])
                each = F.binary_cross_entropy_with_logits(out, target, reduction="none")
                loss = each.mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                p0, n0, p = pos0.shape[1], neg0.shape[1], pos.shape[1]
                rank0.append(float(each[:p0].sum() + each[p:p + n0].sum()))
                total, pairs = total + float(each.sum()), pairs + out.numel()
            means.append(total / pairs)
        return rank0, means

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        rec = {}
        for split, graph in (("valid", "train"), ("test", "test")):
            pos, neg = self.data.pairs(split)
            scores = self.logits(np.concatenate([pos, neg], 1), graph).numpy()
            rec.update({f"{split}_{k}": v for k, v in link_metrics(scores[: pos.shape[1]],
                                                                   scores[pos.shape[1]:]).items()})
        return rec


@pytest.mark.heavy  # two torch processes under torchrun (~30 s)
def test_two_ranks_train_and_evaluate_what_one_process_computes(cora_links, tmp_path):
    links = cora_links
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    metrics = tmp_path / "m.jsonl"
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", "-m", "moment", "train", "--task", "link",
                           "--dataset", str(links), "--hidden", "32", "--embed-dim", "16", "--dropout", "0",
                           "--fanouts", "-1,-1", "--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--lr", str(LR),
                           "--seed", str(SEED), "--eval-every", "2", "--metrics", str(metrics), "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["world_size"] == 2 and len(out["epochs"]) == EPOCHS
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps_rec = [r for r in records if r["kind"] == "step"]
    assert all(r["rank"] == 0 for r in records)

    replay = _Replay(links)
    ds = replay.data.ds
    negatives = NegativeSampler(EdgeSet.from_csr(ds.indptr, ds.indices, ds.num_nodes),
                                degree=np.diff(np.asarray(ds.indptr)))
    steps = LinkSteps(replay.data.train_pos, negatives, BATCH, 1.0, seed=SEED, world_size=2)
    # every positive once per epoch over the ranks, the same steps on each
    for epoch in range(EPOCHS):
        seen = np.concatenate([p for p, _ in world_step_pairs(steps, epoch)], 1)
        assert sorted(map(tuple, seen.T.tolist())) == sorted(map(tuple, replay.data.train_pos.T.tolist()))
    rank0, means = replay.train(steps)
    assert [r["world_pairs"] for r in steps_rec] == [
        p.shape[1] + n.shape[1] for e in range(EPOCHS) for p, n in world_step_pairs(steps, e)]
    for epoch, rec in enumerate(out["epochs"]):
        assert rec["pairs"] == 2 * replay.data.train_pos.shape[1] and 0 < rec["rank_pairs"] < rec["pairs"]
        assert rec["loss"] == pytest.approx(means[epoch], rel=1e-5, abs=1e-6)
    assert len(steps_rec) == len(rank0) == EPOCHS * len(steps)
    # step by step: rank 0's loss on its part is what the replayed model gives those pairs
    np.testing.assert_allclose([r["loss_sum"] for r in steps_rec], rank0, rtol=1e-5)
    # the ranks drew different negatives: rank 0's pairs are not the world's first half mirrored
    first = world_step_pairs(steps, 0)[0][1]
    half = first.shape[1] // 2
    assert not np.array_equal(first[:, :half], first[:, half:])
    want = replay.evaluate()
    got = out["epochs"][-1]
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=2e-4), key
