"""Layer-wise inference (training/infer/, `moment infer`): equal to the in-memory full-graph forward on Cora for
GraphSAGE, GCN and GAT, chunks that bound a block, one-line errors, and the command end to end.

Tolerance: the layer-wise logits equal the in-memory forward to 1e-5 absolute (measured: 0.0 for all three
models on Cora, 2026-11-29; the sums may run in another order on other builds, so not asserted bit-equal).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import graph_fixture
from training.data import open_dataset
from training.infer.blocks import chunk_ranges, full_block
from training.infer.model import InferError
from training.infer.run import InferSpec, infer
from training.models import build_model
from training.specs import ModelSpec, SamplingSpec, TrainSpec

TOL = 1e-5


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    from moment.cli import main

    root = tmp_path_factory.mktemp("infer-cora")
    assert main(["data", "import", str(graph_fixture("cora")), str(root / "cora")]) == 0
    return root / "cora"


def _full_graph(ds):
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices, np.int64)
    ei = torch.from_numpy(np.stack([indices, np.repeat(np.arange(ds.num_nodes), np.diff(indptr))]))
    deg = torch.from_numpy(np.diff(indptr).astype(np.float32))
    return torch.from_numpy(np.array(ds.features, np.float32)), ei, deg


def _checkpoint(path, dataset, arch, layers=2, **model):
    torch.manual_seed(1)
    spec = ModelSpec(arch=arch, hidden=16, heads=2 if arch == "gat" else None, **model)
    ds = open_dataset(dataset)
    m = build_model(arch, ds.feature_dim, ds.num_classes, layers, hidden=16, heads=spec.heads,
                    norm=spec.gcn_norm if arch == "gcn" else None)
    cfg = TrainSpec(str(dataset), model=spec, sampling=SamplingSpec(fanouts=(5,) * layers)).to_dict()
    torch.save({"config": cfg, "model": m.state_dict()}, path)
    return m.eval()


@pytest.mark.parametrize("arch, extra", [("sage", {}), ("gcn", {}), ("gcn", {"gcn_norm": "global"}), ("gat", {}),
                                         ("sage", {"normalize_features": True})])
def test_layerwise_equals_full_graph_forward(cora, tmp_path, arch, extra):
    model = _checkpoint(tmp_path / "ck.pt", cora, arch, **extra)
    ds = open_dataset(cora)
    x, ei, deg = _full_graph(ds)
    if extra.get("normalize_features"):
        x = x / x.sum(1, keepdim=True).clamp(min=1.0)
    with torch.no_grad():
        want = model(x, [ei, ei], ds.num_nodes, deg=deg if extra.get("gcn_norm") == "global" else None)
        hidden = model.layer_forward(0, x, ei, ds.num_nodes, deg=deg if arch == "gcn" else None)
    seen = []
    # 700 rows a chunk: 8+ chunks a layer, so blocks cut across neighbourhoods
    r = infer(InferSpec(str(cora), str(tmp_path / "ck.pt"), str(tmp_path / "out"), chunk_rows=700, embeddings=True),
              progress=lambda stage, done, total: seen.append((stage, done, total)))
    logits = np.load(r.outputs["logits.npy"], mmap_mode="r")
    assert logits.shape == (ds.num_nodes, ds.num_classes)
    assert np.abs(logits - want.numpy()).max() <= TOL
    assert np.array_equal(np.load(r.outputs["predictions.npy"]), want.numpy().argmax(1))
    assert np.abs(np.load(r.outputs["embeddings.npy"]) - hidden.numpy()).max() <= TOL
    assert [rec["chunks"] for rec in r.layers][0] >= 8
    assert seen[-1] == ("layer 2/2", ds.num_nodes, ds.num_nodes) and ("layer 1/2", ds.num_nodes, ds.num_nodes) in seen
    assert not list((tmp_path / "out").glob(".layers.tmp-*"))  # the scratch tables are gone
    rec = json.loads((tmp_path / "out" / "infer.json").read_text())
    assert rec["model"] == arch and rec["layers"][1]["tiers"]["ssd"]["rows"] >= ds.num_nodes


def test_through_a_placement_equals_in_memory(placed_cora, tmp_path):
    """Layer 0 read through the placement's GPU (host here), CPU and SSD bins: the same logits."""
    model = _checkpoint(tmp_path / "ck.pt", placed_cora, "sage")
    ds = open_dataset(placed_cora)
    x, ei, _ = _full_graph(ds)
    r = infer(InferSpec(str(placed_cora), str(tmp_path / "ck.pt"), str(tmp_path / "out"),
                        placement=str(placed_cora.parent / "place"), chunk_rows=1000))
    with torch.no_grad():
        want = model(x, [ei, ei], ds.num_nodes).numpy()
    assert np.abs(np.load(r.outputs["logits.npy"]) - want).max() <= TOL
    assert {"gpu", "cpu", "ssd"} <= set(r.layers[0]["tiers"])  # every tier served rows of layer 0


