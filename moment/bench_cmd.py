"""``moment bench``: benchmarks. ``moment bench io raw|gather`` measures the feature store's I/O.

``raw``: random row reads from one SSD bin, ours against fio in the same run,
side by side with the ratio. ``gather``: the training access stream without
training (hot-skewed Zipf ids, or an id stream from a ``.npy``), DLIO-style.
``moment bench emulate WORKLOAD.yaml`` replays a whole training I/O workload
(:mod:`iostack.bench.emulate`); ``moment bench record`` records the stream of a
``moment train`` configuration for it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from iostack.backends import backend_choices
from iostack.vocab import ENGINES
from moment._args import examples
from moment.bars import Bars
from moment.errors import CommandError
from momentbase.space import reserve

#: fewer paired rounds than this are too noisy on a shared machine to choose an engine by
MIN_RUNS_TO_RECORD = 3

#: the picture formats of --plot (matplotlib picks the format from the suffix)
PICTURE_SUFFIXES = (".png", ".svg", ".pdf")


def register(subparsers) -> None:
    bench = subparsers.add_parser(
        "bench", help="benchmarks: the feature store's reads, training I/O emulation",
        description="Benchmarks of the feature store: raw SSD reads against fio, the gather stream, and "
                    "whole training I/O workloads replayed through the tiers.",
        **examples("moment bench io raw --dir /mnt/nvme0 --runs 6", "moment bench io gather --dir /mnt/nvme0",
                   "moment bench emulate workload.yaml --plot emulate.png"))
    groups = bench.add_subparsers(dest="bench_group", metavar="{io,emulate,record,ssds}", required=True)
    io = groups.add_parser("io", help="feature-store I/O: raw SSD reads vs fio, or the gather stream",
                           description="The feature store's I/O: raw SSD reads against fio, or the gather stream.",
                           **examples("moment bench io raw --dir /mnt/nvme0",
                                      "moment bench io gather --dir /mnt/nvme0 --seconds 10"))
    which = io.add_subparsers(dest="bench_io", metavar="{raw,gather}", required=True)

    raw = which.add_parser("raw", help="random row reads from one SSD bin: ours vs fio, with the ratio",
                           description="Random row reads from one SSD bin file: each of our read engines against "
                                       "fio on the same file, block size and queue depth, alternating, with the ratio.",
                           **examples("moment bench io raw --dir /mnt/nvme0 --runs 6   # each engine vs fio",
                                      "moment bench io raw --dir /var/tmp --file-size 1GiB --engine auto --runs 1"))
    raw.add_argument("--dir", required=True, help="directory on the SSD to test (a bin file is written there)")
    raw.add_argument("--file-size", default="4GiB",
                     help="bin file size (default 4GiB; larger than the page cache or O_DIRECT)")
    raw.add_argument("--row-size", default="4KiB", help="row = block size (default 4KiB)")
    raw.add_argument("--queue-depth", type=int, default=64, help="reads in flight, both tools (default 64)")
    raw.add_argument("--seconds", type=float, default=5.0, help="per tool per run (default 5)")
    raw.add_argument("--runs", type=int, default=3, help="alternating fio/ours runs (default 3)")
    raw.add_argument("--engine", choices=("all", *ENGINES), default="all",
                     help="our read engine(s): all (default: each that works here; with 3 runs or more the "
                          "fastest is recorded for this device, and engine 'auto' then uses it), auto, or one")
    raw.add_argument("--no-record", dest="record", action="store_false",
                     help="with --engine all: do not record the fastest engine")
    raw.set_defaults(func=_raw)

    g = which.add_parser("gather", help="the gather stream without training: rows/s, GB/s, tier shares, latency",
                         description="Gather Zipf-skewed batches of ids (or a recorded stream) through a feature "
                                     "store with GPU, CPU and SSD bins, without training.",
                         **examples("moment bench io gather --dir /mnt/nvme0",
                                    "moment bench io gather --vertices 100000 --cpu-rows 50000 --alpha 0.8 "
                                    "--seconds 3"))
    g.add_argument("--dir", help="where the bins are written (default: a temporary directory)")
    g.add_argument("--vertices", type=int, default=200_000, help="vertices (default 200000)")
    g.add_argument("--dim", type=int, default=1024, help="float32 features per row (default 1024 = 4 KiB rows)")
    g.add_argument("--gpu-rows", type=int, default=0, help="rows in a 'gpu' bin (on the CPU without CUDA)")
    g.add_argument("--cpu-rows", type=int, default=20_000, help="rows in the CPU bin (default 20000)")
    g.add_argument("--batch", type=int, default=8192, help="ids per gather (default 8192)")
    g.add_argument("--seconds", type=float, default=5.0)
    g.add_argument("--alpha", type=float, default=1.0, help="Zipf exponent of the ids (default 1.0)")
    g.add_argument("--ids", help="a .npy of vertex ids to replay instead of Zipf ids")
    g.add_argument("--backend", default="auto", choices=backend_choices())
    g.set_defaults(func=_gather)

    em = groups.add_parser(
        "emulate", help="replay a training I/O workload (YAML) through the tiered store, DLIO-style",
        description="Replay a workload (docs/emulate.md): the access stream of training (recorded with "
                    "`moment bench record`, or uniform / Zipf), emulated compute per step, readers, prefetch, "
                    "checkpoints; report throughput, per-tier rows/bytes/IOPS, gather latency, I/O wait and "
                    "accelerator utilisation (compute / step time).",
        **examples("moment bench emulate workload.yaml --plot emulate.png",
                   "moment bench emulate workload.yaml --json > result.json"))
    em.add_argument("workload", metavar="WORKLOAD.yaml", help="the workload file")
    em.add_argument("--json", action="store_true", help="print the result as JSON")
    em.add_argument("--plot", metavar="FILE", help="write a picture (PNG, SVG or PDF by suffix)")
    em.set_defaults(func=_emulate)

    rec = groups.add_parser(
        "record", help="record the feature-read stream of a moment train configuration (for emulate)",
        description="Sample the batches `moment train` would train on (same dataset, fan-outs, batch size, "
                    "seed, rank) and save each step's vertex ids and sampling time to a .npz stream.",
        **examples("moment bench record stream.npz --dataset graph --fanouts 25,10 --batch-size 1024"))
    rec.add_argument("out", metavar="OUT.npz", help="where the stream is written")
    rec.add_argument("--dataset", required=True, metavar="DIR")
    rec.add_argument("--fanouts", default="25,10", metavar="F1,F2,..")
    rec.add_argument("--batch-size", type=int, default=1024, metavar="N")
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--epochs", type=int, default=1, metavar="N")
    rec.add_argument("--rank", type=int, default=0, help="record this rank's share (default 0)")
    rec.add_argument("--world-size", type=int, default=1, help="of this many ranks (default 1)")
    rec.set_defaults(func=_record)
    _register_ssds(groups)


def _register_ssds(groups) -> None:
    ssds = groups.add_parser(
        "ssds", help="emulate several SSDs: throttled loop devices (root; README 'Emulating several SSDs')",
        description="Several SSDs of different speed on this machine's disk: loop devices with direct I/O, ext4 "
                    "and a blkio read throttle each (root, cgroup v1 blkio). `up` makes them and a machine spec "
                    "of the box, `caps` keys a `moment profile` of the mounts to that spec's SSDs, `down` removes "
                    "everything.",
        **examples("moment bench ssds up --root /var/tmp/emu --count 8 --total-iops 16000 --slow 6,7",
                   "moment bench ssds caps --root /var/tmp/emu profile.yaml caps.yaml",
                   "moment bench ssds down --root /var/tmp/emu"))
    which = ssds.add_subparsers(dest="bench_ssds", metavar="{up,caps,down}", required=True)
    up = which.add_parser("up", help="make the emulated SSDs, mount them under --root and throttle them",
                          description="Make --count throttled loop devices under --root, mounted at ROOT/mnt0 ..., "
                                      "and ROOT/machine.yaml, a machine spec of the box.",
                          **examples("moment bench ssds up --root /var/tmp/emu --count 8 --total-iops 16000 "
                                     "--slow 6,7"))
    up.add_argument("--root", required=True, help="directory for the backing files, mounts and state")
    up.add_argument("--count", type=int, default=8, help="SSDs (default 8)")
    up.add_argument("--size", default="1GiB", help="each SSD's (sparse) backing file (default 1GiB)")
    up.add_argument("--machine", default="moment-b", help="the spec whose SSDs' rates are scaled (default moment-b)")
    up.add_argument("--total-iops", type=float, required=True,
                    help="4 KiB reads/s of all SSDs together: keep it below what the disk delivers "
                         "(moment bench io raw)")
    up.add_argument("--slow", default="", metavar="I,J", help="SSDs behind a congested switch (indices)")
    up.add_argument("--slow-factor", type=float, default=0.3, help="their share of a normal SSD's rate (0.3)")
    up.set_defaults(func=_ssds_up)
    caps = which.add_parser("caps", help="key a moment profile of the mounts to the emulated machine's SSDs",
                            description="Re-key a `moment profile` of the mounts (block:loopN) to the SSD nodes "
                                        "of ROOT/machine.yaml (dev:ssd0 ...) for `moment plan --capacities`.",
                            **examples("moment bench ssds caps --root /var/tmp/emu profile.yaml caps.yaml"))
    caps.add_argument("--root", required=True)
    caps.add_argument("profile", metavar="PROFILE.yaml", help="moment profile --ssd MOUNT ... --out of the mounts")
    caps.add_argument("out", metavar="OUT.yaml", help="the capacities for moment plan --machine ROOT/machine.yaml")
    caps.set_defaults(func=_ssds_caps)
    down = which.add_parser("down", help="unmount, detach and delete the emulated SSDs and their cgroup",
                            description="Undo `moment bench ssds up`: unmount, detach the loop devices, delete the "
                                        "backing files and remove the cgroup.",
                            **examples("moment bench ssds down --root /var/tmp/emu"))
    down.add_argument("--root", required=True)
    down.set_defaults(func=_ssds_down)


def _console():
    from rich.console import Console

    return Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)


def _raw(args: argparse.Namespace) -> int:
    from rich.table import Table

    from iostack.bench.io import bench_raw
    from momentbase.units import format_size, parse_size

    if args.queue_depth < 1 or args.runs < 1 or not 0 < args.seconds < float("inf"):
        raise CommandError("--queue-depth and --runs must be >= 1 and --seconds > 0")
    d = Path(args.dir)
    if not d.is_dir():
        raise CommandError(f"--dir {d}: no such directory")
    con = _console()
    with Bars(log_every_s=10.0) as bars:  # the test file takes minutes to write: a line now and then, piped too
        res = bench_raw(d, file_bytes=parse_size(args.file_size), row_bytes=parse_size(args.row_size),
                        queue_depth=args.queue_depth, seconds=args.seconds, runs=args.runs,
                        engine=args.engine, progress=bars)
    t = Table(title=f"random {format_size(res.row_bytes)} row reads, queue depth {res.queue_depth}, "
                    f"{'O_DIRECT' if res.direct else 'buffered'}, {format_size(res.file_bytes)} file {res.path}")
    for c in ("run", "first", "fio", "k IOPS", "ours", "k IOPS", "ours / fio"):
        t.add_column(c, justify="right" if c not in ("fio", "ours", "first") else "left")
    for r in res.runs:
        t.add_row(str(r.round + 1), "fio" if r.fio_first else "ours", r.fio_engine, f"{r.fio_iops / 1e3:.1f}",
                  r.ours_engine, f"{r.ours_iops / 1e3:.1f}", f"{r.ratio:.2f}")
    con.print(t)
    for engine, runs in res.by_engine().items():
        ratios = sorted(r.ratio for r in runs)
        con.print(f"{engine}: median ours / fio over {len(runs)} runs: {statistics.median(ratios):.2f} "
                  f"(range {ratios[0]:.2f}..{ratios[-1]:.2f})")
    if len(res.by_engine()) > 1 and args.record and args.runs >= MIN_RUNS_TO_RECORD:
        from iostack.backends.choice import record_engine

        best = res.fastest()
        medians = {e: statistics.median(r.ratio for r in runs) for e, runs in res.by_engine().items()}
        con.print(f"fastest here: {best} (recorded in {record_engine(d, best, medians)}; engine 'auto' uses it)")
    con.print(f"store buffers {format_size(res.buffer_bytes)}, peak RSS {format_size(res.peak_rss_bytes)}")
    return 0


def _gather(args: argparse.Namespace) -> int:
    import numpy as np

    from iostack.bench.io import bench_gather
    from iostack.bins import write_bins
    from iostack.placement import simple_placement
    from iostack.store import FeatureStore
    from momentbase.units import format_size

    v, g, c = args.vertices, args.gpu_rows, args.cpu_rows
    if v < 1 or args.dim < 1 or args.batch < 1 or g < 0 or c < 0 or g + c > v:
        raise CommandError("need --vertices >= 1, --dim >= 1, --batch >= 1, --gpu-rows and --cpu-rows >= 0 "
                           "and --gpu-rows + --cpu-rows <= --vertices")
    if not 0 < args.seconds < float("inf") or not 0 <= args.alpha < float("inf"):
        raise CommandError(f"need --seconds > 0 and a Zipf exponent --alpha >= 0 (0: uniform ids), "
                           f"got {args.seconds:g} and {args.alpha:g}")
    if args.dir is not None and not Path(args.dir).is_dir():
        raise CommandError(f"--dir {args.dir}: no such directory (create it, or leave --dir out for a temporary one)")
    ids = None
    if args.ids:
        try:
            ids = np.load(args.ids, allow_pickle=False).astype(np.int64).reshape(-1)
        except (OSError, ValueError) as exc:
            raise CommandError(f"--ids {args.ids}: cannot read a .npy of ids ({exc})") from None
        if ids.size and (ids.min() < 0 or ids.max() >= v):
            raise CommandError(f"--ids {args.ids}: ids must lie in 0..{v - 1} (--vertices {v})")
    con = _console()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        fpath = Path(d) / "features.npy"
        feats = np.lib.format.open_memmap(fpath, mode="w+", dtype=np.float32, shape=(v, args.dim))
        reserve(fpath)  # a full disk: one line, not SIGBUS
        rng = np.random.default_rng(0)
        for a in range(0, v, 1 << 14):
            feats[a:a + (1 << 14)] = rng.random((min(v, a + (1 << 14)) - a, args.dim), dtype=np.float32)
        kinds = [k for k in (("gpu", g), ("cpu", c), ("ssd", v - g - c)) if k[1] > 0]
        p = simple_placement(v, kinds)
        with Bars(transient=True) as bars:
            write_bins(feats, p, d, progress=bars)
            with FeatureStore(p, d, features=feats, backend=args.backend) as store:
                r = bench_gather(store, batch=args.batch, seconds=args.seconds, alpha=args.alpha, ids=ids,
                                 progress=bars)
    con.print(f"{r.batches} gathers of {args.batch} ids in {r.seconds:.1f} s: "
              f"{r.rows_per_s / 1e3:.1f} k rows/s, {r.bytes_per_s / 1e9:.3f} GB/s "
              f"(SSD reads {'O_DIRECT' if r.direct else 'buffered'})")
    con.print("tier hit shares: " + ", ".join(f"{t} {s:.1%}" for t, s in sorted(r.tier_share.items())))
    con.print(f"gather latency p50 {r.latency_p50_s * 1e3:.2f} ms, p99 {r.latency_p99_s * 1e3:.2f} ms")
    con.print("store memory: " + ", ".join(f"{k} {format_size(b)}" for k, b in r.memory_bytes.items()))
    return 0


def _emulate(args: argparse.Namespace) -> int:
    import json

    from rich.table import Table

    from iostack.bench.emulate import emulate
    from iostack.bench.workload import load_workload
    from momentbase.units import format_size

    w = load_workload(args.workload)
    if args.plot:  # before the run: a bad picture name would otherwise fail after all of it
        from moment.outputs import check_file

        check_file(args.plot, "--plot", suffixes=PICTURE_SUFFIXES, inputs=(args.workload,), what="the picture")
    con = _console()
    with Bars(quiet=args.json, transient=True) as bars:
        res = emulate(w, progress=bars)
    if args.plot:
        from moment.plots import plot_emulation

        plot_emulation(res, args.plot)
    if args.json:
        sys.stdout.write(json.dumps(res.to_dict(), indent=2) + "\n")
        return 0
    con.print(f"[bold]{res.workload}[/bold]: {res.steps} steps by {res.readers} reader(s) in {res.seconds:.2f} s: "
              f"{res.steps_per_s:.1f} steps/s, {res.rows_per_s / 1e3:.1f} k rows/s, "
              f"{format_size(res.bytes_per_s)}/s (SSD reads {'O_DIRECT' if res.direct else 'buffered'})")
    con.print(f"I/O wait {res.io_wait_share:.1%} of step time · accelerator utilisation "
              f"{res.accelerator_utilisation:.1%} · gather latency p50 {res.latency_p50_s * 1e3:.2f} ms, "
              f"p99 {res.latency_p99_s * 1e3:.2f} ms · compute emulated on the {res.compute_on}")
    if res.checkpoint_bytes:
        con.print(f"checkpoints: {format_size(res.checkpoint_bytes)} in {res.checkpoint_s:.2f} s")
    t = Table(title="per tier", title_justify="left")
    for c in ("tier", "rows", "bytes", "read requests", "rows/s", "bytes/s", "requests/s"):
        t.add_column(c, justify="left" if c == "tier" else "right")
    for k, f in res.tiers.items():
        t.add_row(k, f"{f.rows:,}", format_size(f.bytes), f"{f.requests:,}", f"{f.rows_per_s / 1e3:.1f} k",
                  f"{format_size(f.bytes_per_s)}/s", f"{f.requests_per_s / 1e3:.1f} k")
    con.print(t)
    if args.plot:
        con.print(f"[dim]picture written to {args.plot}[/dim]")
    return 0


def _record(args: argparse.Namespace) -> int:
    from moment._args import parse_fanouts
    from training.stream import record_stream

    if args.batch_size < 1 or args.epochs < 1 or not 0 <= args.rank < args.world_size:
        raise CommandError("need --batch-size >= 1, --epochs >= 1 and 0 <= --rank < --world-size")
    out = Path(args.out)
    if not out.parent.is_dir():
        raise CommandError(f"{out}: directory {out.parent} does not exist")
    path = record_stream(args.dataset, out, fanouts=parse_fanouts(args.fanouts), batch_size=args.batch_size,
                         seed=args.seed, epochs=args.epochs, rank=args.rank, world_size=args.world_size)
    print(f"stream written to {path}")
    return 0


def _ssds_up(args: argparse.Namespace) -> int:
    from iostack.bench.loopssds import machine_spec_yaml, setup_emulated_ssds, spec_rates
    from momentbase.units import parse_size

    try:
        slow = [int(x) for x in args.slow.split(",") if x.strip()]
    except ValueError:
        raise CommandError(f"--slow {args.slow!r}: expected SSD indices like 6,7") from None
    rates, model = spec_rates(args.machine, args.count, args.total_iops, slow, args.slow_factor)
    state = setup_emulated_ssds(args.root, rates, size_bytes=parse_size(args.size))
    spec = Path(state.root) / "machine.yaml"
    spec.write_text(machine_spec_yaml(state))
    for d in state.devices:
        print(f"{d.mount}  {d.loop_device} ({d.maj_min})  {d.read_iops:,.0f} IOPS, {d.read_bytes_per_s / 1e6:.1f} MB/s")
    print(f"{len(state.devices)} x {model}, scaled; machine spec {spec}")
    print(f"join the throttle (this shell and what it starts): echo $$ > {state.cgroup}/cgroup.procs")
    return 0


def _ssds_caps(args: argparse.Namespace) -> int:
    from iostack.bench.loopssds import capacities_for_spec, load_state
    from planner.capacities import load_capacities, save_capacities

    path = save_capacities(capacities_for_spec(load_capacities(args.profile), load_state(args.root)), args.out)
    print(f"capacities keyed to {Path(args.root) / 'machine.yaml'}'s SSDs written to {path}")
    return 0


def _ssds_down(args: argparse.Namespace) -> int:
    from iostack.bench.loopssds import load_state, teardown_emulated_ssds

    left = teardown_emulated_ssds(load_state(args.root))
    for line in left:
        print(f"not undone: {line}", file=sys.stderr)
    return 1 if left else 0
