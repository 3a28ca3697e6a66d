"""Issue 34's defects found by reading the GPU path, each pinned by a test that failed before its fix.

No GPU here: each test drives the real code through a small local stand-in for the CUDA
facts it needs (a namespace in place of ``torch``, a monkeypatched call), never through a
faked GPU figure.
"""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest
import torch


class _Props:
    def __init__(self, name: str, uuid: str = "") -> None:
        self.name, self.uuid = name, uuid  # no pci_* fields: PyTorch before they were exposed


def _fake_cuda_torch(count: int, props: list[_Props], registered: list, pinned_asks: list):
    """A ``torch`` stand-in for hwprofile.cuda: real CPU tensors, CUDA calls recorded, events timed as 1 ms."""

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 1.0

    class Cudart:
        def cudaHostRegister(self, ptr, n, flags):  # noqa: N802 - CUDA's name
            registered.append(("register", ptr, n))
            return 0

        def cudaHostUnregister(self, ptr):  # noqa: N802 - CUDA's name
            registered.append(("unregister", ptr))
            return 0

    def empty(n, dtype=None, device=None, pin_memory=False):
        if pin_memory:
            pinned_asks.append(n)
        return torch.empty(n, dtype=dtype)

    cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: count, get_device_properties=lambda i: props[i],
        device=lambda i: contextlib.nullcontext(), Event=Event, cudart=lambda: Cudart(),
        can_device_access_peer=lambda i, j: False)
    return types.SimpleNamespace(cuda=cuda, empty=empty, from_numpy=torch.from_numpy, uint8=torch.uint8)


def test_profiled_gpus_get_their_own_pinned_block_and_distinct_keys(monkeypatch):
    """Defects 8 and 11f: every GPU's host buffer is freshly allocated (first-touched on its node) and
    page-locked in place, not a block PyTorch's caching host allocator kept from GPU 0; and two GPUs of
    one model without bus addresses (older torch) get different keys."""
    import sys

    from hwprofile import cuda as hc

    registered: list = []
    pinned_asks: list = []
    fake = _fake_cuda_torch(2, [_Props("H200"), _Props("H200")], registered, pinned_asks)
    monkeypatch.setitem(sys.modules, "torch", fake)
    links, _, notes = hc.cuda_bandwidths(bytes=1 << 16, repeats=1)
    assert pinned_asks == []  # the caching host allocator is never asked
    regs = [r for r in registered if r[0] == "register"]
    assert len(regs) == 2 and all(r[2] == 1 << 16 for r in regs)
    assert sum(r[0] == "unregister" for r in registered) == 2  # each block unlocked after its GPU
    keys = {lk.device for lk in links if lk.link_class == "host-to-device"}
    assert len(keys) == 2, keys


def test_gpu_key_prefers_the_uuid():
    from hwprofile.cuda import _gpu_node

    assert _gpu_node(None, _Props("A100", "GPU-abc"), 3) == ("cuda:GPU-abc:A100", None)
    assert _gpu_node(None, _Props("A100"), 3) == ("cuda:3:A100", None)


