"""Import time and peak memory: Moment's streaming importers against the in-memory way, at one or more sizes.

For each size in ``--edges`` a synthetic input in the chosen ``--layout`` is written once (in
blocks, so inputs larger than memory can be made), then imported twice, each in a fresh process
so that peak memory is its own:

- ``edgelist``: a gzipped SNAP-style text edge list. Ours: ``import_edgelist`` (blocks of text,
  spill to disk, chunked counting sort). Reference: ``np.loadtxt`` of the whole file, then
  ``scipy.sparse`` COO -> CSR with duplicates summed.
- ``ogb-binary``: OGB's binary layout as ogbn-papers100M ships it (``raw/data.npz`` deflated as
  ``np.savez_compressed`` writes it, ``[2, E]`` int64 ``edge_index``, ``[N, F]`` float32
  ``node_feat``; ``raw/node-label.npz``; ``split/time``). Ours: ``import_ogb`` (zip members as
  streams). Reference: what OGB's ``read_binary_graph_raw`` does, ``np.load`` of every member,
  then the scipy CSR and ``np.save`` of the features.
- ``igb``: IGB full's layout (headerless ``node_feat.npy`` [N, 1024] float32, ``node_label_19.npy``,
  ``edge_index.npy`` [E, 2]). Ours: ``import_igb`` (memory maps, blocks). Reference: IGB's
  ``in_memory=1`` loader (``np.load`` / ``np.fromfile`` whole), then the scipy CSR.

Memory is reported two ways: the peak of anonymous memory (heap; sampled from /proc every 2 ms
and excluding the page cache of memory-mapped files, which the kernel can drop) above the
interpreter's baseline, and ``ru_maxrss`` (peak RSS including mapped file pages). With two sizes
the growth of each from the smaller to the larger is printed: ours should stay flat. Example::

    python tools/bench_import.py --layout ogb-binary --edges 1e7 4e7 --nodes 1e6 --json out.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
from _results import Figure, write

from momentbase.space import reserve

#: child prelude: peak anonymous memory sampled from /proc every 2 ms; with MOMENT_TRACEMALLOC=1
#: also tracemalloc's exact peak of Python and numpy allocations (slower)
PEAK = """
import os, sys, threading, time as _t, tracemalloc
_peak = [0]
def _anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0
def _watch():
    while True:
        _peak[0] = max(_peak[0], _anon())
        _t.sleep(0.002)
threading.Thread(target=_watch, daemon=True).start()
if os.environ.get("MOMENT_TRACEMALLOC") == "1":
    tracemalloc.start()
