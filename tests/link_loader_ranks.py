"""One rank of the link loader under torchrun with the user's own DDP set-up (tests/test_link_loader.py launches it).

argv: DATASET PLACEMENT OUT_DIR. Writes OUT_DIR/rank{R}.json: each step's pairs and labels, the test metrics of
a feature-only score (x_u . x_v, the same whoever scores it), and the sum of the DDP-trained parameters.
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from training.link.loader import open_link_loader

dist.init_process_group("gloo")  # the user's own group: the loader joins it
with open_link_loader(sys.argv[1], sys.argv[2], fanouts=(5, 5), batch_size=1000, seed=2, backend="posix",
                      eval_batch_size=300) as loader:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(loader.num_features, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for b in loader:
        z = model(b.x)
        loss = F.binary_cross_entropy_with_logits((z[b.edge_label_index[0]] * z[b.edge_label_index[1]]).sum(1),
                                                  b.edge_label)
        loss.backward(), opt.step(), opt.zero_grad()
        steps.append({"pairs": b.batch.n_id[b.edge_label_index].tolist(), "labels": b.edge_label.tolist()})
    scores, labels = [], []
    for b in loader.evaluation("test"):
        scores.append((b.x[b.edge_label_index[0]] * b.x[b.edge_label_index[1]]).sum(1))
        labels.append(b.edge_label)
    result = {"rank": loader.rank, "world_size": loader.world_size, "steps": steps,
              "metrics": loader.link_metrics(torch.cat(scores), torch.cat(labels)),
              "param_sum": float(sum(p.detach().double().sum() for p in model.parameters()))}
with open(f"{sys.argv[3]}/rank{result['rank']}.json", "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
