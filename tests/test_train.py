"""The models, the training loop and `moment train`, on real Cora (Planetoid public split)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from iostack.bins import write_bins
from iostack.placement import simple_placement
from moment.cli import main
from tests.conftest import REPO, flat_spec, graph_fixture
from training.batches import epoch_seeds
from training.checkpoint import CHECKPOINT_NAME
from training.data import open_dataset
from training.errors import TrainError
from training.importers import import_dataset
from training.models import ModelError, build_model
from training.sampler import NeighborSampler
from training.specs import TrainSpec
from training.trainer import train

SMALL = dict(fanouts=(10, 5), batch_size=35, hidden=32, seed=3)  # 4 steps per epoch on Cora's 140 seeds


@pytest.fixture(scope="module")
def cora(tmp_path_factory) -> Path:
    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


@pytest.fixture(scope="module")
def cora_placement(cora, tmp_path_factory) -> Path:
    """500 rows in a CPU bin, the rest in an SSD bin file."""
    ds = open_dataset(cora)
    d = tmp_path_factory.mktemp("placement")
    p = simple_placement(ds.num_nodes, [("cpu", 500), ("ssd", ds.num_nodes)])
    write_bins(ds.features, p, d, fsync=False)
    p.save(d)
    return d


def _full_graph(ds):
    indptr = torch.from_numpy(np.array(ds.indptr))
    src = torch.from_numpy(np.array(ds.indices)).long()
    dst = torch.repeat_interleave(torch.arange(ds.num_nodes), indptr.diff())
    return torch.stack([src, dst]), indptr.diff().float()


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------------------------
# models


@pytest.mark.parametrize("name", ["sage", "gat", "gcn"])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_model_shapes_and_trimming_match_untrimmed(name, layers):
    torch.manual_seed(0)
    n = 40
    indptr = torch.arange(0, 3 * n + 1, 3)
    indices = torch.randint(0, n, (3 * n,))
    batch = NeighborSampler(indptr, indices, (2,) * layers, seed=1).sample(torch.arange(5))
    model = build_model(name, 6, 4, layers, hidden=8).eval()
    x = torch.randn(batch.num_nodes, 6)
    out = model(x, batch.edge_index_per_layer, batch.batch_size)
    assert out.shape == (5, 4)
    if name != "gcn":  # local GCN degrees depend on the edges given, by design
        untrimmed = model(x, (batch.edge_index,) * layers, batch.num_nodes)[:5]
        torch.testing.assert_close(out, untrimmed, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, hyper", [("sage", {}), ("gat", {"hidden": 8}), ("gcn", {"norm": "global"})])
def test_full_neighbourhoods_equal_full_graph(cora, name, hyper):
    """With fan-out -1 a sampled batch gives the seeds exactly the full-graph model's outputs."""
    ds = open_dataset(cora)
    x = torch.from_numpy(np.array(ds.features))
    ei, deg = _full_graph(ds)
    seeds = torch.from_numpy(np.asarray(ds.test_idx[:64]))
    b = NeighborSampler(ds.indptr, ds.indices, (-1, -1), seed=0).sample(seeds)
    torch.manual_seed(0)
    model = build_model(name, ds.feature_dim, ds.num_classes, 2, **hyper).eval()
    with torch.no_grad():
        out = model(x[b.n_id], b.edge_index_per_layer, b.batch_size, deg=deg[b.n_id])
        ref = model(x, (ei, ei), ds.num_nodes, deg=deg)[seeds]
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_build_model_refuses_bad_input():
    with pytest.raises(ModelError, match="expected one of"):
        build_model("gin", 4, 2, 2)
    with pytest.raises(ModelError, match="dropout"):
        build_model("sage", 4, 2, 2, dropout=1.5)
    with pytest.raises(ModelError, match="norm"):
        build_model("gcn", 4, 2, 2, norm="sym")


# ----------------------------------------------------------------------------------------------
# the loop


