"""Filling the host cache from a memory-mapped feature file (iostack.caches): front to back, dense spans read ahead."""

from __future__ import annotations

import numpy as np
import pytest

import iostack.caches as caches


@pytest.mark.parametrize("mapped", [True, False])
def test_cache_rows_come_in_file_order_and_equal_the_rows(tmp_path, monkeypatch, mapped):
    # the fault at papers100M's size: cache rows copied in their bin's (hot-first) order faulted
    # the 28 GB file in one 4 KiB page at a time, all over it (minutes for a 2 GiB cache)
    feats = np.arange(5000 * 64, dtype=np.float32).reshape(5000, 64)  # 256 B rows: 16 a page
    if mapped:
        np.save(tmp_path / "f.npy", feats)
        feats = np.load(tmp_path / "f.npy", mmap_mode="r")
    advice = []
    monkeypatch.setattr(caches, "_madvise", lambda arr, lo, hi, a: advice.append((lo, hi, a)))
    monkeypatch.setattr(caches, "_FILL_ROWS", 100)
    rng = np.random.default_rng(0)
    # a sparse set (one row in 200: at most 25 of the ~310 pages of its span) and a dense one
    # (every other row: every page), in random (row) order
    for verts, dense in ((rng.permutation(5000)[:25], False), (rng.permutation(np.arange(0, 5000, 2)), True)):
        advice.clear()
        got = list(caches._in_file_order(verts, feats))
        ids = np.concatenate([v for v, _ in got])
        assert np.array_equal(ids, np.sort(verts))
        for v, rows in got:
            assert np.array_equal(rows, np.asarray(feats)[v])
        if not mapped:
            assert advice == []
            continue
        read_ahead = [a for a in advice if a[2] == caches._MADV_WILLNEED]
        assert bool(read_ahead) == dense
        # every span let go once copied
        assert sum(a[2] == caches._MADV_DONTNEED for a in advice) == len(got)
