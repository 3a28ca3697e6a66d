"""I/O benchmarks behind ``moment bench io``: raw random row reads against fio, and the gather stream.

Library functions: they return frozen results and never print; ``progress``
gets one-line messages.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iostack.backends.base import aligned_empty
from iostack.backends.posix import PosixBackend
from iostack.bins import PAGE, file_bytes_for, open_bin, write_bin_file
from iostack.errors import StoreError
from iostack.placement import Bin
from momentbase.units import format_size
from planner.progress import Progress


@dataclass(frozen=True)
class RawRun:
    """One engine in one round of ``raw``: its random-read IOPS and fio's of the same round, same file, block size
    and depth."""

    fio_iops: float
    fio_engine: str
    ours_iops: float
    ours_engine: str
    fio_first: bool = True
    round: int = 0

    @property
    def ratio(self) -> float:
        return self.ours_iops / self.fio_iops if self.fio_iops else float("nan")

    @property
    def engine(self) -> str:
        """Our read engine (``uring``, ``aio``, ``threads``)."""
        return self.ours_engine.rpartition("-")[2]


@dataclass(frozen=True)
class RawResult:
    path: str
    file_bytes: int
    row_bytes: int
    queue_depth: int
    direct: bool
    runs: tuple[RawRun, ...]
    buffer_bytes: int
    peak_rss_bytes: int

    def by_engine(self) -> dict[str, list[RawRun]]:
        """The runs of each of our engines, in the order the engines were measured."""
        out: dict[str, list[RawRun]] = {}
        for r in self.runs:
            out.setdefault(r.engine, []).append(r)
        return out

    def fastest(self) -> str:
        """The engine with the highest median ratio to fio (ratios, not IOPS: each is paired with
        the fio of its own round, which cancels the load of that moment)."""
        return max(self.by_engine().items(), key=lambda kv: statistics.median(r.ratio for r in kv[1]))[0]


def bench_file(directory: str | os.PathLike[str], file_bytes: int, row_bytes: int = PAGE,
               progress: Progress | None = None) -> tuple[Path, Bin]:
    """A bin file of random rows (``file_bytes`` of them) in ``directory``, reused when already there.

    Before writing, the directory must have room for the whole file; while writing, ``progress``
    hears ``"writing the test file"`` once per block; an interrupted write (Ctrl-C, an error)
    leaves nothing behind (the file appears under its name only when whole).

    Raises
    ------
    StoreError
        ``directory`` has not room for the file (naming both sizes), or the write failed.
    """
    rows = max(1, file_bytes // row_bytes)
    name = f"moment-bench-{rows}x{row_bytes}.dat"
    b = Bin(0, "ssd", rows, path=name)
    path = Path(directory) / name
    try:
        open_bin(directory, b, min_rows=rows)
        return path, b
    except StoreError:
        pass
    need = file_bytes_for(rows, row_bytes)
    # a stale copy (too short, or a killed run's temporary file) is replaced: its bytes come back
    have = sum(p.stat().st_size for p in (path, path.with_name(path.name + ".tmp")) if p.is_file())
    free = shutil.disk_usage(directory).free + have
    if need > free:
        raise StoreError(f"`file_bytes` {format_size(need)}: {directory} has {format_size(free)} free for the test "
                         "file; pass a smaller size (larger than the page cache is enough) or another directory")
    rng = np.random.default_rng()

    def told(stage: str, done: int, total: int | None) -> None:
        if progress is not None:
            progress("writing the test file (MiB)", done * row_bytes >> 20, total and total * row_bytes >> 20)

    try:  # real random bytes: a sparse or constant file would not touch the device
        write_bin_file(path, 0, np.uint8, row_bytes, rows,
                       lambda a, z: rng.integers(0, 256, (z - a, row_bytes), dtype=np.uint8), progress=told)
    except BaseException:  # Ctrl-C included: no partial file stays behind (write_bin_file keeps it on those)
        for p in (path.with_name(path.name + ".tmp"), path.with_name(path.name + ".tmp.json")):
            p.unlink(missing_ok=True)
        raise
    return path, b


def _ours(backend: PosixBackend, handle, rows: int, seconds: float, batch: int) -> float:
    rng = np.random.default_rng()
    out = aligned_empty(batch, handle.info.row_bytes)
    # Fault the buffer in before the clock starts. FeatureStore.gather reads into a freed
    # result's buffer (AlignedPool), already resident, and fio's buffers exist before its
    # runtime counts; a fresh 256 MiB buffer instead page-faults inside the first reads
    # (transparent huge pages compacting): that alone cost ours 20-40% of a 3-5 s run here.
    out.fill(0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        backend.read_rows(handle, rng.integers(0, rows, batch), out)
        n += batch
    return n / (time.perf_counter() - t0)


def available_engines() -> tuple[str, ...]:
    """Our asynchronous engines that work on this machine (``uring``, ``aio``), or ``("threads",)``."""
    from iostack.backends import _aio, _uring

    found = tuple(name for name, mod in (("uring", _uring), ("aio", _aio)) if mod.available() is None)
    return found or ("threads",)


def bench_raw(directory: str | os.PathLike[str], *, file_bytes: int = 4 << 30, row_bytes: int = PAGE,
              queue_depth: int = 64, seconds: float = 5.0, runs: int = 3, batch: int = 65536,
              engine: str | Sequence[str] = "auto", pause_s: float = 1.0,
              progress: Progress | None = None) -> RawResult:
    """Random ``row_bytes`` reads of one bin file: fio (io_uring, else libaio/psync) and ours, alternating.

    Same file, block size (= row size, page-aligned), total queue depth, and
    O_DIRECT when the file system allows it (buffered otherwise, for both).
    Each round pairs each of our ``engine`` (a name, several, or ``"all"``: every
    engine that works here) with a fio run of its own, back to back, so each ratio
    compares the same moment of a noisy machine; who goes first alternates, the
    engines' order rotates, and each tool starts after the same ``pause_s`` of idle
    device, so no side gets a throttled cloud disk's refilled burst more often. ``ours`` is the same
    :meth:`PosixBackend.read_rows` that :class:`~iostack.store.FeatureStore`
    calls for its SSD bins (batches of ``batch`` random rows).

    ``batch`` defaults to 65,536 rows per call: one training mini-batch
    (8,000 seeds, fan-outs 25 and 10) gathers about 300,000 rows, so the SSD
    tier's share of one gather is of that order or larger; smaller calls pay
    the queue's ramp-up and drain once per call.
    """
    from planner.errors import ProfileError
    from planner.fio import run_fio

    engines = available_engines() if engine == "all" else (engine,) if isinstance(engine, str) else tuple(engine)
    path, b = bench_file(directory, file_bytes, row_bytes, progress)
    info = open_bin(directory, b)
    backends = {e: PosixBackend(queue_depth=queue_depth, engine=e) for e in engines}  # the store's buffer sizes
    try:
        handles = {e: be.open(info) for e, be in backends.items()}
        direct = all(h.direct for h in handles.values())
        out = []
        for i in range(runs):
            # Each engine is paired with a fio run of its own, back to back, alternating who goes
            # first, and the engines' order rotates: whoever runs right after another tool (or
            # an idle gap) meets the device in a state the other left (a throttled cloud disk's
            # refill), so every engine must sit in every position equally often. Each tool rests
            # the device the same pause before it.
            for e in engines[i % len(engines):] + engines[:i % len(engines)]:
                fio_first = (i + engines.index(e)) % 2 == 0  # each engine: fio first every other round
                res: dict[str, float] = {}
                fio = None
                for tool in (("fio", e) if fio_first else (e, "fio")):
                    time.sleep(pause_s)
                    if progress:
                        name = "fio" if tool == "fio" else f"ours ({backends[e].engine_of(handles[e])})"
                        progress(f"run {i + 1}/{runs}: {name}", 0, None)
                    if tool == "fio":
                        try:
                            fio, _ = run_fio(path, block_bytes=info.row_stride_bytes, queue_depth=queue_depth,
                                             seconds=seconds, file_bytes=info.file_bytes, direct=direct)
                        except ProfileError as exc:
                            raise StoreError(f"fio: {exc}") from None
                        res["fio"] = fio.read_iops
                    else:
                        res[e] = _ours(backends[e], handles[e], info.rows, seconds, batch)
                assert fio is not None
                out.append(RawRun(res["fio"], fio.tool, res[e], f"moment-posix-{backends[e].engine_of(handles[e])}",
                                  fio_first, i))
        be0 = backends[engines[0]]
        return RawResult(str(path), info.file_bytes, info.row_bytes, be0.queue_depth, direct, tuple(out),
                         be0.buffer_bytes, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    finally:
        for be in backends.values():
            be.close()


@dataclass(frozen=True)
class GatherResult:
    """The gather stream without training, DLIO-style."""

    batches: int
    rows: int
    seconds: float
    rows_per_s: float
    bytes_per_s: float
    tier_share: dict[str, float]
    latency_p50_s: float
    latency_p99_s: float
    memory_bytes: dict[str, int]
    direct: bool


def zipf_ids(num_vertices: int, size: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """``size`` vertex ids, hot-skewed: id ``k`` drawn with weight ``1/(k+1)**alpha`` (vertex 0 hottest)."""
    w = 1.0 / np.arange(1, num_vertices + 1) ** alpha
    cdf = np.cumsum(w)
    return np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1]), num_vertices - 1).astype(np.int64)


def bench_gather(store, *, batch: int = 8192, seconds: float = 5.0, alpha: float = 1.0,
                 ids: np.ndarray | None = None, seed: int = 0, progress: Progress | None = None) -> GatherResult:
    """Gather batches of hot-skewed ids (or successive slices of ``ids``) for ``seconds``.

    ``progress`` hears ``("gathering", elapsed ms, seconds in ms)`` after each batch."""
    import torch

    rng = np.random.default_rng(seed)
    store.reset_stats()
    lat = []
    n = k = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if ids is not None:
            a = (k * batch) % max(1, ids.size)
            b_ids = ids[a:a + batch]
        else:
            b_ids = zipf_ids(store.num_vertices, batch, alpha, rng)
        t1 = time.perf_counter()
        store.gather(torch.from_numpy(b_ids))
        store.memory.host_wait(store.memory.mark())  # on a GPU: done, not just queued
        lat.append(time.perf_counter() - t1)
        n += b_ids.size
        k += 1
        if progress is not None:
            progress("gathering (ms)", min(int((time.perf_counter() - t0) * 1e3), int(seconds * 1e3)),
                     int(seconds * 1e3))
    dt = time.perf_counter() - t0
    share = {t: v["share"] for t, v in store.tier_stats().items()}
    p50, p99 = np.percentile(lat, [50, 99]).tolist()
    return GatherResult(k, n, dt, n / dt, n * store.row_bytes / dt, share, p50, p99,
                        store.memory_bytes(), all(d for d, _ in store.direct_io().values()))
