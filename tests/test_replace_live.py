"""Re-placement inside training: the move runs in the background, every read stays exact before, during and
after it, exactly the changed rows move, a crash leaves a valid placement, the caches follow the new one."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from iostack.bins import open_bin, staged_path, write_bins
from iostack.commit import COMMIT
from iostack.placement import Bin, Placement, load_placement
from iostack.store import FeatureStore
from moment.cli import main as moment_main
from planner.placement import DdakBin
from planner.policies import place_items
from tests.conftest import graph_fixture
from training.data import open_dataset
from training.importers import import_dataset
from training.metrics import Predictor
from training.place.live import LiveReplacement, ReplaceOptions
from training.place.replace import apply_replacement, plan_replacement

REPO = Path(__file__).resolve().parents[1]
BINS = (Bin(0, "gpu", 150), Bin(1, "cpu", 300), Bin(2, "ssd", 3000, "ssd0.bin"), Bin(3, "ssd", 3000, "ssd1.bin"))
TARGETS = (4.0, 3.0, 1.5, 1.5)


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    return open_dataset(import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora"))


def _hot(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).zipf(1.6, n).astype(np.float32)


def _placed(x: np.ndarray, d: Path, seed: int = 0) -> Placement:
    res = place_items("ddak", _hot(len(x), seed), [DdakBin(str(b.id), b.kind, b.capacity_rows, t)
                                                   for b, t in zip(BINS, TARGETS, strict=True)], pool=10)
    p = Placement(BINS, res.bin_of, res.row_of)
    write_bins(x, p, d, fsync=False)
    p.save(d)
    return p


def _open(x: np.ndarray, d: Path):
    return lambda p: FeatureStore(p, d, features=x, backend="posix", backend_options={"processes": 0})


def _live(x, d, on_stage=None, min_gain=0.0) -> LiveReplacement:
    store = _open(x, d)(load_placement(d))
    return LiveReplacement(store, d, x, ReplaceOptions(every_epochs=1, min_gain=min_gain), _open(x, d),
                           targets=TARGETS, on_stage=on_stage)


def _epoch(live: LiveReplacement, hot_ids: np.ndarray, x: np.ndarray) -> None:
    """An 'epoch' of gathers that read ``hot_ids`` often (checked exact), then the hook between epochs."""
    for i in range(8):
        ids = torch.from_numpy(np.concatenate([hot_ids, np.arange(i, len(x), 97)]))
        assert torch.equal(live.gather(ids), torch.from_numpy(x[ids.numpy()]))


def test_reads_stay_exact_before_during_and_after_a_background_move(cora, tmp_path):
    x = np.array(cora.features)
    old = _placed(x, tmp_path)
    every = torch.arange(len(x))
    seen: dict[str, int] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:  # a second thread gathering all the while, as a prefetch thread does
        try:
            while not stop.is_set():
                assert torch.equal(live.gather(every), torch.from_numpy(x))
        except BaseException as exc:
            errors.append(exc)

    def at(stage: str) -> None:  # the mover stops at each stage while every row is read through the live source
        for _ in range(3):
            assert torch.equal(live.gather(every), torch.from_numpy(x))
        seen[stage] = seen.get(stage, 0) + 1
        if stage == "staged":  # the new bins are written beside the live ones, nothing renamed yet
            assert staged_path(tmp_path / "ssd0.bin").exists() or staged_path(tmp_path / "ssd1.bin").exists()
            assert np.array_equal(load_placement(tmp_path).bin_of, old.bin_of)

    live = _live(x, tmp_path, at)
    t = threading.Thread(target=reader)
    t.start()
    cold = np.flatnonzero(old.bin_of >= 2)[:120]  # rows on the SSDs that become the hottest
    _epoch(live, cold, x)
    first = live.store
    rec = live.epoch_record()["replacement"]
    assert rec["moving"]
    live.wait(60)
    _epoch(live, cold, x)  # the first gather swaps the new store in
    stop.set()
    t.join()
    assert not errors, errors
    assert seen == {"planned": 1, "staged": 1, "committed": 1}
    assert live.store is not first and first.tier_of(2).closed and not first.tier_of(0).tensors  # closed once idle
    [move] = live.epoch_record()["replacement"]["moves"]
    new = load_placement(tmp_path)
    changed = np.flatnonzero(new.bin_of != old.bin_of)
    assert move["moved_rows"] == changed.size > 0  # exactly the rows whose bin changed moved
    same = new.bin_of == old.bin_of
    assert np.array_equal(new.row_of[same], old.row_of[same])
    assert move["predicted_share"] > move["static_share"]
    assert move["rechecked_share"] == pytest.approx(move["predicted_share"])
    assert (new.bin_of[cold] < 2).mean() > 0.9  # the drifted hot rows now in the caches
    live.close()


def test_the_caches_are_refilled_from_the_new_placement(cora, tmp_path):
    x = np.array(cora.features)
    old = _placed(x, tmp_path, seed=1)
    live = _live(x, tmp_path)
    cold = np.flatnonzero(old.bin_of >= 2)[:100]
    _epoch(live, cold, x)
    live.epoch_record()
    live.wait(60)
    _epoch(live, cold, x)
    new = load_placement(tmp_path)
    for b in BINS[:2]:  # each cache bin holds the rows of the vertices the new placement puts there
        held = live.store.tier_of(b.id).tensors[b.id]
        verts = new.vertices_of(b.id)
        assert torch.equal(held[torch.from_numpy(new.row_of[verts])], torch.from_numpy(x[verts]))
    moved_in = cold[new.bin_of[cold] < 2]
    assert live.store.tier_rows(moved_in).get("ssd", (0, 0))[0] == 0  # served by the caches now
    # the prediction re-checked after the move: the trainer's predictor takes the new placement's shares
    [move] = [m for m in live.epoch_record()["replacement"]["moves"] if "rechecked_share" in m]
    tiers, ssd_bins = live.expected_shares()
    bins = move["predicted_bin_shares"]
    assert tiers == pytest.approx({"gpu": bins[0], "cpu": bins[1], "ssd": bins[2] + bins[3]})
    assert tiers["gpu"] + tiers["cpu"] == pytest.approx(move["predicted_share"])
    assert [r for _, r in ssd_bins] == new.rows_per_bin()[2:].tolist()
    predictor = Predictor(live, {"ssd": 1.0}, x.shape[1] * 4, {}, [(1.0, len(x))])
    predictor.start()
    _epoch(live, cold, x)
    pred = predictor.finish(0, 8)
    assert pred.tier("cpu").predicted_share == pytest.approx(tiers["cpu"])
    live.close()


def test_no_move_below_the_gain_floor(cora, tmp_path):
    x = np.array(cora.features)
    _placed(x, tmp_path, seed=2)
    live = _live(x, tmp_path, min_gain=0.99)
    _epoch(live, np.arange(50), x)
    live.epoch_record()
    live.wait(60)
    [move] = live.epoch_record()["replacement"]["moves"]
    assert "skipped" in move and "`min_gain`" in move["skipped"]
    assert not list(tmp_path.glob("*.new*")) and not (tmp_path / COMMIT).exists()
    live.close()


_CRASH = """
import os, sys, numpy as np
from iostack.placement import load_placement
from training.place.replace import apply_replacement, plan_replacement
d, where = sys.argv[1], sys.argv[2]
x = np.load(sys.argv[3])
p = load_placement(d)
rep = plan_replacement(p, np.load(sys.argv[4]), [4.0, 3.0, 1.5, 1.5], pool=10)
calls, real = [0], os.replace


