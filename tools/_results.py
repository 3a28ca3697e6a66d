"""Machine-readable figures of a benchmark run, for ``tools/bench_all.py`` (not imported by the packages).

Every benchmark prints its own table for a reader and, with ``--json PATH``,
writes the same figures as rows: what was measured, ours, the reference
measured in the same run, the ratio and which way is better. ``bench_all``
collects them into one table.

Every ``--json`` also carries the run's environment (:func:`environment`,
written by :func:`write`): the load when the benchmark started (this module
is imported first thing) and when it wrote, the cores it may use, the thread
settings, the versions, moment's commit, and whether numba's kernel cache was
warm at the start, so a figure can be re-measured under the same conditions
and compared. :class:`CpuMeter` measures CPU time against wall time around a
piece of work, with the time its threads waited for a core
(``/proc/<pid>/task/*/schedstat``): a CPU/wall ratio near 1 on 2 cores is
either serial work or a busy machine, and the wait says which.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: below this CPU/wall ratio on 2 or more cores, parallel work did not use the cores it had
PARALLEL_MIN = 1.6


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _kernel_cache_state() -> dict:
    """Whether numba's on-disk cache holds the placement's kernels (:data:`planner.compiled.KERNELS`),
    read from the index files' names and times without importing numba (the parent of a
    benchmark's forked children must not, see tools/bench_ddak.py; the library's exact check is
    :func:`planner.compiled.cache_state`). Where numba looks: ``NUMBA_CACHE_DIR`` if set, else
    ``__pycache__`` beside the source, else the user's cache dir (``~/.cache/numba``)."""
    from planner import compiled

    KERNELS = compiled.KERNELS
    src = Path(compiled.__file__).with_name("_kernels.py")  # where numba keys its cache
    try:
        mtime = src.stat().st_mtime
    except OSError:
        return {"state": "unknown", "why": f"{src} not readable"}
    user = os.environ.get("NUMBA_CACHE_DIR")
    dirs = [Path(user)] if user else [src.parent / "__pycache__",
                                      Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "numba"]
    for d in dirs:
        # an index older than the source is stale: numba recompiles
        names = {p.name.split(".")[1].split("-")[0] for p in (d.rglob("_kernels.*.nbi") if d.is_dir() else [])
                 if p.stat().st_mtime >= mtime}
        cached = sum(k in names for k in KERNELS)
        if cached:
            return {"state": "warm" if cached == len(KERNELS) else "partly warm", "dir": str(d),
                    "kernels_cached": cached, "kernels": len(KERNELS)}
    return {"state": "cold (the first placement compiles)", "dir": str(dirs[0]), "kernels_cached": 0,
            "kernels": len(KERNELS)}


def _cpu_with_children_s() -> float:
    """User + system CPU seconds of this process and of its children that have been waited for."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


# taken when a benchmark imports this module, i.e. as it starts
_AT_START = {"load": _loadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
             "numba_cache": _kernel_cache_state(), "t": time.perf_counter(), "cpu_s": _cpu_with_children_s()}


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("numpy", "scipy", "torch", "numba", "torch_geometric", "dgl"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _commit() -> str | None:
    """moment's git commit, with "+changes" when the work tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+changes" if dirty else "")) or None


def _threads() -> dict:
    """The thread settings: the environment variables, and the libraries' own where already imported
    (importing torch or numba only to ask would slow every benchmark)."""
    out: dict = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
                                                 "NUMBA_THREADING_LAYER", "NUMBA_CACHE_DIR")}
    if "torch" in sys.modules:
        out["torch"] = sys.modules["torch"].get_num_threads()
    if "numba" in sys.modules:
        numba = sys.modules["numba"]
        out["numba"] = numba.get_num_threads()
        try:
            out["numba_layer"] = numba.threading_layer()
        except ValueError:  # no parallel kernel has run in this process (it may have in a child)
            out["numba_layer"] = None
    return out


