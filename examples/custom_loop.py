"""Your own model in your own loop on Moment's batches: `python examples/custom_loop.py DATASET [PLACEMENT]`."""
import sys

import torch
import torch.nn.functional as F

from training.loader import open_loader


class MeanSage(torch.nn.Module):  # two GraphSAGE-style layers in plain PyTorch: [self | mean of neighbours]
    def __init__(self, dim: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(2 * dim, hidden), torch.nn.Linear(2 * hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        (src, dst), deg = edge_index, torch.bincount(edge_index[1], minlength=len(x)).clamp(min=1).unsqueeze(1)
        mean = lambda h: torch.zeros_like(h).index_add_(0, dst, h[src]) / deg  # noqa: E731 (src → dst edges)
        h = F.dropout(F.relu(self.l1(torch.cat([x, mean(x)], 1))), 0.5, self.training)
        return self.l2(torch.cat([h, mean(h)], 1))


def main(dataset: str, placement: str | None = None, epochs: int = 10) -> tuple[list[float], float]:
    torch.manual_seed(0)
    with open_loader(dataset, placement, fanouts=(10, 10), batch_size=32) as loader:
        model = MeanSage(loader.num_features, 64, loader.num_classes).to(loader.device)
        opt, losses = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4), []
        for epoch in range(epochs):
            loader.set_epoch(epoch)  # a new shuffle each epoch, as with DistributedSampler
            for b in loader:  # b.x: features of b.batch.n_id, whose first batch_size are the seeds; b.y their labels
                loss = F.cross_entropy(model.train()(b.x, b.batch.edge_index)[: b.batch.batch_size], b.y)
                loss.backward(), opt.step(), opt.zero_grad(), losses.append(loss.item())
            print(f"epoch {epoch}: loss {sum(losses[-len(loader):]) / len(loader):.3f}", loader.metrics()["tiers"])
        hits = torch.cat([model.eval()(b.x, b.batch.edge_index)[: b.batch.batch_size].argmax(1) == b.y
                          for b in loader.evaluation("test")])
    return losses, float(hits.float().mean())


if __name__ == "__main__":
    print(f"test accuracy {main(*sys.argv[1:3])[1]:.3f}")