def test_sampled_fanouts_are_reproducible(cora, tmp_path):
    _checkpoint(tmp_path / "ck.pt", cora, "sage")
    runs = [infer(InferSpec(str(cora), str(tmp_path / "ck.pt"), str(tmp_path / f"o{i}"), fanouts=(3, 3), seed=4,
                            chunk_rows=500)) for i in range(2)]
    a, b = (np.load(r.outputs["logits.npy"]) for r in runs)
    assert np.array_equal(a, b)
    full = infer(InferSpec(str(cora), str(tmp_path / "ck.pt"), str(tmp_path / "full")))
    assert not np.array_equal(a, np.load(full.outputs["logits.npy"]))  # 3 of up to 168 neighbours: another answer
    # a byte budget per chunk: 1 MiB of 1433-float rows is 91 targets and edges a chunk in layer 0, of 16-float
    # rows 8192 in layer 1
    small = infer(InferSpec(str(cora), str(tmp_path / "ck.pt"), str(tmp_path / "small"), chunk_bytes=1 << 20))
    indptr = np.asarray(open_dataset(cora).indptr)
    assert [rec["chunks"] for rec in small.layers] == [len(chunk_ranges(indptr, 91)), len(chunk_ranges(indptr, 8192))]
    assert small.layers[0]["chunks"] > 30 > full.layers[0]["chunks"]
    assert np.abs(np.load(small.outputs["logits.npy"]) - np.load(full.outputs["logits.npy"])).max() <= TOL


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=40), st.integers(1, 25), st.data())
def test_chunks_cover_every_vertex_and_bound_a_block(degrees, budget, data):
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    n = len(degrees)
    indices = np.array([data.draw(st.integers(0, n - 1)) for _ in range(int(indptr[-1]))], np.int64)
    ranges = chunk_ranges(indptr, budget)
    assert ranges[0][0] == 0 and ranges[-1][1] == n and all(a < b for a, b in ranges)
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(ranges, ranges[1:], strict=False))
    for a, b in ranges:
        assert b - a <= budget and (indptr[b] - indptr[a] <= budget or b - a == 1)
        blk = full_block(indptr, indices, a, b)
        assert blk.n_id[: b - a].tolist() == list(range(a, b)) and len(set(blk.n_id.tolist())) == blk.n_id.numel()
        # the block's edges, back in global ids, are exactly the CSR rows of its targets
        got = sorted(zip(blk.n_id[blk.edge_index[1]].tolist(), blk.n_id[blk.edge_index[0]].tolist(), strict=True))
        want = sorted((v, int(u)) for v in range(a, b) for u in indices[indptr[v]:indptr[v + 1]])
        assert got == want


def test_bad_inputs_fail_in_one_line(cora, tmp_path):
    _checkpoint(tmp_path / "ck.pt", cora, "sage")
    other = tmp_path / "other.pt"  # a checkpoint of another dataset's shapes: 500 features, 3 classes
    m = build_model("sage", 500, 3, 2, hidden=16)
    torch.save({"config": TrainSpec("pubmed", sampling=SamplingSpec(fanouts=(5, 5))).to_dict(),
                "model": m.state_dict()}, other)
    out = str(tmp_path / "out")
    cases = [
        (InferSpec(str(cora), str(other), out), "trained on pubmed (features of dim 500, 3 classes)"),
        (InferSpec(str(cora), str(tmp_path / "ck.pt"), out, placement=str(tmp_path / "nowhere")),
         "no such placement directory"),
        (InferSpec(str(cora), str(tmp_path / "missing"), out), "no such checkpoint"),
        (InferSpec(str(cora), str(tmp_path / "ck.pt"), out, fanouts=(5,)), "the model has 2 layers"),
    ]
    for spec, words in cases:
        with pytest.raises(InferError) as exc:
            infer(spec)
        assert words in str(exc.value) and "\n" not in str(exc.value)
    infer(InferSpec(str(cora), str(tmp_path / "ck.pt"), out))
    before = (tmp_path / "out" / "logits.npy").read_bytes()
    with pytest.raises(InferError, match="already holds logits.npy"):
        infer(InferSpec(str(cora), str(tmp_path / "ck.pt"), out))
    assert (tmp_path / "out" / "logits.npy").read_bytes() == before  # nothing written is lost


def test_moment_infer_end_to_end(cora, tmp_path, capsys):
    """`moment train --checkpoint`, then `moment infer` on its checkpoint: predictions for every vertex.

    Floor 0.70 test accuracy: 20 epochs of the training below measured 0.779 layer-wise with full
    neighbourhoods, as its own sampled evaluation did (2026-11-29; 10 epochs: 0.693); GraphSAGE on Cora's
    public split reaches 0.75-0.80. About 25 s here, most of it the training.
    """
    from moment.cli import main

    ck, out = tmp_path / "ck", tmp_path / "pred"
    assert main(["train", "--dataset", str(cora), "--epochs", "20", "--fanouts", "10,10", "--batch-size", "140",
                 "--hidden", "16", "--lr", "0.01", "--checkpoint", str(ck)]) == 0
    capsys.readouterr()
    assert main(["infer", "--dataset", str(cora), "--checkpoint", str(ck), "--out", str(out), "--embeddings"]) == 0
    text = capsys.readouterr().out
    assert "inferred 2,708 vertices" in text and "layer 1:" in text and "peak resident memory" in text
    pred, labels = np.load(out / "predictions.npy", mmap_mode="r"), np.load(cora / "labels.npy")
    test = np.load(cora / "test_idx.npy")
    assert pred.shape == (2708,) and float((pred[test] == labels[test]).mean()) >= 0.70
    assert np.load(out / "embeddings.npy", mmap_mode="r").shape == (2708, 16)
    assert main(["infer", "--dataset", str(cora), "--checkpoint", str(ck), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err  # the library's `overwrite=True`, as the option the user types
    assert main(["infer", "--dataset", str(cora), "--checkpoint", str(ck), "--out", str(out), "--force",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_nodes"] == 2708
