"""Every synchronisation of the GPU path, shown needed: on the deferred fake accelerator each test fails
when the wait it covers is removed (``tools/check_syncs.py`` removes each in turn and checks).

No GPU here: :class:`tests.fake_cuda.FakeDeviceMemory` with ``deferred=True`` queues copies on their
streams, poisons their destinations until they run, and reports work that overwrites or frees memory
that queued work still uses; the synchronisations themselves are the library's code.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
import torch

from iostack.errors import StoreError
from iostack.transfer import Transfer
from tests.fake_cuda import DRIVER, FakeCudaError, FakeDeviceMemory, reset_driver


def _batch(t, values, name="rows", slots=None):
    with t.batch() as b:
        stage = b.staging(name, tuple(values.shape), values.dtype)
        stage.copy_(values)
        x = b.to_device(stage)
    return x, b


def test_a_landing_orders_the_consumer_after_the_copies(mem):
    t = Transfer(mem)
    v = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    x, b = _batch(t, v)
    b.landing.wait()
    assert torch.equal(x + 0, v)


def test_reading_without_the_landing_sees_poison():
    reset_driver()
    m = FakeDeviceMemory(deferred=True)
    with m:
        x, _ = _batch(Transfer(m), torch.ones(4))
        assert torch.isnan(x + 0).all()
    with pytest.raises(FakeCudaError, match="never waited"):
        m.check()
    reset_driver()


def test_the_consumer_records_its_use_of_the_batch(mem):
    t = Transfer(mem)
    x, b = _batch(t, torch.ones(5))
    b.landing.wait()
    y = x * 2  # queued on the default stream, which nobody has waited for
    del x, b
    assert mem.violations == [], mem.violations  # freed after record_stream: kept until the default stream is past it
    mem.synchronize(mem.mark())
    assert torch.equal(y + 0, torch.full((5,), 2.0))


def test_staging_is_reused_only_after_its_copy(mem):
    t = Transfer(mem, staging_slots=2)
    got = [_batch(t, torch.full((8,), float(i))) for i in range(5)]  # never consumed in between
    for i, (x, b) in enumerate(got):
        b.landing.wait()
        assert torch.equal(x + 0, torch.full((8,), float(i))), i


def test_a_batch_that_stages_more_than_the_ring_holds_waits_for_its_own_copies(mem):
    """Defect 11a: the ring wrapped inside one batch and the first copy read the third batch's rows."""
    t = Transfer(mem, staging_slots=2)
    with t.batch() as b:
        xs = []
        for i in range(5):
            stage = b.staging("rows", (8,), torch.float32)
            stage.copy_(torch.full((8,), float(i)))
            xs.append(b.to_device(stage))
    b.landing.wait()
    for i, x in enumerate(xs):
        assert torch.equal(x + 0, torch.full((8,), float(i))), i


def test_a_side_stream_starts_after_the_callers_work(mem):
    t = Transfer(mem)
    src = mem.empty_pinned(16).view(torch.float32)
    src.copy_(torch.arange(4.0))
    dev = mem.empty((4,), torch.float32)
    mem.copy(dev, src)  # queued on the default stream
    with t.batch() as b:
        y = b.keep(mem.adopt(dev * 2))  # on the copy stream: must come after the default stream's copy
    b.landing.wait()
    assert torch.equal(y + 0, torch.arange(4.0) * 2)
    t.finish_thread()  # `dev` was read on the copy stream: done before it is freed


def test_a_producer_thread_waits_for_its_copies_before_its_buffers_go(mem):
    t = Transfer(mem)
    out = []

    def produce():
        with t.on_thread_stream():
            try:
                out.append(_batch(t, torch.arange(6.0)))
            finally:
                t.finish_thread()

    th = threading.Thread(target=produce)
    th.start()
    th.join()
    del th
    import gc

    gc.collect()
    assert mem.violations == [], mem.violations  # its staging ring died with it
    x, b = out[0]
    b.landing.wait()
    assert torch.equal(x + 0, torch.arange(6.0))


def test_a_tensor_of_another_gpu_is_copied_not_used_in_place(mem):
    """Defect 1: a batch served from cuda:0 to a trainer on cuda:1 was kept on cuda:0."""
    other = FakeDeviceMemory(index=1, deferred=True)
    served = mem.empty((4,), torch.int64)
    served.copy_(torch.arange(4))
    with pytest.raises(FakeCudaError, match="same device"):
        served + other.empty((4,), torch.int64)
    t = Transfer(other)
    with t.batch() as b:
        mine = b.to_device(served)
    b.landing.wait()
    assert other.is_local(mine) and not other.is_local(served)
    assert t.counts().by_route == {("device", "device"): (1, 32)}
    assert torch.equal(mine + other.empty((4,), torch.int64).zero_(), torch.arange(4))


