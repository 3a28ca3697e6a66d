"""The KvikIO backend's real code, driven by a fake ``kvikio`` module on CPU tensors (no GPU here)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from iostack.backends import get_backend
from iostack.backends.kvikio_backend import KvikioBackend, gds_status, kvikio_option, resolve_device
from iostack.bins import PAGE, write_bins
from iostack.errors import StoreError
from iostack.placement import simple_placement
from tests.fake_kvikio import VERSIONS, CompatMode, fake_kvikio


@pytest.fixture
def bins(tmp_path):
    """Two SSD bins: packed rows (dim 3, float32) and page rows (dim 1024)."""
    rng = np.random.default_rng(0)
    out = {}
    for dim in (3, 1024):
        n = 3000 if dim == 3 else 600
        feats = rng.random((n, dim)).astype(np.float32)
        d = tmp_path / f"d{dim}"
        d.mkdir()
        info = write_bins(feats, simple_placement(n, [("ssd", n)]), d, fsync=False)[0]
        out[dim] = (feats, info)
    return out


def _backend(monkeypatch, **kw):
    mod = fake_kvikio(**{k: kw.pop(k) for k in list(kw) if k in ("version", "compat", "cufile_available")})
    monkeypatch.setitem(sys.modules, "kvikio", mod)
    return KvikioBackend(device="cpu", **kw), mod


@pytest.mark.parametrize("dim", [3, 1024])
def test_reads_coalesce_and_go_out_concurrently(monkeypatch, bins, dim):
    feats, info = bins[dim]
    be, mod = _backend(monkeypatch, threads=8, max_read_bytes=8 * PAGE)
    h = be.open(info)
    rng = np.random.default_rng(dim)
    ids = np.concatenate([np.arange(100, 160), rng.integers(0, feats.shape[0], 200), [7, 7, 7]])
    out = torch.empty((ids.size, dim), dtype=torch.float32)
    requests = be.read_rows(h, ids, out)
    assert torch.equal(out, torch.from_numpy(feats[ids]))
    ext = PAGE if info.rows_per_page > 1 else info.row_stride_bytes
    extents = np.unique(ids // info.rows_per_page if info.rows_per_page > 1 else ids)
    preads = mod.stats["preads"]
    assert requests == len(preads) < extents.size  # neighbours merged
    assert sum(n for _, n in preads) == extents.size * ext  # each extent read once
    assert all(n % ext == 0 and n <= 8 * PAGE and off % PAGE == 0 for off, n in preads)
    assert mod.stats["max_in_flight"] == len(preads) > 1  # all issued before the first wait
    # positions: scatter into a larger out, nothing else touched
    big = torch.zeros((2 * ids.size, dim), dtype=torch.float32)
    pos = rng.permutation(2 * ids.size)[:ids.size]
    be.read_rows(h, torch.from_numpy(ids), big, positions=pos)
    assert torch.equal(big[torch.from_numpy(pos)], torch.from_numpy(feats[ids]))
    assert int((big.abs().sum(1) > 0).sum()) == ids.size
    be.close()
    assert mod.stats["closed"] == 1


def test_rounds_bounded_by_staging(monkeypatch, bins):
    feats, info = bins[1024]
    be, mod = _backend(monkeypatch, max_read_bytes=2 * PAGE, staging_bytes=4 * PAGE)
    h = be.open(info)
    ids = np.arange(0, 40)
    out = np.empty((ids.size, info.row_bytes), np.uint8)
    be.read_rows(h, ids, out)
    assert np.array_equal(out.view(np.float32), feats[ids])
    assert mod.stats["max_in_flight"] == 2  # 4 pages of staging: two 2-page reads per round


def test_configures_kvikio_pool_threshold_and_task_size(monkeypatch):
    be, mod = _backend(monkeypatch, threads=32, max_read_bytes=1 << 20)
    assert mod.state["num_threads"] == 32
    assert mod.state["gds_threshold"] == PAGE  # 4 KiB reads go through the pool, not synchronously
    assert mod.state["task_size"] == 4 << 20  # already >= one read: left alone
    be2 = KvikioBackend(device="cpu", threads=4, configure=False)
    assert be2.threads == 4 and mod.state["num_threads"] == 32


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("compat,cufile,expect", [("OFF", True, True), ("ON", True, False),
                                                 ("AUTO", True, True), ("AUTO", False, False)])
def test_gds_reported_from_every_kvikio_version(monkeypatch, version, compat, cufile, expect):
    mod = fake_kvikio(version=version, compat=compat, cufile_available=cufile)
    gds, note = gds_status(mod)
    if version == "24.12" and compat == "AUTO":
        assert gds is False and "not known" in note  # AUTO cannot be resolved from Python there
    elif version == "24.10" and compat == "AUTO":
        assert gds is False  # a bool API: AUTO did not exist; the fake reports compat on
    else:
        assert gds is expect, (version, compat, cufile)
        assert (note is None) == expect
    assert int(kvikio_option(mod, "num_threads")) == 1
    monkeypatch.setitem(sys.modules, "kvikio", mod)
    be = KvikioBackend(device="cpu", threads=3)
    assert int(kvikio_option(mod, "num_threads")) == 3 and be.gds is gds


def test_compat_mode_enum_is_not_taken_for_false():
    """The bug this replaces: ``compat_mode() is False`` is never true of an enum, so GDS read as off."""
    mod = fake_kvikio(version="24.12", compat="OFF")
    assert mod.defaults.compat_mode() is CompatMode.OFF
    assert gds_status(mod) == (True, None)


def test_device_is_resolved_to_an_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(StoreError, match="not visible"):
        resolve_device("cuda:2")


def test_no_cuda_and_no_kvikio_are_clear_errors(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(StoreError, match="needs CUDA"):
        get_backend("kvikio")
    monkeypatch.setitem(sys.modules, "kvikio", None)
    with pytest.raises(StoreError, match="pip install kvikio"):
        KvikioBackend(device="cpu")


def test_short_read_is_an_error(monkeypatch, bins, tmp_path):
    feats, info = bins[1024]
    be, _ = _backend(monkeypatch)
    h = be.open(info)
    with open(info.path, "r+b") as f:
        f.truncate(info.row_stride_bytes * 10)
    with pytest.raises(StoreError, match="short read"):
        be.read_rows(h, np.array([20]), np.empty((1, info.row_bytes), np.uint8))


def _caps(tmp_path, kv: float | None, px: float | None):
    from iostack.backends import TOOL_KVIKIO_TO_GPU, TOOL_POSIX_TO_GPU
    from planner.capacities import Capacities, DeviceCapacity, ReadMeasurement

    fio = ReadMeasurement(3e9, tool="fio-io_uring")
    others = tuple(ReadMeasurement(v, tool=t, page_cache="cold")
                   for v, t in ((kv, TOOL_KVIKIO_TO_GPU), (px, TOOL_POSIX_TO_GPU)) if v is not None)
    return Capacities(devices=(DeviceCapacity("0000:3b:00.0", fio, block_device="nvme0n1", path=str(tmp_path),
                                              others=others),))


def test_auto_backend_is_chosen_by_measurement(monkeypatch, tmp_path):
    from iostack.backends import choose_backend
    from planner import hostinfo
    from planner.hostinfo import BlockDevice

    monkeypatch.setattr(hostinfo, "block_device_of", lambda p, sys_root="/sys": BlockDevice("nvme0n1"))
    paths = [str(tmp_path / "bin3.dat")]
    assert choose_backend("auto", cuda=False).reason.startswith("no CUDA")
    assert choose_backend("posix", cuda=True).name == "posix"
    no_caps = choose_backend("auto", cuda=True, paths=paths)
    assert no_caps.name == "posix" and "moment profile" in no_caps.reason  # installed is not measured
    faster = choose_backend("auto", cuda=True, capacities=_caps(tmp_path, 6e9, 3e9), paths=paths)
    assert faster.name == "kvikio" and "kvikio 6.00 GB/s, posix 3.00 GB/s" in faster.reason
    slower = choose_backend("auto", cuda=True, capacities=_caps(tmp_path, 2e9, 3e9), paths=paths)
    assert slower.name == "posix" and "as fast or faster" in slower.reason
    half = choose_backend("auto", cuda=True, capacities=_caps(tmp_path, 6e9, None), paths=paths)
    assert half.name == "posix" and "not measured for both" in half.reason
    monkeypatch.setattr(hostinfo, "block_device_of", lambda p, sys_root="/sys": BlockDevice("sdb"))
    other = choose_backend("auto", cuda=True, capacities=_caps(tmp_path, 6e9, 3e9), paths=paths)
    assert other.name == "posix" and "no figures for its disk sdb" in other.reason


def test_device_read_figures_say_why_not_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from hwprofile.gpureads import add_device_read_figures

    caps = add_device_read_figures(_caps(tmp_path, None, None), [str(tmp_path)])
    assert any("into GPU memory" in n and "no CUDA device" in n for n in caps.notes)
    assert caps.devices[0].others == ()
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("cufile", [True, False])
def test_store_says_whether_kvikio_reads_through_gds(monkeypatch, bins, cufile):
    from iostack.store import FeatureStore

    feats, info = bins[1024]
    monkeypatch.setitem(sys.modules, "kvikio", fake_kvikio(cufile_available=cufile))
    p = simple_placement(feats.shape[0], [("ssd", feats.shape[0])])
    with FeatureStore(p, info.path.rsplit("/", 1)[0], backend=KvikioBackend(device="cpu")) as s:
        assert s.direct_io()[0][0] is cufile
        note = next(n for n in s.notes if n.startswith("SSD bin 0"))
        assert ("GPUDirect Storage where" in note) if cufile else ("compatibility mode" in note)


def test_auto_weighs_any_registered_backend_with_device_reads(monkeypatch, tmp_path):
    """A new backend whose reads land on the device competes in ``auto`` by its flag, not by its name."""
    from iostack.backends import READ_BACKENDS, choose_backend, tool_to_gpu
    from iostack.backends.base import ReadBackend
    from planner import hostinfo
    from planner.capacities import Capacities, DeviceCapacity, ReadMeasurement
    from planner.hostinfo import BlockDevice

    class Direct(ReadBackend):  # never built here: auto reads the class's flag only
        device_reads = True

    monkeypatch.setattr(hostinfo, "block_device_of", lambda p, sys_root="/sys": BlockDevice("nvme0n1"))
    figures = {"posix": 3e9, "kvikio": 4e9, "toy-direct": 5e9}
    caps = Capacities(devices=(DeviceCapacity(
        "0000:3b:00.0", ReadMeasurement(3e9, tool="fio-io_uring"), block_device="nvme0n1", path=str(tmp_path),
        others=tuple(ReadMeasurement(v, tool=tool_to_gpu(n), page_cache="cold") for n, v in figures.items())),))
    paths = [str(tmp_path / "bin3.dat")]
    assert choose_backend("auto", cuda=True, capacities=caps, paths=paths).name == "kvikio"
    with READ_BACKENDS.registered("toy-direct", Direct):
        chosen = choose_backend("auto", cuda=True, capacities=caps, paths=paths)
        assert chosen.name == "toy-direct" and "toy-direct 5.00 GB/s" in chosen.reason
    with READ_BACKENDS.registered("toy-host", type("Host", (Direct,), {"device_reads": False})):
        assert choose_backend("auto", cuda=True, capacities=caps, paths=paths).name == "kvikio"
