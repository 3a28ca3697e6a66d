"""The training I/O stream as a benchmark: replay a workload's reads through the tiered store.

What DLIO and the h5bench AI-I/O extension do for deep-learning training in general,
for GNN feature reads: a :class:`Workload` names the data (the tiers of a ``moment
place`` placement, or one synthetic SSD bin), the access stream (recorded from the
real sampler, or uniform / Zipf ids), an emulated compute time per step, reader
processes, prefetch depth, checkpoint writes and epochs. :func:`emulate` replays it
and returns an :class:`EmulateResult`: throughput, per-tier rows / bytes / read
requests per second, gather latency p50/p99, the I/O-wait share, and accelerator
utilisation as DLIO defines it (compute time / step time).

The replay is the trainer's pipeline without the model: a background thread gathers
the next ``prefetch`` steps' rows (:meth:`~iostack.store.FeatureStore.gather`, the
trainer's own call) while the main thread "computes" by sleeping the step's compute
time; a step waits for its rows (the I/O wait), computes, and every ``every_steps``
writes a checkpoint of ``bytes`` (fsync'ed, as the trainer's). With the sampling
time of a measured run (``compute.from_metrics``) the preparing thread also spends
each step's sampling time, so a recorded stream replays what ``moment train`` did.
Several readers are separate processes, each with its own store, taking steps
``r, r + R, ...`` (a data-parallel rank's share).

The workload file is YAML (``docs/emulate.md``)::

    name: sage-on-skewed
    data: {placement: /data/place}          # or {synthetic: {rows: 1e6, row_bytes: 4096, dir: /ssd}}
    stream: {kind: zipf, exponent: 1.1, rows_per_step: 65536, steps: 200, seed: 0}
    compute: {seconds_per_step: 0.05}      # or {from_metrics: metrics.jsonl}
    readers: 1
    prefetch: 2
    epochs: 1
    checkpoint: {bytes: 256MiB, every_steps: 100, dir: /ssd/ckpt}

>>> from iostack.bench.workload import workload_from_dict
>>> w = workload_from_dict({"data": {"synthetic": {"rows": 1000, "row_bytes": 4096, "dir": "/tmp"}},
...                         "stream": {"kind": "uniform", "rows_per_step": 64, "steps": 3}})
>>> w.stream.kind, w.compute.seconds_per_step, w.readers
('uniform', 0.0, 1)
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iostack.bench.workload import CheckpointSpec, ComputeSpec, StreamSpec, Workload, WorkloadError
from iostack.errors import StoreError
from momentbase.jsontypes import JsonObject, JsonValue
from planner.progress import Progress

#: latency samples each reader returns (a uniform subsample beyond this)
_LATENCY_SAMPLES = 4096


def save_stream(path: str | os.PathLike[str], batches: list[np.ndarray], sample_s: list[float] | None = None,
                meta: Mapping[str, JsonValue] | None = None) -> Path:
    """Write a recorded stream: the row ids each step reads (``batches``), optionally each step's sampling time."""
    p = Path(path)
    ids = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    offsets = np.zeros(len(batches) + 1, np.int64)
    np.cumsum([b.size for b in batches], out=offsets[1:])
    arrays = {"ids": ids.astype(np.int64), "offsets": offsets,
              "meta": np.frombuffer(json.dumps(dict(meta or {})).encode(), np.uint8)}
    if sample_s is not None:
        arrays["sample_s"] = np.asarray(sample_s, np.float64)
    tmp = p.with_name(f".{p.name}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, p)
    return p


@dataclass(frozen=True)
class Stream:
    """Row ids per step (``ids[offsets[s]:offsets[s + 1]]``), and each step's sampling time if recorded."""

    ids: np.ndarray
    offsets: np.ndarray
    sample_s: np.ndarray | None = None

    @property
    def steps(self) -> int:
        return int(self.offsets.size - 1)

    def step(self, s: int) -> np.ndarray:
        return self.ids[self.offsets[s]:self.offsets[s + 1]]


def make_stream(spec: StreamSpec, num_rows: int) -> Stream:
    """The stream ``spec`` describes over ``num_rows`` rows (a recorded one is checked against it)."""
    if spec.kind == "recorded":
        try:
            z = np.load(spec.path, allow_pickle=False)
            ids, offsets = z["ids"], z["offsets"]
            sample_s = z["sample_s"] if "sample_s" in z.files else None
        except (OSError, KeyError, ValueError) as exc:
            raise WorkloadError(f"stream.path {spec.path}: not a recorded stream ({exc}); "
                                "record one with `training.stream.record_stream`") from None
        if ids.size and (ids.min() < 0 or ids.max() >= num_rows):
            raise WorkloadError(f"stream.path {spec.path}: ids reach {int(ids.max())}, the data has {num_rows} rows; "
                                "record the stream on this dataset")
        return Stream(ids, offsets, sample_s)
    rng = np.random.default_rng(spec.seed)
    n = spec.rows_per_step * spec.steps
    if spec.kind == "uniform":
        ids = rng.integers(0, num_rows, n, dtype=np.int64)
    else:
        from iostack.bench.io import zipf_ids

        # a random relabelling: the hot ids are spread over the file, as a real graph's are
        perm = rng.permutation(num_rows)
        ids = perm[zipf_ids(num_rows, n, spec.exponent, rng)]
    return Stream(ids, np.arange(0, n + 1, spec.rows_per_step, dtype=np.int64))


def _metrics_records(path: str | os.PathLike[str]) -> list[JsonObject]:
    """The JSON records of a ``moment train`` metrics file (lines that are not JSON skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise WorkloadError(f"compute.from_metrics {path}: {exc.strerror or exc}") from None
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def metrics_times(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (compute + all-reduce, sampling) seconds of the first epoch in a ``moment train`` metrics file."""
    rows = [(r.get("epoch", 0), r["step"], r["compute_s"] + r.get("allreduce_s", 0.0), r["sample_s"])
            for r in _metrics_records(path) if r.get("kind") == "step"]
    if not rows:
        raise WorkloadError(
            f"compute.from_metrics {path}: no step records; give a training run's metrics file (`metrics_path`)"
        )
    first = min(e for e, *_ in rows)
    rows = sorted(r for r in rows if r[0] == first)
    return np.array([r[2] for r in rows]), np.array([r[3] for r in rows])


def metrics_device(path: str | os.PathLike[str]) -> str | None:
    """The training device (``cpu``, ``cuda:0``) of a ``moment train`` metrics file's start record, if any."""
    return next((str(r["device"]) for r in _metrics_records(path) if r.get("kind") == "start" and r.get("device")),
                None)


def compute_on(spec: ComputeSpec) -> str:
    """``host`` or ``device``: ``spec.on``, with ``auto`` resolved (``host`` for a CPU run's metrics)."""
    if spec.on != "auto":
        return spec.on
    dev = metrics_device(spec.from_metrics) if spec.from_metrics else None
    return "host" if dev is not None and dev.split(":")[0] == "cpu" else "device"


class _HostWork:
    """Busy host time standing in for a CPU run's compute and sampling (``compute.on: host``).

    A CPU training step is a few large multi-threaded kernels (the layers' matrix
    products over every sampled row, their backward passes): it keeps all of
    torch's intra-op threads busy, and the gather shares the cores with it. So
    the emulated compute runs matrix products on those threads (this process's
    torch default, the trainer's too) for the step's measured compute time, in
    short kernels (~0.1-1 ms, released GIL) so it ends within a kernel of it.
    Sampling (index arithmetic on one thread) is emulated by one thread of
    element-wise numpy work, which also releases the GIL.
    """

    def __init__(self) -> None:
        import torch

        self._torch = torch
        g = torch.Generator().manual_seed(0)
        self._a, self._b = torch.rand(256, 256, generator=g), torch.rand(256, 256, generator=g)
        self._c = torch.empty(256, 256)
        self._v = np.zeros(1 << 16)

    def compute(self, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self._torch.mm(self._a, self._b, out=self._c)

    def sample(self, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            np.add(self._v, 1.0, out=self._v)


# --- the replay --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TierFigures:
    """What one tier served during the replay (all readers): rows, bytes, read requests, per second."""

    rows: int
    bytes: int
    requests: int
    rows_per_s: float
    bytes_per_s: float
    requests_per_s: float


@dataclass(frozen=True)
class EmulateResult:
    """One replay. Times in seconds; ``accelerator_utilisation`` = compute / wall time (DLIO's AU)."""

    workload: str
    readers: int
    steps: int
    seconds: float
    rows: int
    bytes: int
    steps_per_s: float
    rows_per_s: float
    bytes_per_s: float
    io_wait_s: float
    io_wait_share: float
    compute_s: float
    accelerator_utilisation: float
    checkpoint_s: float
    checkpoint_bytes: int
    latency_p50_s: float
    latency_p99_s: float
    tiers: dict[str, TierFigures]
    direct: bool
    step_wait_s: tuple[float, ...] = ()
    step_compute_s: tuple[float, ...] = ()
    compute_on: str = "device"

    def to_dict(self) -> JsonObject:
        return asdict(self)


def _open_store(w: Workload):
    from iostack.bench.io import bench_file
    from iostack.placement import Placement, load_placement
    from iostack.store import FeatureStore

    if w.synthetic is not None:
        s = w.synthetic
        Path(s.dir).mkdir(parents=True, exist_ok=True)
        _, b = bench_file(s.dir, s.rows * s.row_bytes, s.row_bytes)
        p = Placement((b,), np.zeros(s.rows, np.int16), np.arange(s.rows, dtype=np.int64))
        return FeatureStore(p, s.dir, backend=w.backend)
    if not Path(w.placement, "placement.json").exists():
        raise WorkloadError(f"data.placement {w.placement}: no placement there (write one with moment place)")
    p = load_placement(w.placement)
    feats = None
    if any(b.kind != "ssd" for b in p.bins):
        if w.features is None:
            raise WorkloadError(f"data.placement {w.placement}: it has GPU/CPU caches; give data.features, "
                                "the dataset's features.npy, to fill them")
        feats = np.load(w.features, mmap_mode="r")
    return FeatureStore(p, w.placement, features=feats, backend=w.backend)


def _checkpoint_buffer(spec: CheckpointSpec, rank: int) -> np.ndarray:
    """The bytes a reader's checkpoints write (up to 64 MiB, repeated), its directory made."""
    if spec.dir:
        Path(spec.dir).mkdir(parents=True, exist_ok=True)
    return np.random.default_rng(rank).integers(0, 256, min(spec.bytes, 64 << 20) or 1, np.uint8)


def _checkpoint(spec: CheckpointSpec, rank: int, buf: np.ndarray) -> float:
    t0 = time.perf_counter()
    path = Path(spec.dir) / f"emulated-checkpoint-{rank}.bin"
    with open(path, "wb") as f:
        for a in range(0, spec.bytes, buf.size):
            f.write(memoryview(buf)[: min(buf.size, spec.bytes - a)])
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def _tier_totals(store) -> dict[str, list[int]]:
    """``{tier: [rows, bytes, read requests]}`` the store served since its last reset."""
    tiers: dict[str, list[int]] = {}
    for b in store.stats():
        t = tiers.setdefault(b.kind, [0, 0, 0])
        t[0] += b.rows
        t[1] += b.bytes
        t[2] += b.requests
    return tiers


def _replay(w: Workload, rank: int, progress: Progress | None = None) -> JsonObject:
    """One reader: its steps of every epoch through its own store; raw figures for :func:`_combine`."""
    import torch

    store = _open_store(w)
    try:
        stream = make_stream(w.stream, store.num_vertices)
        compute = sample = None
        if w.compute.from_metrics:
            compute, sample = metrics_times(w.compute.from_metrics)
        on = compute_on(w.compute)
        host = _HostWork() if on == "host" else None
        spend_compute = host.compute if host is not None else time.sleep
        spend_sample = host.sample if host is not None else time.sleep
        mine = list(range(rank, stream.steps, w.readers))
        ck_buf = _checkpoint_buffer(w.checkpoint, rank)
        order = [(e, s) for e in range(w.epochs) for s in mine]
        q: queue.Queue = queue.Queue(maxsize=max(1, w.prefetch))
        stop = threading.Event()
        lat: list[float] = []

        def prepare() -> None:
            try:
                for _, s in order:
                    if stop.is_set():
                        return
                    if sample is not None:  # the sampler's time of the measured run
                        spend_sample(float(sample[s % sample.size]))
                    t0 = time.perf_counter()
                    store.gather(torch.from_numpy(stream.step(s)))
                    lat.append(time.perf_counter() - t0)
                    q.put(s)
                q.put(None)
            except BaseException as exc:  # handed to the replaying thread
                q.put(exc)

        store.reset_stats()
        thread = threading.Thread(target=prepare, name="moment-emulate-prefetch", daemon=True) if w.prefetch else None
        waits, computes, ck_s, ck_bytes, done = [], [], 0.0, 0, 0
        t_start = time.perf_counter()
        if thread is not None:
            thread.start()
        for i, (_, s) in enumerate(order):
            t0 = time.perf_counter()
            if thread is None:  # no prefetch: gather inline, all of it is waiting
                if sample is not None:
                    spend_sample(float(sample[s % sample.size]))
                store.gather(torch.from_numpy(stream.step(s)))
                item = s
            else:
                item = q.get()
            if isinstance(item, BaseException):
                raise item
            waits.append(time.perf_counter() - t0)
            c = float(compute[s % compute.size]) if compute is not None else w.compute.seconds_per_step
            if c > 0:
                spend_compute(c)
            computes.append(c)
            done += 1
            ck = w.checkpoint
            if ck.bytes and ck.every_steps and (i + 1) % ck.every_steps == 0:
                ck_s += _checkpoint(ck, rank, ck_buf)
                ck_bytes += ck.bytes
            if progress is not None:
                progress(f"reader {rank}: steps", i + 1, len(order))
        seconds = time.perf_counter() - t_start
        stop.set()
        if thread is not None:
            thread.join()
        tiers = _tier_totals(store)
        if len(lat) > _LATENCY_SAMPLES:
            lat = [lat[i] for i in np.linspace(0, len(lat) - 1, _LATENCY_SAMPLES).astype(int)]
        return {"steps": done, "seconds": seconds, "waits": waits, "computes": computes, "ck_s": ck_s,
                "ck_bytes": ck_bytes, "tiers": tiers, "lat": lat, "row_bytes": store.row_bytes,
                "direct": all(d for d, _ in store.direct_io().values()), "on": on}
    finally:
        store.close()


def _reader_main(w: Workload, rank: int, out: Any) -> None:
    try:
        out.put((rank, _replay(w, rank)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as text
        out.put((rank, f"{type(exc).__name__}: {exc}"))


def _combine(w: Workload, parts: list[JsonObject]) -> EmulateResult:
    seconds = max(p["seconds"] for p in parts)
    steps = sum(p["steps"] for p in parts)
    wait = sum(sum(p["waits"]) for p in parts)
    comp = sum(sum(p["computes"]) for p in parts)
    wall = sum(p["seconds"] for p in parts)  # reader-seconds: shares are per reader, averaged
    tiers: dict[str, TierFigures] = {}
    for k in sorted({k for p in parts for k in p["tiers"]}):
        r, b, q = (sum(p["tiers"].get(k, [0, 0, 0])[i] for p in parts) for i in range(3))
        tiers[k] = TierFigures(r, b, q, r / seconds, b / seconds, q / seconds)
    rows = sum(t.rows for t in tiers.values())
    nbytes = sum(t.bytes for t in tiers.values())
    lat = [x for p in parts for x in p["lat"]]
    p50, p99 = (np.percentile(lat, [50, 99]).tolist() if lat else (0.0, 0.0))
    first = parts[0]
    return EmulateResult(w.name, w.readers, steps, seconds, rows, nbytes, steps / seconds, rows / seconds,
                         nbytes / seconds, wait, wait / wall if wall else 0.0, comp, comp / wall if wall else 0.0,
                         sum(p["ck_s"] for p in parts), sum(p["ck_bytes"] for p in parts), p50, p99, tiers,
                         all(p["direct"] for p in parts), tuple(first["waits"]), tuple(first["computes"]),
                         first["on"])


def emulate(workload: Workload, progress: Progress | None = None) -> EmulateResult:
    """Replay ``workload`` (one reader in this process; several as spawned processes) and measure it.

    Raises :class:`WorkloadError` for data or streams that do not fit, and
    :class:`~iostack.errors.StoreError` from the store.
    """
    w = workload
    if w.readers == 1:
        return _combine(w, [_replay(w, 0, progress)])
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no forked store or threads
    out = ctx.Queue()
    procs = [ctx.Process(target=_reader_main, args=(w, r, out), name=f"moment-emulate-{r}") for r in range(w.readers)]
    for p in procs:
        p.start()
    parts: dict[int, Any] = {}
    try:
        while len(parts) < len(procs):
            try:
                rank, res = out.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise StoreError(f"emulation reader {dead[0].name} died (exit {dead[0].exitcode})") from None
                continue
            if isinstance(res, str):
                raise StoreError(f"emulation reader {rank}: {res}")
            parts[rank] = res
            if progress is not None:
                progress("readers done", len(parts), len(procs))
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return _combine(w, [parts[r] for r in range(w.readers)])


__all__ = [
    "EmulateResult", "Stream", "TierFigures", "emulate", "make_stream", "compute_on",
    "metrics_device", "metrics_times", "save_stream"
]
