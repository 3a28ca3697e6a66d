"""Several nodes on localhost (process groups through a c10d store): sharded training, refusals, failures.

Every test starts real ``moment train`` processes with torchrun's environment
(:mod:`tests.nodes_launch`); each node has its own directory of a placement
sharded over two nodes, on real Cora.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from iostack.bins import write_bins
from iostack.placement import simple_placement
from planner.handoff import PlanTargets, StoreTarget
from tests.conftest import flat_spec, graph_fixture
from tests.nodes_launch import launch, log, wait_all
from training.checkpoint import CHECKPOINT_NAME
from training.data import open_dataset
from training.hotness import degree_from_csr
from training.importers import import_dataset
from training.place.nodes import place_sharded
from training.place.specs import PolicySpec, ShardSpec, TierSpec
from training.trainer import train

COMMON = ["--fanouts=-1,-1", "--hidden", "16", "--dropout", "0", "--seed", "3", "--lr", "0.01", "--eval-every", "0",
          "--backend", "posix"]
CFG = dict(fanouts=(-1, -1), hidden=16, dropout=0.0, seed=3, lr=0.01, eval_every_epochs=0, backend="posix")


@pytest.fixture(scope="module")
def cora(tmp_path_factory) -> Path:
    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


def _sharded(ds_dir: Path, out: Path, replicas: int) -> Path:
    ds = open_dataset(ds_dir)
    hot = degree_from_csr(np.asarray(ds.indptr), np.asarray(ds.indices)).astype(np.float32)
    t = PlanTargets("toy", gpus=(("gpu0", "s0"),), stores=(StoreTarget("mem0", "cpu", "mem0", "s0", 1.0),
                                                           StoreTarget("ssd0", "ssd", "ssd0", "s0", 2.0)))
    place_sharded(ds.features, hot, t, out, TierSpec(cpu_cache_bytes=300 * ds.row_bytes, ssd_dirs=[out]),
                  PolicySpec(), ShardSpec(nodes=2, replicas=replicas, hot_rows=270 / ds.num_nodes), fsync=False)
    return out


@pytest.fixture(scope="module")
def shards(cora, tmp_path_factory) -> Path:
    """Cora over two nodes, the 270 hottest rows (by degree) on both; a CPU bin and an SSD bin per node."""
    return _sharded(cora, tmp_path_factory.mktemp("shards"), replicas=2)


def _train(node_dir: Path, *extra: str, cora: Path) -> list[str]:
    return ["train", "--dataset", str(cora), "--placement", str(node_dir), *COMMON, *extra]


def _steps(metrics: Path) -> list[dict]:
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "step"]


# ~9 s: the end-to-end check in the default run (the RPC exchange: slow)
@pytest.mark.parametrize("exchange", ["alltoall", pytest.param("rpc", marks=pytest.mark.slow)])
def test_two_nodes_train_what_one_process_trains(cora, shards, tmp_path, exchange):
    """Same seeds, full neighbourhoods: the sharded run's losses are one process's, with remote rows fetched."""
    m = tmp_path / "m.jsonl"
    args = ["--batch-size", "35", "--epochs", "2", "--metrics", str(m), "--exchange", exchange,
            "--remote-cache", "256KiB"]
    procs = launch([_train(shards / "node0", *args, cora=cora), _train(shards / "node1", *args, cora=cora)],
                   logs=tmp_path / "logs")
    assert wait_all(procs) == [[0], [0]], log(tmp_path / "logs", 0)[-2000:] + log(tmp_path / "logs", 1)[-2000:]
    one = []
    train(flat_spec(dataset=str(cora), batch_size=35, epochs=2, **CFG),
          progress=lambda r: one.append(r["loss"]) if r["kind"] == "step" else None)
    np.testing.assert_allclose([r["loss"] for r in _steps(m)], one, rtol=1e-5)
    ep = [r for r in map(json.loads, m.read_text().splitlines()) if r["kind"] == "epoch"]
    nodes = ep[-1]["nodes"]
    assert nodes["exchange"] == exchange and ep[-1]["param_spread"] == 0.0
    assert nodes["remote_rows"] > 0 and nodes["cache_rows"] > 0 and 0 < nodes["remote_share"] < 0.5
    assert nodes["served_rows"] == nodes["remote_rows"]  # every row fetched was served by the other node
    text = log(tmp_path / "logs", 0)
    assert "node shard" in text and "locality cache" in text


def _refused(cora, dirs, msg, logs):
    procs = launch([_train(d, "--batch-size", "35", cora=cora) for d in dirs], logs=logs)
    assert wait_all(procs) == [[2]] * len(dirs)
    for k in range(len(dirs)):
        text = log(logs, k)
        assert msg in text and "epoch 0" not in text, text[-1500:]
        assert text.strip().splitlines()[-1].startswith("moment train: error:")


@pytest.mark.heavy  # starts node processes that import torch (~13 s)
def test_a_node_started_with_another_nodes_directory_is_refused_before_training(cora, shards, tmp_path):
    _refused(cora, (shards / "node0", shards / "node0"), "were all started with shard 0's directory", tmp_path)


@pytest.mark.slow  # two more launches; join() is unit-tested on every case in test_shards.py
def test_nodes_of_different_placements_or_too_few_nodes_are_refused(cora, shards, tmp_path):
    other = _sharded(cora, tmp_path / "w1", replicas=1)
    _refused(cora, (shards / "node0", other / "node1"), "another placement", tmp_path / "a")
    _refused(cora, (shards,), "held by no node", tmp_path / "b")


@pytest.mark.heavy  # four launches of two nodes and a wait for the lost peer's timeout (~25 s)
def test_a_dead_node_is_a_clear_error_and_the_job_resumes(cora, shards, tmp_path):
    """kill -9 of one node mid-epoch: the other stops within 30 s with one line; a restart resumes."""
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    args = ["--batch-size", "7", "--epochs", "3", "--checkpoint", str(ck), "--checkpoint-every", "4",
            "--metrics", str(m)]
    node = [_train(shards / f"node{k}", *args, cora=cora) for k in range(2)]
    procs = launch(node, logs=tmp_path / "a")
    deadline = time.time() + 120
    while not (m.exists() and len(_steps(m)) >= 25):  # epoch 1, step 5: after a mid-epoch checkpoint
        assert time.time() < deadline and procs[0][0].poll() is None, log(tmp_path / "a", 0)[-2000:]
        time.sleep(0.05)
    procs[1][0].send_signal(signal.SIGKILL)
    t0 = time.time()
    code = procs[0][0].wait(timeout=60)
    waited = time.time() - t0
    wait_all(procs)
    text = log(tmp_path / "a", 0).strip().splitlines()[-1]
    assert code == 2 and waited < 30, (code, waited)
    # the job's heartbeats name the dead rank, whichever collective met its death
    assert re.match(r"moment train: error: epoch [12](, step \d+)?: .*rank 1 died", text), text
    assert "--resume" in text
    saved = torch.load(ck / CHECKPOINT_NAME, weights_only=False)
    assert 1 <= saved["epoch"] < 3  # mid-training: the restart has work left
    procs = launch([a + ["--resume"] for a in node], logs=tmp_path / "b")
    assert wait_all(procs) == [[0], [0]], log(tmp_path / "b", 0)[-2000:]
    assert f"resuming at epoch {saved['epoch']}, step {saved['step']}" in log(tmp_path / "b", 0)
    # the resumed job ends where an uninterrupted one does (one process: the same global batches)
    whole = train(flat_spec(dataset=str(cora), batch_size=7, epochs=3, **CFG))
    final = torch.load(ck / CHECKPOINT_NAME, weights_only=False)
    assert final["epoch"] == 3
    for k, v in whole.model.state_dict().items():
        torch.testing.assert_close(final["model"][k], v, rtol=1e-3, atol=1e-4)


@pytest.mark.slow  # waits out a collective timeout
def test_a_hung_node_times_out_with_a_clear_error(cora, shards, tmp_path):
    m = tmp_path / "m.jsonl"
    args = ["--batch-size", "7", "--epochs", "20", "--metrics", str(m), "--timeout", "3"]
    procs = launch([_train(shards / f"node{k}", *args, cora=cora) for k in range(2)], logs=tmp_path / "a")
    try:
        while not (m.exists() and len(_steps(m)) >= 10):
            assert procs[0][0].poll() is None, log(tmp_path / "a", 0)[-2000:]
            time.sleep(0.05)
        procs[1][0].send_signal(signal.SIGSTOP)  # alive, holding its sockets, answering nothing
        t0 = time.time()
        assert procs[0][0].wait(timeout=60) == 2
        assert time.time() - t0 < 3 + 10
        assert "Timed out" in log(tmp_path / "a", 0).strip().splitlines()[-1]
    finally:
        procs[1][0].send_signal(signal.SIGCONT)
        # the resumed node finds its peer gone only when its own --timeout (3 s) runs out; wait_all
        # kills what is left after this, and a loaded machine must not turn the clean-up into a failure
        with contextlib.suppress(subprocess.TimeoutExpired):
            wait_all(procs, timeout=30)


@pytest.mark.heavy  # kills and restarts rank processes, timing-sensitive under load (~20 s)
def test_kill_9_of_every_local_rank_leaves_no_shared_segment(cora, tmp_path):
    """Two ranks on one node map one copy of the CPU tier; nothing of it outlives them, killed or not."""
    ds = open_dataset(cora)
    pl = tmp_path / "pl"
    p = simple_placement(ds.num_nodes, [("cpu", 1000), ("ssd", ds.num_nodes)])
    write_bins(ds.features, p, pl, fsync=False)
    p.save(pl)
    shm, m = tmp_path / "shm", tmp_path / "m.jsonl"
    shm.mkdir()
    argv = ["train", "--dataset", str(cora), "--placement", str(pl), *COMMON, "--batch-size", "7", "--epochs", "20",
            "--metrics", str(m)]
    env = {"MOMENT_SHM_DIR": str(shm)}
    procs = launch([argv], local_size=2, logs=tmp_path / "a", env=env)
    while not (m.exists() and len(_steps(m)) >= 5):
        assert procs[0][0].poll() is None, log(tmp_path / "a", 0)[-2000:]
        time.sleep(0.05)
    assert "one copy per node" in " ".join(log(tmp_path / "a", 0).split())  # rank 0 prints; resume_ranks.py
    # (test_train.py) shows the other rank maps what this one filled
    for pr in procs[0]:
        pr.send_signal(signal.SIGKILL)
    wait_all(procs)
    assert os.listdir(shm) == []  # unlinked once both ranks had mapped it: the kernel freed it with them
    procs = launch([[*argv[:-2], "--epochs", "1"]], local_size=2, logs=tmp_path / "b", env=env)
    assert wait_all(procs) == [[0, 0]], log(tmp_path / "b", 0)[-2000:]
    assert os.listdir(shm) == []


def test_bad_node_options_are_one_line(cora, shards, capsys):
    from moment.cli import main

    base = ["train", "--dataset", str(cora), "--placement", str(shards / "node0"), "--epochs", "1"]
    for bad, msg in ((["--timeout", "0"], "--timeout 0.0"), (["--remote-cache", "lots"], "--remote-cache 'lots'"),
                     (["--remote-cache", "-1KiB"], "--remote-cache")):
        assert main([*base, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("moment train: error:") and msg in err and "\n" not in err, err
