"""Whole-bin integrity (issue 28, item 1): every byte a gather takes from an SSD bin is checked against a
per-block CRC-32 the first time it is read; a corrupt block is a StoreError, never wrong rows."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.bins import open_bin, write_bins
from iostack.binverify import BlockChecker, check_bin
from iostack.checksums import BlockCrcs
from iostack.errors import StoreError
from iostack.placement import simple_placement
from iostack.ssdreads import SsdTier
from iostack.store import FeatureStore


@pytest.fixture
def disk_dir():
    """A directory on a real disk (O_DIRECT needs one; tmpfs has none)."""
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    with tempfile.TemporaryDirectory(dir=base, prefix="moment-test-") as d:
        yield Path(d)


def _corrupt(path: str, offset: int, n: int = 64) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))


def _ssd_only(n: int, dim: int):
    feats = np.random.default_rng(0).random((n, dim)).astype(np.float32)
    return feats, simple_placement(n, [("ssd", n)])


def test_corrupt_bin_past_first_block_is_refused_not_read(disk_dir):
    """The issue's case as it was filed: a 40 MiB bin, bytes at offset 30,000,000 overwritten. Before the
    per-block sums the store opened it (first 16 MiB checked) and returned the corrupt rows."""
    feats, p = _ssd_only(10_000, 1024)  # 4 KiB rows: 40,960,000 bytes
    write_bins(feats, p, disk_dir)
    info = open_bin(disk_dir, p.bins[0])
    assert info.file_bytes > 32 << 20
    _corrupt(info.path, 30_000_000)
    hit = 30_000_000 // 4096  # the row those bytes belong to
    with FeatureStore(p, disk_dir, backend_options={"processes": 0, "threads": 2}) as s:
        good = np.arange(0, 1000)  # rows in blocks that are intact still read
        assert np.array_equal(s.gather(torch.from_numpy(good)).numpy(), feats[good])
        with pytest.raises(StoreError) as err:
            s.gather(torch.tensor([5, hit, 7]))
    msg = str(err.value)
    assert info.path in msg and "block 28 of 40" in msg and "moment place" in msg
    assert "bytes 29,360,128 to 30,408,704" in msg


@pytest.mark.parametrize("dim,dtype", [(3, np.float64), (1500, np.float16), (1500, np.float32), (7, np.int8)])
def test_every_block_is_checked_on_first_read(disk_dir, dim, dtype):
    """Small sum blocks (4 KiB) so each layout (packed rows, page rows, rows over two blocks) spans many;
    corrupting any one block makes exactly the gathers that touch it fail, and verified blocks stay verified."""
    n = 2000
    feats = (np.random.default_rng(1).random((n, dim)) * 100).astype(dtype)
    p = simple_placement(n, [("ssd", n)])
    write_bins(feats, p, disk_dir, sum_block_bytes=4096)
    info = open_bin(disk_dir, p.bins[0])
    sums = info.block_sums
    assert sums is not None and sums.blocks == -(-info.file_bytes // 4096) and sums.blocks > 2
    victim = sums.blocks // 2
    checker = BlockChecker(info)
    rows = np.arange(n)
    in_victim = np.array([victim in checker.blocks_of(np.array([r])) for r in rows])
    assert in_victim.any() and not in_victim.all()
    with FeatureStore(p, disk_dir, backend_options={"processes": 0, "threads": 2}) as s:
        # corrupted once open (a file under 16 MiB is all first block, which opening checks)
        _corrupt(info.path, victim * 4096 + 10, 3)
        clean = rows[~in_victim]
        assert np.array_equal(s.gather(torch.from_numpy(clean)).numpy(), feats[clean])
        tier = next(t for t in s.tiers if isinstance(t, SsdTier))
        # the blocks the clean rows lie in are verified, once; the corrupt one is not among them
        touched = checker.blocks_of(clean)
        assert victim not in touched and tier.checkers[0].left == sums.blocks - touched.size
        with pytest.raises(StoreError, match=f"block {victim} of {sums.blocks}"):
            s.gather(torch.from_numpy(rows[in_victim][:1]))
    assert check_bin(info).bad_blocks == (victim,)


def test_a_bin_without_block_sums_still_reads_with_one_warning(disk_dir, caplog):
    """A placement from before the block sums: reads work, one warning per directory, and a full check
    falls back to the whole-file CRC-32."""
    feats, p = _ssd_only(300, 16)
    write_bins(feats, p, disk_dir)
    man = disk_dir / "bin0.dat.json"
    data = json.loads(man.read_text())
    del data["block_sums"]
    man.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="iostack.binverify"):
        for _ in range(2):
            with FeatureStore(p, disk_dir, backend_options={"processes": 0, "threads": 1}) as s:
                assert np.array_equal(s.gather(torch.arange(300)).numpy(), feats)
    warned = [r for r in caplog.records if "checksum per block" in r.getMessage()]
    assert len(warned) == 1 and "moment place" in warned[0].getMessage()
    info = open_bin(disk_dir, p.bins[0])
    assert info.block_sums is None and check_bin(info).whole_file_ok is True
    _corrupt(info.path, 2000, 4)
    assert check_bin(info).ok is False


def test_malformed_block_sums_are_refused(disk_dir):
    feats, p = _ssd_only(50, 4)
    write_bins(feats, p, disk_dir)
    man = disk_dir / "bin0.dat.json"
    data = json.loads(man.read_text())
    data["block_sums"]["crc32"] = data["block_sums"]["crc32"][:-3]
    man.write_text(json.dumps(data))
    with pytest.raises(StoreError, match="block_sums"):
        open_bin(disk_dir, p.bins[0])


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(1, 90), max_size=8), st.integers(1, 64))
def test_block_crcs_match_block_sums_of_the_whole(data, cuts, block):
    """Feeding the bytes in any pieces gives the CRCs of fixed blocks of the whole."""
    acc = BlockCrcs(block)
    at = 0
    for c in cuts:
        acc.feed(data[at:at + c])
        at += c
    acc.feed(data[at:])
    import zlib

    want = tuple(zlib.crc32(data[i:i + block]) for i in range(0, len(data), block))
    assert acc.sums().crcs == want and acc.sums().size_bytes == len(data)


def test_moment_train_on_a_bin_corrupt_past_its_first_16_mib_fails_in_one_line(tmp_path, capsys):
    """The issue as a user met it: a placed bin overwritten at offsets past its first 16 MiB, then
    `moment train`: it exited 0 with the accuracy down (92.1% -> 83.0%); now an error naming the bin."""
    from moment.cli import main
    from tests.test_place_inplace import _one_ssd_spec

    (tmp_path / "one-ssd.yaml").write_text(_one_ssd_spec())
    assert main(["data", "synth", str(tmp_path / "g"), "--nodes", "5000", "--edges", "40000", "--feature-dim",
                 "1024", "--train-share", "0.1", "--quiet"]) == 0
    out = tmp_path / "pl"
    assert main(["place", "--dataset", str(tmp_path / "g"), "--machine", str(tmp_path / "one-ssd.yaml"),
                 "--gpu-cache", "0", "--cpu-cache", "256KiB", "--ssd", str(tmp_path / "ssd"), "--hotness", "degree",
                 "--out", str(out), "--json"]) == 0
    (bin_file,) = (tmp_path / "ssd").glob("*.dat")
    assert bin_file.stat().st_size > 18 << 20
    for at in range(17_000_000, bin_file.stat().st_size, 700_000):  # every 1 MiB block past the first 16 MiB
        _corrupt(str(bin_file), at, 16)
    capsys.readouterr()
    assert main(["train", "--dataset", str(tmp_path / "g"), "--placement", str(out), "--epochs", "1",
                 "--fanouts", "5,5", "--batch-size", "64", "--json"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the run's header lines: the error, one line
    assert str(bin_file) in last and "is corrupt: block " in last and "moment place" in last
    assert "Traceback" not in err and err.count("is corrupt") == 1


def test_node_shared_reads_check_the_blocks_they_read(disk_dir, tmp_path):
    """The node's ranks read each page once for all (iostack/nodeshare.py): that read is checked too, and
    a rank whose rows lie in a corrupt block gets the StoreError, not the rows."""
    from tests.test_nodeshare import _stores, _together

    n = 2000
    rng = np.random.default_rng(3)
    feats = rng.random((n, 1024)).astype(np.float32)
    p = simple_placement(n, [("cpu", 200), ("ssd", 900), ("ssd", 900)], order=rng.permutation(n))
    write_bins(feats, p, disk_dir, sum_block_bytes=4096, fsync=False)
    stores = _stores(disk_dir, feats, p, tmp_path)
    try:
        on_ssd1 = np.flatnonzero(p.bin_of == 1)
        victim = on_ssd1[int(np.argmax(p.row_of[on_ssd1] == 450))]
        ids = [np.array([victim, *on_ssd1[:20]]), np.array([*on_ssd1[20:40], victim])]
        good = [on_ssd1[100:300], on_ssd1[300:500]]
        _corrupt(str(open_bin(disk_dir, p.bins[1]).path), 450 * 4096 + 7, 5)
        for i, g in enumerate(_together(stores, good)):
            assert torch.equal(g, torch.from_numpy(feats[good[i]]))
        got = _together(stores, ids)
        assert all(isinstance(g, StoreError) and "block 450 of 900" in str(g) for g in got), got
    finally:
        for s in stores:
            s.close()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9000), st.integers(1, 300), st.sampled_from([512, 4096, 8192, 12288, 65536]),
       st.lists(st.integers(0, 10**6), min_size=1, max_size=40))
def test_blocks_of_rows_are_the_blocks_their_bytes_overlap(row_bytes, rows, block, picks):
    """Whatever the layout (packed rows, page rows, rows over pages; blocks dividing the rows or not), the
    blocks a row is checked in are exactly those its bytes overlap."""
    from iostack.bins import BinFile, file_bytes_for, layout
    from iostack.checksums import BlockSums

    stride, rpp = layout(row_bytes)
    size = file_bytes_for(rows, row_bytes)
    nblocks = -(-size // block)
    info = BinFile("x", 0, "|u1", row_bytes, row_bytes, stride, rpp, rows, size, 0, 0,
                   BlockSums(size, block, (0,) * nblocks))
    picked = np.array([p % rows for p in picks], np.int64)
    start = info.offsets(picked)
    want = sorted({b for a in start.tolist() for b in range(a // block, (a + row_bytes - 1) // block + 1)})
    assert BlockChecker(info).blocks_of(picked).tolist() == want