def test_cuda_serving_starts_one_worker_per_gpu_each_bound_to_it(tmp_path, monkeypatch):
    """Defect 2: `moment serve --device cuda` started one worker per CPU, each with a CUDA context and a whole
    CSR on GPU 0. Now one per GPU, each told its own GPU; more workers than GPUs is refused."""
    from training.serve import device as sd
    from training.serve import workers as sw
    from training.serve.protocol import SamplingParams, ServerError
    from training.serve.server import SamplingServer
    from training.synth import SynthSpec
    from training.synth_run import synthesize

    graph = tmp_path / "g"
    synthesize(graph, SynthSpec(num_nodes=500, num_edges=4000, feature_dim=4, train_share=0.5, seed=5))
    monkeypatch.setattr(sd, "device_handover_available", lambda device: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    started: list[list[str]] = []
    monkeypatch.setattr(sw.WorkerPool, "start", lambda self, timeout_s: started.append(list(self.devices)))
    server = SamplingServer(graph, SamplingParams(16, (2,)), device="cuda", port=0)
    assert server.workers == 3 and server.worker_devices == ["cuda:0", "cuda:1", "cuda:2"]
    with pytest.raises(ServerError, match="at most one sampler worker per GPU"):
        SamplingServer(graph, SamplingParams(16, (2,)), device="cuda", workers=4, port=0)
    assert SamplingServer(graph, SamplingParams(16, (2,)), device="cuda", workers=2, port=0).workers == 2
    # the pool hands each worker process its device (what serve_worker binds with torch.cuda.set_device)
    pool = sw.WorkerPool({"device": "cuda"}, ["a", "b"], ["cuda:0", "cuda:1"])
    assert pool.devices == ["cuda:0", "cuda:1"]


def test_auto_backend_decides_on_cold_cache_figures_only(monkeypatch, tmp_path):
    """Defect 5: KvikIO's compatibility mode reads buffered, posix O_DIRECT: a figure taken with the file in the
    page cache times memory against the SSD. `auto` weighs cold figures only and says so; the capacities file
    keeps which was measured."""
    from iostack.backends import TOOL_KVIKIO_TO_GPU, TOOL_POSIX_TO_GPU, choose_backend
    from planner import hostinfo
    from planner.capacities import Capacities, DeviceCapacity, ReadMeasurement, dump_capacities, parse_capacities
    from planner.hostinfo import BlockDevice

    monkeypatch.setattr(hostinfo, "block_device_of", lambda p, sys_root="/sys": BlockDevice("nvme0n1"))

    def caps(cache_kv: str | None, cache_px: str | None) -> Capacities:
        others = (ReadMeasurement(9e9, tool=TOOL_KVIKIO_TO_GPU, mode="buffered", page_cache=cache_kv),
                  ReadMeasurement(3e9, tool=TOOL_POSIX_TO_GPU, mode="direct", page_cache=cache_px))
        return Capacities(devices=(DeviceCapacity("0000:3b:00.0", ReadMeasurement(3e9, tool="fio-io_uring"),
                                                  block_device="nvme0n1", path=str(tmp_path), others=others),))

    paths = [str(tmp_path / "bin3.dat")]
    warm = choose_backend("auto", cuda=True, capacities=caps("warm", "warm"), paths=paths)
    assert warm.name == "posix" and "cold page cache" in warm.reason
    unsaid = choose_backend("auto", cuda=True, capacities=caps(None, None), paths=paths)
    assert unsaid.name == "posix"  # a figure that does not say it was cold is not trusted
    cold = choose_backend("auto", cuda=True, capacities=caps("cold", "cold"), paths=paths)
    assert cold.name == "kvikio" and "cold page cache" in cold.reason
    back = parse_capacities(dump_capacities(caps("cold", "warm")))
    assert [m.page_cache for m in back.devices[0].others] == ["cold", "warm"]


def test_page_cache_drop_and_residency(tmp_path):
    from iostack.pagecache import drop, resident_share

    f = tmp_path / "x.bin"
    f.write_bytes(np.random.default_rng(0).bytes(1 << 20))
    drop(f)
    share = resident_share(f)
    if share == 1.0:
        pytest.skip("this file system keeps its pages in memory (tmpfs): nothing to drop")
    assert share is not None and share < 0.5
    f.read_bytes()
    assert resident_share(f) == 1.0


def _local_kvikio(compat: bool, bounce: int = 16 << 20):
    """A KvikIO 25.04+ module stand-in: settings only, and a CuFile that records how it was asked to read."""
    state = {"num_threads": 1, "task_size": 4 << 20, "gds_threshold": 16 << 10, "bounce_buffer_size": bounce,
             "compat_mode": compat}
    calls: list[str] = []

    class Ready:
        def __init__(self, n):
            self.n = n

        def get(self):
            return self.n

        def check_bytes_done(self):
            calls.append("waited on its stream")
            return self.n

    class CuFile:
        def __init__(self, path, flags="r"):
            pass

        def pread(self, buf, size, offset):
            calls.append("pread")
            return Ready(size)

        def raw_read_async(self, buf, stream, size, offset):
            calls.append(f"raw_read_async on {stream}")
            return Ready(size)

        def close(self):
            pass

    defaults = types.SimpleNamespace(get=state.__getitem__, set=state.__setitem__,
                                     is_compat_mode_preferred=lambda: state["compat_mode"])
    return types.SimpleNamespace(defaults=defaults, CuFile=CuFile, __version__="25.08"), state, calls


def test_kvikio_bounce_buffers_are_sized_from_the_plan(monkeypatch):
    """Defect 9: 64 threads x KvikIO's 16 MiB bounce buffers pinned 1 GiB per rank; a task never reads more than
    `max_read_bytes`, so the buffers are that size and the backend reports what it may pin."""
    import sys

    from iostack.backends.kvikio_backend import KvikioBackend

    kv, state, _ = _local_kvikio(compat=True)
    monkeypatch.setitem(sys.modules, "kvikio", kv)
    be = KvikioBackend(device="cpu", queue_depth=64, max_read_bytes=1 << 20)
    assert state["bounce_buffer_size"] == 1 << 20
    assert be.buffer_bytes == 64 << 20  # not 1 GiB
    kv2, state2, _ = _local_kvikio(compat=True, bounce=256 << 10)  # a smaller one set by the user stays
    monkeypatch.setitem(sys.modules, "kvikio", kv2)
    assert KvikioBackend(device="cpu", queue_depth=8).buffer_bytes == 8 * (256 << 10)
    assert state2["bounce_buffer_size"] == 256 << 10


def test_kvikio_reads_do_not_wait_for_the_default_stream(monkeypatch):
    """Defect 4: with GDS, `pread` synchronises the default stream (the training compute) before reading; the
    backend reads with `raw_read_async` on its own stream and waits on that stream only. In compatibility mode
    KvikIO's device reads copy on blocking streams: the backend then reads into host staging (no device reads)
    and the store copies up on its own stream."""
    import sys

    from iostack.backends.kvikio_backend import KvikioBackend

    kv, _, calls = _local_kvikio(compat=False)
    monkeypatch.setitem(sys.modules, "kvikio", kv)
    gds = KvikioBackend(device="cpu")
    assert gds.device_reads and gds.direct
    f = kv.CuFile("x")
    assert gds._issue(f, None, 4096, 0, stream=77).get() == 4096
    assert calls == ["raw_read_async on 77", "waited on its stream"]
    calls.clear()

    def refuse(*a):
        raise RuntimeError("cuFile stream API not supported")

    f.raw_read_async = refuse
    assert gds._issue(f, None, 4096, 0, stream=77).get() == 4096 and calls == ["pread"]  # refused: pread, logged
    kv2, _, _ = _local_kvikio(compat=True)
    monkeypatch.setitem(sys.modules, "kvikio", kv2)
    compat = KvikioBackend(device="cpu")
    assert not compat.device_reads  # reads land in the store's pinned staging; the store copies them up


def test_cpu_tier_is_not_page_locked_and_a_refusal_cannot_stop_the_run(tmp_path):
    """Defect 6: every rank page-locked its CPU bins though no GPU path reads them in place (their rows are
    gathered on the CPU into pinned staging), and a refused `cudaHostRegister` (ulimit -l) raised. The bins are
    not registered now: a device whose registration always fails still builds the store and gathers right."""
    from iostack.bins import write_bins
    from iostack.errors import StoreError
    from iostack.placement import simple_placement
    from iostack.store import FeatureStore
    from tests.fake_cuda import FakeDeviceMemory

    class Refusing(FakeDeviceMemory):
        asked = 0

        def pin_in_place(self, t):
            Refusing.asked += 1
            raise StoreError("cudaHostRegister failed (cudaError 2)")

    rng = np.random.default_rng(1)
    feats = rng.random((600, 8)).astype(np.float32)
    p = simple_placement(600, [("gpu", 100), ("cpu", 300), ("ssd", 600)], order=rng.permutation(600))
    write_bins(feats, p, tmp_path, fsync=False)
    mem = Refusing()
    with FeatureStore(p, tmp_path, features=feats, memory=mem, backend="posix",
                      backend_options={"processes": 0}) as s:
        ids = rng.integers(0, 600, 500)
        assert torch.equal(s.gather_landing(ids).wait(), torch.from_numpy(feats[ids]))
    assert Refusing.asked == 0


def test_gds_is_decided_per_file(monkeypatch, tmp_path):
    """Defect 11c: KvikIO's compatibility setting is process-wide, but cuFile registers each file on its own; a
    bin on a file system that refuses O_DIRECT is read through POSIX even when the process has GDS, and is
    reported so (not `direct`), and its reads do not take the stream-ordered cuFile path."""
    import sys

    from iostack.backends import kvikio_backend as kb
    from iostack.bins import write_bins
    from iostack.placement import simple_placement

    kv, _, _ = _local_kvikio(compat=False)
    monkeypatch.setitem(sys.modules, "kvikio", kv)
    feats = np.zeros((20, 4), np.float32)
    infos = write_bins(feats, simple_placement(20, [("ssd", 10), ("ssd", 10)]), tmp_path, fsync=False)
    refusing = {infos[1].path}
    monkeypatch.setattr(kb, "o_direct_opens", lambda path: path not in refusing)
    be = kb.KvikioBackend(device="cpu")
    on_gds, on_posix = be.open(infos[0]), be.open(infos[1])
    assert on_gds.direct and not on_posix.direct and "refuses O_DIRECT" in (on_posix.note or "")
    assert be._direct == {on_gds.fid: True, on_posix.fid: False}


def test_plain_ranks_never_take_a_partition_ranks_gpu():
    """Defect 11d: a rank with a planned partition took the GPU at its bus address, a rank without one took
    cuda:LOCAL_RANK, which could be the same GPU. Every rank now decides every local rank's GPU alike."""
    from training.devices import DeviceError, rank_devices

    buses = {0: "0000:01:00.0", 1: "0000:02:00.0", 2: "0000:03:00.0"}
    # partitions planned on the GPUs at ordinals 1 and 2; rank 2 holds none (cuda:2 before: shared with rank 1)
    got = rank_devices(["0000:02:00.0", "0000:03:00.0", None], buses=buses)
    assert [d.index for d in got] == [1, 2, 0]
    assert [d.index for d in rank_devices([None, None, None], buses=buses)] == [0, 1, 2]  # unplanned: as before
    assert [d.index for d in rank_devices([None, "0000:01:00.0"], buses=buses)] == [1, 0]
    with pytest.raises(DeviceError, match="planned onto one GPU"):
        rank_devices(["0000:02:00.0", "0000:02:00.0"], buses=buses)
    with pytest.raises(DeviceError, match="at most one rank per GPU"):
        rank_devices([None] * 4, buses=buses)
    assert rank_devices([None, None], visible=1) == [torch.device("cuda", 0)] * 2


def test_feature_exchange_never_opens_a_second_nccl_communicator(monkeypatch):
    """Defect 10: on GPUs the exchange ran NCCL all_to_all on a group of its own from the prefetch thread while
    DDP's all-reduce ran NCCL from the trainer's thread, NCCL's known hang pattern. It runs on gloo now."""
    from training.sharded import exchange as ex
    from training.sharded import features as sh

    made: list[str] = []
    monkeypatch.setattr(ex.AllToAllExchange, "new_group", classmethod(lambda cls, t, backend="gloo": made.append(
        backend) or "group"))
    monkeypatch.setattr(ex.AllToAllExchange, "__init__", lambda self, group, serve, **kw: setattr(self, "kw", kw))
    feats = types.SimpleNamespace(dim=4, dtype=torch.float32, serve=lambda ids: ids, exchange_device=torch.device(
        "cpu"), transfer=types.SimpleNamespace(memory=types.SimpleNamespace(device=torch.device("cuda", 1))))
    x = sh._start_exchange(sh.ShardedOptions(), sh.Peers(0, 2, 0, 1, 0), feats)
    assert made == ["gloo"] and x.kw.get("device", "cpu") == "cpu" and feats.exchange_device.type == "cpu"


def _sync_ops(fn) -> tuple[int, int]:
    """(ops that make a GPU wait for the host's read-back, all aten ops) while ``fn`` runs, counted on the CPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    # top-level aten ops only (an op's own sub-ops are not more launches)
    names = [e.name for e in prof.events() if e.name.startswith("aten::")
             and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    waits = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::masked_select", "aten::_unique2",
             "aten::unique_consecutive", "aten::is_nonzero"}
    return sum(n in waits for n in names), len(names)


def test_gpu_sampling_has_fixed_shapes_few_ops_per_hop_and_no_host_sync():
    """Defect 7: on a GPU the sampler's hops waited for the device four times each and ran hundreds of small
    kernels (the CPU-tuned Floyd loop). With `shapes="fixed"` (the default on CUDA) every hop is a fixed-size
    chain of about a hundred tensor ops (views included) with no read-back, one per batch; its batches keep every
    sampling rule, and its Floyd draws are exactly the sequential ones."""
    from training.gpusample import floyd_parallel
    from training.samplecheck import sample_problems
    from training.sampler import NeighborSampler, _floyd

    rng = np.random.default_rng(0)
    n = 4000
    indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(rng.integers(0, 80, n))]))
    indices = torch.from_numpy(rng.integers(0, n, int(indptr[-1])))
    for fanouts in ((25, 10), (10, 10, 5), (1, 3)):
        s = NeighborSampler(indptr, indices, fanouts, seed=3, shapes="fixed")
        for _ in range(3):
            seeds = torch.from_numpy(rng.choice(n, 300, replace=False))
            assert sample_problems(indptr, indices, s.sample(seeds, check=False), fanouts, seeds) == []
    seeds = torch.from_numpy(rng.choice(n, 300, replace=False))
    fixed2, fixed3 = (NeighborSampler(indptr, indices, f, seed=3, shapes="fixed") for f in ((25, 10), (25, 10, 10)))
    data2 = NeighborSampler(indptr, indices, (25, 10), seed=3, shapes="data", compiled=False)  # the torch path
    waits2, ops2 = _sync_ops(lambda: fixed2.sample(seeds, check=False))
    waits3, ops3 = _sync_ops(lambda: fixed3.sample(seeds, check=False))
    assert waits2 == waits3 == 0 and ops3 - ops2 <= 120  # a hop: ~100 ops (views included), none waiting
    data_waits, data_ops = _sync_ops(lambda: data2.sample(seeds, check=False))
    assert data_waits >= 4 * 2  # the CPU's hops (what a GPU ran before): four waits per hop at least
    g = torch.Generator().manual_seed(1)
    deg = torch.randint(26, 90, (2000,), generator=g)
    u = torch.rand((2000, 25), generator=g, dtype=torch.float64)
    assert torch.equal(floyd_parallel(deg, 25, u.clone()), _floyd(deg, 25, u.t().contiguous()))
    assert NeighborSampler(indptr, indices, (5,)).shapes == "data"  # on the CPU, by default
