"""Heterogeneous training data-parallel: 2 ranks under torchrun train what one process trains."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

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


@pytest.mark.heavy  # four moment train runs, two under torchrun (~40 s)
def test_the_training_benchmark_writes_its_figure(tmp_path) -> None:
    shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_hetero_train.py"), "--papers", "1000",
                           "--batch-size", "128", "--epochs", "2", "--repeats", "1", "--json", str(out)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fig = json.loads(out.read_text())["figures"][0]
    assert fig["ours"] > 0 and fig["reference"] > 0 and fig["ratio"] == pytest.approx(fig["ours"] / fig["reference"])
    assert "ratio 2 ranks / 1 process" in proc.stdout


def test_batches_made_ahead_train_what_inline_batches_train(tmp_path) -> None:
    """``prefetch`` samples and gathers on a background thread: the same batches, so the same run."""
    write_hetero(tmp_path / "mag", add_reverse(synth_mag(papers=200, authors=100, institutions=10, fields=10)))
    runs = []
    for prefetch in (0, 2):
        steps: list[dict] = []
        res = train_hetero(flat_spec(dataset=str(tmp_path / "mag"), model="rgcn", fanouts=[3, 2], batch_size=16,
                                     hidden=8, seed=1, epochs=2, prefetch=prefetch),
                           progress=lambda r, steps=steps: steps.append(r) if r["kind"] == "step" else None)
        runs.append(([s["loss"] for s in steps], res.final))
    (inline, a), (made_ahead, b) = runs
    assert len(inline) == 2 * 8 and inline == made_ahead  # sampled fan-outs: the same draws in the same order
    assert a["valid_acc"] == b["valid_acc"] and a["seeds"] == b["seeds"] == 120


def test_ahead_keeps_order_and_raises_where_the_batch_is_taken() -> None:
    import threading

    from training.hetero.prefetch import ahead

    made: list[int] = []
    threads: set[str] = set()

    def make(i: int) -> int:
        made.append(i)
        threads.add(threading.current_thread().name)
        if i == 3:
            raise ValueError("batch 3")
        return i * i

    assert list(ahead(lambda i: i * i, 6, 2)) == [i * i for i in range(6)]
    it = ahead(make, 6, 2)
    assert [next(it) for _ in range(3)] == [0, 1, 4]
    with pytest.raises(ValueError, match="batch 3"):
        next(it)
    assert made == sorted(made) and len(threads) == 1  # one thread, in order
    assert threading.current_thread().name not in threads  # made on the background thread
    threads.clear()
    assert list(ahead(make, 3, 0)) == [0, 1, 4] and threads == {threading.current_thread().name}  # inline


@pytest.mark.parametrize("model", ["rgcn", "hetero-sage"])
def test_bf16_mixed_trains_near_float32(tmp_path, model) -> None:
    """``--precision bf16-mixed``: the forward under CPU autocast; the losses stay near float32's, not equal."""
    write_hetero(tmp_path / "mag", add_reverse(synth_mag(papers=200, authors=100, institutions=10, fields=10)))
    runs = {}
    for precision in ("32", "bf16-mixed"):
        steps: list[dict] = []
        res = train_hetero(flat_spec(dataset=str(tmp_path / "mag"), model=model, fanouts=[3, 2], batch_size=16,
                                     hidden=16, lr=0.01, seed=1, epochs=3, precision=precision),
                           progress=lambda r, steps=steps: steps.append(r) if r["kind"] == "step" else None)
        runs[precision] = ([s["loss"] for s in steps], res.final)
    (f32, _), (bf16, b) = runs["32"], runs["bf16-mixed"]
    assert bf16[0] == pytest.approx(f32[0], rel=0.05) and bf16[0] != f32[0]  # autocast narrowed the products
    assert b["loss"] < bf16[0] / 2 and b["valid_acc"] > 0.7  # it learns (4 classes: chance 0.25)
