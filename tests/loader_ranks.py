"""One rank of the loader under torchrun with the user's own DDP set-up (tests/test_loader.py launches it).

argv: DATASET PLACEMENT OUT_DIR. Writes OUT_DIR/rank{R}.json: the seeds of each step, the start record, the
metrics, and the sum of the DDP-trained parameters.
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from training.loader import open_loader

dist.init_process_group("gloo")  # the user's own group: the loader joins it
records: list[dict] = []
with open_loader(sys.argv[1], sys.argv[2], fanouts=(5, 5), batch_size=48, seed=2, backend="posix",
                 progress=records.append) as loader:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(loader.num_features, loader.num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seeds = []
    for b in loader:  # the last step's part may be empty: the step still runs, DDP waits for every rank
        out = model(b.x[: b.batch.batch_size])
        (F.cross_entropy(out, b.y, reduction="sum") * loader.world_size / 48).backward()
        opt.step(), opt.zero_grad()
        seeds.append(b.batch.n_id[: b.batch.batch_size].tolist())
    result = {"rank": loader.rank, "world_size": loader.world_size, "steps": len(loader), "seeds": seeds,
              "start": records[0], "metrics": loader.metrics(),
              "param_sum": float(sum(p.detach().double().sum() for p in model.parameters()))}
with open(f"{sys.argv[3]}/rank{result['rank']}.json", "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
