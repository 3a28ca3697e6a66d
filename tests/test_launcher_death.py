"""Ranks do not outlive their launcher, and an orphaned job writes no checkpoint (issue 28 item 9).

After ``kill -9`` of ``torchrun`` the ranks used to run on as orphans (their process group
intact among themselves) and kept replacing the checkpoint of a job nobody watched.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, graph_fixture
from training.checkpoint import CHECKPOINT_NAME, checkpoint_path, save_checkpoint
from training.errors import TrainError

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}

#: a launcher that starts one rank (which binds itself to it), prints the rank's pid and waits
MIDDLE = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(rank.pid, flush=True)
time.sleep(600)
"""
RANK = """
import sys, time
import training.launcher as L
if {watchdog_only}:
    L._parent_death_signal = lambda sig: False   # the watchdog thread alone
L.bind_to_launcher()
open({ready!r}, "w").close()
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_running(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("watchdog_only", [False, True], ids=["prctl", "watchdog"])
def test_a_bound_process_ends_with_its_launcher(watchdog_only, tmp_path):
    ready = tmp_path / "bound"
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE, RANK.format(watchdog_only=watchdog_only,
                                                                          ready=str(ready))],
                              env=ENV, stdout=subprocess.PIPE, text=True)
    assert middle.stdout is not None
    rank = int(middle.stdout.readline())
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline:  # the rank has bound itself
            time.sleep(0.05)
        assert ready.exists() and _running(rank)
        middle.send_signal(signal.SIGKILL)
        middle.wait()
        assert _gone_within([rank], 10), "the rank outlived its launcher"
    finally:
        if _running(rank):
            os.kill(rank, signal.SIGKILL)


def test_a_checkpoint_of_a_job_no_longer_whole_is_not_put_in_place(tmp_path):
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(path, {"step": 1})
    with pytest.raises(TrainError, match="not written, the job is no longer whole"):
        save_checkpoint(path, {"step": 2}, whole=lambda: False)
    assert torch.load(path, weights_only=False) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]


def test_a_killed_runs_half_checkpoint_is_swept_by_the_next(tmp_path, caplog):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / "ck" / f".{CHECKPOINT_NAME}.tmp-{int(dead.stdout)}"
    left.parent.mkdir()
    left.write_bytes(b"half")
    mine = tmp_path / "ck" / f".{CHECKPOINT_NAME}.tmp-{os.getpid()}"
    mine.write_bytes(b"running")
    assert checkpoint_path(str(tmp_path / "ck"), resume=False) == tmp_path / "ck" / CHECKPOINT_NAME
    assert not left.exists() and mine.exists()
    assert f"removed {left}" in caplog.text


@pytest.mark.heavy  # torchrun with two ranks, killed (~20 s)
def test_kill_9_of_torchrun_stops_its_ranks_and_their_checkpoints(tmp_path):
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    from training.importers import import_dataset

    cora = import_dataset(graph_fixture("cora"), tmp_path / "cora")
    ck = tmp_path / "ck" / CHECKPOINT_NAME
    launcher = subprocess.Popen(
        [torchrun, "--nproc-per-node", "2", "-m", "moment", "train", "--dataset", str(cora), "--fanouts", "5,5",
         "--batch-size", "35", "--epochs", "500", "--hidden", "8", "--eval-every", "0", "--checkpoint",
         str(ck.parent), "--checkpoint-every", "5"], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while not ck.exists() and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.2)
        assert ck.exists(), "the job wrote no checkpoint to start from"
        ranks += [int(p) for p in subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True,
                                                text=True).stdout.split()]
        assert len(ranks) == 2, ranks
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert _gone_within(ranks, 10), "ranks ran on as orphans after torchrun was killed"
        before = (ck.stat().st_mtime_ns, ck.read_bytes())
        time.sleep(2)
        assert (ck.stat().st_mtime_ns, ck.read_bytes()) == before  # nobody writes it any more
        torch.load(ck, weights_only=False)  # and what is there is a whole checkpoint
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for r in ranks:
            if _running(r):
                os.kill(r, signal.SIGKILL)


def test_a_second_run_into_the_same_checkpoint_directory_is_refused_naming_the_first(tmp_path, capsys):
    """Two trainers writing one checkpoint directory used to both exit 0, each replacing the other's checkpoint."""
    from moment.cli import main
    from training.importers import import_dataset

    cora = import_dataset(graph_fixture("cora"), tmp_path / "cora")
    ck = tmp_path / "ck"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from training.writer import output_lock\n"
                               f"with output_lock({str(ck)!r}):\n    print('held', flush=True); time.sleep(120)"],
                              env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        rc = main(["train", "--dataset", str(cora), "--fanouts", "5,5", "--batch-size", "70", "--epochs", "1",
                   "--hidden", "8", "--eval-every", "0", "--checkpoint", str(ck)])
        err = capsys.readouterr().err
        assert rc == 2 and f"another writer has it (process {holder.pid}, since" in err, err
        assert not (ck / CHECKPOINT_NAME).exists()
    finally:
        holder.kill()
        holder.wait()
    assert main(["train", "--dataset", str(cora), "--fanouts", "5,5", "--batch-size", "70", "--epochs", "1",
                 "--hidden", "8", "--eval-every", "0", "--checkpoint", str(ck)]) == 0  # its lock died with it
    assert (ck / CHECKPOINT_NAME).exists() and not (tmp_path / ".ck.lock").exists()