@pytest.mark.parametrize("error,pinned", [(0, True), (712, False)])
def test_host_registration_already_registered_is_not_an_error(error, pinned):
    m = FakeDeviceMemory(register_error=error)
    t = torch.zeros(100)
    assert m.pin_in_place(t) is pinned
    assert m.pin_in_place(torch.zeros(0)) is False


def test_host_registration_refused_says_why():
    with pytest.raises(StoreError, match="ulimit -l"):
        FakeDeviceMemory(register_error=2).pin_in_place(torch.zeros(100))


def test_random_flushes_keep_results_right(mem):
    DRIVER.flush_p = 0.5
    t = Transfer(mem, staging_slots=2)
    got = [_batch(t, torch.full((8,), float(i))) for i in range(12)]
    for i, (x, b) in enumerate(got):
        b.landing.wait()
        assert torch.equal(x + 0, torch.full((8,), float(i))), i


def test_a_served_batch_from_another_gpu_is_moved_to_the_trainers(mem):
    """Defect 1 through the pipeline: the trainer on cuda:1 got a batch sampled on the server's cuda:0."""
    import numpy as np

    from training.features import MemoryFeatures
    from training.pipeline import Lookups, preparer
    from training.sampler import SampledBatch

    trainer = FakeDeviceMemory(index=1, deferred=True)
    feats = np.arange(40, dtype=np.float32).reshape(10, 4)
    features = MemoryFeatures(feats, Transfer(trainer))
    n_id = torch.tensor([3, 1, 4, 5])
    edges = mem.empty((2, 3), torch.int64)  # on the server's GPU, cuda:0
    edges.copy_(torch.tensor([[2, 3, 3], [0, 0, 1]]))
    b = SampledBatch(n_id, 2, edges, (2, 2), (3,))
    prep = preparer(features, Lookups(torch.arange(10), None), normalize=False)(b, 0.0).wait()
    assert trainer.is_local(prep.batch.edge_index) and trainer.is_local(prep.x)
    # the trainer's model mixes them: on CUDA (and the fake) two devices in one op raise
    got = prep.x.index_select(0, prep.batch.edge_index[0])
    assert torch.equal(got + 0, torch.from_numpy(feats[[4, 5, 5]]))


# -- KvikIO straight into device memory ---------------------------------------------------------------


@pytest.fixture
def ssd_bin(tmp_path):
    import numpy as np

    from iostack.bins import write_bins
    from iostack.placement import simple_placement

    feats = np.random.default_rng(0).random((600, 1024)).astype(np.float32)
    info = write_bins(feats, simple_placement(600, [("ssd", 600)]), tmp_path, fsync=False)[0]
    return feats, info


@pytest.mark.parametrize("delay,compat", [(None, "OFF"), (0.002, "OFF")])
def test_kvikio_device_rounds_wait_before_refilling_their_staging(mem, ssd_bin, monkeypatch, delay, compat):
    """Several rounds through one device staging buffer, on a prefetch thread's stream (KvikIO's
    sync_default_stream does not order it); the index of each goes up from pinned memory (11b)."""
    import sys

    import numpy as np

    from iostack.backends.kvikio_backend import KvikioBackend
    from iostack.bins import PAGE
    from tests.fake_kvikio import fake_kvikio

    mod = fake_kvikio(compat=compat, cufile_available=True, write_delay_s=delay, task_size=PAGE)
    monkeypatch.setitem(sys.modules, "kvikio", mod)
    feats, info = ssd_bin
    be = KvikioBackend(device="cpu", max_read_bytes=2 * PAGE, staging_bytes=4 * PAGE)
    h = be.open(info)
    t = Transfer(mem)
    ids = np.concatenate([np.arange(0, 40), [300, 7]])
    with t.on_thread_stream():
        scratch = mem.empty((1 << 16,), torch.uint8)
        queued = scratch + 1  # queued work on a block freed next: the staging buffer may be that block
        del scratch, queued
        out = mem.empty((ids.size, 1024), torch.float32)
        be.read_rows(h, ids, out, transfer=t)
    t.finish_thread()
    assert torch.equal(out + 0, torch.from_numpy(feats[ids]))
    mem.synchronize(mem.mark())  # the comparison ran on the default stream: done before `out` goes
    assert mod.stats["device_preads"] > 2 and mod.stats["tasks"] >= mod.stats["device_preads"]
    # sync_default_stream: once per pread with cuFile (in compatibility mode the backend reads into host staging)
    assert mod.stats["default_stream_syncs"] == mod.stats["device_preads"]
    c = t.counts()
    assert c.to_device() > 0 and c.to_device("pageable") == 0  # every round's index from pinned memory
    be.close()


