"""Measure what can be measured on the machine at hand (the paper's §3.1 profiling).

The planner's flow model needs the capacity of every link and device. Tables
give the PCIe figures; this module measures the rest where it can:

- :func:`ssd_random_read`: random aligned reads of ``block_bytes`` from a
  file on a storage device, with fio (``io_uring``, else ``libaio``, else
  ``psync``) when it is installed *and* with Moment's own reader
  (``moment-posix``: several processes, each a few threads issuing
  ``os.preadv``), O_DIRECT where the file system allows it;
- :func:`host_memory_bandwidth` / :func:`memory_bandwidth_by_node`: DRAM
  bandwidth from a numpy copy (STREAM "copy" convention: bytes read plus
  bytes written, per second);
- :func:`cuda_bandwidths`: host→device, device→host and peer copies, on a
  machine with CUDA and PyTorch only;
- :func:`profile_machine`: all of it, as :class:`~planner.capacities.Capacities`
  keyed by the devices the test files live on.

Library code: results are returned and progress goes to an optional
callback taking one line of text; nothing is printed. Failures a user can
cause (a missing directory, no space, a read-only file system) raise
:class:`ProfileError`.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     m = ssd_random_read(d, file_bytes=64 * 1024, seconds=0.05, use_fio=False, processes=1,
...                         queue_depth=2)
>>> [r.tool for r in m.results], m.created, m.verified
(['moment-posix'], True, True)
>>> host_memory_bandwidth(8 << 20, repeats=2) > 0
True
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner import _posixread
from planner.capacities import (
    Capacities,
    DeviceCapacity,
    LinkCapacity,
    MemoryCapacity,
    PcieEfficiency,
    ReadMeasurement,
    format_size,
)
from planner.errors import ParseError, PlannerError
from planner.progress import Progress, report
from planner.topology.model import NodeKind, Topology
from planner.topology.pcie import pcie_bytes_per_s

__all__ = [
    "ProfileError", "SsdMeasurement", "BlockDevice", "FioRun",
    "ssd_random_read", "write_test_file", "posix_random_read", "fio_command", "parse_fio_json",
    "run_fio", "fio_engines", "block_device_of", "host_memory_bandwidth",
    "memory_bandwidth_by_node", "numa_nodes", "cuda_bandwidths", "profile_machine", "gpu_numa_node",
    "props_bus_address",
    "DEFAULT_FILE_BYTES", "FIO_ENGINES",
]

#: fio engines tried in this order: asynchronous first
FIO_ENGINES = ("io_uring", "libaio", "psync")

#: test file written when a directory is given, bytes
DEFAULT_FILE_BYTES = 1 << 30

#: sizes, depths and durations accepted (typo protection)
MAX_BLOCK_BYTES = 64 << 20
MAX_QUEUE_DEPTH = 4096
MAX_SECONDS = 3600.0

#: room left free on the file system beside a test file
_FREE_MARGIN = 256 << 20


class ProfileError(PlannerError):
    """A measurement that could not be made (bad path, no space, a tool that failed)."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------
# block devices


@dataclass(frozen=True)
class BlockDevice:
    """The block device a path lives on, as far as sysfs tells.

    ``name`` is the whole disk (``nvme0n1``, ``vda``; a partition is
    resolved to its disk), ``pci_address`` the PCI function it hangs under
    (``None`` for a device with no PCI parent: a loop or RAM disk), ``model``
    its model string when sysfs has one, ``backing`` the disks under a
    device-mapper or md device, ``notes`` what a reader of the figures should
    know (a virtual disk, an array of several disks).
    """

    name: str | None
    major: int | None = None
    minor: int | None = None
    pci_address: str | None = None
    model: str | None = None
    kind: str | None = None
    backing: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


