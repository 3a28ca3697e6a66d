"""iostack: placement, bins, posix backend, store gathers, PyG adapter, `moment bench io`."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.backends import get_backend
from iostack.backends.posix import PosixBackend, probe_direct
from iostack.bins import open_bin, write_bins
from iostack.errors import StoreError
from iostack.placement import Bin, Placement, load_placement, simple_placement
from iostack.store import FeatureStore
from momentbase.errors import MomentError


@pytest.fixture
def disk_dir():
    """A directory on a real disk (O_DIRECT needs one; tmpfs has none)."""
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        yield Path(d)


def _mixed(n: int, dim: int, dtype=np.float32, seed: int = 0):
    rng = np.random.default_rng(seed)
    feats = rng.random((n, dim)).astype(dtype)
    order = rng.permutation(n)
    a, b = n // 5, n // 5 + n // 4
    rest = n - b
    p = simple_placement(n, [("gpu", a), ("cpu", b - a), ("ssd", rest // 2 + 3), ("ssd", rest - rest // 2)],
                         order=order)
    return feats, p


def test_placement_validation_and_roundtrip(tmp_path):
    bins = (Bin(0, "cpu", 2), Bin(1, "ssd", 2, path="b.dat"))
    with pytest.raises(StoreError, match="both on row 0 of bin 1"):
        Placement(bins, np.array([1, 1]), np.array([0, 0]))
    with pytest.raises(StoreError, match="outside bin 0"):
        Placement(bins, np.array([0, 1]), np.array([2, 0]))
    with pytest.raises(StoreError, match="needs a path"):
        Bin(0, "ssd", 1)
    p = Placement(bins, np.array([1, 0, 1]), np.array([1, 0, 0]))
    p.save(tmp_path)
    q = load_placement(tmp_path)
    assert q.bins == p.bins and q.bin_of.tolist() == [1, 0, 1] and q.row_of.tolist() == [1, 0, 0]


@pytest.mark.parametrize("dim,dtype", [(1024, np.float32), (3, np.float64), (1500, np.float16), (7, np.int8)])
@pytest.mark.parametrize("processes", [0, 1])
def test_gather_equals_reference(disk_dir, dim, dtype, processes):
    feats, p = _mixed(300, dim, dtype)
    write_bins(feats, p, disk_dir, block_bytes=8192)
    ids = np.random.default_rng(1).integers(0, 300, 500)  # duplicates, unsorted, every tier
    with FeatureStore(p, disk_dir, features=feats,
                      backend_options={"processes": processes, "threads": 3, "staging_bytes": 1 << 16}) as s:
        got = s.gather(torch.from_numpy(ids))
        assert torch.equal(got, torch.from_numpy(feats[ids]))
        assert s.gather(torch.empty(0, dtype=torch.int64)).shape == (0, dim)
        tiers = s.tier_stats()
        assert set(tiers) == {"gpu", "cpu", "ssd"} and sum(t["rows"] for t in tiers.values()) == 500
        assert all(st_.latency_p99_s >= st_.latency_p50_s for st_ in s.stats())


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 60), st.integers(1, 40), st.lists(st.integers(0, 10_000), max_size=80), st.integers(0, 99))
def test_gather_property(n, dim, raw_ids, seed):
    rng = np.random.default_rng(seed)
    feats = rng.integers(-100, 100, (n, dim)).astype(np.int16)
    cuts = np.sort(rng.integers(0, n + 1, 3))
    sizes = np.diff(np.concatenate([[0], cuts, [n]]))
    p = simple_placement(n, [(k, int(s) + int(rng.integers(0, 3)))
                             for k, s in zip(("gpu", "cpu", "ssd", "ssd"), sizes, strict=True)],
                         order=rng.permutation(n))
    ids = np.array([i % n for i in raw_ids], np.int64)
    with tempfile.TemporaryDirectory() as d:
        write_bins(feats, p, d)
        with FeatureStore(p, d, features=feats, backend_options={"processes": 0, "threads": 2}) as s:
            assert np.array_equal(s.gather(torch.from_numpy(ids)).numpy(), feats[ids])


def test_gather_results_reuse_freed_buffers_only(disk_dir):
    """A result (or any view of it) still held is never overwritten; a freed one's buffer is reused."""
    import gc

    from iostack.backends.base import AlignedPool

    feats, p = _mixed(300, 16)
    write_bins(feats, p, disk_dir)
    rng = np.random.default_rng(3)
    with FeatureStore(p, disk_dir, features=feats, backend_options={"processes": 0, "threads": 2}) as s:
        ids_a = rng.integers(0, 300, 120)
        kept = s.gather(torch.from_numpy(ids_a))[10:]  # only a view of the result survives
        gc.collect()
        for _ in range(3):
            ids = rng.integers(0, 300, 120)
            assert torch.equal(s.gather(torch.from_numpy(ids)), torch.from_numpy(feats[ids]))
        gc.collect()
        assert torch.equal(kept, torch.from_numpy(feats[ids_a[10:]]))
        assert s._results.idle == 1  # the freed results' one buffer, reused by each next gather
    pool = AlignedPool(keep=1)
    a, b = pool.empty(2, 4096), pool.empty(300, 4096)
    del a, b
    gc.collect()
    assert pool.idle == 1 and pool.empty(300, 4096).shape == (300, 4096)  # the larger one was kept


