"""Run by tests/test_socket_batches.py (and tools/bench_sockets.py --train) under ``torchrun --nproc-per-node 2``
(gloo): training on a socket-aware placement.

Arguments: the dataset, the placement, an output directory, then the run's fan-outs (``10,5``), batch size and
epochs. Two trainings of the same config: as ``moment train`` runs it on this placement (each socket's ranks on
their socket's part, :mod:`training.socket_batches`), and with the batches every run took before (every rank a
part of every global batch: a :class:`~training.batches.LocalBatchSource` handed in). Writes
``result-RANK.json``: the start record's ``socket_split``, each run's step and epoch records (the rows read per
bin), and the seeds of every step this rank took in the socket-aware run (from :func:`socket_source`, the
function the trainer's feed calls).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from tests.conftest import flat_spec
from training.batches import LocalBatchSource
from training.data import open_dataset
from training.distributed import World
from training.sampler import NeighborSampler
from training.socket_batches import socket_source
from training.trainer import train


def main() -> int:
    dataset, placement, out, fanouts, batch, epochs = sys.argv[1:7]
    fan = tuple(int(f) for f in fanouts.split(","))
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    spec = flat_spec(dataset=dataset, placement=placement, fanouts=fan, batch_size=int(batch), hidden=16,
                     seed=3, eval_every_epochs=0, backend="posix", epochs=int(epochs))
    aware: list[dict] = []
    train(spec, progress=aware.append)
    ds = open_dataset(dataset, validate=False)
    train_idx = np.asarray(ds.train_idx, dtype=np.int64)
    csr = (torch.as_tensor(np.asarray(ds.indptr)), torch.as_tensor(np.asarray(ds.indices)))
    plain_src = LocalBatchSource(NeighborSampler(*csr, fan, seed=3), train_idx, int(batch), rank=rank,
                                 world_size=size, seed=3)
    plain: list[dict] = []
    train(spec, source=plain_src, progress=plain.append)
    world = World(rank, size, torch.device("cpu"), False, local_rank=rank, local_size=size)
    src, split = socket_source(spec, train_idx, world, csr)
    seeds = [[p.tolist() for p in src.seeds(e)] for e in range(int(epochs))] if src is not None else []
    Path(out, f"result-{rank}.json").write_text(json.dumps({
        "rank": rank, "split": split, "start_split": aware[0]["socket_split"], "seeds": seeds,
        "aware": [r for r in aware if r["kind"] != "start"], "plain": [r for r in plain if r["kind"] != "start"]}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