def test_loss_falls_and_metrics_are_written(cora, tmp_path):
    metrics = tmp_path / "m.jsonl"
    res = train(flat_spec(dataset=str(cora), epochs=4, metrics_path=str(metrics), **SMALL))
    losses = [r["loss"] for r in res.epochs]
    assert losses[-1] < 0.8 * losses[0]
    assert res.final["valid_acc"] > 0.5 and res.final["test_acc"] > 0.5
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["kind"] for r in recs].count("step") == 16 and recs[0]["kind"] == "start"
    step = next(r for r in recs if r["kind"] == "step")
    for key in ("sample_s", "gather_s", "compute_s", "allreduce_s", "io_wait_s", "seeds_per_s", "loss"):
        assert step[key] >= 0
    assert step["tiers"]["memory"]["rows"] > step["seeds"]
    epoch = recs[-1]
    assert epoch["kind"] == "epoch" and epoch["seeds"] == 140 and 0 <= epoch["io_wait_share"] <= 1


def test_two_ranks_parts_sum_to_the_single_process_gradient(cora):
    """The split semantics: each rank's loss over its part, scaled by the global batch, sums to one process's."""
    ds = open_dataset(cora)
    x = torch.from_numpy(np.array(ds.features))
    y = torch.from_numpy(np.asarray(ds.labels))
    sampler = NeighborSampler(ds.indptr, ds.indices, (-1, -1), seed=0)  # full: no sampling noise
    torch.manual_seed(0)
    model = build_model("sage", ds.feature_dim, ds.num_classes, 2, hidden=16, dropout=0.0)

    def grads(world: int) -> list[torch.Tensor]:
        total = [torch.zeros_like(p) for p in model.parameters()]
        for rank in range(world):
            part = epoch_seeds(ds.train_idx, 0, 64, rank=rank, world_size=world, seed=1)[2]  # the short last step
            b = sampler.sample(part)
            model.zero_grad()
            out = model(x[b.n_id], b.edge_index_per_layer, b.batch_size)
            (F.cross_entropy(out, y[part], reduction="sum") / 12).backward()  # 140 - 2 * 64 = 12 seeds
            for t, p in zip(total, model.parameters(), strict=True):
                t += p.grad
        return total

    for a, b in zip(grads(1), grads(2), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads(1), grads(5), strict=True):  # 5 ranks: some parts of 2 seeds, all still join
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_ssd_tier_gives_what_memory_gives(cora, cora_placement):
    cfg = flat_spec(dataset=str(cora), epochs=2, backend="posix", **SMALL)
    mem = train(cfg)
    ssd = train(TrainSpec.from_dict({**cfg.to_dict(), "placement": str(cora_placement)}))
    for k, v in _params(mem.model).items():
        assert torch.equal(v, _params(ssd.model)[k]), k
    tiers = ssd.final["tiers"]
    assert tiers["ssd"]["rows"] > 0 and tiers["cpu"]["rows"] > 0 and "memory" not in tiers
    assert tiers["ssd"]["bytes"] == tiers["ssd"]["rows"] * open_dataset(cora).row_bytes


class _Crash(Exception):
    pass


def test_checkpoint_resume_reproduces_the_uninterrupted_run(cora, tmp_path):
    """Interrupted mid-epoch (dropout on, so RNG states matter) and resumed: the same parameters."""
    base = dict(dataset=str(cora), epochs=3, dropout=0.5, checkpoint_every_steps=2, **SMALL)
    whole = train(flat_spec(checkpoint_dir=str(tmp_path / "a"), **base))

    def crash(rec):
        if rec["kind"] == "step" and rec["epoch"] == 1 and rec["step"] == 3:
            raise _Crash

    metrics = tmp_path / "b.jsonl"
    with pytest.raises(_Crash):
        train(flat_spec(checkpoint_dir=str(tmp_path / "b"), metrics_path=str(metrics), **base), progress=crash)
    again = train(flat_spec(checkpoint_dir=str(tmp_path / "b"), metrics_path=str(metrics), resume=True, **base))
    assert again.resumed_from == (1, 2)
    for k, v in _params(whole.model).items():
        assert torch.equal(v, _params(again.model)[k]), k
    assert again.epochs[0]["seeds"] == 140  # the epoch's sums survived the interruption
    assert again.epochs[0]["loss"] == pytest.approx(whole.epochs[1]["loss"], rel=1e-6)
    kinds = [json.loads(line)["kind"] for line in metrics.read_text().splitlines()]
    assert kinds.count("start") == 2 and kinds.count("epoch") == 3  # appended, nothing lost
    steps = [(r["epoch"], r["step"]) for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "step"]
    assert len(steps) == len(set(steps)) == 3 * whole.epochs[0]["steps"]  # the redone steps once each
    done = train(flat_spec(checkpoint_dir=str(tmp_path / "b"), resume=True, **base))
    assert done.epochs == () and done.resumed_from == (3, 0)
    with pytest.raises(TrainError, match="batch_size=35"):
        train(flat_spec(checkpoint_dir=str(tmp_path / "b"), resume=True, **{**base, "batch_size": 70}))


