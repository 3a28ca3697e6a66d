"""Peak memory of ``moment data synth`` at several edge counts, this tree against another (not a test).

    PYTHONPATH=. python tools/bench_synth_memory.py --ref-tree /work/main --nodes 1e6 --edges 5e6 2e7 [--json F]

Each run is its own process (``os.wait4``'s peak RSS, plus the peak of its
anonymous memory polled from ``/proc``). The reference is the same command
run from ``--ref-tree`` (a checkout of the code before the bucketed builder):
the issue measured 817 MiB at 2e7 edges and 1,330 MiB at 8e7 there. Memory
that does not grow with the edges shows as a flat row; the nodes are held
fixed so that only the edges change.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _results import Figure, write
from bench_billion import phase


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref-tree", required=True, help="a checkout to compare with (its moment, same arguments)")
    ap.add_argument("--nodes", default="1e6")
    ap.add_argument("--edges", nargs="+", default=["5e6", "2e7"])
    ap.add_argument("--feature-dim", default="16")
    ap.add_argument("--chunk-edges", default="1048576",
                    help="both sides' chunk (default 2**20: small, so that what grows with the edges shows)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--json")
    a = ap.parse_args()
    ours_tree = Path(__file__).resolve().parents[1]
    scratch = Path(a.dir or tempfile.mkdtemp(prefix="synthmem-"))
    scratch.mkdir(parents=True, exist_ok=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rows: dict[tuple[str, str], dict] = {}
    for edges in a.edges:
        for side, tree in (("ours", ours_tree), ("reference", Path(a.ref_tree))):
            dst = scratch / f"{side}-{edges}"
            shutil.rmtree(dst, ignore_errors=True)
            rec = phase(f"{side} {edges}", ["data", "synth", str(dst), "--nodes", a.nodes, "--edges", edges,
                                            "--feature-dim", a.feature_dim, "--chunk-edges", a.chunk_edges, "--quiet"],
                        scratch / f"{side}-{edges}.log", tree=tree)
            rows[side, edges] = rec
            shutil.rmtree(dst, ignore_errors=True)
    print(f"\nnodes {a.nodes}; load before {load}, after {', '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'edges':>8}{'ours RSS':>10}{'anon':>8}{'ref RSS':>10}{'anon':>8}{'ours s':>8}{'ref s':>8}  (MiB, s)")
    figs = []
    for edges in a.edges:
        o, r = rows["ours", edges], rows["reference", edges]
        print(
            f"{edges:>8}{o['peak_rss_bytes'] / 2**20:10.0f}{o['peak_anon_bytes'] / 2**20:8.0f}"
            f"{r['peak_rss_bytes'] / 2**20:10.0f}{r['peak_anon_bytes'] / 2**20:8.0f}"
            f"{o['seconds']:8.1f}{r['seconds']:8.1f}"
        )
        figs.append(
            Figure(
                "synth_memory",
                f"synth peak RSS, {a.nodes} nodes, {edges} edges",
                "MiB",
                o["peak_rss_bytes"] / 2**20,
                r["peak_rss_bytes"] / 2**20,
                f"moment data synth from {a.ref_tree}",
                higher_is_better=False,
                target="flat in the edges",
                note=f"wall {o['seconds']:.0f} s vs {r['seconds']:.0f} s; load {load}",
            )
        )
    write(a.json, "bench_synth_memory", figs, " ".join(sys.argv))
    if not a.dir:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
