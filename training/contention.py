"""The contention a run actually had over an epoch: the CPU's run queue and steal, this process's
wait for a core, and the drive under the bins: its busy time, queue and rate.

The plan's prediction (:mod:`training.prediction`) is made from a profile taken once, on a quiet
machine; a loaded machine makes every read slower than predicted. Two snapshots, one at each end
of the epoch, each a handful of small reads of ``/proc`` and ``/sys`` (no sampling thread), say by
how much and why:

* CPU: ``/proc/stat`` (jiffies per state: ``steal`` over all), ``/proc/loadavg`` (the run queue,
  1-minute average, at the end), ``/proc/pressure/cpu`` (PSI: the share of the epoch in which some
  task waited for a core) and ``/proc/self/task/*/schedstat`` (this process's threads: ns on a core
  and ns waiting in the run queue; a thread's wait is the stretch time slicing gave its work);
* SSD: ``/sys/block/<disk>/stat`` of the disk under a path (``os.stat(path).st_dev`` →
  ``/sys/dev/block/MAJ:MIN``, a partition to its disk; tmpfs and other device-less file systems give
  no disk, said in ``notes``): reads, sectors, ``io_ticks`` (ms the disk was busy) and
  ``time_in_queue`` (ms summed over requests: ÷ wall = average queue depth).

:func:`adjust` scales the plan's SSD read seconds by what was measured: by ``1 / (1 - the disk's
busy share taken by others)``, plus, per read call, the mean time this process's threads waited for a
core each time they were woken (a read call sleeps on the disk, then waits its turn for a core to
return). Both are measured over the epoch they adjust: the adjusted figure explains a miss, it is not
a forecast made before the run. (Scaling by ``cpu_stretch``, the threads' ``(run + wait) / run``,
overshot several-fold in tools/bench_contention.py: a read call mostly sleeps on the disk, and
this process's compute threads also wait on each other.)

>>> root = "/nonexistent"
>>> c = contention_between(sample(proc_root=root, sys_root=root), sample(proc_root=root, sys_root=root))
>>> c.cpu_stretch, c.disk is None
(1.0, True)
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from momentbase.jsontypes import JsonObject

__all__ = ["Contention", "CpuCounters", "DiskCounters", "DiskFigures", "Snapshot", "adjust", "contention_between",
           "describe", "disk_counters", "explain", "sample"]

SECTOR = 512  # /sys/block/*/stat counts 512-byte sectors whatever the device's block size


@dataclass(frozen=True)
class CpuCounters:
    """Whole-machine jiffies (all states, steal), PSI cpu ``some`` µs, this process's threads' ns on a core
    and waiting for one (per thread id, so threads born in the epoch count from zero), and the load."""

    total_jiffies: int
    steal_jiffies: int
    psi_some_us: int | None
    thread_ns: tuple[tuple[int, int, int, int], ...]  # (tid, run ns, wait ns, times put on a core)
    load_1min: float | None
    cores: int


@dataclass(frozen=True)
class DiskCounters:
    """One disk's ``/sys/block/<name>/stat``: reads completed, sectors read, writes, sectors written,
    ms busy (``io_ticks``), ms summed over requests (``time_in_queue``)."""

    name: str
    reads: int
    sectors_read: int
    writes: int
    sectors_written: int
    io_ticks_ms: int
    time_in_queue_ms: int


@dataclass(frozen=True)
class Snapshot:
    wall_s: float
    cpu: CpuCounters
    disk: DiskCounters | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiskFigures:
    """The disk over the epoch: busy share of the wall time, average requests in flight, bytes read per
    second (everyone's), and bytes read + written."""

    name: str
    busy_share: float
    queue_depth: float
    read_bytes_per_s: float
    read_bytes: int
    written_bytes: int


@dataclass(frozen=True)
class Contention:
    """What the epoch ran against. ``cpu_stretch``: ``(run + wait) / run`` of this process's threads
    (1.0: never waited for a core); ``cpu_wait_share``: PSI's share of the wall time in which some task
    waited for a core (``None`` without PSI); ``steal_share``: the machine's time stolen by its
    hypervisor; ``load_1min``: the run queue (1-minute load average) at the end, on ``cores``;
    ``wait_per_slice_s``: this process's threads' mean wait in the run queue each time before they
    were put on a core (what a thread woken by a finished read waits before it can return)."""

    wall_s: float
    cores: int
    load_1min: float | None
    steal_share: float
    cpu_wait_share: float | None
    cpu_stretch: float
    wait_per_slice_s: float
    disk: DiskFigures | None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: JsonObject) -> Contention:
        """Back from :meth:`to_dict` (an epoch record's ``contention``)."""
        disk = d.get("disk")
        return cls(float(d["wall_s"]), int(d["cores"]), d.get("load_1min"), float(d["steal_share"]),
                   d.get("cpu_wait_share"), float(d["cpu_stretch"]), float(d.get("wait_per_slice_s") or 0.0),
                   DiskFigures(**disk) if isinstance(disk, dict) else None, tuple(d.get("notes") or ()))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cpu_counters(proc: Path) -> CpuCounters:
    total = steal = 0
    for line in (_read(proc / "stat") or "").splitlines():
        if line.startswith("cpu "):
            vals = [int(x) for x in line.split()[1:]]
            # guest and guest_nice (fields 9, 10) are already inside user and nice
            total, steal = sum(vals[:8]), (vals[7] if len(vals) > 7 else 0)
            break
    psi = None
    for line in (_read(proc / "pressure" / "cpu") or "").splitlines():
        if line.startswith("some "):
            psi = int(dict(kv.split("=", 1) for kv in line.split()[1:]).get("total", 0))
    threads = []
    task_dir = proc / "self" / "task"
    for d in sorted(task_dir.iterdir()) if task_dir.is_dir() else ():
        fields = (_read(d / "schedstat") or "").split()
        if len(fields) >= 3 and d.name.isdigit():
            threads.append((int(d.name), int(fields[0]), int(fields[1]), int(fields[2])))
    load = (_read(proc / "loadavg") or "").split()
    return CpuCounters(total, steal, psi, tuple(threads), float(load[0]) if load else None, os.cpu_count() or 1)


