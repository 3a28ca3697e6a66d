"""The pipelined prefetch (training.pipeline.Prefetcher with several workers) and what it relies on.

Several workers must hand over exactly the batches one worker would, in the same
order, drawn from the sampler in turn; errors reach the trainer in order; a batch's
tier figures are its own while another thread gathers; the policy picks two
workers only for host gathers of a store with node-shared reads.
"""

from __future__ import annotations

import random
import sys
import threading
import time

import numpy as np
import pytest
import torch

from iostack.bins import write_bins
from iostack.placement import simple_placement
from iostack.store import FeatureStore
from iostack.transfer import Transfer
from tests.fake_cuda import FakeDeviceMemory
from training.features import MemoryFeatures
from training.pipeline import Lookups, Prefetcher, prefetch_workers, preparer
from training.sampler import NeighborSampler


class Draws:
    """An iterator of ints that records which thread drew each, and fails at ``fail_at`` if given."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at, self.i = n, fail_at, 0
        self.drawn_by: list[str] = []
        self.inside = 0
        self.overlapped = False

    def __iter__(self):
        return self

    def __next__(self) -> int:
        self.inside += 1
        self.overlapped |= self.inside > 1
        try:
            time.sleep(random.random() * 0.002)
            if self.i == self.n:
                raise StopIteration
            if self.i == self.fail_at:
                raise RuntimeError(f"sampler broke at batch {self.i}")
            self.drawn_by.append(threading.current_thread().name)
            self.i += 1
            return self.i - 1
        finally:
            self.inside -= 1


def _slow_prepare(fail_at: int | None = None):
    def prepare(b, sample_s):
        time.sleep(random.random() * 0.01)  # batches finish out of order
        if b == fail_at:
            raise ValueError(f"gather of batch {b} failed")
        return (b, sample_s)
    return prepare


def _drain(pre: Prefetcher) -> list:
    out = []
    try:
        while True:
            item, _ = pre.get()
            if item is None:
                return out
            out.append(item[0])
    finally:
        pre.close()


@pytest.mark.parametrize("workers,depth", [(1, 2), (2, 1), (2, 2), (3, 2)])
def test_workers_hand_over_every_batch_in_order(workers, depth):
    random.seed(workers * 10 + depth)
    draws = Draws(40)
    pre = Prefetcher(draws, _slow_prepare(), depth, workers=workers)
    assert _drain(pre) == list(range(40))
    assert not draws.overlapped  # one draw at a time: the sampler's stream is one sequence
    if workers > 1:  # the draws went round the workers
        assert draws.drawn_by[:workers] == ["moment-prefetch"] + [f"moment-prefetch-{k}" for k in range(1, workers)]


def test_the_last_batches_are_prepared_while_another_worker_draws_the_end():
    """Instant draws and preparations, many short runs: the end drawn by one worker never leaves another
    worker's batch unprepared."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: the window between draw and check opens
    try:
        for n in range(1, 200):
            pre = Prefetcher(iter(range(n % 7 + 1)), lambda b, s: (b, s), 1, workers=3)
            assert _drain(pre) == list(range(n % 7 + 1))
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("workers,draw_fails,exc", [(1, False, ValueError), (2, False, ValueError),
                                                    (2, True, RuntimeError)])
def test_a_failure_is_raised_in_its_turn_after_the_batches_before_it(workers, draw_fails, exc):
    """A gather that fails at batch 5 (or the sampler itself): batches 0-4 first, then the error."""
    draws = Draws(20, fail_at=5 if draw_fails else None)
    pre = Prefetcher(draws, _slow_prepare(fail_at=None if draw_fails else 5), 2, workers=workers)
    got = []
    with pytest.raises(exc, match="batch 5"):
        while True:
            got.append(pre.get()[0][0])
    pre.close()
    assert got == [0, 1, 2, 3, 4]


def test_close_midway_stops_every_worker():
    pre = Prefetcher(Draws(1000), _slow_prepare(), 1, workers=2)
    pre.get()
    t0 = time.perf_counter()
    pre.close()
    assert time.perf_counter() - t0 < 5
    assert not any(t.name.startswith("moment-prefetch") for t in threading.enumerate())


def test_bad_worker_counts_are_refused():
    with pytest.raises(ValueError, match="workers: 0"):
        Prefetcher(Draws(2), _slow_prepare(), 2, workers=0)
    with pytest.raises(ValueError, match="host gathers only"):
        Prefetcher(Draws(2), _slow_prepare(), 2, Transfer(FakeDeviceMemory()), workers=2)


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    n, dim = 3000, 32
    feats = rng.random((n, dim)).astype(np.float32)
    p = simple_placement(n, [("gpu", 300), ("cpu", 700), ("ssd", 1000), ("ssd", 1000)], order=rng.permutation(n))
    write_bins(feats, p, tmp_path, fsync=False)
    s = FeatureStore(p, tmp_path, features=feats, backend="posix", backend_options={"processes": 0, "threads": 2})
    yield s, feats
    s.close()