# ----------------------------------------------------------------------------------------------
# torchrun, two ranks, features on the SSD tier


# ~20-35 s (two fresh torch processes plus four in-process runs): in the default run, it is the end-to-end test
def test_torchrun_two_ranks_ssd_tier_equal_one_process_and_resume(cora, cora_placement, tmp_path):
    """Two gloo ranks: loss falls, ranks stay identical, equal one process, and the checkpoint resumes.

    Full neighbourhoods: sampled neighbours depend on the rank's sampler stream
    (training.batches reseeds per rank), so only with fan-out -1 are the batches of
    two ranks and of one process the same vertices and edges.
    """
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    ck = tmp_path / "ck"
    metrics = tmp_path / "m.jsonl"
    cmd = [torchrun, "--nproc-per-node", "2", "-m", "moment", "train", "--dataset", str(cora),
           "--placement", str(cora_placement), "--backend", "posix", "--fanouts=-1,-1", "--batch-size", "35",
           "--epochs", "3", "--hidden", "16", "--dropout", "0", "--seed", "3", "--lr", "0.01",
           "--checkpoint", str(ck), "--metrics", str(metrics), "--eval-every", "0"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    epochs = [r for r in recs if r["kind"] == "epoch"]
    assert len(epochs) == 3 and all(r["world_size"] == 2 for r in recs)
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    assert all(r["param_spread"] == 0.0 for r in epochs)  # the ranks' parameters are identical
    assert epochs[-1]["tiers"]["ssd"]["rows"] > 0
    start = next(r for r in recs if r["kind"] == "start")
    assert start["node_shared_reads"]["on"] and start["config"]["node_shared_reads"]  # on by default
    shared = epochs[-1]["node_shared_reads"]
    assert shared["on"] and shared["fell_back"] is None and shared["wait_s"] >= 0, shared
    assert epochs[-1]["ssd_reads"]["pages"] > 0  # rank 0's part of the node's SSD pages
    assert all("share_wait_s" in r for r in recs if r["kind"] == "step")
    cfg = dict(dataset=str(cora), placement=str(cora_placement), fanouts=(-1, -1), batch_size=35, hidden=16,
               dropout=0.0, seed=3, lr=0.01, eval_every_epochs=0, backend="posix")
    one = train(flat_spec(epochs=3, **cfg))
    two = torch.load(ck / CHECKPOINT_NAME, weights_only=False)
    for k, v in _params(one.model).items():
        torch.testing.assert_close(two["model"][k], v, rtol=1e-3, atol=1e-4)
    # the two-rank checkpoint resumes (here in one process: the same global batches)
    resumed = train(flat_spec(epochs=4, checkpoint_dir=str(ck), resume=True, **cfg))
    whole = train(flat_spec(epochs=4, **cfg))
    assert resumed.resumed_from == (3, 0)
    for k, v in _params(whole.model).items():
        torch.testing.assert_close(_params(resumed.model)[k], v, rtol=1e-3, atol=1e-4)


@pytest.mark.heavy  # two torchrun launches (~11 s); the equality of N ranks and one process stays in the default run
def test_torchrun_two_ranks_resume_exactly_with_dropout(cora, cora_placement, tmp_path):
    """Dropout draws from each rank's own random stream: a resumed rank must get its own back.

    Sampled fan-outs, dropout 0.5, interrupted mid-epoch and resumed in two gloo
    ranks: parameters identical to the uninterrupted run. The same checkpoint with
    rank 0's streams on every rank (how checkpoints were before) does not give them.
    """
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    cmd = [torchrun, "--nproc-per-node", "2", str(REPO / "tests" / "resume_ranks.py"), str(cora),
           str(cora_placement), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["resumed_from"] == [1, 2] and r["resumed_equal"] for r in res), res
    assert not any(r["rank0_streams_equal"] for r in res), res
    shared = [next(n for n in r["store_notes"] if "one copy per node" in n) for r in res]
    assert sorted("filled here" in n for n in shared) == [False, True], shared  # one copy, two ranks


@pytest.mark.heavy  # three torch processes (~15 s)
def test_torchrun_three_ranks_with_an_empty_part_equal_one_process(cora, tmp_path):
    """DDP with a rank whose part of the last step is empty: 140 seeds in batches of 69 leave 2 for 3 ranks.

    That rank still runs its step (a forward over zero rows), so DDP's all-reduce
    completes and the world trains what one process trains.
    """
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    ck = tmp_path / "ck"
    cmd = [torchrun, "--nproc-per-node", "3", "-m", "moment", "train", "--dataset", str(cora), "--fanouts=-1,-1",
           "--batch-size", "69", "--epochs", "2", "--hidden", "16", "--dropout", "0", "--seed", "3", "--lr", "0.01",
           "--checkpoint", str(ck), "--metrics", str(tmp_path / "m.jsonl"), "--eval-every", "0"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["seeds"] for r in recs if r["kind"] == "step"][:3] == [69, 69, 2]
    assert all(r["param_spread"] == 0.0 for r in recs if r["kind"] == "epoch")
    one = train(flat_spec(dataset=str(cora), fanouts=(-1, -1), batch_size=69, epochs=2, hidden=16, dropout=0.0,
                            seed=3, lr=0.01, eval_every_epochs=0))
    three = torch.load(ck / CHECKPOINT_NAME, weights_only=False)
    assert not any(k.startswith("module.") for k in three["model"])  # the module's own state, as one process saves
    for k, v in _params(one.model).items():
        torch.testing.assert_close(three["model"][k], v, rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# the command line


def test_cli_trains_and_writes_metrics(cora, tmp_path, capsys):
    metrics = tmp_path / "m.jsonl"
    rc = main(["train", "--dataset", str(cora), "--fanouts", "5,5", "--batch-size", "70", "--epochs", "1",
               "--hidden", "16", "--metrics", str(metrics), "--checkpoint", str(tmp_path / "ck")])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "test accuracy" in out and "epoch 0: loss" in err
    assert (tmp_path / "ck" / CHECKPOINT_NAME).exists()
    assert json.loads(metrics.read_text().splitlines()[-1])["kind"] == "epoch"


def _one_line_error(argv, capsys, match):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("moment train: error:"), err
    assert match in err


def test_cli_bad_input_is_one_line_exit_2(cora, cora_placement, tmp_path, capsys):
    _one_line_error(["train", "--dataset", str(tmp_path / "missing")], capsys, "no such dataset directory")
    _one_line_error(["train", "--dataset", str(cora), "--fanouts", "10,x"], capsys, "--fanouts '10,x'")
    _one_line_error(["train", "--dataset", str(cora), "--fanouts", "10,0"], capsys, "--fanouts")
    other = tmp_path / "other"
    simple_placement(100, [("ssd", 100)]).save(other)
    _one_line_error(["train", "--dataset", str(cora), "--placement", str(other)], capsys, "100 vertices")
    _one_line_error(["train", "--dataset", str(cora), "--placement", str(tmp_path / "nope")], capsys,
                    "no such placement directory")
    _one_line_error(["train", "--dataset", str(cora), "--batch-size", "0"], capsys, "--batch-size 0")
    _one_line_error(
        ["train", "--dataset", str(cora), "--resume"], capsys, "needs a checkpoint directory (--checkpoint)"
    )
    _one_line_error(["train", "--dataset", str(cora), "--hidden", "0"], capsys, "hidden")
    # a checkpoint directory under a regular file fails before training, not after an epoch
    _one_line_error(["train", "--dataset", str(cora), "--checkpoint", str(cora / "meta.json" / "ck")], capsys,
                    "meta.json is a file, not a directory")
    junk = tmp_path / "junk"
    junk.mkdir()
    torch.save({"a": 1}, junk / "checkpoint.pt")
    _one_line_error(["train", "--dataset", str(cora), "--checkpoint", str(junk), "--resume"], capsys,
                    "not a Moment training checkpoint")


def test_resume_on_another_dataset_is_a_clear_error_and_new_lr_applies(cora, tmp_path, capsys):
    from training.synth import SynthSpec
    from training.synth_run import synthesize

    ck = tmp_path / "ck"
    small = ["--fanouts", "5,5", "--batch-size", "70", "--hidden", "8", "--checkpoint", str(ck)]
    assert main(["train", "--dataset", str(cora), *small, "--epochs", "1"]) == 0
    capsys.readouterr()
    other = tmp_path / "g"
    synthesize(other, SynthSpec(num_nodes=500, num_edges=4000, feature_dim=12, train_share=0.3, seed=2))
    _one_line_error(["train", "--dataset", str(other), *small, "--epochs", "2", "--resume"], capsys,
                    "does not fit this model and dataset")
    # a resumed run takes this run's learning rate, not the checkpoint's
    assert main(["train", "--dataset", str(cora), *small, "--epochs", "2", "--resume", "--lr", "0.5"]) == 0
    state = torch.load(ck / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert state["optimizer"]["param_groups"][0]["lr"] == 0.5


def test_python_dash_m_moment_train_help():
    proc = subprocess.run([sys.executable, "-m", "moment", "train", "--help"], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == 0 and "--placement" in proc.stdout


# ----------------------------------------------------------------------------------------------
# a non-finite loss or gradient stops the run; the last checkpoint stays


def test_a_nan_loss_stops_training_naming_epoch_and_step_and_keeps_the_checkpoint(cora, tmp_path):
    """The issue's case: NaN bytes in features.npy of a dataset written before checksums existed."""
    poisoned = tmp_path / "cora-nan"
    shutil.copytree(cora, poisoned)
    meta = json.loads((poisoned / "meta.json").read_text())
    del meta["checksums"]  # as written before checksums: nothing on open can tell
    (poisoned / "meta.json").write_text(json.dumps(meta))
    feats = np.load(poisoned / "features.npy", mmap_mode="r+")
    feats[:, 0] = np.nan  # every row, so that the first step of any epoch meets one
    feats.flush()
    del feats
    ckpt = tmp_path / "ck"
    train(flat_spec(dataset=str(cora), epochs=1, checkpoint_dir=str(ckpt), **SMALL))
    before = (ckpt / CHECKPOINT_NAME).read_bytes()
    seen = []
    with pytest.raises(TrainError, match=r"^epoch 1, step 0: the loss is nan; training stopped before updating"):
        train(flat_spec(dataset=str(poisoned), epochs=3, checkpoint_dir=str(ckpt), resume=True,
                          checkpoint_every_steps=1, **SMALL), progress=seen.append)
    assert (ckpt / CHECKPOINT_NAME).read_bytes() == before
    assert not [r for r in seen if r.get("kind") in ("step", "epoch")]  # no record of the bad step


def test_a_non_finite_gradient_with_a_finite_loss_is_named():
    from training.trainer import _refuse_non_finite

    _refuse_non_finite(torch.tensor([0.5, -1.0, 2.0, 3.0]), 0, 0)  # all finite: nothing happens
    with pytest.raises(TrainError, match="epoch 4, step 7: a gradient is NaN or infinite"):
        _refuse_non_finite(torch.tensor([0.5, float("inf"), 2.0, 3.0]), 4, 7)


def test_cli_reports_the_nan_step_in_one_line(cora, tmp_path, capsys):
    poisoned = tmp_path / "cora-nan"
    shutil.copytree(cora, poisoned)
    meta = json.loads((poisoned / "meta.json").read_text())
    del meta["checksums"]
    (poisoned / "meta.json").write_text(json.dumps(meta))
    feats = np.load(poisoned / "features.npy", mmap_mode="r+")
    feats[:, :4] = np.inf
    feats.flush()
    del feats
    assert main(["train", "--dataset", str(poisoned), "--epochs", "1", "--fanouts", "10,5"]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert len(errors) == 1 and errors[0].startswith("moment train: error: epoch 0, step 0: the loss is nan")
    assert "Traceback" not in errors[0]
