"""Partitioning (training/partition/): the relabelling is a permutation, the parts' slices are the relabelled CSR and
that is the original graph; every partitioner; `moment data partition` end to end on Cora; its bad inputs."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iostack.shards import partition_rows
from tests.conftest import graph_fixture
from training.data import DatasetError, open_dataset
from training.partition import PARTITIONERS, PartitionError, default_method
from training.partition.read import open_partition
from training.partition.write import write_partition
from training.writer import DatasetWriter


@pytest.fixture(scope="module")
def cora(tmp_path_factory) -> Path:
    from moment.cli import main

    root = tmp_path_factory.mktemp("cora")
    assert main(["data", "import", str(graph_fixture("cora")), str(root / "cora")]) == 0
    return root / "cora"


def _rows(indptr: np.ndarray, indices: np.ndarray) -> list[list[int]]:
    return [sorted(indices[indptr[v]:indptr[v + 1]].tolist()) for v in range(indptr.size - 1)]


def check_partitioned(ds, out: Path, part_of: np.ndarray) -> None:
    """Every invariant of the format, against the dataset it came from."""
    pt = open_partition(out)
    n, p = ds.num_nodes, pt.parts
    old = np.asarray(pt.old_ids)
    assert sorted(old.tolist()) == list(range(n))  # a permutation
    offs = pt.node_offsets
    assert offs[0] == 0 and offs[-1] == n and np.all(np.diff(offs) == np.bincount(part_of, minlength=p))
    for k in range(p):
        mine = old[offs[k]:offs[k + 1]]
        assert np.all(part_of[mine] == k) and np.all(np.diff(mine) > 0)  # its vertices, increasing old id
    indptr = np.asarray(pt.indptr)
    assert np.array_equal(pt.edge_offsets, indptr[offs])
    indices = np.concatenate([np.asarray(pt.part(k).indices) for k in range(p)])
    assert indices.size == ds.num_edges and indices.dtype == ds.indices.dtype
    # the relabelled CSR, mapped back through old_ids, is the original graph row for row
    back = old[indices]
    new_of_old = np.argsort(old)
    orig = _rows(np.asarray(ds.indptr), np.asarray(ds.indices))
    for v in range(n):
        row = indices[indptr[v]:indptr[v + 1]]
        assert np.all(np.diff(row) > 0) or row.size <= 1  # rows sorted by new id
        assert sorted(back[indptr[v]:indptr[v + 1]].tolist()) == orig[old[v]]
    cut = 0
    for k in range(p):
        part = pt.part(k)
        lo, hi = part.node_range
        rows = np.asarray(part.indices)
        far = rows[(rows < lo) | (rows >= hi)]
        cut += far.size
        assert np.array_equal(np.asarray(part.halo), np.unique(far))
        if ds.features is not None:
            assert np.array_equal(np.asarray(part.features), np.asarray(ds.features)[old[lo:hi]])
        if ds.train_idx is not None:
            want = np.sort(new_of_old[np.asarray(ds.train_idx)])
            assert np.array_equal(np.asarray(part.train_idx), want[(want >= lo) & (want < hi)])
    assert cut == pt.manifest["edge_cut"]


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 30))
    e = draw(st.integers(0, 80))
    src = np.array(draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e)), np.int64)
    dst = np.array(draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e)), np.int64)
    p = draw(st.integers(1, n))
    part_of = np.array(draw(st.lists(st.integers(0, p - 1), min_size=n, max_size=n)), np.int16)
    return n, src, dst, p, part_of, draw(st.booleans())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_relabel_is_a_permutation_and_the_slices_are_the_graph(g):
    n, src, dst, p, part_of, undirected = g
    with tempfile.TemporaryDirectory() as d:
        with DatasetWriter(f"{d}/g", num_nodes=n) as w:
            w.write_edges((src, dst), undirected=undirected)
            w.write_features(np.arange(n * 3, dtype=np.float32).reshape(n, 3))
            w.write_splits(train=np.arange(0, n, 2))
        ds = open_dataset(f"{d}/g")
        write_partition(ds, part_of, p, f"{d}/out", method="given")
        check_partitioned(ds, Path(d, "out"), part_of)


@pytest.mark.parametrize("method", PARTITIONERS.names())
@pytest.mark.parametrize("parts", [1, 2, 4])
def test_every_partitioner_cuts_fewer_edges_than_hashing(cora, method, parts):
    if PARTITIONERS.caps(method)["requires"] and importlib.util.find_spec(PARTITIONERS.caps(method)["requires"]) \
            is None:
        pytest.skip(f"{method} needs {PARTITIONERS.caps(method)['requires']}")
    ds = open_dataset(cora)
    part_of = PARTITIONERS.get(method)(ds, parts)
    assert part_of.dtype == np.int16 and part_of.shape == (ds.num_nodes,)
    counts = np.bincount(part_of, minlength=parts)
    assert counts.size == parts and counts.min() > 0.7 * ds.num_nodes / parts  # balanced within 30%
    rows = np.repeat(np.arange(ds.num_nodes), np.diff(ds.indptr))
    cut = int((part_of[rows] != part_of[np.asarray(ds.indices)]).sum())
    hashed = np.arange(ds.num_nodes) % parts
    assert cut <= int((hashed[rows] != hashed[np.asarray(ds.indices)]).sum()) * (0.8 if parts > 1 else 1)


def test_partitioned_cora_keeps_the_format(cora, tmp_path):
    ds = open_dataset(cora)
    part_of = PARTITIONERS.get("ldg")(ds, 3)
    write_partition(ds, part_of, 3, tmp_path / "out", method="ldg")
    check_partitioned(ds, tmp_path / "out", part_of)


def test_partition_rows_owner_follows_the_partition():
    part_of = np.array([0, 1, 1, 0, 2, 2], np.int16)
    hot = np.array([0.0, 5, 1, 9, 2, 3])
    lay = partition_rows(part_of, hot, replicas=2, hot_rows=2)
    assert lay.owner.tolist() == part_of.tolist()
    assert lay.width.tolist() == [1, 2, 1, 2, 1, 1]  # the two hottest (3 and 1) on two nodes
    assert lay.rows_of(1).tolist() == [1, 2, 3] and lay.rows_of(2).tolist() == [1, 4, 5]


def _cli(*argv: str) -> int:
    from moment.cli import main

    return main(list(argv))


def test_cli_partitions_cora_end_to_end(cora, tmp_path, capsys):
    out = tmp_path / "cora-2"
    assert _cli("data", "partition", str(cora), str(out), "--parts", "2", "--json") == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["parts"] == 2 and rep["method"] == default_method(10556)
    assert 0 < rep["edge_cut"] < 10556 and rep["halo_share"] > 0
    share = rep["remote_share"]
    assert share["partition"] < share["hash"] / 2 and abs(share["hash"] - 0.5) < 0.1
    assert _cli("data", "info", str(out), "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["edge_cut"] == rep["edge_cut"] and len(info["parts_detail"]) == 2
    assert _cli("data", "info", str(out)) == 0
    assert "edge cut" in capsys.readouterr().out
    with pytest.raises(DatasetError, match="open_partition"):
        open_dataset(out / "part-0")
    with pytest.raises(DatasetError, match="open_partition"):
        open_dataset(out)
    check_partitioned(open_dataset(cora), out, np.asarray(np.load(out / "part_of.npy")))


@pytest.mark.parametrize("argv, says", [
    (["--parts", "0"], "--parts 0: expected at least 1"),
    (["--parts", "100000"], "--parts 100000: more partitions than the 2,708 vertices"),
])
def test_cli_bad_parts_is_one_line(cora, tmp_path, capsys, argv, says):
    assert _cli("data", "partition", str(cora), str(tmp_path / "o"), *argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_cli_refuses_a_non_empty_out_without_force(cora, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert _cli("data", "partition", str(cora), str(out), "--parts", "2", "--presample-batches", "0") == 2
    err = capsys.readouterr().err.strip()
    assert "not empty; pass --force" in err and len(err.splitlines()) == 1
    assert (out / "keep.txt").read_text() == "mine"
    assert _cli("data", "partition", str(cora), str(out), "--parts", "2", "--presample-batches", "0",
                "--force") == 0
    assert not (out / "keep.txt").exists() and open_partition(out).parts == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left beside it


def test_write_rejects_a_bad_part_of(cora, tmp_path):
    ds = open_dataset(cora)
    with pytest.raises(PartitionError, match="shape"):
        write_partition(ds, np.zeros(5, np.int16), 2, tmp_path / "o", method="x")
    with pytest.raises(PartitionError, match="outside 0..1"):
        write_partition(ds, np.full(ds.num_nodes, 2, np.int16), 2, tmp_path / "o", method="x")


def test_place_over_nodes_follows_the_partition(cora, tmp_path, capsys):
    assert _cli("data", "partition", str(cora), str(tmp_path / "c2"), "--parts", "2", "--method", "ldg",
                "--presample-batches", "0") == 0
    ssd = [a for _ in range(8) for a in ("--ssd", str(tmp_path / "ssd"))]
    common = ["place", "--dataset", str(cora), "--machine", "moment-b", "--gpu-cache", "128KiB", "--cpu-cache",
              "1MiB", *ssd, "--fanouts", "10,5", "--batch-size", "35", "--replicas", "2", "--hot-rows", "0.05"]
    assert _cli(*common, "--nodes", "2", "--partition", str(tmp_path / "c2"), "--out", str(tmp_path / "pl")) == 0
    assert "owners: the partitions of" in capsys.readouterr().out
    part_of = np.load(tmp_path / "c2" / "part_of.npy")
    for d in (tmp_path / "pl", tmp_path / "pl" / "node1"):
        assert np.array_equal(np.load(d / "owner.npy"), part_of)
    width = np.load(tmp_path / "pl" / "owner.npy"), np.load(tmp_path / "pl" / "width.npy")
    assert int((width[1] == 2).sum()) == round(0.05 * 2708)
    held = (part_of == 1) | (width[1] == 2)
    assert np.load(tmp_path / "pl" / "node1" / "rows.npy").shape[0] == int(held.sum())
    assert _cli(*common, "--nodes", "4", "--partition", str(tmp_path / "c2"), "--out", str(tmp_path / "p4")) == 2
    assert "--partition" in capsys.readouterr().err


def test_ldg_runs_the_same_without_numba(cora, monkeypatch):
    from training.partition import stream

    ds = open_dataset(cora)
    compiled = stream.ldg_partition(ds, 3)
    monkeypatch.setattr(stream, "_kernel", lambda: stream._ldg_block)  # the Python loop numba compiles
    assert np.array_equal(stream.ldg_partition(ds, 3), compiled)


def test_without_pymetis_metis_says_so_and_the_default_streams(cora, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pymetis", None)  # import pymetis now raises ImportError
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pymetis" else object())
    assert default_method(10556) == "ldg"
    with pytest.raises(PartitionError, match="needs pymetis"):
        PARTITIONERS.get("metis")(open_dataset(cora), 2)


@pytest.mark.heavy  # starts two node processes that import torch (~10 s)
def test_two_nodes_train_over_partition_owned_rows_what_one_process_trains(cora, tmp_path):
    """The sharded trainer over a placement whose owners are the partitions: one process's losses, full fan-outs."""
    from planner.handoff import PlanTargets, StoreTarget
    from tests.conftest import flat_spec
    from tests.nodes_launch import launch, log, wait_all
    from tests.test_nodes import CFG, _steps, _train
    from training.hotness import degree_from_csr
    from training.partition.owners import partition_layout
    from training.place.nodes import place_sharded
    from training.place.specs import PolicySpec, ShardSpec, TierSpec
    from training.trainer import train

    ds = open_dataset(cora)
    assert _cli("data", "partition", str(cora), str(tmp_path / "c2"), "--parts", "2", "--presample-batches",
                "0") == 0
    hot = degree_from_csr(np.asarray(ds.indptr), np.asarray(ds.indices)).astype(np.float32)
    lay = partition_layout(ds, tmp_path / "c2", 2, hotness=hot, replicas=2, hot_rows=270)
    t = PlanTargets("toy", gpus=(("gpu0", "s0"),), stores=(StoreTarget("mem0", "cpu", "mem0", "s0", 1.0),
                                                           StoreTarget("ssd0", "ssd", "ssd0", "s0", 2.0)))
    out = tmp_path / "pl"
    place_sharded(ds.features, hot, t, out, TierSpec(cpu_cache_bytes=300 * ds.row_bytes, ssd_dirs=[out]),
                  PolicySpec(), ShardSpec(nodes=2, replicas=2, hot_rows=270 / ds.num_nodes), fsync=False, layout=lay)
    assert np.array_equal(np.load(out / "owner.npy"), np.load(tmp_path / "c2" / "part_of.npy"))
    m = tmp_path / "m.jsonl"
    args = ["--batch-size", "35", "--epochs", "2", "--metrics", str(m)]
    procs = launch([_train(out / "node0", *args, cora=cora), _train(out / "node1", *args, cora=cora)],
                   logs=tmp_path / "logs")
    assert wait_all(procs) == [[0], [0]], log(tmp_path / "logs", 0)[-2000:] + log(tmp_path / "logs", 1)[-2000:]
    one: list[float] = []
    train(flat_spec(dataset=str(cora), batch_size=35, epochs=2, **CFG),
          progress=lambda r: one.append(r["loss"]) if r["kind"] == "step" else None)
    np.testing.assert_allclose([r["loss"] for r in _steps(m)], one, rtol=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(PARTITIONERS.names()))
