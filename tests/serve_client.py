"""A trainer stand-in for tests/test_serve.py and tools/bench_serve.py (run as a script, not a test).

    python tests/serve_client.py ADDRESS DATASET --rank R --world-size W [--mode compare|slow|bench] ...

Prints one JSON object per line: ``{"event": "joined", ...}``, ``{"event": "step", ...}``
(slow mode), and a last ``{"event": "done", ...}`` or ``{"event": "error", "type": ...,
"message": ..., "seconds_since_last_batch": ...}``; exit status 0, or 3 on a MomentError (a user error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from momentbase.errors import MomentError  # noqa: E402
from training.batches import LocalBatchSource  # noqa: E402
from training.data import open_dataset  # noqa: E402
from training.sampler import NeighborSampler  # noqa: E402
from training.serve import RemoteBatchSource  # noqa: E402


def say(**record) -> None:
    print(json.dumps(record), flush=True)


def same(a, b) -> bool:
    return (torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
            and a.batch_size == b.batch_size and a.num_sampled_nodes == b.num_sampled_nodes
            and a.num_sampled_edges == b.num_sampled_edges)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("dataset")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--mode", choices=("compare", "slow", "bench"), default="compare")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--start-step", type=int, default=0)
    p.add_argument("--delay", type=float, default=0.05, help="slow mode: seconds 'training' per batch")
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--transport", choices=("auto", "shm", "rpc"), default="auto")
    a = p.parse_args()
    fanouts = tuple(int(f) for f in a.fanouts.split(","))
    last = time.monotonic()
    try:
        src = RemoteBatchSource(a.address, rank=a.rank, world_size=a.world_size, batch_size=a.batch_size,
                                fanouts=fanouts, seed=a.seed, prefetch=a.prefetch, timeout_s=a.timeout,
                                transport=a.transport)
        say(event="joined", name=src.name, steps=src.steps(0), transport=src.transport, pid=os.getpid())
        last = time.monotonic()
        if a.mode == "compare":
            ds = open_dataset(a.dataset)
            local = LocalBatchSource(NeighborSampler(ds.indptr, ds.indices, fanouts, seed=0), ds.train_idx,
                                     a.batch_size, rank=a.rank, world_size=a.world_size, seed=a.seed)
            equal = count = 0
            for epoch in range(a.epochs):
                pairs = zip(src.batches(epoch, a.start_step), local.batches(epoch, a.start_step), strict=True)
                for remote, mine in pairs:
                    equal += same(remote, mine)
                    count += 1
            say(event="done", batches=count, equal=equal)
        elif a.mode == "slow":
            count = 0
            for epoch in range(a.epochs):
                for step, batch in enumerate(src.batches(epoch)):
                    last = time.monotonic()
                    count += 1
                    say(event="step", epoch=epoch, step=step, nodes=batch.num_nodes)
                    time.sleep(a.delay)
            say(event="done", batches=count)
        else:  # bench: batches/s and bytes
            count = nbytes = 0
            t0 = time.perf_counter()
            for epoch in range(a.epochs):
                for batch in src.batches(epoch):
                    count += 1
                    nbytes += batch.nbytes
            say(event="done", batches=count, bytes=nbytes, seconds=time.perf_counter() - t0)
        src.close()
        return 0
    except MomentError as exc:
        say(event="error", type=type(exc).__name__, message=str(exc),
            seconds_since_last_batch=round(time.monotonic() - last, 2))
        return 3


if __name__ == "__main__":
    sys.exit(main())
