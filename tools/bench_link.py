"""Cora link prediction: Moment's `--task link` beside PyG's examples/link_pred.py, and the published GAE figure.

Both sides train the same model the same way: a 2-layer GCN (1433 -> 128 -> 64, no dropout), dot-product
decoder, Adam lr 0.01, 100 epochs, row-normalised features, one fresh uniform negative per training
positive each epoch, 85 / 5 / 10 % of the undirected edges for train / valid / test with as many fixed
negatives, and the test AUC of the epoch with the best validation AUC.

- **ours**: the edge split of `training.link.store.write_link_dataset` (seeded by the run's seed), every
  feature row read back from an SSD bin through the tiered store at every step, one batch of all training
  pairs per epoch sampled with full neighbourhoods (fan-outs -1,-1) and GCN with whole-graph degrees,
  through `training.link.train.train_link`.
- **reference**: PyG's examples/link_pred.py (pyg-team/pytorch_geometric, examples/link_pred.py) as
  written: `RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True,
  add_negative_train_samples=False)`, `GCNConv`, `negative_sampling`, full-batch, on the same Cora graph
  and features given to it as a `Data` (no download); `torch.manual_seed(seed)` first. sklearn is not
  installed: its `roc_auc_score` is replaced by `training.link.metrics.auc`, the same statistic.
- **published**: GAE on Cora, test AUC 91.0 (Kipf & Welling, "Variational Graph Auto-Encoders",
  NIPS 2016 Bayesian Deep Learning workshop, arXiv:1611.07308, Table 1), with this split protocol
  (5 % / 10 % held out, as many non-edges); PyG's example is a GAE without the variational part.

Usage: ``python tools/bench_link.py [--seeds 5] [--epochs 100] [--json FILE]``
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

CORA = REPO.parent / "shared" / "fixtures" / "graphs" / "cora"
PUBLISHED_AUC = 91.0  # GAE, Cora (arXiv:1611.07308, Table 1)


def ours(cora_dir: Path, tmp: Path, seed: int, epochs: int) -> float:
    """Test AUC (%) at the best validation epoch, Moment's edge split and link training, features from an SSD bin."""
    from iostack.bins import write_bins
    from iostack.placement import simple_placement
    from training.link.store import write_link_dataset
    from training.link.train import LinkSpec, train_link
    from training.specs import IOSpec, ModelSpec, RunSpec, SamplingSpec, TrainSpec

    ds, _ = write_link_dataset(cora_dir, tmp / f"links-{seed}", seed=seed, overwrite=True)
    pdir = tmp / f"place-{seed}"
    placement = simple_placement(ds.num_nodes, [("ssd", ds.num_nodes)])
    write_bins(ds.features, placement, pdir, fsync=False)
    placement.save(pdir)
    spec = TrainSpec(str(ds.path), model=ModelSpec("gcn", hidden=128, dropout=0.0, gcn_norm="global",
                                                   normalize_features=True),
                     sampling=SamplingSpec(fanouts=(-1, -1), batch_size=1 << 30, eval_batch_size=1 << 30),
                     io=IOSpec(placement=str(pdir), backend="posix"),
                     run=RunSpec(epochs=epochs, seed=seed, lr=0.01))
    res = train_link(spec, LinkSpec(decoder="dot", negatives="uniform", embed_dim=64))
    return 100 * res.epochs[-1]["test_at_best"]["auc"]


