"""The steps of tools/bench_gpu.py, each ``step_NAME(args, rec)``: run in a process of its own, filling ``rec``.

``rec["figures"]``: :class:`_results.Figure` fields (ours against a reference
measured in the same step); ``rec["bad"]``: rows or batches that broke a
check; ``rec["values"]``: what was read or measured, by name; ``rec["notes"]``.
A step raises on what it cannot do: bench_gpu.py records the error and goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]


# -- helpers -----------------------------------------------------------------------------------------------------
def _device(args) -> torch.device:
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _say(rec: dict, text: str) -> None:
    print(text, flush=True)
    rec.setdefault("lines", []).append(text)


def _figure(rec: dict, figure: str, unit: str, ours: float, reference: float | None, reference_name: str,
            **kw) -> None:
    from _results import Figure

    rec["figures"].append(dataclasses.asdict(Figure("gpu", figure, unit, float(ours),
                                                    None if reference is None else float(reference),
                                                    reference_name, **kw)))


def rate(fn: Callable[[], int], device: torch.device, seconds: float) -> float:
    """Units per second of ``fn`` (which returns the units it did), run to completion on ``device``."""
    fn()  # warm up (allocator, kernels)
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while True:
        n += fn()
        _sync(device)
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n / dt


def rounds(pair: dict[str, Callable[[], float]], k: int) -> dict[str, list[float]]:
    """``k`` alternating rounds of each measurement (order flipped every round: load hits both alike)."""
    out: dict[str, list[float]] = {name: [] for name in pair}
    names = list(pair)
    for r in range(k):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(pair[name]())
    return out


def _paths(args) -> tuple[Path, Path]:
    return args.dir / "dataset", args.dir / "placement"


def _data(args):
    from iostack.placement import load_placement
    from training.data import open_dataset

    ds_dir, pl_dir = _paths(args)
    return open_dataset(ds_dir), load_placement(pl_dir), ds_dir, pl_dir


def _check_rows(rec: dict, what: str, got: torch.Tensor, feats: torch.Tensor, ids: torch.Tensor) -> bool:
    got = got.cpu()
    want = feats.index_select(0, ids.cpu().to(torch.int64))
    if got.shape == want.shape and bool((got == want).all()):
        return True
    n = int((got != want).any(1).sum()) if got.shape == want.shape else len(ids)
    rec["bad"].append(f"{what}: {n} of {len(ids)} gathered rows differ from the in-memory features")
    _say(rec, f"MISMATCH {rec['bad'][-1]}")
    return False


def _ssd_files(pl_dir: Path) -> list[Path]:
    return sorted(p for p in pl_dir.iterdir() if p.suffix in (".bin", ".dat") and p.is_file())


def _stores(placement, pl_dir, ds, device, rec: dict, names=("posix", "kvikio")) -> dict:
    from iostack.store import FeatureStore

    stores = {}
    for name in names:
        try:
            stores[name] = FeatureStore(placement, pl_dir, features=ds.features, backend=name, device=device)
        except Exception as exc:  # noqa: BLE001 - said; the other backend still runs
            rec["notes"].append(f"{name}: not measured: {type(exc).__name__}: {exc}")
            _say(rec, rec["notes"][-1])
    return stores


# -- env --------------------------------------------------------------------------------------------------------
def _version(module: str) -> str | None:
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        return version(module)
    with contextlib.suppress(Exception):
        return str(importlib.import_module(module).__version__)
    return None


def _nvml(values: dict) -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        values["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            g: dict = {"index": i, "name": str(pynvml.nvmlDeviceGetName(h)),
                       "pci_bus_id": str(pynvml.nvmlDeviceGetPciInfo(h).busId)}
            links = {}
            for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
                entry = {}
                for what, call in (("state", pynvml.nvmlDeviceGetNvLinkState),
                                   ("version", pynvml.nvmlDeviceGetNvLinkVersion)):
                    try:
                        entry[what] = call(h, link)
                    except Exception as exc:  # noqa: BLE001 - the raw answer is the record
                        entry[what] = f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):
                    entry["remote_bus_id"] = str(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
                links[link] = entry
            g["nvlink_raw"] = links
            gpus.append(g)
        values["nvml_gpus"] = gpus
    finally:
        pynvml.nvmlShutdown()


def _kvikio(values: dict) -> None:
    import kvikio

    from iostack.backends.kvikio_backend import gds_status, kvikio_option

    values["kvikio_version"] = getattr(kvikio, "__version__", None)
    settings = {}
    for name in ("compat_mode", "num_threads", "task_size", "gds_threshold", "bounce_buffer_size"):
        try:
            settings[name] = str(kvikio_option(kvikio, name))
        except Exception as exc:  # noqa: BLE001 - recorded as read
            settings[name] = f"{type(exc).__name__}: {exc}"
    values["kvikio_defaults"] = settings
    with contextlib.suppress(Exception):
        values["kvikio_is_compat_mode_preferred"] = bool(kvikio.defaults.is_compat_mode_preferred())
    values["kvikio_gds"] = list(gds_status(kvikio))


def _file_system(path: Path) -> dict:
    from iostack.backends.kvikio_backend import o_direct_opens

    best, fs = "", {}
    real = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mnt, kind, opts = (line.split() + ["", "", "", ""])[:4]
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
            best, fs = mnt, {"device": dev, "mount": mnt, "type": kind, "options": opts}
    probe = path / ".odirect-probe"
    probe.write_bytes(b"\0" * (1 << 20))
    try:
        fs["o_direct_opens"] = o_direct_opens(str(probe))
    finally:
        probe.unlink()
    return fs


def step_env(args, rec: dict) -> None:
    v = rec["values"]
    v["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    v["loadavg"] = Path("/proc/loadavg").read_text().strip()
    v["python"], v["platform"] = sys.version.split()[0], platform.platform()
    v["torch"], v["torch_cuda"] = torch.__version__, torch.version.cuda
    v["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    for name in ("numpy", "cupy", "cupy-cuda13x", "nvidia-ml-py", "torch_geometric", "kvikio", "kvikio-cu13",
                 "libkvikio-cu13", "nvidia-cufile", "nvidia-cufile-cu12", "numba"):
        v[f"version:{name}"] = _version(name)
    v["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(_device(args))
        v["gpu"] = {a: str(getattr(props, a, None)) for a in ("name", "total_memory", "multi_processor_count",
                                                              "pci_domain_id", "pci_bus_id", "pci_device_id",
                                                              "uuid", "major", "minor")}
    for part, fn in (("nvml", _nvml), ("kvikio", _kvikio)):
        try:
            fn(v)
        except Exception as exc:  # noqa: BLE001 - what could not be read is part of the record
            v[f"{part}_error"] = f"{type(exc).__name__}: {exc}"
    import ctypes.util

    v["cufile_library"] = ctypes.util.find_library("cufile")
    v["cufile_json"] = os.environ.get("CUFILE_ENV_PATH_JSON") or ("/etc/cufile.json"
                                                                 if Path("/etc/cufile.json").exists() else None)
    args.dir.mkdir(parents=True, exist_ok=True)
    v["dir"] = _file_system(args.dir)
    for k, x in v.items():
        if k not in ("nvml_gpus",):
            _say(rec, f"{k}: {x}")
    for g in v.get("nvml_gpus", []):
        _say(rec, f"NVML GPU {g['index']} {g['name']} at {g['pci_bus_id']}: NVLink "
                  + json.dumps(g["nvlink_raw"])[:2000])


# -- data -------------------------------------------------------------------------------------------------------
def step_data(args, rec: dict) -> None:
    from iostack.bins import write_bins
    from iostack.placement import simple_placement
    from training.data import open_dataset
    from training.synth import SynthSpec
    from training.synth_run import synthesize

    tag = f"{args.nodes}-{args.edges}-{args.feature_dim}-{args.gpu_share}-{args.cpu_share}-{args.train_share}"
    args.dir.mkdir(parents=True, exist_ok=True)
    ds_dir, pl_dir = _paths(args)
    stamp = args.dir / "made.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("tag") == tag:
        _say(rec, f"data: reused from {args.dir}")
        return
    t0 = time.perf_counter()
    synthesize(ds_dir, SynthSpec(num_nodes=args.nodes, num_edges=args.edges, generator="chung-lu",
                                 feature_dim=args.feature_dim, train_share=args.train_share, seed=1), overwrite=True)
    ds = open_dataset(ds_dir)
    deg = np.diff(np.asarray(ds.indptr))
    order = np.argsort(-deg, kind="stable")  # hottest (highest in-degree) first
    n = ds.num_nodes
    p = simple_placement(n, [("gpu", int(n * args.gpu_share)), ("cpu", int(n * args.cpu_share)), ("ssd", n)],
                         order=order)
    pl_dir.mkdir(parents=True, exist_ok=True)
    write_bins(ds.features, p, pl_dir)
    p.save(pl_dir)
    stamp.write_text(json.dumps({"tag": tag}))
    rec["values"].update(nodes=n, edges=int(ds.indptr[-1]), seconds_to_make=round(time.perf_counter() - t0, 1))
    _say(rec, f"data: {n:,} vertices, {int(ds.indptr[-1]):,} edges, {args.feature_dim} float32 features "
              f"in {time.perf_counter() - t0:.0f} s")


# -- sampling ---------------------------------------------------------------------------------------------------
def _csr(ds) -> tuple[torch.Tensor, torch.Tensor]:
    # copies: the dataset's arrays are read-only maps
    return torch.from_numpy(np.array(ds.indptr, np.int64)), torch.from_numpy(np.array(ds.indices))


def step_sampling(args, rec: dict) -> None:
    from training.sampler import NeighborSampler

    ds, _, _, _ = _data(args)
    device = _device(args)
    rng = np.random.default_rng(2)
    bs = min(8000, ds.num_nodes // 2)
    seeds = [torch.from_numpy(rng.choice(ds.num_nodes, bs, replace=False)) for _ in range(8)]
    indptr, indices = _csr(ds)
    samplers = {"gpu": NeighborSampler(indptr.to(device), indices.to(device), (25, 10), seed=0),
                "cpu": NeighborSampler(indptr, indices, (25, 10), seed=0, num_threads=args.cpu_threads)}
    on_dev = [x.to(device) for x in seeds]

    def run(name, s):
        xs = on_dev if name == "gpu" else seeds
        return lambda: rate(lambda: sum(s.sample(x, check=False).num_edges for x in xs), s.device, args.seconds)

    r = rounds({k: run(k, s) for k, s in samplers.items()}, args.rounds)
    ours, ref = statistics.median(r["gpu"]) / 1e6, statistics.median(r["cpu"]) / 1e6
    rec["values"]["rounds"] = r
    _say(rec, f"sampling (25,10, batches of {bs}): {device} {ours:.2f} M edges/s, CPU ({args.cpu_threads} "
              f"thread(s)) {ref:.2f} M edges/s, ratio {ours / ref:.2f}")
    _figure(rec, f"sampling 25,10 batch {bs} on {device} vs CPU ({args.cpu_threads} threads)", "M edges/s", ours,
            ref, f"same sampler on the CPU, {args.cpu_threads} thread(s)")


def step_sampling_valid(args, rec: dict) -> None:
    from training.samplecheck import sample_problems
    from training.sampler import NeighborSampler

    ds, _, _, _ = _data(args)
    device = _device(args)
    indptr, indices = _csr(ds)
    rng = np.random.default_rng(5)
    bs = min(4000, ds.num_nodes // 2)
    for fanouts, shapes in (((25, 10), "fixed"), ((25, 10), "data"), ((10, 10, 5), "fixed"), ((-1, 5), "auto")):
        s = NeighborSampler(indptr.to(device), indices.to(device), fanouts, seed=1, shapes=shapes)
        for k in range(3):
            seeds = torch.from_numpy(rng.choice(ds.num_nodes, bs, replace=False))
            b = s.sample(seeds.to(device))
            problems = sample_problems(indptr, indices, b, fanouts, seeds)
            where = f"sampler on {device} ({s.shapes} shapes), fan-outs {fanouts}, batch {k}"
            if problems:
                rec["bad"].extend(f"{where}: {p}" for p in problems)
            _say(rec, f"{where}: {b.num_edges:,} edges, " + ("valid" if not problems else "; ".join(problems)))


# -- gathers ----------------------------------------------------------------------------------------------------
def step_tiers(args, rec: dict) -> None:
    ds, placement, _, pl_dir = _data(args)
    device = _device(args)
    feats = torch.from_numpy(np.array(ds.features))
    rng = np.random.default_rng(3)
    stores = _stores(placement, pl_dir, ds, device, rec, ("posix",))
    store = stores["posix"]
    try:
        for kind in ("gpu", "cpu"):
            b = next(x for x in placement.bins if x.kind == kind)
            verts = placement.vertices_of(b.id)
            ids = [torch.from_numpy(rng.choice(verts, min(args.gather_batch, verts.size))) for _ in range(4)]
            if _check_rows(rec, f"{kind} tier", store.gather(ids[0]), feats, ids[0]):
                _say(rec, f"rows ok: {kind} tier ({len(ids[0])} rows)")

            def ours(ids=ids) -> int:
                return sum(store.gather(x).shape[0] for x in ids)

            def naive(ids=ids) -> int:  # pageable host gather, then a synchronous copy up
                return sum(feats.index_select(0, x).to(device).shape[0] for x in ids)

            r = rounds({"ours": lambda f=ours: rate(f, device, args.seconds),
                        "naive": lambda f=naive: rate(f, device, args.seconds)}, args.rounds)
            o, n = statistics.median(r["ours"]) / 1e6, statistics.median(r["naive"]) / 1e6
            _say(rec, f"gather, {kind} tier, {len(ids[0])} rows per call: store {o:.2f} M rows/s, naive {n:.2f}, "
                      f"ratio {o / n:.2f}")
            _figure(rec, f"gather {kind}-tier rows into {device}, {len(ids[0])} rows/call", "M rows/s", o, n,
                    "host index_select + .to(device) (pageable)")
    finally:
        store.close()


def step_ssd(args, rec: dict) -> None:
    from iostack.pagecache import drop, resident_share

    ds, placement, _, pl_dir = _data(args)
    device = _device(args)
    feats = torch.from_numpy(np.array(ds.features))
    ssd = next(x for x in placement.bins if x.kind == "ssd")
    rng = np.random.default_rng(4)
    verts = placement.vertices_of(ssd.id)  # only SSD rows: every row of a gather is a read
    ids = [torch.from_numpy(rng.choice(verts, min(args.gather_batch, verts.size))) for _ in range(4)]
    files = _ssd_files(pl_dir)
    resident: list[float] = []
    stores = _stores(placement, pl_dir, ds, device, rec)
    try:
        for name, s in stores.items():
            direct, why = next(iter(s.direct_io().values()))
            _say(rec, f"{name}: {'direct (O_DIRECT / GDS)' if direct else 'not direct'}" + (f" - {why}" if why else ""))
            if _check_rows(rec, f"SSD tier ({name})", s.gather(ids[0]), feats, ids[0]):
                _say(rec, f"rows ok: SSD tier ({name})")

        def cold(s) -> float:  # rows/s of gathers alone, every one from a cold page cache
            n, busy, t0 = 0, 0.0, time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                for f in files:
                    drop(f)
                resident.extend(r for r in (resident_share(f) for f in files) if r is not None)
                t1 = time.perf_counter()
                x = ids[n // len(ids[0]) % len(ids)]
                s.gather(x)
                _sync(device)
                busy += time.perf_counter() - t1
                n += len(x)
            return n / busy

        r = rounds({k: (lambda s=s: cold(s)) for k, s in stores.items()}, args.rounds)
        med = {k: statistics.median(v) / 1e6 for k, v in r.items()}
        cache = f"page cache dropped before every batch, at most {max(resident, default=0):.1%} resident then"
        rec["values"].update(rounds=r, max_resident_share=max(resident, default=None))
        _say(rec, "SSD rows into GPU memory (cold): " + ", ".join(f"{k} {v:.3f} M rows/s" for k, v in med.items())
             + f"; {cache}")
        if "kvikio" in med and "posix" in med:
            gds = next(iter(stores["kvikio"].direct_io().values()))[0]
            _figure(rec, f"SSD rows into {device}, {args.gather_batch} random rows/call, cold "
                         f"(KvikIO {'GDS' if gds else 'compatibility mode'})", "M rows/s", med["kvikio"],
                    med["posix"], "posix backend (O_DIRECT into pinned, one copy up)", note=cache)
        elif "posix" in med:
            _figure(rec, f"SSD rows into {device} with posix, {args.gather_batch} rows/call, cold", "M rows/s",
                    med["posix"], None, "KvikIO not measured (see notes)", note=cache)
    finally:
        for s in stores.values():
            s.close()


def _busy(device: torch.device, n: int = 2048) -> Callable[[int], None]:
    """``burst(k)`` queues ``k`` matrix products on the current (default) stream: the training compute stand-in."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device) / n**0.5
    c = torch.empty_like(a)

    def burst(k: int) -> None:
        for _ in range(k):
            torch.mm(a, b, out=c)
    return burst


