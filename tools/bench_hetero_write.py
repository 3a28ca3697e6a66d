"""Writing a heterogeneous dataset: the streamed writer against the in-memory one, time and peak memory.

For each size in ``--edges`` a synthetic ogbn-mag-shaped graph (``synth_mag_stream``: 4 node
types, 7 relations with the reverse ones, about 15 edges a paper, float32/float16/uint8 features)
is written twice, each in a fresh process so that its peak memory is its own:

- ours: :func:`training.hetero.stream.write_hetero_stream`, edges drawn and written in chunks
  (``--chunk-edges``);
- reference: the in-memory way, the whole graph drawn into arrays (``to_graph``) and written by
  :func:`training.hetero.store.write_hetero` (per-relation ``np.unique``, one ``lexsort`` of the union).

Both write the same directory (tests/test_hetero_stream.py checks it byte for byte on small
graphs; here the two outputs' ``meta.json`` checksums are compared). Memory is reported as
``bench_import`` does: the peak of anonymous RSS (sampled every 2 ms; file pages of memory
maps excluded, the kernel takes those back) and ``ru_maxrss`` (peak RSS with mapped file pages).
``--reference-max-edges`` skips the in-memory side above that size (it needs several GB). Example::

    python tools/bench_hetero_write.py --edges 1e7 1e8 --reference-max-edges 3e7 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import Figure, write  # noqa: E402
from bench_import import PEAK  # noqa: E402

#: argv: output, papers, chunk edges
SIDES = {
    "ours": """
from training.hetero.stream import write_hetero_stream
from training.hetero.synth import synth_mag_stream
t = time.perf_counter()
write_hetero_stream(sys.argv[1], synth_mag_stream(papers=int(sys.argv[2]), block_nodes=max(int(sys.argv[3]) // 16, 1)),
                    chunk_edges=int(sys.argv[3]))
""",
    "reference": """
from training.hetero.store import write_hetero
from training.hetero.stream import to_graph
from training.hetero.synth import synth_mag_stream
t = time.perf_counter()
g = to_graph(synth_mag_stream(papers=int(sys.argv[2]), block_nodes=max(int(sys.argv[3]) // 16, 1)))
write_hetero(sys.argv[1], g)
""",
}
TAIL = """
dt = time.perf_counter() - t
import json as _j
_report(seconds=dt, crc=_j.load(open(sys.argv[1] + "/meta.json"))["checksums"]["files"]["indices"])
"""


def _run(side: str, out: Path, papers: int, chunk: int) -> dict:
    code = PEAK + "import sys, time\n" + SIDES[side] + TAIL
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", code, str(out), str(papers), str(chunk)], capture_output=True,
                       text=True, env=env, check=False)
    if r.returncode != 0:
        sys.exit(f"bench_hetero_write: {side} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _baseline() -> float:
    r = subprocess.run([sys.executable, "-c", PEAK + "import numpy\n_report()"], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["peak_anon_kib"] / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--edges", type=float, nargs="+", default=[1e7, 1e8])
    p.add_argument("--reference-max-edges", type=float, default=3e7)
    p.add_argument("--chunk-edges", type=int, default=1 << 22)
    p.add_argument("--dir", help="where to write (default: a temporary directory)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    from training.hetero.synth import EDGES_PER_PAPER

    base = _baseline()
    print(f"baseline (python + numpy): {base:.0f} MiB anonymous; load {os.getloadavg()}")
    figs, rows = [], []
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        for e in args.edges:
            papers = int(e) // EDGES_PER_PAPER
            res = {}
            for side in ("ours", "reference"):
                if side == "reference" and e > args.reference_max_edges:
                    continue
                out = Path(d) / f"{side}-{int(e)}"
                res[side] = _run(side, out, papers, args.chunk_edges)
                subprocess.run(["rm", "-rf", str(out)], check=True)
                r = res[side]
                print(f"{e:.0e} edges, {side}: {r['seconds']:.1f} s, peak anonymous {r['peak_anon_kib'] / 1024:,.0f} "
                      f"MiB, peak RSS with mapped files {r['peak_rss_kib'] / 1024:,.0f} MiB", flush=True)
            if "reference" in res:
                same = res["ours"]["crc"] == res["reference"]["crc"]
                print(f"  same union indices (CRCs): {same}")
                if not same:
                    sys.exit("bench_hetero_write: the two writers' indices differ")
            rows.append((e, res))
            ref = res.get("reference")
            load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            figs.append(Figure("hetero_write", f"{e:.0e} edges: peak anonymous RSS", "MiB",
                               res["ours"]["peak_anon_kib"] / 1024, ref and ref["peak_anon_kib"] / 1024,
                               "write_hetero in memory", higher_is_better=False, target="flat in the edges",
                               note=f"peak RSS with mapped files {res['ours']['peak_rss_kib'] / 1024:,.0f} MiB; "
                                    f"baseline {base:.0f} MiB; load {load}"))
            figs.append(Figure("hetero_write", f"{e:.0e} edges: wall time", "s", res["ours"]["seconds"],
                               ref and ref["seconds"], "write_hetero in memory", higher_is_better=False,
                               note=f"cold, one run; load {load}"))
    if len(rows) > 1:
        (e0, r0), (e1, r1) = rows[0], rows[-1]
        print(f"growth {e0:.0e} -> {e1:.0e} edges: ours anonymous x"
              f"{r1['ours']['peak_anon_kib'] / r0['ours']['peak_anon_kib']:.2f}")
    write(args.json, "bench_hetero_write", figs, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
