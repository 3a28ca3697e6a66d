"""Heterogeneous training data-parallel: 2 ranks under torchrun train what one process trains."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch

from tests.conftest import REPO, flat_spec
from training.distributed import World
from training.hetero.graph import add_reverse
from training.hetero.ranks import rank_parts
from training.hetero.store import write_hetero
from training.hetero.synth import synth_mag
from training.hetero.train import train_hetero

#: full neighbourhoods (the batches' outputs per seed do not depend on how the global batch is split);
#: sage: 240 training papers in global batches of 239, so rank 1's part of the last step is empty
CONFIGS = [dict(model="hetero-sage", fanouts=[-1, -1], batch_size=239, hidden=16, lr=0.01, seed=5, epochs=2),
           dict(model="rgcn", fanouts=[-1, -1], batch_size=64, hidden=16, lr=0.01, seed=5, epochs=2)]


def test_every_seed_once_an_epoch_in_equal_steps() -> None:
    train = torch.arange(100, 210)
    worlds = [World(r, 3, torch.device("cpu"), False) for r in range(3)]
    parts = [rank_parts(train, 4, 32, w, seed=7) for w in worlds]
    assert len({len(p) for p in parts}) == 1  # every rank runs the same steps
    assert sorted(torch.cat([torch.cat(p) for p in parts]).tolist()) == train.tolist()
    one = rank_parts(train, 4, 32, World(0, 1, torch.device("cpu"), False), seed=7)
    for step, whole in enumerate(one):  # the global batch is one process's, split in rank order
        assert torch.equal(torch.cat([p[step] for p in parts]), whole)


@pytest.mark.heavy  # two torch processes under torchrun (~60 s)
def test_two_ranks_train_what_one_process_trains(tmp_path) -> None:
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    write_hetero(tmp_path / "mag", add_reverse(synth_mag()))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(REPO / "tests" / "hetero_ranks.py"),
                           str(tmp_path / "mag"), json.dumps(CONFIGS), str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for i, fields in enumerate(CONFIGS):
        steps: list[dict] = []
        one = train_hetero(flat_spec(dataset=str(tmp_path / "mag"), **fields),
                           progress=lambda r, steps=steps: steps.append(r) if r["kind"] == "step" else None)
        ranks = [json.loads((tmp_path / f"rank{r}-{i}.json").read_text()) for r in range(2)]
        assert all(r["world_size"] == 2 for r in ranks)
        for r in ranks:  # every rank reports the global batch's loss, one process's within float rounding
            assert [s["seeds"] for s in r["steps"]] == [s["seeds"] for s in steps]
            assert [s["loss"] for s in r["steps"]] == pytest.approx([s["loss"] for s in steps], rel=1e-4, abs=1e-6)
            last = r["epochs"][-1]
            assert last["param_spread"] == 0.0  # the ranks hold the same model
            assert last["valid_acc"] == one.final["valid_acc"]  # evaluation reduced exactly
            assert last["test_acc"] == one.final["test_acc"]
            assert last["seeds"] == one.final["seeds"] == 240
        assert ranks[0]["param_sum"] == pytest.approx(
            float(sum(p.detach().double().sum() for p in one.model.parameters())), rel=1e-4)
