"""The sampler on a CSR whose neighbour lists stay on the SSD, against the same sampler in memory (not a test).

    PYTHONPATH=. python tools/bench_csr_ssd.py --dataset DIR [--memory-limit 512MiB] [--cache 64MiB]
        [--rounds 3] [--batches 20] [--batch-size 1024] [--fanouts 25,10] [--modes memory,disk,mmap] [--json F]

Each round runs every mode in its own process, on the same seeds (the first
``--batches`` batches of epoch ``round`` of the dataset's training split,
``training.batches.LocalBatchSource``, seed ``--seed``), and checks that every
mode sampled the same batches (a hash of each batch's ``n_id`` and ``edge_index``):

- ``memory`` (the reference): ``indptr`` and ``indices`` read whole into the
  process's memory first (the load is timed apart), then sampled; no memory
  limit, since the point is a CSR that fits;
- ``disk`` (ours): ``indptr`` memory-mapped, the neighbour lists read from
  ``indices.npy`` by :class:`training.diskcsr.DiskNeighbours`: O_DIRECT through
  the native AIO / io_uring engine, an adjacency cache of ``--cache`` filled
  first (timed apart); run inside a memory cgroup of ``--memory-limit`` (below
  the CSR's size: the CSR does not fit). Its SSD figures: bytes, pages and read
  requests over the seconds spent inside the reads (MB/s, IOPS), and the share
  of sampled edges the cache served. Then, in the same process, the engine's
  raw rate on the same file: random distinct 4 KiB pages, ``--raw-pages`` per
  call, as many calls as the sampler made (the device's ceiling for this access);
- ``disk-gap``: the same, also reading over gaps of up to ``--gap`` pages
  between needed pages (fewer, longer requests; off in ``disk``, the default);
- ``disk-nocache``: the same as ``disk`` without the adjacency cache;
- ``mmap``: the naive out-of-core way, both files memory-mapped (with
  ``madvise(MADV_RANDOM)``: without it each fault reads up to ``read_ahead_kb``
  around it, 8 MiB on this VM), in the same cgroup limit: every sampled
  position a page fault when not cached (its first
  ``--mmap-batches`` batches only: under a limit below the CSR it thrashes).

Cold start: before every mode of every round the dataset's two CSR files are
dropped from the page cache with ``posix_fadvise(DONTNEED)`` (those files
only: the machine is shared, so no global ``drop_caches`` unless
``--drop-caches``); the disk mode's reads bypass the page cache anyway.
Printed and written with ``--json``: medians and ranges over the rounds, the
date, the load before and after, the limit and each mode's peak memory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import Figure, drop_from_page_cache, write  # noqa: E402

MODES = ("memory", "disk", "disk-gap", "disk-nocache", "mmap")


def _size(text: str) -> int:
    from momentbase.units import parse_size

    return 0 if text in ("0", "none") else parse_size(text)


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# ------------------------------------------------------------------------------------------------
# one mode, in its own process


def _open_csr(mode: str, dataset: Path, cache_bytes: int, gap: int):
    import numpy as np

    from training.data import open_dataset
    from training.diskcsr import open_disk_csr

    ds = open_dataset(dataset, validate=False)
    t0 = time.perf_counter()
    if mode == "memory":
        csr = (np.load(dataset / "indptr.npy"), np.load(dataset / "indices.npy"))
    elif mode == "mmap":
        csr = (np.asarray(ds.indptr), np.asarray(ds.indices))
        # the fair naive reference: no read-around on a fault (this VM's read_ahead_kb reads up to 8 MiB)
        for name in ("indptr", "indices"):
            getattr(ds, name)._mmap.madvise(mmap.MADV_RANDOM)
    else:  # disk-gap: requests over gaps of up to ``gap`` pages too; disk-nocache: no adjacency cache
        csr = open_disk_csr(ds, cache_bytes=0 if mode == "disk-nocache" else cache_bytes,
                            **({"max_gap_pages": gap} if mode == "disk-gap" else {}))
    return ds, csr, time.perf_counter() - t0


def _raw_pages(disk, calls: int, pages_per_call: int, seed: int) -> dict:
    """The engine on its own: ``calls`` reads of ``pages_per_call`` random distinct pages of the same file."""
    import numpy as np

    rng = np.random.default_rng(seed)
    f = disk.file
    pages = reqs = 0
    secs = 0.0
    for _ in range(calls):
        want = np.unique(rng.integers(0, f.full_pages, pages_per_call))
        _, r = f.read_pages(want)
        pages, reqs, secs = pages + r.pages, reqs + r.requests, secs + r.read_s
    return {"pages": pages, "requests": reqs, "read_s": secs}


def child(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from training.batches import LocalBatchSource
    from training.sampler import NeighborSampler

    torch.set_num_threads(args.threads)
    ds, csr, open_s = _open_csr(args.child, args.dataset, args.cache, args.gap)
    sampler = NeighborSampler(*csr, tuple(int(f) for f in args.fanouts.split(",")), num_threads=args.threads)
    source = LocalBatchSource(sampler, np.asarray(ds.train_idx), args.batch_size, seed=args.seed)
    digests, edges, nodes, sample_s, n = [], 0, 0, 0.0, 0
    batches = source.batches(args.epoch)
    while n < args.batches:
        t = time.perf_counter()
        b = next(batches, None)
        if b is None:
            break
        sample_s += time.perf_counter() - t
        digests.append(hashlib.sha256(b.n_id.numpy().tobytes() + b.edge_index.numpy().tobytes()).hexdigest()[:12])
        edges, nodes, n = edges + b.num_edges, nodes + b.num_nodes, n + 1
    out = {"mode": args.child, "open_s": open_s, "batches": n, "edges": edges, "nodes": nodes,
           "sample_s": sample_s, "digests": digests}
    if args.child.startswith("disk"):
        disk = csr[1]
        s = disk.stats()
        out.update(csr=s.to_dict(), direct=disk.direct, describe=disk.describe(),
                   cache_bytes=int(disk.cache.values.nbytes), cache_vertices=int(disk.cache.vertices.size),
                   fill=disk.fill_reads.__dict__)
        calls = max(1, n * len(sampler.fanouts))
        out["raw"] = _raw_pages(disk, calls, max(1, s.pages // calls), args.seed)
        disk.close()
    out["maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


# ------------------------------------------------------------------------------------------------
# the rounds


def _run_mode(args: argparse.Namespace, mode: str, epoch: int, cgroup) -> dict:
    files = [args.dataset / "indptr.npy", args.dataset / "indices.npy"]
    if args.drop_caches:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    drop_from_page_cache(files)
    cmd = [sys.executable, __file__, "--child", mode, "--dataset", str(args.dataset), "--epoch", str(epoch),
           "--cache", str(args.cache), "--batches", str(args.mmap_batches if mode == "mmap" else args.batches),
           "--batch-size", str(args.batch_size),
           "--fanouts", args.fanouts, "--seed", str(args.seed), "--threads", str(args.threads), "--gap", str(args.gap)]
    limited = cgroup is not None and mode != "memory"  # the disk modes and mmap
    if limited:
        cgroup.drop_cache()
        cgroup.reset_peak()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          preexec_fn=cgroup.preexec() if limited else None)
    if proc.returncode != 0:
        sys.exit(f"{mode} failed (status {proc.returncode}; over the memory limit?): {proc.stderr.strip()[-800:]}")
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    if limited:
        rec["cgroup_peak_bytes"] = cgroup.usage().get("peak")
    return rec


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _figures(args, rounds: list[dict[str, dict]]) -> tuple[dict, list[Figure]]:
    per = {m: [r[m] for r in rounds] for m in args.modes}
    eps = {m: _summary([x["edges"] / x["sample_s"] for x in per[m]]) for m in args.modes}
    out: dict = {"edges_per_s": eps}
    figs = []
    cond = f"fan-out {args.fanouts}, batch {args.batch_size}, {args.batches} batches, {args.threads} thread(s)"
    if "disk" in per:
        d = per["disk"]
        csr = [x["csr"] for x in d]
        out["ssd_mb_per_s"] = _summary([c["bytes_read"] / c["read_s"] / 1e6 for c in csr])
        out["ssd_iops"] = _summary([c["requests"] / c["read_s"] for c in csr])
        out["ssd_pages_per_s"] = _summary([c["pages"] / c["read_s"] for c in csr])
        out["ssd_read_share_of_sampling"] = _summary([x["csr"]["read_s"] / x["sample_s"] for x in d])
        out["raw_mb_per_s"] = _summary([x["raw"]["pages"] * 4096 / x["raw"]["read_s"] / 1e6 for x in d])
        out["raw_iops"] = _summary([x["raw"]["requests"] / x["raw"]["read_s"] for x in d])
        out["cache_hit_rate"] = _summary([c["cache_hit_rate"] for c in csr])
        lim = f"under a {args.memory_limit_text} memory limit" if args.memory_limit else "no memory limit"
        names = {"memory": "in memory", "mmap": "memory-mapped (MADV_RANDOM), same limit",
                 "disk-gap": "on SSD with gap reads, same limit",
                 "disk-nocache": "on SSD without the adjacency cache, same limit"}
        for ref, name in names.items():
            if ref in per:
                figs.append(Figure("csr_ssd", f"sampler edges/s, CSR on SSD ({lim}, cache {args.cache_text}) vs "
                                   f"{name}; {cond}", "M edges/s", eps["disk"]["median"] / 1e6,
                                   eps[ref]["median"] / 1e6, f"the same sampler, CSR {name}"))
        figs.append(Figure("csr_ssd", f"SSD read rate while sampling (inside the reads); {cond}", "MB/s",
                           out["ssd_mb_per_s"]["median"], out["raw_mb_per_s"]["median"],
                           "random 4 KiB pages of the same file, same engine, same pages per call"))
        figs.append(Figure("csr_ssd", f"SSD read requests/s while sampling; {cond}", "IOPS",
                           out["ssd_iops"]["median"], out["raw_iops"]["median"],
                           "random 4 KiB pages of the same file, same engine"))
        figs.append(Figure("csr_ssd", f"adjacency cache hit rate (share of sampled edges), cache {args.cache_text}",
                           "share", out["cache_hit_rate"]["median"], None, "none"))
    return out, figs


def _print(args, rounds: list[dict[str, dict]], summary: dict) -> None:
    print(f"{'mode':<8}{'edges/s (median, range)':>34}{'open s':>9}{'peak MiB':>10}")
    for m in args.modes:
        e = summary["edges_per_s"][m]
        recs = [r[m] for r in rounds]
        peak = max((x.get("cgroup_peak_bytes") or x["maxrss_bytes"]) for x in recs) / 2**20
        print(
            f"{m:<8}{e['median']:>14,.0f} ({e['min']:,.0f}-{e['max']:,.0f})"
            f"{statistics.median(x['open_s'] for x in recs):>9.1f}"
            f"{peak:>10.0f}"
        )
    if "disk" in args.modes:
        for m in ("memory", "disk-gap", "disk-nocache", "mmap"):
            if m in args.modes:
                print(
                    f"disk / {m}: {summary['edges_per_s']['disk']['median'] / summary['edges_per_s'][m]['median']:.2f}x"
                )
        s = summary
        print(
            f"SSD while sampling: {s['ssd_mb_per_s']['median']:.0f} MB/s ({s['ssd_mb_per_s']['min']:.0f}-"
            f"{s['ssd_mb_per_s']['max']:.0f}), {s['ssd_iops']['median']:,.0f} requests/s, "
            f"{s['ssd_pages_per_s']['median']:,.0f} pages/s; "
            f"reads {100 * s['ssd_read_share_of_sampling']['median']:.0f}% "
            f"of sampling time; raw random pages {s['raw_mb_per_s']['median']:.0f} MB/s, "
            f"{s['raw_iops']['median']:,.0f} "
            f"requests/s; cache hit rate {100 * s['cache_hit_rate']['median']:.1f}% of sampled edges"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", type=Path, required=True, help="a dataset directory (moment data synth/import)")
    p.add_argument("--modes", default="memory,disk,disk-gap,mmap", help=f"some of {','.join(MODES)}")
    p.add_argument("--gap", type=int, default=6, help="pages of gap the disk-gap mode reads over")
    p.add_argument("--memory-limit", default="512MiB", help="cgroup limit of the disk and mmap modes (0: none)")
    p.add_argument("--cache", default="64MiB", help="the disk mode's adjacency cache")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=20, help="batches sampled per mode per round")
    p.add_argument("--mmap-batches", type=int, default=3,
                   help="batches of the mmap mode (it thrashes under a limit below the CSR: keep it short)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="25,10")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads, every mode")
    p.add_argument("--drop-caches", action="store_true", help="also drop the whole page cache before each mode")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--epoch", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.cache_text, args.cache = args.cache, _size(args.cache)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    args.modes = tuple(m for m in args.modes.split(",") if m)
    if not set(args.modes) <= set(MODES):
        sys.exit(f"--modes: choose from {', '.join(MODES)}")
    args.memory_limit_text, args.memory_limit = args.memory_limit, _size(args.memory_limit)
    csr_bytes = sum((args.dataset / f).stat().st_size for f in ("indptr.npy", "indices.npy"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the cgroup is removed (finally below)
    cgroup = None
    if args.memory_limit:
        from bench_train_dgl import Cgroup

        cgroup = Cgroup(args.memory_limit)
    load_before, date = _load(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{args.dataset}: CSR {csr_bytes / 2**20:,.0f} MiB; limit {args.memory_limit_text} for disk/mmap; "
          f"cache {args.cache_text}; load {load_before}; {date}; cold: CSR files evicted before each mode")
    rounds = []
    try:
        for r in range(args.rounds):
            rounds.append({m: _run_mode(args, m, r, cgroup) for m in args.modes})
            common = min(rec["batches"] for rec in rounds[-1].values())
            digests = {m: tuple(rec["digests"][:common]) for m, rec in rounds[-1].items()}
            if len(set(digests.values())) != 1:
                sys.exit(f"round {r}: the modes sampled different batches: {digests}")
            print(f"round {r}: " + ", ".join(f"{m} {rec['edges'] / rec['sample_s']:,.0f} edges/s"
                                             for m, rec in rounds[-1].items()) + " (same batches)", flush=True)
    finally:
        if cgroup is not None:
            cgroup.close()
    summary, figs = _figures(args, rounds)
    _print(args, rounds, summary)
    load_after = _load()
    print(f"load before {load_before}, after {load_after}")
    write(args.json, "bench_csr_ssd", figs, " ".join(sys.argv))
    if args.json:  # the raw rounds beside the figures
        data = json.loads(args.json.read_text())
        data.update(dataset=str(args.dataset), csr_bytes=csr_bytes, memory_limit_bytes=args.memory_limit,
                    cache_bytes=args.cache, date=date, load_before=load_before, load_after=load_after,
                    cold="CSR files evicted with posix_fadvise(DONTNEED) before each mode"
                         + ("; drop_caches too" if args.drop_caches else ""),
                    summary=summary, rounds=rounds)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
