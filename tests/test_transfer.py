"""Host↔device movement, counted: the transfer module and the feature store's GPU path on a fake device.

No GPU here: :class:`tests.fake_cuda.FakeDeviceMemory` labels host tensors as
device or pinned memory, so the store and the transfer module take their
accelerated code paths and every copy is counted by the memory it came from.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from iostack.bins import write_bins
from iostack.errors import StoreError
from iostack.hostshare import SHM_DIR
from iostack.placement import Bin, Placement, simple_placement
from iostack.store import FeatureStore
from iostack.transfer import HostMemory, Transfer, memory_for
from tests.fake_cuda import FakeDeviceMemory
from tests.fake_kvikio import fake_kvikio


def test_host_memory_copies_nothing():
    t = Transfer(HostMemory())
    src = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    with t.batch() as b:
        same = b.to_device(src)
        wide = b.to_device(src, dtype=torch.float32)
    b.landing.wait()
    assert same is src and wide.dtype == torch.float32 and t.counts().copies == 0
    assert memory_for("cpu").accelerated is False
    with pytest.raises(StoreError, match="CUDA is not available"):
        if not torch.cuda.is_available():
            memory_for("cuda:0")


def test_copies_are_counted_by_source_and_cast_after_the_copy():
    mem = FakeDeviceMemory()
    t = Transfer(mem)
    half = torch.ones(4, 8, dtype=torch.float16)
    with t.batch() as b:
        staged = b.staging("rows", (4, 8), torch.float16)
        staged.copy_(half)
        assert mem.kind_of(staged) == "pinned"
        x = b.to_device(staged, dtype=torch.float32)
        y = b.to_device(half)  # pageable: counted as such
        z = b.to_device(x)  # already on the device: no copy
    assert mem.kind_of(y) == "device" and z is x and x.dtype == torch.float32
    c = t.counts()
    assert c.by_route == {("pinned", "device"): (1, 64), ("pageable", "device"): (1, 64)}  # fp16 bytes crossed
    assert c.to_device("pinned") == 1 and c.to_device() == 2 and c.bytes_to_device() == 128
    b.landing.wait()
    b.landing.wait()
    assert mem.consumer_waits == 1  # once per landing


def test_staging_is_reused_once_its_copy_is_done():
    mem = FakeDeviceMemory()
    t = Transfer(mem, staging_slots=2)
    ptrs = []
    for _ in range(4):
        with t.batch() as b:
            s = b.staging("rows", (16,), torch.float32)
            ptrs.append(s.data_ptr())
            b.to_device(s)
    assert ptrs[0] == ptrs[2] and ptrs[1] == ptrs[3] and ptrs[0] != ptrs[1]
    assert mem.host_waits == 2  # the 3rd and 4th batch waited for the copy that last read their slot
    with t.batch() as b:
        big = b.staging("rows", (1 << 17,), torch.float32)  # grows
    assert big.numel() == 1 << 17


# -- the store's GPU path ---------------------------------------------------------------------


@pytest.fixture
def fp16_store_dir(tmp_path):
    rng = np.random.default_rng(3)
    n, dim = 2000, 64
    feats = rng.random((n, dim)).astype(np.float16)
    p = simple_placement(n, [("gpu", 300), ("cpu", 500), ("ssd", 700), ("ssd", 500)], order=rng.permutation(n))
    write_bins(feats, p, tmp_path, fsync=False)
    return feats, p, tmp_path


def _tiers(p, ids):
    kinds = np.array([b.kind for b in p.bins])[p.bin_of[ids]]
    return {k: int((kinds == k).sum()) for k in ("gpu", "cpu", "ssd")}


def test_gather_on_the_device_stages_host_rows_once(fp16_store_dir):
    feats, p, d = fp16_store_dir
    mem = FakeDeviceMemory()
    with FeatureStore(p, d, features=feats, memory=mem, backend="posix",
                      backend_options={"processes": 0}) as s:
        gpu_bin, cpu_bin = s.tier_of(0).tensors[0], s.tier_of(1).tensors[1]
        assert mem.kind_of(gpu_bin) == "device" and mem.kind_of(cpu_bin) == "pageable"
        assert mem.pinned_in_place == []  # gathered into pinned staging: the bin itself is not locked
        ids = np.random.default_rng(0).integers(0, 2000, 4000)
        waits = mem.consumer_waits
        got = s.gather_landing(ids, dtype=torch.float32)
        assert mem.consumer_waits == waits
        x = got.wait()
        assert mem.consumer_waits == waits + 1 and mem.kind_of(x) == "device" and x.dtype == torch.float32
        assert torch.equal(x, torch.from_numpy(feats[ids].astype(np.float32)))
        c = s.transfer.counts()
        n = _tiers(p, ids)
        host_rows = n["cpu"] + n["ssd"]
        # two copies up, both from pinned memory: the index metadata and the host-side rows (fp16)
        assert c.to_device() == 2 and c.to_device("pinned") == 2 and c.to_device("pageable") == 0
        index_bytes = (2 * n["gpu"] + host_rows) * 8
        assert c.bytes_to_device() == index_bytes + host_rows * 64 * 2
        st = {b.bin_id: b for b in s.stats()}
        assert st[0].held == "device" and st[0].rows == n["gpu"] and st[0].calls == 1
        assert st[1].held == "host" and st[2].held == "file"
        s.transfer.reset_counts()
        only_gpu = p.vertices_of(0)[:50]
        assert torch.equal(s.gather(only_gpu), torch.from_numpy(feats[only_gpu]))
        assert s.transfer.counts().by_route == {("pinned", "device"): (1, 100 * 8)}  # no feature bytes moved
        assert s.gather(np.array([], np.int64)).shape == (0, 64)
        assert torch.equal(s.gather(ids[:10], device="cpu"), torch.from_numpy(feats[ids[:10]]))


def test_kvikio_reads_land_on_the_device(fp16_store_dir, monkeypatch):
    feats, p, d = fp16_store_dir
    mod = fake_kvikio(cufile_available=True)  # GDS: compatibility mode reads via host staging
    monkeypatch.setitem(sys.modules, "kvikio", mod)
    from iostack.backends.kvikio_backend import KvikioBackend

    mem = FakeDeviceMemory()
    with FeatureStore(p, d, features=feats, memory=mem, backend=KvikioBackend(device="cpu")) as s:
        ids = np.random.default_rng(1).integers(0, 2000, 3000)
        assert torch.equal(s.gather(ids), torch.from_numpy(feats[ids]))
        n = _tiers(p, ids)
        # SSD rows were read straight into the result: only the CPU rows crossed from the host
        c = s.transfer.counts()
        # ... and the KvikIO rounds' index (slot, row in page, destination: int64 each), from pinned memory
        assert c.bytes_to_device() == (2 * n["gpu"] + n["cpu"]) * 8 + n["cpu"] * 64 * 2 + n["ssd"] * 3 * 8
        assert c.to_device("pageable") == 0
        assert len(mod.stats["preads"]) == 2  # every page of each SSD bin is hit: one coalesced read per bin


def test_gpu_bins_must_fit_in_free_device_memory(fp16_store_dir):
    feats, p, d = fp16_store_dir
    with pytest.raises(StoreError, match=r"smaller `gpu_cache_bytes`"):
        FeatureStore(p, d, features=feats, memory=FakeDeviceMemory(free=1000), backend_options={"processes": 0})


def test_other_ranks_partitions_are_served_from_host_memory(tmp_path):
    rng = np.random.default_rng(5)
    feats = rng.random((400, 8)).astype(np.float32)
    bins = (Bin(0, "gpu", 100, device="cuda:0"), Bin(1, "gpu", 100, device="cuda:1"), Bin(2, "cpu", 200))
    bin_of = np.repeat([0, 1, 2], [100, 100, 200])
    row_of = np.concatenate([np.arange(100), np.arange(100), np.arange(200)])
    p = Placement(bins, bin_of, row_of)
    mem = FakeDeviceMemory()
    with FeatureStore(p, features=feats, memory=mem, local_gpu_bins=[1]) as s:
        assert s.held == {0: "host", 1: "device", 2: "host"}
        assert any("GPU bin 0" in n and "NVLink" in n for n in s.notes)
        ids = np.arange(0, 400, 3)
        assert torch.equal(s.gather(ids), torch.from_numpy(feats[ids]))
        tiers = s.tier_stats()
        assert tiers["gpu-peer"]["rows"] == 34 and tiers["gpu"]["rows"] == 33 and tiers["cpu"]["rows"] == 67
        m = s.memory_bytes()
        assert m["device"] == 100 * 32 and m["host"] == 300 * 32 and m["gpu"] == 200 * 32


def _segments(store):
    """The node-shared segments of a store's host tiers, in bin order."""
    return [seg for t in store.tiers for seg in getattr(t, "segments", ())]


