"""Distributed sampling over a partitioned CSR (training.distsample): gloo, 2 and 3 spawned ranks.

Each rank holds the global ``indptr`` and its partition's slice of ``indices``, written in the
partition format (``partition.json``, ``indptr.npy``, ``part-K/indices.npy``) from Cora relabelled
by a random partition; its batches must equal :class:`training.sampler.NeighborSampler`'s over
the whole relabelled graph for the same seeds and sampler seed, bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, graph_fixture
from training.distsample import PartitionLayout
from training.sampler import SamplerError

#: (relabel, replace, fanouts) of every comparison; each rank runs all of them in one process
CONFIGS = [(relabel, replace, fanouts) for relabel in ("map", "unique") for replace in (False, True)
           for fanouts in ((4, 3), (-1, -1))]


def partition_csr(indptr: np.ndarray, indices: np.ndarray, part_of: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray]:
    """Relabel a CSR so that partition ``k`` owns a contiguous id range (increasing old id inside).

    Returns ``(indptr, indices, node_offsets, old_ids)`` of the relabelled graph; ``old_ids[new]``
    is the old id. The test's stand-in for ``moment data partition``'s writer.
    """
    parts = int(part_of.max()) + 1
    old_ids = np.argsort(part_of, kind="stable")
    new_of_old = np.empty_like(old_ids)
    new_of_old[old_ids] = np.arange(old_ids.size)
    deg = np.diff(indptr)[old_ids]
    new_indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    rows = [indices[indptr[o]:indptr[o + 1]] for o in old_ids]
    new_indices = new_of_old[np.concatenate(rows)].astype(indices.dtype) if rows else indices[:0]
    node_offsets = [0, *np.cumsum(np.bincount(part_of, minlength=parts)).tolist()]
    return new_indptr, new_indices, node_offsets, old_ids


def write_partition(out: Path, indptr: np.ndarray, indices: np.ndarray, node_offsets: list[int]) -> None:
    """The relabelled CSR in the partition format (its files a rank reads: ``moment data partition`` writes more)."""
    edge_offsets = [int(indptr[v]) for v in node_offsets]
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "indptr.npy", indptr)
    for k in range(len(node_offsets) - 1):
        (out / f"part-{k}").mkdir(exist_ok=True)
        np.save(out / f"part-{k}" / "indices.npy", indices[edge_offsets[k]:edge_offsets[k + 1]])
    (out / "partition.json").write_text(json.dumps({"parts": len(node_offsets) - 1, "node_offsets": node_offsets,
                                                    "edge_offsets": edge_offsets}))


@pytest.fixture(scope="module")
def cora_csr() -> tuple[np.ndarray, np.ndarray]:
    import scipy.sparse as sp

    z = np.load(graph_fixture("cora", "cora.npz"))
    a = sp.csr_matrix((z["adj_data"], z["adj_indices"], z["adj_indptr"]), shape=tuple(z["adj_shape"]))
    a = (a + a.T).tocsr()
    a.sort_indices()
    return a.indptr.astype(np.int64), a.indices.astype(np.int32)


def _partitioned(cora_csr, d: Path, parts: int) -> None:
    indptr, indices = cora_csr
    part_of = np.random.default_rng(parts).integers(0, parts, indptr.size - 1)
    new_indptr, new_indices, node_offsets, old_ids = partition_csr(indptr, indices, part_of)
    write_partition(d / "part", new_indptr, new_indices, node_offsets)
    np.save(d / "whole_indices.npy", new_indices)
    np.save(d / "old_ids.npy", old_ids)
    np.save(d / "orig_indptr.npy", indptr)
    np.save(d / "orig_indices.npy", indices)


def read_partition(d: Path, rank: int) -> tuple[np.ndarray, np.ndarray, PartitionLayout]:
    """``(global indptr, rank's slice of indices, layout)`` from the files ``write_partition`` wrote."""
    meta = json.loads((d / "partition.json").read_text())
    return (np.load(d / "indptr.npy", mmap_mode="r"), np.load(d / f"part-{rank}" / "indices.npy", mmap_mode="r"),
            PartitionLayout(tuple(meta["node_offsets"]), tuple(meta["edge_offsets"])))


def _seed_batches(rank: int, size: int, num_nodes: int) -> list[torch.Tensor]:
    """Uneven work: rank r has 3 + r batches, its first batch empty on the last rank (zero seeds)."""
    g = torch.Generator().manual_seed(100 + rank)
    out = [torch.randperm(num_nodes, generator=g)[: 5 + 7 * i] for i in range(3 + rank)]
    if rank == size - 1:
        out[0] = out[0][:0]
    return out


def _same(a, b) -> bool:
    return (torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
            and a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges)


def _worker(rank: int, d: str, size: int) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from training.distsample import DistributedNeighbours, sample_batches
    from training.heartbeats import Heartbeats
    from training.sampler import NeighborSampler

    dist.init_process_group("gloo", init_method=f"file://{d}/init", rank=rank, world_size=size,
                            timeout=timedelta(seconds=60))
    indptr, local, layout = read_partition(Path(d) / "part", rank)
    whole = torch.from_numpy(np.load(Path(d) / "whole_indices.npy"))
    beats = Heartbeats.for_job(every_s=0.2)
    source = DistributedNeighbours(local, layout, heartbeats=beats)
    results = []
    for k, (relabel, replace, fanouts) in enumerate(CONFIGS):
        ref = NeighborSampler(torch.from_numpy(np.asarray(indptr)), whole, fanouts, replace, seed=k, relabel=relabel)
        ours = NeighborSampler(indptr, source, fanouts, replace, seed=k, relabel=relabel)
        batches = _seed_batches(rank, size, layout.node_offsets[-1])
        reseed = (lambda i, k=k: 1000 * k + i) if k % 2 else None
        got = list(sample_batches(ours, batches, source, prefetch=k % 3, reseed=reseed))
        same = []
        for i, seeds in enumerate(batches):
            if reseed is not None:
                ref.reseed(reseed(i))
            same.append(_same(got[i], ref.sample(seeds)))
        results.append({"config": [relabel, replace, list(fanouts)], "same": same,
                        "edges": [b.num_edges for b in got]})
    stats = source.stats.as_dict()
    training = _training_batches(Path(d), rank, size, source, indptr, whole)
    Path(d, f"out{rank}.json").write_text(json.dumps({"results": results, "stats": stats, "training": training}))
    source.close()
    dist.destroy_process_group()


def _training_batches(d: Path, rank: int, size: int, source, indptr, whole) -> dict:
    """PartitionedBatchSource against LocalBatchSource: over the original graph with full neighbourhoods (the
    same vertex and edge sets, seeds in order), over the relabelled whole graph with sampled fan-outs (equal)."""
    from training.batches import LocalBatchSource
    from training.distsample import PartitionedBatchSource
    from training.sampler import NeighborSampler

    old_ids = np.load(d / "old_ids.npy")
    orig = (torch.from_numpy(np.load(d / "orig_indptr.npy")), torch.from_numpy(np.load(d / "orig_indices.npy")))
    train_old = np.random.default_rng(5).permutation(old_ids.size)[:300]
    new_of_old = np.argsort(old_ids)
    out = {}
    for fanouts in ((-1, -1), (4, 2)):
        ours = PartitionedBatchSource(indptr, source, old_ids, train_old, 64, fanouts, rank=rank, world_size=size,
                                      seed=9, split="even")
        if fanouts[0] == -1:
            ref = LocalBatchSource(NeighborSampler(*orig, fanouts, seed=9), train_old, 64, rank=rank,
                                   world_size=size, seed=9)
        else:
            ref = LocalBatchSource(NeighborSampler(torch.from_numpy(np.asarray(indptr)), whole, fanouts, seed=9),
                                   new_of_old[train_old], 64, rank=rank, world_size=size, seed=9)
        same = []
        for a, b in zip(ours.batches(1), ref.batches(1), strict=True):
            if fanouts[0] == -1:  # the dataset's ids on both sides; edges as sets of (source, target) id pairs
                pairs = [set(zip(x.n_id[x.edge_index[0]].tolist(), x.n_id[x.edge_index[1]].tolist(), strict=True))
                         for x in (a, b)]
                same.append(torch.equal(a.n_id[:a.batch_size], b.n_id[:b.batch_size])
                            and sorted(a.n_id.tolist()) == sorted(b.n_id.tolist()) and pairs[0] == pairs[1])
            else:
                same.append(torch.equal(a.n_id, torch.from_numpy(old_ids)[b.n_id])
                            and torch.equal(a.edge_index, b.edge_index))
        out[str(fanouts)] = {"steps": ours.steps(1), "same": same}
    layout = read_partition(d / "part", rank)[2]
    owned = PartitionedBatchSource(indptr, source, old_ids, train_old, 64, (3, 2), rank=rank, world_size=size, seed=9,
                                   node_offsets=layout.node_offsets)
    lo, hi = layout.node_offsets[rank], layout.node_offsets[rank + 1]
    seeds = [b.n_id[:b.batch_size].tolist() for b in owned.batches(1)]
    out["owned"] = {"seeds": seeds, "inside": all(lo <= new_of_old[s] < hi for step in seeds for s in step)}
    return out


@pytest.mark.heavy  # spawned torch processes (~10 s each)
@pytest.mark.parametrize("size", [2, 3])
def test_distributed_batches_equal_the_whole_graph_sampler(cora_csr, tmp_path, size):
    import torch.multiprocessing as mp

    _partitioned(cora_csr, tmp_path, size)
    mp.spawn(_worker, args=(str(tmp_path), size), nprocs=size, join=True)
    outs = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(size)]
    for rank, out in enumerate(outs):
        assert len(out["results"]) == len(CONFIGS)
        for res in out["results"]:
            assert len(res["same"]) == 3 + rank and all(res["same"]), (rank, res)
            assert sum(res["edges"]) > 0
        st = out["stats"]
        # every hop of every batch is one round; a rank that ran out first served its peers' rounds
        fanouts_hops = [len(f) for _, _, f in CONFIGS]
        assert st["rounds"] == sum(h * (3 + rank) for h in fanouts_hops) + st["idle_rounds"]
        assert st["idle_rounds"] == sum(h * (size - 1 - rank) for h in fanouts_hops)
        assert 0 < st["local_positions"] < st["positions_asked"] and st["bytes_out"] > 0
        for fanouts, res in out["training"].items():
            if fanouts != "owned":
                assert res["steps"] == 5 and len(res["same"]) == 5 and all(res["same"]), (rank, fanouts, res)
        assert out["training"]["owned"]["inside"]  # split="owned": a rank's seeds are its partition's
    # ... and the ranks' seeds of a step make up the single process's global batch
    from training.batches import epoch_seeds

    train_old = np.random.default_rng(5).permutation(cora_csr[0].size - 1)[:300]
    for step, whole_batch in enumerate(epoch_seeds(train_old, 1, 64, seed=9)):
        union = sorted(s for o in outs for s in o["training"]["owned"]["seeds"][step])
        assert union == sorted(whole_batch.tolist()), step
    # what one rank served is what the others asked of it: the positions served add up to those asked remotely
    served = sum(o["stats"]["positions_served"] for o in outs)
    remote = sum(o["stats"]["positions_asked"] - o["stats"]["local_positions"] for o in outs)
    assert served == remote


