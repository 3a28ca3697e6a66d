"""``moment bench emulate`` checked against the real thing (not a test).

    python tools/bench_emulate.py [--dir /var/tmp/moment-emulate] [--rounds 3] [--json FILE]

Two comparisons, each measured side by side in the same run:

1. **The plain case against fio.** Uniform random 4 KiB rows from one SSD bin (O_DIRECT), one
   reader, no compute, 65,536 rows per step: the emulator's read requests per second (the
   distinct pages it reads) against fio's random-read IOPS (io_uring, queue depth 64) on the
   same file, alternating who goes first. Goal: within 10%.
2. **A recorded stream against ``moment train``.** An I/O-bound GraphSAGE run (4 KiB feature
   rows, a small model, most rows on the SSD bins of a ``moment place`` placement) is trained
   by the real command; the same configuration's stream is recorded with ``moment bench
   record`` and replayed with that run's per-step compute and sampling times
   (``compute.from_metrics``). Figures: the emulated epoch time and I/O wait against the
   run's measured ones. Goal: within 10%.

3. **The peer: ``dlio-benchmark``** (PyPI, in its own venv: it imports tensorflow and wants
   MPI; ``--dlio-venv DIR``, default ``/var/tmp/dliov``; without it the script says it was not
   run). The same bytes, sample size (4 KiB), one reader, no compute, batches of 1,024: DLIO
   in its own format on the same disk (``npy``, one sample per file, shuffled, read through
   the page cache, which is dropped first when this user may) against ``moment bench emulate``
   (one SSD bin, uniform rows, O_DIRECT). Where they differ: DLIO opens and parses a file per
   sample and shuffles a permutation; ours reads rows of one file, draws with replacement.
   (DLIO's ``hdf5`` format, many samples per file, ran at ~40 samples/s here: not the peer's
   best foot, so not used.)

Build DLIO's venv once::

    python3 -m venv --system-site-packages /var/tmp/dliov
    /var/tmp/dliov/bin/pip install --no-deps dlio-benchmark==2.0.0
    /var/tmp/dliov/bin/pip install hydra-core omegaconf pydftracer==1.0.2 mpi4py pandas psutil Pillow tensorflow-cpu
    # mpi4py needs an MPI: apt-get install libopenmpi-dev openmpi-bin
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _cli  # noqa: E402
from _results import Figure, write  # noqa: E402

from iostack.bench.emulate import emulate  # noqa: E402
from iostack.bench.workload import workload_from_dict  # noqa: E402

#: every step with 2 OpenMP threads unless the caller's environment sets them
moment = partial(_cli.moment, omp_threads="2")


def engine_alone(path: Path, rows: int, steps: int, seed: int) -> float:
    """Our read engine without the emulator or the store: the same number of uniform rows per call,
    into one reused page-aligned buffer (what ``moment bench raw`` measures); distinct reads per second."""
    import numpy as np

    from iostack.backends.base import aligned_empty
    from iostack.backends.posix import PosixBackend
    from iostack.bins import open_bin
    from iostack.placement import Bin

    info = open_bin(path.parent, Bin(0, "ssd", rows, path=path.name))
    rng = np.random.default_rng(seed)
    with PosixBackend(queue_depth=64) as be:
        h = be.open(info)
        out = aligned_empty(65536, 4096)
        n, t0 = 0, time.perf_counter()
        for _ in range(steps):
            n += be.read_rows(h, rng.integers(0, rows, 65536), out)
        return n / (time.perf_counter() - t0)


def plain_vs_fio(base: Path, rounds: int, steps: int) -> tuple[list[float], list[float], list[float]]:
    from iostack.bench.io import bench_file
    from planner.fio import run_fio

    d = base / "plain"
    d.mkdir(parents=True, exist_ok=True)
    rows = (1 << 30) // 4096
    path, _ = bench_file(d, rows * 4096, 4096)
    w = workload_from_dict({"name": "uniform 4KiB", "data": {"synthetic": {"rows": rows, "row_bytes": 4096,
                                                                          "dir": str(d)}},
                            "stream": {"kind": "uniform", "rows_per_step": 65536, "steps": steps}})
    ours, fio, engine = [], [], []
    sides = ("fio", "ours", "engine")
    for r in range(rounds):
        for side in sides[r % 3:] + sides[:r % 3]:  # every side in every position over three rounds
            time.sleep(1.0)  # the same idle gap before each: a cloud disk's burst refills while idle
            if side == "fio":
                res, _ = run_fio(path, block_bytes=4096, queue_depth=64, seconds=5, file_bytes=rows * 4096,
                                 direct=True)
                fio.append(res.read_iops)
            elif side == "ours":
                e = emulate(w)
                ours.append(e.tiers["ssd"].requests_per_s)
            else:
                engine.append(engine_alone(path, rows, steps, r))
        print(f"plain round {r + 1}: emulate {ours[-1] / 1e3:.1f} k reads/s, fio {fio[-1] / 1e3:.1f} k IOPS "
              f"({ours[-1] / fio[-1]:.2f}); our engine alone {engine[-1] / 1e3:.1f} k ({engine[-1] / fio[-1]:.2f})",
              flush=True)
    return ours, fio, engine


def recorded_vs_train(base: Path, rounds: int, args: argparse.Namespace) -> list[dict]:
    g, pl = base / "graph", base / "place"
    if not (g / "meta.json").exists():
        print("making the graph (4 KiB feature rows)", flush=True)
        moment("data", "synth", str(g), "--nodes", str(args.nodes), "--edges", str(10 * args.nodes),
               "--generator", "chung-lu", "--undirected", "--feature-dim", "1024", "--train-share",
               str(args.train_share), "--seed", "5", "--quiet")
    cfg = ["--fanouts", args.fanouts, "--batch-size", str(args.batch_size)]
    if not (pl / "placement.json").exists():
        moment("place", "--dataset", str(g), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache",
               args.cpu_cache, *[a for _ in range(8) for a in ("--ssd", str(pl))], "--out", str(pl), *cfg)
    stream = base / "stream.npz"
    moment("bench", "record", str(stream), "--dataset", str(g), *cfg)
    out = []
    for r in range(rounds):
        m = base / f"metrics-{r}.jsonl"
        m.unlink(missing_ok=True)
        moment("train", "--dataset", str(g), "--placement", str(pl), *cfg, "--hidden", str(args.hidden),
               "--epochs", "1", "--eval-every", "0", "--metrics", str(m))
        ep = [json.loads(x) for x in m.read_text().splitlines() if '"epoch"' in x]
        ep = [x for x in ep if x.get("kind") == "epoch"][-1]
        res = {}
        # the model (compute.on auto: host, the run trained on the CPU) and, for comparison, DLIO's
        # sleep (compute.on device); which of the two follows the training run alternates
        for on in (("auto", "device") if r % 2 == 0 else ("device", "auto")):
            wl = {"name": "recorded GraphSAGE", "data": {"placement": str(pl), "features": str(g / "features.npy")},
                  "stream": {"kind": "recorded", "path": str(stream)}, "compute": {"from_metrics": str(m), "on": on},
                  "prefetch": 2}
            (base / f"w-{on}.yaml").write_text(yaml.safe_dump(wl))
            res[on] = emulate(workload_from_dict(wl))
        e, d = res["auto"], res["device"]
        out.append({"train_epoch_s": ep["epoch_s"], "train_io_wait_s": ep["io_wait_s"], "emu_epoch_s": e.seconds,
                    "emu_io_wait_s": e.io_wait_s, "compute_on": e.compute_on, "sleep_epoch_s": d.seconds,
                    "sleep_io_wait_s": d.io_wait_s})
        print(f"recorded round {r + 1}: epoch {ep['epoch_s']:.2f} s (train) vs {e.seconds:.2f} s (emulated, compute "
              f"on {e.compute_on}; {d.seconds:.2f} s with DLIO's sleep); I/O wait {ep['io_wait_s']:.2f} vs "
              f"{e.io_wait_s:.2f} s ({d.io_wait_s:.2f} s)", flush=True)
    return out


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def dlio_vs_ours(base: Path, venv: Path, rounds: int, files: int) -> tuple[list[float], list[float], bool]:
    exe = venv / "bin" / "dlio_benchmark"
    data = base / "dlio-data"
    common = ["workload=default", f"++workload.dataset.data_folder={data}", "++workload.dataset.format=npy",
              f"++workload.dataset.num_files_train={files}", "++workload.dataset.num_samples_per_file=1",
              "++workload.dataset.record_length=4096", "++workload.dataset.num_files_eval=0",
              "++workload.dataset.num_subfolders_train=0"]
    env = dict(os.environ, DFTRACER_ENABLE="0", TF_CPP_MIN_LOG_LEVEL="3")
    if not (data / "train").is_dir() or len(list((data / "train").iterdir())) < files:
        subprocess.run([str(exe), *common, "++workload.workflow.generate_data=True", "++workload.workflow.train=False",
                        f"hydra.run.dir={base / 'dlio-gen'}"], env=env, capture_output=True, check=True)
    d = base / "dlio-ours"
    d.mkdir(exist_ok=True)
    w = workload_from_dict({"name": "uniform 4KiB, DLIO-sized",
                            "data": {"synthetic": {"rows": files, "row_bytes": 4096, "dir": str(d)}},
                            "stream": {"kind": "uniform", "rows_per_step": 1024, "steps": files // 1024}})
    ours, theirs, dropped = [], [], True
    for r in range(rounds):
        dropped &= drop_caches()
        out = base / f"dlio-run-{r}"
        subprocess.run([str(exe), *common, "++workload.workflow.generate_data=False", "++workload.workflow.train=True",
                        "++workload.workflow.evaluation=False", "++workload.reader.batch_size=1024",
                        "++workload.reader.read_threads=1", "++workload.train.computation_time=0",
                        "++workload.train.epochs=1", f"hydra.run.dir={out}"], env=env, capture_output=True,
                       check=True)
        theirs.append(json.loads((out / "summary.json").read_text())["metric"]
                      ["train_throughput_mean_samples_per_second"])
        ours.append(emulate(w).rows_per_s)
        print(f"DLIO round {r + 1}: DLIO {theirs[-1]:.0f} samples/s, emulate {ours[-1]:.0f} rows/s", flush=True)
    return ours, theirs, dropped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/moment-emulate"), help="work directory on the SSD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="steps of the plain case (65,536 rows each)")
    ap.add_argument("--nodes", type=int, default=300_000)
    ap.add_argument("--train-share", type=float, default=0.05)
    ap.add_argument("--fanouts", default="25,10")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=32, help="a small model: the run is I/O-bound")
    ap.add_argument("--cpu-cache", default="64MiB")
    ap.add_argument("--dlio-venv", type=Path, default=Path("/var/tmp/dliov"))
    ap.add_argument("--dlio-files", type=int, default=8192, help="DLIO samples (= files) per epoch (default 8192)")
    ap.add_argument("--skip", choices=("plain", "recorded", "dlio"), action="append", default=[])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    figs = []
    if "plain" not in args.skip:
        ours, fio, engine = plain_vs_fio(args.dir, args.rounds, args.steps)
        ratios = [o / f for o, f in zip(ours, fio, strict=True)]
        eng = [e / f for e, f in zip(engine, fio, strict=True)]
        print(f"plain case: emulate / fio median {statistics.median(ratios):.2f} "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}); engine alone / fio {statistics.median(eng):.2f} "
              f"(range {min(eng):.2f}-{max(eng):.2f})")
        figs += [Figure("emulate", "uniform 4 KiB reads, 1 reader, QD 64: emulate vs fio", "reads/s",
                        statistics.median(ours), statistics.median(fio), "fio io_uring", target="within 10%",
                        note=f"ratio range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} paired rounds"),
                 Figure("emulate", "uniform 4 KiB reads, 1 reader, QD 64: our engine alone vs fio (same rounds)",
                        "reads/s", statistics.median(engine), statistics.median(fio), "fio io_uring",
                        note=f"ratio range {min(eng):.2f}-{max(eng):.2f}: the ceiling the emulator reads through")]
    if "recorded" not in args.skip:
        rec = recorded_vs_train(args.dir, args.rounds, args)
        ep = [r["emu_epoch_s"] / r["train_epoch_s"] for r in rec]
        io = [r["emu_io_wait_s"] / r["train_io_wait_s"] for r in rec if r["train_io_wait_s"] > 0]
        sep = [r["sleep_epoch_s"] / r["train_epoch_s"] for r in rec]
        sio = [r["sleep_io_wait_s"] / r["train_io_wait_s"] for r in rec if r["train_io_wait_s"] > 0]
        print(f"recorded stream: emulated / measured epoch time median {statistics.median(ep):.3f} "
              f"(range {min(ep):.3f}-{max(ep):.3f}); I/O wait {statistics.median(io):.3f} "
              f"(range {min(io):.3f}-{max(io):.3f}); with DLIO's sleep for compute: epoch "
              f"{statistics.median(sep):.3f} ({min(sep):.3f}-{max(sep):.3f}), I/O wait {statistics.median(sio):.3f} "
              f"({min(sio):.3f}-{max(sio):.3f})")
        med = sorted(rec, key=lambda r: r["train_epoch_s"])[len(rec) // 2]
        figs += [Figure("emulate", "recorded GraphSAGE stream: emulated vs measured epoch time", "s",
                        med["emu_epoch_s"], med["train_epoch_s"], "moment train", higher_is_better=False,
                        target="within 10%", note=f"the round of median train time; emulated / measured median "
                        f"{statistics.median(ep):.3f}, range {min(ep):.3f}-{max(ep):.3f}; compute on "
                        f"{med['compute_on']}; with a sleep: {statistics.median(sep):.3f}"),
                 Figure("emulate", "recorded GraphSAGE stream: emulated vs measured I/O wait", "s",
                        med["emu_io_wait_s"], med["train_io_wait_s"], "moment train", higher_is_better=False,
                        target="within 10%", note=f"emulated / measured median {statistics.median(io):.3f}, range "
                        f"{min(io):.3f}-{max(io):.3f}; with a sleep: "
                        f"{statistics.median(sio):.3f}")]
    if "dlio" not in args.skip:
        if not (args.dlio_venv / "bin" / "dlio_benchmark").exists():
            print(f"no dlio_benchmark in {args.dlio_venv}: the DLIO comparison was not run (see the docstring)")
        else:
            ours, theirs, dropped = dlio_vs_ours(args.dir, args.dlio_venv, args.rounds, args.dlio_files)
            r = [o / t for o, t in zip(ours, theirs, strict=True)]
            print(f"emulate / DLIO samples per second: median {statistics.median(r):.0f}x "
                  f"(page cache {'dropped' if dropped else 'NOT dropped'} before DLIO)")
            figs.append(Figure("emulate", "4 KiB samples, 1 reader, no compute: emulate vs dlio-benchmark (npy)",
                               "samples/s", statistics.median(ours), statistics.median(theirs),
                               "dlio-benchmark 2.0.0", note=f"DLIO: a file per sample, page cache "
                               f"{'dropped' if dropped else 'warm'}; ours: O_DIRECT rows of one bin"))
    before, after = load0, os.getloadavg()[0]
    print(f"load average (1 min): {before:.2f} before, {after:.2f} after (2 cores, shared with other work)")
    figs = [dataclasses.replace(f, note=f"{f.note}; load {before:.2f} before, {after:.2f} after") for f in figs]
    write(args.json, "bench_emulate", figs, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
