"""Edge-list import: Moment's chunked importer against the in-memory way, time and peak memory.

Writes a gzipped SNAP-style edge list of ``--edges`` random edges (power-law sources) once,
then imports it twice, each in a fresh process so that peak RSS is its own:

- ours: ``training.importers.edgelist.import_edgelist`` (blocks of text, spill to disk,
  chunked counting sort, memory-mapped output);
- reference: ``np.loadtxt`` of the whole file, then ``scipy.sparse`` COO -> CSR with
  duplicates summed, the usual in-memory route.

Prints both side by side with the ratio. Example::

    python tools/bench_import.py --edges 10_000_000 --nodes 1_000_000
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _results import Figure, write

#: child prelude: peak anonymous memory (heap, not the page cache of memory-mapped files, which
#: the kernel can drop) sampled from /proc every 5 ms; ru_maxrss would count mapped output pages
PEAK = """
import threading, time as _t
_peak = [0]
def _anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0
def _watch():
    while True:
        _peak[0] = max(_peak[0], _anon())
        _t.sleep(0.005)
threading.Thread(target=_watch, daemon=True).start()
"""

OURS = PEAK + """
import json, resource, sys, time
from training.importers.edgelist import import_edgelist
from training.data import open_dataset
t = time.perf_counter()
import_edgelist(sys.argv[1], sys.argv[2], chunk_bytes=int(sys.argv[3]), chunk_edges=int(sys.argv[4]))
dt = time.perf_counter() - t
ds = open_dataset(sys.argv[2], validate=False)
print(json.dumps({"seconds": dt, "edges": ds.num_edges, "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "peak_anon_kib": max(_peak[0], _anon())}))
"""

REFERENCE = PEAK + """
import gzip, json, resource, sys, time
import numpy as np, scipy.sparse as sp
t = time.perf_counter()
e = np.loadtxt(gzip.open(sys.argv[1], "rt"), dtype=np.int64, comments="#")
ids, inv = np.unique(e, return_inverse=True)
inv = inv.reshape(e.shape)
m = inv[:, 0] != inv[:, 1]
a = sp.csr_matrix((np.ones(int(m.sum()), dtype=np.float32), (inv[m, 1], inv[m, 0])), shape=(ids.size, ids.size))
a.sum_duplicates()
np.save(sys.argv[2] + "-indptr.npy", a.indptr.astype(np.int64))
np.save(sys.argv[2] + "-indices.npy", a.indices)
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "edges": int(a.nnz), "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "peak_anon_kib": max(_peak[0], _anon())}))
"""

BASELINE = PEAK + """
import json, resource
import numpy, scipy.sparse
import training.importers.edgelist
print(json.dumps({"peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "peak_anon_kib": max(_peak[0], _anon())}))
"""


def write_edge_list(path: Path, nodes: int, edges: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    block = 1_000_000
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write(f"# synthetic: {nodes} nodes, {edges} edges, seed {seed}\n")
        for a in range(0, edges, block):
            k = min(block, edges - a)
            # Zipf-like sources give a skewed degree distribution, as real graphs have
            src = np.minimum((rng.pareto(1.2, k) * nodes / 50).astype(np.int64), nodes - 1)
            dst = rng.integers(0, nodes, k)
            f.write("\n".join(f"{u}\t{v}" for u, v in zip(src.tolist(), dst.tolist(), strict=True)) + "\n")


def run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--edges", type=lambda s: int(float(s.replace("_", ""))), default=10_000_000)
    ap.add_argument("--nodes", type=lambda s: int(float(s.replace("_", ""))), default=1_000_000)
    ap.add_argument("--chunk-bytes", type=int, default=32 << 20)
    ap.add_argument("--chunk-edges", type=int, default=1 << 22)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        src = Path(tmp) / "edges.txt.gz"
        t = time.perf_counter()
        write_edge_list(src, args.nodes, args.edges, args.seed)
        print(f"input: {args.edges:,} edges over {args.nodes:,} ids, {src.stat().st_size / 2**20:.0f} MiB gzip "
              f"(written in {time.perf_counter() - t:.0f} s)")
        base = run(BASELINE)["peak_anon_kib"]
        ours = run(OURS, str(src), str(Path(tmp) / "ours"), str(args.chunk_bytes), str(args.chunk_edges))
        ref = run(REFERENCE, str(src), str(Path(tmp) / "ref"))
    print(f"interpreter + numpy/scipy baseline, anonymous memory: {base / 1024:.0f} MiB")
    print(f"{'':28}{'moment':>14}{'in-memory ref':>16}{'ratio':>9}")
    print(f"{'CSR edges':28}{ours['edges']:>14,}{ref['edges']:>16,}{'':>9}")
    print(f"{'seconds':28}{ours['seconds']:>14.1f}{ref['seconds']:>16.1f}{ours['seconds'] / ref['seconds']:>9.2f}")
    print(f"{'edges per second':28}{ours['edges'] / ours['seconds']:>14,.0f}{ref['edges'] / ref['seconds']:>16,.0f}"
          f"{(ours['edges'] / ours['seconds']) / (ref['edges'] / ref['seconds']):>9.2f}")
    mo, mr = (ours["peak_anon_kib"] - base) / 1024, (ref["peak_anon_kib"] - base) / 1024
    print(f"{'peak heap above baseline MiB':28}{mo:>14.0f}{mr:>16.0f}{mo / mr if mr > 0 else float('nan'):>9.2f}")
    print(f"{'peak RSS incl. mapped, MiB':28}{ours['peak_rss_kib'] / 1024:>14.0f}{ref['peak_rss_kib'] / 1024:>16.0f}"
          f"{ours['peak_rss_kib'] / ref['peak_rss_kib']:>9.2f}")
    write(args.json, "bench_import", [
        Figure("import", f"edge list, {args.edges:.0e} edges: time", "s", ours["seconds"], ref["seconds"],
               "np.loadtxt + scipy COO->CSR", higher_is_better=False),
        Figure("import", f"edge list, {args.edges:.0e} edges: peak heap", "MiB", mo, mr,
               "np.loadtxt + scipy COO->CSR", higher_is_better=False),
    ], " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
