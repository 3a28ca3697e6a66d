"""Reads into GPU memory by each read backend: the figures ``--backend auto`` chooses by (``moment profile``).

:func:`bench_device_reads` reads random rows of one bin file into GPU memory
through the feature store, once per backend, runs alternating;
:func:`add_device_read_figures` adds them to a :class:`planner.capacities.Capacities`
as other measurements of each SSD, where :func:`iostack.backends.choose_backend`
finds them. Needs CUDA; without it the figures are left out, with a note.
"""

from __future__ import annotations

import os
import time

import numpy as np

from iostack.bench.io import bench_file
from iostack.bins import PAGE
from iostack.errors import StoreError
from planner.progress import Progress


def bench_device_reads(directory: str | os.PathLike[str], device: str = "cuda", *,
                       backends: tuple[str, ...] | None = None, file_bytes: int = 1 << 30,
                       row_bytes: int = PAGE, seconds: float = 3.0, batch: int = 65536, runs: int = 3,
                       keep_file: bool = False, progress: Progress | None = None) -> tuple[list, list[str]]:
    """Random rows of one bin file read into GPU memory by each backend, through the feature store.

    What ``--backend auto`` compares (:func:`iostack.backends.choose_backend`):
    ``posix`` reads into pinned host memory and copies up once, ``kvikio``
    reads into device memory. Runs alternate between backends (the median of
    ``runs`` is kept); every timed gather ends with a device synchronisation.
    Returns :class:`planner.capacities.ReadMeasurement` figures (tools
    :data:`~iostack.backends.TOOL_POSIX_TO_GPU`,
    :data:`~iostack.backends.TOOL_KVIKIO_TO_GPU`) and notes on what was not
    measured. Needs CUDA.
    """
    import statistics

    import torch

    from iostack.backends import READ_BACKENDS, tool_to_gpu
    from iostack.pagecache import drop as drop_page_cache
    from iostack.pagecache import resident_share
    from iostack.placement import Placement
    from iostack.store import FeatureStore
    from planner.capacities import ReadMeasurement

    if not torch.cuda.is_available():
        return [], ["reads into GPU memory (posix vs kvikio, what --backend auto compares): not measured: "
                    "no CUDA device"]
    path, b = bench_file(directory, file_bytes, row_bytes, progress)
    rows = b.capacity_rows
    p = Placement((b,), np.zeros(rows, np.int16), np.arange(rows))
    stores, notes = {}, []
    for name in READ_BACKENDS.names() if backends is None else backends:
        try:
            stores[name] = FeatureStore(p, directory, backend=name, device=device)
        except StoreError as exc:
            notes.append(f"{path}: reads into GPU memory with {name}: not measured: {exc}")
    rates: dict[str, list[float]] = {n: [] for n in stores}
    resident: list[float | None] = []  # share of the file in the page cache just before each batch
    rng = np.random.default_rng()
    try:
        for run in range(runs):
            for name in (list(stores) if run % 2 == 0 else list(reversed(stores))):
                s = stores[name]
                if progress:
                    progress(f"reads into {device}, run {run + 1}/{runs}: {name}", 0, None)
                n, busy, t0 = 0, 0.0, time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    # cold for every batch: a buffered reader (KvikIO's compatibility mode) would
                    # otherwise be timed on the page cache while O_DIRECT reads the SSD
                    drop_page_cache(path)
                    resident.append(resident_share(path))
                    t1 = time.perf_counter()
                    s.gather(rng.integers(0, rows, batch))
                    s.memory.host_wait(s.memory.mark())  # the rows are on the device, not just queued
                    busy += time.perf_counter() - t1
                    n += batch
                rates[name].append(n / busy)
        out = []
        known = [r for r in resident if r is not None]
        cache = (f"page cache dropped before every batch (at most {max(known):.1%} of the file resident then)"
                 if known else "page cache dropped before every batch (residency not known)")
        for name, s in stores.items():
            direct, note = next(iter(s.direct_io().values()))
            rps = statistics.median(rates[name])
            out.append(ReadMeasurement(rps * row_bytes, rps, row_bytes, getattr(s.backend, "queue_depth", None)
                                       or getattr(s.backend, "threads", None),
                                       tool_to_gpu(name),
                                       "direct" if direct else "buffered", int(b.capacity_rows * row_bytes),
                                       seconds, note=f"into {device}, batches of {batch} random rows, median of "
                                                     f"{runs} runs; {cache}" + (f"; {note}" if note else ""),
                                       page_cache="cold"))
        return out, notes
    finally:
        for s in stores.values():
            s.close()
        if not keep_file:
            path.unlink(missing_ok=True)


def add_device_read_figures(caps, ssd_paths, *, progress: Progress | None = None, **options):
    """``caps`` (a :class:`planner.capacities.Capacities` of ``moment profile``) with
    :func:`bench_device_reads` figures added to each measured SSD path's device (as other measurements)."""
    from dataclasses import replace

    devices, notes = list(caps.devices), list(caps.notes)
    for p in ssd_paths:
        figures, why = bench_device_reads(p, progress=progress, **options)
        notes.extend(why)
        for i, d in enumerate(devices):
            if d.path == str(p) and figures:
                devices[i] = replace(d, others=(*d.others, *figures))
        if not figures:
            break  # no CUDA: said once
    return replace(caps, devices=tuple(devices), notes=tuple(dict.fromkeys(notes)))


__all__ = ["add_device_read_figures", "bench_device_reads"]
