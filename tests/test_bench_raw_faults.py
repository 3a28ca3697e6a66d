"""``moment bench io raw``'s test file: room checked first, progress while written, Ctrl-C leaves nothing
(issue 28 item 8).

It used to start writing a 100 TiB file into whatever the disk had, silently when not on a
terminal, and a Ctrl-C left the part written as ``moment-bench-*.dat.tmp``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from iostack.bench.io import bench_file
from moment.cli import main
from tests.conftest import REPO


def test_a_file_larger_than_the_free_space_is_refused_before_writing(tmp_path, capsys):
    rc = main(["bench", "io", "raw", "--dir", str(tmp_path), "--file-size", "100TiB", "--runs", "1"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("moment bench: error: --file-size 100 TiB: ") and "free for the test file" in err, err
    assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_progress_is_told_while_the_file_is_written(tmp_path):
    heard: list[tuple[str, int, int | None]] = []
    path, _ = bench_file(tmp_path, 40 << 20, progress=lambda s, d, t: heard.append((s, d, t)))
    assert heard[-1] == ("writing the test file (MiB)", 40, 40)
    assert len(heard) >= 2 and heard[0][1] < 40  # more than one report: it moved while written
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + ".json"]


def test_ctrl_c_while_writing_removes_the_partial_file(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "MOMENT_PROGRESS_LOG": "0"}  # a line per block, piped
    proc = subprocess.Popen([sys.executable, "-m", "moment", "bench", "io", "raw", "--dir", str(tmp_path),
                             "--file-size", "2GiB", "--runs", "1"], env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert "writing the test file (MiB): " in first and "/ 2,048" in first, first
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, rest
    assert "moment: interrupted" in rest
    assert list(tmp_path.iterdir()) == []  # no .dat.tmp, no manifest: nothing looks like a test file
