"""Cross-socket reads on Machine A's classic layouts (a)-(d): socket-aware DDAK against hash (paper §4.5, Fig. 17).

    python tools/bench_sockets.py [--json FILE] [--dir DIR] [--train [--epochs N] [--gpus 2,4]]

For each layout, ``moment plan --machine moment-a --layout X`` and ``moment place`` of two graphs
(Cora, and a 100,000-vertex Chung-Lu graph) over the plan's 8 SSDs, twice: socket-aware (the
default where the plan's GPUs span sockets: each socket's GPUs train on their own contiguous part
of the training vertices, pre-sampled apart, ``training.place.sockets``) and ``--no-socket-aware``
(every GPU reads every row alike). Printed and written per layout and graph: the share of the
bytes the GPUs receive that cross sockets under socket-aware DDAK, under hash on the same
per-socket reads (the run's baseline), and, with ``--no-socket-aware``, DDAK and hash where every
GPU reads every row alike (the paper's data-parallel setting); the reductions against hash beside
the paper's 14.2 / 8.7 / 18.1 / 9.5%. Socket-aware DDAK's share is of reads it was not fitted to
(an independent pre-sample, ``place.json``'s ``held_out_cross_socket_share``); the others' are of
the pre-sampled reads (hash is fitted to none). Shares of pre-sampled reads, not QPI counters:
this machine has one socket.

``--train`` measures instead what training reads: Cora placed socket-aware for Machine A with ``--gpus``
GPUs in layout (c) (2: one per socket; 4: two per socket), then one gloo rank per GPU trains on it
(``tests/socket_ranks.py`` under torchrun) as ``moment train`` does (each rank on its socket's part,
:mod:`training.socket_batches`) and, on the same placement, with the batches every run took before (every
rank a part of every batch). Per epoch, the share of the rows the ranks read from the other socket's bins
(the epoch records' ``bin_rows``, rank ``i`` on the plan's GPU ``i``'s socket) beside ``place.json``'s
prediction (``held_out_cross_socket_share``) and hash's share; median and range over the epochs (each epoch
reshuffles the seeds). Counted rows, not QPI counters.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import REPO, moment, small_graphs  # noqa: E402
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


def _place(ds: Path, plan: Path, out: Path, cpu_bytes: int, gpu_bytes: int, *extra: str, fanouts: str = "25,10",
           batch: int = 1000) -> dict:
    args = ["place", "--dataset", str(ds), "--plan", str(plan), "--gpu-cache", str(gpu_bytes), "--cpu-cache",
            str(cpu_bytes), "--fanouts", fanouts, "--batch-size", str(batch), "--out", str(out), "--force", "--json"]
    for _ in range(8):
        args += ["--ssd", str(out.parent / f"{out.name}-ssd")]
    moment(*args, *extra)
    return json.loads((out / "place.json").read_text())


def _train(d: Path, epochs: int, gpus: int) -> list[Figure]:
    """Training's measured cross-socket share on a socket-aware placement, split by socket and not (see the doc)."""
    from training.socket_batches import measured_cross_share

    torchrun = shutil.which("torchrun")
    if torchrun is None:
        sys.exit("--train needs torchrun on PATH")
    cora, _ = small_graphs(d)
    fanouts, batch = "10,5", 32
    plan = d / f"plan-a-{gpus}gpu-c.json"
    plan.write_text(moment("plan", "--machine", "moment-a", "--gpus", str(gpus), "--layout", "c", "--json", "--top",
                           "1"))
    out = d / f"train-c{gpus}"
    report = _place(cora, plan, out, 256 * 1024, 0, fanouts=fanouts, batch=batch)
    runs = d / f"train-c{gpus}-runs"
    runs.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    subprocess.run([torchrun, "--nproc-per-node", str(gpus), str(REPO / "tests" / "socket_ranks.py"), str(cora),
                    str(out), str(runs), fanouts, str(batch), str(epochs)], cwd=REPO, env=env, check=True,
                   capture_output=True)
    res = sorted((json.loads((runs / f"result-{r}.json").read_text()) for r in range(gpus)), key=lambda r: r["rank"])
    share = {kind: [measured_cross_share(report, [[x["bin_rows"] for x in r[kind] if x["kind"] == "epoch"][e]
                                                  for r in res]) for e in range(epochs)] for kind in ("aware", "plain")}
    held, hashed = report["socket_aware"]["held_out_cross_socket_share"], report["baseline"]["cross_socket_share"]
    med = {k: statistics.median(v) for k, v in share.items()}
    rng = {k: f"{min(v):.3f}-{max(v):.3f}" for k, v in share.items()}
    print(f"training on Cora, Machine A layout (c) with {gpus} GPUs, {gpus} gloo ranks, fan-outs {fanouts}, "
          f"batch {batch}, "
          f"{epochs} epochs: cross-socket share of the rows read, socket split {med['aware']:.3f} "
          f"({rng['aware']}) vs place.json's held-out prediction {held:.3f}; every rank a part of every batch "
          f"{med['plain']:.3f} ({rng['plain']}); hash {hashed:.3f} -> {med['plain'] / med['aware']:.2f}x less "
          "with the split", flush=True)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    note = f"median over {epochs} epochs (range {{}}); {gpus} gloo ranks on Cora, rows counted per bin; load {load}"
    return [Figure("sockets_train", "training's cross-socket share: socket-split batches vs every rank in every batch "
                              f"(Cora, Machine A layout (c), {gpus} GPUs)", "share", med["aware"], med["plain"],
                   "every rank a part of every batch (before)", higher_is_better=False,
                   target=f"at the placement's held-out prediction {held:.3f}",
                   note=note.format(rng["aware"]) + f"; before: {rng['plain']}; hash placement {hashed:.3f}"),
            Figure("sockets_train", "training's measured cross-socket share vs place.json's held-out prediction "
                                    f"({gpus} GPUs)",
                   "share", med["aware"], held, "place.json held_out_cross_socket_share", higher_is_better=False,
                   target="within 0.08 of the prediction (tests/test_socket_batches.py)",
                   note=note.format(rng["aware"]))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/moment-sockets"), help="work directory")
    ap.add_argument("--json", help="also write the figures here (for tools/bench_all.py)")
    ap.add_argument("--train", action="store_true", help="measure training's reads on a socket-aware placement")
    ap.add_argument("--epochs", type=int, default=3, help="with --train: epochs of each training")
    ap.add_argument("--gpus", default="2", help="with --train: the plan's GPUs, one rank each (several: 2,4)")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {' '.join(load)}; shares of the GPUs' "
          "bytes that cross sockets " + ("(training's reads)" if args.train else "(placements' pre-sampled reads)"))
    if args.train:
        figures = [f for n in args.gpus.split(",") for f in _train(args.dir, args.epochs, int(n))]
        write(args.json, "bench_sockets_train", figures, " ".join(sys.argv))
        return 0
    graphs = _graphs(args.dir)
    figures = []
    for layout in "abcd":
        plan = args.dir / f"plan-{layout}.json"
        plan.write_text(moment("plan", "--machine", "moment-a", "--json", "--top", "1", "--layout", layout))
        for name, (ds, n, row) in graphs.items():
            cpu_rows = n // 20
            gpu_rows = cpu_rows * 2 // 5
            tag = f"{layout}-{name.split()[0].lower()}"
            aware = _place(ds, plan, args.dir / f"aware-{tag}", cpu_rows * row, gpu_rows * row)
            plain = _place(ds, plan, args.dir / f"plain-{tag}", cpu_rows * row, gpu_rows * row, "--no-socket-aware")
            sa = aware["socket_aware"]
            used = sa["used"]
            # held out: DDAK's share of an independent pre-sample's reads (hash is fitted to none)
            a = sa["held_out_cross_socket_share"] if used else aware["report"]["cross_socket_share"]
            fitted, h = aware["report"]["cross_socket_share"], aware["baseline"]["cross_socket_share"]
            u, uh = plain["report"]["cross_socket_share"], plain["baseline"]["cross_socket_share"]
            less, uless = (100 * (1 - x / y) if y else float("nan") for x, y in ((a, h), (u, uh)))
            dev, udev = aware["report"]["max_relative_deviation"], plain["report"]["max_relative_deviation"]
            print(f"layout ({layout}) {name:13} socket-aware {'yes' if used else 'no '}  DDAK {a:.3f} held out "
                  f"({fitted:.3f} fitted)  hash {h:.3f}  -> {less:5.1f}% less; every GPU alike: DDAK {u:.3f} hash "
                  f"{uh:.3f} -> {uless:5.1f}% less (paper {PAPER[layout]}%); max bin deviation {dev:.3f} "
                  f"(unaware {udev:.3f})", flush=True)
            how = "GPUs on two sockets" if used else "not used: " + sa["why_not"]
            figures.append(Figure(
                "sockets", f"cross-socket share, socket-aware DDAK vs hash: {name}, Machine A layout ({layout})",
                "share", a, h, "hash placement (same per-socket reads)", higher_is_better=False,
                target=f"paper: {PAPER[layout]}% less than hash",
                note=f"{less:.1f}% less; held-out reads ({fitted:.3f} on the reads it was fitted to); {how}; "
                     f"max bin deviation {dev:.3f} (unaware {udev:.3f})"))
            figures.append(Figure(
                "sockets", f"cross-socket share, DDAK vs hash, every GPU reading alike: {name}, Machine A layout "
                           f"({layout})", "share", u, uh, "hash placement", higher_is_better=False,
                target=f"paper: {PAPER[layout]}% less than hash", note=f"{uless:.1f}% less (--no-socket-aware)"))
    write(args.json, "bench_sockets", figures, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
