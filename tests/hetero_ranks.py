"""Run by tests/test_hetero_ranks.py under ``torchrun --nproc-per-node 2`` (gloo): heterogeneous training on 2 ranks.

Trains each config given as JSON (``argv[2]``, a list of flat spec fields) on the dataset ``argv[1]``
and writes rank ``r``'s records to ``argv[3]/rank<r>-<i>.json``: the step losses, the epoch records
and the parameters' sum. The script holds the process group: the trainings join it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from tests.conftest import flat_spec
from training.hetero.train import train_hetero


def main() -> int:
    dataset, configs, out = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    # one group for all the trainings (each would otherwise set one up and tear it down: a rank still
    # tearing down the last one refuses the other's connections to the next)
    dist.init_process_group("gloo")
    for i, fields in enumerate(configs):
        steps: list[dict] = []
        res = train_hetero(flat_spec(dataset=dataset, **fields),
                           progress=lambda r, steps=steps: steps.append(r) if r["kind"] == "step" else None)
        (out / f"rank{res.rank}-{i}.json").write_text(json.dumps({
            "world_size": res.world_size, "steps": steps, "epochs": list(res.epochs),
            "param_sum": float(sum(p.detach().double().sum() for p in res.model.parameters()))}, default=str))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
