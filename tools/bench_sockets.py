"""Cross-socket reads on Machine A's classic layouts (a)-(d): socket-aware DDAK against hash (paper §4.5, Fig. 17).

    python tools/bench_sockets.py [--json FILE] [--dir DIR]

For each layout, ``moment plan --machine moment-a --layout X`` and ``moment place`` of two graphs
(Cora, and a 100,000-vertex Chung-Lu graph) over the plan's 8 SSDs, twice: socket-aware (the
default where the plan's GPUs span sockets: each socket's GPUs train on their own contiguous part
of the training vertices, pre-sampled apart, ``training.place.sockets``) and ``--no-socket-aware``
(every GPU reads every row alike). Printed and written per layout and graph: the share of the
bytes the GPUs receive that cross sockets under socket-aware DDAK, under hash on the same
per-socket reads (the run's baseline), and under the socket-unaware DDAK placement (on its own,
data-parallel reads); the reduction against hash beside the paper's 14.2 / 8.7 / 18.1 / 9.5%.
These are the placements' shares of the pre-sampled reads (the same sample the placement was
fitted to), not QPI counters: this machine has one socket.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import moment, small_graphs  # noqa: E402
from _results import Figure, write  # noqa: E402

#: the paper's reduction of cross-QPI traffic by DDAK against hash on Machine A, per layout (§4.5)
PAPER = {"a": 14.2, "b": 8.7, "c": 18.1, "d": 9.5}


def _graphs(d: Path) -> dict[str, tuple[Path, int, int]]:
    """name -> (dataset, rows, row bytes)."""
    cora, demo = small_graphs(d)
    out = {}
    for name, ds in (("Cora", cora), ("Chung-Lu 1e5", demo)):
        feats = json.loads((ds / "meta.json").read_text())["files"]["features"]
        out[name] = (ds, int(feats["shape"][0]), int(feats["shape"][1]) * np.dtype(feats["dtype"]).itemsize)
    return out


def _place(ds: Path, plan: Path, out: Path, cpu_bytes: int, gpu_bytes: int, *extra: str) -> dict:
    args = ["place", "--dataset", str(ds), "--plan", str(plan), "--gpu-cache", str(gpu_bytes), "--cpu-cache",
            str(cpu_bytes), "--fanouts", "25,10", "--batch-size", "1000", "--out", str(out), "--force", "--json"]
    for _ in range(8):
        args += ["--ssd", str(out.parent / f"{out.name}-ssd")]
    moment(*args, *extra)
    return json.loads((out / "place.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/moment-sockets"), help="work directory")
    ap.add_argument("--json", help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {' '.join(load)}; shares of the GPUs' "
          "bytes that cross sockets (placements' pre-sampled reads)")
    graphs = _graphs(args.dir)
    figures, rows = [], []
    for layout in "abcd":
        plan = args.dir / f"plan-{layout}.json"
        plan.write_text(moment("plan", "--machine", "moment-a", "--json", "--top", "1", "--layout", layout))
        for name, (ds, n, row) in graphs.items():
            cpu_rows = n // 20
            gpu_rows = cpu_rows * 2 // 5
            tag = f"{layout}-{name.split()[0].lower()}"
            aware = _place(ds, plan, args.dir / f"aware-{tag}", cpu_rows * row, gpu_rows * row)
            plain = _place(ds, plan, args.dir / f"plain-{tag}", cpu_rows * row, gpu_rows * row, "--no-socket-aware")
            a, h = aware["report"]["cross_socket_share"], aware["baseline"]["cross_socket_share"]
            u = plain["report"]["cross_socket_share"]
            used = aware["socket_aware"]["used"]
            less = 100 * (1 - a / h) if h else float("nan")
            rows.append((layout, name, used, a, h, u, less, aware["report"]["max_relative_deviation"],
                         plain["report"]["max_relative_deviation"]))
            print(f"layout ({layout}) {name:13} socket-aware {'yes' if used else 'no '}  DDAK {a:.3f}  hash {h:.3f}  "
                  f"unaware DDAK {u:.3f}  -> {less:5.1f}% less than hash (paper {PAPER[layout]}%); max bin "
                  f"deviation {rows[-1][7]:.3f} (unaware {rows[-1][8]:.3f})", flush=True)
            figures.append(Figure(
                "sockets", f"cross-socket share, socket-aware DDAK vs hash: {name}, Machine A layout ({layout})",
                "share", a, h, "hash placement (same per-socket reads)", higher_is_better=False,
                target=f"paper: {PAPER[layout]}% less than hash",
                note=f"{less:.1f}% less than hash; socket-unaware DDAK {u:.3f}; "
                     f"{'GPUs on two sockets' if used else 'not used: ' + aware['socket_aware']['why_not']}; "
                     f"max bin deviation {rows[-1][7]:.3f} (unaware {rows[-1][8]:.3f})"))
    write(args.json, "bench_sockets", figures, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
