"""Node-shared SSD reads across real processes (training.nodeshare): gloo on the CPU, two ranks.

Who shares is decided the same way on every rank: one node's ranks share; ranks
that report different nodes, different step counts, or a rank that turned it
off, read privately, and none waits for another. The fast logic (union, split,
copy, fallbacks) is tested with threads in tests/test_nodeshare.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO

N, DIM = 3000, 16  # 64-byte rows, 64 to a page


def _placed(d: Path):
    from iostack.bins import write_bins
    from iostack.placement import simple_placement

    rng = np.random.default_rng(0)
    feats = rng.random((N, DIM)).astype(np.float32)
    p = simple_placement(N, [("cpu", 500), ("ssd", 1200), ("ssd", N - 1700)], order=rng.permutation(N))
    write_bins(feats, p, d, fsync=False)
    return feats, p


def _gathers(steps_store, store, feats, rank: int, steps: int) -> bool:
    """``steps`` training gathers through ``steps_store`` on a thread (as the prefetch thread makes them), plus
    private ones through ``store`` between."""
    rng = np.random.default_rng(10 + rank)
    ok = []

    def run():
        for _ in range(steps):
            ids = rng.integers(0, N, 600)
            ok.append(torch.equal(steps_store.gather(torch.from_numpy(ids)), torch.from_numpy(feats[ids])))
            if rank == 0:  # an evaluation gather on one rank only: private, no collective
                e = rng.integers(0, N, 50)
                ok.append(torch.equal(store.gather(torch.from_numpy(e)), torch.from_numpy(feats[e])))

    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    return not t.is_alive() and all(ok)


def _worker(rank: int, d: str) -> None:
    import torch.distributed as dist

    from iostack.store import FeatureStore
    from training.distributed import World
    from training.nodeshare import setup_node_shared_reads, ssd_reads

    dist.init_process_group("gloo", init_method=f"file://{d}/init", rank=rank, world_size=2)
    feats, p = _placed(Path(d) / f"bins{rank}")
    out = {}
    # scenario: (GROUP_RANK, local rank, local size, steps, wanted)
    scenarios = {"one node": ("0", rank, 2, 3, True),
                 "two nodes": (str(rank), 0, 1, 3, True),
                 "steps differ": ("0", rank, 2, 3 + rank, True),
                 "rank 1 turned it off": ("0", rank, 2, 3, rank == 0)}
    for name, (node, local, size, steps, wanted) in scenarios.items():
        os.environ["GROUP_RANK"] = node
        world = World(rank, 2, torch.device("cpu"), True, local_rank=local, local_size=size)
        store = FeatureStore(p, Path(d) / f"bins{rank}", features=feats, backend="posix",
                             backend_options={"processes": 0, "threads": 2})
        shared = setup_node_shared_reads(wanted, world, store, steps, 20.0)
        equal = _gathers(shared.features, store, feats, rank, steps if shared.on else 2)
        out[name] = {"on": shared.on, "why": shared.why, "equal": equal, **ssd_reads(shared.features)}
        store.close()
    Path(d, f"out{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


@pytest.mark.heavy  # two spawned torch processes (~10 s)
def test_the_node_decides_together_and_gathers_stay_exact(tmp_path):
    import torch.multiprocessing as mp

    before = {p.name for p in Path("/dev/shm").glob("moment-nsr-*")} if Path("/dev/shm").is_dir() else set()
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)
    res = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(2)]
    for r in res:
        assert all(s["equal"] for s in r.values()), r
        assert r["one node"]["on"] and r["one node"]["node_shared_reads"]["on"], r["one node"]
        assert not r["two nodes"]["on"] and "one rank on this node" in r["two nodes"]["why"]
        assert not r["steps differ"]["on"] and "different numbers of steps" in r["steps differ"]["why"]
        assert not r["rank 1 turned it off"]["on"] and "local rank 1: turned off" in r["rank 1 turned it off"]["why"]
    # the node read each page once: its ranks' pages add up to less than each alone would read
    assert all(r["one node"]["ssd_reads"]["pages"] > 0 for r in res)
    after = {p.name for p in Path("/dev/shm").glob("moment-nsr-*")} if Path("/dev/shm").is_dir() else set()
    assert after <= before  # no buffer outlives the job


@pytest.mark.heavy  # two torchrun launches (~40 s)
def test_torchrun_shared_and_private_reads_train_the_same_model(tmp_path):
    """``moment train`` under torchrun with node-shared reads (default) and without: identical parameters."""
    from tests.conftest import graph_fixture
    from training.data import open_dataset
    from training.importers import import_dataset

    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    cora = import_dataset(graph_fixture("cora"), tmp_path / "cora")
    ds = open_dataset(cora)
    from iostack.bins import write_bins
    from iostack.placement import simple_placement

    place = tmp_path / "place"
    place.mkdir()
    p = simple_placement(ds.num_nodes, [("cpu", 500), ("ssd", ds.num_nodes)])
    write_bins(ds.features, p, place, fsync=False)
    p.save(place)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    models, starts = [], []
    for extra in ([], ["--no-node-shared-reads"]):
        ck, m = tmp_path / f"ck{len(extra)}", tmp_path / f"m{len(extra)}.jsonl"
        cmd = [torchrun, "--nproc-per-node", "2", "-m", "moment", "train", "--dataset", str(cora), "--placement",
               str(place), "--backend", "posix", "--fanouts=10,5", "--batch-size", "35", "--epochs", "2",
               "--hidden", "16", "--seed", "3", "--checkpoint", str(ck), "--metrics", str(m), "--eval-every", "1",
               *extra]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        recs = [json.loads(line) for line in m.read_text().splitlines()]
        starts.append(next(r for r in recs if r["kind"] == "start"))
        models.append(torch.load(ck / "checkpoint.pt", weights_only=False)["model"])
    assert starts[0]["node_shared_reads"]["on"] and not starts[1]["node_shared_reads"]["on"]
    assert starts[1]["config"]["node_shared_reads"] is False
    for k, v in models[1].items():  # the same rows, bit for bit, so the same training
        assert torch.equal(models[0][k], v), k