def step_pipelined(args, rec: dict) -> None:
    ds, placement, _, pl_dir = _data(args)
    device = _device(args)
    feats = torch.from_numpy(np.array(ds.features))
    rng = np.random.default_rng(6)
    batches = [torch.from_numpy(rng.integers(0, ds.num_nodes, args.gather_batch)) for _ in range(8)]
    burst = _busy(device, 2048 if device.type == "cuda" else 64)
    stores = _stores(placement, pl_dir, ds, device, rec)
    try:
        for name, s in stores.items():
            for trial in range(3):
                burst(50)  # the default stream is busy while every gather below is issued
                landings = [s.gather_landing(x) for x in batches]  # back to back, none waited for yet
                ok = sum(_check_rows(rec, f"pipelined {name}, trial {trial}, batch {i}", g.wait(), feats, x)
                         for i, (g, x) in enumerate(zip(landings, batches, strict=True)))
                _say(rec, f"pipelined {name}, trial {trial}: {ok} of {len(batches)} batches of "
                          f"{args.gather_batch} rows equal the features, every row compared")
    finally:
        for s in stores.values():
            s.close()


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _overlap(name: str, s, mixed: list, burst: Callable[[int], None], device: torch.device, args, rec: dict) -> None:
    """Gathers with the default stream busy vs gathers and products one after the other."""
    n = len(mixed) * 3

    def gathers() -> None:
        for x in mixed * 3:
            s.gather(x)

    _timed(gathers, device)  # warm up
    one = _timed(lambda: burst(20), device) / 20  # seconds per product
    g_alone = statistics.median(_timed(gathers, device) for _ in range(args.rounds))
    reps = max(1, round(g_alone / max(one, 1e-9) / n))  # products per gather: about as long as the gather

    def both() -> None:
        for x in mixed * 3:
            burst(reps)
            s.gather(x)

    b_alone = statistics.median(_timed(lambda: burst(reps * n), device) for _ in range(args.rounds))
    together = statistics.median(_timed(both, device) for _ in range(args.rounds))
    busy_rate, serial_rate, idle_rate = n / together, n / (g_alone + b_alone), n / g_alone
    rec["values"][name] = dict(gathers_s=g_alone, products_s=b_alone, together_s=together, reps=reps)
    _say(rec, f"overlap {name}: gathers/s idle {idle_rate:.1f}, busy {busy_rate:.1f}, serialised would be "
              f"{serial_rate:.1f} (ratio {busy_rate / serial_rate:.2f}; 1 = no overlap, "
              f"{(g_alone + b_alone) / max(g_alone, b_alone):.2f} = full)")
    _figure(rec, f"gathers/s of {args.gather_batch} mixed-tier rows with the default stream busy ({name})",
            "gathers/s", busy_rate, serial_rate, "gathers and products one after the other (no overlap)",
            note=f"idle: {idle_rate:.1f} gathers/s")


