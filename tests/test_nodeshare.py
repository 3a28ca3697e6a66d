"""Node-shared SSD reads (iostack.nodeshare): two "ranks" as threads of one process, a fake exchange.

The union/split/copy logic against private reads, bit for bit: duplicates, packed
rows and whole-page rows, a rank with no SSD rows, a bin only one rank touches,
the fake-accelerator gather path; and every fallback (steps out of line, no room
for the buffer, a failed read) taken by both ranks at once, never a wait.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from iostack.bins import write_bins
from iostack.nodeshare import NodeExchange, encode_keys, plan_share, with_node_shared_reads
from iostack.placement import simple_placement
from iostack.store import FeatureStore
from tests.fake_cuda import FakeDeviceMemory


class ThreadExchange:
    """The node's ranks as threads: :class:`NodeExchange` over shared slots and a thread barrier."""

    def __init__(self, shared: dict, rank: int) -> None:
        self.s, self.rank, self.size = shared, rank, shared["size"]

    @staticmethod
    def node(size: int) -> list[ThreadExchange]:
        shared = {"size": size, "barrier": threading.Barrier(size, timeout=20), "slots": [None] * size,
                  "calls": [0] * size}
        return [ThreadExchange(shared, r) for r in range(size)]

    def _all(self, value):
        self.s["slots"][self.rank] = value
        self.s["calls"][self.rank] += 1
        self.s["barrier"].wait()
        got = list(self.s["slots"])
        self.s["barrier"].wait()  # nobody overwrites a slot before every rank has read them all
        return got

    def exchange(self, keys: np.ndarray) -> list[np.ndarray]:
        return [np.array(k, np.int64) for k in self._all(np.array(keys, np.int64))]

    def barrier(self, ok: bool = True) -> bool:
        return all(self._all(bool(ok)))


@pytest.fixture
def disk_dir():
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        yield Path(d)