def environment() -> dict:
    """Where and under what conditions the figures were measured: load (1, 5, 15 min) when the
    benchmark started and now, cores, thread settings, versions, moment's commit, whether the
    compiled kernels' cache was warm at the start (``numba_cache_at_start``), and the run's wall
    and CPU time so far (``run``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    wall = time.perf_counter() - _AT_START["t"]
    cpu = _cpu_with_children_s() - _AT_START["cpu_s"]
    return {"load_before": _AT_START["load"], "load_after": _loadavg(), "started": _AT_START["date"],
            "cores": cores, "cpu_count": os.cpu_count(), "threads": _threads(), "versions": _versions(),
            "commit": _commit(), "numba_cache_at_start": _AT_START["numba_cache"],
            # the whole run, children waited for included: its own figures say which parts are parallel
            "run": {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                    "cores_used": round(cpu / wall, 3) if wall > 0 else None}}


@dataclass(frozen=True)
class CpuUse:
    """CPU time against wall time over a piece of work: ``cpu_s`` user + system of the process;
    ``wait_s`` the time its threads were ready to run but waited for a core (other processes
    had it) and ``busiest_thread_s`` the CPU time of its busiest thread, both over the threads
    alive at the end; ``cores`` the cores it could use."""

    wall_s: float
    cpu_s: float
    wait_s: float
    busiest_thread_s: float
    cores: int

    @property
    def cores_used(self) -> float:
        """CPU/wall: how many cores the work kept busy on average."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def spread(self) -> float:
        """CPU time over the busiest thread's: how many cores the work could keep busy on a quiet
        machine (2.0: two threads shared it evenly; 1.0: one thread did it all), which the load hardly
        changes."""
        return self.cpu_s / self.busiest_thread_s if self.busiest_thread_s > 0 else 1.0

    def line(self) -> str:
        return (f"CPU {self.cpu_s:.1f} s / wall {self.wall_s:.1f} s = {self.cores_used:.2f} of {self.cores} "
                f"cores; spread over threads {self.spread:.2f}; waited for a core {self.wait_s:.1f} s "
                f"(load {', '.join(map(str, _loadavg()))})")

    def warning(self, what: str) -> str | None:
        """A line starting "WARNING" when parallel work ``what`` kept fewer than :data:`PARALLEL_MIN`
        cores busy with 2 or more to use, naming the likely cause; None otherwise."""
        if self.cores < 2 or self.cores_used >= PARALLEL_MIN:
            return None
        if self.spread < PARALLEL_MIN:
            why = f"its busiest thread did {1 / self.spread:.0%} of the CPU work: much of it ran on one thread"
        else:
            why = (f"the work was spread over threads ({self.spread:.2f}) but they waited {self.wait_s:.1f} s "
                   "for a core: the machine was busy, re-measure on a quiet one")
        return f"WARNING: {what} kept {self.cores_used:.2f} of {self.cores} cores busy (< {PARALLEL_MIN}); {why}"


def _schedstat() -> dict[str, tuple[int, int]]:
    """Per live thread of this process: (ns on a CPU, ns waiting on a run queue); empty without schedstat."""
    out = {}
    for t in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                run, wait = f.read().split()[:2]
            out[t] = (int(run), int(wait))
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue
    return out


class CpuMeter:
    """``with CpuMeter() as m: work()`` then ``m.use``: a :class:`CpuUse` of the work (this process only:
    run it in the process that does the work, e.g. a benchmark's forked child)."""

    def __enter__(self) -> CpuMeter:
        self._t = time.perf_counter()
        self._cpu = self._cpu_s()
        self._sched = _schedstat()
        return self

    @staticmethod
    def _cpu_s() -> float:
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime

    def __exit__(self, *exc: object) -> None:
        wall, cpu, now = time.perf_counter() - self._t, self._cpu_s() - self._cpu, _schedstat()
        before = self._sched
        runs = [r - before.get(t, (0, 0))[0] for t, (r, _) in now.items()]
        wait = sum(w - before.get(t, (0, 0))[1] for t, (_, w) in now.items())
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.use = CpuUse(wall, cpu, max(0.0, wait / 1e9), max(runs, default=0) / 1e9, cores)


@dataclass(frozen=True)
class Figure:
    """One comparison. ``ratio`` is ours/reference when ``higher_is_better`` else reference/ours,
    so a ratio above 1 always means ours is better; ``target`` is what the issue asks of the ratio
    (or of ``ours`` when there is no reference), free text."""

    bench: str
    figure: str
    unit: str
    ours: float
    reference: float | None
    reference_name: str
    higher_is_better: bool = True
    target: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.reference is None or not self.ours or not self.reference:
            return None
        return self.ours / self.reference if self.higher_is_better else self.reference / self.ours


def _gpu() -> str | None:
    """The first CUDA device's name, or None (no GPU, or no torch)."""
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # a broken driver: no GPU figure then either
        return None


def machine() -> dict:
    """Where the figures came from (``gpu``: the CUDA device's name, None without one)."""
    return {"host": socket.gethostname(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "gpu": _gpu()}


def write(path: str | os.PathLike[str] | None, bench: str, figures: list[Figure], command: str,
          skipped: str | None = None) -> None:
    """Write ``figures`` to ``path`` (nothing when ``path`` is None), atomically; ``skipped``: why there are none."""
    if path is None:
        return
    data = {"bench": bench, "command": command, "machine": machine(), "environment": environment(),
            "figures": [asdict(f) | {"ratio": f.ratio} for f in figures]}
    if skipped:
        data["skipped"] = skipped
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, p)


def drop_from_page_cache(paths: list[Path]) -> None:
    """Evict these files' clean pages from the page cache (``posix_fadvise DONTNEED``): a cold start for them
    alone; the machine is shared, so no global ``drop_caches``."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