def step_overlap(args, rec: dict) -> None:
    ds, placement, _, pl_dir = _data(args)
    device = _device(args)
    rng = np.random.default_rng(7)
    mixed = [torch.from_numpy(rng.integers(0, ds.num_nodes, args.gather_batch)) for _ in range(4)]
    burst = _busy(device, 2048 if device.type == "cuda" else 64)
    stores = _stores(placement, pl_dir, ds, device, rec)
    try:
        for name, s in stores.items():
            _overlap(name, s, mixed, burst, device, args, rec)
    finally:
        for s in stores.values():
            s.close()


# -- training ---------------------------------------------------------------------------------------------------
def step_epoch(args, rec: dict) -> None:
    from training.specs import IOSpec, ModelSpec, RunSpec, SamplingSpec, TrainSpec
    from training.trainer import train

    ds, _, ds_dir, pl_dir = _data(args)
    n_train = int(ds.train_idx.shape[0])
    batch = max(1, n_train // 30)  # 30 steps
    where = ("gpu", "cpu") if torch.cuda.is_available() and args.device != "cpu" else ("auto", "cpu")
    res = {}
    for sample_on in where:
        steps: list[dict] = []
        spec = TrainSpec(str(ds_dir), model=ModelSpec(hidden=args.hidden),
                         sampling=SamplingSpec(fanouts=(10, 5), batch_size=batch, sample_on=sample_on),
                         io=IOSpec(placement=str(pl_dir), backend="auto"), run=RunSpec(epochs=1, eval_every_epochs=0))
        r = train(spec, progress=lambda x, steps=steps: steps.append(x) if x.get("kind") in ("step", "start") else None)
        losses = [s["loss"] for s in steps if s.get("kind") == "step"]
        start = next((s for s in steps if s.get("kind") == "start"), {})
        k = max(1, len(losses) // 6)
        falling = len(losses) >= 2 and statistics.mean(losses[-k:]) < statistics.mean(losses[:k])
        res[sample_on] = r.final["seeds_per_s"]
        rec["values"][sample_on] = {"losses": losses, "final": {k2: v for k2, v in r.final.items()
                                                                if isinstance(v, (int, float, str))},
                                    "sampling": start.get("sampling"), "backend": start.get("backend")}
        _say(rec, f"epoch, sampling {sample_on} ({(start.get('sampling') or {}).get('device')}): {len(losses)} steps, "
                  f"loss {losses[0]:.3f} -> {losses[-1]:.3f} ({'falling' if falling else 'NOT FALLING'}), "
                  f"{r.final['seeds_per_s']:,.0f} seeds/s")
        if not falling:
            rec["bad"].append(f"epoch with sampling {sample_on}: the loss did not fall "
                              f"({losses[:3]} ... {losses[-3:]})")
    a, b = where
    _figure(rec, f"30-step epoch, GraphSAGE 10,5, batch {batch}: sampling {a} vs {b}", "seeds/s", res[a], res[b],
            f"sampling on {b}")


def _segment_child(key: str, shape: tuple[int, int], register: bool) -> dict:
    from iostack.hostshare import shared_host_tensor

    seg = shared_host_tensor(key, shape, torch.float32, lambda t: t.copy_(_pattern(shape)))
    if seg is None:
        return {"error": "no room in /dev/shm"}
    t = seg.tensor
    out: dict = {"pid": os.getpid(), "built": seg.built, "equal": bool(torch.equal(t, _pattern(shape)))}
    if register and torch.cuda.is_available():
        rc = int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * 4, 1))
        out["cudaHostRegister"] = rc
        if rc == 0:
            up = t.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            out["equal_on_gpu"] = bool(torch.equal(up.cpu(), _pattern(shape)))
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
    else:
        out["cudaHostRegister"] = "not attempted (no CUDA)"
    return out