def disk_counters(path: str | os.PathLike[str] | None, sys_root: str | os.PathLike[str] = "/sys"
                  ) -> tuple[DiskCounters | None, str | None]:
    """The counters of the disk holding ``path``, or ``None`` and why (no path, no device, no stat file).

    A partition counts as its disk (the drive is what others contend for); a device-mapper, md or loop
    device as itself (the counters of what the file system sees).
    """
    if path is None:
        return None, "no data path to tie to a disk"
    try:
        dev = os.stat(path).st_dev
    except OSError as exc:
        return None, f"cannot stat {path}: {exc.strerror or exc}"
    major, minor = os.major(dev), os.minor(dev)
    if major == 0:
        return None, f"{path} is on a file system with no block device (tmpfs, overlay, NFS): no disk figures"
    link = Path(sys_root) / "dev" / "block" / f"{major}:{minor}"
    real = Path(os.path.realpath(link))
    if (real / "partition").exists():
        real = real.parent  # a partition's directory sits inside its disk's
    fields = (_read(real / "stat") or "").split()
    if len(fields) < 11:
        return None, f"no disk statistics for {major}:{minor} under {sys_root}"
    f = [int(x) for x in fields[:11]]
    return DiskCounters(real.name, f[0], f[2], f[4], f[6], f[9], f[10]), None


def sample(data_path: str | os.PathLike[str] | None = None, *, proc_root: str | os.PathLike[str] = "/proc",
           sys_root: str | os.PathLike[str] = "/sys") -> Snapshot:
    """One snapshot of the counters (a few small file reads); any that cannot be read count as absent."""
    disk, why = disk_counters(data_path, sys_root)
    return Snapshot(time.perf_counter(), _cpu_counters(Path(proc_root)), disk, (why,) if why else ())