def test_a_batch_tiers_counted_from_its_ids_match_the_store_counters(store):
    s, _ = store
    ids = torch.from_numpy(np.random.default_rng(1).integers(0, 3000, 5000))
    before = s.tier_stats()
    s.gather(ids)
    after = s.tier_stats()
    diff = {k: (int(after[k]["rows"] - before[k]["rows"]), int(after[k]["bytes"] - before[k]["bytes"]))
            for k in after}
    assert s.tier_rows(ids) == diff
    assert sum(r for r, _ in diff.values()) == 5000


def test_concurrent_preparation_gives_each_batch_its_own_figures(store):
    s, feats = store
    f = s  # the store is a feature source itself
    indptr = torch.arange(0, 3001 * 4, 4)
    indices = torch.from_numpy(np.random.default_rng(2).integers(0, 3000, 3000 * 4))
    lookups = Lookups(torch.zeros(3000, dtype=torch.int64), None)
    sampler = NeighborSampler(indptr, indices, (3, 2), seed=0)
    seeds = np.random.default_rng(3).permutation(3000)

    def batches():
        for i in range(0, 3000, 200):
            yield sampler.sample(torch.from_numpy(seeds[i:i + 200]))

    def run(workers):
        prep = preparer(f, lookups, False, concurrent=workers > 1)
        pre = Prefetcher(batches(), prep, 2, workers=workers)
        out = []
        try:
            while (item := pre.get()[0]) is not None:
                out.append(item)
        finally:
            pre.close()
        return out

    for item in run(2):
        ids = item.batch.n_id
        assert torch.equal(item.x, torch.from_numpy(feats[ids.numpy()]))
        assert {k: v for k, v in item.tiers.items() if v[0]} == \
            {k: v for k, v in s.tier_rows(ids).items() if v[0]}
        assert sum(r for r, _ in item.tiers.values()) == ids.numel()


def test_two_workers_only_for_host_gathers_with_node_shared_reads(store):
    s, feats = store
    assert prefetch_workers(s, node_shared=True) == 2
    assert prefetch_workers(s, node_shared=False) == 1
    assert prefetch_workers(MemoryFeatures(feats), node_shared=True) == 1


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("moment-prefetch")]


@pytest.mark.parametrize("workers,fail", [(1, False), (2, False), (1, True)])
def test_the_threads_stay_until_close_after_the_last_batch(workers, fail):
    """The prefetch threads outlive the epoch's batches (and a failure) until ``close()``: a thread that ended
    early freed its OpenMP team and let the training thread's team spin at every barrier for the epoch's
    last steps (docs/design-notes.md, "The epoch's slow tail")."""
    assert not _prefetch_threads()
    pre = Prefetcher(Draws(6), _slow_prepare(fail_at=3 if fail else None), 2, workers=workers)
    try:
        got = _drain_open(pre)
        assert got == ([0, 1, 2] if fail else list(range(6)))
        threads = _prefetch_threads()
        assert len(threads) == workers
        for t in threads:
            t.join(timeout=0.5)  # an ended thread joins at once
            assert t.is_alive()
    finally:
        pre.close()
    assert not _prefetch_threads()


def _drain_open(pre: Prefetcher) -> list:
    """The batches up to the end or the first error, leaving ``pre`` open."""
    out = []
    while True:
        try:
            item, _ = pre.get()
        except ValueError:
            return out
        if item is None:
            return out
        out.append(item[0])


def test_the_tail_bench_reads_each_epochs_last_prefetch_steps_but_not_the_first_epochs():
    """tools/bench_prefetch_tail.py's figures from a metrics file: per epoch after the first, the mean of its last
    ``prefetch`` (2) steps, the median of the others, the epoch's seeds/s."""
    from tests.conftest import REPO

    sys.path.insert(0, str(REPO / "tools"))
    try:
        from bench_prefetch_tail import PREFETCH, epoch_figures
    finally:
        sys.path.remove(str(REPO / "tools"))
    assert PREFETCH == 2
    times = {0: [9.0, 1.0, 1.0, 1.0, 5.0], 1: [0.2, 0.1, 0.3, 0.8, 1.2]}
    records = [{"kind": "start"}]
    for ep, ts in times.items():  # steps out of order: the figures go by step number
        records += [{"kind": "step", "epoch": ep, "step": s, "step_s": ts[s]} for s in (3, 0, 4, 1, 2)]
        records.append({"kind": "epoch", "epoch": ep, "seeds_per_s": 100.0 * (ep + 1)})
    assert epoch_figures(records) == [(pytest.approx(1.0), pytest.approx(0.2), 200.0)]