def _pattern(shape: tuple[int, int]) -> torch.Tensor:
    return torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape)


def step_nodeshare(args, rec: dict) -> None:
    key = f"benchgpu-{os.getpid()}"
    shape = (4096, 256) if not args.dry_run_cpu else (64, 16)
    code = (f"import json,sys; sys.path[:0]=[{str(Path(__file__).parent)!r},{str(REPO)!r}]; import _gpu_steps as g; "
            f"print(json.dumps(g._segment_child({key!r}, {shape!r}, True)))")
    mine = _segment_child(key, shape, True)  # this process builds it
    other = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      timeout=120).stdout.strip().splitlines()[-1])
    rec["values"].update(first=mine, second=other)
    _say(rec, f"node-shared segment: built here {mine}; second process {other}")
    for who, r in (("first", mine), ("second", other)):
        if not r.get("equal", False) or r.get("equal_on_gpu") is False:
            rec["bad"].append(f"node-shared segment, {who} process: contents differ ({r})")
        if isinstance(r.get("cudaHostRegister"), int) and r["cudaHostRegister"] != 0:
            rec["notes"].append(f"{who} process: cudaHostRegister of the shared segment returned "
                                f"{r['cudaHostRegister']}")
    if other.get("built"):
        rec["bad"].append("the second process built the segment again instead of mapping the first's")
    for p in Path("/dev/shm").glob(f"moment-{key}*"):
        p.unlink(missing_ok=True)