def _disk_between(a: DiskCounters, b: DiskCounters, wall_s: float) -> DiskFigures:
    read = (b.sectors_read - a.sectors_read) * SECTOR
    wall_ms = max(wall_s * 1e3, 1e-9)
    return DiskFigures(b.name, min(1.0, (b.io_ticks_ms - a.io_ticks_ms) / wall_ms),
                       (b.time_in_queue_ms - a.time_in_queue_ms) / wall_ms, read / max(wall_s, 1e-9), read,
                       (b.sectors_written - a.sectors_written) * SECTOR)


def contention_between(a: Snapshot, b: Snapshot) -> Contention:
    """What the counters say about the time between two snapshots (``b`` after ``a``)."""
    wall = max(b.wall_s - a.wall_s, 1e-9)
    jiffies = b.cpu.total_jiffies - a.cpu.total_jiffies
    steal = (b.cpu.steal_jiffies - a.cpu.steal_jiffies) / jiffies if jiffies > 0 else 0.0
    psi = None
    if a.cpu.psi_some_us is not None and b.cpu.psi_some_us is not None:
        psi = min(1.0, (b.cpu.psi_some_us - a.cpu.psi_some_us) / (wall * 1e6))
    before = {tid: (r, w, n) for tid, r, w, n in a.cpu.thread_ns}
    run = wait = slices = 0
    for tid, r, w, n in b.cpu.thread_ns:
        r0, w0, n0 = before.get(tid, (0, 0, 0))
        run, wait, slices = run + r - r0, wait + w - w0, slices + n - n0
    notes = list(dict.fromkeys(a.notes + b.notes))
    if run <= 0:
        notes.append("no per-thread scheduler statistics (/proc/self/task/*/schedstat): CPU stretch taken as 1")
    disk = None
    if a.disk is not None and b.disk is not None and a.disk.name == b.disk.name:
        disk = _disk_between(a.disk, b.disk, wall)
    return Contention(wall, b.cpu.cores, b.cpu.load_1min, max(0.0, steal), psi,
                      (run + wait) / run if run > 0 else 1.0, wait / slices * 1e-9 if slices > 0 else 0.0,
                      disk, tuple(notes))


def _others_busy(c: Contention, own_read_bytes: float) -> float:
    """The share of the wall time the disk was busy with others' requests: its busy share times the
    share of its traffic that was not this process's reads (reads served by the page cache never
    reach the disk, so ours is capped at what the disk moved)."""
    d = c.disk
    if d is None or d.busy_share <= 0:
        return 0.0
    moved = d.read_bytes + d.written_bytes
    ours = min(1.0, own_read_bytes / moved) if moved else 1.0
    return d.busy_share * (1.0 - ours)