def test_every_partitioner_assigns_every_vertex_to_a_partition(g, method):
    n, src, dst, p, _, undirected = g
    requires = PARTITIONERS.caps(method)["requires"]
    if requires and importlib.util.find_spec(requires) is None:
        return
    with tempfile.TemporaryDirectory() as d:
        with DatasetWriter(f"{d}/g", num_nodes=n) as w:
            w.write_edges((src, dst), undirected=undirected)
            w.write_splits(train=np.arange(0, n, 3))
        ds = open_dataset(f"{d}/g")
        part_of = PARTITIONERS.get(method)(ds, p)
        assert part_of.dtype == np.int16 and part_of.shape == (n,)
        assert part_of.min() >= 0 and part_of.max() < p
        assert np.array_equal(PARTITIONERS.get(method)(ds, p), part_of)  # deterministic for one seed


def test_metis_balances_each_count_and_falls_back_to_one_blended_weight(cora, monkeypatch):
    pytest.importorskip("pymetis")
    from training.partition import metis

    ds = open_dataset(cora)
    deg = np.diff(np.asarray(ds.indptr))
    for fallback in (False, True):
        if fallback:
            monkeypatch.setattr(metis, "_metis_ncon", lambda *a: None)
        part_of = metis.metis_partition(ds, 4)
        seeds = np.bincount(part_of[np.asarray(ds.train_idx)], minlength=4)
        edges = np.bincount(part_of, weights=deg, minlength=4)
        nodes = np.bincount(part_of, minlength=4)
        spread = max(x.max() / x.mean() for x in (seeds, edges, nodes))
        assert spread < (1.35 if fallback else 1.05)  # ncon = 3: each count within METIS's tolerance
