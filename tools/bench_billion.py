"""A papers100M-shaped graph end to end on one machine, phase by phase (a benchmark run by hand, not a test).

    PYTHONPATH=. python tools/bench_billion.py --dir /var/tmp/billion --nodes 1e6 --edges 1.5e7   # smoke test
    PYTHONPATH=. nohup nice -n 5 python tools/bench_billion.py --dir /var/tmp/billion --resume --json F &  # full size

The default size is ogbn-papers100M's: 111,059,956 vertices, 1,615,685,872
directed edges (R-MAT at Graph500's skew, a = 0.57), 128-dimensional
features, 172 classes, and papers100M's split sizes (train 1,207,179, valid
125,265, test 214,338; scaled by ``--nodes`` on a smaller run). The features
are **float16 on disk** because of the disk: 111 M x 128 x 2 bytes is 28 GB,
float32 would be 57 GB, more than the 50 GB this run may use beside the CSR.

Phases, each its own process (``moment ...``) so that its wall time and peak
RSS (``os.wait4``) are its own; each is recorded in ``<dir>/bench_state.json``
when it ends, and ``--resume`` skips the recorded ones (``moment data synth``
itself resumes a killed run from its checkpoint):

1. ``synth``: ``moment data synth`` (bound: :mod:`training.synth_run`);
2. ``verify``: ``moment data info --verify`` (every CRC block, chunked range checks);
3. ``place``: ``moment place --in-place`` on a one-SSD machine: hotness by
   pre-sampling (``--presample-batches``), DDAK over every row, a
   ``--cpu-cache`` host cache; the SSD bin is the dataset's ``features.npy``;
4. ``profile``: ``moment profile`` of that very file at the row size;
5. ``train``: ``moment train`` GraphSAGE fan-outs 25,10 for ``--steps`` steps
   (a view of the dataset whose train split is ``steps x batch`` of the real
   one: the files are links to the dataset's own), CPU only;
6. the same synth / place / train on a ``--small-edges`` graph of the same
   mean degree: the cost of scale per stage (seeds/s);
7. ``replay``: the training's gather stream through the feature store (SSD
   bytes / SSD read seconds against the profile, goal >= 0.8);
8. ``sampler``: the same sampler on the big graph's memory-mapped CSR (cold:
   its pages dropped with ``posix_fadvise``; warm: again) and on the small
   graph's CSR loaded into memory: sampled edges/s per hop, and the major page
   faults the cold run took.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _results import Figure, drop_from_page_cache, write
from bench_outofcore import ONE_SSD, profile_rate, replay

PAPERS = {"nodes": 111_059_956, "edges": 1_615_685_872, "train": 1_207_179, "valid": 125_265, "test": 214_338}


def _count(text: str) -> int:
    return int(float(text)) if any(c in text for c in ".eE") else int(text)


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def _rss_kinds(pid: int) -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes of ``pid`` now (0, 0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("RssAnon", "RssFile")))
    except OSError:
        return 0, 0
    return tuple(int(fields.get(k, "0 kB").split()[0]) * 1024 for k in ("RssAnon", "RssFile"))


def phase(name: str, args: list[str], log: Path, tree: Path | None = None) -> dict:
    """Run ``python -m moment ARGS`` as its own process: seconds, peak RSS (``wait4``), and the peaks of its
    anonymous and file-backed resident memory (polled every 0.5 s): the file-backed part is memory-mapped
    dataset pages, the kernel's page cache, which the kernel takes back under pressure. ``tree``: the
    checkout whose ``moment`` runs (default this one)."""
    print(f"\n== {name}: moment {' '.join(args)}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(tree or Path(__file__).resolve().parents[1])}
    t = time.perf_counter()
    peaks = [0, 0]
    with open(log, "w") as out:
        p = subprocess.Popen([sys.executable, "-m", "moment", *args], stdout=out, env=env)  # progress: stderr
        done = threading.Event()

        def poll() -> None:
            while not done.wait(0.5):
                for i, v in enumerate(_rss_kinds(p.pid)):
                    peaks[i] = max(peaks[i], v)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        _, status, ru = os.wait4(p.pid, 0)
        done.set()
        th.join()
    sec = time.perf_counter() - t
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"bench_billion: {name} failed (exit {code}); its output is in {log}")
    print(f"== {name}: {sec:.1f} s, peak RSS {ru.ru_maxrss / 2**20:.2f} GiB (anonymous {peaks[0] / 2**30:.2f}, "
          f"mapped files {peaks[1] / 2**30:.2f})", flush=True)
    return {"seconds": sec, "peak_rss_bytes": ru.ru_maxrss * 1024, "peak_anon_bytes": peaks[0],
            "peak_file_bytes": peaks[1], "stdout": log.read_text()}


class State:
    """``bench_state.json``: the recorded phases (seconds, peak RSS, stdout, load), kept across runs."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path = path
        self.data = json.loads(path.read_text()) if resume and path.exists() else {"phases": {}}

    def run(self, name: str, args: list[str], work: Path) -> dict:
        if name in self.data["phases"]:
            print(f"== {name}: recorded, skipped (--resume)", flush=True)
            return self.data["phases"][name]
        before = _load()
        rec = phase(name, args, work / f"{name}.log")
        rec.update(load_before=before, load_after=_load(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        self.record(name, rec)
        return rec

    def record(self, name: str, rec: dict) -> None:
        self.data["phases"][name] = rec
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def synth_args(ds: Path, nodes: int, edges: int, a: argparse.Namespace) -> list[str]:
    share = {k: PAPERS[k] / PAPERS["nodes"] for k in ("train", "valid", "test")}
    return ["data", "synth", str(ds), "--nodes", str(nodes), "--edges", str(edges), "--generator", a.generator,
            "--feature-dim", str(a.feature_dim), "--feature-dtype", "float16", "--classes", "172",
            "--train-share", repr(share["train"]), "--valid-share", repr(share["valid"]),
            "--test-share", repr(share["test"]), "--seed", "0"]


def train_view(ds: Path, view: Path, train_seeds: int, valid_seeds: int) -> None:
    """A dataset directory whose files link to ``ds``'s but whose train (valid) split is ``train_seeds``
    (``valid_seeds``) of the real one's ids, drawn with a fixed seed: a fixed number of steps of
    ``moment train`` and a short evaluation, without copying a byte of the graph or the features."""
    if view.exists():
        shutil.rmtree(view)
    view.mkdir()
    meta = json.loads((ds / "meta.json").read_text())
    subsets = {"train_idx": train_seeds, "valid_idx": valid_seeds}
    for f in ds.iterdir():
        if f.suffix == ".npy" and f.stem not in subsets:
            (view / f.name).symlink_to(f.resolve())
    for key, count in subsets.items():
        ids = np.load(ds / f"{key}.npy")
        pick = np.sort(ids[np.random.default_rng(0).permutation(ids.size)[:count]])
        np.save(view / f"{key}.npy", pick)
        meta["files"][key]["shape"] = [int(pick.size)]
        # the view's own splits are not what the checksums cover; the other files still are
        meta.get("checksums", {}).get("files", {}).pop(key, None)
    (view / "meta.json").write_text(json.dumps(meta, indent=1))


def sampler_rates(ds: Path, *, in_memory: bool, fanouts: tuple[int, ...], batch_size: int, batches: int,
                  seed: int = 0, before=lambda: None) -> dict:
    """Sampled edges/s per hop of ``NeighborSampler`` over ``batches`` batches of train seeds, with the
    CSR memory-mapped (``in_memory=False``) or read into memory first; the major page faults taken."""
    import resource

    import torch

    from training.data import open_dataset
    from training.sampler import NeighborSampler

    d = open_dataset(ds, verify="none", validate=False)
    indptr, indices = d.indptr, d.indices
    if in_memory:
        indptr, indices = np.array(indptr), np.array(indices)
    s = NeighborSampler(indptr, indices, fanouts=fanouts, seed=seed, num_threads=1)
    train = np.asarray(d.train_idx)
    order = torch.from_numpy(train[np.random.default_rng(seed).permutation(train.size)])
    # hop 1 alone first (same seeds, same stream), then all hops: the later hops' time is the
    # difference. ``before()`` runs before each (a cold measurement drops the CSR's pages there,
    # so that the all-hops run does not find hop 1's pages warm)
    hop1 = NeighborSampler(indptr, indices, fanouts=fanouts[:1], seed=seed, num_threads=1)
    out: dict = {"batches": batches, "in_memory": in_memory}
    for name, smp in (("hop1", hop1), ("all", s)):
        edges = np.zeros(len(smp.fanouts))
        before()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        t = time.perf_counter()
        for i in range(batches):
            edges += smp.sample(order[(i * batch_size) % order.numel():][:batch_size]).num_sampled_edges
        out[name] = {"wall_s": time.perf_counter() - t, "hop_edges": edges.tolist(),
                     "major_faults": int(resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults)}
    h1, al = out["hop1"], out["all"]
    out["hop1_edges_per_s"] = h1["hop_edges"][0] / h1["wall_s"]
    later_s = al["wall_s"] - h1["wall_s"]
    # None when noise makes the difference meaningless (the later hops cannot take no time)
    out["later_hops_edges_per_s"] = sum(al["hop_edges"][1:]) / later_s if len(fanouts) > 1 and later_s > 0 else None
    out["edges_per_s"] = sum(al["hop_edges"]) / al["wall_s"]
    out["major_faults"] = h1["major_faults"] + al["major_faults"]
    return out


def pipeline(st: State, tag: str, ds: Path, nodes: int, edges: int, a: argparse.Namespace, work: Path) -> None:
    """synth, verify, place, train of one graph (phase names prefixed by ``tag``)."""
    st.run(f"{tag}synth", synth_args(ds, nodes, edges, a), work)
    st.run(f"{tag}verify", ["data", "info", str(ds), "--verify", "--json"], work)
    if tag == "" and a.ready_file:  # others may now read the dataset (read-only)
        Path(a.ready_file).write_text(str(ds) + "\n")
    pl = work / f"{tag}pl"
    st.run(f"{tag}place", [
        "place", "--dataset", str(ds), "--machine", str(work / "one-ssd.yaml"), "--gpu-cache", "0",
        "--cpu-cache", a.cpu_cache, "--ssd", str(work / f"{tag}ssd"), "--in-place", "--fanouts", a.fanouts,
        "--batch-size", str(a.batch_size), "--presample-batches", str(a.presample_batches),
        "--hotness-dir", str(work / f"{tag}hotness"), "--out", str(pl), "--force", "--json"], work)
    view = work / f"{tag}view"
    if f"{tag}train" not in st.data["phases"]:
        train_view(ds, view, a.steps * a.batch_size, a.batch_size)
    st.run(f"{tag}train", [
        "train", "--dataset", str(view), "--placement", str(pl), "--epochs", "1", "--fanouts", a.fanouts,
        "--batch-size", str(a.batch_size), "--eval-every", "0", "--json"], work)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/billion", help="work directory (datasets, placements, logs)")
    ap.add_argument("--nodes", default=str(PAPERS["nodes"]), help="vertices (default papers100M's 111,059,956)")
    ap.add_argument("--edges", default=str(PAPERS["edges"]), help="edges (default papers100M's 1,615,685,872)")
    ap.add_argument("--small-edges", default="1e8", help="the cost-of-scale graph's edges, same mean degree")
    ap.add_argument("--generator", default="rmat", help="rmat (Graph500 skew, default) or chung-lu")
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", default="25,10")
    ap.add_argument("--cpu-cache", default="2GiB", help="host cache for the hottest rows (default 2GiB)")
    ap.add_argument("--presample-batches", type=int, default=200, help="pre-sampling batches for the hotness")
    ap.add_argument("--sampler-batches", type=int, default=40)
    ap.add_argument("--replay-batches", type=int, default=40)
    ap.add_argument("--runtime-gib", type=float, default=3.0,
                    help="train RSS allowed beyond cache + CSR + labels: torch, model, batches (default 3)")
    ap.add_argument("--phases", default="all", help="stop after this phase group: synth, big, small, all")
    ap.add_argument("--resume", action="store_true", help="skip the phases bench_state.json records")
    ap.add_argument("--json", help="write the figures here (tools/_results.py rows)")
    ap.add_argument("--ready-file", help="write the dataset's path here once it is generated and verified")
    a = ap.parse_args()

    work = Path(a.dir)
    work.mkdir(parents=True, exist_ok=True)
    nodes, edges = _count(a.nodes), _count(a.edges)
    small_edges = _count(a.small_edges)
    small_nodes = max(1000, round(nodes * small_edges / edges))
    (work / "one-ssd.yaml").write_text(ONE_SSD)
    st = State(work / "bench_state.json", a.resume)
    st.data.setdefault("started", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(f"{nodes:,} nodes, {edges:,} edges; small graph {small_nodes:,} nodes, {small_edges:,} edges; "
          f"load {_load()}; disk free {shutil.disk_usage(work).free / 2**30:.0f} GiB", flush=True)
    big, small = work / "papers", work / "small"
    if a.phases == "synth":
        st.run("synth", synth_args(big, nodes, edges, a), work)
        return
    pipeline(st, "", big, nodes, edges, a, work)
    # the store reads whole 4 KiB pages with O_DIRECT (rows of 256 B share them), so the profile
    # measures 4 KiB random reads of the same file
    st.run("profile", ["profile", "--ssd", str(big / "features.npy"), "--block-size", "4096",
                       "--no-memory", "--seconds", "5", "--out", str(work / "caps.json")], work)
    if a.phases != "big":
        pipeline(st, "small-", small, small_nodes, small_edges, a, work)
    fanouts = tuple(int(f) for f in a.fanouts.split(","))
    if "replay" not in st.data["phases"]:
        t = time.perf_counter()
        rp = replay(work / "view", work / "pl", fanouts=fanouts, batch_size=a.batch_size, batches=a.replay_batches)
        st.record("replay", {**rp, "seconds": time.perf_counter() - t, "load_after": _load()})
    if "sampler" not in st.data["phases"]:
        csr = [big / "indptr.npy", big / "indices.npy"]
        cold = sampler_rates(big, in_memory=False, fanouts=fanouts, batch_size=a.batch_size, batches=a.sampler_batches,
                             before=lambda: drop_from_page_cache(csr))
        warm = sampler_rates(big, in_memory=False, fanouts=fanouts, batch_size=a.batch_size, batches=a.sampler_batches)
        mem = (sampler_rates(small, in_memory=True, fanouts=fanouts, batch_size=a.batch_size,
                             batches=a.sampler_batches) if a.phases != "big" else None)
        st.record("sampler", {"cold_mmap": cold, "warm_mmap": warm, "small_in_memory": mem, "load_after": _load()})
    report(st, a, work, nodes, edges, small_nodes, small_edges)


def _epoch(rec: dict) -> dict:
    return json.loads(rec["stdout"])["epochs"][-1]


def _seeds_s(ep: dict) -> float:
    return (ep.get("seeds") or 0) / ep["epoch_s"] if ep.get("epoch_s") else 0.0


def report(st: State, a: argparse.Namespace, work: Path, nodes: int, edges: int, small_nodes: int,
           small_edges: int) -> None:
    """Print the table and write the figures (``--json``)."""
    ph = st.data["phases"]
    what = f"{nodes:,} nodes, {edges:,} edges"
    small = f"{small_nodes:,} nodes, {small_edges:,} edges"
    figs: list[Figure] = []
    print(f"\n{what}\n{'phase':14}{'seconds':>10}{'peak RSS':>10}{'anon':>8}{'files':>8} GiB  load before | after")
    for k, rec in ph.items():
        if "peak_rss_bytes" in rec:
            print(f"{k:14}{rec['seconds']:10.1f}{rec['peak_rss_bytes'] / 2**30:10.2f}"
                  f"{rec.get('peak_anon_bytes', 0) / 2**30:8.2f}{rec.get('peak_file_bytes', 0) / 2**30:8.2f}  "
                  f"{rec.get('load_before', '')} | {rec.get('load_after', '')}")
    synth_meta = json.loads((work / "papers" / "meta.json").read_text())
    for k, rec in ph.items():  # a phase started before this bench polled memory: polled from outside
        poll = work / f"{k}.rsspoll"
        if "peak_rss_bytes" in rec and "peak_anon_bytes" not in rec and poll.exists():
            got = dict(x.split("=") for x in poll.read_text().split())
            rec.update(
                peak_anon_bytes=int(got["peak_anon_kib"]) * 1024, peak_file_bytes=int(got["peak_file_kib"]) * 1024
            )
    gen = ph["synth"]
    # the synth bound (docs/scale.md): 52 B a node (the model and its build), ~100 B per chunk edge
    # (2**22), ~40 B per edge of the largest bucket (~2**24), the interpreter
    synth_bound = nodes * 52 + (1 << 22) * 100 + 40 * (1 << 24) * 1.25 + (1 << 29)
    figs.append(Figure("billion", f"{what}: synth peak anonymous RSS", "GiB", gen.get("peak_anon_bytes", 0) / 2**30,
                       synth_bound / 2**30, "bound: 52 B/node + 100 B x chunk + 40 B x bucket + 0.5 GiB",
                       higher_is_better=False, target="ours <= bound",
                       note=f"{gen['seconds']:.0f} s; {synth_meta['num_edges']:,} edges stored; peak RSS with mapped "
                            f"files {gen['peak_rss_bytes'] / 2**30:.2f} GiB (the commit's validation maps the CSR)"))
    for k in ("synth", "verify", "place", "profile", "train"):
        if k in ph:
            figs.append(Figure("billion", f"{what}: {k} wall time", "s", ph[k]["seconds"], None, "",
                               higher_is_better=False, target="minutes",
                               note=f"peak RSS {ph[k]['peak_rss_bytes'] / 2**30:.2f} GiB (anonymous "
                                    f"{ph[k].get('peak_anon_bytes', 0) / 2**30:.2f}, mapped files "
                                    f"{ph[k].get('peak_file_bytes', 0) / 2**30:.2f}); load {ph[k].get('load_before')}"))
    prof_bps, prof_tool = profile_rate(work / "caps.json")
    ep = _epoch(ph["train"])
    row_bytes = a.feature_dim * 2
    import iostack.placement as ipl

    cache_rows = sum(b.capacity_rows for b in ipl.load_placement(work / "pl").bins if b.kind == "cpu")
    csr = sum((work / "papers" / f).stat().st_size for f in ("indptr.npy", "indices.npy"))
    # anonymous: the host cache, 26 B a node (labels int64, the sampler's id map int64, the
    # placement's bin_of int16 and row_of int64), the runtime; mapped files: the CSR's pages
    bound = cache_rows * row_bytes + nodes * 26 + a.runtime_gib * 2**30
    tr = ph["train"]
    figs.append(
        Figure(
            "billion",
            f"{what}: train peak anonymous RSS",
            "GiB",
            tr.get("peak_anon_bytes", 0) / 2**30,
            bound / 2**30,
            "bound: cpu cache + 26 B/node + runtime",
            higher_is_better=False,
            target="ours <= bound",
            note=f"{a.steps} steps of {a.batch_size}; mapped files peak {tr.get('peak_file_bytes', 0) / 2**30:.2f} "
            f"GiB of a {csr / 2**30:.2f} GiB CSR; peak RSS {tr['peak_rss_bytes'] / 2**30:.2f} GiB",
        )
    )
    # rows of 256 B are read as whole 4 KiB pages (O_DIRECT): the device moves pages, so the rate to
    # hold against the profile's 4 KiB random reads is pages x 4 KiB per second of SSD reading
    t_ssd = next((t for t in (ep.get("prediction") or {}).get("tiers", []) if t.get("tier") == "ssd"), {})
    pages = (ep.get("ssd_reads") or {}).get("pages", 0)
    if t_ssd.get("measured_s"):
        figs.append(
            Figure(
                "billion",
                f"{what}: SSD read rate inside moment train (4 KiB pages) vs moment profile",
                "MB/s",
                pages * 4096 / t_ssd["measured_s"] / 1e6,
                prof_bps / 1e6,
                f"moment profile ({prof_tool}), same file, 4 KiB random reads",
                target="ratio >= 0.8",
                note=f"{pages:,} pages in {t_ssd['measured_s']:.1f} s of the trainer's SSD reads "
                f"({t_ssd['measured_bytes'] / 1e6:,.0f} MB of rows); load {ph['train'].get('load_before')}",
            )
        )
    rp = ph.get("replay")
    if rp and rp.get("wall_s"):
        # the replay's per-bin seconds add up reads in flight, so its wall time (sampling included)
        # is the honest divisor: a lower bound of the device rate
        figs.append(Figure("billion", f"{what}: SSD read rate (4 KiB pages), gather stream replayed, "
                                      "pages / replay wall time (a lower bound)", "MB/s",
                           rp.get("pages", 0) * 4096 / rp["wall_s"] / 1e6, prof_bps / 1e6,
                           f"moment profile ({prof_tool}), same file, 4 KiB random reads", target="ratio >= 0.8",
                           note=f"{rp['requests']:,} requests, {rp.get('pages', 0):,} pages in {rp['wall_s']:.1f} s "
                                f"with sampling; O_DIRECT {rp['direct']}"))
    if "small-train" in ph:
        sep = _epoch(ph["small-train"])
        figs.append(Figure("billion", f"seeds/s, {what} vs {small}",
                           "seeds/s", _seeds_s(ep), _seeds_s(sep), f"same train on {small}",
                           target="the cost of scale", note=f"{a.steps} steps, fan-outs {a.fanouts}, CPU"))
        for stage in ("sample_s", "gather_s", "compute_s", "io_wait_s"):
            figs.append(Figure("billion", f"train {stage[:-2]} seconds per step, {what} vs {small}", "s/step",
                               ep[stage] / max(1, ep["steps"]), sep[stage] / max(1, sep["steps"]),
                               "same train on the smaller graph", higher_is_better=False,
                               target="the cost of scale, per stage"))
        for k in ("synth", "verify", "place", "train"):
            figs.append(Figure("billion", f"{k}: seconds, {what} vs {small}", "s", ph[k]["seconds"],
                               ph[f"small-{k}"]["seconds"], "same phase on the smaller graph",
                               higher_is_better=False, target="the cost of scale (~edges ratio)"))
    sm = ph.get("sampler")
    if sm:
        ref = sm["small_in_memory"]
        for mode in ("cold_mmap", "warm_mmap"):
            r = sm[mode]
            for key, stage in (("hop1_edges_per_s", "hop 1"), ("later_hops_edges_per_s", "hop 2"),
                               ("edges_per_s", "all hops")):
                if r[key] is None:
                    continue
                figs.append(Figure("billion", f"sampler edges/s, {stage}, {what} mmap CSR ({mode.split('_')[0]})",
                                   "edges/s", r[key], ref[key] if ref else None,
                                   f"same sampler, in-memory CSR of {small}", target="the cost of scale",
                                   note=f"{r['major_faults']:,} major page faults; {r['batches']} batches"))
    print()
    for f in figs:
        ratio = f" ratio {f.ratio:.2f}" if f.ratio else ""
        ref = f" vs {f.reference:,.2f} ({f.reference_name})" if f.reference is not None else ""
        print(f"{f.figure}: {f.ours:,.2f} {f.unit}{ref}{ratio} {f.note}")
    write(a.json, "bench_billion", figs, " ".join(sys.argv))


if __name__ == "__main__":
    main()
