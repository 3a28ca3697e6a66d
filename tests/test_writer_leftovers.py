"""A killed dataset writer's temporary directory is swept by the next writer of the same path (issue 28 item 11)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO, graph_fixture
from training.data import DatasetError, open_dataset
from training.writer import DatasetWriter, sweep_leftovers


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # exited and reaped: no process has it (pids are not reused this soon)


def test_only_dead_writers_leftovers_are_swept(tmp_path):
    dead = tmp_path / f".g.tmp-{_dead_pid()}-abc"
    live = tmp_path / f".g.tmp-{os.getppid()}-def"  # a running process's (our parent)
    legacy = tmp_path / ".g.tmp-x1y2z3"  # from before the pid was in the name: no telling
    other = tmp_path / f".h.tmp-{_dead_pid()}-abc"  # another dataset's
    for d in (dead, live, legacy, other):
        d.mkdir()
        (d / "indices.npy").write_bytes(b"x")
    assert sweep_leftovers(tmp_path / "g") == [dead]
    assert not dead.exists() and live.exists() and legacy.exists() and other.exists()


def test_kill_9_mid_write_then_the_next_import_sweeps_and_names_it(tmp_path):
    dst = tmp_path / "g"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writer = ("import sys, time; from training.writer import DatasetWriter; "
              f"w = DatasetWriter({str(dst)!r}, num_nodes=3).__enter__(); "
              "(w.tmp_dir / 'indices.npy').write_bytes(b'x' * 4096); print('writing', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", writer], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    leftovers = list(tmp_path.glob(".g.tmp-*"))
    assert [d.name.split("-")[1] for d in leftovers] == [str(proc.pid)] and not dst.exists()
    done = subprocess.run([sys.executable, "-m", "moment", "data", "import", str(graph_fixture("cora")), str(dst)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"removed {leftovers[0]}, the leftover of a writer of {dst} that was killed" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]  # nothing else left: no temp, no lock file
    assert open_dataset(dst).num_nodes == 2708


def test_a_writer_names_what_it_swept(tmp_path):
    dead = tmp_path / f".g.tmp-{_dead_pid()}-abc"
    dead.mkdir()
    with DatasetWriter(tmp_path / "g", num_nodes=3) as w:
        w.write_edges([(np.array([0, 1]), np.array([1, 2]))])
    assert w.swept == [dead] and not dead.exists() and open_dataset(tmp_path / "g").num_edges == 2


def test_a_second_writer_of_the_same_path_is_refused_naming_the_first(tmp_path):
    # issue 28 item 6: two synths into one directory both exited 0 and one result was thrown away
    with DatasetWriter(tmp_path / "g", num_nodes=3) as w:
        w.write_edges([(np.array([0]), np.array([1]))])
        with pytest.raises(DatasetError, match=f"another writer has it \\(process {os.getpid()}, since "), \
                DatasetWriter(tmp_path / "g", num_nodes=3):
            pass
    assert open_dataset(tmp_path / "g").num_edges == 1  # the first one's, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]  # no lock file, no temp left
    # and one made meanwhile (after the second writer's own check) is not replaced without overwrite
    late = DatasetWriter(tmp_path / "h", num_nodes=2)
    with DatasetWriter(tmp_path / "h", num_nodes=2) as w:
        w.write_edges([(np.array([0]), np.array([1]))])
    with pytest.raises(DatasetError, match="already exists"), late:
        pass
    assert open_dataset(tmp_path / "h").num_edges == 1


def test_two_synths_into_one_directory(tmp_path):
    dst = tmp_path / "g"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen([sys.executable, "-m", "moment", "data", "synth", str(dst), "--nodes", "200000",
                              "--edges", "4000000", "--feature-dim", "64", "--quiet"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / ".g.lock").exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
        second = subprocess.run([sys.executable, "-m", "moment", "data", "synth", str(dst), "--nodes", "1000",
                                 "--edges", "5000"], env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr
        assert f"another writer has it (process {first.pid}, since" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
    finally:
        first.kill()
        first.wait()