@pytest.mark.skipif(not os.access(SHM_DIR, os.W_OK), reason="no writable /dev/shm")
def test_host_tiers_are_one_copy_per_node(fp16_store_dir):
    feats, p, d = fp16_store_dir
    key = f"test-{uuid.uuid4().hex[:12]}"
    a = FeatureStore(p, d, features=feats, share_key=key, backend_options={"processes": 0})
    b = FeatureStore(p, d, features=feats, share_key=key, backend_options={"processes": 0})
    # no accelerator: the "gpu" bin is host memory too, so both cache bins are node-shared
    seg_a, seg_b = _segments(a), _segments(b)
    assert len(seg_a) == len(seg_b) == 2
    assert all(x.built for x in seg_a) and not any(x.built for x in seg_b)
    assert [x.path for x in seg_a] == [x.path for x in seg_b]
    sa = seg_a[1]
    ta, tb = a.tier_of(1).tensors[1], b.tier_of(1).tensors[1]
    assert ta.data_ptr() != tb.data_ptr()  # two mappings ...
    ta[0, 0] = 42  # ... of one copy
    assert float(tb[0, 0]) == 42
    a.close()
    assert sa.path.exists()  # b still maps it
    b.close()
    assert not sa.path.exists() and not Path(str(sa.path)[:-4] + ".lock").exists()


def test_row_buffers_reuse_only_what_nothing_else_holds():
    from iostack.rowbuffers import RowBuffers

    rb = RowBuffers(8, torch.float32, slots=2)
    a = rb.take(100)
    ptr = a.data_ptr()
    a.fill_(1.0)
    b = rb.take(50)  # `a` is alive: a second buffer
    assert b.data_ptr() != ptr
    w = torch.ones(8, 3, requires_grad=True)
    loss = (a @ w).sum()  # autograd saves `a` for the gradient of `w`
    del a
    c = rb.take(100)
    assert c.data_ptr() not in (ptr, b.data_ptr())  # saved for backward: still held
    loss.backward()
    assert torch.equal(w.grad, torch.full((8, 3), 100.0))  # the saved rows were not overwritten
    del loss, c
    d = rb.take(120)  # both ring buffers free again; the first grows past its 100 rows
    assert d.shape == (120, 8)
    e = rb.take(10)
    assert e.data_ptr() != d.data_ptr()
