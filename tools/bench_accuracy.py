"""Cora accuracy of GCN and GAT trained through the whole Moment pipeline, against the papers.

The Planetoid public split of Cora (140 / 500 / 1000) is imported with
``training.importers``, every feature row is written to an SSD bin
(``iostack.bins.write_bins``, a one-bin ``simple_placement``) and read back by
the ``FeatureStore`` at every step; batches come from ``NeighborSampler`` with
full neighbourhoods (fan-out ``-1``), and the whole training set (140 seeds) is
one batch, i.e. full-batch training as in the papers. Hyperparameters are the
papers':

- GCN (Kipf & Welling 2017): 2 layers, 16 hidden, dropout 0.5, lr 0.01, weight decay
  5e-4, 200 epochs, row-normalised features; published 81.5 %.
- GAT (Veličković et al. 2018): 8 heads × 8 hidden, 1 output head, dropout 0.6 on
  inputs and attention, lr 0.005, weight decay 5e-4; published 83.0 %.

Reported: mean ± std over ``--seeds`` seeds of the test accuracy at the epoch of best
validation accuracy (model selection as the papers' early stopping does), and at the
last epoch. Usage::

    python tools/bench_accuracy.py [--seeds 5] [--epochs 200] [--gcn-norm global|local]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import Figure, write  # noqa: E402

from iostack.bins import write_bins  # noqa: E402
from iostack.placement import simple_placement  # noqa: E402
from training.data import open_dataset  # noqa: E402
from training.importers import import_dataset  # noqa: E402
from training.specs import IOSpec, ModelSpec, RunSpec, SamplingSpec, TrainSpec  # noqa: E402
from training.trainer import train  # noqa: E402

CORA = REPO.parent / "shared" / "fixtures" / "graphs" / "cora"

PUBLISHED = {"gcn": 81.5, "gat": 83.0}


def paper_config(model: str, dataset: Path, placement: Path, seed: int, epochs: int, gcn_norm: str) -> TrainSpec:
    if model == "gcn":
        net, lr = ModelSpec("gcn", hidden=16, dropout=0.5, gcn_norm=gcn_norm, normalize_features=True), 0.01
    else:
        net, lr = ModelSpec("gat", hidden=8, heads=8, out_heads=1, dropout=0.6, attn_dropout=0.6,
                            normalize_features=True), 0.005
    return TrainSpec(str(dataset), model=net,
                     sampling=SamplingSpec(fanouts=(-1, -1), batch_size=140, eval_batch_size=1000),
                     io=IOSpec(placement=str(placement), prefetch=1, backend="posix"),
                     run=RunSpec(epochs=epochs, seed=seed, lr=lr, weight_decay=5e-4))


def run(model: str, dataset: Path, placement: Path, seed: int, epochs: int, gcn_norm: str) -> tuple[float, float]:
    """(test accuracy at the best validation epoch, test accuracy at the last epoch), in percent."""
    res = train(paper_config(model, dataset, placement, seed, epochs, gcn_norm))
    best = max(res.epochs, key=lambda r: (r["valid_acc"], -r["epoch"]))  # earliest best
    return 100 * best["test_acc"], 100 * res.epochs[-1]["test_acc"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cora", type=Path, default=CORA, help="directory of the Planetoid Cora files")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--models", default="gcn,gat")
    ap.add_argument("--gcn-norm", choices=("global", "local"), default="global",
                    help="GCN degrees: the whole graph's (exactly the paper's GCN with full neighbourhoods) "
                         "or the batch graph's (PyG's GCNConv on a mini-batch)")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args(argv)
    figures = []
    with tempfile.TemporaryDirectory(prefix="moment-acc-") as tmp:
        ds_dir = import_dataset(args.cora, Path(tmp) / "cora")
        ds = open_dataset(ds_dir)
        pdir = Path(tmp) / "placement"
        placement = simple_placement(ds.num_nodes, [("ssd", ds.num_nodes)])  # every row on the SSD tier
        write_bins(ds.features, placement, pdir, fsync=False)
        placement.save(pdir)
        print(f"Cora public split: {ds.num_nodes} nodes, train/valid/test {len(ds.train_idx)}/{len(ds.valid_idx)}/"
              f"{len(ds.test_idx)}; features from SSD bins, full neighbourhoods, {args.epochs} epochs, "
              f"{args.seeds} seeds")
        print(f"{'model':<6} {'test@best-valid':>16} {'test@last':>12} {'published':>10} {'diff':>7} {'within 2':>9}"
              f" {'s/run':>7}")
        ok = True
        for model in args.models.split(","):
            t0 = time.perf_counter()
            runs = [run(model, ds_dir, pdir, seed, args.epochs, args.gcn_norm) for seed in range(args.seeds)]
            per_run = (time.perf_counter() - t0) / args.seeds
            best = [r[0] for r in runs]
            last = [r[1] for r in runs]
            mean = statistics.fmean(best)
            sd = statistics.stdev(best) if len(best) > 1 else 0.0
            diff = mean - PUBLISHED[model]
            ok &= abs(diff) <= 2.0
            name = model + (f" ({args.gcn_norm})" if model == "gcn" else "")
            print(f"{name:<6} {mean:>10.1f} ± {sd:<3.1f} {statistics.fmean(last):>12.1f} {PUBLISHED[model]:>10.1f} "
                  f"{diff:>+7.1f} {'yes' if abs(diff) <= 2.0 else 'NO':>9} {per_run:>7.1f}")
            print(f"       per seed (test@best-valid): {', '.join(f'{b:.1f}' for b in best)}")
            figures.append(Figure("accuracy", f"Cora, {name}, mean of {args.seeds} seeds", "% test", mean,
                                  PUBLISHED[model], "published", target="within 2 points",
                                  note=f"sd {sd:.1f}; {'within' if abs(diff) <= 2.0 else 'OUTSIDE'} 2 points; "
                                       "features from SSD bins"))
    write(args.json, "bench_accuracy", figures, " ".join(sys.argv))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
