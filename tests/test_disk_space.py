"""A disk that fills under a memory-mapped writer is a one-line error, not SIGBUS (issue 28 item 7).

``moment data import`` onto a small disk used to die of SIGBUS (exit 135) at the first store
into a mapped page the disk could not back, printing nothing and leaving its temporary
directory. Every mapped writer now reserves its file's blocks first
(:func:`momentbase.space.reserve`) and every ``write``/``pwrite`` writer names its file
(:func:`momentbase.space.write_all`). The disks are small tmpfs mounts (the ``disk`` fixture).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from momentbase.space import NoSpaceError, reserve, write_all
from tests.conftest import REPO, graph_fixture


def _moment(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "moment", *argv], env=env, capture_output=True, text=True,
                          timeout=600)


def _one_clear_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # SIGBUS was -7 here (135 from a shell)
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "internal error" not in lines[0], proc.stderr
    for n in needles:
        assert n in lines[0], proc.stderr
    return lines[0]


def test_import_onto_a_small_disk_fails_in_one_line_and_leaves_nothing(disk):
    d = disk("empty")  # 64 KiB: cora's CSR (77 KiB) and features (15 MiB) do not fit
    line = _one_clear_line(_moment("data", "import", str(graph_fixture("cora")), str(d / "c")),
                           "needs", "free", str(d))
    assert "bytes) on its disk, which has" in line
    assert list(d.iterdir()) == []  # no temporary directory, no lock file


def test_synth_onto_a_small_disk_names_the_file_that_did_not_fit(disk):
    d = disk("empty", size="1m")
    _one_clear_line(_moment("data", "synth", str(d / "s"), "--nodes", "20000", "--edges", "200000"),
                    "needs", "free", str(d / ".s.partial"))
    # what remains is the resumable work directory only, and the next run says so by resuming
    assert [p.name for p in d.iterdir()] == [".s.partial"]


def test_reserve_allocates_or_refuses_with_the_numbers(disk):
    d = disk("tight")  # 4 KiB free
    small, big = d / "small", d / "big"
    for p, n in ((small, 4096), (big, 1 << 20)):
        with open(p, "wb") as f:
            f.truncate(n)  # sparse: the store into its pages is what used to raise SIGBUS
    reserve(small)
    assert os.stat(small).st_blocks * 512 >= 4096
    with pytest.raises(NoSpaceError, match=rf"^{big}: needs 1 MiB \(1048576 bytes\) on its disk, which has 0 B"):
        reserve(big)


def test_write_all_names_the_file_on_a_full_disk(disk):
    d = disk("full")
    fd = os.open(d / "f", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(NoSpaceError, match=rf"^{d / 'f'}: needs 8 KiB \(8192 bytes\)"):
            write_all(fd, bytes(8192), d / "f", 0)
    finally:
        os.close(fd)


def test_reserve_refuses_more_than_the_free_space_without_allocating(tmp_path, monkeypatch):
    p = tmp_path / "f"
    st = os.statvfs(tmp_path)
    size = 2 * st.f_bavail * st.f_frsize + (1 << 20)
    with open(p, "wb") as f:
        f.truncate(size)  # twice the free space, sparse
    calls: list[tuple] = []
    monkeypatch.setattr(os, "posix_fallocate", lambda *a: calls.append(a))
    with pytest.raises(NoSpaceError, match=rf"needs .* \({size} bytes\)"):
        reserve(p)
    assert calls == []  # ext4 would allocate until the disk is full, then fail


def test_reserve_counts_free_space_where_fallocate_is_missing(tmp_path, monkeypatch):
    p = tmp_path / "f"
    with open(p, "wb") as f:
        f.truncate(1 << 20)
    monkeypatch.delattr(os, "posix_fallocate")
    reserve(p)  # room enough: nothing to say
    monkeypatch.setattr("momentbase.space.free_bytes", lambda fd: 4096)
    with pytest.raises(NoSpaceError, match=r"needs 1 MiB \(1048576 bytes\) on its disk, which has 4 KiB"):
        reserve(p)
