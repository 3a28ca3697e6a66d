"""Graph partitioning: METIS against streaming LDG, and partition ownership against hash ownership, side by side.

    python tools/bench_partition.py [--quick] [--json out.json] [--dir DIR]

For each graph (the fixtures Cora and Amazon-Photo, CiteSeer / PubMed /
ogbn-arxiv where ``../shared/fixtures/graphs`` has them, and the skewed
Chung-Lu graph of ``tools/_cli.py``'s ``skewed_graph()``), at 2 and 4 parts:

* each partitioner (``metis``, ``ldg``) runs in a child process (``moment data
  partition`` 's library call, partition then the streamed write): seconds,
  the child's peak memory against a child that only opens the dataset (and
  loads the same modules): ``VmHWM`` and the peak anonymous memory (``RssAnon``
  sampled every 10 ms, without the memory-mapped files' page cache), the
  edge cut and the balance (largest part over the mean:
  vertices, CSR entries, training seeds);
* the remote share of sampled rows (every rank samples 4 batches of 1024 of
  its partition's training seeds, fan-outs 10,5, and counts the rows its node
  does not hold), under partition ownership, ``v mod P`` hash ownership and
  random ownership, on the same batches (DistDGL's figure: METIS against random);
* the placement half: the layout ``moment place --nodes P --partition`` makes
  (:func:`iostack.shards.partition_rows`) against today's deal by hotness
  (:func:`iostack.shards.shard_rows`), both with the 5% hottest rows on 2
  nodes (hotness by pre-sampling): remote share, and the feature bytes of the
  largest node over a full copy; the graph bytes a rank holds (global indptr,
  old_ids, part_of and its slice of the indices) over the whole CSR.

``--scale-edges E`` partitions a synthetic graph of E CSR entries (E/10
vertices) with LDG and METIS in children and reports their peak anonymous
memory over the baseline per vertex and per edge; with two sizes, the growth
between them per vertex is extrapolated to 10^8 vertices and 10^9 edges
(printed). Figures go to ``--json`` for ``tools/bench_all.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _cli import moment, skewed_graph
from _results import Figure, write

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIXTURES = REPO.parent / "shared" / "fixtures" / "graphs"
#: fixture directories tried besides Cora and Amazon-Photo (imported when present)
MORE_FIXTURES = ("citeseer", "pubmed", "ogbn-arxiv", "ogbn_arxiv")


class AnonPeak:
    """The largest ``RssAnon`` of this process, sampled every 10 ms by a thread: the memory a run allocates,
    without the memory-mapped files' pages (page cache the kernel takes back, which ``VmHWM`` counts too)."""

    def __init__(self) -> None:
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _status("RssAnon:"))
            self._stop.wait(0.01)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _status("RssAnon:"))


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0


def child(argv: list[str]) -> int:
    """In a child process: ``noop DATASET`` opens it; ``METHOD DATASET PARTS OUT`` partitions and writes."""
    from training.data import open_dataset
    from training.partition.run import partition_dataset

    anon = AnonPeak()
    ds = open_dataset(argv[1])
    if argv[0] == "noop":  # the same modules loaded (numba's LDG kernel, scipy, pymetis): their pages are no bound
        import pymetis  # noqa: F401
        import scipy.sparse  # noqa: F401

        from training.partition.stream import _kernel

        _kernel()
        print(json.dumps({"peak_rss_bytes": _status("VmHWM:"), "peak_anon_bytes": anon.stop()}))
        return 0
    res = partition_dataset(ds, argv[3], int(argv[2]), method=argv[0], overwrite=True, presample_batches=0)
    # VmHWM: this program's own peak (wait4's ru_maxrss would carry the parent's over the fork)
    print(json.dumps({"partition_s": res.partition_s, "write_s": res.write_s, "peak_rss_bytes": _status("VmHWM:"),
                      "peak_anon_bytes": anon.stop()}))
    return 0


