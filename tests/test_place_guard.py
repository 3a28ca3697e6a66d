"""`moment place`: one writer per placement (the second names the first) and a killed one's leftovers swept by
the next run (issue 28, items 6 and 11 for place)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from moment.cli import main
from training.place.guard import _ssd_prefix, placement_leftovers, writing_placement
from training.writer import output_lock

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("guard") / "g"
    assert main(["data", "synth", str(d), "--nodes", "3000", "--edges", "20000", "--feature-dim", "16",
                 "--train-share", "0.1", "--quiet"]) == 0
    return d


def _args(ds: Path, out: Path, ssd: Path) -> list[str]:
    return ["place", "--dataset", str(ds), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache", "16KiB",
            "--fanouts", "5", "--batch-size", "64", "--hotness", "degree", *(["--ssd", str(ssd)] * 8),
            "--out", str(out), "--json"]


def _hold(lock_of: Path) -> subprocess.Popen:
    """A process holding the writers' lock of ``lock_of`` until killed (it says when it has it)."""
    code = ("import sys, time; from training.writer import output_lock\n"
            f"with output_lock({str(lock_of)!r}):\n    print('held', flush=True); time.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_second_place_into_a_held_placement_names_the_holder(dataset, tmp_path, capsys):
    out, ssd = tmp_path / "p", tmp_path / "ssd"
    ssd.mkdir()
    holder = _hold(out)
    try:
        assert main(_args(dataset, out, ssd)) == 2
        err = capsys.readouterr().err
        assert f"another writer has it (process {holder.pid}, since " in err
        assert f"on host {socket.gethostname()}" in err and len(err.strip().splitlines()) == 1
        assert not (out / "placement.json").exists() and not list(ssd.glob("bin*"))
    finally:
        holder.kill()
        holder.wait()
    assert main(_args(dataset, out, ssd)) == 0  # the holder gone (its lock with it): placed
    assert (out / "placement.json").exists() and len(list(ssd.glob("p-*-bin*.dat"))) == 8


def test_a_killed_place_is_swept_by_the_next_run_naming_what_it_removed(dataset, tmp_path, capsys):
    out, ssd = tmp_path / "p", tmp_path / "ssd"
    # the place is killed (SIGKILL, no clean-up possible) as it renames its third bin into place
    code = ("import os, signal, sys\nreal, n = os.replace, [0]\n"
            "def replace(a, b):\n    n[0] += str(a).endswith('.dat.tmp')\n"
            "    if n[0] == 3: os.kill(os.getpid(), signal.SIGKILL)\n    real(a, b)\n"
            "os.replace = replace\nfrom moment.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    run = subprocess.run([sys.executable, "-c", code, *_args(dataset, out, ssd)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert run.returncode == -9, run.stderr
    tmp = sorted(ssd.glob("p-*-bin*.dat.tmp*"))
    whole = sorted(ssd.glob("p-*-bin*.dat"))
    assert len(tmp) == 2 and len(whole) == 2 and not (out / "placement.json").exists()
    left = placement_leftovers(out, [ssd])
    assert left == sorted([*tmp, *whole, *(w.with_name(w.name + ".json") for w in whole)])

    capsys.readouterr()
    assert main(_args(dataset, out, ssd)) == 0  # the same command again, no --force needed
    err = capsys.readouterr().err
    for p in left:
        assert f"removed {p}, left by a placement writer" in err
    assert not list(ssd.glob("*.tmp*")) and not list(out.glob(".*.tmp"))
    assert main(["place", "--verify", str(out)]) == 0  # whole, every block checks


def test_sweeping_leaves_other_placements_and_other_files_alone(tmp_path):
    out, other, ssd = tmp_path / "p", tmp_path / "q", tmp_path / "ssd"
    for d in (out, other, ssd):
        d.mkdir()
    theirs = ssd / f"q-{_ssd_prefix(other).split('-')[1]}-bin0-1.dat"
    theirs.write_bytes(b"x")  # another placement's whole bin, and a temporary one of its live writer
    theirs.with_name(theirs.name + ".json").write_text(json.dumps({"placement_dir": str(other.resolve())}))
    theirs.with_name(theirs.name + ".tmp").write_bytes(b"x")
    (ssd / ".notes.json.tmp").write_text("someone else's")  # an SSD directory is not ours alone
    (out / ".placement.json.tmp").write_text("{")
    ours = ssd / f"{_ssd_prefix(out)}bin3-4.dat.tmp"
    ours.write_bytes(b"y")
    seen: list[str] = []
    with writing_placement(out, [ssd], warn=seen.append) as swept:
        assert swept == [out / ".placement.json.tmp", ours]
        with pytest.raises(Exception, match="another writer has it"), output_lock(out):
            pass
    assert len(seen) == 2 and (ssd / ".notes.json.tmp").exists()
    assert theirs.exists() and theirs.with_name(theirs.name + ".tmp").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "q", "ssd"]  # no lock file left


def _bins_state(ssd: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in ssd.iterdir()}


def test_an_interrupted_force_keeps_the_old_placement_whole(dataset, tmp_path, capsys, monkeypatch):
    """``--force`` writes the new bins beside the old: Ctrl-C in the middle leaves the old placement as it was
    (issue 28: an interrupted force lost the old placement)."""
    import iostack.bins as bins

    out, ssd = tmp_path / "p", tmp_path / "ssd"
    assert main(_args(dataset, out, ssd)) == 0
    before, index = _bins_state(ssd), (out / "placement.json").read_bytes()
    real, calls = bins.write_bin_file, [0]

    def interrupted(path, *a, **k):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(path, *a, **k)

    monkeypatch.setattr(bins, "write_bin_file", interrupted)
    capsys.readouterr()
    assert main([*_args(dataset, out, ssd), "--force", "--strategy", "hot-first"]) == 130
    assert _bins_state(ssd) == before and (out / "placement.json").read_bytes() == index
    assert not list(ssd.glob("*.new*")) and not list(ssd.glob("*.tmp*"))
    monkeypatch.setattr(bins, "write_bin_file", real)
    assert main(["place", "--verify", str(out)]) == 0  # still whole: every block checks

    capsys.readouterr()
    assert main([*_args(dataset, out, ssd), "--force", "--strategy", "hot-first"]) == 0
    assert json.loads(capsys.readouterr().out)["report"]["strategy"] == "hot-first"
    assert sorted(_bins_state(ssd)) == sorted(before) and not list(ssd.glob("*.new*"))
    assert main(["place", "--verify", str(out)]) == 0


def test_a_force_without_room_for_both_says_the_old_goes_first(dataset, tmp_path, capsys, monkeypatch):
    import shutil
    from collections import namedtuple

    out, ssd = tmp_path / "p", tmp_path / "ssd"
    assert main(_args(dataset, out, ssd)) == 0
    old_bytes = sum(p.stat().st_size for p in ssd.glob("*.dat"))
    usage = namedtuple("usage", "total used free")
    # room for the new bins once the old are counted free, not for both at once
    monkeypatch.setattr(shutil, "disk_usage", lambda d: usage(10**12, 0, old_bytes // 2))
    capsys.readouterr()
    assert main([*_args(dataset, out, ssd), "--force"]) == 0
    assert "no room for the new bins beside the old ones" in capsys.readouterr().err
    assert not list(ssd.glob("*.new*"))
    monkeypatch.undo()
    assert main(["place", "--verify", str(out)]) == 0


def test_a_killed_forces_staged_bins_are_swept_even_beside_an_index(tmp_path):
    out, ssd = tmp_path / "p", tmp_path / "ssd"
    for d in (out, ssd):
        d.mkdir()
    (out / "placement.json").write_text("{}")  # the old placement, still indexed
    staged = [ssd / f"{_ssd_prefix(out)}bin2-3.dat.new", ssd / f"{_ssd_prefix(out)}bin2-3.dat.new.json",
              out / "bin1.dat.new.tmp"]
    for p in staged:
        p.write_bytes(b"z")
    whole = ssd / f"{_ssd_prefix(out)}bin2-3.dat"
    whole.write_bytes(b"old")
    assert placement_leftovers(out, [ssd]) == sorted(staged)