def reference(cora_dir: Path, seed: int, epochs: int) -> float:
    """Test AUC (%) of PyG's examples/link_pred.py (its code, Cora handed in as a ``Data``)."""
    import numpy as np
    import torch
    import torch_geometric.transforms as T
    from torch_geometric.data import Data
    from torch_geometric.nn import GCNConv
    from torch_geometric.utils import negative_sampling

    from training.data import open_dataset
    from training.link.metrics import auc as roc_auc

    torch.manual_seed(seed)
    ds = open_dataset(cora_dir)
    dst = torch.repeat_interleave(torch.arange(ds.num_nodes), torch.from_numpy(np.diff(ds.indptr)))
    data = Data(x=torch.from_numpy(np.array(ds.features)),
                edge_index=torch.stack([torch.from_numpy(np.array(ds.indices, np.int64)), dst]))
    transform = T.Compose([T.NormalizeFeatures(), T.RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True,
                                                                    add_negative_train_samples=False)])
    train_data, val_data, test_data = transform(data)

    class Net(torch.nn.Module):
        def __init__(self, in_channels, hidden_channels, out_channels):
            super().__init__()
            self.conv1 = GCNConv(in_channels, hidden_channels)
            self.conv2 = GCNConv(hidden_channels, out_channels)

        def encode(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

        def decode(self, z, edge_label_index):
            return (z[edge_label_index[0]] * z[edge_label_index[1]]).sum(dim=-1)

    model = Net(data.num_features, 128, 64)
    optimizer = torch.optim.Adam(params=model.parameters(), lr=0.01)
    criterion = torch.nn.BCEWithLogitsLoss()

    def train():
        model.train()
        optimizer.zero_grad()
        z = model.encode(train_data.x, train_data.edge_index)
        neg = negative_sampling(edge_index=train_data.edge_index, num_nodes=train_data.num_nodes,
                                num_neg_samples=train_data.edge_label_index.size(1), method="sparse")
        eli = torch.cat([train_data.edge_label_index, neg], dim=-1)
        label = torch.cat([train_data.edge_label, train_data.edge_label.new_zeros(neg.size(1))], dim=0)
        loss = criterion(model.decode(z, eli).view(-1), label)
        loss.backward()
        optimizer.step()

    @torch.no_grad()
    def test(d):
        model.eval()
        out = model.decode(model.encode(d.x, d.edge_index), d.edge_label_index).view(-1).sigmoid().numpy()
        y = d.edge_label.numpy()
        return roc_auc(out[y == 1], out[y == 0])

    best_val = final_test = 0.0
    for _ in range(epochs):
        train()
        val_auc, test_auc = test(val_data), test(test_data)
        if val_auc > best_val:
            best_val, final_test = val_auc, test_auc
    return 100 * final_test


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cora", type=Path, default=CORA, help="directory of the Planetoid Cora files")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    args = ap.parse_args(argv)
    from training.importers import import_dataset

    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}, load {' '.join(load)}; Cora, {args.epochs} epochs, "
          f"{args.seeds} seeds (cold: each run builds its model and split afresh)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="moment-link-") as name:
        tmp = Path(name)
        cora = import_dataset(args.cora, tmp / "cora")
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            a = ours(cora, tmp, seed, args.epochs)
            t1 = time.perf_counter()
            b = reference(cora, seed, args.epochs)
            t2 = time.perf_counter()
            rows.append((a, b))
            print(f"seed {seed}: ours {a:.2f} ({t1 - t0:.0f} s) · PyG's link_pred.py {b:.2f} ({t2 - t1:.0f} s)",
                  flush=True)
    mine, theirs = [r[0] for r in rows], [r[1] for r in rows]
    med_a, med_b = statistics.median(mine), statistics.median(theirs)
    span = f"ours {min(mine):.1f}-{max(mine):.1f}, PyG {min(theirs):.1f}-{max(theirs):.1f}"
    print(f"median test AUC: ours {med_a:.2f}, PyG's example {med_b:.2f} (ratio {med_a / med_b:.3f}), "
          f"published GAE {PUBLISHED_AUC:.1f}; ranges {span}; within 2 points of published: "
          f"{'yes' if abs(med_a - PUBLISHED_AUC) <= 2 else 'NO'}")
    figures = [Figure("link", f"Cora link prediction, GCN+dot, median test AUC of {args.seeds} seeds", "% AUC",
                      med_a, med_b, "PyG examples/link_pred.py", target="within 2 points of published 91.0 (GAE)",
                      note=f"{span}; published GAE 91.0 (arXiv:1611.07308); load {' '.join(load)}")]
    write(args.json, "bench_link", figures, " ".join(sys.argv))
    return 0 if abs(med_a - PUBLISHED_AUC) <= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