def test_concurrent_gathers(disk_dir):
    feats, p = _mixed(400, 64)
    write_bins(feats, p, disk_dir)
    errors = []
    with FeatureStore(p, disk_dir, features=feats, backend_options={"processes": 1, "threads": 4}) as s:
        def work(seed):
            rng = np.random.default_rng(seed)
            for _ in range(10):
                ids = rng.integers(0, 400, 200)
                if not np.array_equal(s.gather(torch.from_numpy(ids)).numpy(), feats[ids]):
                    errors.append(seed)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_corrupt_and_missing_bins(tmp_path):
    feats, p = _mixed(100, 16)
    infos = write_bins(feats, p, tmp_path)
    ssd = [b for b in p.bins if b.kind == "ssd"]
    path = Path(infos[ssd[0].id].path)
    with open(path, "r+b") as f:  # flip a byte in the first block
        f.seek(10)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    with pytest.raises(StoreError, match="does not match its manifest"):
        FeatureStore(p, tmp_path, features=feats)
    os.truncate(path, 100)
    with pytest.raises(StoreError, match="truncated"):
        open_bin(tmp_path, ssd[0])
    path.unlink()
    with pytest.raises(StoreError, match="missing") as ei:
        FeatureStore(p, tmp_path, features=feats)
    assert isinstance(ei.value, MomentError)
    with pytest.raises(StoreError, match="holds float32, the store expects float64"):
        open_bin(tmp_path, ssd[1], dtype=np.float64)


def test_backends_buffered_and_direct(disk_dir):
    feats = np.arange(50 * 1024, dtype=np.float32).reshape(50, 1024)
    p = simple_placement(50, [("ssd", 50)])
    info = write_bins(feats, p, disk_dir)[0]
    rows = np.array([49, 0, 3, 3, 4, 5, 17])
    for direct in (False, "auto"):
        for engine in ("threads", "auto"):
            with PosixBackend(processes=0, threads=2, direct=direct, engine=engine) as be:
                h = be.open(info)
                out = np.empty((rows.size, 4096), np.uint8)
                requests = be.read_rows(h, rows, out)
                assert np.array_equal(out.view(np.float32), feats[rows])
                assert requests == 4  # 0 | 3,4,5 coalesced | 17 | 49
                assert h.direct == (direct == "auto" and probe_direct(info.path)[0])


def test_kvikio_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(StoreError, match="needs CUDA"):
        get_backend("kvikio")
    with pytest.raises(StoreError, match="unknown read backend"):
        get_backend("spdk")
    be = get_backend("auto", processes=0)
    assert be.name == "posix"
    be.close()


