"""The recipes of docs/architecture.md ("Where each algorithm plugs in") run as written.

Each ```python block there that starts ``# recipe: KIND.`` is executed as it
stands (it registers a toy entry of one extension point), the toy is run
through the public call a user would make, and it is unregistered again.
A recipe that stops working, or a public call that stops honouring its
registry, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.conftest import REPO, graph_fixture, topology_fixture

DOC = REPO / "docs" / "architecture.md"


def _recipes() -> dict[str, str]:
    blocks = re.findall(r"```python\n(# recipe: ([a-z ]+)\..*?)```", DOC.read_text(), flags=re.S)
    return {kind: code for code, kind in blocks}


@pytest.fixture
def recipe(request):
    """Run the doc's recipe named by the test's parameter; unregister what it registered afterwards."""
    registry, name = request.param
    code = _recipes()[request.node.callspec.id]
    assert name not in registry, f"{name!r} is registered already"
    namespace: dict = {"__name__": f"recipe_{name}"}
    exec(compile(code, str(DOC), "exec"), namespace)  # the doc's code, exactly as a reader copies it
    assert name in registry, "the recipe registers its entry"
    yield namespace
    registry.unregister(name)
    assert name not in registry


def _registries():
    from iostack.backends import READ_BACKENDS
    from planner.flow import FLOW_MODELS
    from planner.policies import PLACEMENT_POLICIES
    from planner.topology.sources import CAPTURE_SOURCES
    from training.batches import BATCH_SOURCES
    from training.hotness_methods import HOTNESS_METHODS
    from training.partition import PARTITIONERS

    return {"flow model": (FLOW_MODELS, "store-bound"), "read backend": (READ_BACKENDS, "mmap"),
            "placement policy": (PLACEMENT_POLICIES, "round-robin"),
            "hotness method": (HOTNESS_METHODS, "two-hop"), "batch source": (BATCH_SOURCES, "degree-ordered"),
            "capture source": (CAPTURE_SOURCES, "lscpu"), "graph partitioner": (PARTITIONERS, "id-blocks")}


def _one(kind: str):
    return pytest.mark.parametrize("recipe", [pytest.param(_registries()[kind], id=kind)], indirect=True)


def test_the_page_has_a_recipe_for_each_of_the_seven():
    assert sorted(_recipes()) == sorted(_registries())


@_one("flow model")
def test_flow_model_recipe(recipe):
    from planner.flow import solve
    from planner.inventory import inventory_from_counts
    from planner.plan import plan
    from planner.topology.model import Link, Node, NodeKind, Topology
    from planner.topology.spec.load import load_machine
    from planner.workload import Consumer, Demand, Store, Tier, Workload

    topo = Topology("toy")
    for n in (Node("socket0", NodeKind.SOCKET), Node("gpu0", NodeKind.GPU), Node("ssd0", NodeKind.NVME),
              Node("ssd1", NodeKind.NVME)):
        topo.add_node(n)
    topo.add_link(Link.pcie("socket0", "gpu0", gen=4, lanes=16))
    for s in ("ssd0", "ssd1"):
        topo.add_link(Link.pcie("socket0", s, gen=4, lanes=4))
    w = Workload([Consumer("gpu0", 12e9)], [Tier("ssd", [Store("ssd0", "ssd0", read_bytes_per_s=6e9),
                                                          Store("ssd1", "ssd1", read_bytes_per_s=2e9)], 1.0)])
    bound, exact = solve(topo, w, model="store-bound"), solve(topo, w, model="maxflow")
    assert bound.seconds_per_iteration == pytest.approx(1.5)  # 12 GB at 8 GB/s
    assert bound.seconds_per_iteration <= exact.seconds_per_iteration * (1 + 1e-6)
    assert sum(bound.store_bytes.values()) == pytest.approx(12e9)
    # or handed over as the function itself, networkx's flow_func= way: the same answer
    assert solve(topo, w, model=recipe["solve_store_bound"]) == bound
    # plan() takes the name from the same registry: no list of its own to extend
    res = plan(load_machine("moment-b"), inventory_from_counts(gpus=2, ssds=4), Demand(bytes_per_consumer=3e9),
               model="store-bound", top=2)
    assert res.model == "store-bound" and res.ranked


@_one("read backend")
def test_read_backend_recipe(recipe, tmp_path):
    from iostack.backends import get_backend
    from iostack.bins import write_bins
    from iostack.placement import simple_placement
    from iostack.store import FeatureStore
    from training.specs import IOSpec

    rng = np.random.default_rng(0)
    feats = rng.random((200, 24)).astype(np.float32)
    p = simple_placement(200, [("cpu", 50), ("ssd", 80), ("ssd", 70)], order=rng.permutation(200))
    write_bins(feats, p, tmp_path)
    assert type(get_backend("mmap")).__name__ == "MmapBackend"
    ids = rng.integers(0, 200, 300)
    with FeatureStore(p, tmp_path, features=feats, backend="mmap") as store:
        assert store.backend.name == "mmap"
        assert torch.equal(store.gather(torch.from_numpy(ids)), torch.from_numpy(feats[ids]))
        assert any("page cache (mmap)" in n for n in store.notes)
    assert IOSpec(backend="mmap").backend == "mmap"  # a training run accepts the name


@_one("placement policy")
def test_placement_policy_recipe(recipe, tmp_path):
    from planner.handoff import PlanTargets, StoreTarget
    from training.place.bins import build_bins
    from training.place.policy import place

    t = PlanTargets("toy", gpus=(("gpu0", "socket0"),),
                    stores=(StoreTarget("cache:gpu0", "gpu", "gpu0", "socket0", 1.0),
                            StoreTarget("ssd0", "ssd", "ssd0", "socket0", 3.0)))
    bins = build_bins(t, num_rows=100, row_bytes=400, gpu_cache_bytes=4000, cpu_cache_bytes=0,
                      ssd_dirs=[tmp_path], out_dir=tmp_path)
    hot = np.arange(100, dtype=np.float32)[::-1].copy()  # item 0 hottest
    res = place(hot, bins, t, row_bytes=400, strategy="round-robin")
    bin_of = res.placement.bin_of
    assert bin_of[:20].tolist() == [0, 1] * 10  # alternating while the GPU bin (10 rows) has room
    assert (bin_of[20:] == 1).all() and res.report.strategy == "round-robin"


@_one("hotness method")
def test_hotness_method_recipe(recipe, tmp_path):
    import scipy.sparse as sp

    from training.data import open_dataset
    from training.hotness import HotnessSpec, compute_hotness, get_hotness
    from training.importers.planetoid import import_planetoid

    ds = open_dataset(import_planetoid(graph_fixture("cora"), tmp_path / "cora"))
    hot = compute_hotness(ds, HotnessSpec("two-hop"))
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    a = sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(ds.num_nodes, ds.num_nodes))
    deg = np.asarray(a.sum(axis=0)).ravel()  # how many rows list each vertex
    np.testing.assert_allclose(hot.values, a.T @ deg)  # vertex v: the degrees of the rows listing it
    assert hot.spec.params() == {"method": "two-hop"} and hot.epochs_covered is None
    saved = get_hotness(ds, HotnessSpec("two-hop"))
    assert get_hotness(ds, HotnessSpec("two-hop")).loaded and saved.path.name == "two-hop.npy"


@_one("batch source")
def test_batch_source_recipe(recipe, tmp_path):
    from training.batches import BatchSource
    from training.data import open_dataset
    from training.pipeline import csr_on, open_source
    from training.specs import ModelSpec, RunSpec, SamplingSpec, TrainSpec
    from training.synth import SynthSpec
    from training.synth_run import synthesize
    from training.trainer import train

    indptr = torch.tensor([0, 1, 4, 6, 6, 8])  # degrees 1, 3, 2, 0, 2
    indices = torch.tensor([1, 0, 2, 4, 1, 3, 0, 2])
    world = SimpleNamespace(rank=0, size=1)
    source = open_source(SamplingSpec(fanouts=(2,), batch_size=2), 0, np.arange(5), world, (indptr, indices),
                         name="degree-ordered")
    assert isinstance(source, BatchSource) and source.steps(0) == 3
    seeds = [b.n_id[:b.batch_size].tolist() for b in source.batches(0)]
    assert seeds == [[1, 2], [4, 0], [3]]  # highest degree first, ties in id order
    source.close()

    # and the trainer trains on it, handed in as an object
    ds = open_dataset(synthesize(tmp_path / "ds", SynthSpec(num_nodes=300, num_edges=2400, feature_dim=8,
                                                            num_classes=4, train_share=0.3, seed=5)).path)
    spec = TrainSpec(str(ds.path), model=ModelSpec(hidden=8), sampling=SamplingSpec(fanouts=(4, 4), batch_size=40),
                     run=RunSpec(epochs=2, eval_every_epochs=0, seed=1))
    source = open_source(spec.sampling, spec.run.seed, np.asarray(ds.train_idx), world,
                         csr_on(ds, torch.device("cpu")), name="degree-ordered")
    starts: list[dict] = []
    res = train(spec, source=source, progress=lambda r: starts.append(r) if r["kind"] == "start" else None)
    assert starts[0]["sampling"]["device"] == "DegreeOrderedSource"  # the run says whose batches it trained on
    assert [r["steps"] for r in res.epochs] == [source.steps(0)] * 2
    assert all(np.isfinite(r["loss"]) for r in res.epochs)


@_one("capture source")
def test_capture_source_recipe(recipe, capsys):
    import json

    from moment.cli import main
    from planner.topology.discover import topology_from_files

    machine = "dgx-a100-class-8x-a100-sxm-2x-epyc7742-topo"
    smi, lscpu = topology_fixture(machine, "nvidia-smi-topo.txt"), topology_fixture(machine, "lscpu.txt")
    topo = topology_from_files(nvidia_smi=smi, lscpu=lscpu)
    assert "CPU model: AMD EPYC 7742 64-Core Processor" in topo.notes and str(lscpu) in topo.sources
    assert main(["topo", "--nvidia-smi", str(smi), "--lscpu", str(lscpu), "--json"]) == 0  # an option of its own
    assert "CPU model: AMD EPYC 7742 64-Core Processor" in json.loads(capsys.readouterr().out)["notes"]
    with pytest.raises(Exception, match="lscpu names the CPUs only"):
        topology_from_files(lscpu=Path(lscpu))


@_one("graph partitioner")
def test_graph_partitioner_recipe(recipe, tmp_path):
    from training.data import open_dataset
    from training.partition.read import open_partition
    from training.partition.run import partition_dataset
    from training.synth import SynthSpec
    from training.synth_run import synthesize

    ds = open_dataset(synthesize(tmp_path / "ds", SynthSpec(num_nodes=300, num_edges=2400, feature_dim=4,
                                                            train_share=0.3, seed=5)).path)
    res = partition_dataset(ds, tmp_path / "out", 3, method="id-blocks", presample_batches=2, batch_size=20)
    pt = open_partition(tmp_path / "out")
    assert pt.manifest["method"] == "id-blocks" and pt.node_offsets.tolist() == [0, 100, 200, 300]
    assert np.array_equal(np.asarray(pt.old_ids), np.arange(300))  # blocks of ids: the relabelling is the identity
    assert res.remote is not None and res.remote.rows > 0