def run_child(*args: str) -> dict:
    """Run :func:`child` with ``args``; its JSON (with its peak RSS in bytes)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, __file__, "--child", *args], stdout=subprocess.PIPE, env=env, text=True)
    if p.returncode != 0:
        raise SystemExit(f"child {args} failed with status {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def graphs(work: Path, quick: bool, nodes: int, edges: int) -> list[tuple[str, Path]]:
    out = []
    for name, src in (("cora", FIXTURES / "cora"), ("amazon-photo", FIXTURES / "amazon-photo" / "amazon_photo.npz"),
                      *((n, FIXTURES / n) for n in MORE_FIXTURES)):
        if not src.exists():
            continue
        dst = work / name
        if not (dst / "meta.json").exists():
            moment("data", "import", str(src), str(dst))
        out.append((name, dst))
    out.append(("skewed", skewed_graph(work / "skewed", nodes // (5 if quick else 1), edges // (5 if quick else 1))))
    return out


def _hotness(ds):
    from training.hotness import HotnessSpec, presample_counts

    return presample_counts(ds, HotnessSpec("presample", fanouts=(10, 5), batch_size=1024, epochs=1.0))[0]


def measure_graph(name: str, path: Path, work: Path, parts: int) -> list[dict]:
    """Every method at ``parts`` on one graph: one row of figures each."""
    import numpy as np

    from iostack.shards import partition_rows, shard_rows
    from training.data import open_dataset
    from training.partition.quality import hash_layout, random_layout, remote_share
    from training.partition.read import open_partition, summary

    ds = open_dataset(path)
    hot = _hotness(ds)
    hot_rows = round(0.05 * ds.num_nodes)
    b = run_child("noop", str(path))
    base, base_anon = b["peak_rss_bytes"], b["peak_anon_bytes"]
    rows = []
    for method in ("metis", "ldg"):
        out = work / f"{name}-{parts}-{method}"
        r = run_child(method, str(path), str(parts), str(out))
        pt = open_partition(out)
        s = summary(pt.manifest)
        part_of = np.asarray(pt.part_of)
        layouts = {"partition": partition_rows(part_of, num_nodes=parts), "hash": hash_layout(ds.num_nodes, parts),
                   "random": random_layout(ds.num_nodes, parts),
                   "partition+hot": partition_rows(part_of, hot, 2, hot_rows, num_nodes=parts),
                   "hotness+hot": shard_rows(hot, parts, 2, hot_rows)}
        rs = remote_share(ds, part_of, layouts)
        full_graph = ds.indptr.nbytes + ds.indices.nbytes
        shared = pt.indptr.nbytes + pt.old_ids.nbytes + pt.part_of.nbytes
        graph_node = shared + max(pt.part(k).indices.nbytes for k in range(parts))
        feat = {k: int(layouts[k].bytes_per_node(ds.row_bytes).max()) for k in ("partition+hot", "hotness+hot")}
        rows.append({"graph": name, "parts": parts, "method": method, "nodes": ds.num_nodes, "edges": ds.num_edges,
                     **r, "baseline_rss_bytes": base, "baseline_anon_bytes": base_anon,
                     "edge_cut_share": s["edge_cut_share"],
                     "balance": s["balance"], "halo_share": s["halo_share"],
                     "remote": {k: rs.share(k) for k in layouts}, "sampled_rows": rs.rows,
                     "graph_bytes_node_share": graph_node / full_graph, "shared_index_share": shared / full_graph,
                     "feature_bytes_largest_node_share": {k: v / max(ds.feature_bytes, 1) for k, v in feat.items()}})
        shutil.rmtree(out, ignore_errors=True)
    return rows


def scale(work: Path, edges: float) -> list[dict]:
    """LDG and METIS in children on a synthetic graph of ``edges`` CSR entries: peak RSS over the baseline."""
    e = int(edges)
    path = work / f"synth-{e}"
    if not (path / "meta.json").exists():
        moment("data", "synth", str(path), "--nodes", str(e // 10), "--edges", str(e // 2), "--generator",
               "chung-lu", "--undirected", "--feature-dim", "4", "--train-share", "0.01", "--seed", "5", "--quiet")
    b = run_child("noop", str(path))
    base, base_anon = b["peak_rss_bytes"], b["peak_anon_bytes"]
    rows = []
    # METIS holds about 1.3 KB a vertex (scipy's symmetrised copy and its own graph): past 2e7 entries that is
    # more than this shared machine lends, so the large runs are LDG's alone
    for method in ("ldg", "metis") if e <= 2e7 else ("ldg",):
        out = work / f"synth-{e}-{method}"
        r = run_child(method, str(path), "4", str(out))
        man = json.loads((out / "partition.json").read_text())
        rows.append({"method": method, "edges": man["num_edges"], "nodes": man["num_nodes"], **r,
                     "baseline_rss_bytes": base, "baseline_anon_bytes": base_anon,
                     "edge_cut_share": man["edge_cut"] / man["num_edges"]})
        shutil.rmtree(out, ignore_errors=True)
    return rows


def figures(rows: list[dict], scaled: list[dict]) -> list[Figure]:
    figs = []
    for r in rows:
        g, p, m, rem = r["graph"], r["parts"], r["method"], r["remote"]
        for ref in ("hash", "random"):
            figs.append(Figure("partition", f"{g}, {p} parts: remote share of sampled rows, {m} vs {ref} ownership",
                               "share", rem["partition"], rem[ref], f"{ref} ownership", higher_is_better=False,
                               target="several times lower (DistDGL: METIS vs random)"))
        figs.append(Figure("partition", f"{g}, {p} parts, {m}: remote share, 5% hottest on 2 nodes: partition "
                           "ownership vs today's deal by hotness", "share", rem["partition+hot"], rem["hotness+hot"],
                           "shard_rows (hotness deal)", higher_is_better=False))
        fb = r["feature_bytes_largest_node_share"]
        figs.append(Figure("partition", f"{g}, {p} parts, {m}: feature bytes of the largest node over a full copy",
                           "share", fb["partition+hot"], fb["hotness+hot"], "shard_rows (hotness deal)",
                           higher_is_better=False, target="about 1/N plus the replicated share"))
        figs.append(Figure("partition", f"{g}, {p} parts, {m}: graph bytes a rank holds over the whole CSR",
                           "share", r["graph_bytes_node_share"], 1.0, "a full copy (today)", higher_is_better=False,
                           note=f"of which the global indptr, old_ids and part_of {r['shared_index_share']:.1%}"))
    by = {(r["graph"], r["parts"], r["method"]): r for r in rows}
    for (g, p, m), r in by.items():
        if m != "metis" or (g, p, "ldg") not in by:
            continue
        ldg = by[(g, p, "ldg")]
        figs.append(Figure("partition", f"{g}, {p} parts: edge cut share, METIS vs LDG", "share",
                           r["edge_cut_share"], ldg["edge_cut_share"], "LDG (streaming)", higher_is_better=False))
        figs.append(Figure("partition", f"{g}, {p} parts: seconds to partition, METIS vs LDG", "s",
                           r["partition_s"], ldg["partition_s"], "LDG (streaming)", higher_is_better=False))
    for r in scaled:
        extra = r["peak_anon_bytes"] - r["baseline_anon_bytes"]
        figs.append(Figure("partition", f"{r['method']} partition + write at {r['edges']:.2g} CSR entries: "
                           "peak anonymous memory above opening the dataset, bytes per vertex", "B/vertex",
                           extra / r["nodes"], None, "", higher_is_better=False,
                           note=f"{extra / 2**20:.0f} MiB over {r['nodes']:,} vertices; VmHWM with the mapped "
                                f"files {r['peak_rss_bytes'] / 2**20:.0f} MiB; {r['partition_s']:.1f} s + "
                                f"{r['write_s']:.1f} s"))
    return figs


def report(rows: list[dict], scaled: list[dict]) -> None:
    print(f"{'graph':<13}{'P':>2} {'method':<6}{'cut':>7}{'bal v/e/s':>17}{'halo':>7}{'remote: part':>13}"
          f"{'hash':>7}{'random':>7}{'x vs hash':>10}{'+hot: part':>11}{'hotdeal':>8}{'graph/node':>11}"
          f"{'time s':>8}{'anon MiB':>9}")
    for r in rows:
        b, rem = r["balance"], r["remote"]
        print(f"{r['graph']:<13}{r['parts']:>2} {r['method']:<6}{r['edge_cut_share']:>7.1%}"
              f"{b['nodes']:>7.2f}/{b['edges']:.2f}/{b['train_seeds']:.2f}{r['halo_share']:>7.1%}"
              f"{rem['partition']:>13.1%}{rem['hash']:>7.1%}{rem['random']:>7.1%}"
              f"{rem['hash'] / max(rem['partition'], 1e-9):>9.1f}x{rem['partition+hot']:>11.1%}"
              f"{rem['hotness+hot']:>8.1%}{r['graph_bytes_node_share']:>11.1%}"
              f"{r['partition_s'] + r['write_s']:>8.2f}"
              f"{(r['peak_anon_bytes'] - r['baseline_anon_bytes']) / 2**20:>9.0f}")
    first = {r["method"]: r for r in reversed(scaled)}  # each method's smallest run
    for r in scaled:
        extra = r["peak_anon_bytes"] - r["baseline_anon_bytes"]
        f = first[r["method"]]
        print(f"scale {r['method']}: {r['edges']:,} CSR entries, {r['nodes']:,} vertices: partition "
              f"{r['partition_s']:.1f} s, write {r['write_s']:.1f} s; peak anonymous memory "
              f"{r['peak_anon_bytes'] / 2**20:.0f} MiB ({extra / 2**20:.0f} MiB above opening the dataset: "
              f"{extra / r['nodes']:.1f} B/vertex, {extra / r['edges']:.2f} B/edge); VmHWM with the mapped files "
              f"{r['peak_rss_bytes'] / 2**20:.0f} MiB; cut {r['edge_cut_share']:.1%}")
        if f is not r and r["nodes"] > f["nodes"]:  # the growth between two sizes: what scales with the graph
            slope = (r["peak_anon_bytes"] - f["peak_anon_bytes"]) / (r["nodes"] - f["nodes"])
            print(f"  growth from {f['edges']:,} entries: {slope:.1f} B a vertex; at 1e8 vertices (1e9 entries) "
                  f"about {slope * 1e8 / 2**30:.1f} GiB + {f['peak_anon_bytes'] / 2**30:.2f} GiB")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller skewed graph and scale run")
    ap.add_argument("--dir", default="/var/tmp/bench_partition", help="work directory (graphs are kept)")
    ap.add_argument("--nodes", type=int, default=100_000, help="skewed graph vertices (default 1e5)")
    ap.add_argument("--edges", type=int, default=1_000_000, help="skewed graph edges (default 1e6)")
    ap.add_argument("--scale-edges", type=float, nargs="*", default=None,
                    help="CSR entries of the scale runs (default 1e7; --quick 1e6)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    t0, load = time.time(), Path("/proc/loadavg").read_text().split()[:3]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {' '.join(load)}; warm page cache "
          "(graphs read once before)")
    rows = []
    for name, path in graphs(work, args.quick, args.nodes, args.edges):
        for parts in (2, 4):
            rows += measure_graph(name, path, work, parts)
    scaled = []
    for e in args.scale_edges if args.scale_edges is not None else ([1e6] if args.quick else [1e7]):
        scaled += scale(work, e)
    report(rows, scaled)
    print(f"{time.time() - t0:.0f} s; load at the end {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    cmd = "python tools/bench_partition.py " + " ".join(sys.argv[1:])
    write(args.json, "partition", figures(rows, scaled), cmd)
    if args.json:
        Path(args.json).with_suffix(".rows.json").write_text(json.dumps({"rows": rows, "scale": scaled}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