_PCI_ADDR = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _read_sys(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip() or None
    except OSError:
        return None


def _disk_from_sysfs(major: int, minor: int, sys_root: str | os.PathLike[str] = "/sys",
                     depth: int = 0) -> BlockDevice:
    root = Path(sys_root)
    link = root / "dev" / "block" / f"{major}:{minor}"
    try:
        real = Path(os.path.realpath(link))
    except OSError:
        real = link
    if not real.exists():
        return BlockDevice(None, major, minor, notes=(f"no block device {major}:{minor} in sysfs",))
    if (real / "partition").exists():
        real = real.parent  # a partition's directory sits inside its disk's
    name = real.name
    notes: list[str] = []
    slaves_dir = real / "slaves"
    slaves = sorted(p.name for p in slaves_dir.iterdir()) if slaves_dir.is_dir() else []
    if slaves and depth < 8:
        if len(slaves) == 1:
            dev = _read_sys(root / "class" / "block" / slaves[0] / "dev")
            if dev and ":" in dev:
                a, b = dev.split(":", 1)
                inner = _disk_from_sysfs(int(a), int(b), sys_root, depth + 1)
                return replace(inner, backing=(inner.name or slaves[0],),
                               notes=(f"{name} is a device-mapper/md device over {inner.name}",
                                      *inner.notes))
        notes.append(f"{name} spans {len(slaves)} devices ({', '.join(slaves)}): the figures "
                     "are the array's, not one device's")
        return BlockDevice(name, major, minor, kind="array", backing=tuple(slaves),
                           notes=tuple(notes))
    pci = None
    for part in real.parts:
        if _PCI_ADDR.match(part):
            pci = part  # the deepest PCI function on the path is the controller
    model = _read_sys(real / "device" / "model")
    if model is None and (real / "device" / "device" / "model").exists():
        model = _read_sys(real / "device" / "device" / "model")
    if name.startswith("nvme"):
        kind = "nvme"
    elif name.startswith("vd"):
        kind = "virtio"
        notes.append(f"{name} is a virtio disk: a virtual machine's disk, so the figures are "
                     "what the VM gets, not those of a physical SSD")
    elif name.startswith(("sd", "hd")):
        kind = "scsi/sata"
    elif name.startswith(("loop", "ram", "zram", "nbd")):
        kind = name.rstrip("0123456789")
        notes.append(f"{name} is not a physical device")
    else:
        kind = None
    if pci is None and kind not in ("loop", "ram", "zram", "nbd"):
        notes.append(f"no PCI device found above {name} in sysfs")
    return BlockDevice(name, major, minor, pci, model, kind, (), tuple(notes))


def _mount_source(path: Path) -> str | None:
    """The device a path's file system was mounted from (for btrfs and others with anonymous st_dev)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, source = -1, None
    for ln in lines:
        pre, _, post = ln.partition(" - ")
        fields, rest = pre.split(), post.split()
        if len(fields) < 5 or len(rest) < 2:
            continue
        mnt = fields[4].replace("\\040", " ")
        if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) > best:
            best, source = len(mnt), rest[1]
    return source


def block_device_of(path: str | os.PathLike[str], sys_root: str | os.PathLike[str] = "/sys") -> BlockDevice:
    """The block device holding ``path``: ``os.stat(path).st_dev`` → ``/sys/dev/block/MAJ:MIN``.

    Walks up from the partition to the disk, through a device-mapper or md
    device with one backing disk, and up the sysfs path to the PCI function
    of the controller.

    >>> block_device_of("/proc").name is None   # a virtual file system has no device
    True
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        return BlockDevice(None, notes=(f"cannot stat {p}: {exc.strerror or exc}",))
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if stat.S_ISBLK(st.st_mode):
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    elif major == 0:
        # btrfs, overlay, tmpfs, NFS: an anonymous device number; ask the mount table
        src = _mount_source(p)
        if src and src.startswith("/dev/"):
            try:
                rst = os.stat(src)
                major, minor = os.major(rst.st_rdev), os.minor(rst.st_rdev)
            except OSError:
                pass
        if major == 0:
            return BlockDevice(None, major, minor, notes=(
                f"{p} is on a file system with no block device of its own "
                f"({src or 'unknown source'}): the figures cannot be tied to a device",))
    return _disk_from_sysfs(major, minor, sys_root)


# ---------------------------------------------------------------------------
# test files


def write_test_file(directory: str | os.PathLike[str], file_bytes: int = DEFAULT_FILE_BYTES,
                    progress: Progress | None = None) -> Path:
    """Create a test file of ``file_bytes`` bytes in ``directory``, fully written.

    The data is pseudo-random (a random 4 MiB pattern, offset per chunk), so
    the device stores and returns real blocks: a sparse or fallocated file
    reads zeros without touching the device and gives meaningless figures.
    The first 8 bytes of every 512-byte sector hold the sector's byte offset
    XOR :data:`planner._posixread.MAGIC`, which lets the reader check every
    block it gets back. The file is flushed to the device and its pages are
    dropped from the page cache. ``file_bytes`` is rounded up to 512 bytes.
    """
    import numpy as np

    d = Path(directory)
    file_bytes = -(-int(file_bytes) // _posixread.SECTOR) * _posixread.SECTOR
    _check_room(d, file_bytes)
    try:
        fd, name = tempfile.mkstemp(prefix=".moment-profile-", suffix=".dat", dir=d)
    except OSError as exc:
        raise ProfileError(f"cannot create a test file in {d}: {exc.strerror or exc}") from None
    path = Path(name)
    chunk = 4 << 20
    rng = np.random.default_rng()
    pad = rng.integers(0, 2**63, chunk // 8, dtype=np.uint64)
    sector_words = _posixread.SECTOR // 8
    try:
        written = 0
        while written < file_bytes:
            n = min(chunk, file_bytes - written)
            # a different pattern per chunk, so that no two blocks of the file are equal
            shift = np.uint64((0x9E3779B97F4A7C15 * (written // chunk + 1)) % 2**64)
            words = (pad[: n // 8] + shift).reshape(-1, sector_words)
            words[:, 0] = (np.arange(written, written + n, _posixread.SECTOR, dtype=np.uint64)
                           ^ np.uint64(_posixread.MAGIC))
            view = memoryview(words.tobytes())
            while view:
                k = os.write(fd, view)
                view = view[k:]
            written += n
            report(progress, f"writing the test file ({format_size(file_bytes)})", written, file_bytes)
        os.fsync(fd)
        _drop_cache(fd, file_bytes)
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        raise ProfileError(f"cannot write a test file in {d}: {exc.strerror or exc}") from None
    os.close(fd)
    return path


def _check_room(d: Path, file_bytes: int) -> None:
    if not d.exists():
        raise ProfileError(f"{d}: no such directory")
    if not d.is_dir():
        raise ProfileError(f"{d}: not a directory")
    if not os.access(d, os.W_OK | os.X_OK):
        raise ProfileError(f"{d}: not writable (a test file is written there)")
    try:
        free = shutil.disk_usage(d).free
    except OSError as exc:
        raise ProfileError(f"{d}: cannot tell the free space: {exc.strerror or exc}") from None
    if free < file_bytes + _FREE_MARGIN:
        raise ProfileError(
            f"{d}: only {format_size(free)} free; a {format_size(file_bytes)} test file needs "
            f"{format_size(file_bytes + _FREE_MARGIN)} (use a smaller --file-size)")


def _drop_cache(fd: int, length: int) -> None:
    # Buffered reads of pages still cached from writing would measure memory
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, 0, length, os.POSIX_FADV_DONTNEED)


def _probe_direct(path: Path, block_bytes: int, want: bool | None) -> tuple[bool, str | None]:
    """Whether O_DIRECT reads of ``block_bytes`` work on ``path`` (and why not)."""
    if want is False:
        return False, "buffered reads were asked for"
    why = None
    try:
        _posixread.read_blocks(str(path), [0], block_bytes, direct=True)
        return True, None
    except OSError as exc:
        why = f"O_DIRECT is not available here ({exc.strerror or exc})"
    except _posixread.ReadError as exc:
        why = f"O_DIRECT read failed ({exc})"
    if want:
        raise ProfileError(f"{path}: {why}")
    return False, why


# ---------------------------------------------------------------------------
# fio


@dataclass(frozen=True)
class FioRun:
    """What one fio run reported (its ``--output-format=json``), reads only."""

    version: str
    read_iops: float
    read_bytes_per_s: float
    read_bytes: int
    runtime_s: float
    total_ios: int
    engine: str | None
    iodepth: int | None
    numjobs: int
    block_bytes: int | None
    direct: bool | None
    error: int = 0


def fio_command(path: str | os.PathLike[str], *, block_bytes: int, queue_depth: int,
                seconds: float, file_bytes: int, direct: bool, engine: str,
                fio: str = "fio") -> list[str]:
    """The fio command line for a random-read test of an existing file.

    ``--readonly`` makes fio refuse any write, so a user's file is safe; an
    asynchronous engine keeps ``queue_depth`` reads in flight from one job,
    ``psync`` runs ``queue_depth`` threads of one read each.

    >>> fio_command("/d/f:1", block_bytes=4096, queue_depth=64, seconds=5, file_bytes=1 << 30,
    ...             direct=True, engine="io_uring")[1:4]
    ['--name=moment-randread', '--filename=/d/f\\\\:1', '--readonly']
    """
    cmd = [
        fio, "--name=moment-randread",
        # fio splits --filename at ':' (a list of files); escape it
        "--filename=" + str(path).replace("\\", "\\\\").replace(":", "\\:"),
        "--readonly", "--rw=randread", f"--bs={block_bytes}", f"--direct={int(direct)}",
        f"--ioengine={engine}", f"--size={file_bytes}",
        f"--runtime={max(1, round(seconds * 1000))}ms", "--time_based",
        "--randrepeat=0", "--norandommap", "--group_reporting", "--output-format=json",
    ]
    if engine in ("psync", "sync", "pvsync", "pvsync2"):
        cmd += ["--iodepth=1", f"--numjobs={queue_depth}", "--thread"]
    else:
        cmd += [f"--iodepth={queue_depth}", "--numjobs=1"]
    return cmd


def parse_fio_json(text: str, source: str = "<fio output>") -> FioRun:
    """The read figures of fio's JSON output (``--output-format=json``).

    Warning lines fio prints before the JSON object are skipped. Jobs not
    grouped (no ``--group_reporting``) are summed. Raises
    :class:`~planner.errors.ParseError` on anything else.

    >>> parse_fio_json('fio: engine x not loadable\\n')
    Traceback (most recent call last):
    ...
    planner.errors.ParseError: <fio output>:1: expected fio JSON output (--output-format=json), found 'fio: engine x not loadable'
    """
    if not isinstance(text, str):
        raise ParseError(source, None, "fio JSON output (text)", type(text).__name__)
    lines = text.split("\n")
    first = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("{")), None)
    if first is None:
        shown = next((ln for ln in lines if ln.strip()), None)
        line = lines.index(shown) + 1 if shown is not None else None
        raise ParseError(source, line, "fio JSON output (--output-format=json)",
                         shown if shown is not None else "no text")
    body = "\n".join(lines[first:])
    try:
        data = json.JSONDecoder().raw_decode(body.lstrip())[0]
    except json.JSONDecodeError as exc:
        raise ParseError(source, first + exc.lineno, f"valid JSON from fio ({exc.msg})") from None
    except RecursionError:
        raise ParseError(source, first + 1, "fio JSON output", "JSON nested too deeply") from None

    def fail(expected: str, found: Any = None) -> ParseError:
        return ParseError(source, first + 1, expected, None if found is None else str(found))

    if not isinstance(data, dict) or "fio version" not in data:
        raise fail("fio JSON output (an object with 'fio version')",
                   type(data).__name__ if not isinstance(data, dict) else ", ".join(list(data)[:5]))
    jobs = data.get("jobs")
    if not isinstance(jobs, list) or not jobs or not all(isinstance(j, dict) for j in jobs):
        raise fail("a non-empty 'jobs' list in fio's output", type(jobs).__name__)

    def num(obj: Any, key: str, what: str) -> float:
        v = obj.get(key) if isinstance(obj, dict) else None
        try:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise fail(f"a number for {what}", v)
            return float(v)
        except OverflowError:  # an integer too large for a float
            raise fail(f"a number for {what}", "a huge number") from None

    iops = bw = nbytes = ios = 0.0
    runtime_ms = 0.0
    error = 0
    for job in jobs:
        rd = job.get("read")
        if not isinstance(rd, dict):
            raise fail("a 'read' object in each fio job", type(rd).__name__)
        iops += num(rd, "iops", "read iops")
        bw += num(rd, "bw_bytes", "read bw_bytes")
        nbytes += num(rd, "io_bytes", "read io_bytes")
        ios += num(rd, "total_ios", "read total_ios")
        runtime_ms = max(runtime_ms, num(rd, "runtime", "read runtime"))
        err = job.get("error", 0)
        if isinstance(err, int) and not isinstance(err, bool) and err:
            error = error or err
    opts: dict[str, Any] = {}
    for src in (data.get("global options"), jobs[0].get("job options")):
        if isinstance(src, dict):
            opts.update(src)

    def opt_int(key: str) -> int | None:
        v = opts.get(key)
        try:
            return int(str(v)) if v is not None else None
        except ValueError:
            return None

    direct = opts.get("direct")
    numjobs = opt_int("numjobs") or len(jobs)
    return FioRun(
        version=str(data.get("fio version")), read_iops=iops, read_bytes_per_s=bw,
        read_bytes=int(nbytes), runtime_s=runtime_ms / 1000.0, total_ios=int(ios),
        engine=str(opts["ioengine"]) if "ioengine" in opts else None,
        iodepth=opt_int("iodepth"), numjobs=numjobs, block_bytes=opt_int("bs"),
        direct=None if direct is None else str(direct) not in ("0", "false"), error=error,
    )


def fio_engines(fio: str = "fio") -> tuple[str, ...]:
    """The engines of :data:`FIO_ENGINES` this fio was built with, in preference order."""
    try:
        out = subprocess.run([fio, "--enghelp"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return FIO_ENGINES
    have = {ln.strip() for ln in out.splitlines()}
    return tuple(e for e in FIO_ENGINES if e in have) or FIO_ENGINES


def run_fio(path: str | os.PathLike[str], *, block_bytes: int, queue_depth: int, seconds: float,
            file_bytes: int, direct: bool, engines: Sequence[str] | None = None,
            fio: str | None = None, progress: Progress | None = None
            ) -> tuple[ReadMeasurement, list[str]]:
    """Random reads of ``path`` with fio: the first engine that works, and why others did not.

    Raises :class:`ProfileError` when fio is missing or every engine fails.
    """
    exe = fio or shutil.which("fio")
    if exe is None:
        raise ProfileError("not installed (apt-get install fio)")
    failures: list[str] = []
    for engine in (engines or fio_engines(exe)):
        cmd = fio_command(path, block_bytes=block_bytes, queue_depth=queue_depth, seconds=seconds,
                          file_bytes=file_bytes, direct=direct, engine=engine, fio=exe)
        report(progress, f"fio {engine}: {format_size(block_bytes)} random reads, "
                       f"queue depth {queue_depth}, {seconds:g} s")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            failures.append(f"fio {engine}: no answer within {seconds + 120:.0f} s")
            continue
        except OSError as exc:
            raise ProfileError(f"cannot run fio: {exc.strerror or exc}") from None
        complaint = _fio_complaint(proc.stderr) or _fio_complaint(proc.stdout)
        try:
            run = parse_fio_json(proc.stdout, "fio output")
        except ParseError as exc:
            failures.append(f"fio {engine}: {complaint or exc}")
            continue
        if proc.returncode != 0 or run.error or run.total_ios == 0:
            failures.append(f"fio {engine}: {complaint or f'exit status {proc.returncode}, error {run.error}'}")
            continue
        jobs = (f"{run.numjobs} threads, 1 read each" if engine in ("psync", "sync", "pvsync", "pvsync2")
                else f"1 job, iodepth {run.iodepth or queue_depth}")
        return ReadMeasurement(
            read_bytes_per_s=run.read_bytes_per_s, read_iops=run.read_iops,
            block_bytes=block_bytes, queue_depth=queue_depth, tool=f"fio-{engine}",
            mode="direct" if direct else "buffered", file_bytes=file_bytes,
            seconds=run.runtime_s, jobs=f"{jobs} ({run.version})", date=_now(),
            host=socket.gethostname()), failures
    raise ProfileError("failed with every engine: " + "; ".join(failures))


def _fio_complaint(text: str) -> str | None:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip().startswith("fio:")]
    return " / ".join(dict.fromkeys(lines)) or None


# ---------------------------------------------------------------------------
# Moment's own reader


def posix_random_read(path: str | os.PathLike[str], *, block_bytes: int, queue_depth: int,
                      seconds: float, direct: bool, verify: bool = False,
                      processes: int | None = None, file_bytes: int | None = None
                      ) -> ReadMeasurement:
    """Random reads of ``path`` with Moment's reader (``moment-posix``).

    ``queue_depth`` reads are in flight: ``processes`` worker processes
    (default: the CPUs this process may run on, at most ``queue_depth``)
    each run ``ceil(queue_depth / processes)`` threads issuing one
    ``os.preadv`` at a time into a page-aligned buffer. ``verify`` checks
    every block against the offset header of a file from
    :func:`write_test_file`.
    """
    p = str(path)
    size = file_bytes if file_bytes is not None else _file_size(Path(p))
    nblocks = size // block_bytes
    if nblocks < 1:
        raise ProfileError(f"{p}: smaller than one block of {block_bytes} bytes")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    procs = max(1, min(processes or cpus, queue_depth))
    threads = -(-queue_depth // procs)
    try:
        reads, elapsed = _posixread.run_readers(
            p, direct=direct, block_bytes=block_bytes, nblocks=nblocks, processes=procs,
            threads=threads, seconds=seconds, verify=verify, seed=int(time.time_ns() % 1_000_003))
    except _posixread.ReadError as exc:
        raise ProfileError(f"{p}: {exc}") from None
    iops = reads / elapsed if elapsed > 0 else 0.0
    return ReadMeasurement(
        read_bytes_per_s=iops * block_bytes, read_iops=iops, block_bytes=block_bytes,
        queue_depth=procs * threads, tool="moment-posix", mode="direct" if direct else "buffered",
        file_bytes=nblocks * block_bytes, seconds=round(elapsed, 3),
        jobs=f"{procs} processes x {threads} threads, os.preadv" + (", every block checked" if verify else ""),
        date=_now(), host=socket.gethostname())


def _file_size(p: Path) -> int:
    st = p.stat()
    if stat.S_ISBLK(st.st_mode):
        fd = os.open(p, os.O_RDONLY)
        try:
            return os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)
    return st.st_size


# ---------------------------------------------------------------------------
# SSD random reads


@dataclass(frozen=True)
class SsdMeasurement:
    """Random-read results for one file: one :class:`ReadMeasurement` per tool that ran.

    ``created`` says the test file was written for the test (and ``verified``
    that Moment's reader checked every block it read against it); ``kept``
    that it was left in place; ``mode`` is ``"direct"`` or ``"buffered"``,
    with ``mode_note`` saying why when buffered. ``not_measured`` lists
    tools that did not run, and why.
    """

    path: str
    file_bytes: int
    block_bytes: int
    queue_depth: int
    mode: str
    created: bool
    results: tuple[ReadMeasurement, ...]
    not_measured: tuple[str, ...] = ()
    verified: bool = False
    kept: bool = False
    mode_note: str | None = None

    @property
    def best(self) -> ReadMeasurement:
        """The result with the most reads per second."""
        return max(self.results, key=lambda r: r.read_iops or 0.0)

    def result(self, tool_prefix: str) -> ReadMeasurement | None:
        return next((r for r in self.results if r.tool and r.tool.startswith(tool_prefix)), None)


def _validate(block_bytes: int, queue_depth: int, seconds: float, file_bytes: int | None) -> None:
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes <= 0 \
            or block_bytes % _posixread.SECTOR or block_bytes > MAX_BLOCK_BYTES:
        raise ProfileError(f"block size {block_bytes!r}: expected a multiple of 512 bytes, "
                           f"at most {format_size(MAX_BLOCK_BYTES)}")
    if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) \
            or not 1 <= queue_depth <= MAX_QUEUE_DEPTH:
        raise ProfileError(f"queue depth {queue_depth!r}: expected 1 to {MAX_QUEUE_DEPTH}")
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or not 0 < seconds <= MAX_SECONDS:
        raise ProfileError(f"duration {seconds!r} s: expected more than 0 and at most {MAX_SECONDS:g} s")
    if file_bytes is not None and (not isinstance(file_bytes, int) or file_bytes < block_bytes):
        raise ProfileError(f"file size {file_bytes!r}: expected at least one block ({block_bytes} bytes)")


def ssd_random_read(
    path_or_dir: str | os.PathLike[str],
    block_bytes: int = 4096,
    queue_depth: int = 64,
    seconds: float = 5.0,
    file_bytes: int = DEFAULT_FILE_BYTES,
    *,
    use_fio: bool = True,
    use_own: bool = True,
    direct: bool | None = None,
    keep_file: bool = False,
    processes: int | None = None,
    progress: Progress | None = None,
) -> SsdMeasurement:
    """Random aligned reads of ``block_bytes`` from a file, ``queue_depth`` in flight, for ``seconds``.

    ``path_or_dir`` is a directory (a test file of ``file_bytes`` bytes is
    written there with :func:`write_test_file` and removed afterwards unless
    ``keep_file``), or an existing file or block device (read only, never
    written; ``file_bytes`` is then its size). ``direct=None`` uses O_DIRECT
    when the file system allows it and buffered reads otherwise (say which:
    ``mode``, ``mode_note``); ``True`` requires it, ``False`` refuses it.

    fio runs when ``use_fio`` and it is installed; Moment's own reader when
    ``use_own``. Each runs for ``seconds``; the test file is written first
    (at the device's write speed). Raises :class:`ProfileError` on a bad
    path or parameter, or when no tool could measure.
    """
    _validate(block_bytes, queue_depth, seconds, file_bytes)
    p = Path(path_or_dir)
    created = False
    if p.is_dir():
        report(progress, f"writing a {format_size(file_bytes)} test file in {p}")
        target = write_test_file(p, file_bytes, progress)
        created = True
    elif p.exists():
        target = p
        try:
            st = p.stat()
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
                raise ProfileError(f"{p}: not a directory, regular file or block device")
            file_bytes = _file_size(p)
            with open(p, "rb"):
                pass
        except PermissionError:
            raise ProfileError(f"{p}: not readable") from None
        except OSError as exc:
            raise ProfileError(f"{p}: {exc.strerror or exc}") from None
        if file_bytes < block_bytes:
            raise ProfileError(f"{p}: {file_bytes} bytes, smaller than one block of {block_bytes}")
        file_bytes -= file_bytes % block_bytes
    else:
        raise ProfileError(f"{p}: no such directory or file")

    results: list[ReadMeasurement] = []
    skipped: list[str] = []
    verified = False
    try:
        is_direct, mode_note = _probe_direct(target, block_bytes, direct)
        mode = "direct" if is_direct else "buffered"
        if not is_direct:
            mode_note = (f"{mode_note}; buffered reads may be served from the page cache, "
                         "so the figures are an upper bound unless the file is much larger than memory")
        if use_fio:
            try:
                m, failed = run_fio(target, block_bytes=block_bytes, queue_depth=queue_depth,
                                    seconds=seconds, file_bytes=file_bytes, direct=is_direct,
                                    progress=progress)
                results.append(m)
                skipped.extend(failed)
            except ProfileError as exc:
                skipped.append(f"fio: {exc}")
        else:
            skipped.append("fio: not run (asked not to)")
        if use_own:
            _drop_file_cache(target, file_bytes)
            report(progress, f"moment-posix: {format_size(block_bytes)} random reads, "
                           f"queue depth {queue_depth}, {seconds:g} s")
            try:
                results.append(posix_random_read(
                    target, block_bytes=block_bytes, queue_depth=queue_depth, seconds=seconds,
                    direct=is_direct, verify=created, processes=processes, file_bytes=file_bytes))
                verified = created
            except ProfileError as exc:
                if "not the one written" in str(exc):
                    raise  # wrong data is a failure, not a figure to skip
                skipped.append(f"moment-posix: {exc}")
        if not results:
            raise ProfileError(f"{target}: nothing could be measured: " + "; ".join(skipped))
    finally:
        if created and not keep_file:
            with contextlib.suppress(OSError):
                target.unlink()
    return SsdMeasurement(str(target), file_bytes, block_bytes, queue_depth, mode, created,
                          tuple(results), tuple(skipped), verified, created and keep_file, mode_note)


def _drop_file_cache(path: Path, length: int) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        _drop_cache(fd, length)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# memory


def host_memory_bandwidth(bytes: int = 256 << 20, repeats: int = 5, threads: int = 1) -> float:
    """DRAM bandwidth in bytes/s: the best of ``repeats`` numpy copies of ``bytes`` bytes.

    Counted as the STREAM benchmark's "copy" does: each copy reads
    ``bytes`` and writes ``bytes``, so the figure is ``2 × bytes / time``.
    ``threads`` threads copy a slice each (numpy releases the GIL while
    copying); one thread rarely reaches a socket's full bandwidth. Both
    arrays are written before timing so their pages are in place, and the
    arrays should be well beyond the CPU caches (the default 256 MiB is).

    >>> host_memory_bandwidth(4 << 20, repeats=1) > 0
    True
    """
    import threading

    import numpy as np

    n = int(bytes)
    if n < 4096 or repeats < 1 or threads < 1:
        raise ProfileError("memory test: expected at least 4 KiB, one repeat and one thread")
    src = np.empty(n, dtype=np.uint8)
    src.fill(1)
    dst = np.empty_like(src)
    dst.fill(0)
    bounds = [(n * i // threads) // 4096 * 4096 for i in range(threads)] + [n]
    slices = [(src[a:b], dst[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    best = math.inf
    for _ in range(repeats):
        if len(slices) == 1:
            t0 = time.perf_counter()
            np.copyto(slices[0][1], slices[0][0])
            dt = time.perf_counter() - t0
        else:
            workers = [threading.Thread(target=np.copyto, args=(d, s)) for s, d in slices]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            dt = time.perf_counter() - t0
        best = min(best, dt)
    return 2.0 * n / best


def _cpulist(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def numa_nodes(sys_root: str | os.PathLike[str] = "/sys") -> dict[int, set[int]]:
    """NUMA node number → its CPUs, from sysfs (empty when sysfs has no NUMA information)."""
    base = Path(sys_root) / "devices" / "system" / "node"
    out: dict[int, set[int]] = {}
    if not base.is_dir():
        return out
    for d in sorted(base.glob("node[0-9]*")):
        text = _read_sys(d / "cpulist") or ""
        try:
            out[int(d.name[4:])] = _cpulist(text)
        except ValueError:
            continue
    return out


def memory_bandwidth_by_node(bytes: int = 256 << 20, repeats: int = 5, threads: int | None = None,
                             sys_root: str | os.PathLike[str] = "/sys",
                             progress: Progress | None = None
                             ) -> tuple[list[MemoryCapacity], list[str]]:
    """DRAM bandwidth of each NUMA node, and notes on nodes not measured.

    For each node, the calling thread is pinned to that node's CPUs while
    the arrays are allocated and written (Linux places a page on the node of
    the CPU that first touches it) and copied, then unpinned. ``threads``
    defaults to the node's CPUs this process may use, at most 8. Without
    NUMA information in sysfs, one figure for ``all`` is measured.
    """
    nodes = numa_nodes(sys_root)
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    out: list[MemoryCapacity] = []
    notes: list[str] = []
    host, date = socket.gethostname(), _now()

    def entry(numa: int | None, bw: float, t: int) -> MemoryCapacity:
        return MemoryCapacity(numa, bw, method="numpy-copy", convention="stream-copy",
                              array_bytes=int(bytes), repeats=repeats, threads=t, date=date, host=host)

    if not nodes or allowed is None:
        t = threads or min(8, os.cpu_count() or 1)
        report(progress, f"memory: numpy copy of {format_size(bytes)}, {t} thread(s)")
        out.append(entry(None, host_memory_bandwidth(bytes, repeats, t), t))
        return out, notes
    for numa, cpus in nodes.items():
        usable = cpus & allowed
        if not usable:
            notes.append(f"memory of NUMA node {numa}: not measured: "
                         + ("the node has no CPUs" if not cpus else "none of its CPUs may be used here"))
            continue
        t = threads or min(8, len(usable))
        report(progress, f"memory of NUMA node {numa}: numpy copy of {format_size(bytes)}, {t} thread(s)")
        try:
            os.sched_setaffinity(0, usable)
            bw = host_memory_bandwidth(bytes, repeats, t)
        finally:
            os.sched_setaffinity(0, allowed)
        out.append(entry(numa, bw, t))
    return out, notes


# ---------------------------------------------------------------------------
# CUDA


def props_bus_address(props: Any) -> str | None:
    """The PCI bus address in a CUDA device's properties (PyTorch versions that expose the PCI fields)."""
    dom, bus, dev = (getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if bus is None or dev is None:
        return None
    return f"{int(dom or 0):04x}:{int(bus):02x}:{int(dev):02x}.0"


def _gpu_node(topo: Topology | None, props: Any) -> tuple[str, str | None]:
    """(key to write, topology node id or None) of a CUDA device."""
    addr = props_bus_address(props)
    if addr is None:
        return f"cuda:{getattr(props, 'name', '?')}", None
    node = topo.find(addr) if topo is not None else None
    return (node.id if node is not None else addr), (node.id if node is not None else None)


def gpu_numa_node(bus_address: str | None, topo: Topology | None = None,
                  sys_root: str | os.PathLike[str] = "/sys") -> int | None:
    """The NUMA node (socket memory) a GPU hangs under: sysfs ``numa_node`` of its PCI function, else the topology's.

    >>> gpu_numa_node(None) is None
    True
    """
    if bus_address:
        text = _read_sys(Path(sys_root) / "bus" / "pci" / "devices" / bus_address / "numa_node")
        if text is not None and text.strip().lstrip("-").isdigit() and int(text) >= 0:
            return int(text)
        node = topo.find(bus_address) if topo is not None else None
        if node is not None and node.numa_node is not None:
            return node.numa_node
    return None


@contextlib.contextmanager
def _on_numa_node(numa: int | None, sys_root: str | os.PathLike[str]) -> Iterator[bool]:
    """Run the block on ``numa``'s CPUs (first-touch puts new pages there); yields whether it could."""
    cpus = numa_nodes(sys_root).get(numa, set()) if numa is not None else set()
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    usable = cpus & allowed if allowed is not None else set()
    if not usable:
        yield False
        return
    os.sched_setaffinity(0, usable)
    try:
        yield True
    finally:
        os.sched_setaffinity(0, allowed)


def cuda_bandwidths(topo: Topology | None = None, bytes: int = 256 << 20, repeats: int = 5,
                    progress: Progress | None = None, sys_root: str | os.PathLike[str] = "/sys"
                    ) -> tuple[list[LinkCapacity], PcieEfficiency | None, list[str]]:
    """Host→device, device→host and peer copy bandwidths of every CUDA device.

    Needs PyTorch with CUDA (imported here, not by the planner): without it,
    returns no figures and a note saying why. Host buffers are pinned and
    allocated, page-locked and copied from the GPU's own NUMA node (the socket
    its PCIe link goes to; a buffer on the other socket would measure the
    inter-socket link too); each figure is the best of ``repeats`` copies of
    ``bytes``, timed with CUDA events. The measured protocol efficiency is the
    median over GPUs of host→device bandwidth / the encoded rate of the GPU's
    link (generation × width from ``topo``).
    """
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return [], None, ["host↔GPU and GPU↔GPU links: not measured: PyTorch is not installed"]
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # a broken driver raises assorted errors
        return [], None, [f"host↔GPU and GPU↔GPU links: not measured: CUDA failed ({exc})"]
    if count == 0:
        return [], None, ["host↔GPU and GPU↔GPU links: not measured: no CUDA device"]

    host, date = socket.gethostname(), _now()
    n = int(bytes)
    links: list[LinkCapacity] = []
    notes: list[str] = []
    effs: list[float] = []

    def timed(copy: Callable[[], Any], device: int) -> float:
        best = math.inf
        with torch.cuda.device(device):
            copy()  # warm up
            for _ in range(repeats):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                copy()
                b.record()
                b.synchronize()
                best = min(best, a.elapsed_time(b) / 1000.0)
        return n / best

    keys = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        key, node_id = _gpu_node(topo, props)
        keys.append(key)
        report(progress, f"GPU {i} ({props.name}): host↔device copies of {format_size(n)}")
        numa = gpu_numa_node(props_bus_address(props), topo, sys_root)
        with _on_numa_node(numa, sys_root) as local:
            pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            pinned.fill_(0)  # touched here, on the GPU's node
            dev = torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}")
            h2d = timed(lambda d=dev, p=pinned: d.copy_(p, non_blocking=True), i)
            d2h = timed(lambda d=dev, p=pinned: p.copy_(d, non_blocking=True), i)
        where = (f"pinned host buffer on NUMA node {numa}, the GPU's" if local else
                 "pinned host buffer where the OS put it (the GPU's NUMA node is not known or not usable)")
        if not local:
            notes.append(f"GPU {i}: host↔device copies not pinned to the GPU's socket ({where})")
        for cls, bw in (("host-to-device", h2d), ("device-to-host", d2h)):
            links.append(LinkCapacity(bw, link_class=cls, device=key, transfer_bytes=n,
                                      tool="torch-cuda", date=date, host=host, note=where))
        if topo is not None and node_id is not None:
            parent = topo.parent(node_id)
            lk = topo.link_between(parent.id, node_id) if parent is not None else None
            if lk is not None and lk.pcie_gen and lk.lanes:
                effs.append(min(1.0, h2d / pcie_bytes_per_s(lk.pcie_gen, lk.lanes, 1.0)))
        del pinned, dev
    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            if not torch.cuda.can_device_access_peer(i, j):
                notes.append(f"GPU {i} → GPU {j}: not measured: no peer access")
                continue
            report(progress, f"GPU {i} → GPU {j}: peer copies of {format_size(n)}")
            a = torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}")
            b = torch.empty(n, dtype=torch.uint8, device=f"cuda:{j}")
            bw = timed(lambda a=a, b=b: b.copy_(a, non_blocking=True), i)
            links.append(LinkCapacity(bw, src=keys[i], dst=keys[j], link_class="peer-to-peer",
                                      transfer_bytes=n, tool="torch-cuda", date=date, host=host))
            del a, b
    eff = None
    if effs:
        effs.sort()
        eff = PcieEfficiency(round(effs[len(effs) // 2], 4),
                             derived_from=f"median over {len(effs)} GPU(s) of host-to-device "
                                          "bandwidth / encoded PCIe rate of the GPU's link")
    else:
        notes.append("PCIe protocol efficiency: not measured: no GPU with a known link "
                     "generation and width in the topology")
    return links, eff, notes


# ---------------------------------------------------------------------------
# the whole machine


def _device_key(info: BlockDevice, topo: Topology | None, path: str) -> str:
    if info.pci_address:
        node = topo.find(info.pci_address) if topo is not None else None
        return node.id if node is not None else info.pci_address
    if info.name:
        return f"block:{info.name}"
    return f"path:{path}"


def profile_machine(
    topo: Topology | None = None,
    *,
    ssd_paths: Iterable[str | os.PathLike[str]] = (),
    block_bytes: int = 4096,
    queue_depth: int = 64,
    seconds: float = 5.0,
    file_bytes: int = DEFAULT_FILE_BYTES,
    use_fio: bool = True,
    memory: bool = True,
    memory_bytes: int = 256 << 20,
    memory_repeats: int = 5,
    cuda: bool = True,
    keep_files: bool = False,
    processes: int | None = None,
    progress: Progress | None = None,
    sys_root: str | os.PathLike[str] = "/sys",
) -> Capacities:
    """Measure this machine: SSDs under ``ssd_paths``, memory, and CUDA copies when present.

    Each SSD figure is keyed by the device its path lives on: the topology
    node of the PCI function above the block device when ``topo`` has it,
    else the bus address, else ``block:NAME`` (no PCI parent) or
    ``path:PATH`` (no block device). The figure used is the tool with the
    most reads per second (the device delivers at least that); the other
    tools' figures are kept as ``others``. ``notes`` of the result say what
    was not measured and why. Parameters are those of
    :func:`ssd_random_read`, :func:`memory_bandwidth_by_node` and
    :func:`cuda_bandwidths`.
    """
    _validate(block_bytes, queue_depth, seconds, file_bytes)
    paths = [Path(p) for p in ssd_paths]
    for p in paths:  # fail before spending minutes on the first path
        if not p.exists():
            raise ProfileError(f"{p}: no such directory or file")
    notes: list[str] = []
    devices: dict[str, DeviceCapacity] = {}
    if not paths:
        notes.append("SSDs: not measured: no path given (name a directory on each SSD: --ssd PATH)")
    for p in paths:
        info = block_device_of(p, sys_root)
        key = _device_key(info, topo, str(p))
        m = ssd_random_read(p, block_bytes, queue_depth, seconds, file_bytes, use_fio=use_fio,
                            direct=None, keep_file=keep_files, processes=processes,
                            progress=progress)
        notes.extend(f"{p}: {n}" for n in info.notes)
        notes.extend(f"{p}: {n}" for n in m.not_measured)
        if m.mode_note:
            notes.append(f"{p}: {m.mode_note}")
        if m.kept:
            notes.append(f"{p}: test file kept at {m.path}")
        best = m.best
        others = tuple(r for r in m.results if r is not best)
        old = devices.get(key)
        if old is not None:
            allm = [*old.measurements(), *m.results]
            best = max(allm, key=lambda r: r.read_iops or 0.0)
            others = tuple(r for r in allm if r is not best)
        devices[key] = DeviceCapacity(key, best, model=info.model, block_device=info.name,
                                      path=str(p), others=others)
    mem: list[MemoryCapacity] = []
    if memory:
        mem, mem_notes = memory_bandwidth_by_node(memory_bytes, memory_repeats, sys_root=sys_root,
                                                  progress=progress)
        notes.extend(mem_notes)
    else:
        notes.append("memory: not measured (asked not to)")
    links: list[LinkCapacity] = []
    eff = None
    if cuda:
        links, eff, cuda_notes = cuda_bandwidths(topo, progress=progress, sys_root=sys_root)
        notes.extend(cuda_notes)
    else:
        notes.append("host↔GPU and GPU↔GPU links: not measured (asked not to)")
    if eff is None:
        notes.append("PCIe links: not measured (that needs host-to-device copies to a GPU); "
                     "their figures stay generation x width x the default efficiency")
    if topo is not None and topo.links("inter-socket"):
        notes.append("inter-socket links: not measured; the table or spec figure stays")
    if topo is not None and topo.nodes(NodeKind.NVME) and not paths:
        notes.append(f"the topology has {len(topo.nodes(NodeKind.NVME))} NVMe device(s); "
                     "none was measured")
    return Capacities(devices=tuple(devices.values()), links=tuple(links), memory=tuple(mem),
                      pcie_efficiency=eff, host=socket.gethostname(), date=_now(),
                      tool=_tool_name(), notes=tuple(notes))


def _tool_name() -> str:
    try:
        from moment import __version__
    except ImportError:  # the planner used without the moment package
        return "planner.profile"
    return f"moment {__version__} (planner.profile)"

