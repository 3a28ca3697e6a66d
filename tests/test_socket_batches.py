"""`moment train` on a socket-aware placement: each socket's ranks train on their socket's part.

(:mod:`training.socket_batches`.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moment.cli import main
from tests.conftest import REPO, flat_spec, graph_fixture
from training.batches import LocalBatchSource, global_batch
from training.data import open_dataset
from training.distributed import World
from training.importers.planetoid import import_planetoid
from training.place.sockets import socket_seed_split
from training.sampler import NeighborSampler, SamplerError
from training.socket_batches import SocketBatchSource, SocketLayout, measured_cross_share, socket_source
from training.trainer import train

FAN, BATCH = "10,5", 32


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    """Cora placed for Machine A with two GPUs in layout (c), one per socket (socket-aware), and for Machine B
    (its GPUs on one socket: not socket-aware)."""
    d = tmp_path_factory.mktemp("sockets")
    cora = import_planetoid(graph_fixture("cora"), d / "cora")
    out = {"cora": cora}
    for name, args in (("aware", ["--machine", "moment-a", "--gpus", "2", "--layout", "c"]),
                       ("one", ["--machine", "moment-b"])):
        plan = d / f"plan-{name}.json"
        with open(plan, "w") as fh:
            subprocess.run(["python3", "-m", "moment", "plan", "--json", "--top", "1", *args], stdout=fh, check=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
        assert main(["place", "--dataset", str(cora), "--plan", str(plan), "--gpu-cache", "0", "--cpu-cache",
                     "256KiB", "--fanouts", FAN, "--batch-size", str(BATCH), "--out", str(d / name), "--json",
                     *[a for _ in range(8) for a in ("--ssd", str(d / f"ssd-{name}"))]]) == 0
        out[name] = d / name
    return out


def _world(rank: int, size: int) -> World:
    return World(rank, size, torch.device("cpu"), False, local_rank=rank, local_size=size)


def _spec(placed, name: str, **extra):
    return flat_spec(dataset=str(placed["cora"]), placement=str(placed[name]), fanouts=(10, 5), batch_size=BATCH,
                     hidden=16, seed=3, eval_every_epochs=0, backend="posix", epochs=1, **extra)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), batch=st.integers(2, 70), gpus=st.lists(st.integers(1, 3), min_size=2, max_size=3),
       epoch=st.integers(0, 3), data=st.data())
def test_every_vertex_once_per_epoch_on_its_socket_in_equal_steps(n, batch, gpus, epoch, data):
    """Whatever the ranges' sizes: every rank runs the same steps, takes seeds of its socket's range only, every
    training vertex once an epoch, and each step's global batch is the ranks' parts summed, at most the batch."""
    socks = tuple(f"s{k}" for k in range(len(gpus)))
    gpu_sockets = tuple(s for s, g in zip(socks, gpus, strict=True) for _ in range(g))
    order = data.draw(st.permutations(list(gpu_sockets)))
    counts = [order.count(s) for s in socks]  # the plan's GPUs in any order over the sockets
    lay = SocketLayout(socks, tuple(counts), tuple(order))
    if batch < len(socks):
        return
    ids = np.random.default_rng(n).choice(10 * n, n, replace=False)
    sampler = NeighborSampler(torch.zeros(10 * n + 1, dtype=torch.long), torch.zeros(0, dtype=torch.long), (1,))
    srcs = [SocketBatchSource(sampler, ids, batch, lay, rank=r, world_size=len(order), seed=7) for r in
            range(len(order))]
    ranges = socket_seed_split(ids, counts)
    assert len({s.steps(epoch) for s in srcs}) == 1
    parts = [s.seeds(epoch) for s in srcs]
    assert all(len(p) == srcs[0].steps(epoch) for p in parts)
    for r, p in enumerate(parts):
        mine = np.concatenate([t.numpy() for t in p])
        assert np.isin(mine, ranges[socks.index(order[r])]).all()
    everything = np.concatenate([t.numpy() for p in parts for t in p])
    assert np.array_equal(np.sort(everything), np.sort(ids))
    sizes = [sum(len(p[s]) for p in parts) for s in range(srcs[0].steps(epoch))]
    assert sizes == [srcs[0].global_batch(epoch, s) for s in range(len(sizes))] and max(sizes) <= batch


def test_a_socket_without_ranks_or_seeds_per_step_is_refused():
    lay = SocketLayout(("s0", "s1"), (1, 1), ("s0", "s1"))
    s = NeighborSampler(torch.zeros(11, dtype=torch.long), torch.zeros(0, dtype=torch.long), (1,))
    with pytest.raises(SamplerError, match="none of the 1 ranks"):
        SocketBatchSource(s, np.arange(10), 4, lay, rank=0, world_size=1)
    with pytest.raises(SamplerError, match="use at least 2"):
        SocketBatchSource(s, np.arange(10), 1, lay, rank=0, world_size=2)


def test_runs_that_cannot_follow_the_split_keep_todays_batches(placed):
    """No socket-aware placement, one rank, or a server: no socket source (the run's usual one), and why."""
    ds = open_dataset(placed["cora"])
    idx = np.asarray(ds.train_idx)
    csr = (torch.as_tensor(ds.indptr), torch.as_tensor(ds.indices))
    why = {name: socket_source(_spec(placed, name), idx, _world(0, size), csr)
           for name, size in (("one", 2), ("aware", 1))}
    assert all(src is None for src, _ in why.values())
    assert "not socket-aware (the plan's GPUs sit on one socket)" in why["one"][1]["why_not"]
    assert "not on every socket" in why["aware"][1]["why_not"]
    assert "placement_socket_aware" not in why["one"][1] and why["aware"][1]["placement_socket_aware"]
    src, split = socket_source(_spec(placed, "aware", server="127.0.0.1:1"), idx, _world(0, 2), csr)
    assert src is None and "sampling server" in split["why_not"]
    src, split = socket_source(_spec(placed, "aware"), idx, _world(1, 2), csr)
    assert split["used"] and split["socket"] == "socket1" and isinstance(src, SocketBatchSource)
    local = LocalBatchSource(NeighborSampler(*csr, (10, 5)), idx, BATCH)  # today's global batches, unchanged
    assert [global_batch(local, 0, s, idx.size, BATCH) for s in range(local.steps(0))] == [32, 32, 32, 32, 12]


def test_training_on_a_placement_that_is_not_socket_aware_is_unchanged(placed):
    """On moment-b's placement `train` builds today's source: the model equals one trained on a LocalBatchSource
    handed in, bit for bit, and the start record says why the split is not used."""
    ds = open_dataset(placed["cora"])
    csr = (torch.as_tensor(ds.indptr), torch.as_tensor(ds.indices))
    starts: list[dict] = []
    a = train(_spec(placed, "one"), progress=lambda r: starts.append(r) if r["kind"] == "start" else None)
    given = LocalBatchSource(NeighborSampler(*csr, (10, 5), seed=3), np.asarray(ds.train_idx), BATCH, seed=3)
    b = train(_spec(placed, "one"), source=given)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert starts[0]["socket_split"]["used"] is False


def _cross(results: list[dict], kind: str, report: dict) -> list[float]:
    """The measured share of the rows the ranks read from the other socket's bins, per epoch."""
    ranks = sorted(results, key=lambda r: r["rank"])
    epochs = [[x["bin_rows"] for x in r[kind] if x["kind"] == "epoch"] for r in ranks]
    return [measured_cross_share(report, [e[i] for e in epochs]) for i in range(len(epochs[0]))]


@pytest.mark.heavy  # two torch processes, four trainings (~35 s)
def test_two_ranks_train_on_their_sockets_and_cross_as_the_placement_predicted(placed, tmp_path):
    """Two gloo ranks on Machine A (c) with a GPU per socket: each rank's seeds come from its socket's range only,
    both run the same steps, every training vertex once an epoch; the rows they read from the other socket's bins
    are the share `moment place` predicted on held-out reads (within 0.08), less than half of what the same
    placement is read with today's batches (every rank a part of every batch: about hash's share)."""
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    cmd = [torchrun, "--nproc-per-node", "2", str(REPO / "tests" / "socket_ranks.py"), str(placed["cora"]),
           str(placed["aware"]), str(tmp_path), FAN, str(BATCH), "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(2)]
    assert [r["start_split"]["socket"] for r in res] == ["socket0", "socket1"]
    train_idx = np.asarray(open_dataset(placed["cora"]).train_idx)
    ranges = socket_seed_split(train_idx, [1, 1])
    for e in range(2):
        steps = [[x for x in r["aware"] if x["kind"] == "step" and x["epoch"] == e] for r in res]
        assert len(steps[0]) == len(steps[1]) == len(res[0]["seeds"][e])
        assert sum(x["seeds"] for x in steps[0]) == train_idx.size  # the loss was scaled by these
        for r in res:
            assert np.isin(np.concatenate([np.asarray(p, np.int64) for p in r["seeds"][e]]), ranges[r["rank"]]).all()
        used = np.concatenate([np.asarray(p, np.int64) for r in res for p in r["seeds"][e]])
        assert np.array_equal(np.sort(used), np.sort(train_idx))
    report = json.loads((placed["aware"] / "place.json").read_text())
    held = report["socket_aware"]["held_out_cross_socket_share"]
    aware, plain = _cross(res, "aware", report), _cross(res, "plain", report)
    assert all(abs(a - held) < 0.08 for a in aware), (aware, held)
    assert all(a < 0.5 * p for a, p in zip(aware, plain, strict=True)), (aware, plain)


def test_moment_train_warns_when_it_cannot_follow_a_socket_aware_placement(placed, capsys):
    """One rank on a two-socket placement: `moment train` trains every seed and says the shares do not hold."""
    assert main(["train", "--dataset", str(placed["cora"]), "--placement", str(placed["aware"]), "--epochs", "1",
                 "--fanouts", FAN, "--batch-size", str(BATCH), "--eval-every", "0"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "the placement is socket-aware but the seeds are not split by socket" in err
    assert "not on every socket of the split" in err


def test_the_loaders_global_batch_is_what_its_steps_hold(placed):
    """MomentLoader (the user's loop) says each step's global batch: its seeds here, one rank, summing to the split."""
    from training.loader import open_loader

    with open_loader(placed["cora"], placed["one"], fanouts=(10, 5), batch_size=BATCH, seed=3) as loader:
        sizes = [b.batch.batch_size for b in loader]
        assert sizes == [loader.global_batch(s) for s in range(len(loader))] == [32, 32, 32, 32, 12]