def replace(a, b):  # from the commit on: the record's rename, two of the move's, then killed
    calls[0] += 1
    if calls[0] > 3:
        os._exit(9)
    real(a, b)


def staged(_):
    if where == "staged":  # killed with all staged, nothing decided
        os._exit(9)
    os.replace = replace


apply_replacement(rep, d, x, fsync=False, before_commit=staged)
"""


@pytest.mark.parametrize("where", ["staged", "renames"])
def test_a_crash_mid_move_leaves_a_valid_placement(cora, tmp_path, where, capsys):
    x = np.array(cora.features)
    d = tmp_path / "p"
    old = _placed(x, d, seed=3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "h.npy", _hot(len(x), 99))
    rep = plan_replacement(old, np.load(tmp_path / "h.npy"), TARGETS, pool=10)
    r = subprocess.run([sys.executable, "-c", _CRASH, str(d), where, str(tmp_path / "x.npy"), str(tmp_path / "h.npy")],
                       cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, capture_output=True)
    assert r.returncode == 9, r.stderr.decode()[-2000:]
    assert (d / COMMIT).exists() == (where == "renames")
    assert moment_main(["place", "--verify", str(d), "--json"]) == 0  # finishes a decided move first
    assert json.loads(capsys.readouterr().out)
    after = load_placement(d)
    expect = old if where == "staged" else rep.placement  # undecided: the old one; decided: the new one
    assert np.array_equal(after.bin_of, expect.bin_of) and np.array_equal(after.row_of, expect.row_of)
    for b in BINS[2:]:
        open_bin(d, b, full_check=True)
    with FeatureStore(after, d, features=x, backend="posix") as s:
        assert torch.equal(s.gather(torch.arange(len(x))), torch.from_numpy(x))
    # the next move starts clean from whatever a crash left
    apply_replacement(plan_replacement(after, _hot(len(x), 7), TARGETS, pool=10), d, x, fsync=False)
    assert not list(d.glob("*.new*")) and not (d / ".replace-staged").exists()


def test_moment_train_re_places_in_the_background_and_learns_exactly_as_without(tmp_path):
    from training.importers import import_dataset as imp

    cora = imp(graph_fixture("cora"), tmp_path / "cora")
    ssd = [a for _ in range(8) for a in ("--ssd", str(tmp_path / "ssd"))]
    assert moment_main(["place", "--dataset", str(cora), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache",
                        "64KiB", *ssd, "--out", str(tmp_path / "pl"), "--fanouts", "5,5", "--batch-size", "35"]) == 0
    before = load_placement(tmp_path / "pl")
    runs = {}
    for name, extra in (("static", []), ("replaced", ["--replace-every", "1", "--replace-min-gain", "0"])):
        metrics = tmp_path / f"{name}.jsonl"
        assert moment_main(["train", "--dataset", str(cora), "--placement", str(tmp_path / "pl"), "--fanouts", "5,5",
                            "--batch-size", "35", "--epochs", "3", "--hidden", "16", "--seed", "3", "--prefetch", "1",
                            "--metrics", str(metrics), *extra]) == 0
        runs[name] = [json.loads(line) for line in metrics.read_text().splitlines()]
    epochs = {k: [r for r in v if r["kind"] == "epoch"] for k, v in runs.items()}
    # the rows are the same bytes whichever placement serves them: the same losses, step for step
    steps = {k: [r["loss"] for r in v if r["kind"] == "step"] for k, v in runs.items()}
    assert steps["replaced"] == steps["static"]
    moves = [m for e in epochs["replaced"] for m in e["replacement"]["moves"]]
    assert moves and all("failed" not in m for m in moves)
    done = [m for m in moves if "rechecked_share" in m]
    assert done and done[0]["moved_rows"] > 0 and done[0]["predicted_share"] >= done[0]["static_share"]
    assert sum(e["replacement"]["swaps"] for e in epochs["replaced"]) >= 1
    assert "replacement" not in epochs["static"][0]
    # the move started after the last epoch finishes when the run closes: the placement left fits its reads
    after = load_placement(tmp_path / "pl")
    assert (after.bin_of != before.bin_of).any()
    assert moment_main(["place", "--verify", str(tmp_path / "pl")]) == 0


def test_a_store_open_before_a_move_checks_and_reads_its_own_files_after_the_commit(cora, tmp_path):
    """The old store's blocks not yet verified are checked against the bytes it reads (the old files, open),
    not against the new bin renamed over their names: no false alarm, no wrong row."""
    x = np.array(cora.features)
    res = place_items("ddak", _hot(len(x), 5), [DdakBin(str(b.id), b.kind, b.capacity_rows, t)
                                               for b, t in zip(BINS, TARGETS, strict=True)], pool=10)
    old = Placement(BINS, res.bin_of, res.row_of)
    write_bins(x, old, tmp_path, fsync=False, sum_block_bytes=4096)  # many blocks: most unverified below
    old.save(tmp_path)
    with _open(x, tmp_path)(load_placement(tmp_path)) as store:
        assert torch.equal(store.gather(torch.arange(3)), torch.from_numpy(x[:3]))
        rep = plan_replacement(old, _hot(len(x), 6), TARGETS, pool=10)
        assert apply_replacement(rep, tmp_path, x, fsync=False)["rows_written"] > 0
        assert torch.equal(store.gather(torch.arange(len(x))), torch.from_numpy(x))
    with _open(x, tmp_path)(load_placement(tmp_path)) as store:
        assert torch.equal(store.gather(torch.arange(len(x))), torch.from_numpy(x))


@pytest.mark.slow
def test_the_training_benchmark_runs_both_sides_and_writes_its_figures(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(REPO / "tools" / "bench_replace.py"), "--train", "--nodes", "6000",
                        "--batches", "6", "--window", "1500", "--shift", "400", "--epochs", "3", "--repeats", "1",
                        "--hidden", "8", "--batch", "128", "--dir", str(tmp_path), "--json", str(out)],
                       cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    figs = json.loads(out.read_text())["figures"]
    assert [f["bench"] for f in figs] == ["replace_train", "replace_train"]
    assert all(f["reference"] > 0 and f["ours"] > 0 for f in figs)
    assert "static cache %" in r.stdout and "moved" in r.stdout


def test_a_damaged_live_bin_stops_the_move_before_anything_is_committed(cora, tmp_path):
    from iostack.errors import StoreError

    x = np.array(cora.features)
    old = _placed(x, tmp_path, seed=4)
    rep = plan_replacement(old, _hot(len(x), 8), TARGETS, pool=10)
    target = next(b for b in BINS[2:] if (rep.new_bin == b.id).any())
    with open(tmp_path / target.path, "r+b") as f:  # a byte of the live bin flipped on the device
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(StoreError, match="corrupt|does not match"):  # the open check, or a block's as copied
        apply_replacement(rep, tmp_path, x, fsync=False)
    after = load_placement(tmp_path)
    assert np.array_equal(after.bin_of, old.bin_of) and np.array_equal(after.row_of, old.row_of)
    assert not list(tmp_path.glob("*.new*")) and not (tmp_path / COMMIT).exists()
