"""The cache that fills on access with its rows on the GPU (``moment train --dynamic-cache-on gpu``).

No GPU here: :class:`tests.fake_cuda.FakeDeviceMemory` with ``deferred=True`` queues copies on their streams,
poisons their destinations until they run and reports work that overwrites memory queued work still reads; the
synchronisations are the library's (``tools/check_syncs.py`` removes each in turn and runs these tests).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from iostack.transfer import Transfer
from tests.fake_cuda import FakeDeviceMemory, reset_driver
from training.cached_features import CachedFeatures
from training.errors import TrainError
from training.features import MemoryFeatures
from training.specs import IOSpec

N, DIM = 300, 8


class Counted(MemoryFeatures):
    """Features in memory that remember which rows were asked of them."""

    def __init__(self, features: np.ndarray, transfer: Transfer) -> None:
        super().__init__(features, transfer)
        self.asked: list[np.ndarray] = []

    def gather_landing(self, ids, dtype=None):
        self.asked.append(np.asarray(torch.as_tensor(ids).cpu()).copy())
        return super().gather_landing(ids, dtype)


def _feats() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((N, DIM)).astype(np.float32)


def test_rows_are_exact_across_epochs_with_evictions(mem):
    feats = _feats()
    cf = CachedFeatures(MemoryFeatures(feats, Transfer(mem)), N, 40 * DIM * 4, "lru", np.arange(20), on="gpu")
    assert mem.kind_of(cf.cache.rows) == "device"
    rng = np.random.default_rng(1)
    inserted = 0
    for _epoch in range(3):
        for _ in range(6):
            ids = rng.integers(0, N, 90)
            x = cf.gather_landing(torch.from_numpy(ids)).wait()
            assert mem.kind_of(x) == "device"
            assert torch.equal(x + 0, torch.from_numpy(feats[ids])), "a row read before it landed, or wrong"
        inserted += cf.cache.counts.inserted
        rec = cf.epoch_record()
        assert 0 < rec["cache_hit_rate"] < 1
    assert inserted > 3 * 40  # rows went in over evicted ones, every epoch
    mem.synchronize(mem.mark())


def test_hits_are_never_read_from_the_source_again(mem):
    feats = _feats()
    src = Counted(feats, Transfer(mem))
    cf = CachedFeatures(src, N, 50 * DIM * 4, "lru", np.arange(30), on="gpu")
    rng = np.random.default_rng(2)
    for _ in range(8):
        ids = rng.integers(0, 120, 70)
        cached = set(cf.cache.cached_ids().tolist())
        src.asked.clear()
        x = cf.gather_landing(torch.from_numpy(ids), dtype=torch.float64).wait()
        asked = np.concatenate(src.asked) if src.asked else np.empty(0, np.int64)
        assert sorted(asked.tolist()) == sorted(set(ids.tolist()) - cached)  # each miss once, no hit
        assert x.dtype == torch.float64 and torch.equal(x + 0, torch.from_numpy(feats[ids]).double())
    mem.synchronize(mem.mark())


def test_an_insert_waits_for_reads_of_the_rows_on_another_stream(mem):
    """A gather on a prefetch thread reads the cached rows on its copy stream; the next one, on the main
    thread's stream, evicts them: it must be ordered after those reads (sync-point gpu-cache-after-last-batch)."""
    feats = _feats()
    cf = CachedFeatures(MemoryFeatures(feats, Transfer(mem)), N, 16 * DIM * 4, "lru", np.arange(16), on="gpu")
    got = {}

    def first() -> None:
        got["x"] = cf.gather_landing(torch.arange(16))  # all hits, read on this thread's copy stream

    t = threading.Thread(target=first)
    t.start()
    t.join()
    ids = torch.arange(100, 140)  # all misses: every slot evicted and rewritten
    y = cf.gather_landing(ids).wait()
    assert torch.equal(y + 0, torch.from_numpy(feats[100:140]))
    assert torch.equal(got["x"].wait() + 0, torch.from_numpy(feats[:16]))
    mem.synchronize(mem.mark())


def test_a_cpu_only_run_is_refused_naming_the_setting():
    with pytest.raises(TrainError, match="`dynamic_cache_on` gpu: this run has no accelerator"):
        CachedFeatures(MemoryFeatures(_feats()), N, 1 << 20, "lru", np.arange(4), on="gpu")


def test_the_spec_checks_where_the_cache_lives():
    assert IOSpec(cache_policy="lru", dynamic_cache_bytes=1 << 20, dynamic_cache_on="gpu").dynamic_cache_on == "gpu"
    with pytest.raises(TrainError, match="`dynamic_cache_on` 'disk'"):
        IOSpec(cache_policy="lru", dynamic_cache_bytes=1 << 20, dynamic_cache_on="disk")
    with pytest.raises(TrainError, match="give `dynamic_cache_bytes`"):
        IOSpec(dynamic_cache_on="gpu")


def test_the_host_cache_is_unchanged():
    feats = _feats()
    cf = CachedFeatures(MemoryFeatures(feats), N, 40 * DIM * 4, "lru", np.arange(20))
    assert not cf.on_device and cf.cache.rows.device.type == "cpu"
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, N, 90))
    assert torch.equal(cf.gather(ids), torch.from_numpy(feats)[ids])


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    from tests.conftest import graph_fixture
    from training.importers import import_dataset

    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


def test_training_with_the_gpu_cache_equals_the_host_cache(cora, monkeypatch):
    """On Cora, a few steps: the same parameters and accuracy as the host cache (every landing waited for)."""
    from tests.conftest import flat_spec
    from training.trainer import train

    common = dict(dataset=str(cora), epochs=1, prefetch=2, backend="posix", eval_every_epochs=1, model="gcn",
                  fanouts=(10, 5), batch_size=35, hidden=16, seed=3, eval_batch_size=100, cache_policy="lru",
                  dynamic_cache=256 * 1433 * 4)
    host = train(flat_spec(**common))
    on_device = []
    inner = CachedFeatures._gather_on_device

    def counted(self, ids, dtype):
        on_device.append(int(ids.numel()))
        return inner(self, ids, dtype)

    monkeypatch.setattr(CachedFeatures, "_gather_on_device", counted)
    reset_driver()
    m = FakeDeviceMemory(deferred=True)
    with m:
        fake = train(flat_spec(**common, dynamic_cache_on="gpu"), memory=m)
    m.check()
    assert len(on_device) >= fake.final["steps"]  # every training batch came through the device cache
    for k, v in host.model.state_dict().items():
        assert torch.equal(v, fake.model.state_dict()[k]), k
    assert fake.final["valid_acc"] == host.final["valid_acc"] and fake.final["steps"] == host.final["steps"]
    reset_driver()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a run without an accelerator")
def test_cli_gpu_cache_on_a_cpu_only_run_is_one_line(cora, capsys):
    from moment.cli import main

    assert main(["train", "--dataset", str(cora), "--fanouts", "5", "--batch-size", "64", "--epochs", "1",
                 "--hidden", "8", "--dynamic-cache", "64KiB", "--dynamic-cache-on", "gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dynamic-cache-on" in err and "no accelerator" in err, err