def step_ipc(args, rec: dict) -> None:
    from training.samplecheck import sample_problems
    from training.serve import RemoteBatchSource

    ds, _, ds_dir, _ = _data(args)
    dev = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    fanouts, batch = (10, 5), 512
    cmd = [sys.executable, "-m", "moment", "serve", "--dataset", str(ds_dir), "--port", "0", "--trainer-timeout", "10",
           "--fanouts", ",".join(map(str, fanouts)), "--batch-size", str(batch), "--seed", "3", "--workers", "1",
           "--device", dev]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    try:
        address = None
        assert server.stdout is not None
        for line in server.stdout:
            _say(rec, f"server: {line.rstrip()}")
            m = re.search(r"--server (\S+)", line)
            if m:
                address = m.group(1)
                break
        if address is None:
            raise RuntimeError(f"the server did not start (status {server.poll()})")
        src = RemoteBatchSource(address, rank=0, world_size=1, batch_size=batch, fanouts=fanouts, seed=3,
                                timeout_s=60.0)
        try:
            seen, devices = 0, set()
            for b in src.batches(0):
                devices.add(str(b.n_id.device))
                problems = sample_problems(ds.indptr, ds.indices, b, fanouts)
                rec["bad"].extend(f"served batch {seen}: {p}" for p in problems)
                seen += 1
                if seen >= 20:
                    break
            rec["values"].update(batches=seen, transport=src.transport, devices=sorted(devices))
            _say(rec, f"ipc: {seen} batches over {src.transport} on {sorted(devices)}, each checked by the "
                      "sampling rules")
            if dev == "cuda" and devices != {"cuda:0"}:
                rec["bad"].append(f"served batches were on {sorted(devices)}, not handed over on cuda:0")
        finally:
            src.close()
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=20)
        if server.poll() is None:
            server.kill()