def _placed(d: Path, n: int, dim: int, seed: int = 0):
    """``n`` rows: a CPU bin, then two SSD bins (ids 1 and 2) in a shuffled order."""
    rng = np.random.default_rng(seed)
    feats = rng.random((n, dim)).astype(np.float32)
    p = simple_placement(n, [("cpu", n // 5), ("ssd", n // 2), ("ssd", n - n // 5 - n // 2)],
                         order=rng.permutation(n))
    write_bins(feats, p, d, fsync=False)
    return feats, p


def _stores(d: Path, feats, p, shm: Path, size: int = 2, memory=None, shared: bool = True) -> list[FeatureStore]:
    """One store per rank, composed with node-shared SSD reads (``shared``) or reading privately."""
    out = []
    for ex in ThreadExchange.node(size):
        s = FeatureStore(p, d, features=feats, backend="posix", backend_options={"processes": 0, "threads": 2},
                         memory=memory() if memory else None)
        out.append(with_node_shared_reads(s, ex, "t", directory=shm) if shared else s)
    return out


def _together(stores, ids_per_rank):
    """Every rank's gather on its own thread, as the prefetch threads would; results (or errors) per rank."""
    res: list = [None] * len(stores)

    def run(i):
        try:
            res[i] = stores[i].gather(torch.as_tensor(ids_per_rank[i])).clone()
        except BaseException as exc:
            res[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a rank hung"
    return res


@contextlib.contextmanager
def _two_ranks(d: Path, shm: Path, n: int, dim: int, memory=None):
    """Two ranks' stores over one placement of ``n`` rows of ``dim`` float32: (features, stores); closed after."""
    feats, p = _placed(d, n, dim)
    stores = _stores(d, feats, p, shm, memory=memory)
    try:
        yield feats, stores
    finally:
        for s in stores:
            s.close()


def _assert_exact(stores, feats, ids) -> None:
    """Both ranks' gathers of ``ids`` (one array per rank) are the rows themselves."""
    for i, g in enumerate(_together(stores, ids)):
        assert torch.equal(g, torch.from_numpy(feats[ids[i]]))


def _ssd_of(p, which):
    return np.flatnonzero(np.isin(np.asarray(p.bin_of), which))


@pytest.mark.parametrize("dim", [16, 1024, 1250])  # 64-byte rows packed 64 to a page; a page a row; 2 pages
def test_shared_gathers_equal_private_ones(disk_dir, tmp_path, dim):
    feats, p = _placed(disk_dir, 3000, dim)
    rng = np.random.default_rng(1)
    ssd1, ssd2, cpu = _ssd_of(p, [1]), _ssd_of(p, [2]), _ssd_of(p, [0])
    cases = [
        [rng.integers(0, 3000, 700), rng.integers(0, 3000, 900)],              # overlapping, with duplicates
        [np.concatenate([ssd1[:50], ssd1[:50], cpu[:5]]), cpu[:40]],          # rank 1: no SSD row at all
        [ssd1[::3][:200], np.concatenate([ssd2[:300], ssd1[::3][:10]])],      # bin 2: only rank 1 touches it
        [cpu[:3], cpu[3:9]],                                                   # nobody reads the SSDs
        [np.zeros(0, np.int64), ssd2[:64]],                                    # an empty gather on rank 0
    ]
    stores = _stores(disk_dir, feats, p, tmp_path)
    try:
        for ids in cases:
            got = _together(stores, ids)
            for i, g in enumerate(got):
                assert not isinstance(g, BaseException), g
                ref = torch.from_numpy(feats[np.asarray(ids[i], np.int64)])
                assert torch.equal(g, ref)  # bit for bit: the same bytes as read privately
        for s in stores:
            assert s.node_shared_reads.off is None and s.node_shared_reads.steps == len(cases)
        assert not list(tmp_path.iterdir())  # buffers' names gone once every rank mapped them
    finally:
        for s in stores:
            s.close()


def test_each_page_is_read_once_by_the_node(disk_dir, tmp_path):
    feats, p = _placed(disk_dir, 4000, 16)  # 64 rows to a page
    rng = np.random.default_rng(2)
    ids = [rng.integers(0, 4000, 1500), rng.integers(0, 4000, 1500)]
    shared, private = _stores(disk_dir, feats, p, tmp_path), _stores(disk_dir, feats, p, tmp_path, shared=False)
    try:
        _together(shared, ids)
        _together(private, ids)
        tiers = [s.tier_stats()["ssd"] for s in shared]
        alone = [s.tier_stats()["ssd"] for s in private]
        union = np.unique(np.concatenate(ids))
        distinct_pages = sum(np.unique(np.asarray(p.row_of)[union[np.asarray(p.bin_of)[union] == b]] // 64).size
                             for b in (1, 2))
        assert sum(t["pages"] for t in tiers) == distinct_pages  # each page once, for both ranks
        assert sum(t["pages"] for t in alone) > distinct_pages   # read privately: shared pages twice
        assert all(t["pages"] > 0 and t["requests"] > 0 for t in tiers)  # both ranks took a part
        assert [t["rows"] for t in tiers] == [t["rows"] for t in alone]  # rows served: the same either way
        assert all(s.node_shared_reads.wait_s >= 0 for s in shared)
    finally:
        for s in shared + private:
            s.close()


def test_the_fake_accelerator_path_copies_from_the_shared_buffer(disk_dir, tmp_path):
    rng = np.random.default_rng(3)
    ids = [rng.integers(0, 2000, 400), rng.integers(0, 2000, 300)]
    with _two_ranks(disk_dir, tmp_path, 2000, 1024, memory=FakeDeviceMemory) as (feats, stores):
        _assert_exact(stores, feats, ids)
        assert all(s.tier_stats()["ssd"]["pages"] > 0 for s in stores)


def test_steps_out_of_line_fall_back_on_both_ranks(disk_dir, tmp_path):
    ids = [np.arange(0, 1000, 3), np.arange(0, 1000, 7)]
    with _two_ranks(disk_dir, tmp_path, 1000, 64) as (feats, stores):
        stores[0].node_shared_reads.steps = 5  # rank 0 thinks it is further on
        for _ in range(2):  # the second call makes no collective call at all (the exchange would hang)
            _assert_exact(stores, feats, ids)
        assert all("disagree" in s.node_shared_reads.off for s in stores)


def test_no_room_for_the_buffer_on_one_rank_falls_back_on_both(disk_dir, tmp_path):
    ids = [np.arange(0, 1000, 2), np.arange(1, 1000, 2)]
    with _two_ranks(disk_dir, tmp_path, 1000, 64) as (feats, stores):
        stores[1].node_shared_reads.directory = tmp_path / "missing"  # shared_host_tensor: None, as /dev/shm full
        _assert_exact(stores, feats, ids)
        assert all("no room" in s.node_shared_reads.off for s in stores)


def test_a_failed_read_raises_there_and_the_other_rank_reads_alone(disk_dir, tmp_path):
    def broken(*a, **k):
        raise OSError("injected read error")

    ids = [np.arange(0, 1000, 2), np.arange(1, 1000, 2)]
    with _two_ranks(disk_dir, tmp_path, 1000, 64) as (feats, stores):
        stores[0].backend.read_rows = broken
        got = _together(stores, ids)
        assert isinstance(got[0], OSError)
        assert torch.equal(got[1], torch.from_numpy(feats[ids[1]]))
        assert all(s.node_shared_reads.off for s in stores)


def test_two_gathering_threads_per_rank_stay_exact(disk_dir, tmp_path):
    """Each rank gathers on two threads at once, as a pipelined prefetch does: every result exact."""
    rng = np.random.default_rng(7)
    steps = 8
    ids = [[rng.integers(0, 4000, 1500) for _ in range(steps)] for _ in range(2)]
    with _two_ranks(disk_dir, tmp_path, 4000, 64) as (feats, stores):
        bad: list = []

        def worker(rank, k):
            for s in range(k, steps, 2):
                g = stores[rank].gather(torch.as_tensor(ids[rank][s]))
                if not torch.equal(g, torch.from_numpy(feats[ids[rank][s]])):
                    bad.append((rank, s))

        threads = [threading.Thread(target=worker, args=(r, k)) for r in range(2) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
            assert not t.is_alive(), "a rank hung"
        assert bad == []
        assert all(s.node_shared_reads.off is None and s.node_shared_reads.steps == steps for s in stores)


def test_a_step_waits_for_the_copy_two_steps_back_before_it_exchanges(disk_dir, tmp_path):
    """Step n + 2 reuses step n's buffer: no rank joins its exchange before this rank released step n."""
    with _two_ranks(disk_dir, tmp_path, 2000, 64) as (feats, stores):
        ssd = _ssd_of(stores[0].placement, [1, 2])
        nr = [s.node_shared_reads for s in stores]

        def read(rank):
            h = stores[rank].tier_of(1).inner.handles
            return lambda b, rows, out: stores[rank].backend.read_rows(h[b], rows, out)

        def groups(rank, s):
            rows = np.asarray(stores[rank].placement.row_of)[ssd[s * 10:(s + 1) * 10 + 50]]
            return [(1, rows)]

        held: dict = {}
        done = threading.Event()

        def rank_main(r):
            held[r, 0] = nr[r].step(groups(r, 0), read(r))  # step 0, not released yet
            t1 = threading.Thread(target=lambda: held.__setitem__((r, 1), nr[r].step(groups(r, 1), read(r))))
            t1.start()
            t1.join(20)
            t2 = threading.Thread(target=lambda: held.__setitem__((r, 2), nr[r].step(groups(r, 2), read(r))))
            t2.start()
            done.wait(20)  # the test looks while step 2 waits
            held[r, 0].release()
            t2.join(20)

        mains = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
        for t in mains:
            t.start()
        time.sleep(0.5)
        assert (0, 2) not in held and (1, 2) not in held  # both wait for their own step 0 copies
        assert all(held[r, 1] is not None for r in range(2))
        done.set()
        for t in mains:
            t.join(30)
            assert not t.is_alive(), "a rank hung"
        assert all(held[r, 2] is not None for r in range(2)) and all(n.off is None for n in nr)


def test_a_thread_that_calls_again_is_done_with_its_older_steps(disk_dir, tmp_path):
    with _two_ranks(disk_dir, tmp_path, 1000, 64) as (feats, stores):
        nr = [s.node_shared_reads for s in stores]
        rows = [(1, np.arange(0, 100, 3))]

        def run(r):
            h = stores[r].tier_of(1).inner.handles
            for _ in range(5):  # never released: the same thread's third call must not wait for itself
                assert nr[r].step(rows, lambda b, x, out: stores[r].backend.read_rows(h[b], x, out)) is not None

        ts = [threading.Thread(target=run, args=(r,)) for r in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
            assert not t.is_alive(), "a thread waited for itself"
        assert all(n.steps == 5 and n.off is None for n in nr)


def test_plan_share_splits_by_page_into_contiguous_parts():
    rng = np.random.default_rng(4)
    ranks = [encode_keys([(1, rng.integers(0, 5000, 800)), (4, rng.integers(0, 90, 30))]) for _ in range(3)]
    rpp = {1: 8, 4: 1}
    plans = [plan_share(ranks, r, 3, rpp) for r in range(3)]
    union = plans[0].keys
    assert all(np.array_equal(q.keys, union) for q in plans)  # every rank computes the same union
    owner = np.full(union.size, -1)
    for r, q in enumerate(plans):
        for _b, lo, hi in q.mine:
            assert (owner[lo:hi] == -1).all()
            owner[lo:hi] = r
    assert (owner >= 0).all()  # every union entry read by exactly one rank
    for b in (1, 4):
        sel = plans[0].bins == b
        page = plans[0].rows[sel] // rpp[b]
        for pg in np.unique(page):
            assert np.unique(owner[sel][page == pg]).size == 1  # a page is never split between ranks
        counts = [sum(u for (bb, _, _), u in zip(q.mine, q.units_read, strict=True) if bb == b) for q in plans]
        assert max(counts) - min(counts) <= 1  # the pages split evenly
    assert plans[0].positions(1, plans[0].rows[:3]).tolist() == [0, 1, 2]
    assert isinstance(ThreadExchange.node(2)[0], NodeExchange)


def test_bad_keys_and_ranks_are_refused():
    with pytest.raises(ValueError, match="rows must lie"):
        encode_keys([(0, np.array([-1]))])
    from iostack.nodeshare import NodeSharedReads

    with pytest.raises(ValueError, match="at least 2 ranks"):
        NodeSharedReads(ThreadExchange.node(1)[0], "k", 64, {})
