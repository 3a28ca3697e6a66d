"""Mixed-precision training (`moment train --precision`) against float32, side by side, in one run.

    python tools/bench_mixed_precision.py [--graphs cora,amazon-photo,synthetic] [--seeds 3] [--epochs 30] [--quick]

Each graph is trained four ways, the ways interleaved within every seed, on the same batches:

* ``float32``: rows placed as float32, ``--precision 32`` (the reference);
* ``bfloat16 / bf16-mixed``: rows placed as bfloat16, autocast to bfloat16; the rows reach the model as
  bfloat16 (no float32 copy of a batch);
* ``float16 / 16-mixed``: rows placed as float16, autocast to float16 with loss scaling;
* ``int8 / bf16-mixed``: rows placed as int8 (a scale per column), decoded straight into bfloat16.

Every row sits in one CPU bin of the placement (host memory: the figures are the model's arithmetic,
not the disk's). GraphSAGE (fan-outs 10,5, hidden 64, batch 256, 64 on the small splits; Adam lr 0.01)
trains ``--epochs`` epochs through :func:`training.trainer.train`; the figures are the test accuracy
after the last epoch and seeds/s (the median of the epochs after the first), each the median over
``--seeds`` seeds with its range. Graphs: Cora (Planetoid fixture, public split, row-normalised), Amazon
Photo (gnn-benchmark fixture, 20/30 per class random split), a synthetic Chung-Lu graph whose labels
depend on Gaussian features (``--feature-snr 1``: their precision matters). On a CPU without bfloat16
instructions (AMX, AVX512-BF16) autocast emulates the narrow types; the GPU figure is not measured on
this machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _cli import moment  # noqa: E402
from _results import Figure, write  # noqa: E402

from iostack.codec import fit_codec  # noqa: E402
from iostack.placement import Placement, simple_placement  # noqa: E402
from training.data import fingerprint, open_dataset  # noqa: E402
from training.importers import import_dataset  # noqa: E402
from training.specs import IOSpec, ModelSpec, RunSpec, SamplingSpec, TrainSpec  # noqa: E402
from training.trainer import train  # noqa: E402

FIXTURES = REPO.parent / "shared" / "fixtures" / "graphs"
#: (label, rows stored as, precision); the first is the reference
WAYS = (("float32", "float32", "32"), ("bfloat16 / bf16-mixed", "bfloat16", "bf16-mixed"),
        ("float16 / 16-mixed", "float16", "16-mixed"), ("int8 / bf16-mixed", "int8", "bf16-mixed"))


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def dataset(name: str, base: Path, args) -> tuple[Path, bool]:
    """The dataset directory of ``name`` and whether its rows are row-normalised (Planetoid style)."""
    if name == "cora":
        return import_dataset(FIXTURES / "cora", base / "cora"), True
    if name == "amazon-photo":
        return import_dataset(FIXTURES / "amazon-photo" / "amazon_photo.npz", base / "photo"), False
    if name == "synthetic":
        g = base / "synthetic"
        moment("data", "synth", str(g), "--nodes", args.synth_nodes, "--edges", str(10 * int(float(args.synth_nodes))),
               "--generator", "chung-lu", "--undirected", "--feature-dim", "128", "--feature-snr", "1",
               "--classes", "8", "--train-share", "0.2", "--valid-share", "0.1", "--test-share", "0.2",
               "--seed", "5", "--quiet")
        return g, False
    raise SystemExit(f"--graphs: unknown graph {name!r}; expected cora, amazon-photo or synthetic")


def placed_in_memory(ds_dir: Path, dtype: str, out: Path) -> Path:
    """Every row of the dataset in one CPU bin, stored as ``dtype``."""
    ds = open_dataset(ds_dir)
    p = simple_placement(ds.num_nodes, [("cpu", ds.num_nodes)])
    Placement(p.bins, p.bin_of, p.row_of, codec=fit_codec(ds.features, dtype)).save(
        out, dataset_fingerprint=fingerprint(ds))
    return out


def run(ds_dir: Path, placement: Path, normalize: bool, precision: str, seed: int, epochs: int
        ) -> tuple[float, float]:
    """(test accuracy %, seeds/s: the median of the epochs after the first)."""
    ds = open_dataset(ds_dir)
    batch = 256 if len(ds.train_idx) > 1024 else 64  # several steps an epoch on the small splits too
    spec = TrainSpec(str(ds_dir), model=ModelSpec("sage", hidden=64, normalize_features=normalize),
                     sampling=SamplingSpec(fanouts=(10, 5), batch_size=batch, eval_batch_size=2048),
                     io=IOSpec(placement=str(placement), prefetch=1, backend="posix"),
                     run=RunSpec(epochs=epochs, seed=seed, lr=0.01, eval_every_epochs=0, precision=precision))
    eps = train(spec).epochs
    return 100 * eps[-1]["test_acc"], statistics.median(e["seeds_per_s"] for e in (eps[1:] or eps))


def measure(name: str, base: Path, args) -> dict[str, dict[str, list[float]]]:
    ds_dir, normalize = dataset(name, base, args)
    dirs = {label: placed_in_memory(ds_dir, dtype, base / f"{name}-{dtype}") for label, dtype, _ in WAYS}
    out: dict[str, dict[str, list[float]]] = {label: {"acc": [], "sps": []} for label, _, _ in WAYS}
    for seed in range(args.seeds):
        for label, _, precision in WAYS:  # interleaved: a load change hits every way alike
            acc, sps = run(ds_dir, dirs[label], normalize, precision, seed, args.epochs)
            out[label]["acc"].append(acc)
            out[label]["sps"].append(sps)
            print(f"  {name:>12} seed {seed} {label:>22}: test {acc:5.1f} %, {sps:8.0f} seeds/s", flush=True)
    return out


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def report(args, results: dict[str, dict[str, dict[str, list[float]]]]) -> list[Figure]:
    figures = []
    print(f"\n{'graph':>12} {'rows / precision':>22} {'test % (range)':>20} {'seeds/s (range)':>26} {'x float32':>10}")
    for name, res in results.items():
        ref = res[WAYS[0][0]]
        for label, _, precision in WAYS:
            r = res[label]
            speed = statistics.median(r["sps"]) / statistics.median(ref["sps"])
            print(f"{name:>12} {label:>22} {med(r['acc']):>20} {med(r['sps']):>26} {speed:>10.2f}")
            if label == WAYS[0][0]:
                continue
            what = f"{name}, SAGE 10,5, {args.epochs} epochs, rows {label}"
            n = len(r["acc"])
            figures.append(Figure("mixed_precision", f"{what}: test accuracy vs float32", "% test",
                                  statistics.median(r["acc"]), statistics.median(ref["acc"]), "float32 rows, 32",
                                  target="within 1 point (bf16, fp16)",
                                  note=f"median of {n} seeds, range {min(r['acc']):.1f}-{max(r['acc']):.1f}; "
                                       f"float32 {min(ref['acc']):.1f}-{max(ref['acc']):.1f}"))
            figures.append(Figure("mixed_precision", f"{what}: seeds/s vs float32 (CPU)", "seeds/s",
                                  statistics.median(r["sps"]), statistics.median(ref["sps"]), "float32 rows, 32",
                                  note=f"median of {n} seeds, range {min(r['sps']):.0f}-{max(r['sps']):.0f}; "
                                       f"CPU autocast ({precision}), warm (epochs after the first)"))
    print(f"({load()}; {os.cpu_count()} cores shared with other jobs)")
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="cora,amazon-photo,synthetic")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--synth-nodes", default="20000")
    ap.add_argument("--dir", help="work directory (default: a temporary one under /var/tmp)")
    ap.add_argument("--quick", action="store_true", help="one seed, 10 epochs, a smaller synthetic graph")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs, args.synth_nodes = 1, 10, "8000"
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="moment-bench-mixed-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    print(load(), flush=True)
    try:
        results = {name: measure(name, base, args) for name in args.graphs.split(",") if name}
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    write(args.json, "bench_mixed_precision", report(args, results), " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