def test_pyg_adapter():
    from torch_geometric.data import TensorAttr

    from iostack.pyg import PygFeatureStore

    feats, p = _mixed(30, 4)
    p2 = simple_placement(30, [("cpu", 30)])
    fs = PygFeatureStore({(None, "x"): FeatureStore(p2, features=feats)})
    idx = torch.tensor([4, 1, 4])
    assert torch.equal(fs.get_tensor(None, "x", idx), torch.from_numpy(feats[[4, 1, 4]]))
    assert fs.put_tensor(torch.ones(30, 2), group_name=None, attr_name="y", index=slice(None))
    a, b = fs.multi_get_tensor([TensorAttr(None, "x", idx), TensorAttr(None, "y", torch.tensor([0]))])
    assert torch.equal(a, torch.from_numpy(feats[[4, 1, 4]])) and torch.equal(b, torch.ones(1, 2))
    assert tuple(fs.get_tensor_size(None, "x", None)) == (30, 4)
    assert {(t.group_name, t.attr_name) for t in fs.get_all_tensor_attrs()} == {(None, "x"), (None, "y")}
    assert fs.remove_tensor(None, "y", slice(None))
    with pytest.raises(KeyError):
        fs.get_tensor(None, "y", idx)


def test_cli_bench_gather(tmp_path, capsys):
    from moment.cli import main

    rc = main(["bench", "io", "gather", "--dir", str(tmp_path), "--vertices", "3000", "--dim", "64",
               "--cpu-rows", "300", "--gpu-rows", "100", "--seconds", "0.3", "--batch", "256"])
    out = capsys.readouterr().out
    assert rc == 0 and "tier hit shares" in out and "ssd" in out
    assert main(["bench", "io", "gather", "--vertices", "10", "--cpu-rows", "20"]) == 2


@pytest.mark.heavy  # timed fio and store reads side by side (~10 s)
@pytest.mark.skipif(not __import__("shutil").which("fio"), reason="fio not installed")
def test_cli_bench_raw_tiny(disk_dir, capsys):
    import shutil

    from moment.cli import main

    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (.ci/run installs it from Debian)")
    rc = main(["bench", "io", "raw", "--dir", str(disk_dir), "--file-size", "8MiB", "--seconds", "0.5",
               "--runs", "1", "--queue-depth", "4"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "ours / fio" in out


def _rss_file_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssFile in /proc/self/status")


def test_caches_filled_from_a_memmap_do_not_keep_the_file_mapped(tmp_path):
    """A CPU cache of scattered rows copied out of a memory-mapped feature file leaves the file's
    pages out of this process's resident set (with read-ahead they were most of the file)."""
    n, dim = 32768, 512  # 64 MiB of 2 KiB rows
    path = tmp_path / "features.npy"
    w = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    w[:] = np.arange(n, dtype=np.float32)[:, None]
    w.flush()
    del w
    feats = np.load(path, mmap_mode="r")
    every = 16  # the cache holds one row in 16, spread over the whole file
    bin_of = np.where(np.arange(n) % every == 0, 0, 1).astype(np.int16)
    row_of = np.where(bin_of == 0, np.arange(n) // every, np.cumsum(bin_of == 1) - 1).astype(np.int64)
    p = Placement((Bin(0, "cpu", n // every), Bin(1, "ssd", n, path="rest.dat")), bin_of, row_of)
    write_bins(np.load(path, mmap_mode="r"), p, tmp_path)  # its own mapping, gone with it
    before = _rss_file_bytes()
    with FeatureStore(p, tmp_path, features=feats, backend_options={"processes": 0}) as s:
        grown = _rss_file_bytes() - before
        got = s.gather(torch.tensor([0, 16, n - 16, 5]))[:, 0].tolist()
    assert got == [0.0, 16.0, n - 16.0, 5.0]
    assert grown < 8 << 20, f"the store left {grown / 2**20:.0f} MiB of the feature file mapped"


def test_an_empty_ssd_bin_is_not_opened(disk_dir):
    # a hot-first placement fills one SSD bin and leaves the others empty: an empty bin (no O_DIRECT
    # to probe) used to get buffered-read worker processes, in the memory the caches could use
    feats = np.arange(40, dtype=np.float32).reshape(10, 4)
    p = simple_placement(10, [("cpu", 4), ("ssd", 6), ("ssd", 0)])
    write_bins(feats, p, disk_dir)
    with FeatureStore(p, disk_dir, features=feats, backend_options={"processes": 1}) as s:
        assert set(s.direct_io()) == {1}
        assert not s.backend._procs
        ids = torch.tensor([9, 0, 5, 9])
        assert torch.equal(s.gather(ids), torch.from_numpy(feats[ids.numpy()]))
