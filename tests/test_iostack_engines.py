"""iostack's asynchronous read engines: native AIO and io_uring through ctypes, alone and in the store."""

from __future__ import annotations

import mmap
import os
import signal
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from iostack.backends import _aio, _uring
from iostack.backends.base import aligned_empty
from iostack.backends.posix import PosixBackend
from iostack.bins import PAGE, write_bins
from iostack.errors import StoreError
from iostack.placement import simple_placement
from iostack.store import FeatureStore

ENGINES = {"aio": _aio, "uring": _uring}


def _ring(name: str, depth: int):
    why = ENGINES[name].available()
    if why:
        pytest.skip(f"{name}: {why}")
    return _aio.AioContext(depth) if name == "aio" else _uring.Uring(depth)


@pytest.fixture
def disk_file():
    """A 2 MiB file of random bytes on a real disk (O_DIRECT needs one), and its contents."""
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        data = np.random.default_rng(7).integers(0, 256, 512 * PAGE, dtype=np.uint8)
        path = Path(d) / "f.dat"
        data.tofile(path)
        yield path, data


def _open_direct(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        pytest.skip(f"no O_DIRECT here: {exc}")
    probe = mmap.mmap(-1, PAGE)
    try:
        os.preadv(fd, [probe], 0)
    except OSError as exc:  # EINVAL: the file system refuses O_DIRECT reads
        os.close(fd)
        pytest.skip(f"O_DIRECT reads fail here: {exc}")
    finally:
        probe.close()
    return fd


def _plan(rng, pages: int, n: int, max_pages: int = 4):
    """``n`` random page-aligned reads of 1..max_pages pages, and their destinations in a staging buffer."""
    lens = rng.integers(1, max_pages + 1, n)
    starts = np.array([rng.integers(0, pages - k + 1) for k in lens], np.int64)
    dst = np.concatenate([[0], np.cumsum(lens)[:-1]]) * PAGE
    return starts * PAGE, lens * PAGE, dst, int(lens.sum()) * PAGE


@pytest.mark.parametrize("name", ["aio", "uring"])
@pytest.mark.parametrize("depth", [1, 7, 64])
def test_engine_reads_equal_reference(disk_file, name, depth):
    path, data = disk_file
    ring = _ring(name, depth)
    fd = _open_direct(path)
    try:
        rng = np.random.default_rng(depth)
        off, nb, dst, total = _plan(rng, data.size // PAGE, 300)
        buf = mmap.mmap(-1, total)
        view = np.frombuffer(buf, np.uint8)
        seen = []

        def progress(p):
            # every read before p is complete when we are told so, while the rest may be in flight
            for i in range(seen[-1] if seen else 0, p):
                assert np.array_equal(view[dst[i]:dst[i] + nb[i]], data[off[i]:off[i] + nb[i]])
            seen.append(p)

        ring.run(fd, off, nb, np.uint64(view.ctypes.data) + dst.astype(np.uint64), progress=progress, every=16)
        assert seen == sorted(seen) and seen[-1] == off.size
        for i in range(off.size):
            assert np.array_equal(view[dst[i]:dst[i] + nb[i]], data[off[i]:off[i] + nb[i]])
        # an empty request is fine and reports progress 0
        got = []
        ring.run(fd, off[:0], nb[:0], dst[:0].astype(np.uint64), progress=got.append)
        assert got == [0]
    finally:
        os.close(fd)
        ring.close()


@pytest.mark.parametrize("name", ["aio", "uring"])
def test_engine_survives_signals(disk_file, name):
    """EINTR: a 1 ms interval timer interrupts the waits; every read still lands intact."""
    path, data = disk_file
    ring = _ring(name, 16)
    fd = _open_direct(path)
    ticks = []
    old = signal.signal(signal.SIGALRM, lambda *_: ticks.append(1))
    try:
        rng = np.random.default_rng(3)
        off, nb, dst, total = _plan(rng, data.size // PAGE, 2000, max_pages=1)
        buf = mmap.mmap(-1, total)
        view = np.frombuffer(buf, np.uint8)
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
        try:
            ring.run(fd, off, nb, np.uint64(view.ctypes.data) + dst.astype(np.uint64))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
        got = view.reshape(-1, PAGE)
        want = data.reshape(-1, PAGE)[off // PAGE]
        assert np.array_equal(got, want)
        del view, got
        buf.close()
    finally:
        signal.signal(signal.SIGALRM, old)
        os.close(fd)
        ring.close()


@pytest.mark.parametrize("name", ["aio", "uring"])
def test_engine_read_past_end_is_an_error(disk_file, name):
    path, data = disk_file
    ring = _ring(name, 4)
    fd = _open_direct(path)
    buf = mmap.mmap(-1, 2 * PAGE)
    view = np.frombuffer(buf, np.uint8)
    try:
        # the second page is past the end: a short read, whose continuation reads 0 bytes
        with pytest.raises(OSError, match="end of the file"):
            ring.run(fd, np.array([data.size - PAGE]), np.array([2 * PAGE]), np.array([view.ctypes.data], np.uint64))
        with pytest.raises(OSError):  # a closed descriptor: EBADF from the kernel
            ring.run(10_000, np.array([0]), np.array([PAGE]), np.array([view.ctypes.data], np.uint64))
    finally:
        del view
        buf.close()
        os.close(fd)
        ring.close()


@pytest.mark.parametrize("depth", [4, 64])
def test_uring_continues_short_reads_mid_run(disk_file, depth):
    """Completions cut short mid-run (every 7th read reports 512 bytes, the rest of its bytes wiped):
    the continuations go out among the new reads of the same turns, and every byte lands."""
    path, data = disk_file
    ring = _ring("uring", depth)
    fd = os.open(path, os.O_RDONLY)  # buffered: a continuation starts at an unaligned offset
    rng = np.random.default_rng(11)
    off, nb, dst, total = _plan(rng, data.size // PAGE, 400)
    buf = mmap.mmap(-1, total)
    view = np.frombuffer(buf, np.uint8)
    reap, cut = ring._reap, set()

    def short_reap():
        got = reap()
        if got is None:
            return None
        idx, res = got[0], got[1].copy()
        for j in np.flatnonzero((idx % 7 == 0) & (res > 512)).tolist():
            i = int(idx[j])
            if i not in cut and res[j] == nb[i]:
                cut.add(i)
                res[j] = 512
                view[dst[i] + 512:dst[i] + nb[i]] = 0  # as if those bytes had not been read
        return idx, res

    ring._reap = short_reap
    try:
        ring.run(fd, off, nb, np.uint64(view.ctypes.data) + dst.astype(np.uint64))
        assert len(cut) == np.count_nonzero(np.arange(400) % 7 == 0)
        for o, n, d in zip(off.tolist(), nb.tolist(), dst.tolist(), strict=True):
            assert np.array_equal(view[d:d + n], data[o:o + n])
    finally:
        view = None  # the closure shares this name: release the mapping's export for close()
        buf.close()
        os.close(fd)
        ring.close()


def test_uring_continues_short_reads():
    """A pipe gives a short read (3 of 8 bytes); the engine reads the rest once it arrives."""
    ring = _ring("uring", 2)
    r, w = os.pipe()
    buf = np.zeros(8, np.uint8)
    try:
        os.write(w, b"abc")
        t = threading.Timer(0.05, lambda: os.write(w, b"defgh"))
        t.start()
        ring.run(r, np.array([0]), np.array([8]), np.array([buf.ctypes.data], np.uint64), offset_ignored=True)
        t.join()
        assert buf.tobytes() == b"abcdefgh"
    finally:
        os.close(r)
        os.close(w)
        ring.close()


@pytest.mark.parametrize("engine", ["aio", "uring"])
@pytest.mark.parametrize("dim", [3, 1024, 1500])  # packed rows, one page per row, rows over two pages
def test_backend_engines_equal_reference(engine, dim):
    if ENGINES[engine].available():
        pytest.skip(f"{engine} not available")
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    rng = np.random.default_rng(dim)
    n = 3000
    feats = rng.random((n, dim)).astype(np.float32)
    p = simple_placement(n, [("ssd", n)])
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        infos = write_bins(feats, p, d)
        # a small staging buffer: several rounds per call, copy-out while reads are in flight
        with PosixBackend(processes=0, engine=engine, queue_depth=8, staging_bytes=64 * PAGE) as be:
            be.copy_every = 8
            h = be.open(infos[0])
            if not h.direct:
                pytest.skip(h.note)
            assert be.engine_of(h) == engine
            for size in (0, 1, 777, 5000):
                ids = rng.integers(0, n, size)
                out = np.empty((size, dim * 4), np.uint8)
                be.read_rows(h, ids, out)
                assert np.array_equal(out.view(np.float32), feats[ids])


@pytest.mark.parametrize("engine", ["aio", "uring"])
def test_store_gathers_through_engine(engine):
    if ENGINES[engine].available():
        pytest.skip(f"{engine} not available")
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    rng = np.random.default_rng(1)
    n, dim = 4000, 1024
    feats = rng.random((n, dim)).astype(np.float32)
    p = simple_placement(n, [("cpu", 500), ("ssd", 2000), ("ssd", 1500)], order=rng.permutation(n))
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        write_bins(feats, p, d)
        with FeatureStore(p, d, features=feats, backend_options={"processes": 0, "engine": engine}) as s:
            if not all(direct for direct, _ in s.direct_io().values()):
                pytest.skip("no O_DIRECT here")
            assert {s.backend.engine_of(h) for h in s.tier_of(1).handles.values()} == {engine}
            ids = rng.integers(0, n, 3000)

            def work(seed):
                r = np.random.default_rng(seed).integers(0, n, 1000)
                assert torch.equal(s.gather(torch.from_numpy(r)), torch.from_numpy(feats[r]))

            threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
            for t in threads:
                t.start()
            assert torch.equal(s.gather(torch.from_numpy(ids)), torch.from_numpy(feats[ids]))
            for t in threads:
                t.join()


def test_unknown_engine_is_refused():
    with pytest.raises(StoreError, match="engine 'spdk'"):
        PosixBackend(processes=0, engine="spdk")


@pytest.mark.parametrize("engine", ["aio", "uring"])
def test_backend_reads_into_aligned_output(engine):
    """Page-sized rows and a page-aligned ``out``: reads land in ``out`` directly, duplicates and runs included."""
    if ENGINES[engine].available():
        pytest.skip(f"{engine} not available")
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    rng = np.random.default_rng(5)
    n, dim = 2000, 1024
    feats = rng.random((n, dim)).astype(np.float32)
    p = simple_placement(n, [("ssd", n)])
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        infos = write_bins(feats, p, d)
        with PosixBackend(processes=0, engine=engine, queue_depth=8, max_read_bytes=8 * PAGE) as be:
            h = be.open(infos[0])
            if not h.direct:
                pytest.skip(h.note)
            cases = [rng.integers(0, n, 3000),  # duplicates, unsorted
                     np.arange(100, 160),  # one run: coalesced into reads of 8 rows
                     np.concatenate([np.arange(50, 70), np.arange(50, 70)[::-1], [n - 1, 0]])]
            for ids in cases:
                out = aligned_empty(ids.size, dim * 4)
                assert out.ctypes.data % PAGE == 0
                requests = be.read_rows(h, ids, out)
                assert np.array_equal(out.view(np.float32), feats[ids])
                assert requests <= np.unique(ids).size
            assert be.read_rows(h, np.arange(100, 160), aligned_empty(60, dim * 4)) == 60 // 8 + 1


@pytest.mark.parametrize("dim", [3, 1024])  # staged (packed rows) and in place (page rows)
def test_read_rows_into_positions(dim):
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    rng = np.random.default_rng(dim + 1)
    n = 1500
    feats = rng.random((n, dim)).astype(np.float32)
    p = simple_placement(n, [("ssd", n)])
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        infos = write_bins(feats, p, d)
        with PosixBackend(processes=0, queue_depth=8) as be:
            h = be.open(infos[0])
            ids = np.concatenate([rng.integers(0, n, 400), np.arange(10, 30)])
            positions = rng.permutation(2 * ids.size)[:ids.size]  # scattered over a larger out
            out = aligned_empty(2 * ids.size, dim * 4)
            out[:] = 0
            be.read_rows(h, ids, out, positions)
            got = out.view(np.float32)
            assert np.array_equal(got[positions], feats[ids])
            rest = np.setdiff1d(np.arange(2 * ids.size), positions)
            assert not got[rest].any()  # nothing written elsewhere
            with pytest.raises(IndexError):
                be.read_rows(h, ids[:2], out, np.array([0, out.shape[0]]))


def test_auto_takes_the_engine_recorded_for_the_device(tmp_path, monkeypatch):
    """`moment bench io raw` records the fastest engine per device; engine='auto' follows it."""
    from iostack.backends import choice

    working = [name for name, mod in ENGINES.items() if mod.available() is None]
    if not working:
        pytest.skip("no asynchronous engine here")
    monkeypatch.setenv("MOMENT_CACHE_DIR", str(tmp_path / "cache"))
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    feats = np.random.default_rng(0).random((64, 1024)).astype(np.float32)
    p = simple_placement(64, [("ssd", 64)])
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        infos = write_bins(feats, p, d)
        with PosixBackend(processes=0) as be:  # no record: the default order
            h = be.open(infos[0])
            if not h.direct:
                pytest.skip(h.note)
            assert be.engine_of(h) == next(e for e in choice.DEFAULT_ORDER if e in working)
        for engine in working:
            where = choice.record_engine(d, engine, {e: 1.0 for e in working})
            assert where.parent == tmp_path / "cache" and choice.recorded_engine(infos[0].path) == engine
            with PosixBackend(processes=0) as be:
                h = be.open(infos[0])
                assert be.engine_of(h) == engine
                out = np.empty((3, 4096), np.uint8)
                be.read_rows(h, np.array([5, 63, 5]), out)
                assert np.array_equal(out.view(np.float32), feats[[5, 63, 5]])
    # a damaged record is ignored, not an error
    choice.record_file().write_text("{not json")
    assert choice.recorded_engine(tmp_path) is None
    with pytest.raises(ValueError, match="engine 'spdk'"):
        choice.record_engine(tmp_path, "spdk", {})


@pytest.mark.parametrize("size,high", [(0, 5), (1, 5), (50, 3), (5000, 100_000), (5000, 10**12)])
def test_sorted_extents_equal_unique_and_argsort(size, high):
    """One stable argsort gives what np.unique(return_inverse) and an argsort of the inverse gave."""
    from iostack.backends.base import sorted_extents

    key = np.random.default_rng(size).integers(0, high, size)
    ex = sorted_extents(key)
    uniq, inv = np.unique(key, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    assert np.array_equal(ex.uniq, uniq) and np.array_equal(ex.order, order)
    assert np.array_equal(ex.sinv, inv[order])
    assert np.array_equal(ex.first, np.searchsorted(inv[order], np.arange(uniq.size)))


def test_default_queue_depths():
    # an asynchronous engine keeps ASYNC_QUEUE_DEPTH reads in flight by default; buffered files get
    # THREAD_QUEUE_DEPTH reader threads; a depth given is used by both
    from iostack.backends.posix import ASYNC_QUEUE_DEPTH, THREAD_QUEUE_DEPTH

    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    feats = np.arange(64 * 1024, dtype=np.float32).reshape(64, 1024)
    p = simple_placement(64, [("ssd", 64)])
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        info = write_bins(feats, p, d)[0]
        with PosixBackend(processes=0) as be:
            assert be.queue_depth == THREAD_QUEUE_DEPTH and be.threads == THREAD_QUEUE_DEPTH
            h = be.open(info)
            if be.engine_of(h) != "threads":  # O_DIRECT here and an asynchronous engine works
                assert be.queue_depth == ASYNC_QUEUE_DEPTH and be._aio.depth == ASYNC_QUEUE_DEPTH
            out = aligned_empty(3, 4096)
            be.read_rows(h, np.array([5, 63, 5]), out)
            assert np.array_equal(out.view(np.float32), feats[[5, 63, 5]])
        with PosixBackend(processes=0, queue_depth=8) as be:
            h = be.open(info)
            assert be.queue_depth == 8 and be.threads == 8
        with PosixBackend(processes=0, threads=4) as be:  # threads alone: that many in flight either way
            h = be.open(info)
            assert be.queue_depth == 4 and be.async_depth == 4
