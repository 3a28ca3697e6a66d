"""The edge split's memory: the in-memory split beside the split read in chunks, same graph and seed, side by side.

    python3 tools/bench_split_edges.py --edges 1e7 3e7 --json out.json

For each size a random undirected graph (``edges`` CSR edges, both directions, 10 per vertex on average) is
written as ``indptr.npy`` / ``indices.npy`` and split three times, each in a fresh process that maps the
arrays: ``base`` (imports and maps only), ``memory``
(:func:`training.link.edges.split_edges`) and ``streamed``
(:func:`training.link.streamsplit.split_edges_streamed`, chunks of ``--chunk-edges``). Each child reports
its peak resident memory (``VmHWM``; the mapped CSR's pages count where they are read) and its time,
and a digest of every output array: the two splits must agree. Ours is the streamed split, the reference
the in-memory one; the ratio is reference / ours (above 1: ours holds less). Cold: the first run after the
graph is written reads it from the page cache; one run per size (the peaks are deterministic up to the
allocator, the times are not: they are stated, not compared).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import Figure, write  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FIELDS = ("train_pos", "valid_pos", "test_pos", "valid_neg", "test_neg", "indptr", "indices")


def make_graph(edges: int, out: Path, seed: int = 0) -> None:
    """A random undirected graph of about ``edges`` CSR edges (both directions) as ``indptr.npy``/``indices.npy``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = max(10, edges // 10)
    half = edges // 2
    src = rng.integers(0, n, half, dtype=np.int64)
    dst = rng.integers(0, n, half, dtype=np.int64)
    keep = src != dst
    s, d = np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])
    del src, dst
    order = np.argsort(d, kind="stable")
    np.save(out / "indices.npy", s[order].astype(np.int32))
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(d, minlength=n), out=indptr[1:])
    np.save(out / "indptr.npy", indptr)


def _peak_rss() -> int:
    """This process's peak resident bytes since its exec (``VmHWM``; ``ru_maxrss`` would carry the parent's
    high-water mark at the fork across the exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class AnonPeak:
    """The peak of this process's anonymous resident memory (``RssAnon``: its own arrays, not mapped files'
    pages, which the kernel may drop), sampled every 20 ms on a thread."""

    def __init__(self) -> None:
        import threading

        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.now())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.now())


def child(mode: str, graph: Path, chunk: int) -> dict:
    """One split in this process: its seconds, peak RSS (all, and anonymous) and output digests."""
    import numpy as np

    anon = AnonPeak()

    indptr = np.load(graph / "indptr.npy", mmap_mode="r")
    indices = np.load(graph / "indices.npy", mmap_mode="r")
    from training.link.edges import split_edges
    from training.link.streamsplit import split_edges_streamed

    t0 = time.perf_counter()
    split = None
    if mode == "memory":
        split = split_edges(indptr, indices, undirected=True, seed=1)
    elif mode == "streamed":
        split = split_edges_streamed(indptr, indices, graph / "scratch", undirected=True, seed=1, chunk_edges=chunk)
    seconds = time.perf_counter() - t0
    peak, anon_peak = _peak_rss(), anon.stop()
    digests = {} if split is None else {
        f: hashlib.sha256(np.ascontiguousarray(getattr(split, f)).tobytes()).hexdigest() for f in FIELDS}
    return {"seconds": seconds, "peak_bytes": peak, "anon_peak_bytes": anon_peak, "digests": digests}


def run_child(mode: str, graph: Path, chunk: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(graph), "--chunk-edges", str(chunk)],
                         capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--edges", type=float, nargs="+", default=[1e7, 3e7], help="CSR edges of each graph")
    ap.add_argument("--chunk-edges", type=int, default=1 << 22, help="edges per chunk of the streamed split")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]), args.chunk_edges)))
        return 0
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}, load {' '.join(load)}; chunks of {args.chunk_edges:,} edges; "
          "one run per size, each split in a fresh process")
    figures, agree = [], True
    for e in args.edges:
        with tempfile.TemporaryDirectory(prefix="moment-split-") as name:
            graph = Path(name)
            make_graph(int(e), graph)
            base, mem, streamed = (run_child(m, graph, args.chunk_edges) for m in ("base", "memory", "streamed"))
        same = mem["digests"] == streamed["digests"]
        agree &= same
        gib = 2.0 ** 30
        per_edge = [(r["peak_bytes"] - base["peak_bytes"]) / e for r in (mem, streamed)]
        anon = [(r["anon_peak_bytes"] - base["anon_peak_bytes"]) / e for r in (mem, streamed)]
        print(f"{e:.0e} edges: peak RSS in memory {mem['peak_bytes'] / gib:.2f} GiB ({mem['seconds']:.1f} s), "
              f"streamed {streamed['peak_bytes'] / gib:.2f} GiB ({streamed['seconds']:.1f} s), base "
              f"{base['peak_bytes'] / gib:.2f} GiB; per CSR edge above base: {per_edge[0]:.1f} B vs "
              f"{per_edge[1]:.1f} B; anonymous (the arrays, not mapped files' pages) {anon[0]:.1f} B vs "
              f"{anon[1]:.1f} B; same output: {'yes' if same else 'NO'}", flush=True)
        figures.append(Figure("split_edges", f"edge split of {e:.0e} CSR edges, anonymous peak RSS above the base",
                              "bytes per CSR edge", anon[1], anon[0], "the in-memory split_edges",
                              higher_is_better=False, target="less memory per edge, equal output",
                              note=f"same output: {same}; load {' '.join(load)}"))
        figures.append(Figure("split_edges", f"edge split of {e:.0e} CSR edges, peak RSS above the base process",
                              "bytes per CSR edge", per_edge[1], per_edge[0], "the in-memory split_edges",
                              higher_is_better=False, target="less memory per edge, equal output",
                              note=f"seconds {streamed['seconds']:.1f} (streamed) vs {mem['seconds']:.1f} (in memory); "
                                   f"same output: {same}; load {' '.join(load)}"))
    write(args.json, "bench_split_edges", figures, " ".join(sys.argv))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
