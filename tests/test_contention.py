"""The contention an epoch ran against, from fake /proc and /sys trees, and end to end in `moment train`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iostack.binstats import Counter, thread_wait_s
from moment.cli import main
from tests.test_prediction import train_args
from training.contention import (
    Contention,
    DiskFigures,
    adjust,
    contention_between,
    describe,
    disk_counters,
    explain,
    sample,
)
from training.runreport import read_runs, summary


def _proc(root: Path, *, total: int, steal: int, psi_us: int, threads: dict[int, tuple[int, int, int]],
          load: float = 7.4) -> Path:
    (root / "pressure").mkdir(parents=True, exist_ok=True)
    # cpu user nice system idle iowait irq softirq steal guest guest_nice; guest is inside user
    user = total - steal - 100
    (root / "stat").write_text(f"cpu  {user} 0 50 50 0 0 0 {steal} 999 0\ncpu0 1 2 3\nprocs_running 8\n")
    (root / "pressure" / "cpu").write_text(f"some avg10=92.00 avg60=84.00 avg300=90.00 total={psi_us}\n"
                                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    (root / "loadavg").write_text(f"{load} 9.25 12.34 5/123 306\n")
    for tid, (run, wait, slices) in threads.items():
        d = root / "self" / "task" / str(tid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "schedstat").write_text(f"{run} {wait} {slices}\n")
    return root


def _sys(root: Path, data: Path, fields: list[int], *, partition: bool = True) -> Path:
    """A sysfs whose ``dev/block/MAJ:MIN`` (of ``data``'s real device) links to ``vdz1`` inside disk ``vdz``
    (a partition of it when ``partition``)."""
    dev = os.stat(data).st_dev
    disk = root / "devices" / "virtual" / "block" / "vdz"
    part = disk / "vdz1"
    part.mkdir(parents=True, exist_ok=True)
    if partition:
        (part / "partition").write_text("1\n")
    (disk / "stat").write_text(" ".join(str(x) for x in fields) + "\n")
    (part / "stat").write_text("0 " * 17 + "\n")  # a partition's own counters are not the drive's
    link = root / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(part)  # without a partition file vdz1 stands alone (a loop device)
    return root


def _stat(reads=0, sectors=0, writes=0, wsectors=0, ticks=0, queue=0) -> list[int]:
    return [reads, 0, sectors, 0, writes, 0, wsectors, 0, 0, ticks, queue, 0, 0, 0, 0, 0, 0]


def test_counters_between_two_snapshots_name_the_contention(tmp_path, monkeypatch):
    data = tmp_path / "bins"
    data.mkdir()
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    clock = iter([100.0, 102.0])
    monkeypatch.setattr("training.contention.time.perf_counter", lambda: next(clock))
    _proc(proc, total=10_000, steal=100, psi_us=1_000_000, threads={11: (1_000, 500, 10)})
    _sys(sysfs, data, _stat(reads=10, sectors=0, ticks=0, queue=0))
    a = sample(data, proc_root=proc, sys_root=sysfs)
    # two seconds later: 1,000 jiffies, 50 stolen; 1.5 s some-waiting; thread 11 ran 1 s more and waited
    # 1 s more in 100 turns on a core, thread 12 born in the epoch ran 1 s in 100 turns; the disk read
    # 1.2 GB, busy 1.92 s, 6 s queued
    _proc(proc, total=11_000, steal=150, psi_us=2_500_000,
          threads={11: (1_000_001_000, 1_000_000_500, 110), 12: (1_000_000_000, 0, 100)})
    _sys(sysfs, data, _stat(reads=1010, sectors=1_200_000_000 // 512, ticks=1920, queue=6000))
    c = contention_between(a, sample(data, proc_root=proc, sys_root=sysfs))
    assert c.wall_s == 2.0 and c.load_1min == 7.4
    assert c.steal_share == pytest.approx(0.05) and c.cpu_wait_share == pytest.approx(0.75)
    assert c.cpu_stretch == pytest.approx(1.5)  # (2 s run + 1 s wait) / 2 s run
    assert c.wait_per_slice_s == pytest.approx(0.005)  # 1 s of waits over 200 turns
    assert c.disk is not None and c.disk.name == "vdz"  # the partition counted as its disk
    assert c.disk.busy_share == pytest.approx(0.96) and c.disk.queue_depth == pytest.approx(3.0)
    assert c.disk.read_bytes_per_s == pytest.approx(0.6e9, rel=1e-3)
    line = explain(None, c, profiled_bytes_per_s=2.0e9)
    assert "run queue 7.4 on" in line and "steal 5%" in line
    assert "waited 5.0 ms per turn on a core, stretched 1.50×" in line
    assert "vdz busy 96%, queue 3.0, 600.0 MB/s read by all against 2000 MB/s profiled" in line
    assert Contention.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_a_device_less_or_unknown_path_gives_no_disk_and_says_why(tmp_path):
    assert disk_counters(None)[0] is None
    gone = disk_counters(tmp_path / "nope")
    assert gone[0] is None and "cannot stat" in (gone[1] or "")
    no_sys = disk_counters(tmp_path, sys_root=tmp_path / "empty")
    assert no_sys[0] is None and "no disk statistics" in (no_sys[1] or "")
    if Path("/dev/shm").is_dir() and os.major(os.stat("/dev/shm").st_dev) == 0:
        shm = disk_counters("/dev/shm")
        assert shm[0] is None and "no block device" in (shm[1] or "")
    # a whole disk (no partition file) is read as itself; an absent /proc gives a stretch of 1 and a note
    sysfs = _sys(tmp_path / "sys", tmp_path, _stat(reads=3, ticks=4), partition=False)
    whole, why = disk_counters(tmp_path, sys_root=sysfs)
    assert why is None and whole is not None and whole.name == "vdz1" and whole.reads == 0
    s = sample(tmp_path, proc_root=tmp_path / "noproc", sys_root=sysfs)
    c = contention_between(s, s)
    assert c.cpu_stretch == 1.0 and c.cpu_wait_share is None and any("schedstat" in n for n in c.notes)


def _contention(wait_s: float, busy: float, read: int, written: int = 0) -> Contention:
    disk = DiskFigures("vdz", busy, 2.0, read / 1.0, read, written)
    return Contention(1.0, 2, 8.0, 0.0, 0.9, 3.0, wait_s, disk)


def test_adjust_scales_ssd_by_others_busy_time_and_adds_each_calls_wait_for_a_core():
    pred = {"io_error": -0.4, "measured_io_s": 1.0, "predicted_io_s": 0.6,
            "tiers": [{"tier": "ssd", "predicted_s": 0.6, "measured_s": 1.0, "measured_bytes": 1e8},
                      {"tier": "cpu", "predicted_s": 0.1, "measured_s": 0.2, "measured_bytes": 1e8},
                      {"tier": "gpu", "predicted_s": None, "measured_s": None, "measured_bytes": 0.0}]}
    # the disk moved 4e8 bytes, 1e8 of them ours: others held it 0.8 × 3/4 = 60% of the time
    # and 40 read calls each waited 5 ms for a core once woken
    out = adjust(pred, _contention(0.005, 0.8, 400_000_000), read_calls=40)
    ssd, cpu, gpu = out["tiers"]
    assert out["adjustment"]["ssd_factor"] == pytest.approx(2.5)
    assert out["adjustment"]["cpu_wait_s"] == pytest.approx(0.2)
    assert ssd["adjusted_s"] == pytest.approx(0.6 * 2.5 + 0.2) and cpu["adjusted_s"] == 0.1  # SSD only
    assert gpu["adjusted_s"] is None and gpu["adjusted_error"] is None
    assert out["adjusted_io_s"] == pytest.approx(1.7) and out["adjusted_io_error"] == pytest.approx(0.7)
    line = explain(out, _contention(0.005, 0.8, 400_000_000))
    assert line.startswith("SSD reads measured 67% slower than predicted (+70% after adjusting")
    # the store's own timing of the reads' whole wait for a core, when it has one: the bracket's high end
    timed = {**pred, "tiers": [{**pred["tiers"][0], "measured_cpu_wait_s": 0.35}, *pred["tiers"][1:]]}
    out = adjust(timed, _contention(0.005, 0.8, 400_000_000), read_calls=40)
    assert out["adjusted_io_s"] == pytest.approx(1.7) and out["adjusted_io_high_s"] == pytest.approx(1.85)
    assert out["adjustment"]["cpu_wait_high_s"] == 0.35
    assert "(+70% to +85% after adjusting" in explain(out, _contention(0.005, 0.8, 400_000_000))
    inside = adjust({**timed, "measured_io_s": 1.8}, _contention(0.005, 0.8, 400_000_000), read_calls=40)
    assert ": within)" in explain(inside, _contention(0.005, 0.8, 400_000_000))
    # only our own reads on the disk and no wait: nothing to add
    same = adjust(pred, _contention(0.0, 0.9, 100_000_000), read_calls=40)
    assert same["adjustment"]["ssd_factor"] == 1.0 and same["adjusted_io_s"] == pytest.approx(0.6)


@given(busy=st.floats(0, 1), read=st.integers(0, 10**10), written=st.integers(0, 10**10),
       ours=st.floats(0, 1e10), wait=st.floats(0, 0.1), calls=st.integers(0, 10**6))
def test_adjusting_never_predicts_less_and_stays_bounded(busy, read, written, ours, wait, calls):
    pred = {"measured_io_s": 1.0,
            "tiers": [{"tier": "ssd", "predicted_s": 0.5, "measured_s": 1.0, "measured_bytes": ours}]}
    out = adjust(pred, _contention(wait, busy, read, written), read_calls=calls)
    extra = calls * wait
    assert 0.5 + extra - 1e-9 <= out["adjusted_io_s"] <= 0.5 * 20 + extra + 1e-9


def test_moment_train_records_the_contention_beside_the_prediction(tmp_path, capsys):
    metrics = tmp_path / "m.jsonl"
    args = [*train_args(tmp_path, capsys), "--metrics", str(metrics)]
    assert main([*args, "--json"]) == 0
    last = json.loads(capsys.readouterr().out)["epochs"][-1]
    c = last["contention"]
    assert c["cpu_stretch"] >= 1.0 and c["cores"] == os.cpu_count() and c["wall_s"] > 0
    assert set(c) >= {"load_1min", "steal_share", "cpu_wait_share", "disk", "notes"}
    assert c["disk"] is not None or c["notes"]  # a disk's figures, or why there are none
    ssd_tier = next(t for t in last["prediction"]["tiers"] if t["tier"] == "ssd")
    assert ssd_tier["adjusted_s"] >= ssd_tier["predicted_s"] > 0
    adj = last["prediction"]["adjustment"]
    assert adj["read_calls"] > 0 and ssd_tier["measured_cpu_wait_s"] >= 0
    assert adj["cpu_wait_s"] == pytest.approx(adj["read_calls"] * c["wait_per_slice_s"])
    if ssd_tier["measured_cpu_wait_s"] > 0:  # the store timed its reads' wait: the bracket's high end
        assert adj["cpu_wait_high_s"] == pytest.approx(max(ssd_tier["measured_cpu_wait_s"], adj["cpu_wait_s"]))
        assert ssd_tier["adjusted_high_s"] >= ssd_tier["adjusted_s"]
    epoch = [json.loads(x) for x in metrics.read_text().splitlines() if '"epoch"' in x][-1]
    assert epoch["contention"] == c
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "contention (last epoch)" in out and "run queue" in out and "adjusted for the contention" in out
    assert describe(last["prediction"], c).startswith("SSD reads measured")
    run = read_runs(metrics)[-1]
    assert any(ln.startswith("contention: SSD reads measured") and "run queue" in ln for ln in summary(run))



def test_the_store_counts_its_ssd_reads_wait_for_a_core():
    """The thread's schedstat wait never goes back, and the SSD tier's counters carry the reads' share of it."""
    a = thread_wait_s()
    sum(range(200_000))
    assert thread_wait_s() >= a >= 0.0
    c = Counter()
    c.add(3, 3 * 4096, 1, 0.02, cpu_wait_s=0.005)
    c.add(1, 4096, 1, 0.01, cpu_wait_s=0.001)
    assert c.cpu_wait_s == pytest.approx(0.006) and c.seconds == pytest.approx(0.03)
