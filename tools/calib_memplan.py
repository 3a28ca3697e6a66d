"""Calibrate ``moment place --cpu-cache auto``: its estimate (cache + reserve) against the peak RSS of ``moment train``.

For each size: a synthetic graph (``moment data synth``), a placement with
``--cpu-cache auto --memory-limit LIMIT`` (one SSD directory, Machine B's plan),
then one epoch of ``moment train`` (evaluation included) under ``/usr/bin/time -v``;
prints the estimate, the measured peak RSS and their ratio. The estimate must
not be below the peak.

    python tools/calib_memplan.py --work /tmp/calib            # 1e5, 4e5 and 1e6 nodes
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

SIZES = (("g1e5", "1e5", "1e6", 128, "1GiB"), ("g4e5", "4e5", "4e6", 128, "2GiB"), ("g1e6", "1e6", "5e6", 64, "2GiB"))


def _moment(*args: str) -> str:
    cmd = [sys.executable, "-m", "moment", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/calib-memplan"))
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", default="1024")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    print("graph   nodes    limit  cache/node  held  reserve   estimate  peak RSS  estimate/peak")
    for name, nodes, edges, dim, limit in SIZES:
        ds, pl = a.work / name, a.work / f"{name}-p"
        if not ds.exists():
            _moment("data", "synth", str(ds), "--nodes", nodes, "--edges", edges, "--feature-dim", str(dim),
                    "--train-share", "0.02", "--quiet")
        ssd = [x for _ in range(8) for x in ("--ssd", str(pl))]
        _moment("place", "--dataset", str(ds), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache", "auto",
                "--memory-limit", limit, *ssd, "--out", str(pl), "--fanouts", a.fanouts, "--batch-size",
                a.batch_size, "--force", "--json", "--strategy", "hot-first")  # hot-first fills the caches
        sizing = json.loads((pl / "place.json").read_text())["cpu_cache_sizing"]
        err = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "moment", "train", "--dataset", str(ds),
                              "--placement", str(pl), "--fanouts", a.fanouts, "--batch-size", a.batch_size,
                              "--epochs", "1", "--eval-every", "0"], check=True, capture_output=True, text=True).stderr
        peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1)) * 1024
        from iostack.placement import load_placement
        from training.memplan import host_cache_bytes

        cache = host_cache_bytes(load_placement(pl), sizing["row_bytes"], gpu_bins_on_host=True)  # rows held
        reserve = sizing["reserve"]["total_bytes"]
        mib = 1 << 20
        print(
            f"{name:7} {nodes:>6} {limit:>8} {sizing['per_node_bytes'] / mib:9.0f}M "
            f"{cache / mib:5.0f}M {reserve / mib:7.0f}M "
            f"{(cache + reserve) / mib:8.0f}M {peak / mib:8.0f}M  {(cache + reserve) / peak:6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
