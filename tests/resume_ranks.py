"""Run by tests/test_train.py under ``torchrun --nproc-per-node 2`` (gloo): exact resume with dropout on.

One process group, four trainings of the same config (sampled fan-outs,
dropout 0.5, features through the store with node-shared host tiers):
uninterrupted; interrupted mid-epoch; resumed from its checkpoint; and resumed
from a copy of that checkpoint in which every rank gets rank 0's random
streams (what checkpoints held before they were saved per rank). Prints one
JSON line per rank: whether the resumed run equals the uninterrupted one,
whether the rank-0-streams resume does, and the store's notes (the CPU bin is
one node-shared segment: one rank fills it, the other maps it).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.conftest import flat_spec
from training.checkpoint import CHECKPOINT_NAME
from training.trainer import train


class _Crash(Exception):
    pass


def _crash(rec: dict) -> None:
    if rec["kind"] == "step" and rec["epoch"] == 1 and rec["step"] == 3:
        raise _Crash  # every rank at the same step, after its all-reduce: no collective left waiting


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def main() -> int:
    dataset, placement, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    base = dict(dataset=dataset, placement=placement, fanouts=(10, 5), batch_size=35, hidden=16, dropout=0.5,
                seed=3, eval_every_epochs=0, backend="posix", checkpoint_every_steps=2, epochs=2)
    starts: list[dict] = []
    whole = train(flat_spec(checkpoint_dir=f"{out}/a", **base),
                  progress=lambda r: starts.append(r) if r["kind"] == "start" else None)
    with contextlib.suppress(_Crash):
        train(flat_spec(checkpoint_dir=f"{out}/b", **base), progress=_crash)
    if rank == 0:  # the checkpoint as it was before per-rank streams: rank 0's for everyone
        shutil.copytree(f"{out}/b", f"{out}/c")
        ck = torch.load(f"{out}/c/{CHECKPOINT_NAME}", weights_only=False)
        ck["rng"] = [ck["rng"][0]] * len(ck["rng"])
        torch.save(ck, f"{out}/c/{CHECKPOINT_NAME}")
    dist.barrier()
    again = train(flat_spec(checkpoint_dir=f"{out}/b", resume=True, **base))
    shared = train(flat_spec(checkpoint_dir=f"{out}/c", resume=True, **base))
    # one file per rank: two ranks printing to one pipe can interleave their lines
    Path(out, f"result-{rank}.json").write_text(json.dumps({
        "rank": rank, "resumed_from": list(again.resumed_from or ()),
        "resumed_equal": _same(whole.model, again.model), "rank0_streams_equal": _same(whole.model, shared.model),
        "store_notes": starts[0]["store_notes"]}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
