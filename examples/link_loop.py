"""Your link predictor in your own loop on Moment's link batches: `python examples/link_loop.py LINKS [PLACEMENT]`."""
import sys

import torch
import torch.nn.functional as F

from training.link.loader import open_link_loader


class MeanGCN(torch.nn.Module):  # each layer: a vertex averages itself and its sampled neighbours, then a linear map
    def __init__(self, dim: int, hidden: int, out: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(dim, hidden), torch.nn.Linear(hidden, out)])

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        (src, dst), deg = edge_index, torch.bincount(edge_index[1], minlength=len(x)).add(1).unsqueeze(1)
        for i, layer in enumerate(self.layers):
            x = layer(x.index_add(0, dst, x[src]) / deg)  # src → dst edges, the vertex itself counted once
            x = F.relu(x) if i == 0 else x
        return x


def main(dataset: str, placement: str | None = None, epochs: int = 10) -> tuple[list[float], float]:
    torch.manual_seed(0)
    with open_link_loader(dataset, placement, fanouts=(10, 10), batch_size=512, eval_fanouts=(-1, -1)) as loader:
        model = MeanGCN(loader.num_features, 128, 64).to(loader.device)
        opt, losses = torch.optim.Adam(model.parameters(), lr=0.01), []
        score = lambda z, pairs: (z[pairs[0]] * z[pairs[1]]).sum(1)  # noqa: E731 (a dot-product decoder)
        for epoch in range(epochs):
            loader.set_epoch(epoch)  # new shuffle and negatives
            for b in loader:  # b.edge_label_index: the pairs' endpoints (rows of b.x); b.edge_label: 1 edge, 0 not
                loss = F.binary_cross_entropy_with_logits(score(model.train()(b.x, b.batch.edge_index),
                                                                b.edge_label_index), b.edge_label)
                loss.backward(), opt.step(), opt.zero_grad(), losses.append(loss.item())
            print(f"epoch {epoch}: loss {sum(losses[-len(loader):]) / len(loader):.3f}", loader.metrics()["tiers"])
        with torch.no_grad():
            out = [(score(model.eval()(b.x, b.batch.edge_index), b.edge_label_index), b.edge_label)
                   for b in loader.evaluation("test")]
        return losses, loader.link_metrics(torch.cat([s for s, _ in out]), torch.cat([y for _, y in out]))["auc"]


if __name__ == "__main__":
    print(f"test AUC {main(*sys.argv[1:3])[1]:.3f}")
