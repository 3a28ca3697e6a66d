"""iostack.pagefile: items at byte offsets of any file, through the read engines, against numpy's own read."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.backends.posix import PosixBackend, probe_direct
from iostack.bins import PAGE
from iostack.errors import StoreError
from iostack.pagefile import PagedFile


def _direct_or_skip(path) -> None:
    ok, why = probe_direct(str(path))
    if not ok:
        pytest.skip(f"the temporary directory's file system refuses O_DIRECT: {why}")


@pytest.fixture(scope="module")
def array_file(tmp_path_factory):
    """An int64 .npy of 10,000 items (80,128 bytes: 19 whole pages and a partial one)."""
    path = tmp_path_factory.mktemp("pagefile") / "a.npy"
    np.save(path, np.arange(10_000, dtype=np.int64) * 7 - 3)
    return path


def _offsets(path, positions):
    data = np.load(path, mmap_mode="r")
    return data.offset + np.asarray(positions, np.int64) * 8, np.asarray(data[np.asarray(positions)])


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
def test_gather_gives_what_numpy_reads(array_file, direct):
    if direct:
        _direct_or_skip(array_file)
    rng = np.random.default_rng(0)
    positions = np.concatenate([rng.integers(0, 10_000, 3000), [9_999, 0, 9_999]])  # repeats, first, tail
    offsets, want = _offsets(array_file, positions)
    with PosixBackend(processes=0, threads=2, direct=direct) as be, PagedFile(array_file, be,
                                                                              max_buffer_bytes=3 * PAGE) as f:
        assert f.direct is direct
        got, reads = f.gather(offsets, np.int64)
    np.testing.assert_array_equal(got, want)
    pages = np.unique(offsets // PAGE)
    assert reads.pages == pages.size and reads.bytes_read == pages.size * PAGE
    whole = pages[pages < f.full_pages]  # the tail page was read at open, not by a request
    runs = 1 + int((np.diff(whole) != 1).sum()) if whole.size else 0
    assert runs <= reads.requests <= whole.size  # coalesced: at most one request per page


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3000), picks=st.lists(st.integers(0, 10**9), min_size=0, max_size=200),
       buffer_pages=st.integers(1, 4), itemsize=st.sampled_from([4, 8]), gap=st.integers(0, 3))
def test_gather_property_any_file_size(tmp_path_factory, n, picks, buffer_pages, itemsize, gap):
    dtype = np.dtype(f"int{8 * itemsize}")
    path = tmp_path_factory.mktemp("prop") / "x.bin"
    values = np.random.default_rng(n).integers(-(2**31), 2**31 - 1, n).astype(dtype)
    values.tofile(path)
    positions = np.array([p % n for p in picks], np.int64)
    with PosixBackend(processes=0, threads=2) as be, PagedFile(path, be, max_buffer_bytes=buffer_pages * PAGE,
                                                               max_gap_pages=gap) as f:
        got, reads = f.gather(positions * itemsize, dtype)
    np.testing.assert_array_equal(got, values[positions])
    pages = np.unique(positions * itemsize // PAGE)
    spans = pages[-1] - pages[0] + 1 if pages.size else 0
    assert pages.size <= reads.pages <= spans  # the needed pages, plus at most the gaps between them
    if gap == 0:
        assert reads.pages == pages.size


def test_short_gaps_are_read_over_in_one_request(array_file):
    offsets = np.array([0, 2, 4, 10]) * PAGE  # pages 0, 2, 4 and 10 (gaps of 1, 1 and 5 pages)
    raw = np.frombuffer(array_file.read_bytes(), np.uint8)
    want = np.array([raw[o:o + 8].view(np.int64)[0] for o in offsets])
    with PosixBackend(processes=0, threads=1) as be:
        for gap, pages, requests in ((0, 4, 4), (1, 6, 2), (5, 11, 1)):
            with PagedFile(array_file, be, max_gap_pages=gap) as f:
                got, reads = f.gather(offsets, np.int64)
            np.testing.assert_array_equal(got, want)
            assert (reads.pages, reads.requests) == (pages, requests)


def test_bad_requests_are_store_errors(array_file):
    with PosixBackend(processes=0, threads=1) as be, PagedFile(array_file, be) as f:
        with pytest.raises(StoreError, match="outside the file"):
            f.gather(np.array([f.file_bytes]), np.int32)
        with pytest.raises(StoreError, match="aligned"):
            f.gather(np.array([2]), np.int32)
        with pytest.raises(StoreError, match="outside the file"):
            f.read_pages(np.array([f.full_pages + 1]))
    with pytest.raises(StoreError, match="cannot open"), PosixBackend(processes=0, threads=1) as be:
        PagedFile(array_file.parent / "missing.npy", be)