def _dying_worker(rank: int, d: str, size: int) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from training.distsample import DistributedNeighbours
    from training.heartbeats import Heartbeats
    from training.sampler import NeighborSampler
    from training.sharded.exchange import PeerLostError

    dist.init_process_group("gloo", init_method=f"file://{d}/init", rank=rank, world_size=size,
                            timeout=timedelta(seconds=20))
    indptr, local, layout = read_partition(Path(d) / "part", rank)
    # first, rank 0 given another partition of the same edges: every rank refuses at the start
    wrong = PartitionLayout((0, *(x + 1 for x in layout.node_offsets[1:-1]), layout.node_offsets[-1]),
                            layout.edge_offsets) if rank == 0 else layout
    try:
        DistributedNeighbours(local, wrong)
        refused = ""
    except SamplerError as exc:
        refused = str(exc)
    beats = Heartbeats.for_job(every_s=0.2)
    source = DistributedNeighbours(local, layout, heartbeats=beats)
    sampler = NeighborSampler(indptr, source, (5, 5), seed=rank)
    g = torch.Generator().manual_seed(rank)
    msg, t0 = "", time.time()
    try:
        for step in range(50):
            if rank == size - 1 and step == 3:
                os._exit(3)  # dies between two batches, as a killed node does
            sampler.sample(torch.randperm(layout.node_offsets[-1], generator=g)[:20])
            t0 = time.time()
    except PeerLostError as exc:
        msg = str(exc)
    Path(d, f"err{rank}.json").write_text(json.dumps({"msg": msg, "after_s": time.time() - t0, "refused": refused}))
    os._exit(0)  # the group is broken: no clean-up collective