def adjust(prediction: JsonObject, c: Contention, read_calls: int) -> JsonObject:
    """``prediction`` (:meth:`training.prediction.EpochPrediction.to_dict`) with the SSD tier's
    ``adjusted_s`` and ``adjusted_high_s``, the node's ``adjusted_io_s`` / ``adjusted_io_error`` and
    ``adjusted_io_high_s`` / ``adjusted_io_high_error``, and the terms used (``adjustment``). Other
    tiers keep their plain figure (``adjusted_s`` equal to ``predicted_s``).

    The SSD's seconds are the plan's, divided by the share of the disk's time others left
    (:func:`_others_busy`), plus the time the read calls lost waiting for a core, bracketed:

    * low (``adjusted_s``): each of the epoch's ``read_calls`` (a batch's read of one SSD bin) waits
      once, the mean wait per turn on a core of this process's threads (``wait_per_slice_s``);
    * high (``adjusted_high_s``): the reading threads' whole wait for a core during the calls (the
      store's ``measured_cpu_wait_s``, schedstat around each call), part of which overlaps reads still
      in flight on the disk. ``None`` where the store did not time it.

    Both terms are measured over the epoch adjusted.
    """
    ssd_tiers = [t for t in prediction["tiers"] if t["tier"] == "ssd"]
    ssd_bytes = sum(float(t["measured_bytes"]) for t in ssd_tiers)
    disk_factor = 1.0 / max(0.05, 1.0 - _others_busy(c, ssd_bytes))
    low_wait = max(0, int(read_calls)) * c.wait_per_slice_s
    timed = sum(float(t.get("measured_cpu_wait_s") or 0.0) for t in ssd_tiers)
    high_wait = max(timed, low_wait) if timed > 0 else None
    m = prediction.get("measured_io_s")

    def err(s: float | None, measured: float | None) -> float | None:
        return s / measured - 1.0 if s is not None and measured else None

    tiers = []
    for t in prediction["tiers"]:
        p = t.get("predicted_s")
        ssd = t["tier"] == "ssd" and p is not None
        adj = None if p is None else (float(p) * disk_factor + low_wait if ssd else float(p))
        high = float(p) * disk_factor + high_wait if ssd and high_wait is not None else adj
        tiers.append({**t, "adjusted_s": adj, "adjusted_error": err(adj, t.get("measured_s")),
                      "adjusted_high_s": high})
    lows = [t["adjusted_s"] for t in tiers if t["tier"] == "ssd"]
    highs = [t["adjusted_high_s"] for t in tiers if t["tier"] == "ssd"]
    io = None if not lows or None in lows else sum(lows)
    io_high = None if high_wait is None or not highs or None in highs else sum(highs)
    return {**prediction, "tiers": tiers, "adjusted_io_s": io, "adjusted_io_error": err(io, m),
            "adjusted_io_high_s": io_high, "adjusted_io_high_error": err(io_high, m),
            "adjustment": {"ssd_factor": disk_factor, "cpu_wait_s": low_wait, "cpu_wait_high_s": high_wait,
                           "read_calls": int(read_calls),
                           "basis": "contention measured over this epoch (explains the miss; not a forecast)"}}


def explain(prediction: JsonObject | None, c: Contention, profiled_bytes_per_s: float | None = None) -> str:
    """One line: predicted against measured with the contention named, e.g. ``measured 23% slower than
    predicted; CPU run queue 7.4 on 2 cores (steal 0%, waited for a core 41% of the time); SSD vda busy
    96%, queue 3.1, 1.2 GB/s read``."""
    parts = []
    if prediction and prediction.get("io_error") is not None:
        miss = 1.0 / (1.0 + float(prediction["io_error"])) - 1.0  # measured / predicted - 1
        lo, hi = prediction.get("adjusted_io_error"), prediction.get("adjusted_io_high_error")
        adj = "" if lo is None else (f" ({float(lo):+.0%} after adjusting for the contention)" if hi is None else
                                     f" ({float(lo):+.0%} to {float(hi):+.0%} after adjusting for the contention"
                                     + (": within" if float(lo) <= 0.0 <= float(hi) else "") + ")")
        parts.append(f"SSD reads measured {abs(miss):.0%} {'slower' if miss >= 0 else 'faster'} than predicted"
                     + adj)
    cpu = f"CPU run queue {c.load_1min:.1f} on {c.cores} cores" if c.load_1min is not None else \
        f"CPU on {c.cores} cores"
    cpu += f" (steal {c.steal_share:.0%}"
    if c.cpu_wait_share is not None:
        cpu += f", some task waited for a core {c.cpu_wait_share:.0%} of the time"
    parts.append(cpu + f"; this run's threads waited {1e3 * c.wait_per_slice_s:.1f} ms per turn on a core, "
                 f"stretched {c.cpu_stretch:.2f}×)")
    if c.disk is not None:
        d = c.disk
        parts.append(f"SSD {d.name} busy {d.busy_share:.0%}, queue {d.queue_depth:.1f}, "
                     f"{d.read_bytes_per_s / 1e6:.1f} MB/s read by all"
                     + (f" against {profiled_bytes_per_s / 1e6:.0f} MB/s profiled" if profiled_bytes_per_s else ""))
    else:
        parts.append("no disk figures" + (f" ({c.notes[0]})" if c.notes else ""))
    return "; ".join(parts)


def describe(prediction: JsonObject | None, contention: JsonObject) -> str:
    """:func:`explain` of an epoch record's ``prediction`` and ``contention`` (as JSON)."""
    return explain(prediction, Contention.from_dict(contention))
