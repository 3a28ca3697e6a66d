"""Several SSD bins of one gather read in one engine call (iostack.backends._manybins): bit-identical results."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.backends import _aio, _uring
from iostack.backends._manybins import interleave
from iostack.backends.posix import PosixBackend
from iostack.bins import open_bin, write_bins
from iostack.placement import simple_placement
from iostack.store import FeatureStore

ENGINES = [e for e, m in (("aio", _aio), ("uring", _uring)) if m.available() is None]
if not ENGINES:
    pytest.skip("no asynchronous engine (native AIO, io_uring) here", allow_module_level=True)


@pytest.fixture
def disk_dir():
    """A directory on a real disk (O_DIRECT needs one; tmpfs has none)."""
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        yield Path(d)


def _ssd_store(n: int, dim: int, dtype, bins: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    feats = (rng.random((n, dim)) * 100).astype(dtype)
    cap = -(-n // bins)
    return feats, simple_placement(n, [("cpu", n // 10)] + [("ssd", cap)] * bins, order=rng.permutation(n))


class _Spy:
    """Wraps an engine: records the files of each call."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []

    def run(self, fd, *args, **kw):
        self.calls.append(np.unique(np.asarray(fd)).size)
        return self.engine.run(fd, *args, **kw)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dim,dtype", [(1024, np.float32), (7, np.int8), (1500, np.float16), (2048, np.float32)])
def test_gather_over_several_ssd_bins_is_exact(disk_dir, engine, dim, dtype):
    feats, p = _ssd_store(600, dim, dtype, bins=5)
    write_bins(feats, p, disk_dir)
    ids = torch.from_numpy(np.random.default_rng(1).integers(0, 600, 900))  # duplicates, every bin
    got = {}
    for concurrent in (True, False):
        opts = {"engine": engine, "concurrent_bins": concurrent, "staging_bytes": 64 << 10}
        with FeatureStore(p, disk_dir, features=feats, backend_options=opts) as s:
            ssd = next(t for t in s.tiers if getattr(t, "held", "") == "file")
            spy = ssd.backend._aio = _Spy(ssd.backend._aio)
            got[concurrent] = s.gather(ids)
            assert torch.equal(got[concurrent], torch.from_numpy(feats[ids.numpy()]))
            # concurrent: every engine call had several files in flight; else one file per call
            assert spy.calls and (min(spy.calls) > 1 if concurrent else max(spy.calls) == 1), spy.calls
            if concurrent and dim * np.dtype(dtype).itemsize == 3000:  # rows not a page multiple: staged
                assert len(spy.calls) > 1  # a 64 KiB staging buffer: several rounds
            assert s.tier_stats()["ssd"]["rows"] == int(np.isin(ids.numpy(), np.flatnonzero(p.bin_of > 0)).sum())
    assert torch.equal(got[True], got[False])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.sampled_from([(4, np.int16), (1024, np.float32), (700, np.int8)]),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10_000)), min_size=1, max_size=120),
       st.booleans(), st.integers(0, 99))
def test_read_rows_many_equals_read_rows(bins, shape, raw, scatter, seed):
    dim, dtype = shape
    rng = np.random.default_rng(seed)
    n = 40 * bins
    feats = rng.integers(-100, 100, (n, dim)).astype(dtype)
    p = simple_placement(n, [("ssd", 40)] * bins)
    with tempfile.TemporaryDirectory(dir="/var/tmp" if os.path.isdir("/var/tmp") else None) as d, \
            PosixBackend(engine=ENGINES[0], staging_bytes=16 << 10) as be:
        infos = write_bins(feats, p, d)
        handles = [be.open(open_bin(d, b)) for b in p.bins]
        if not all(h.direct for h in handles):
            pytest.skip("no O_DIRECT here")
        row_bytes = infos[0].row_bytes
        groups = [[r % 40 for b, r in raw if b % bins == i] for i in range(bins)]
        total = sum(len(g) for g in groups)
        out = np.zeros((total + 3, row_bytes), np.uint8)
        perm = rng.permutation(total + 3)[:total] if scatter else np.arange(total)
        items, at = [], 0
        for h, g in zip(handles, groups, strict=True):
            items.append((h, np.array(g, np.int64), out, perm[at:at + len(g)]))
            at += len(g)
        counts = be.read_rows_many(items)
        want = np.zeros_like(out)
        for b, (_, rows, _, pos) in enumerate(items):
            want[pos] = feats[b * 40 + rows].view(np.uint8).reshape(len(rows), row_bytes)
        assert np.array_equal(out, want)
        assert all(c >= 1 for c, g in zip(counts, groups, strict=True) if g)


def test_interleave_mixes_in_proportion():
    o = interleave([6, 3, 0, 3])
    assert sorted(o.tolist()) == list(range(12))
    item = np.repeat([0, 1, 3], [6, 3, 3])[o]
    # in the first half each item has about half of its reads (ties: the earlier item first)
    assert np.bincount(item[:6], minlength=4).tolist() == [3, 2, 0, 1]


@pytest.mark.parametrize("dim,dtype", [(1024, np.float32), (1500, np.float16)])
def test_device_gather_over_several_ssd_bins_is_exact(disk_dir, dim, dtype):
    """On a (fake) accelerator the SSD rows land in the pinned staging, slices of one buffer: read at once."""
    from tests.fake_cuda import FakeDeviceMemory

    feats, p = _ssd_store(500, dim, dtype, bins=4, seed=2)
    write_bins(feats, p, disk_dir)
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, 500, 700))
    mem = FakeDeviceMemory()
    with FeatureStore(p, disk_dir, features=feats, memory=mem, backend="posix",
                      backend_options={"engine": ENGINES[0], "staging_bytes": 64 << 10}) as s:
        ssd = next(t for t in s.tiers if getattr(t, "held", "") == "file")
        spy = ssd.backend._aio = _Spy(ssd.backend._aio)
        got = s.gather_landing(ids).wait()
        assert mem.kind_of(got) == "device"
        assert torch.equal(got, torch.from_numpy(feats[ids.numpy()]))
        assert spy.calls and min(spy.calls) > 1, spy.calls