@pytest.mark.heavy  # spawned torch processes, one of which dies (~15 s)
def test_a_wrong_partition_is_refused_and_a_peer_that_dies_is_one_line_naming_its_rank(cora_csr, tmp_path):
    import torch.multiprocessing as mp

    size = 3
    _partitioned(cora_csr, tmp_path, size)
    ctx = mp.start_processes(_dying_worker, args=(str(tmp_path), size), nprocs=size, join=False,
                             start_method="spawn")
    for p in ctx.processes:
        p.join(60)
    for rank in range(size - 1):
        err = json.loads((tmp_path / f"err{rank}.json").read_text())
        assert "\n" not in err["msg"] and err["msg"].startswith("the sampler's neighbour exchange: rank 2 died"), err
        assert "resume" in err["msg"] and err["after_s"] < 10, err
        assert "were given different partitions" in err["refused"], err


def test_the_layout_is_the_rank_count_and_the_slice_its_range(cora_csr, tmp_path):
    _partitioned(cora_csr, tmp_path, 2)
    indptr, local, layout = read_partition(tmp_path / "part", 1)
    whole = np.load(tmp_path / "whole_indices.npy")
    assert layout.parts == 2 and np.array_equal(local, whole[layout.edge_offsets[1]:])
    assert layout == PartitionLayout.of_indptr(indptr, layout.node_offsets)