def _report(**kw):
    import json, resource
    traced = tracemalloc.get_traced_memory()[1] if tracemalloc.is_tracing() else None
    print(json.dumps({**kw, "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "peak_anon_kib": max(_peak[0], _anon()), "traced_peak_bytes": traced}))
"""

#: the floor both sides start from: the interpreter with numpy (each side's own imports count as its memory)
BASELINE = PEAK + """
import numpy
_report()
"""

#: per layout: ours, then the in-memory reference; argv: input, output, chunk bytes, chunk edges
OURS = {
    "edgelist": """
from training.importers.edgelist import import_edgelist as imp
kw = {"chunk_bytes": int(sys.argv[3]), "chunk_edges": int(sys.argv[4])}
""",
    "ogb-binary": """
from training.importers.ogb import import_ogb as imp
kw = {"chunk_bytes": int(sys.argv[3]), "chunk_edges": int(sys.argv[4])}
""",
    "igb": """
from training.importers.igb import import_igb as imp
kw = {"chunk_edges": int(sys.argv[4])}
""",
}
OURS_RUN = """
import sys, time
from training.data import open_dataset
t = time.perf_counter()
imp(sys.argv[1], sys.argv[2], **kw)
dt = time.perf_counter() - t
_report(seconds=dt, edges=open_dataset(sys.argv[2], validate=False).num_edges)
"""

SCIPY_CSR = """
def csr(src, dst, n):
    import scipy.sparse as sp
    m = src != dst
    a = sp.csr_matrix((np.ones(int(m.sum()), dtype=np.float32), (dst[m], src[m])), shape=(n, n))
    a.sum_duplicates()
    np.save(sys.argv[2] + "-indptr.npy", a.indptr.astype(np.int64))
    np.save(sys.argv[2] + "-indices.npy", a.indices)
    return int(a.nnz)
"""
REFERENCE = {
    "edgelist": """
e = np.loadtxt(gzip.open(sys.argv[1], "rt"), dtype=np.int64, comments="#")
ids, inv = np.unique(e, return_inverse=True)
inv = inv.reshape(e.shape)
edges = csr(inv[:, 0], inv[:, 1], ids.size)
""",
    "ogb-binary": """
d = np.load(sys.argv[1] + "/raw/data.npz")
ei, n = d["edge_index"], int(d["num_nodes_list"][0])
np.save(sys.argv[2] + "-features.npy", d["node_feat"])
lab = np.load(sys.argv[1] + "/raw/node-label.npz")["node_label"]
np.save(sys.argv[2] + "-labels.npy", np.where(np.isnan(lab), -1, lab).astype(np.int64))
edges = csr(ei[0], ei[1], n)
""",
    "igb": """
p = sys.argv[1] + "/full/processed/"
ei = np.load(p + "paper__cites__paper/edge_index.npy")
feat = np.fromfile(p + "paper/node_feat.npy", dtype=np.float32).reshape(-1, 1024)
np.save(sys.argv[2] + "-features.npy", feat)
lab = np.fromfile(p + "paper/node_label_19.npy", dtype=np.float32)
edges = csr(ei[:, 0], ei[:, 1], feat.shape[0])
""",
}
REFERENCE_RUN = """
import gzip, sys, time
import numpy as np
""" + SCIPY_CSR + """
t = time.perf_counter()
exec(BODY)
_report(seconds=time.perf_counter() - t, edges=edges)
"""


# --- inputs -----------------------------------------------------------------------------------------

def source_blocks(nodes: int, edges: int, seed: int, block: int = 1 << 20):
    """The edge sources in blocks: Zipf-like, so degrees are skewed as in real graphs."""
    rng = np.random.default_rng([seed, 0])
    for a in range(0, edges, block):
        k = min(block, edges - a)
        yield np.minimum((rng.pareto(1.2, k) * nodes / 50).astype(np.int64), nodes - 1)


def target_blocks(nodes: int, edges: int, seed: int, block: int = 1 << 20):
    """The edge targets in blocks, uniform."""
    rng = np.random.default_rng([seed, 1])
    for a in range(0, edges, block):
        yield rng.integers(0, nodes, min(block, edges - a))


def edges_in_memory(nodes: int, edges: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The same edges as the writers below write, whole (for tests at small sizes)."""
    return (np.concatenate(list(source_blocks(nodes, edges, seed))),
            np.concatenate(list(target_blocks(nodes, edges, seed))))


def labels_of(nodes: int, seed: int, classes: int = 172) -> np.ndarray:
    """float32 class ids, one node in seven unlabelled (NaN), as papers100M's mostly unlabelled nodes."""
    lab = np.random.default_rng([seed, 2]).integers(0, classes, nodes).astype(np.float32)
    lab[::7] = np.nan
    return lab


def feature_blocks(nodes: int, dim: int, seed: int, rows: int = 1 << 14):
    rng = np.random.default_rng([seed, 3])
    for a in range(0, nodes, rows):
        yield rng.standard_normal((min(rows, nodes - a), dim), dtype=np.float32)


def write_edge_list(path: Path, nodes: int, edges: int, seed: int) -> Path:
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write(f"# synthetic: {nodes} nodes, {edges} edges, seed {seed}\n")
        for src, dst in zip(source_blocks(nodes, edges, seed), target_blocks(nodes, edges, seed), strict=True):
            f.write("\n".join(f"{u}\t{v}" for u, v in zip(src.tolist(), dst.tolist(), strict=True)) + "\n")
    return path


def write_ogb_binary(root: Path, nodes: int, edges: int, seed: int, *, feature_dim: int = 128,
                     compress: bool = True, splits: tuple[str, ...] = ("train", "valid", "test")) -> Path:
    """``root/ogbn_papers100M`` in OGB's binary layout, written member by member (zip64, deflate level 1)."""
    from training.importers._npystream import write_member

    d = root / "ogbn_papers100M"
    (d / "raw").mkdir(parents=True, exist_ok=True)
    how = {"compression": zipfile.ZIP_DEFLATED, "compresslevel": 1} if compress else {"compression": zipfile.ZIP_STORED}
    with zipfile.ZipFile(d / "raw" / "data.npz", "w", **how) as zf:
        write_member(zf, "edge_index", (2, edges), np.int64, _both_rows(nodes, edges, seed))
        write_member(zf, "node_feat", (nodes, feature_dim), np.float32, feature_blocks(nodes, feature_dim, seed))
        write_member(zf, "node_year", (nodes, 1), np.int64, [np.full((nodes, 1), 2020)])
        write_member(zf, "num_nodes_list", (1,), np.int64, [np.array([nodes])])
        write_member(zf, "num_edges_list", (1,), np.int64, [np.array([edges])])
    with zipfile.ZipFile(d / "raw" / "node-label.npz", "w", **how) as zf:
        write_member(zf, "node_label", (nodes, 1), np.float32, [labels_of(nodes, seed)[:, None]])
    order = np.random.default_rng([seed, 4]).permutation(nodes)
    cut = np.linspace(0, nodes // 2, len(splits) + 1).astype(int)
    for i, part in enumerate(splits):
        p = d / "split" / "time" / f"{part}.csv.gz"
        p.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(p, "wt", compresslevel=1) as f:
            f.write("".join(f"{x}\n" for x in order[cut[i] : cut[i + 1]].tolist()))
    return d


def _both_rows(nodes: int, edges: int, seed: int):
    yield from source_blocks(nodes, edges, seed)
    yield from target_blocks(nodes, edges, seed)


def write_igb(root: Path, nodes: int, edges: int, seed: int) -> Path:
    """``root/igb/full/processed`` as IGB full ships it: headerless features and labels, ``.npy`` edges."""
    proc = root / "igb" / "full" / "processed"
    (proc / "paper").mkdir(parents=True, exist_ok=True)
    (proc / "paper__cites__paper").mkdir(exist_ok=True)
    with open(proc / "paper" / "node_feat.npy", "wb") as f:
        for block in feature_blocks(nodes, 1024, seed, rows=1 << 10):
            f.write(block.tobytes())
    labels_of(nodes, seed, classes=19).tofile(proc / "paper" / "node_label_19.npy")
    out = np.lib.format.open_memmap(proc / "paper__cites__paper" / "edge_index.npy", "w+", np.int64, (edges, 2))
    reserve(proc / "paper__cites__paper" / "edge_index.npy")
    a = 0
    for src, dst in zip(source_blocks(nodes, edges, seed), target_blocks(nodes, edges, seed), strict=True):
        out[a : a + src.size, 0], out[a : a + src.size, 1] = src, dst
        a += src.size
    out.flush()
    del out
    return root / "igb"


def make_input(layout: str, tmp: Path, nodes: int, edges: int, seed: int, feature_dim: int) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    if layout == "edgelist":
        return write_edge_list(tmp / "edges.txt.gz", nodes, edges, seed)
    if layout == "ogb-binary":
        return write_ogb_binary(tmp, nodes, edges, seed, feature_dim=feature_dim)
    return write_igb(tmp, nodes, edges, seed)


# --- runs -------------------------------------------------------------------------------------------

def run(code: str, *args: str, traced: bool = False) -> dict:
    env = {**os.environ, "MOMENT_TRACEMALLOC": "1" if traced else "0"}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"child failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_ours(layout: str, src: Path, dst: Path, chunk_bytes: int, chunk_edges: int, *, traced: bool = False) -> dict:
    return run(PEAK + OURS[layout] + OURS_RUN, str(src), str(dst), str(chunk_bytes), str(chunk_edges), traced=traced)


def run_reference(layout: str, src: Path, dst: Path, *, traced: bool = False) -> dict:
    return run(PEAK + f"BODY = {REFERENCE[layout]!r}\n" + REFERENCE_RUN, str(src), str(dst), traced=traced)


def baseline() -> dict:
    return run(BASELINE)


def measure(args, edges: int, tmp: Path) -> dict:
    t = time.perf_counter()
    src = make_input(args.layout, tmp / f"in-{edges}", args.nodes, edges, args.seed, args.feature_dim)
    size = sum(p.stat().st_size for p in ([src] if src.is_file() else src.rglob("*")) if p.is_file())
    print(f"input: {args.layout}, {edges:,} edges over {args.nodes:,} nodes, {size / 2**20:,.0f} MiB "
          f"(written in {time.perf_counter() - t:.0f} s)", flush=True)
    ours = run_ours(args.layout, src, tmp / f"ours-{edges}", args.chunk_bytes, args.chunk_edges)
    ref = run_reference(args.layout, src, tmp / f"ref-{edges}")
    for p in tmp.glob(f"ref-{edges}-*"):
        p.unlink()
    return {"edges_in": edges, "input_mib": size / 2**20, "ours": ours, "reference": ref}


def print_size(row: dict, base_kib: int) -> None:
    ours, ref = row["ours"], row["reference"]
    print(f"\n{row['edges_in']:,} input edges{'':4}{'moment':>14}{'in-memory ref':>16}{'ratio':>9}")
    print(f"{'CSR edges':28}{ours['edges']:>14,}{ref['edges']:>16,}")
    print(f"{'seconds':28}{ours['seconds']:>14.1f}{ref['seconds']:>16.1f}{ours['seconds'] / ref['seconds']:>9.2f}")
    mo, mr = (ours["peak_anon_kib"] - base_kib) / 1024, (ref["peak_anon_kib"] - base_kib) / 1024
    print(f"{'peak heap above base, MiB':28}{mo:>14.0f}{mr:>16.0f}{mo / mr if mr > 0 else float('nan'):>9.2f}")
    print(f"{'peak RSS incl. mapped, MiB':28}{ours['peak_rss_kib'] / 1024:>14.0f}{ref['peak_rss_kib'] / 1024:>16.0f}"
          f"{ours['peak_rss_kib'] / ref['peak_rss_kib']:>9.2f}")


def figures(args, rows: list[dict], base_kib: int) -> list[Figure]:
    name = {"edgelist": "edge list", "ogb-binary": "OGB binary (papers100M layout)", "igb": "IGB full layout"}[
        args.layout
    ]
    ref_name = {"edgelist": "np.loadtxt + scipy COO->CSR", "ogb-binary": "np.load(data.npz) + scipy COO->CSR",
                "igb": "np.load/np.fromfile + scipy COO->CSR"}[args.layout]
    out = []
    for r in rows:
        e = f"{r['edges_in']:.0e} edges"
        out += [
            Figure("import", f"{name}, {e}: time", "s", r["ours"]["seconds"], r["reference"]["seconds"], ref_name,
                   higher_is_better=False),
            Figure("import", f"{name}, {e}: peak heap", "MiB", (r["ours"]["peak_anon_kib"] - base_kib) / 1024,
                   (r["reference"]["peak_anon_kib"] - base_kib) / 1024, ref_name, higher_is_better=False),
            Figure("import", f"{name}, {e}: peak RSS incl. mapped", "MiB", r["ours"]["peak_rss_kib"] / 1024,
                   r["reference"]["peak_rss_kib"] / 1024, ref_name, higher_is_better=False),
        ]
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        grow = {k: (hi[k]["peak_anon_kib"] - lo[k]["peak_anon_kib"]) / 1024 for k in ("ours", "reference")}
        out.append(Figure("import", f"{name}: peak heap growth {lo['edges_in']:.0e} -> {hi['edges_in']:.0e} edges",
                          "MiB", grow["ours"], grow["reference"], ref_name, higher_is_better=False,
                          target="ours flat (does not grow with the edges)"))
    return out


def main() -> int:
    num = lambda s: int(float(s.replace("_", "")))  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", choices=tuple(OURS), default="edgelist")
    ap.add_argument("--edges", type=num, nargs="+", default=[10_000_000], help="one or more sizes")
    ap.add_argument("--nodes", type=num, default=1_000_000)
    ap.add_argument("--feature-dim", type=int, default=128, help="ogb-binary: node_feat width (igb: 1024)")
    ap.add_argument("--chunk-bytes", type=int, default=32 << 20)
    ap.add_argument("--chunk-edges", type=int, default=1 << 22)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {Path('/proc/loadavg').read_text().split()[:3]}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        base = baseline()["peak_anon_kib"]
        rows = [measure(args, e, Path(tmp)) for e in args.edges]
    print(f"interpreter + numpy baseline, anonymous memory: {base / 1024:.0f} MiB")
    for r in rows:
        print_size(r, base)
    figs = figures(args, rows, base)
    if len(rows) > 1:
        print(f"\npeak heap growth, smallest to largest: moment {figs[-1].ours:+.0f} MiB, "
              f"in-memory ref {figs[-1].reference:+.0f} MiB")
    write(args.json, "bench_import", figs, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