def test_kvikio_small_device_reads_are_synchronous(mem, ssd_bin, monkeypatch):
    import sys

    import numpy as np

    from iostack.backends.kvikio_backend import KvikioBackend
    from tests.fake_kvikio import fake_kvikio

    mod = fake_kvikio(compat="OFF", cufile_available=True)
    monkeypatch.setitem(sys.modules, "kvikio", mod)
    feats, info = ssd_bin
    be = KvikioBackend(device="cpu", configure=False)  # gds_threshold left at 16 KiB: one-page reads bypass the pool
    h = be.open(info)
    out = mem.empty((2, 1024), torch.float32)
    be.read_rows(h, np.array([5, 500]), out, transfer=Transfer(mem))
    mem.synchronize(mem.mark())
    assert torch.equal(out + 0, torch.from_numpy(feats[[5, 500]]))
    assert mod.stats["sync_reads"] == mod.stats["device_preads"] == 2 and mod.stats["default_stream_syncs"] == 0
    be.close()


def test_a_gpu_bin_filled_in_more_chunks_than_the_ring_holds(mem, monkeypatch, tmp_path):
    import numpy as np

    import iostack.caches
    from iostack.bins import write_bins
    from iostack.placement import simple_placement
    from iostack.store import FeatureStore

    monkeypatch.setattr(iostack.caches, "_FILL_ROWS", 40)  # 300 GPU rows: 8 chunks through 3 staging slots
    rng = np.random.default_rng(2)
    feats = rng.random((800, 16)).astype(np.float32)
    p = simple_placement(800, [("gpu", 300), ("cpu", 200), ("ssd", 300)], order=rng.permutation(800))
    write_bins(feats, p, tmp_path, fsync=False)
    with FeatureStore(p, tmp_path, features=feats, memory=mem, backend="posix",
                      backend_options={"processes": 0}) as s:
        ids = rng.integers(0, 800, 500)
        x = s.gather_landing(ids).wait()
        assert torch.equal(x + 0, torch.from_numpy(feats[ids]))
        s.transfer.finish_thread()
        mem.synchronize(mem.mark())


# -- the trainer, end to end on the deferred fake ---------------------------------------------------


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    from tests.conftest import graph_fixture
    from training.importers import import_dataset

    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


def test_training_on_the_deferred_fake_equals_the_host_run(cora, monkeypatch):
    """Every landing waited for (else poison reaches the loss), the step timed on its own event (defect 3),
    and evaluation reads nothing back per batch (defect 11c)."""
    import training.trainer as trainer_mod
    from tests.conftest import flat_spec
    from training.data import open_dataset
    from training.trainer import train

    cfg = flat_spec(dataset=str(cora), epochs=1, prefetch=2, backend="posix", eval_every_epochs=1,
                    model="gcn", fanouts=(10, 5), batch_size=35, hidden=16, seed=3, eval_batch_size=100)
    host = train(cfg)
    reset_driver()
    m = FakeDeviceMemory(deferred=True)
    reads = []
    inner = trainer_mod._evaluate

    def evaluate(*a, **k):
        before = DRIVER.host_reads
        try:
            return inner(*a, **k)
        finally:
            reads.append(DRIVER.host_reads - before)

    monkeypatch.setattr(trainer_mod, "_evaluate", evaluate)
    with m:
        fake = train(cfg, memory=m)
    m.check()
    for k, v in host.model.state_dict().items():
        assert torch.equal(v, fake.model.state_dict()[k]), k
    assert fake.final["valid_acc"] == host.final["valid_acc"]
    steps = fake.final["steps"]
    assert DRIVER.syncs.get("default0", 0) >= steps  # each step waited on the default stream's own event
    # the evaluation loop reads nothing back per batch (it did: float() of each batch's hits); what is
    # left is the model's own per-layer trimming (training.models._needs: one host read per layer and batch)
    batches = [-(-len(getattr(open_dataset(cora), f"{split}_idx")) // 100) for split in ("valid", "test")]
    assert reads == [2 * n for n in batches], (reads, batches)
    reset_driver()


def test_the_loader_waits_for_each_batch_on_the_deferred_fake(cora, monkeypatch):
    """The user's loop gets rows only after their copies landed: training and evaluation batches equal the
    dataset's rows (without the landing waits they read as poison)."""
    from tests.conftest import flat_spec
    from training.data import open_dataset
    from training.loader import MomentLoader

    cfg = flat_spec(dataset=str(cora), epochs=1, prefetch=2, backend="posix", fanouts=(10, 5), batch_size=35,
                    seed=3, eval_batch_size=100)
    feats = torch.from_numpy(np.asarray(open_dataset(cora).features))
    reset_driver()
    m = FakeDeviceMemory(deferred=True)
    seen = 0
    with m, MomentLoader(cfg, memory=m) as loader:
        for b in itertools.chain(loader, loader.evaluation("valid")):  # each checked as it comes, as a loop does
            x = b.x.cpu() if hasattr(b.x, "cpu") else b.x
            assert torch.equal(torch.as_tensor(x), feats[b.batch.n_id.cpu()]), "a row read before it landed"
            seen += 1
    m.check()
    assert seen > 5
    reset_driver()