def test_owner_of_positions_follows_the_edge_offsets_including_empty_parts():
    layout = PartitionLayout((0, 2, 2, 5), (0, 4, 4, 9))
    pos = torch.arange(9)
    assert layout.owner_of_positions(pos).tolist() == [0] * 4 + [2] * 5
    with pytest.raises(SamplerError, match="non-decreasing"):
        PartitionLayout((0, 3, 2), (0, 1, 2))
    with pytest.raises(SamplerError, match="2 against 1 partitions"):
        PartitionLayout((0, 1, 2), (0, 2))


def test_partition_helper_is_a_relabelling_of_the_graph(cora_csr):
    indptr, indices = cora_csr
    part_of = np.random.default_rng(0).integers(0, 3, indptr.size - 1)
    new_indptr, new_indices, offs, old_ids = partition_csr(indptr, indices, part_of)
    assert np.all(np.diff(part_of[old_ids]) >= 0) and offs[-1] == indptr.size - 1
    for new in (0, 17, indptr.size - 2):
        old = old_ids[new]
        got = sorted(old_ids[new_indices[new_indptr[new]:new_indptr[new + 1]]].tolist())
        assert got == sorted(indices[indptr[old]:indptr[old + 1]].tolist())


def _torchrun(d: Path, *extra: str) -> list[subprocess.CompletedProcess]:
    """Two nodes of one rank each, as users start them: ``torchrun --nnodes 2`` with c10d rendezvous."""
    from tests.nodes_launch import free_port

    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # the agents look at their workers every 3 s (torchrun's default: 0.1 s): otherwise the dead node's agent can
    # end the job, and the living rank with it, before that rank has named the dead one (what the test checks)
    cmd = [torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--monitor-interval", "3", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", endpoint,
           "--rdzv-id", "distsample", str(REPO / "tests" / "distsample_ranks.py"), str(d), *extra]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    try:
        return [subprocess.CompletedProcess(cmd, p.wait(timeout=180), p.communicate()[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.heavy  # two torchrun launches of two nodes (~30 s)
def test_torchrun_nodes_sample_exactly_and_a_dead_node_is_named(cora_csr, tmp_path):
    """Under torchrun's c10d rendezvous (its store carries the heartbeat): exact batches, then a node that dies."""
    _partitioned(cora_csr, tmp_path, 2)
    runs = _torchrun(tmp_path)
    assert [r.returncode for r in runs] == [0, 0], runs[0].stdout[-2000:] + runs[1].stdout[-2000:]
    for rank in range(2):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(out["same"]) == 6 and all(out["same"]) and out["stats"]["positions_served"] > 0, out
        (tmp_path / f"rank{rank}.json").unlink()
    runs = _torchrun(tmp_path, "--die-at", "4")
    assert sorted(r.returncode for r in runs) == [1, 1]  # each agent reports its worker's failure
    out = json.loads((tmp_path / "rank0.json").read_text())
    assert out["same"] == [True] * 4 and "\n" not in out["error"], out
    assert out["error"].startswith("the sampler's neighbour exchange: rank 1 died or stopped answering"), out


# --- training over a partition (`moment train --partition`) ----------------------------------------------------

TRAIN = ["--fanouts=-1,-1", "--hidden", "16", "--dropout", "0", "--seed", "3", "--lr", "0.01", "--eval-every", "0",
         "--batch-size", "35", "--epochs", "2"]
TRAIN_CFG = dict(fanouts=(-1, -1), hidden=16, dropout=0.0, seed=3, lr=0.01, eval_every_epochs=0, batch_size=35,
                 epochs=2)


@pytest.fixture(scope="module")
def cora_ds(tmp_path_factory) -> Path:
    from training.importers import import_dataset

    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


def _dataset_partition(ds_dir: Path, out: Path, parts: int) -> Path:
    """``moment data partition``'s writer over a random ``part_of`` (its format, the contract the source reads)."""
    from training.data import open_dataset
    from training.partition.write import write_partition

    ds = open_dataset(ds_dir)
    part_of = np.random.default_rng(parts).integers(0, parts, ds.num_nodes).astype(np.int16)
    part_of[:parts] = np.arange(parts)  # every partition holds a vertex
    write_partition(ds, part_of, parts, out, method="random")
    return out


def _losses(progress_records: list[dict]) -> list[float]:
    return [r["loss"] for r in progress_records if r["kind"] == "step"]


def test_one_rank_over_one_partition_trains_what_it_trains_over_the_dataset(cora_ds, tmp_path):
    from tests.conftest import flat_spec
    from training.trainer import train

    part = _dataset_partition(cora_ds, tmp_path / "p1", 1)
    runs = []
    for extra in ({}, {"partition": str(part)}):
        recs: list[dict] = []
        train(flat_spec(dataset=str(cora_ds), **TRAIN_CFG, **extra), progress=recs.append)
        runs.append(_losses(recs))
    assert len(runs[0]) == 8 and runs[0] == runs[1]  # 140 seeds, 2 epochs of 4 steps: the same losses, bit for bit


def test_a_partition_that_does_not_fit_the_job_is_one_line(cora_ds, tmp_path, capsys):
    from moment.cli import main

    two = _dataset_partition(cora_ds, tmp_path / "p2", 2)
    base = ["train", "--dataset", str(cora_ds), *TRAIN]
    for bad, msg in ((["--partition", str(two)], "2 partitions for 1 ranks"),
                     (["--partition", str(tmp_path)], "is not a partitioned dataset"),
                     (["--partition", str(two), "--graph-on", "disk"], "drop --server, --graph-on 'disk'")):
        assert main([*base, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("moment train: error:") and msg in err and "\n" not in err, err


@pytest.mark.heavy  # two node processes that import torch and train Cora (~20 s)
def test_two_nodes_over_a_partition_train_what_one_process_trains(cora_ds, tmp_path):
    """Full neighbourhoods: each step's batch holds the single process's vertices and edges, so the losses agree
    up to float rounding (the neighbours' order within a row follows the new ids), and so do the valid and test
    accuracies, each rank evaluating its own partition's vertices. The ranks train on a copy of the dataset whose
    global features, indices and labels are deleted: a rank reads its partition's rows and lists alone."""
    from tests.conftest import flat_spec
    from tests.nodes_launch import launch, log, wait_all
    from training.trainer import train

    part = _dataset_partition(cora_ds, tmp_path / "p2", 2)
    bare = tmp_path / "bare"
    shutil.copytree(cora_ds, bare)
    for name in ("features", "indices", "labels"):
        (bare / f"{name}.npy").unlink()
    m = tmp_path / "m.jsonl"
    argv = ["train", "--dataset", str(bare), "--partition", str(part), *TRAIN, "--metrics", str(m)]
    procs = launch([argv, argv], logs=tmp_path / "logs")
    assert wait_all(procs) == [[0], [0]], log(tmp_path / "logs", 0)[-2000:] + log(tmp_path / "logs", 1)[-2000:]
    recs = [json.loads(line) for line in m.read_text().splitlines()]
    one: list[dict] = []
    train(flat_spec(dataset=str(cora_ds), **TRAIN_CFG), progress=one.append)
    np.testing.assert_allclose(_losses(recs), _losses(one), rtol=1e-5)
    ours, theirs = ([r for r in x if r["kind"] == "epoch"][-1] for x in (recs, one))
    assert ours["valid_acc"] == theirs["valid_acc"] and ours["test_acc"] == theirs["test_acc"], (ours, theirs)
    assert 0 < ours["nodes"]["remote_share"] < 1  # rows of the other partition came through the exchange


@pytest.mark.heavy  # two node processes, one killed mid-epoch, then both restarted (~40 s)
def test_a_node_that_dies_in_partitioned_training_is_named_and_the_job_resumes(cora_ds, tmp_path):
    """kill -9 of node 1 mid-epoch: node 0 stops with one line naming rank 1 (whichever collective met the death
    first: the heartbeats name it for all) and the resume path; a restart with --resume finishes the run."""
    import re

    from tests.nodes_launch import kill_mid_run, launch, log, wait_all

    part = _dataset_partition(cora_ds, tmp_path / "p2", 2)
    m, ck = tmp_path / "m.jsonl", tmp_path / "ck"
    argv = ["train", "--dataset", str(cora_ds), "--partition", str(part), "--fanouts=-1,-1", "--hidden", "16",
            "--batch-size", "7", "--epochs", "3", "--eval-every", "0", "--metrics", str(m), "--checkpoint", str(ck),
            "--checkpoint-every", "4"]
    last = kill_mid_run(argv, m, tmp_path / "a")
    assert re.match(r"moment train: error: epoch \d+(, step \d+)?: .*rank 1 died or stopped answering", last), last
    assert "--resume" in last
    procs = launch([[*argv, "--resume"]] * 2, logs=tmp_path / "b")
    assert wait_all(procs) == [[0], [0]], log(tmp_path / "b", 0)[-2000:]
    assert "resuming at epoch" in log(tmp_path / "b", 0)
